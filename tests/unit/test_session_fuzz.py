"""Any sequence of frames, well-formed or not, only ever produces replies from a session:
no exception escapes ``handle_body``, and the core's accounting stays consistent."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vibemq_server.config import Config
from vibemq_server.core import ManualClock, QueueManager
from vibemq_server.journal import FsyncPolicy, Journal
from vibemq_server.protocol import CommandType, FrameDecoder, Message, decode_body, encode_body
from vibemq_server.server.session import Session


class Link:
    """The transport side of a session, recording what would be written."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closed = False
        self.writable = True

    def send(self, data: bytes) -> None:
        self.out.append(data)

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def call_soon(self, callback: Callable[[], None]) -> None:
        callback()


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


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(bodies, max_size=30), st.booleans(), st.lists(st.integers(0, 5000), max_size=5))
def test_no_input_escapes_as_an_exception(
    frames: list[bytes], auth: bool, ticks: list[int]
) -> None:
    clock = ManualClock()
    config = Config(auth_tokens=["secret"] if auth else [])
    manager = QueueManager(config.queue_defaults, clock)
    links = [Link(), Link()]
    log = structlog.get_logger("fuzz")
    sessions = [Session(link, manager, config, f"c{i}", log) for i, link in enumerate(links)]
    connect = encode_body(Message(CommandType.CONNECT, "c", headers={"authToken": "secret"}))
    for s in sessions:
        s.handle_body(connect)
    for i, body in enumerate(frames):
        sessions[i % 2].handle_body(body)
        if ticks and i % 7 == 0:
            clock.advance(ticks[i % len(ticks)])
            manager.tick()
    sessions[0].connection_lost()
    manager.tick()
    # Everything written is well-formed protocol.
    for link in links:
        for body in FrameDecoder().feed(b"".join(link.out)):
            decode_body(body)
    # Queued bytes are accounted exactly.
    assert manager.memory_bytes == sum(q.store.nbytes for q in manager.queues.values())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(bodies, max_size=30),
    st.lists(st.integers(0, 5000), max_size=5),
    st.sets(st.integers(0, 29), max_size=3),
)
def test_journal_replay_equals_the_live_state(
    frames: list[bytes], ticks: list[int], drops: set[int]
) -> None:
    """Whatever the clients did (including dropping their connections), recovering the
    journal gives back exactly the durable queues and the messages still in them (ready or
    delivered but unacked)."""
    asyncio.run(_replay_equals_live(frames, ticks, drops))


def _live_ids(manager: QueueManager) -> dict[str, list[int]]:
    out = {}
    for name, queue in manager.queues.items():
        if queue.options.durable:
            seqs = [m.seq for m in queue.store]
            for sub in queue.subscriptions:
                seqs.extend(m.seq for m in sub.inflight.values())
            out[name] = sorted(set(seqs))
    return out


async def _replay_equals_live(frames: list[bytes], ticks: list[int], drops: set[int]) -> None:
    clock = ManualClock()
    config = Config()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "journal"
        manager = QueueManager(config.queue_defaults, clock)
        journal = Journal(directory, fsync=FsyncPolicy.NEVER, clock=clock)
        journal.recover(manager)
        journal.start(manager)
        manager.persistence = journal
        links = [Link(), Link()]
        log = structlog.get_logger("fuzz")
        sessions = [Session(link, manager, config, f"c{i}", log) for i, link in enumerate(links)]
        for s in sessions:
            s.handle_body(encode_body(Message(CommandType.CONNECT, "c")))
        for i, body in enumerate(frames):
            sessions[i % 2].handle_body(body)
            if i in drops:  # the client goes away; a new one comes
                sessions[0].connection_lost()
                sessions[0] = Session(Link(), manager, config, f"c{i}", log)
                sessions[0].handle_body(encode_body(Message(CommandType.CONNECT, "c")))
            if i % 5 == 0:
                await asyncio.sleep(0)  # let the journal flush now and then
            if ticks and i % 7 == 0:
                clock.advance(ticks[i % len(ticks)])
                manager.tick()
        expected = _live_ids(manager)
        await journal.close()

        recovered = QueueManager(config.queue_defaults, clock)
        Journal(directory, clock=clock).recover(recovered)
        assert _live_ids(recovered) == expected
        assert all(q.options.durable for q in recovered.queues.values())
