"""MQTT over WebSockets (docs/mqtt.md): paho-mqtt's ``transport="websockets"`` over ws and
wss (a certificate made by the test) with clients on plain MQTT on the same topics; the
``websockets`` library's own client for what paho cannot send (fragmented messages, several
packets in one frame, text frames, pings); bad handshakes and frames refused with a log line,
nothing else disturbed; authentication and permissions as on the TCP listener."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing
from typing import Any

import pytest
from certs import Pki, make_pki, tls_settings
from mqttkit import HOST, TIMEOUT, unique_id
from mqttutil import Clients, LogEntries, MakeBroker, Paho, ThreadBroker
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

from vibemq_server.adapters.mqtt.codec import MqttParser, encode
from vibemq_server.adapters.mqtt.packets import (
    Connack,
    Connect,
    Packet,
    Publish,
    Suback,
    Subscribe,
)
from vibemq_server.management.connections import (
    close_connection,
    connection_detail,
    list_connections,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def ws_broker(make_mqtt_broker: MakeBroker) -> ThreadBroker:
    return make_mqtt_broker(mqtt={"port": 0, "ws_port": 0, "max_packet_size": 300_000})


def ready(broker: ThreadBroker) -> dict[str, int | str | None]:
    return broker.call(lambda b: b.ready())


def ws_port(broker: ThreadBroker, key: str = "mqtt_ws") -> int:
    port = ready(broker)[key]
    assert isinstance(port, int) and port > 0, f"{key} not listening"
    return port


def ws_paho(clients: Clients, port: int, **kw: Any) -> Paho:
    return clients.paho(port, transport="websockets", **kw)


def test_ready_file_keys_and_off_by_default(make_mqtt_broker: MakeBroker) -> None:
    keys = ready(make_mqtt_broker())
    assert keys["mqtt_ws"] is None and keys["mqtt_wss"] is None


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_paho_websockets_round_trip_with_tcp_clients(
    ws_broker: ThreadBroker, mqtt_clients: Clients, qos: int
) -> None:
    port = ws_port(ws_broker)
    ws_sub = ws_paho(mqtt_clients, port).connected()
    tcp_sub = mqtt_clients.paho(ws_broker.mqtt_port).connected()
    assert ws_sub.subscribe(("ws/t/#", qos)) == [qos]
    assert tcp_sub.subscribe(("ws/t/#", qos)) == [qos]
    ws_pub = ws_paho(mqtt_clients, port).connected()
    tcp_pub = mqtt_clients.paho(ws_broker.mqtt_port).connected()
    big = bytes(range(256)) * 800  # 200 KiB: many TCP reads, one WebSocket frame
    ws_pub.publish("ws/t/a", b"from ws", qos)
    tcp_pub.publish("ws/t/b", b"from tcp", qos)
    ws_pub.publish("ws/t/big", big, qos)
    for sub in (ws_sub, tcp_sub):
        got = {m.topic: m.payload for m in (sub.get(), sub.get(), sub.get())}
        assert got == {"ws/t/a": b"from ws", "ws/t/b": b"from tcp", "ws/t/big": big}


def test_paho_websockets_retained_will_and_persistent_session(
    ws_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    port = ws_port(ws_broker)
    pub = ws_paho(mqtt_clients, port).connected()
    pub.publish("ws/r", b"kept", 1, retain=True)
    dying = ws_paho(mqtt_clients, port)
    dying.will_set("ws/will", b"gone", 1)
    dying.connected()
    cid = unique_id("ws-persist")
    sub = ws_paho(mqtt_clients, port, client_id=cid, clean_session=False).connected()
    assert sub.subscribe(("ws/r", 1), ("ws/will", 1), ("ws/offline", 1)) == [1, 1, 1]
    retained = sub.get()
    assert (retained.topic, retained.payload, retained.retain) == ("ws/r", b"kept", True)
    dying.kill()
    assert sub.until("ws/will") == []
    sub.disconnect()
    pub.publish("ws/offline", b"while away", 1)
    again = ws_paho(mqtt_clients, port, client_id=cid, clean_session=False).connected()
    assert again.get().payload == b"while away"


def test_paho_wss_with_a_test_certificate(
    make_mqtt_broker: MakeBroker, pki: Pki, mqtt_clients: Clients
) -> None:
    broker = make_mqtt_broker(mqtt={"port": 0, "wss_port": 0}, tls=tls_settings(pki))
    keys = ready(broker)
    assert keys["mqtt_ws"] is None  # each listener only when its port is set
    port = ws_port(broker, "mqtt_wss")
    sub = ws_paho(mqtt_clients, port)
    sub.client.tls_set(ca_certs=str(pki.ca))
    sub.connected()
    assert sub.subscribe(("wss/#", 1)) == [1]
    tcp = mqtt_clients.paho(broker.mqtt_port).connected()
    tcp.publish("wss/x", b"secret", 1)
    msg = sub.get()
    assert (msg.topic, msg.payload) == ("wss/x", b"secret")


def test_wss_needs_tls_settings(make_mqtt_broker: MakeBroker) -> None:
    assert ready(make_mqtt_broker(mqtt={"port": 0, "wss_port": 0}))["mqtt_wss"] is None


def test_authentication_and_permissions_as_on_tcp(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients
) -> None:
    broker = make_mqtt_broker(
        mqtt={"port": 0, "ws_port": 0, "deny_subscribe": ["secret/#"]},
        users={"alice": "wonderland"},
        allow_anonymous=False,
    )
    port = ws_port(broker)
    for transport_port, make in ((port, ws_paho), (broker.mqtt_port, Clients.paho)):
        anonymous = make(mqtt_clients, transport_port)
        assert anonymous.connect().getName() == "Not authorized"
        wrong = make(mqtt_clients, transport_port)
        wrong.username_pw_set("alice", "nope")
        assert wrong.connect().getName() == "Bad user name or password"
        alice = make(mqtt_clients, transport_port)
        alice.username_pw_set("alice", "wonderland")
        alice.connected()
        assert alice.subscribe(("open/x", 0), ("secret/x", 0)) == [0, 0x80]


def test_wss_client_certificate_identity_as_on_tls(
    make_mqtt_broker: MakeBroker, pki: Pki, mqtt_clients: Clients
) -> None:
    tls = tls_settings(pki, require_client_cert=True, use_identity_as_username=True)
    broker = make_mqtt_broker(mqtt={"port": 0, "wss_port": 0}, tls=tls)
    client = ws_paho(mqtt_clients, ws_port(broker, "mqtt_wss"))
    client.client.tls_set(
        ca_certs=str(pki.ca), certfile=str(pki.alice.cert), keyfile=str(pki.alice.key)
    )
    client.connected()
    [conn] = broker.call(list_connections)
    assert (conn.protocol, conn.tls, conn.tls_identity, conn.user) == (
        "mqtt",
        True,
        "alice",
        "alice",
    )


# -- the websockets library's own client: what paho does not send ---------------------------


class WsMqtt:
    """MQTT packets over a ``websockets`` sync client; every read is bounded."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.parser = MqttParser()
        self.pending: list[Packet] = []

    def recv(self) -> Packet:
        while not self.pending:
            message = self.ws.recv(timeout=TIMEOUT)
            assert isinstance(message, bytes), "the broker sends binary frames only"
            self.pending.extend(self.parser.feed(message))
        return self.pending.pop(0)

    def closed_with(self) -> int | None:
        """Read until the broker closes; its close code."""
        with pytest.raises(ConnectionClosed) as closed:
            for _ in range(100):
                self.ws.recv(timeout=TIMEOUT)
        return closed.value.rcvd.code if closed.value.rcvd is not None else None


WsClients = Callable[[], WsMqtt]


@pytest.fixture
def ws_clients(ws_broker: ThreadBroker) -> Iterator[WsClients]:
    """Makes ``websockets`` clients of ``ws_broker``; all closed at teardown."""
    with ExitStack() as stack:

        def make() -> WsMqtt:
            url = f"ws://{HOST}:{ws_port(ws_broker)}/mqtt"
            return WsMqtt(
                stack.enter_context(
                    connect(url, subprotocols=[Subprotocol("mqtt")], open_timeout=TIMEOUT)
                )
            )

        yield make


def test_packets_split_across_frames_and_packed_into_one(
    ws_broker: ThreadBroker, ws_clients: WsClients
) -> None:
    client = ws_clients()
    connect_bytes = encode(Connect(client_id=unique_id("frag")))
    # one CONNECT in a fragmented message of one-byte frames
    client.ws.send([connect_bytes[i : i + 1] for i in range(len(connect_bytes))])
    assert isinstance(client.recv(), Connack)
    # SUBSCRIBE and two PUBLISHes in one frame; the second PUBLISH split over two messages
    second = encode(Publish("frag/b", b"two"))
    client.ws.send(encode(Subscribe(1, (("frag/#", 0),))) + encode(Publish("frag/a", b"one")))
    client.ws.send(second[:3])
    client.ws.send(second[3:])
    assert isinstance(client.recv(), Suback)
    got = [client.recv(), client.recv()]
    assert [(p.topic, p.payload) for p in got if isinstance(p, Publish)] == [
        ("frag/a", b"one"),
        ("frag/b", b"two"),
    ]


def test_ping_is_answered(ws_broker: ThreadBroker, ws_clients: WsClients) -> None:
    client = ws_clients()
    client.ws.send(encode(Connect(client_id=unique_id("ping"))))
    assert isinstance(client.recv(), Connack)
    assert client.ws.ping(b"hello").wait(TIMEOUT)


def test_bad_frames_close_that_connection_only(
    ws_broker: ThreadBroker,
    ws_clients: WsClients,
    mqtt_clients: Clients,
    broker_log: LogEntries,
) -> None:
    bystander = ws_paho(mqtt_clients, ws_port(ws_broker)).connected()
    assert bystander.subscribe(("calm/#", 0)) == [0]
    text = ws_clients()
    text.ws.send(encode(Connect(client_id=unique_id("text"))))
    assert isinstance(text.recv(), Connack)
    text.ws.send("a text frame")
    assert text.closed_with() == 1003
    big = ws_clients()
    big.ws.send(b"\x00" * 300_001)  # over mqtt.max_packet_size
    assert big.closed_with() == 1009
    bystander.client.publish("calm/x", b"still here")
    assert bystander.get().payload == b"still here"
    events = {e["event"] for e in broker_log}
    assert "websocket text frame refused: binary frames only" in events
    assert "websocket protocol error" in events


def raw_http(port: int, request: bytes) -> bytes:
    """Send ``request`` on a plain socket; the response's status line."""
    with closing(socket.create_connection((HOST, port), timeout=TIMEOUT)) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n", 1)[0]


def upgrade(path: str = "/mqtt", protocol: str | None = "mqtt", extra: bytes = b"") -> bytes:
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {HOST}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
    ]
    if protocol is not None:
        lines.append(f"Sec-WebSocket-Protocol: {protocol}")
    return "\r\n".join(lines).encode() + extra + b"\r\n\r\n"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (upgrade(), b"HTTP/1.1 101 Switching Protocols"),
        (upgrade(path="/other"), b"HTTP/1.1 404 Not Found"),
        (upgrade(protocol=None), b"HTTP/1.1 400 Bad Request"),
        (upgrade(protocol="chat"), b"HTTP/1.1 400 Bad Request"),
        (b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 426 Upgrade Required"),
        (encode(Connect(client_id="tcp-on-ws")), b"HTTP/1.1 400 Bad Request"),
        (
            upgrade(extra=b"\r\nX-Pad: " + b"v" * 8000 + b"\r\nX-Pad2: " + b"v" * 9000),
            b"HTTP/1.1 431 Request Header Fields Too Large",
        ),
    ],
    ids=["ok", "path", "no-subprotocol", "other-subprotocol", "no-upgrade", "mqtt-bytes", "huge"],
)
def test_handshakes(
    ws_broker: ThreadBroker,
    mqtt_clients: Clients,
    broker_log: LogEntries,
    request_bytes: bytes,
    status: bytes,
) -> None:
    bystander = ws_paho(mqtt_clients, ws_port(ws_broker)).connected()
    assert raw_http(ws_port(ws_broker), request_bytes) == status
    if not status.endswith(b"101 Switching Protocols"):
        assert any(str(e["event"]).startswith("websocket handshake refused") for e in broker_log)
    assert bystander.subscribe(("calm", 0)) == [0]


def test_paho_refused_on_the_wrong_path(ws_broker: ThreadBroker, mqtt_clients: Clients) -> None:
    client = ws_paho(mqtt_clients, ws_port(ws_broker))
    client.client.ws_set_options(path="/elsewhere")
    with pytest.raises((OSError, ConnectionError)):
        client.client.connect(HOST, client.port, 60)


def test_stalled_handshake_times_out(make_mqtt_broker: MakeBroker, broker_log: LogEntries) -> None:
    broker = make_mqtt_broker(mqtt={"port": 0, "ws_port": 0, "connect_timeout_s": 0.5})
    with closing(socket.create_connection((HOST, ws_port(broker)), timeout=TIMEOUT)) as sock:
        sock.sendall(b"GET /mqtt HTTP/1.1\r\n")
        assert sock.recv(100) == b""  # closed by the broker
    assert "websocket handshake timed out" in {e["event"] for e in broker_log}


def test_invalid_status_from_the_library_client(ws_broker: ThreadBroker) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(f"ws://{HOST}:{ws_port(ws_broker)}/mqtt", open_timeout=TIMEOUT)
    assert refused.value.response.status_code == 400  # no "mqtt" subprotocol offered


def test_management_lists_and_closes_a_websocket_connection(
    ws_broker: ThreadBroker, ws_clients: WsClients
) -> None:
    client = ws_clients()
    client.ws.send(encode(Connect(client_id="ws-managed")))
    assert isinstance(client.recv(), Connack)
    [conn] = ws_broker.call(list_connections)
    assert conn.id.startswith("mqttws_") and conn.client_id == "ws-managed"
    detail = ws_broker.call(lambda b: connection_detail(b, conn.id))
    assert detail.details["websocket"] is True
    ws_broker.call(lambda b: close_connection(b, conn.id, "maintenance"))
    assert client.closed_with() == 1008


def _v5_connect(client_id: bytes) -> bytes:
    """An MQTT 5.0 CONNECT (level 5, clean start, keep-alive 60, no properties), by hand:
    the layer must not care which version it carries."""
    body = b"\x00\x04MQTT\x05\x02\x00\x3c\x00" + len(client_id).to_bytes(2, "big") + client_id
    return bytes((0x10, len(body))) + body


def _one_packet(read: Callable[[], bytes]) -> bytes:
    """The first whole MQTT packet of a byte stream (``read`` gives more)."""
    data = b""
    for _ in range(100):
        if len(data) >= 2:
            length, shift, i = 0, 0, 1
            while i < len(data):
                length |= (data[i] & 0x7F) << shift
                shift += 7
                i += 1
                if not data[i - 1] & 0x80:
                    if len(data) >= i + length:
                        return data[: i + length]
                    break
        chunk = read()
        assert chunk, f"closed after {data!r}"
        data += chunk
    raise AssertionError("no whole packet")


def test_a_v5_connect_is_answered_over_websockets_as_over_tcp(
    ws_broker: ThreadBroker, ws_clients: WsClients
) -> None:
    """Whatever the broker's MQTT 5.0 support, the same CONNECT gets the same answer: the
    layer carries both versions unchanged (paho/mqtt.js with MQTT 5.0 over WebSockets are
    tested where the v5 features are)."""
    with closing(socket.create_connection((HOST, ws_broker.mqtt_port), timeout=TIMEOUT)) as sock:
        sock.sendall(_v5_connect(b"v5-over-tcp"))
        over_tcp = _one_packet(lambda: sock.recv(4096))
    client = ws_clients()
    client.ws.send(_v5_connect(b"v5-over-ws!"))

    def read_ws() -> bytes:
        message = client.ws.recv(timeout=TIMEOUT)
        assert isinstance(message, bytes)
        return message

    assert _one_packet(read_ws) == over_tcp
    assert over_tcp[0] == 0x20  # a CONNACK
