"""The AMQP 0-9-1 session fuzzed through the broker's real connections, as a socket drives them.

A real broker is started (journal in a temporary directory); the protocol factory its AMQP
listener gave ``loop.create_server`` is captured, and each client connection is one protocol
from that factory over ``FakeSocket`` (fakesocket.py), a stand-in transport that records what
the broker writes. Only the ``asyncio.Protocol`` boundary is used (``connection_made``,
``data_received``, ``pause_writing``/``resume_writing``, ``connection_lost``), so the test
does not depend on how the AMQP adapter is built inside.

Hypothesis drives one to three connections: valid client frames of every class the broker
implements over three channels (handshake, channel open/close/flow, exchange and queue
declare/bind/unbind/purge/delete with and without durability and arguments, basic
qos/consume/cancel/publish with content split over body frames/get/ack/nack/reject/recover,
confirm.select, tx.*) in any order, always cut at random byte positions (a cut frame may wait
while other connections send); at a chaos level drawn per example, also garbage bytes, frames
of wrong types, frames on channels never opened, lying content headers, handshakes gone
wrong; the peer stops and starts reading, vanishes and connects again. A polite client (most
examples) reopens what the server closed, as real clients do, so that the run goes on.
Properties:

1. nothing escapes the protocol: no exception out of a protocol method, none in a loop
   callback, no error logged, no ``541 INTERNAL_ERROR`` (the broker's own answer to a bug);
2. everything written to each socket parses as AMQP server frames (pamqp's unmarshal, not our
   codec): a protocol header only as the whole reply to a bad greeting, connection.start first
   and the handshake in order, only server-to-client methods, connection methods on channel 0
   and no others there, nothing on a channel but its opening until it is open, nothing but
   close-ok after the server closed a channel or the connection, content (header, then body
   frames adding up to the announced size, each within the negotiated frame-max) exactly
   after deliver/get-ok/return;
3. once every connection is gone, recovering a fresh ``QueueManager`` from the journal gives
   the live durable state: durable queues with their options and messages (sequence
   numbers, bodies and headers, in publish order: see ``in_publish_order``), durable
   exchanges, durable bindings and the queues' kept arguments (the ``$amqp.*`` tables); and
   no client ever put a message into those tables.

The plain tests at the end are what the fuzz found, as regressions.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog
from fakesocket import FakeSocket
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from listenerspy import start_broker as start_with_factories
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat
from pamqp.base import Frame as Method

from vibemq_server.adapters.amqp.server import AmqpServer
from vibemq_server.auth import Authenticator
from vibemq_server.config import Config, DeliveryMode
from vibemq_server.core import Queue, QueueManager, StoredMessage
from vibemq_server.core.exchanges import EXCHANGE, QUEUE, Binding
from vibemq_server.journal import Journal
from vibemq_server.protocol.names import valid_queue_name
from vibemq_server.server.adapter import AdapterContext
from vibemq_server.server.broker import Broker, with_payload_forms
from vibemq_server.server.transport import ReadBatch

HEADER = b"AMQP\x00\x00\x09\x01"
SERVER_FRAME_MAX = 131_072
INTERNAL_ERROR = 541

# -- client frames -----------------------------------------------------------------------------


def marshal(method: Method | Any, channel: int) -> bytes:
    """pamqp's encoding, without its client-side validation of names (a fuzzing client sends
    what it likes: ``$`` names, reserved ones)."""
    if isinstance(method, Method):
        method.validate = lambda: None  # type: ignore[method-assign]
    return pamqp_frame.marshal(method, channel)


def content(channel: int, body: bytes, props: commands.Basic.Properties, frame_max: int) -> bytes:
    """A content header and the body in frames of at most ``frame_max`` bytes each (a body
    frame is split again where the fuzz asks, below)."""
    out = marshal(pamqp_header.ContentHeader(0, len(body), props), channel)
    room = frame_max - 8
    for i in range(0, len(body), room):
        out += marshal(pamqp_body.ContentBody(body[i : i + room]), channel)
    return out


def raw_frame(kind: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + bytes((end,))


EXCHANGES = ["ex.d", "ex.t", "ex.f", "ex.h", "amq.topic", "amq.direct", "amq.fanout", "", "nope"]
#: mostly exchanges that route somewhere (a missing one closes the channel)
PUBLISH_EXCHANGES = ["", "ex.d", "amq.topic", "", "ex.f", "amq.direct", "nope", "ex.t", ""]
ROUTED = [("", "dq1"), ("", "tq"), ("", "dq2"), ("ex.d", "dq1"), ("amq.topic", "a.b")]
EXCHANGE_TYPES = ["direct", "topic", "fanout", "headers", "direct", "x-bogus"]
QUEUES = ["dq1", "tq", "dq2", "dq1", "tq", "", "amq.gen-x", "$amqp.bindings", "$amqp.queues"]
KEYS = ["dq1", "tq", "dq2", "dq1", "a.b", "#", "*.b", "", "a.#", "tq"]
TAGS = ["", "c1", "c2"]
BODIES = [b"", b"hello", b'{"k":1}', b"\xff\x00", b"x" * 300, b"y" * 9000]
QUEUE_ARGS: list[dict[str, Any]] = [
    {},
    {"x-max-length": 3},
    {"x-max-priority": 5},
    {"x-dead-letter-exchange": "ex.f"},
    {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dq2"},
    {"x-overflow": "reject-publish", "x-max-length": 2},
    {"x-max-length-bytes": 500},
    {"x-message-ttl": 3_600_000},  # never reached: the state stays the same at recovery
    {"x-expires": 3_600_000},
    {"x-max-length": -1},  # 406
    {"x-overflow": "bogus"},  # 406
]
HEADERS: list[Any] = [None, {"k": "v"}, {"k": 1}]
BIND_ARGS: list[dict[str, Any]] = [{}, {"x-match": "any", "k": "v"}, {"x-match": "all"}]

channels = st.sampled_from([1, 2, 1, 2, 3])  # 3: the consumers' channel
booleans = st.booleans()
# Hypothesis starts from (and shrinks towards) the smallest choices, so a draw's 0 is
# always the productive one: no rare flag, a routed publish, the setup step taken, a polite
# client, no lie and no chaos.
rare = st.integers(0, 7).map(lambda n: n == 7)  # True one time in eight


@st.composite
def properties(draw: st.DrawFn) -> commands.Basic.Properties:
    return commands.Basic.Properties(
        delivery_mode=draw(st.sampled_from([2, 1, None])),
        priority=draw(st.sampled_from([None, 0, 3, 9])),
        headers=draw(st.sampled_from(HEADERS)),
        message_id=draw(st.sampled_from([None, "m1"])),
    )


@st.composite
def publishes(draw: st.DrawFn, channel: int, chaos: int) -> bytes:
    """basic.publish, its content header and body frames; with chaos, sometimes the header
    lies about the size, or the content never comes."""
    body = draw(st.sampled_from(BODIES) | st.binary(max_size=40))
    if draw(st.integers(0, 3)) < 3:  # where the setup's declarations route
        exchange, key = draw(st.sampled_from(ROUTED))
    else:
        exchange, key = draw(st.sampled_from(PUBLISH_EXCHANGES)), draw(st.sampled_from(KEYS))
    method = commands.Basic.Publish(exchange=exchange, routing_key=key, mandatory=draw(booleans))
    out = marshal(method, channel)
    lie = draw(st.integers(0, 15)) if chaos else 0
    if lie == 15:
        return out  # no content: the next method on the channel is out of order
    props = draw(properties())
    if lie == 14:  # announces more than it sends
        out += marshal(pamqp_header.ContentHeader(0, len(body) + 3, props), channel)
        return out + marshal(pamqp_body.ContentBody(body), channel)
    if lie == 13:  # sends more than it announced
        out += marshal(pamqp_header.ContentHeader(0, max(len(body) - 1, 0), props), channel)
        return out + marshal(pamqp_body.ContentBody(body + b"!"), channel)
    pieces = draw(st.integers(1, 3))
    frame_max = 4096 if len(body) > 4088 else max(len(body) // pieces + 8, 9)
    return out + content(channel, body, props, frame_max)


def _build(kind: Callable[[], Method], fields: dict[str, Any]) -> Method:
    method = kind()  # set afterwards: pamqp's constructors refuse names a fuzzer sends
    for name, value in fields.items():
        setattr(method, name, value)
    return method


def _method(kind: Callable[[], Method], **fields: st.SearchStrategy[Any]) -> Any:
    return st.fixed_dictionaries(fields).map(lambda values: _build(kind, values))


def channel_methods(chaos: int) -> st.SearchStrategy[Method]:
    """Every channel-level method a client may send, with arguments from small pools (a
    client that closes its channels is chaos: what it sends next on them is a connection
    error)."""
    exchanges, queues = st.sampled_from(EXCHANGES), st.sampled_from(QUEUES)
    keys, tags = st.sampled_from(KEYS), st.sampled_from(TAGS)
    tag_numbers = st.integers(0, 6)
    return st.one_of(
        _method(
            commands.Queue.Declare,
            queue=queues,
            durable=booleans,
            passive=rare,
            exclusive=rare,
            auto_delete=rare,
            nowait=rare,
            arguments=st.sampled_from(QUEUE_ARGS),
        ),
        _method(
            commands.Exchange.Declare,
            exchange=exchanges,
            exchange_type=st.sampled_from(EXCHANGE_TYPES),
            durable=booleans,
            auto_delete=rare,
            internal=rare,
            passive=rare,
            nowait=rare,
            arguments=st.sampled_from([{}, {"alternate-exchange": "ex.f"}]),
        ),
        _method(
            commands.Queue.Bind,
            queue=queues,
            exchange=exchanges,
            routing_key=keys,
            nowait=rare,
            arguments=st.sampled_from(BIND_ARGS),
        ),
        _method(commands.Basic.Ack, delivery_tag=tag_numbers, multiple=booleans),
        _method(commands.Basic.Consume, queue=queues, consumer_tag=tags, no_ack=rare),
        _method(commands.Basic.Get, queue=queues, no_ack=rare),
        _method(commands.Confirm.Select, nowait=rare),
        _method(commands.Basic.Qos, prefetch_count=st.integers(0, 3), global_=rare),
        _method(commands.Basic.Nack, delivery_tag=tag_numbers, multiple=booleans, requeue=booleans),
        _method(commands.Basic.Reject, delivery_tag=tag_numbers, requeue=booleans),
        _method(commands.Basic.Recover, requeue=st.just(True)),
        _method(commands.Basic.RecoverAsync, requeue=st.just(True)),
        _method(commands.Basic.Cancel, consumer_tag=tags, nowait=rare),
        _method(commands.Tx.Select),
        _method(commands.Tx.Commit),
        _method(commands.Tx.Rollback),
        _method(
            commands.Exchange.Bind,
            destination=exchanges,
            source=exchanges,
            routing_key=keys,
            arguments=st.sampled_from(BIND_ARGS),
        ),
        _method(
            commands.Exchange.Unbind,
            destination=exchanges,
            source=exchanges,
            routing_key=keys,
            arguments=st.sampled_from(BIND_ARGS),
        ),
        _method(
            commands.Queue.Unbind,
            queue=queues,
            exchange=exchanges,
            routing_key=keys,
            arguments=st.sampled_from(BIND_ARGS),
        ),
        _method(commands.Queue.Purge, queue=queues, nowait=rare),
        _method(commands.Queue.Delete, queue=queues, if_unused=rare, if_empty=rare, nowait=rare),
        _method(commands.Exchange.Delete, exchange=exchanges, if_unused=rare),
        _method(commands.Channel.Flow, active=booleans),
        *(
            [
                _method(commands.Channel.CloseOk),
                _method(
                    commands.Channel.Close,
                    reply_code=st.just(200),
                    reply_text=st.just("bye"),
                    class_id=st.just(0),
                    method_id=st.just(0),
                ),
            ]
            if chaos
            else []
        ),
    )


#: Frames no well-behaved client sends: wrong types, wrong channels, methods out of order,
#: broken framing.
odd_frames = st.one_of(
    st.builds(lambda ch: marshal(commands.Connection.Open(virtual_host="/"), ch), channels),
    st.builds(lambda: marshal(commands.Channel.Open(), 0)),
    st.builds(lambda ch: marshal(commands.Channel.Open(), ch), channels),  # maybe open already
    st.builds(lambda: marshal(commands.Connection.StartOk(response="\0a\0b"), 0)),
    st.builds(lambda: marshal(commands.Connection.Close(200, "bye", 0, 0), 0)),
    st.builds(lambda: marshal(commands.Connection.CloseOk(), 0)),
    st.builds(lambda: marshal(commands.Basic.Deliver("c", 1, False, "", "k"), 1)),
    st.builds(lambda ch: marshal(pamqp_heartbeat.Heartbeat(), ch), st.sampled_from([0, 0, 1])),
    st.builds(
        lambda ch, n: marshal(pamqp_header.ContentHeader(0, n, commands.Basic.Properties()), ch),
        channels,
        st.integers(0, 3),
    ),
    st.builds(lambda ch: marshal(pamqp_body.ContentBody(b"abc"), ch), channels),
    st.builds(
        lambda kind, ch, payload: raw_frame(kind, ch, payload),
        st.sampled_from([9, 0, 4, 0xFF]),
        channels,
        st.binary(max_size=8),
    ),
    st.builds(lambda: raw_frame(1, 1, b"\x00\x3c\x00\x50", end=0xCD)),  # bad frame-end
    st.builds(lambda: raw_frame(1, 1, b"\x00\x3c")),  # a method frame too short
    st.builds(lambda: raw_frame(1, 1, b"\x00\x63\x00\x01")),  # unknown class
    st.builds(lambda: raw_frame(1, 1, b"\x00\x3c\x00\x50\x00")),  # ack, arguments cut
    st.builds(lambda: struct.pack(">BHI", 1, 1, 1 << 30)),  # over frame-max
    st.builds(lambda: HEADER),  # a second greeting
    st.builds(  # channels never opened, or past channel-max
        lambda ch: marshal(commands.Basic.Qos(prefetch_count=1), ch),
        st.sampled_from([7, 4096, 65535]),
    ),
)


@st.composite
def client_input(draw: st.DrawFn, chaos: int) -> bytes:
    """What a client sends in one go: valid methods and publishes, and, one time in
    ``60 // chaos``, frames no client should send or random bytes."""
    channel = draw(channels)
    if chaos and draw(st.integers(0, 60 // chaos)) == 60 // chaos:
        if draw(booleans):
            return bytes(draw(odd_frames))
        return draw(st.binary(min_size=1, max_size=24))
    if draw(st.integers(0, 1)) == 0:
        return bytes(draw(publishes(channel, chaos)))
    return marshal(draw(channel_methods(chaos)), channel)


#: A client's consumers, on channel 3 (a polite client starts them again when it reopens it).
CONSUMERS = [
    marshal(commands.Basic.Consume(queue="tq", consumer_tag="s1"), 3),
    marshal(commands.Basic.Consume(queue="dq1", consumer_tag="s2"), 3),
]
#: What a client declares once connected (so that publishes have somewhere to go).
SETUP = [
    marshal(commands.Queue.Declare(queue="dq1", durable=True), 1),
    marshal(commands.Queue.Declare(queue="tq"), 1),
    marshal(commands.Queue.Declare(queue="dq2", durable=True), 1),
    marshal(commands.Exchange.Declare(exchange="ex.d", durable=True), 1),
    marshal(commands.Queue.Bind(queue="dq1", exchange="ex.d", routing_key="dq1"), 1),
    marshal(commands.Queue.Bind(queue="dq1", exchange="amq.topic", routing_key="a.#"), 1),
    *CONSUMERS,
    marshal(commands.Confirm.Select(), 1),
]


@st.composite
def handshakes(draw: st.DrawFn) -> tuple[bytes, int]:
    """A client's opening and the frame-max it asks for. Mostly a valid handshake that opens
    channels 1 to 3 and declares some of what the others use; about one time in six, one step
    is wrong or missing."""
    frame_max = draw(st.sampled_from([0, 4096, SERVER_FRAME_MAX]))
    start_ok = commands.Connection.StartOk(
        client_properties={
            "capabilities": {
                "consumer_cancel_notify": draw(booleans),
                "connection.blocked": draw(booleans),
                "publisher_confirms": True,
            }
        },
        mechanism="PLAIN",
        response="\0guest\0guest",
    )
    tune_ok = commands.Connection.TuneOk(channel_max=draw(st.sampled_from([0, 2047])))
    tune_ok.frame_max = frame_max
    frames = [
        HEADER,
        marshal(start_ok, 0),
        marshal(tune_ok, 0),
        marshal(commands.Connection.Open(virtual_host="/"), 0),
        marshal(commands.Channel.Open(), 1),
        marshal(commands.Channel.Open(), 2),
        marshal(commands.Channel.Open(), 3),
    ]
    fault = draw(st.integers(0, 59))
    if fault == 1:
        frames[0] = b"AMQP\x01\x01\x00\x09"
    elif fault == 2:
        frames[0] = b"HTTP/1.1 "
    elif fault == 3:
        start_ok.mechanism = "EXTERNAL"
        frames[1] = marshal(start_ok, 0)
    elif fault == 4:
        start_ok.response = "guest"
        frames[1] = marshal(start_ok, 0)
    elif fault == 5:
        start_ok.mechanism = "AMQPLAIN"
        start_ok.response = "\x05LOGINS\x00\x00\x00\x05guest"
        frames[1] = marshal(start_ok, 0)
    elif fault == 6:
        tune_ok.frame_max = 1024
        frames[2] = marshal(tune_ok, 0)
    elif fault == 7:
        del frames[2]  # open before tune-ok
    elif fault == 8:
        frames[3] = marshal(commands.Connection.Open(virtual_host="/other"), 0)
    elif fault == 9:
        frames.insert(2, frames[1])  # start-ok twice
    elif fault == 10:
        tune_ok.channel_max = 2  # channel 3 is over it
        frames[2] = marshal(tune_ok, 0)
    setup = draw(st.lists(st.integers(0, 3), min_size=len(SETUP), max_size=len(SETUP)))
    frames += [step for step, skipped in zip(SETUP, setup, strict=True) if skipped < 3]
    return b"".join(frames), frame_max


@st.composite
def sends(draw: st.DrawFn, chaos: int) -> tuple[Any, ...]:
    """Input for one connection: several client frames, delivered cut at random byte
    positions over several reads; the last piece may stay back until the next send."""
    data = b"".join(draw(st.lists(client_input(chaos), min_size=2, max_size=8)))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(len(data) - 1, 1)), max_size=3))))
    return ("send", draw(st.integers(0, 2)), data, tuple(cuts), draw(rare))


def steps(chaos: int) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    """What happens, one step at a time: mostly sends."""
    return st.lists(
        st.one_of(
            *[sends(chaos)] * 8,
            st.tuples(st.just("reopen"), st.integers(0, 2), channels),
            st.tuples(st.just("pause"), st.integers(0, 2)),
            st.tuples(st.just("resume"), st.integers(0, 2)),
            st.tuples(st.just("settle")),
            st.tuples(st.just("ack_all"), st.integers(0, 2), channels),
            st.tuples(st.just("tick")),
            st.tuples(st.just("drop"), st.integers(0, 2), booleans),
            st.tuples(st.just("reconnect"), st.integers(0, 2), handshakes()),
        ),
        min_size=8,
        max_size=40,
    )


#: (chaos, polite, steps): chaos 0 sends valid frames only (in any order); a polite client
#: answers the server's channel.close with close-ok and opens the channel again at once.
scenarios = st.tuples(st.integers(0, 3), st.integers(0, 3).map(lambda n: n < 3)).flatmap(
    lambda cp: st.tuples(st.just(cp[0]), st.just(cp[1]), steps(cp[0]))
)


# -- 2: what the server wrote ------------------------------------------------------------------

_S = commands
#: The methods a server sends (a client's own, such as basic.publish, never come back).
SERVER_METHODS: frozenset[type] = frozenset(
    {
        _S.Connection.Start,
        _S.Connection.Tune,
        _S.Connection.OpenOk,
        _S.Connection.Close,
        _S.Connection.CloseOk,
        _S.Connection.Blocked,
        _S.Connection.Unblocked,
        _S.Channel.OpenOk,
        _S.Channel.Flow,
        _S.Channel.FlowOk,
        _S.Channel.Close,
        _S.Channel.CloseOk,
        _S.Exchange.DeclareOk,
        _S.Exchange.DeleteOk,
        _S.Exchange.BindOk,
        _S.Exchange.UnbindOk,
        _S.Queue.DeclareOk,
        _S.Queue.BindOk,
        _S.Queue.UnbindOk,
        _S.Queue.PurgeOk,
        _S.Queue.DeleteOk,
        _S.Basic.QosOk,
        _S.Basic.ConsumeOk,
        _S.Basic.CancelOk,
        _S.Basic.Cancel,
        _S.Basic.Return,
        _S.Basic.Deliver,
        _S.Basic.GetOk,
        _S.Basic.GetEmpty,
        _S.Basic.Ack,
        _S.Basic.Nack,
        _S.Basic.RecoverOk,
        _S.Confirm.SelectOk,
        _S.Tx.SelectOk,
        _S.Tx.CommitOk,
        _S.Tx.RollbackOk,
    }
)
CONTENT_METHODS = (_S.Basic.Deliver, _S.Basic.GetOk, _S.Basic.Return)
#: Where the handshake may be (what the previous connection method was) and what may follow.
HANDSHAKE: dict[type | None, tuple[type, ...]] = {
    None: (_S.Connection.Start,),
    _S.Connection.Start: (_S.Connection.Tune, _S.Connection.Close),
    _S.Connection.Tune: (_S.Connection.OpenOk, _S.Connection.Close),
}


class ServerStream:
    """Property 2 for one connection, checked as the bytes come: ``feed`` what the broker
    wrote since the last call; ``finish`` once the connection is gone. ``channels`` is what
    a client would know from it: ``open``, or ``closing`` (the server closed it)."""

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max or SERVER_FRAME_MAX
        self.buffer = b""
        self.offset = 0  # bytes parsed so far
        self.handshake: type | None = None  # the last handshake method seen, until open
        self.open = False  # connection.open-ok seen
        self.closing = False  # the server sent connection.close
        self.done = False  # nothing may follow (close-ok sent, or a protocol header)
        self.channels: dict[int, str] = {}
        self.opened: set[int] = set()  # channel.open-ok seen (the client takes them)
        self.content: dict[int, int] = {}  # channel -> body bytes still due (-1: the header)
        self.deliveries = 0
        self.codes: list[int] = []  # reply codes of connection.close and channel.close
        self.frames: list[tuple[int, str]] = []  # (channel, frame name), as received

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if self.offset == 0 and self.buffer[:4] == b"AMQP":
                if len(self.buffer) < 8:
                    return
                assert self.buffer[:8] == HEADER, f"protocol header {self.buffer[:8]!r}"
                self._take(8)
                self.done = True
                continue
            if len(self.buffer) < 7:
                return
            size = int.from_bytes(self.buffer[3:7], "big")
            if len(self.buffer) < size + 8:
                return
            used, channel, frame = pamqp_frame.unmarshal(self.buffer[: size + 8])
            assert used == size + 8
            assert size + 8 <= self.frame_max, f"a frame of {size + 8} over {self.frame_max}"
            self._take(used)
            self._check(channel, frame)

    def _take(self, n: int) -> None:
        self.buffer = self.buffer[n:]
        self.offset += n

    def _check(self, channel: int, frame: Any) -> None:
        self.frames.append((channel, getattr(frame, "name", type(frame).__name__)))
        assert not self.done, f"{frame!r} after the connection ended"
        if isinstance(frame, pamqp_heartbeat.Heartbeat):
            assert channel == 0, "heartbeat on a channel"
            return
        due = self.content.get(channel)
        if isinstance(frame, pamqp_header.ContentHeader):
            assert due == -1, f"content header on channel {channel} without a delivery"
            self._due(channel, frame.body_size)
            return
        if isinstance(frame, pamqp_body.ContentBody):
            assert due is not None and due > 0, f"body frame on channel {channel} unannounced"
            assert len(frame.value) <= due, "more body than the header announced"
            self._due(channel, due - len(frame.value))
            return
        assert due is None, f"{frame.name} on channel {channel} inside a delivery's content"
        assert type(frame) in SERVER_METHODS, f"{frame.name} is not a server method"
        if channel == 0:
            self._connection_method(frame)
        else:
            self._channel_method(channel, frame)

    def _due(self, channel: int, remaining: int) -> None:
        if remaining:
            self.content[channel] = remaining
        else:
            del self.content[channel]

    def _connection_method(self, frame: Any) -> None:
        kind = type(frame)
        assert frame.name.startswith("Connection."), f"{frame.name} on channel 0"
        if self.closing:
            assert kind is _S.Connection.CloseOk, f"{frame.name} after connection.close"
            self.done = True
            return
        if not self.open:
            assert kind in HANDSHAKE[self.handshake], f"{frame.name} after {self.handshake}"
            self.handshake = kind
        elif kind is _S.Connection.Start or kind is _S.Connection.Tune:
            raise AssertionError(f"{frame.name} once open")
        if kind is _S.Connection.OpenOk:
            assert not self.open, "connection.open-ok twice"
            self.open = True
        elif kind is _S.Connection.Close:
            self.codes.append(frame.reply_code)
            self.closing = True
        elif kind is _S.Connection.CloseOk:
            self.done = True

    def _channel_method(self, channel: int, frame: Any) -> None:
        kind = type(frame)
        assert not frame.name.startswith("Connection."), f"{frame.name} on channel {channel}"
        assert self.open and not self.closing, f"{frame.name} outside an open connection"
        state = self.channels.get(channel)
        if kind is _S.Channel.OpenOk:
            assert state != "open", f"channel.open-ok on open channel {channel}"
            self.channels[channel] = "open"
            self.opened.add(channel)
        elif kind is _S.Channel.CloseOk:  # the answer to the client's channel.close
            assert state is not None, f"channel.close-ok on channel {channel} never opened"
            del self.channels[channel]
        else:
            assert state == "open", f"{frame.name} on channel {channel} ({state or 'not open'})"
            if kind is _S.Channel.Close:
                self.codes.append(frame.reply_code)
                self.channels[channel] = "closing"
            elif isinstance(frame, CONTENT_METHODS):
                self.deliveries += 1
                self.content[channel] = -1

    def client_closed(self, channel: int) -> None:
        """The client answered the server's channel.close: the channel is free again."""
        if self.channels.get(channel) == "closing":
            del self.channels[channel]

    def finish(self) -> None:
        assert not self.buffer, f"{len(self.buffer)} bytes of a cut frame at the end"
        assert not self.content, f"deliveries without all their content: {self.content}"
        assert INTERNAL_ERROR not in self.codes, "541 INTERNAL_ERROR: the broker had a bug"


# -- the world ---------------------------------------------------------------------------------


class Client:
    """One client connection: the broker's own protocol object over a FakeSocket."""

    def __init__(self, protocol: asyncio.Protocol, peer: int, frame_max: int) -> None:
        self.protocol = protocol
        self.socket = FakeSocket(protocol, peer)
        self.stream = ServerStream(frame_max)
        self.held = b""  # the end of a cut frame, waiting for the next send
        self.opening: set[int] = set()  # channel.open sent, open-ok not seen yet
        protocol.connection_made(self.socket)

    @property
    def gone(self) -> bool:
        return self.socket.closed or self.socket.lost

    def send(self, data: bytes) -> None:
        data, self.held = self.held + data, b""
        self.socket.peer_sends(data)

    def read(self) -> None:
        """The client reads what the broker wrote (property 2, as it goes)."""
        new = bytes(self.socket.out[self.stream.offset + len(self.stream.buffer) :])
        self.stream.feed(new)


class Errors:
    """What escaped: exceptions in loop callbacks, errors logged (a caught bug is logged)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def loop_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.seen.append(context)

    def processor(self, logger: Any, method: str, event: Any) -> Any:
        if method in ("error", "exception", "critical", "fatal"):
            self.seen.append(dict(event))
        return event


@contextmanager
def log_errors_to(errors: Errors) -> Iterator[None]:
    """Every structlog logger, cached or not, shares the configured processor list: hook
    into it in place (``structlog.testing.capture_logs`` misses cached loggers)."""
    processors = structlog.get_config()["processors"]
    processors.insert(0, errors.processor)
    try:
        yield
    finally:
        processors.remove(errors.processor)


def make_config(data_dir: Path, memory: int) -> Config:
    return Config(
        host="127.0.0.1",
        port=0,
        data_dir=data_dir,
        fsync="never",  # the same records as "always", without the wait
        drain_timeout_s=0.05,
        housekeeping_interval_ms=3_600_000,  # the test ticks
        memory_high_watermark_bytes=memory,
        mqtt={"enabled": False},
        amqp={"port": 0, "heartbeat_s": 0},
        http={"enabled": False},
    )


async def start_broker(config: Config) -> tuple[Broker, Callable[[], asyncio.Protocol]]:
    """A started broker and the protocol factory its AMQP listener gave create_server."""
    broker, factories = await start_with_factories(config)
    return broker, factories["amqp"]


async def settle(clients: list[Client], rounds: int = 4) -> None:
    """Let the loop run the broker's callbacks (flushes, journal waiters, lost connections),
    then let every client read."""
    for _ in range(rounds):
        await asyncio.sleep(0)
    for client in clients:
        client.read()


# -- 3: the durable state ------------------------------------------------------------------------


def in_publish_order(queue: Queue) -> list[StoredMessage]:
    """A queue's messages in the order it would deliver them had none been requeued: by
    priority level (a priority queue), then by sequence number, i.e. publish order.

    Recovery replays a queue in that order. A live queue can hold them in another: a
    requeued delivery goes back to the head (``QueueManager.nack``), not to its original
    position as in RabbitMQ, so after deliveries to several consumers are returned the live
    order differs from the publish order (and from the order after a restart)."""
    levels = queue.options.delivery_mode is DeliveryMode.PRIORITY_BASED
    return sorted(queue.ready(), key=lambda m: (-m.priority if levels else 0, m.seq))


def durable_state(manager: QueueManager, amqp: AmqpServer) -> dict[str, Any]:
    """What the journal must keep: durable queues (options, messages in publish order,
    kept arguments), durable exchanges and bindings."""
    queues: dict[str, Any] = {}
    for name, queue in manager.queues.items():
        if name.startswith("$"):
            continue
        if queue.options.durable:
            messages = [(m.seq, m.payload, dict(m.headers)) for m in in_publish_order(queue)]
            queues[name] = (queue.options, messages, amqp.queue_args.get(name))
    exchanges = amqp.exchanges
    assert exchanges is not None
    durable_exchanges = {}
    for name in EXCHANGES:
        exchange = exchanges.get(name)
        if exchange is not None and exchange.durable and name and not name.startswith("amq."):
            durable_exchanges[name] = exchange

    def durable(binding: Binding) -> bool:
        source = exchanges.get(binding.source)
        if source is None or not source.durable:
            return False
        if binding.dest_kind == QUEUE:
            queue = manager.queues.get(binding.destination)
            return queue is not None and queue.options.durable
        assert binding.dest_kind == EXCHANGE
        dest = exchanges.get(binding.destination)
        return dest is not None and dest.durable

    bindings = sorted(
        (b.source, b.dest_kind, b.destination, b.routing_key, b.arguments)
        for b in exchanges.bindings()
        if durable(b)
    )
    return {"queues": queues, "exchanges": durable_exchanges, "bindings": bindings}


def check_tables(manager: QueueManager) -> None:
    """The adapters' durable tables are the broker's: no client message ever lands there."""
    for name, queue in manager.queues.items():
        if name.startswith("$amqp."):
            assert not queue.count, f"{queue.count} client messages in {name}"
            assert not queue.subscriptions, f"a subscription to {name}"


def recovered_state(config: Config) -> dict[str, Any]:
    manager = QueueManager(config.queue_defaults, name_validator=valid_queue_name)
    with_payload_forms(Journal(config.data_dir / "journal")).recover(manager)
    amqp = AmqpServer(
        AdapterContext(
            config, manager, lambda _c: True, lambda _c: None, ReadBatch(), Authenticator(config)
        )
    )
    amqp.restore()
    for queue in manager.queues.values():
        assert queue.options.durable, f"transient queue {queue.name} recovered"
        assert list(queue.ready()) == in_publish_order(queue), f"{queue.name} out of order"
    assert amqp.exchanges is not None
    for name in EXCHANGES:
        exchange = amqp.exchanges.get(name)
        assert exchange is None or exchange.durable, f"transient exchange {name} recovered"
    return durable_state(manager, amqp)


# -- the run -----------------------------------------------------------------------------------


def reopen(client: Client, channel: int) -> None:
    """What a client does to use a channel again: answer the server's channel.close, and
    open it (unless it is open, or being opened)."""
    client.opening -= client.stream.opened
    client.stream.opened.clear()
    state = client.stream.channels.get(channel)
    if client.gone or state == "open" or channel in client.opening:
        return
    if state == "closing":
        client.send(marshal(commands.Channel.CloseOk(), channel))
        client.stream.client_closed(channel)
    client.send(marshal(commands.Channel.Open(), channel))
    client.opening.add(channel)
    if channel == 3:
        client.send(b"".join(CONSUMERS))


def recover_channels(client: Client) -> None:
    """A polite client keeps channels 1 to 3 open."""
    for channel in (1, 2, 3):
        reopen(client, channel)


async def run(
    first: list[tuple[bytes, int]],
    polite: bool,
    steps: list[tuple[Any, ...]],
    memory: int,
    data_dir: Path,
    seen: list[list[tuple[int, str]]] | None = None,
) -> dict[str, str]:
    """Runs one example; returns what happened, for Hypothesis's statistics (and puts the
    frames each client received into ``seen``)."""
    loop = asyncio.get_running_loop()
    errors = Errors()
    loop.set_exception_handler(errors.loop_handler)
    config = make_config(data_dir, memory)
    with log_errors_to(errors):
        broker, factory = await start_broker(config)
        amqp = broker.adapters["amqp"]
        assert isinstance(amqp, AmqpServer)
        peers = iter(range(40_000, 65_000))
        everyone: list[Client] = []

        def connect(handshake: tuple[bytes, int]) -> Client:
            data, frame_max = handshake
            client = Client(factory(), next(peers), frame_max)
            everyone.append(client)
            client.send(data)
            return client

        try:
            slots = [connect(h) for h in first]
            await settle(everyone)
            for step in steps:
                kind = step[0]
                client = slots[step[1] % len(slots)] if len(step) > 1 else slots[0]
                if kind == "send":
                    _, _, data, cuts, hold = step
                    bounds = [0, *cuts, len(data)]
                    pieces = [data[a:b] for a, b in itertools.pairwise(bounds)]
                    if hold and len(pieces) > 1:
                        client.held = pieces.pop()
                    for piece in pieces:
                        client.send(piece)
                elif kind == "reopen":
                    reopen(client, step[2])
                elif kind == "ack_all":
                    client.send(marshal(commands.Basic.Ack(0, multiple=True), step[2]))
                elif kind == "pause":
                    client.socket.peer_stops_reading()
                elif kind == "resume":
                    client.socket.peer_reads_again()
                elif kind == "tick":
                    broker.manager.tick()
                    amqp.tick()
                elif kind == "drop":
                    if not client.gone:
                        client.socket.peer_goes(ConnectionResetError() if step[2] else None)
                elif kind == "reconnect":
                    if client.gone:
                        slots[step[1] % len(slots)] = connect(step[2])
                else:
                    assert kind == "settle", kind
                await settle(everyone, 1 if kind != "settle" else 8)
                if polite:
                    for client in slots:
                        recover_channels(client)
                    await settle(everyone, 1)

            # Every client reads again, then goes; what it left unacknowledged goes back.
            for client in everyone:
                client.socket.peer_reads_again()
            await settle(everyone, 8)
            for client in everyone:
                if not client.gone:
                    client.socket.peer_goes(None)
            await settle(everyone, 8)
            for client in everyone:
                assert client.socket.lost
                assert not client.socket.late, "written after the connection was closed"
                client.stream.finish()
            assert not broker.connections, "connections left registered"
            check_tables(broker.manager)
            live = durable_state(broker.manager, amqp)
            deliveries = sum(c.stream.deliveries for c in everyone)
            codes = {code for c in everyone for code in c.stream.codes}
            if seen is not None:
                seen.extend(c.stream.frames for c in everyone)
        finally:
            for client in everyone:
                if not client.socket.lost:
                    client.socket.peer_goes(None)
            await broker.stop()
    assert not errors.seen, errors.seen
    # 3: replaying the journal gives the live durable state.
    assert recovered_state(config) == live
    stored = sum(len(q[1]) for q in live["queues"].values())
    return {
        "deliveries": "none" if not deliveries else "1-9" if deliveries < 10 else "10+",
        "durable messages": "none" if not stored else "1-9" if stored < 10 else "10+",
        **{f"reply code {code}": "" for code in sorted(codes)},
    }


MEMORY = st.sampled_from([512 * 1024 * 1024, 4096])


@settings(
    max_examples=int(os.environ.get("AMQP_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(first=st.lists(handshakes(), min_size=1, max_size=3), scenario=scenarios, memory=MEMORY)
def test_amqp_session_fuzz(
    first: list[tuple[bytes, int]],
    scenario: tuple[int, bool, list[tuple[Any, ...]]],
    memory: int,
) -> None:
    chaos, polite, steps_ = scenario
    event(f"chaos {chaos}")
    with tempfile.TemporaryDirectory() as tmp:
        stats = asyncio.run(run(first, polite, steps_, memory, Path(tmp)))
    for name, value in stats.items():
        event(f"{name}: {value}" if value else name)


# -- what the fuzz found ---------------------------------------------------------------------------


def _opening(*after: bytes) -> tuple[bytes, int]:
    """A connection in confirm mode on channel 1 with the transient queue tq (its confirms
    need not wait for the journal), and ``after``."""
    capabilities: dict[str, Any] = {"connection.blocked": True}
    start_ok = commands.Connection.StartOk(
        client_properties={"capabilities": capabilities}, response="\0guest\0guest"
    )
    frames = [
        HEADER,
        marshal(start_ok, 0),
        marshal(commands.Connection.TuneOk(), 0),
        marshal(commands.Connection.Open(virtual_host="/"), 0),
        marshal(commands.Channel.Open(), 1),
        marshal(commands.Queue.Declare(queue="tq"), 1),
        marshal(commands.Confirm.Select(), 1),
    ]
    return b"".join([*frames, *after]), 0


def _frames_after(*reads: bytes, memory: int = 512 * 1024 * 1024) -> list[tuple[int, str]]:
    """What the server answers to ``reads`` (one read each, after the opening), checked by
    the same properties as the fuzz."""
    seen: list[list[tuple[int, str]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        steps = [("send", 0, read, (), False) for read in reads]
        asyncio.run(run([_opening()], False, steps, memory, Path(tmp), seen))
    (answers,) = seen
    return answers[answers.index((1, "Confirm.SelectOk")) + 1 :]


def _publish(body: bytes, announced: int) -> bytes:
    header = pamqp_header.ContentHeader(0, announced, commands.Basic.Properties(delivery_mode=2))
    return (
        marshal(commands.Basic.Publish(exchange="", routing_key="tq"), 1)
        + marshal(header, 1)
        + (marshal(pamqp_body.ContentBody(body), 1) if body else b"")
    )


def test_a_confirm_goes_out_before_a_connection_error_in_the_same_read() -> None:
    """A publish confirmed, then a frame error (a body frame the header did not announce)
    in the same read: the ack used to be sent after connection.close."""
    read = _publish(b"", 0) + marshal(pamqp_body.ContentBody(b"!"), 1)
    assert _frames_after(read) == [(1, "Basic.Ack"), (0, "Connection.Close")]


def test_a_confirm_goes_out_before_channel_close_ok_in_the_same_read() -> None:
    """A publish, then channel.close in the same read: the ack used to follow close-ok."""
    close = commands.Channel.Close(200, "bye", 0, 0)
    read = _publish(b"hello", 5) + marshal(close, 1)
    assert _frames_after(read) == [(1, "Basic.Ack"), (1, "Channel.CloseOk")]


def test_a_confirm_goes_out_before_a_channel_error_in_the_same_read() -> None:
    """A publish, then a channel error (a queue that is not there) in the same read."""
    read = _publish(b"hello", 5) + marshal(commands.Basic.Get(queue="nope"), 1)
    assert _frames_after(read) == [(1, "Basic.Ack"), (1, "Channel.Close")]


def test_a_client_cannot_delete_the_durable_tables() -> None:
    """queue.delete of ``$amqp.bindings`` used to delete the bindings' durable table: the
    binding below was gone after a restart (the run's replay check). Such queues are no
    client's: 404, as for basic.consume."""
    declare_exchange = commands.Exchange.Declare(exchange="ex.d", durable=True)
    declare_queue = commands.Queue.Declare(queue="dq1", durable=True)
    bind = commands.Queue.Bind(queue="dq1", exchange="ex.d", routing_key="k")
    delete = commands.Queue.Delete(queue="tq")
    delete.queue = "$amqp.bindings"  # (pamqp refuses the name in its constructor)
    read = b"".join(marshal(m, 1) for m in (declare_exchange, declare_queue, bind, delete))
    assert _frames_after(read) == [
        (1, "Exchange.DeclareOk"),
        (1, "Queue.DeclareOk"),
        (1, "Queue.BindOk"),
        (1, "Channel.Close"),
    ]


def test_no_delivery_follows_connection_close() -> None:
    """Releasing one channel of a connection that is closing dispatches its queues: that
    used to deliver to another of its channels after connection.close went out (the
    property checks of ``run`` see it)."""
    first = b"".join(
        [
            marshal(commands.Channel.Open(), 3),
            marshal(commands.Basic.Qos(prefetch_count=1), 1),
            marshal(commands.Basic.Consume(queue="tq", consumer_tag="a"), 1),
            marshal(commands.Basic.Qos(prefetch_count=1), 3),
            marshal(commands.Basic.Consume(queue="tq", consumer_tag="b"), 3),
            *(_publish(b"hello", 5) for _ in range(3)),  # one for each, one waits
        ]
    )
    # The ack makes room on channel 3, then a frame of no known type ends the connection.
    second = marshal(commands.Basic.Ack(delivery_tag=1), 3) + b"\xff" * 8
    answers = _frames_after(first, second)
    assert answers[-1] == (0, "Connection.Close")
    assert answers.count((3, "Basic.Deliver")) == 1


def test_no_connection_blocked_follows_connection_close() -> None:
    """Publishes that cross the memory high watermark, then an error, in one read:
    connection.blocked used to follow connection.close."""
    read = b"".join(_publish(b"x" * 1000, 1000) for _ in range(3)) + b"\xff" * 8
    answers = _frames_after(read, memory=2048)
    assert answers[-1] == (0, "Connection.Close")
    assert (0, "Connection.Blocked") not in answers


# -- issue 16: a large message cut anywhere ----------------------------------------------------

#: ~200 KB: two body frames at the broker's frame_max (131,072).
BIG_BODY = bytes(range(256)) * 800
BIG_PUBLISH = marshal(commands.Basic.Publish(exchange="", routing_key="tq"), 1) + content(
    1, BIG_BODY, commands.Basic.Properties(delivery_mode=1), 131_072
)
_NEAR_EDGES = st.integers(1, 40) | st.integers(-40, -1).map(lambda d: len(BIG_PUBLISH) + d)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, len(BIG_PUBLISH) - 1) | _NEAR_EDGES, max_size=30))
def test_a_large_message_cut_anywhere_is_confirmed_and_got_whole(cuts: list[int]) -> None:
    """basic.publish + a content header + two body frames, cut at any offsets (the frame
    edges among them often): confirmed, then basic.get finds it (the fuzz's own checks,
    the journal's replay included, hold throughout)."""
    edges = [0, *sorted({c for c in cuts if 0 < c < len(BIG_PUBLISH)}), len(BIG_PUBLISH)]
    reads = [BIG_PUBLISH[a:b] for a, b in itertools.pairwise(edges)]
    get = marshal(commands.Basic.Get(queue="tq", no_ack=True), 1)
    answers = _frames_after(*reads, get)
    body_frames = [(1, "ContentBody")] * 2  # at the broker's frame_max, as it arrived
    assert answers == [(1, "Basic.Ack"), (1, "Basic.GetOk"), (1, "ContentHeader"), *body_frames]
