"""The AMQP session without a socket or an event loop: ``AmqpConnection`` over a recording
``Link``, in front of a real ``AmqpServer`` and ``QueueManager``.

Properties:

1. a publish with confirms reaches a consumer on another connection and is confirmed; the
   consumer's ack empties the queue;
2. the same client bytes fed in one piece or cut anywhere give the same output (the session
   is a pure function of its input bytes);
3. no input after the handshake (random bytes, frames cut or out of place) makes the session
   raise or fail internally (541); what it sends parses as frames, and after its
   connection.close it sends nothing but close-ok.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import structlog
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp.base import Frame as PamqpFrame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from vibemq_server.adapters.amqp.codec import PROTOCOL_HEADER
from vibemq_server.adapters.amqp.connection import AmqpConnection
from vibemq_server.adapters.amqp.server import AmqpServer
from vibemq_server.adapters.amqp.states import State
from vibemq_server.auth import Authenticator
from vibemq_server.config import Config
from vibemq_server.core import ManualClock, QueueManager
from vibemq_server.server.adapter import AdapterContext, Link
from vibemq_server.server.transport import ReadBatch

_ids = itertools.count(1)


class RecordingLink:
    """A ``Link`` whose socket is ``out``: sends are written at once, ``close``/``abort``
    only mark it closed (what a later loop turn would then report is left out)."""

    peer_identity: str | None = None  # a plain connection
    over_tls = False

    def __init__(self) -> None:
        self.conn_id = f"amqp_t{next(_ids)}"
        self.peer_host = "127.0.0.1"
        self.log = structlog.get_logger("vibemq.amqp").bind(conn_id=self.conn_id)
        self.out = bytearray()
        self.closed = False
        self.sent_after_close = b""
        self.paused = False
        self.now = 0.0
        self.offloaded: list[Any] = []

    @property
    def writable(self) -> bool:
        return not self.closed

    @property
    def reading_paused(self) -> bool:
        return self.paused

    def send(self, data: bytes) -> None:
        if self.closed:
            self.sent_after_close += data
        else:
            self.out += data

    def send_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        for part in parts:
            self.send(bytes(part))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def call_later(self, delay: float, callback: Any) -> None:
        callback()  # a refusal held back: at once here (this test's clock does not run)

    def call_soon(self, callback: Any) -> None:
        callback()

    def offload(self, work: Any, then: Any) -> None:
        # never before the caller returns (the transport's contract): run by run_offloaded
        self.offloaded.append(lambda: then(work()))

    def run_offloaded(self) -> None:
        while self.offloaded and not self.closed:
            self.offloaded.pop(0)()

    def time(self) -> float:
        return self.now


def _server() -> AmqpServer:
    config = Config()
    manager = QueueManager(config.queue_defaults, ManualClock())
    registered: set[Link] = set()

    def register(link: Link) -> bool:
        registered.add(link)
        return True

    server = AmqpServer(
        AdapterContext(
            config, manager, register, registered.discard, ReadBatch(), Authenticator(config)
        )
    )
    server.restore()
    return server


def _frames(data: bytes) -> list[tuple[int, Any]]:
    """Every frame in ``data`` (server to client), heartbeats left out."""
    out: list[tuple[int, Any]] = []
    pos = 0
    while pos < len(data):
        size = int.from_bytes(data[pos + 3 : pos + 7], "big")
        consumed, channel, value = pamqp_frame.unmarshal(data[pos : pos + size + 8])
        assert consumed == size + 8
        pos += consumed
        if not isinstance(value, Heartbeat):
            out.append((channel, value))
    return out


def _method(channel: int, method: PamqpFrame) -> bytes:
    return pamqp_frame.marshal(method, channel)


HANDSHAKE = (
    PROTOCOL_HEADER
    + _method(0, commands.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest"))
    + _method(0, commands.Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=0))
    + _method(0, commands.Connection.Open(virtual_host="/"))
    + _method(1, commands.Channel.Open())
)


def _publish(channel: int, body: bytes, routing_key: str) -> bytes:
    return (
        _method(channel, commands.Basic.Publish(exchange="", routing_key=routing_key))
        + pamqp_frame.marshal(ContentHeader(0, len(body), commands.Basic.Properties()), channel)
        + pamqp_frame.marshal(ContentBody(body), channel)
    )


def _connect(server: AmqpServer) -> tuple[RecordingLink, AmqpConnection]:
    link = RecordingLink()
    return link, AmqpConnection(link, server)


def test_a_confirmed_publish_reaches_a_consumer_on_another_connection() -> None:
    server = _server()
    pub_link, publisher = _connect(server)
    sub_link, subscriber = _connect(server)
    subscriber.data_received(
        HANDSHAKE
        + _method(1, commands.Queue.Declare(queue="jobs"))
        + _method(1, commands.Basic.Qos(prefetch_count=10))
        + _method(1, commands.Basic.Consume(queue="jobs", consumer_tag="c1"))
    )
    publisher.data_received(
        HANDSHAKE + _method(1, commands.Confirm.Select()) + _publish(1, b"hello", "jobs")
    )
    assert publisher.state is State.OPEN and subscriber.state is State.OPEN
    published = [f for _, f in _frames(bytes(pub_link.out))]
    assert isinstance(published[-1], commands.Basic.Ack)
    assert published[-1].delivery_tag == 1
    received = _frames(bytes(sub_link.out))
    deliver = [f for _, f in received if isinstance(f, commands.Basic.Deliver)]
    bodies = [f.value for _, f in received if isinstance(f, ContentBody)]
    assert [d.consumer_tag for d in deliver] == ["c1"] and bodies == [b"hello"]
    tag = deliver[0].delivery_tag
    assert tag is not None
    subscriber.data_received(_method(1, commands.Basic.Ack(delivery_tag=tag)))
    queue = server.manager.queues["jobs"]
    assert queue.message_count == 0 and queue.unacked_count == 0


CLIENT_BYTES = (
    HANDSHAKE
    + _method(1, commands.Queue.Declare(queue="q"))
    + _method(1, commands.Confirm.Select())
    + _publish(1, b"one", "q")
    + _publish(1, b"two", "nowhere")
    + _publish(1, b"three", "q")
    + _method(1, commands.Basic.Get(queue="q"))
    + _method(2, commands.Channel.Open())
    + _method(2, commands.Exchange.Declare(exchange="x", passive=True))
    + _method(3, commands.Channel.Open())
    + _method(3, commands.Basic.Get(queue="missing"))
)
#: (a read of its own: confirms still due at the end of a read that closes go unsent)
CLOSE = _method(0, commands.Connection.Close(200, "bye", 0, 0))


def _shape(out: bytearray) -> tuple[list[tuple[int, str, int | None]], set[int]]:
    """The frames in order (kind, channel, reply code), publisher confirms aside: those go
    out when a read is done, so where they fall depends on how the input was cut; their
    sum (the confirmed sequence numbers) does not."""
    frames: list[tuple[int, str, int | None]] = []
    confirmed: set[int] = set()
    for channel, f in _frames(bytes(out)):
        if isinstance(f, commands.Basic.Ack):
            tag = f.delivery_tag or 0
            confirmed |= set(range(1, tag + 1)) if f.multiple else {tag}
        else:
            frames.append((channel, type(f).__name__, getattr(f, "reply_code", None)))
    return frames, confirmed


@settings(max_examples=50, deadline=None)
@given(cuts=st.lists(st.integers(1, len(CLIENT_BYTES) - 1), max_size=12, unique=True))
def test_the_output_does_not_depend_on_how_the_input_is_cut(cuts: list[int]) -> None:
    whole_link, whole = _connect(_server())
    whole.data_received(CLIENT_BYTES)
    whole.data_received(CLOSE)
    cut_link, cut = _connect(_server())
    bounds = [0, *sorted(cuts), len(CLIENT_BYTES)]
    for start, stop in itertools.pairwise(bounds):
        cut.data_received(CLIENT_BYTES[start:stop])
    cut.data_received(CLOSE)
    frames, confirmed = _shape(whole_link.out)
    assert _shape(cut_link.out) == (frames, confirmed)
    assert confirmed == {1, 2, 3}
    assert [code for _, kind, code in frames if kind == "Close"] == [404, 404]
    assert whole.state is State.CLOSED and whole_link.closed


@settings(max_examples=200, deadline=None)
@given(
    noise=st.lists(
        st.one_of(
            st.binary(max_size=40),
            st.sampled_from(
                [
                    _publish(1, b"x", "q"),
                    _publish(1, b"x", "q")[:-5],
                    pamqp_frame.marshal(ContentBody(b"stray"), 1),
                    _method(1, commands.Basic.Ack(delivery_tag=7)),
                    _method(3, commands.Basic.Qos()),
                    _method(0, commands.Connection.Open(virtual_host="/")),
                    _method(1, commands.Channel.Close(200, "bye", 0, 0)),
                    _method(0, commands.Connection.CloseOk()),
                    PROTOCOL_HEADER,
                ]
            ),
        ),
        max_size=8,
    )
)
def test_no_input_makes_the_session_raise(noise: list[bytes]) -> None:
    link, conn = _connect(_server())
    conn.data_received(HANDSHAKE + _method(1, commands.Queue.Declare(queue="q")))
    for chunk in noise:
        if link.closed:
            break
        conn.data_received(chunk)  # no exception escapes (the transport would log it)
    frames = _frames(bytes(link.out))  # what the client got parses as frames
    closes = [i for i, (_, f) in enumerate(frames) if isinstance(f, commands.Connection.Close)]
    # (a bug in a handler would be caught and answered 541 INTERNAL_ERROR: none may be)
    assert not [
        f
        for _, f in frames
        if isinstance(f, commands.Connection.Close | commands.Channel.Close) and f.reply_code == 541
    ]
    if closes:  # after connection.close only its close-ok may follow
        assert all(isinstance(f, commands.Connection.CloseOk) for _, f in frames[closes[0] + 1 :])
    conn.connection_lost(None)
    assert conn.state is State.CLOSED and not conn.channels
