"""The WebSocket layer (vibemq_server/server/websocket.py), sans-IO: the bytes a real client
library (``websockets``' own ``ClientProtocol``) sends, fed in every split, reach the inner
session as one byte stream; what the inner session sends reaches the client as binary
messages; bad input gets the HTTP status or close code RFC 6455 names, and the inner session
sees nothing after it."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from vibemq_server.server.transport import Link, ReadBatch, Session, SessionInfo
from vibemq_server.server.websocket import Endpoint, WebSocketSession

ENDPOINT = Endpoint(
    path="/mqtt",
    subprotocols=("mqtt",),
    max_message=4096,
    handshake_timeout=10.0,
    protocol="mqtt",
)


class Wire:
    """The transport's side of the layer (a ``Link``): records what is sent and closed."""

    conn_id = "ws-test"
    peer_host = "127.0.0.1"
    peer_identity: str | None = None
    over_tls = False
    reading_paused = False

    def __init__(self) -> None:
        self.log = structlog.get_logger("test")
        self.out = bytearray()
        self.closed = False
        self.aborted = False
        self.now = 0.0

    @property
    def writable(self) -> bool:
        return not self.closed

    def send(self, data: bytes) -> None:
        assert not self.closed, "sent after close"
        self.out += data

    def send_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        for part in parts:
            self.send(bytes(part))

    def take(self) -> bytes:
        data, self.out = bytes(self.out), bytearray()
        return data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def call_soon(self, callback: Callable[[], None]) -> None:
        callback()

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        raise AssertionError("the layer sets no timer")

    def offload(self, work: Callable[[], Any], then: Callable[[Any], None]) -> None:
        then(work())

    def time(self) -> float:
        return self.now

    def replace_session(self, session: Session) -> None:
        raise AssertionError("the layer keeps its place in front of the transport")


class Echo:
    """An inner session that records its stream and sends back what it is given (so every
    read's bytes come back as one message)."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.stream = bytearray()
        self.lost = False
        self.shutdowns: list[str] = []

    def data_received(self, data: bytes) -> None:
        assert isinstance(data, bytes)
        self.stream += data
        self.link.send(data)

    def writable_again(self) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        pass

    def shutdown(self, reason: str) -> None:
        self.shutdowns.append(reason)
        self.link.close()

    def describe(self) -> SessionInfo:
        return SessionInfo("mqtt", "alice", "c1", "connected")

    def close_by_operator(self, reason: str) -> None:
        self.link.close()


class Pair:
    """A client (``websockets.client.ClientProtocol``) and our layer over a ``Wire``."""

    def __init__(
        self,
        endpoint: Endpoint = ENDPOINT,
        path: str = "/mqtt",
        subprotocols: list[str] | None = None,
        batch: ReadBatch | None = None,
    ) -> None:
        self.wire = Wire()
        self.inner: Echo | None = None
        self.layer = WebSocketSession(self.wire, self._make, endpoint, batch)
        self.client = ClientProtocol(
            parse_uri(f"ws://127.0.0.1{path}"),
            subprotocols=[
                Subprotocol(p) for p in (["mqtt"] if subprotocols is None else subprotocols)
            ],
            max_size=None,
        )
        self.client.send_request(self.client.connect())

    def _make(self, link: Link) -> Session:
        self.inner = Echo(link)
        return self.inner

    @staticmethod
    def framer() -> ClientProtocol:
        """A client that frames as if its handshake were done (what a client sends right
        after its request, before it has read the response)."""
        early = ClientProtocol(parse_uri("ws://127.0.0.1/mqtt"))
        early.state = State.OPEN
        return early

    def client_bytes(self) -> bytes:
        return b"".join(self.client.data_to_send())

    def feed(self, data: bytes) -> None:
        self.layer.data_received(data)

    def reply(self) -> list[Any]:
        """What the layer sent, as the client parses it."""
        self.client.receive_data(self.wire.take())
        return self.client.events_received()

    def open(self) -> None:
        self.feed(self.client_bytes())
        [response] = self.reply()
        assert isinstance(response, Response) and response.status_code == 101, response
        assert self.client.state is State.OPEN and self.inner is not None


def frames(
    client: ClientProtocol, messages: list[list[bytes]], pings: list[bytes] | None = None
) -> bytes:
    """Each message as binary frames (one per fragment); if ``pings`` are given, a ping
    after each message and between the fragments of the odd ones (RFC 6455 allows control
    frames there)."""
    for i, fragments in enumerate(messages):
        client.send_binary(fragments[0], fin=len(fragments) == 1)
        for j, part in enumerate(fragments[1:], 2):
            if pings and i % 2:
                client.send_ping(b"mid")
            client.send_continuation(part, fin=j == len(fragments))
        if pings:
            client.send_ping(pings[i % len(pings)])
    return b"".join(client.data_to_send())


def cuts(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in itertools.pairwise(edges)]


messages_st = st.lists(
    st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=4), min_size=1, max_size=6
)


@settings(max_examples=150, deadline=None)
@given(messages=messages_st, points=st.lists(st.integers(0, 10_000), max_size=30))
def test_stream_arrives_whole_in_any_split(messages: list[list[bytes]], points: list[int]) -> None:
    pair = Pair()
    wire = pair.client_bytes() + frames(pair.framer(), messages, pings=[b"p"])
    for piece in cuts(wire, points):
        pair.feed(piece)
    expected = b"".join(b"".join(m) for m in messages)
    assert pair.inner is not None and bytes(pair.inner.stream) == expected
    events = pair.reply()
    assert isinstance(events[0], Response) and events[0].status_code == 101
    echoed = [e for e in events[1:] if e.opcode is Opcode.BINARY]
    pongs = [e for e in events[1:] if e.opcode is Opcode.PONG]
    assert b"".join(e.data for e in echoed) == expected
    assert all(e.fin for e in echoed), "each send is one whole binary message"
    assert [p.data for p in pongs if p.data == b"p"] == [b"p"] * len(messages)
    middle = sum(len(m) - 1 for i, m in enumerate(messages) if i % 2)
    assert len(pongs) == len(messages) + middle
    assert not pair.wire.closed


def test_split_at_every_byte() -> None:
    """The handshake and a message of three fragments, one byte per read."""
    pair = Pair()
    messages = [[b"\x10\x0c\x00\x04MQTT", b"\x04\x02\x00", b"\x3c\x00\x00"], [b"\xc0\x00" * 3]]
    wire = pair.client_bytes() + frames(pair.framer(), messages)
    for i in range(len(wire)):
        pair.feed(wire[i : i + 1])
    assert pair.inner is not None
    assert bytes(pair.inner.stream) == b"".join(b"".join(m) for m in messages)


@settings(max_examples=200, deadline=None)
@given(junk=st.binary(min_size=1, max_size=600), points=st.lists(st.integers(0, 700)))
def test_random_bytes_after_the_handshake_never_escape(junk: bytes, points: list[int]) -> None:
    """Whatever follows the handshake: no exception, and either data or a close."""
    pair = Pair()
    pair.open()
    for piece in cuts(junk, points):
        pair.feed(piece)
    assert pair.inner is not None
    assert pair.layer.phase.value in ("open", "closing")


@settings(max_examples=200, deadline=None)
@given(junk=st.binary(min_size=1, max_size=600))
def test_random_bytes_instead_of_a_handshake(junk: bytes) -> None:
    pair = Pair()
    pair.feed(junk)
    assert pair.inner is None


def close_of(events: list[Any]) -> int:
    closes = [e for e in events if isinstance(e, Frame) and e.opcode is Opcode.CLOSE]
    assert closes, f"no close frame in {events}"
    return int.from_bytes(closes[0].data[:2], "big")


def test_text_frame_closes_with_1003_after_the_data_before_it() -> None:
    pair = Pair()
    pair.open()
    pair.client.send_binary(b"before")
    pair.client.send_text(b"text")
    pair.client.send_binary(b"after")
    pair.feed(pair.client_bytes())
    assert pair.inner is not None and bytes(pair.inner.stream) == b"before"
    assert close_of(pair.reply()) == 1003
    assert pair.wire.closed


@pytest.mark.parametrize("fragments", [[b"x" * 5000], [b"x" * 3000, b"y" * 3000]])
def test_message_over_the_limit_closes_with_1009(fragments: list[bytes]) -> None:
    pair = Pair()
    pair.open()
    pair.feed(frames(pair.client, [fragments]))
    assert close_of(pair.reply()) == 1009
    assert pair.wire.closed


def test_the_data_before_a_message_over_the_limit_is_handled() -> None:
    """Frames read together with an oversized one: those before it reach the session (as
    before a text frame), nothing after it."""
    pair = Pair()
    pair.open()
    pair.feed(frames(pair.client, [[b"before"], [b"ok"], [b"x" * 5000], [b"after"]]))
    assert pair.inner is not None and bytes(pair.inner.stream) == b"beforeok"
    assert close_of(pair.reply()) == 1009
    assert pair.wire.closed


def test_several_packets_in_one_frame_and_one_packet_over_many() -> None:
    """The layer does not look at the stream: a frame of two ``packets`` and one ``packet``
    in three frames arrive as they were sent."""
    pair = Pair()
    pair.open()
    pair.feed(frames(pair.client, [[b"\xc0\x00\xc0\x00"], [b"\x30", b"\x02", b"ab"]]))
    assert pair.inner is not None and bytes(pair.inner.stream) == b"\xc0\x00\xc0\x00\x30\x02ab"


def test_sends_during_a_read_go_out_as_one_frame_when_it_ends() -> None:
    """While the broker's read batch is open, what the session sends (deliveries, from
    another connection's read) is gathered; the batch's end frames it once, in order, and a
    close frame sent meanwhile comes after it."""
    batch = ReadBatch()
    pair = Pair(batch=batch)
    pair.open()
    assert pair.inner is not None
    batch.begin()
    for packet in (b"\x30\x03\x00\x01a", b"\x30\x03\x00\x01b", b"\x30\x03\x00\x01c"):
        pair.inner.link.send(packet)
    assert pair.wire.take() == b""  # nothing before the read is done
    batch.end()
    [frame] = pair.reply()
    assert frame.data == b"\x30\x03\x00\x01a\x30\x03\x00\x01b\x30\x03\x00\x01c"
    batch.begin()
    pair.inner.link.send(b"\xe0\x00")
    pair.inner.link.close()  # the gathered bytes first, then the close frame
    batch.end()
    data, close = pair.reply()
    assert data.data == b"\xe0\x00" and close.opcode is Opcode.CLOSE
    assert pair.wire.closed


def test_client_close_is_answered_and_the_socket_closed() -> None:
    pair = Pair()
    pair.open()
    pair.client.send_binary(b"\xe0\x00")  # (a DISCONNECT) sent with the close frame
    pair.client.send_close(1000)
    pair.feed(pair.client_bytes())
    assert pair.inner is not None and bytes(pair.inner.stream) == b"\xe0\x00"
    assert close_of(pair.reply()) == 1000
    assert pair.wire.closed


@pytest.mark.parametrize(
    ("action", "code"),
    [
        (lambda layer: layer.session.link.close(), 1000),
        (lambda layer: layer.shutdown("broker stopping"), 1001),
        (lambda layer: layer.close_by_operator("kicked"), 1008),
    ],
)
def test_server_close_codes(action: Callable[[Any], None], code: int) -> None:
    pair = Pair()
    pair.open()
    action(pair.layer)
    assert close_of(pair.reply()) == code
    assert pair.wire.closed and not pair.wire.aborted


@pytest.mark.parametrize(
    ("path", "subprotocols", "status"),
    [("/other", ["mqtt"], 404), ("/mqtt", [], 400), ("/mqtt", ["chat"], 400)],
)
def test_bad_handshakes(path: str, subprotocols: list[str], status: int) -> None:
    pair = Pair(path=path, subprotocols=subprotocols)
    pair.feed(pair.client_bytes())
    [response] = pair.reply()
    assert isinstance(response, Response) and response.status_code == status
    assert pair.wire.closed and pair.inner is None


def raw_response(wire: Wire) -> bytes:
    return wire.take().split(b"\r\n", 1)[0]


@pytest.mark.parametrize(
    "junk",
    [b"\x10\x0c\x00\x04MQTT\x04\x02\x00<\x00\x00", b"\x16\x03\x01\x02", b"GET\r\n\r\n"],
    ids=["mqtt", "tls", "bad-request-line"],
)
def test_not_http_gets_400(junk: bytes) -> None:
    pair = Pair()
    pair.feed(junk)
    assert raw_response(pair.wire) == b"HTTP/1.1 400 Bad Request"
    assert pair.wire.closed


def test_oversized_handshake_gets_431_in_any_split() -> None:
    pair = Pair()
    request = pair.client_bytes()
    head, _ = request.split(b"\r\n\r\n", 1)
    big = head + b"".join(b"\r\nX-Pad-%d: %s" % (i, b"v" * 4000) for i in range(6))
    for i in range(0, len(big), 1000):
        pair.feed(big[i : i + 1000])
        if pair.wire.closed:
            break
    assert raw_response(pair.wire) == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert pair.inner is None


def test_oversized_handshake_in_one_read_gets_431() -> None:
    pair = Pair()
    head, _ = pair.client_bytes().split(b"\r\n\r\n", 1)
    pair.feed(
        head + b"".join(b"\r\nX-Pad-%d: %s" % (i, b"v" * 4000) for i in range(6)) + b"\r\n\r\n"
    )
    assert raw_response(pair.wire) == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert pair.inner is None


def test_handshake_timeout_aborts() -> None:
    pair = Pair()
    pair.feed(pair.client_bytes()[:20])
    pair.layer.check_timers(9.0, 60.0, 10.0)
    assert not pair.wire.closed
    pair.layer.check_timers(10.0, 60.0, 10.0)
    assert pair.wire.aborted and pair.inner is None


def test_describe_before_and_after_the_handshake() -> None:
    pair = Pair()
    assert pair.layer.describe().state == "websocket handshake"
    pair.open()
    info = pair.layer.describe()
    assert info.client_id == "c1" and info.details["websocket"] is True


def test_inner_link_is_the_transports_with_framing() -> None:
    pair = Pair()
    pair.open()
    assert pair.inner is not None
    link = pair.inner.link
    assert (link.conn_id, link.peer_host, link.over_tls) == ("ws-test", "127.0.0.1", False)
    assert link.writable
    pair.layer.close_by_operator("x")
    assert not link.writable
    link.send(b"dropped after close")  # no error, nothing written
    assert pair.wire.take() == b"" or pair.wire.closed


BIG = Endpoint(
    path="/mqtt",
    subprotocols=("mqtt",),
    max_message=200_000,
    handshake_timeout=10.0,
    protocol="mqtt",
)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(
        st.sampled_from([0, 1, 125, 126, 127, 65_535, 65_536, 70_000]), min_size=1, max_size=4
    ),
    points=st.lists(st.integers(0, 300_000), max_size=20),
)
def test_every_length_encoding_in_any_split(sizes: list[int], points: list[int]) -> None:
    """7-bit, 16-bit and 64-bit lengths, each way."""
    pair = Pair(BIG)
    pair.open()
    messages = [[bytes([i % 251]) * size] for i, size in enumerate(sizes)]
    for piece in cuts(frames(pair.client, messages), points):
        pair.feed(piece)
    assert pair.inner is not None
    assert bytes(pair.inner.stream) == b"".join(m[0] for m in messages)
    echoed = [e for e in pair.reply() if e.opcode is Opcode.BINARY]
    assert b"".join(e.data for e in echoed) == bytes(pair.inner.stream)


def test_unmasked_client_frame_closes_with_1002() -> None:
    pair = Pair()
    pair.open()
    pair.feed(b"\x82\x02ab")
    assert close_of(pair.reply()) == 1002
    assert pair.wire.closed and pair.inner is not None and bytes(pair.inner.stream) == b""


def test_new_message_inside_a_fragmented_one_closes_with_1002() -> None:
    pair = Pair()
    pair.open()
    pair.client.send_binary(b"first", fin=False)
    pair.feed(pair.client_bytes())
    early = Pair.framer()
    early.send_binary(b"second")
    pair.feed(b"".join(early.data_to_send()))
    assert close_of(pair.reply()) == 1002
    assert pair.inner is not None and bytes(pair.inner.stream) == b"first"


def test_a_stalled_frame_times_out_with_1008() -> None:
    pair = Pair()
    pair.open()
    whole = frames(pair.client, [[b"x" * 100]])
    pair.wire.now = 5.0
    pair.feed(whole[:50])
    pair.layer.check_timers(15.0, 60.0, 10.0)
    assert not pair.wire.closed
    pair.feed(whole[50:60])  # more of the same frame: still the same deadline
    pair.layer.check_timers(15.1, 60.0, 10.0)
    assert close_of(pair.reply()) == 1008
    assert pair.wire.closed
