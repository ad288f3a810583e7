"""MQTT 5.0 features beyond the core set (docs/mqtt.md), with real clients: Response
Information, Server Reference (redirection on CONNECT and on shutdown), the Message Expiry
Interval of retained messages (also across a restart), Request Problem Information 0, and
the WebSocket listener's ``Origin`` check.

paho-mqtt (``protocol=MQTTv5``, also over WebSockets), aiomqtt, ``mosquitto_sub -V mqttv5``
and the raw v5 client (``RawMqtt(v5=True)``) for what paho does not show (the properties of
a SUBACK, a DISCONNECT's reason string)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from mqttkit import HOST, unique_id
from mqttutil import V5, Clients, LogEntries, MakeBroker, Paho, ThreadBroker, props, v5
from paho.mqtt.packettypes import PacketTypes
from test_mqtt_websocket import raw_http, upgrade, ws_port
from test_permissions import permit
from userskit import add_user
from waits import wait_until

from vibemq_server.adapters.mqtt.packets5 import (
    Connack5,
    Disconnect5,
    Properties,
    Puback5,
    Publish5,
    Suback5,
    SubOptions,
    Subscribe5,
)

pytestmark = pytest.mark.timeout(60)

# -- Response Information ------------------------------------------------------------------------


def test_response_information_and_a_request_answered_there(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients
) -> None:
    broker = make_mqtt_broker(mqtt={"port": 0, "response_information": "reply/%c/"})
    cid = unique_id("requester")
    ask = props(PacketTypes.CONNECT, RequestResponseInformation=1)
    requester = v5(mqtt_clients, broker, cid, properties=ask)
    prefix = requester.connack_props.ResponseInformation
    assert prefix == f"reply/{cid}/"
    assert requester.subscribe((prefix + "#", 1)) == [1]
    # a responder takes the request's Response Topic and Correlation Data
    responder = v5(mqtt_clients, broker)
    assert responder.subscribe(("service/time", 1)) == [1]
    requester.publish(
        "service/time",
        b"now?",
        1,
        properties=props(ResponseTopic=prefix + "time", CorrelationData=b"\x07"),
    )
    request = responder.get()
    responder.publish(
        request.properties.ResponseTopic,
        b"12:00",
        1,
        properties=props(CorrelationData=request.properties.CorrelationData),
    )
    answer = requester.get()
    assert (answer.topic, answer.payload) == (f"reply/{cid}/time", b"12:00")
    assert answer.properties.CorrelationData == b"\x07"


def test_response_information_only_when_asked_and_configured(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients
) -> None:
    ask = props(PacketTypes.CONNECT, RequestResponseInformation=1)
    plain = make_mqtt_broker()  # the default: none, even when asked
    got = v5(mqtt_clients, plain, properties=ask).connack_props
    assert not hasattr(got, "ResponseInformation")
    broker = make_mqtt_broker(mqtt={"port": 0, "response_information": "reply/%c/"})
    got = v5(mqtt_clients, broker).connack_props  # not asked
    assert not hasattr(got, "ResponseInformation")
    # a client id whose prefix would lie inside another client's gets none
    got = v5(mqtt_clients, broker, "a/b", properties=ask).connack_props
    assert not hasattr(got, "ResponseInformation")


def test_response_information_under_permissions(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients, tmp_path: Path
) -> None:
    """The broker tells the prefix and grants nothing: permissions decide as for any topic
    (here a requester may read its own prefix only, a responder write replies only)."""
    path = tmp_path / "users.json"
    for name in ("req", "svc"):
        add_user(path, name, f"{name}-pw")
    permit(path, "req", write=r"^service\.", read=r"^reply\.%c\.")
    permit(path, "svc", write=r"^reply\.", read=r"^service\.")
    broker = make_mqtt_broker(
        users_file=path,
        allow_anonymous=False,
        mqtt={"port": 0, "response_information": "reply/%c/"},
    )

    def login(user: str, client_id: str | None = None, **kw: Any) -> Paho:
        client = mqtt_clients.paho(broker.mqtt_port, client_id, protocol=V5)
        client.username_pw_set(user, f"{user}-pw")
        return client.connected(**kw)

    cid = unique_id("req")
    ask = props(PacketTypes.CONNECT, RequestResponseInformation=1)
    requester = login("req", cid, properties=ask)
    prefix = requester.connack_props.ResponseInformation
    assert prefix == f"reply/{cid}/"
    assert requester.subscribe((prefix + "#", 1), ("reply/someone-else/#", 1)) == [1, 0x87]
    responder = login("svc")
    responder.publish(prefix + "r", b"answer", 1)
    assert requester.get().payload == b"answer"


# -- Server Reference ----------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "reason"), [("use_another", 0x9C), ("moved", 0x9D)])
def test_server_reference_refuses_v5_connects(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients, mode: str, reason: int
) -> None:
    broker = make_mqtt_broker(
        mqtt={
            "port": 0,
            "server_reference": "mqtt2.example.com:1883",
            "server_reference_mode": mode,
        }
    )
    raw = mqtt_clients.raw(broker.mqtt_port, v5=True)
    ack = raw.connect5()
    assert ack == Connack5(reason, False, Properties(server_reference="mqtt2.example.com:1883"))
    assert raw.wait_closed() == []
    client = mqtt_clients.paho(broker.mqtt_port, protocol=V5)
    assert client.connect() == reason
    assert client.connack_props.ServerReference == "mqtt2.example.com:1883"
    # 3.1.1 has no redirection: its clients are still served
    old = mqtt_clients.paho(broker.mqtt_port).connected()
    assert old.subscribe(("still/here", 1)) == [1]


def test_mosquitto_sub_is_told_the_server_moved(make_mqtt_broker: MakeBroker) -> None:
    broker = make_mqtt_broker(
        mqtt={"port": 0, "server_reference": "other.example:1883", "server_reference_mode": "moved"}
    )
    cmd = ["mosquitto_sub", "-V", "mqttv5", "-h", HOST, "-p", str(broker.mqtt_port), "-t", "x"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    assert done.returncode != 0
    assert "server moved" in (done.stdout + done.stderr).lower()


def test_server_reference_on_shutdown(make_mqtt_broker: MakeBroker, mqtt_clients: Clients) -> None:
    broker = make_mqtt_broker(mqtt={"port": 0, "server_reference": "standby.example:1883"})
    client = v5(mqtt_clients, broker)  # the default mode, "shutdown": connects are served
    raw = mqtt_clients.raw(broker.mqtt_port, v5=True)
    assert raw.connect5().reason_code == 0
    broker.stop()
    packets = raw.wait_closed()
    assert packets == [Disconnect5(0x9C, Properties(server_reference="standby.example:1883"))]
    assert client.disconnects.get(timeout=10) == 0x9C
    assert client.disconnect_props.ServerReference == "standby.example:1883"


# -- retained messages with a Message Expiry Interval -------------------------------------------


def _retained_expiry(broker: ThreadBroker, topic: str) -> int:
    def look(b: Any) -> int:
        msg = b.adapters["mqtt"].retained.get(topic)
        return 0 if msg is None else int(msg.expires_at)

    return broker.call(look)


def _clock_past(broker: ThreadBroker, when: int) -> None:
    wait_until(lambda: broker.call(lambda b: b.manager.clock()) > when, "expiry", timeout=5)


@pytest.mark.parametrize("sweep", [True, False], ids=["swept", "on-subscribe"])
def test_retained_message_expires(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients, sweep: bool
) -> None:
    # Without the housekeeping sweep, the expiry is seen when a subscriber comes.
    broker = make_mqtt_broker(housekeeping_interval_ms=100 if sweep else 3_600_000)
    pub = v5(mqtt_clients, broker)
    pub.publish("rexp/short", b"gone", 1, retain=True, properties=props(MessageExpiryInterval=1))
    pub.publish("rexp/long", b"kept", 1, retain=True, properties=props(MessageExpiryInterval=600))
    pub.publish("rexp/ever", b"always", 1, retain=True)
    short = _retained_expiry(broker, "rexp/short")
    assert short > 0 and _retained_expiry(broker, "rexp/ever") == 0
    _clock_past(broker, short)
    if sweep:
        wait_until(lambda: _retained_expiry(broker, "rexp/short") == 0, "the sweep")
    sub = v5(mqtt_clients, broker)
    assert sub.subscribe(("rexp/#", 1)) == [1]
    got = {m.topic: m for m in (sub.get(), sub.get())}
    assert sorted(got) == ["rexp/ever", "rexp/long"]
    assert 0 < got["rexp/long"].properties.MessageExpiryInterval <= 600
    assert not hasattr(got["rexp/ever"].properties, "MessageExpiryInterval")
    old = mqtt_clients.paho(broker.mqtt_port).connected()  # 3.1.1: no property, same rule
    assert old.subscribe(("rexp/#", 0)) == [0]
    assert sorted(m.payload for m in (old.get(), old.get())) == [b"always", b"kept"]
    sub.assert_no_more()
    assert _retained_expiry(broker, "rexp/short") == 0  # forgotten, not only skipped


def test_expired_retained_messages_leave_room_under_the_limit(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients, broker_log: LogEntries
) -> None:
    broker = make_mqtt_broker(
        housekeeping_interval_ms=3_600_000, mqtt={"port": 0, "max_retained": 1}
    )
    pub = v5(mqtt_clients, broker)
    pub.publish("full/a", b"a", 1, retain=True, properties=props(MessageExpiryInterval=1))
    _clock_past(broker, _retained_expiry(broker, "full/a"))
    pub.publish("full/b", b"b", 1, retain=True)
    sub = v5(mqtt_clients, broker)
    assert sub.subscribe(("full/#", 1)) == [1]
    assert sub.get().payload == b"b"
    assert not any("limit reached" in str(e["event"]) for e in broker_log)
    pub.publish("full/c", b"c", 1, retain=True)  # the limit still holds for live ones
    assert any("limit reached" in str(e["event"]) for e in broker_log)


def test_retained_expiry_survives_a_restart(tmp_path: Path, mqtt_clients: Clients) -> None:
    data = tmp_path / "data"
    first = ThreadBroker(data).start()
    try:
        pub = mqtt_clients.paho(first.mqtt_port, protocol=V5).connected()
        for topic, expiry in (("rr/short", 1), ("rr/long", 600)):
            pub.publish(topic, b"r", 1, retain=True, properties=props(MessageExpiryInterval=expiry))
        short, long = _retained_expiry(first, "rr/short"), _retained_expiry(first, "rr/long")
        pub.disconnect()
    finally:
        first.stop()
    second = ThreadBroker(data).start()
    try:
        assert _retained_expiry(second, "rr/long") == long  # the same deadline, not a new one
        _clock_past(second, short)
        sub = mqtt_clients.paho(second.mqtt_port, protocol=V5).connected()
        assert sub.subscribe(("rr/#", 1)) == [1]
        msg = sub.get()
        assert msg.topic == "rr/long"
        assert 0 < msg.properties.MessageExpiryInterval <= 600
        sub.assert_no_more()
        sub.disconnect()
    finally:
        second.stop()


async def test_aiomqtt_retained_message_with_expiry(make_mqtt_broker: MakeBroker) -> None:
    broker = make_mqtt_broker()
    topic = f"aioret/{unique_id('t')}"
    async with aiomqtt.Client(
        HOST, broker.mqtt_port, protocol=aiomqtt.ProtocolVersion.V5
    ) as client:
        await client.publish(
            topic, b"r", qos=1, retain=True, properties=props(MessageExpiryInterval=300)
        )
        await client.subscribe(topic, qos=1)
        async with asyncio.timeout(10):
            async for message in client.messages:
                assert message.retain and message.payload == b"r"
                assert message.properties is not None
                assert 0 < message.properties.MessageExpiryInterval <= 300
                break


# -- Request Problem Information -----------------------------------------------------------------


@pytest.mark.parametrize("problem_info", [0, 1])
def test_request_problem_information(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients, problem_info: int
) -> None:
    broker = make_mqtt_broker(
        mqtt={"port": 0, "deny_publish": ["secret/#"], "deny_subscribe": ["secret/#"]},
    )
    raw = mqtt_clients.raw(broker.mqtt_port, v5=True)
    asked = Properties(request_problem_information=problem_info)
    assert raw.connect5(properties=asked).reason_code == 0
    raw.send(Publish5("secret/x", b"x", 1, packet_id=5))
    assert raw.expect(Puback5) == Puback5(5, 0x87)  # no reason string, no user property
    raw.send(Subscribe5(6, (("secret/#", SubOptions(1)), ("open/#", SubOptions(1)))))
    assert raw.expect(Suback5) == Suback5(6, (0x80, 1))
    raw.send(b"\xf0\x00")  # AUTH without an authentication method: a protocol error
    packets = raw.wait_closed()
    assert [type(p) for p in packets] == [Disconnect5]
    assert packets[0].reason_code == 0x82
    reason = packets[0].properties.reason_string
    # DISCONNECT may carry one (section 3.1.2.11.7): only when the client did not say 0
    assert (reason is None) == (problem_info == 0)
    assert packets[0].properties.user_properties == ()


# -- WebSocket Origin ----------------------------------------------------------------------------


def _origin(value: str) -> bytes:
    return upgrade(extra=f"\r\nOrigin: {value}".encode())


@pytest.mark.parametrize(
    ("allowed", "origin", "ok"),
    [
        (None, None, True),  # not a browser
        (None, "http://127.0.0.1:8000", True),  # a page on this machine
        (None, "http://localhost", True),
        (None, "http://[::1]:3000", True),
        (None, "https://evil.example", False),  # another site, in a browser here
        (None, "http://localhost.evil.example", False),
        (None, "null", False),
        (["https://app.example.com"], "https://app.example.com", True),
        (["https://app.example.com"], "https://app.example.com:8443", False),
        (["https://app.example.com"], "http://127.0.0.1:8000", False),  # the list replaces
        (["https://*.example.com"], "https://a.b.example.com", True),
        (["*"], "https://evil.example", True),
    ],
)
def test_websocket_origin_check(
    make_mqtt_broker: MakeBroker,
    broker_log: LogEntries,
    allowed: list[str] | None,
    origin: str | None,
    ok: bool,
) -> None:
    mqtt_cfg: dict[str, Any] = {"port": 0, "ws_port": 0}
    if allowed is not None:
        mqtt_cfg["ws_allowed_origins"] = allowed
    broker = make_mqtt_broker(mqtt=mqtt_cfg)
    request = upgrade() if origin is None else _origin(origin)
    status = raw_http(ws_port(broker), request)
    if ok:
        assert status == b"HTTP/1.1 101 Switching Protocols"
    else:
        assert status == b"HTTP/1.1 403 Forbidden"
        event = "websocket handshake refused: origin not allowed"
        refused = [e for e in broker_log if e["event"] == event]
        assert [(e["origin"], e["status"]) for e in refused] == [(origin, 403)]


def test_paho_websockets_with_a_foreign_origin_is_refused(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients
) -> None:
    broker = make_mqtt_broker(mqtt={"port": 0, "ws_port": 0})
    port = ws_port(broker)
    # paho sends Origin http://{host}:{port}: a loopback origin, let in by default
    ok = mqtt_clients.paho(port, protocol=V5, transport="websockets").connected()
    assert ok.subscribe(("o/#", 0)) == [0]
    evil = mqtt_clients.paho(port, protocol=V5, transport="websockets")
    evil.client.ws_set_options(headers={"Origin": "https://evil.example"})
    with pytest.raises((OSError, ConnectionError)):
        evil.client.connect(HOST, port, 60)
