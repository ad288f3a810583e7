"""Any byte stream, well-formed or not and cut anywhere, with the socket filling and draining
and time passing, only ever produces server frames from a session: no exception escapes its
``Session`` interface, and the core's accounting stays consistent."""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vibemq_server.config import Config, DeliveryMode
from vibemq_server.core import ManualClock, QueueManager
from vibemq_server.journal import FsyncPolicy, Journal
from vibemq_server.protocol import (
    CommandType,
    FrameDecoder,
    Message,
    decode_body,
    encode,
    encode_body,
)
from vibemq_server.protocol.bigcopy import Fill, read_through
from vibemq_server.protocol.codec import frame
from vibemq_server.server.session import Session
from vibemq_server.server.transport import Session as TransportSession


class Link:
    """The transport side of a session (``transport.Link``), recording what would be
    written; its clock and its socket's writability are the test's to move."""

    peer_identity: str | None = None  # a plain connection
    over_tls = False

    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        self.peer_host = "127.0.0.1"
        self.log: structlog.typing.FilteringBoundLogger = structlog.get_logger("fuzz")
        self.out: list[bytes] = []
        self.closed = False
        self.socket_writable = True
        self.reading_paused = False
        self.now = 1000.0
        self.soon: list[Callable[[], None]] = []
        self.into: Fill | None = None
        self.replaced: TransportSession | None = None

    @property
    def writable(self) -> bool:
        return self.socket_writable and not self.closed

    def send(self, data: bytes) -> None:
        if not self.closed:  # as the transport: nothing goes out after close
            self.out.append(data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.soon.append(callback)  # a refusal held back: on the next turn here

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def offload(self, work: Callable[[], Any], then: Callable[[Any], None]) -> None:
        # as the transport: the result comes back on a later turn, unless closed meanwhile
        self.soon.append(lambda: None if self.closed else then(work()))

    def time(self) -> float:
        return self.now

    def send_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        self.send(b"".join(parts))

    def replace_session(self, session: TransportSession) -> None:
        self.replaced = session  # (not the native session's way: kept for the Link protocol)

    def read_into(self, fill: Fill) -> None:
        if not self.closed and len(fill):
            self.into = fill

    def receive(self, session: Session, data: bytes) -> None:
        """A socket read passed on as the transport does: while the session has asked for
        its next bytes in a fill of its own (``read_into``), they go there first, and the
        session gets ``data_received(b"")`` after each such read."""
        read_through(data, self._filling, session.data_received)

    def _filling(self) -> Fill | None:
        return None if self.closed else self.into


names = st.sampled_from(["q", "q2", "q.dlq", "bad name", "", "x" * 300])
option_values = st.one_of(
    st.integers(-2, 5),
    st.sampled_from(
        [
            "RoundRobin",
            "FanOutWithAck",
            "PriorityBased",
            "DropNewest",
            "BlockPublisher",
            "RedirectToDlq",
            "true",
            "false",
            "x",
        ]
    ),
)
options = st.dictionaries(
    st.sampled_from(
        [
            "mode",
            "maxQueueSize",
            "messageTtl",
            "enableDeadLetterQueue",
            "overflowStrategy",
            "maxRetryAttempts",
            "ackTimeout",
            "durable",
        ]
    ),
    option_values,
    max_size=4,
)
payloads = st.one_of(
    st.just(b""),
    st.just(b"{"),
    st.just(b"\xff"),
    options.map(lambda o: json.dumps(o).encode()),
    st.binary(max_size=20),
)
headers = st.dictionaries(
    st.sampled_from(["messageId", "priority", "prefetch", "authToken", "maxQueueSize", "k"]),
    st.sampled_from(["m1", "m2", "High", "0", "1", "70000", "abc", "secret"]),
    max_size=3,
)
messages = st.builds(
    Message,
    type=st.sampled_from(list(CommandType)),
    id=st.sampled_from(["m1", "m2", "m3", "c"]),
    queue=names,
    payload=payloads,
    headers=headers,
)
bodies = st.one_of(messages.map(encode_body), st.binary(max_size=40))

# Requests a client would make, so that deliveries, acks, redeliveries and flow control are
# reached often, not only by luck.
good_queues = st.sampled_from(["q", "q2"])
good_options = st.fixed_dictionaries(
    {},
    optional={
        "mode": st.sampled_from(["RoundRobin", "FanOutWithAck", "PriorityBased"]),
        "maxQueueSize": st.integers(1, 4),
        "messageTtl": st.sampled_from([0, 1000]),
        "enableDeadLetterQueue": st.booleans(),
        "overflowStrategy": st.sampled_from(["DropOldest", "DropNewest", "BlockPublisher"]),
        "maxRetryAttempts": st.integers(1, 3),
        "ackTimeout": st.sampled_from([1000, 30000]),
        "durable": st.booleans(),
    },
)
msg_ids = st.sampled_from(["m1", "m2", "m3"])
create = st.builds(
    lambda q, o: Message(CommandType.CREATE_QUEUE, "cq", q, json.dumps(o).encode()),
    good_queues,
    st.one_of(good_options, options),
)
publish = st.builds(
    lambda q, i: Message(CommandType.PUBLISH, i, q, b'{"n":1}'), good_queues, msg_ids
)
subscribe = st.builds(
    lambda q, p: Message(CommandType.SUBSCRIBE, "s", q, headers={"prefetch": p}),
    good_queues,
    st.sampled_from(["1", "2", "10"]),
)
ack = st.builds(lambda i: Message(CommandType.ACK, "a", headers={"messageId": i}), msg_ids)
plausible = st.one_of(
    create,
    publish,
    publish,
    publish,
    subscribe,
    subscribe,
    ack,
    ack,
    ack,
    st.builds(lambda q: Message(CommandType.UNSUBSCRIBE, "u", q), good_queues),
    st.builds(lambda q: Message(CommandType.DELETE_QUEUE, "dq", q), good_queues),
    st.builds(lambda q: Message(CommandType.QUEUE_INFO, "qi", q), good_queues),
).map(encode_body)

# What happens on a connection: a frame (cut where ``cut`` says: what is left of it goes with
# the next read), raw bytes that may break the framing, the socket filling up and draining,
# and time passing (seconds) for the keep-alive and stalled-frame checks.
Step = tuple[str, int, bytes, int]
cuts = st.one_of(st.just(1 << 20), st.just(1 << 20), st.integers(0, 60))
clients = st.integers(0, 1)
steps = st.one_of(
    st.tuples(st.just("frame"), clients, plausible, cuts),
    st.tuples(st.just("frame"), clients, plausible, cuts),
    st.tuples(st.just("frame"), clients, bodies, cuts),
    st.tuples(st.just("frame"), clients, plausible, cuts),
    st.tuples(st.just("raw"), clients, st.binary(min_size=1, max_size=8), st.just(0)),
    st.tuples(st.sampled_from(["block", "drain"]), clients, st.just(b""), st.just(0)),
    st.tuples(st.just("tick"), clients, st.just(b""), st.integers(0, 15)),
)


class Client:
    """One client's side of the fuzz: the session of its current connection; when the
    session closes the connection, the transport's ``connection_lost`` follows, and a new
    connection takes its place (so the rest of the input still reaches a session)."""

    def __init__(self, name: str, manager: QueueManager, config: Config, auth: bool) -> None:
        self.name = name
        self.manager = manager
        self.config = config
        self.auth = auth
        self.links: list[Link] = []
        self.pending = b""
        self.connects = 0
        self._connect()

    def _connect(self) -> None:
        self.connects += 1
        self.link = Link(f"{self.name}_{self.connects}")
        if self.links:
            self.link.now = self.links[-1].now
        self.links.append(self.link)
        self.session = Session(self.link, self.manager, self.config)
        self.pending = b""
        hdrs = {"authToken": "secret"} if self.auth else {}
        self.session.data_received(encode(Message(CommandType.CONNECT, "c", headers=hdrs)))

    def _live(self) -> Session:
        if self.link.closed:
            self.session.connection_lost(None)
            self._connect()
        return self.session

    def feed(self, data: bytes, cut: int) -> None:
        session = self._live()
        self.pending += data
        now, self.pending = self.pending[:cut], self.pending[cut:]
        if now:
            self.link.receive(session, now)

    def run_soon(self) -> None:
        for link in self.links:
            soon, link.soon = link.soon, []
            for callback in soon:
                callback()

    def step(self, kind: str, data: bytes, n: int) -> None:
        if kind == "frame":
            self.feed(frame(data), n)
        elif kind == "raw":
            self.feed(data, len(self.pending) + len(data))
        elif kind == "block":
            self.link.socket_writable = False
        elif kind == "drain":
            self.link.socket_writable = True
            if not self.link.closed:
                self.session.writable_again()
        else:  # tick
            self.link.now += n
            if not self.link.closed:
                cfg = self.config
                self.session.check_timers(
                    self.link.now, cfg.keepalive_timeout_s, cfg.frame_timeout_s
                )
        self.run_soon()

    def finish(self) -> None:
        """The rest of the input arrives; then the client goes away."""
        if self.pending:
            self.feed(b"", len(self.pending))
        self.run_soon()
        self._live()
        self.session.connection_lost(None)
        self.link.closed = True


def assert_live(manager: QueueManager) -> None:
    """Liveness: no ready message waits while a subscriber can take it (has room, its
    connection is writable, and it does not still hold a delivery of the same id)."""
    now = manager.clock()
    for queue in manager.queues.values():
        subs = queue.subscriptions
        fan_out = queue.options.delivery_mode in (
            DeliveryMode.FAN_OUT_WITH_ACK,
            DeliveryMode.FAN_OUT_WITHOUT_ACK,
        )
        for sub in subs:
            # A message parked on a subscription (a reused id) waits only while no
            # subscriber with room is free of its id (a fan-out copy: its own subscriber).
            for msg_id in sub.deferred or ():
                free = [
                    s
                    for s in ([sub] if fan_out else subs)
                    if s.has_capacity() and msg_id not in s.inflight
                ]
                assert not free, f"{msg_id} parked in {queue.name} while {free[0].id} has room"
        parked = {id(m) for s in subs for same in (s.deferred or {}).values() for m in same}
        head = next((m for m in queue.ready() if id(m) not in parked), None)
        if head is None or head.expired(now) or not subs:
            continue
        if fan_out:  # (a subscriber holding the id gets its copy parked)
            takers = [s for s in subs if s.has_capacity()]
            stuck = len(takers) == len(subs) and not head.single
        else:
            # (a message whose id a subscriber still holds is parked on it, not left here)
            takers = [s for s in subs if s.has_capacity() and head.id not in s.inflight]
            stuck = bool(takers)
        assert not stuck, f"{head.id} waits in {queue.name} while {takers[0].id} has room"


def assert_server_frames(links: list[Link]) -> None:
    """Everything written is well-formed protocol, whole frames only."""
    for link in links:
        decoder = FrameDecoder()
        for body in decoder.feed(b"".join(link.out)):
            decode_body(body)
        assert decoder.buffered == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(steps, min_size=20, max_size=80),
    st.booleans(),
    st.lists(st.integers(0, 5000), max_size=5),
)
def test_no_input_escapes_as_an_exception(script: list[Step], auth: bool, ticks: list[int]) -> None:
    clock = ManualClock()
    config = Config(
        auth_tokens=["secret"] if auth else [], keepalive_timeout_s=60, frame_timeout_s=10
    )
    manager = QueueManager(config.queue_defaults, clock)
    clients = [Client(f"c{i}", manager, config, auth) for i in range(2)]
    for i, (kind, who, data, n) in enumerate(script):
        clients[who].step(kind, data, n)
        if ticks and i % 7 == 0:
            clock.advance(ticks[i % len(ticks)])
            manager.tick()
        assert_live(manager)
    clients[0].finish()
    manager.tick()
    assert_server_frames(clients[0].links + clients[1].links)
    # Queued bytes are accounted exactly.
    assert manager.memory_bytes == sum(q.nbytes for q in manager.queues.values())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(steps, min_size=20, max_size=80),
    st.lists(st.integers(0, 5000), max_size=5),
    st.sets(st.integers(0, 79), max_size=3),
)
def test_journal_replay_equals_the_live_state(
    script: list[Step], ticks: list[int], drops: set[int]
) -> None:
    """Whatever the clients did (including dropping their connections), recovering the
    journal gives back exactly the durable queues and the messages still in them (ready or
    delivered but unacked)."""
    asyncio.run(_replay_equals_live(script, ticks, drops))


def _live_ids(manager: QueueManager) -> dict[str, list[int]]:
    out = {}
    for name, queue in manager.queues.items():
        if queue.options.durable:
            seqs = [m.seq for m in queue.ready()]
            for sub in queue.subscriptions:
                seqs.extend(m.seq for m in sub.inflight.values())
            out[name] = sorted(set(seqs))
    return out


async def _replay_equals_live(script: list[Step], ticks: list[int], drops: set[int]) -> None:
    clock = ManualClock()
    config = Config()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "journal"
        manager = QueueManager(config.queue_defaults, clock)
        journal = Journal(directory, fsync=FsyncPolicy.NEVER, clock=clock)
        journal.recover(manager)
        journal.start(manager)
        manager.persistence = journal
        clients = [Client(f"c{i}", manager, config, False) for i in range(2)]
        for i, (kind, who, data, n) in enumerate(script):
            clients[who].step(kind, data, n)
            if i in drops:  # the client goes away; a new one comes
                clients[0].link.closed = True
            if i % 5 == 0:
                await asyncio.sleep(0)  # let the journal flush now and then
            if ticks and i % 7 == 0:
                clock.advance(ticks[i % len(ticks)])
                manager.tick()
            assert_live(manager)
        for client in clients:
            client.finish()
        await asyncio.sleep(0)  # the last durable acks
        expected = _live_ids(manager)
        await journal.close()
        assert_server_frames(clients[0].links + clients[1].links)

        recovered = QueueManager(config.queue_defaults, clock)
        Journal(directory, clock=clock).recover(recovered)
        assert _live_ids(recovered) == expected
        assert all(q.options.durable for q in recovered.queues.values())


# -- issue 16: a large frame cut anywhere, and the stall clock ------------------------------------

#: ~200 KB of JSON, and the frame of a Publish of it.
BIG_JSON = b'"' + b"0123456789abcdef" * 12_500 + b'"'
BIG_FRAME = frame(encode_body(Message(CommandType.PUBLISH, "big1", "big", BIG_JSON)))
_NEAR_EDGES = st.integers(1, 16) | st.integers(-16, -1).map(lambda d: len(BIG_FRAME) + d)


def _big_world(frame_timeout: float = 10.0) -> tuple[Client, Client]:
    """A publisher and a subscriber (prefetch 1) of the queue ``big``."""
    config = Config(keepalive_timeout_s=600, frame_timeout_s=frame_timeout)
    manager = QueueManager(config.queue_defaults, ManualClock())
    pub, sub = Client("p", manager, config, False), Client("s", manager, config, False)
    create = Message(CommandType.CREATE_QUEUE, "cq", "big", b"{}")
    sub.step("frame", encode_body(create), 1 << 20)
    subscribe = Message(CommandType.SUBSCRIBE, "s", "big", headers={"prefetch": "1"})
    sub.step("frame", encode_body(subscribe), 1 << 20)
    return pub, sub


def _received(link: Link) -> list[Message]:
    decoder = FrameDecoder(2 * len(BIG_FRAME))  # (a Deliver is a little longer)
    return [decode_body(body) for body in decoder.feed(b"".join(link.out))]


def _feed_cut(client: Client, data: bytes, cuts: list[int]) -> None:
    edges = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    for a, b in itertools.pairwise(edges):
        client.link.receive(client.session, data[a:b])
        client.run_soon()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, len(BIG_FRAME) - 1) | _NEAR_EDGES, max_size=40))
def test_a_large_publish_cut_anywhere_is_delivered_whole(cuts: list[int]) -> None:
    pub, sub = _big_world()
    _feed_cut(pub, BIG_FRAME, cuts)
    sub.run_soon()
    acks = [m for m in _received(pub.link) if m.type is CommandType.PUBLISH_ACK]
    assert [m.id for m in acks] == ["big1"]
    deliveries = [m for m in _received(sub.link) if m.type is CommandType.DELIVER]
    assert [m.payload for m in deliveries] == [BIG_JSON]
    assert not pub.link.closed


def _arrive_slowly(piece: int, every: float) -> tuple[Client, Client]:
    """The big Publish in pieces of ``piece`` bytes, ``every`` seconds apart, the session's
    timers checked in between (frame_timeout_s 10)."""
    pub, sub = _big_world(frame_timeout=10.0)
    cfg = pub.config
    for at in range(0, len(BIG_FRAME), piece):
        if pub.link.closed:
            break
        pub.link.receive(pub.session, BIG_FRAME[at : at + piece])
        pub.link.now += every
        pub.session.check_timers(pub.link.now, cfg.keepalive_timeout_s, cfg.frame_timeout_s)
        pub.run_soon()
    sub.run_soon()
    return pub, sub


def test_a_large_frame_that_keeps_arriving_is_not_a_stalled_one() -> None:
    """64 KiB every 9 s: the frame takes 36 s, longer than frame_timeout_s, but progresses."""
    pub, sub = _arrive_slowly(64 * 1024, 9.0)
    assert not pub.link.closed
    assert [m.payload for m in _received(sub.link) if m.type is CommandType.DELIVER] == [BIG_JSON]


def test_a_dribbled_frame_still_times_out() -> None:
    """1 KiB every 3 s is no progress: the connection is closed with INVALID_MESSAGE."""
    pub, sub = _arrive_slowly(1024, 3.0)
    assert pub.link.closed
    errors = [m for m in _received(pub.link) if m.type is CommandType.ERROR]
    assert [m.error_code for m in errors] == ["INVALID_MESSAGE"]
    assert not [m for m in _received(sub.link) if m.type is CommandType.DELIVER]
