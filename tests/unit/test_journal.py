"""The journal with a real QueueManager: what a restart brings back, torn tails and damage,
rotation and reclamation, durability callbacks and the disk-failure path."""

from __future__ import annotations

import asyncio
import errno
import os
import struct
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from waits import durable, maintained, wait_for

from vibemq_server.config import QueueDefaults
from vibemq_server.core import (
    ManualClock,
    PersistenceUnavailable,
    PublishOutcome,
    QueueManager,
    StoredMessage,
    Subscription,
)
from vibemq_server.core.queue import Consumer as CoreConsumer
from vibemq_server.journal import journal as journal_mod
from vibemq_server.journal import records as records_mod
from vibemq_server.journal import recovery as recovery_mod
from vibemq_server.journal.batch import PyRecordBuffer
from vibemq_server.journal.journal import FsyncPolicy, Journal
from vibemq_server.journal.records import (
    RECORD_PREFIX,
    SEGMENT_HEADER_SIZE,
    Deliver,
    Publish,
    QueueCreate,
    Record,
    Settle,
    encode_record,
    iter_records,
)
from vibemq_server.journal.recovery import JournalCorrupt, list_segments
from vibemq_server.journal.sysio import SystemCalls

# -- doubles and helpers ---------------------------------------------------------------------


class Consumer(CoreConsumer):
    """The core's Consumer port: records deliveries, never acks by itself."""

    writable = True  # (shadows Consumer's read-only property: instances may set it)

    def __init__(self) -> None:
        self.writable = True
        self.got: list[StoredMessage] = []
        self.cancelled: list[str] = []

    def deliver(self, sub: Subscription, msg: StoredMessage) -> None:
        self.got.append(msg)

    def subscription_cancelled(self, sub: Subscription, reason: str) -> None:
        self.cancelled.append(reason)

    @property
    def seen(self) -> list[tuple[str, int]]:
        return [(m.id, m.attempts) for m in self.got]


class LogRecorder:
    """Stands in for the journal module's structlog logger."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def _record(self, level: str, event: str, **kw: Any) -> None:
        self.events.append((level, event, kw))

    def debug(self, event: str, **kw: Any) -> None:
        self._record("debug", event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        self._record("info", event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._record("warning", event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._record("error", event, **kw)

    def at(self, level: str) -> list[tuple[str, dict[str, Any]]]:
        return [(e, kw) for lv, e, kw in self.events if lv == level]


class FaultyOs(SystemCalls):
    """The journal's system calls, with writes that fail on demand (the OS
    reporting a full disk); everything else is the real module."""

    def __init__(self) -> None:
        self.fail_writes = False
        self.partial_first = False  # the first failing write puts half its bytes on disk
        self.calls: list[str] = []

    def write(self, fd: int, data: Any) -> int:
        self.calls.append("write")
        if self.fail_writes:
            if self.partial_first and len(data) > 1:
                self.partial_first = False
                return os.write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    def writev(self, fd: int, buffers: Any) -> int:
        """A batch with large records (written without a join): fails like ``write``."""
        self.calls.append("writev")
        if self.fail_writes:
            if self.partial_first:
                self.partial_first = False
                return os.write(fd, bytes(buffers[0][: max(1, len(buffers[0]) // 2)]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.writev(fd, buffers)

    def fsync(self, fd: int) -> None:
        self.calls.append("fsync")
        os.fsync(fd)


class Env:
    """Brokers-without-sockets on one journal directory: open, restart, close."""

    def __init__(self, directory: Path, clock: ManualClock) -> None:
        self.directory = directory
        self.clock = clock
        self.open_journals: list[Journal] = []

    def open(self, **kw: Any) -> tuple[QueueManager, Journal]:
        mgr = QueueManager(QueueDefaults(), self.clock)
        journal = Journal(self.directory, clock=self.clock, **kw)
        self.open_journals.append(journal)
        journal.recover(mgr)
        journal.start(mgr)
        mgr.persistence = journal
        return mgr, journal

    async def close(self, journal: Journal) -> None:
        await journal.close()
        self.open_journals.remove(journal)

    async def restart(self, journal: Journal, **kw: Any) -> tuple[QueueManager, Journal]:
        await self.close(journal)
        return self.open(**kw)

    def segments(self) -> list[tuple[int, Path]]:
        return list_segments(self.directory)

    def records(self) -> list[Record]:
        out: list[Record] = []
        for _number, path in self.segments():
            out.extend(e.record for e in iter_records(path.read_bytes(), path=str(path)))
        return out


@pytest.fixture
async def env(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Env]:
    e = Env(tmp_path / "journal", clock)
    yield e
    for journal in list(e.open_journals):
        await journal.close()


def make(mgr: QueueManager, name: str, **options: object) -> None:
    mgr.create_queue(name, mgr.options_from(options))


def publish(mgr: QueueManager, queue: str, *ids: str, payload: bytes = b"{}") -> None:
    for mid in ids:
        outcome = mgr.publish(queue, mid, payload, {})
        assert outcome in (PublishOutcome.ACCEPTED, PublishOutcome.ACCEPTED_DURABLE)


def live(journal: Journal) -> int:
    """The journal's count of unsettled publishes over all its segments (what reclamation
    goes by): it must equal the number of unsettled durable messages."""
    return sum(seg.live for seg in journal.segments.values())


def ready(mgr: QueueManager, queue: str) -> list[tuple[str, int]]:
    return [(m.id, m.attempts) for m in mgr.queues[queue].ready()]


# -- what a restart brings back --------------------------------------------------------------


async def test_queues_and_options_survive_restart(env: Env, clock: ManualClock) -> None:
    mgr, journal = env.open()
    options = {
        "mode": "PriorityBased",
        "maxQueueSize": 50,
        "messageTtl": 60_000,
        "enableDeadLetterQueue": True,
        "deadLetterQueueName": "dead",
        "maxRetryAttempts": 5,
        "ackTimeout": 1234,
        "overflowStrategy": "DropNewest",
    }
    make(mgr, "a", **options)
    clock.advance(10)
    make(mgr, "b", mode="FanOutWithAck", overflowStrategy="BlockPublisher")
    make(mgr, "c")
    expected = {n: (q.options, q.created_at) for n, q in mgr.queues.items()}

    mgr2, journal2 = await env.restart(journal)
    assert {n: (q.options, q.created_at) for n, q in mgr2.queues.items()} == expected
    # and once more: the definitions written at the head of the second segment suffice too
    mgr3, _ = await env.restart(journal2)
    assert {n: (q.options, q.created_at) for n, q in mgr3.queues.items()} == expected


async def test_unacked_messages_return_in_order_with_attempts(env: Env) -> None:
    mgr, journal = env.open()
    make(mgr, "work")
    publish(mgr, "work", *[f"m{i}" for i in range(6)])
    c = Consumer()
    sub = mgr.subscribe("work", "s", c, 3)
    assert c.seen == [("m0", 1), ("m1", 1), ("m2", 1)]
    assert mgr.ack(sub, "m1")
    assert c.seen[-1] == ("m3", 1)  # the freed slot took the next one

    mgr2, journal2 = await env.restart(journal)
    assert journal2.recovered_messages == 5
    assert ready(mgr2, "work") == [("m0", 1), ("m2", 1), ("m3", 1), ("m4", 0), ("m5", 0)]
    c2 = Consumer()
    sub2 = mgr2.subscribe("work", "s", c2, 100)
    assert c2.seen == [("m0", 2), ("m2", 2), ("m3", 2), ("m4", 1), ("m5", 1)]
    # new publishes get a seq after every recovered one, so they stay behind them
    publish(mgr2, "work", "m6")
    assert mgr2.ack(sub2, "m0") and mgr2.ack(sub2, "m4")

    mgr3, _ = await env.restart(journal2)
    assert ready(mgr3, "work") == [("m2", 2), ("m3", 2), ("m5", 1), ("m6", 1)]


async def test_large_records_among_small_ones_survive_whole(env: Env) -> None:
    """A batch with large records is written with os.writev (the large ones not joined into
    the batch): every payload comes back whole and in order."""
    mgr, journal = env.open()
    make(mgr, "big")
    expected: list[tuple[str, bytes]] = []
    for i in range(4):
        large = b'{"pad":"' + bytes([97 + i]) * (300_000 + i) + b'"}'
        expected += [(f"s{i}", b"{}"), (f"m{i}", large)]
    for mid, payload in expected:
        publish(mgr, "big", mid, payload=payload)
    assert await durable(journal) is None
    mgr2, _ = await env.restart(journal)
    assert [(m.id, m.payload) for m in mgr2.queues["big"].ready()] == expected


async def test_all_acked_means_nothing_comes_back(env: Env) -> None:
    mgr, journal = env.open()
    c = Consumer()
    sub = mgr.subscribe("q", "s", c, 10)  # auto-created, durable by default
    publish(mgr, "q", "a", "b", "c")
    for mid in "abc":
        assert mgr.ack(sub, mid)
    mgr2, journal2 = await env.restart(journal)
    assert "q" in mgr2.queues
    assert ready(mgr2, "q") == []
    assert journal2.recovered_messages == 0


async def test_priority_levels_survive(env: Env) -> None:
    mgr, journal = env.open()
    make(mgr, "p", mode="PriorityBased")
    for mid, prio in [("low", "low"), ("crit", "critical"), ("norm", "normal"), ("high", "high")]:
        mgr.publish("p", mid, b"{}", {"priority": prio})
    mgr2, _ = await env.restart(journal)
    c = Consumer()
    mgr2.subscribe("p", "s", c, 10)
    assert [m.id for m in c.got] == ["crit", "high", "norm", "low"]
    assert c.got[0].headers == {"priority": "critical"}


async def test_message_fields_survive(env: Env, clock: ManualClock) -> None:
    mgr, journal = env.open()
    make(mgr, "q", messageTtl=100_000)
    payload = '{"text":"héllo"}'.encode()
    mgr.publish("q", "id-1", payload, {"k": "v", "correlationId": "x"})
    original = next(iter(mgr.queues["q"].ready()))
    clock.advance(50)
    mgr2, _ = await env.restart(journal)
    got = next(iter(mgr2.queues["q"].ready()))
    assert (got.id, got.queue, got.payload, dict(got.headers)) == (
        "id-1",
        "q",
        payload,
        {"k": "v", "correlationId": "x"},
    )
    assert (got.published_at, got.expires_at, got.priority, got.seq) == (
        original.published_at,
        original.expires_at,
        original.priority,
        original.seq,
    )
    assert mgr2.next_seq == original.seq + 1


async def test_dead_lettered_messages_are_in_the_dlq(env: Env) -> None:
    mgr, journal = env.open()
    make(mgr, "q", enableDeadLetterQueue=True, maxRetryAttempts=1)
    c = Consumer()
    sub = mgr.subscribe("q", "s", c, 10)
    publish(mgr, "q", "m1", "m2")
    mgr.unsubscribe(sub)  # both come back at attempt 1 of 1: dead-lettered
    assert ready(mgr, "q") == []
    order = [m.id for m in mgr.queues["q.dlq"].ready()]
    assert sorted(order) == ["m1", "m2"]

    mgr2, _ = await env.restart(journal)
    assert ready(mgr2, "q") == []
    dead = list(mgr2.queues["q.dlq"].ready())
    assert [m.id for m in dead] == order  # the dead-letter queue's own order is kept
    headers = dict(dead[0].headers)
    assert headers["deadLetterReason"] == "MaxRetriesExceeded"
    assert headers["originalQueue"] == "q"
    assert headers["originalDeliveryAttempts"] == "1"
    assert mgr2.queues["q.dlq"].options.durable


async def test_deleted_queue_is_gone(env: Env) -> None:
    mgr, journal = env.open()
    make(mgr, "gone")
    make(mgr, "kept")
    publish(mgr, "gone", "g1", "g2")
    publish(mgr, "kept", "k1")
    mgr.delete_queue("gone")
    mgr2, journal2 = await env.restart(journal)
    assert set(mgr2.queues) == {"kept"}
    assert ready(mgr2, "kept") == [("k1", 0)]
    # recreated under the same name: only what was published after the re-creation
    make(mgr2, "gone", maxQueueSize=7)
    publish(mgr2, "gone", "g3")
    mgr3, _ = await env.restart(journal2)
    assert ready(mgr3, "gone") == [("g3", 0)]
    assert mgr3.queues["gone"].options.max_queue_size == 7


async def test_non_durable_queue_is_not_recovered(env: Env) -> None:
    mgr, journal = env.open()
    make(mgr, "tmp", durable=False)
    make(mgr, "keep")
    publish(mgr, "tmp", "t1")
    publish(mgr, "keep", "k1")
    mgr2, _ = await env.restart(journal)
    assert set(mgr2.queues) == {"keep"}
    assert ready(mgr2, "keep") == [("k1", 0)]
    names = {getattr(r, "name", None) or getattr(r, "queue", None) for r in env.records()}
    assert "tmp" not in names


async def test_ttl_expires_by_wall_clock_across_restart(env: Env, clock: ManualClock) -> None:
    mgr, journal = env.open()
    make(mgr, "t", messageTtl=1000, enableDeadLetterQueue=True)
    publish(mgr, "t", "early")
    clock.advance(500)
    publish(mgr, "t", "late")
    mgr.tick()
    assert [m for m, _ in ready(mgr, "t")] == ["early", "late"]

    await env.close(journal)
    clock.advance(600)  # "early" expired while the broker was down, "late" has 400 ms left
    mgr2, journal2 = env.open()
    mgr2.tick()
    assert [m for m, _ in ready(mgr2, "t")] == ["late"]
    dead = list(mgr2.queues["t.dlq"].ready())
    assert [m.id for m in dead] == ["early"]
    assert dead[0].headers["deadLetterReason"] == "MessageExpired"

    mgr3, journal3 = await env.restart(journal2)
    assert [m for m, _ in ready(mgr3, "t")] == ["late"]
    assert [m.id for m in mgr3.queues["t.dlq"].ready()] == ["early"]
    await env.close(journal3)
    clock.advance(400)
    mgr4, _ = env.open()
    mgr4.tick()
    assert ready(mgr4, "t") == []
    assert [m.id for m in mgr4.queues["t.dlq"].ready()] == ["early", "late"]


async def test_ttl_expiry_without_dlq_drops_for_good(env: Env, clock: ManualClock) -> None:
    mgr, journal = env.open()
    make(mgr, "t", messageTtl=1000)
    publish(mgr, "t", "m")
    await env.close(journal)
    clock.advance(1000)
    mgr2, journal2 = env.open()
    mgr2.tick()
    assert ready(mgr2, "t") == []
    mgr3, _ = await env.restart(journal2)
    assert ready(mgr3, "t") == []
    assert set(mgr3.queues) == {"t"}


async def test_fan_out_is_settled_only_when_every_copy_is_acked(env: Env) -> None:
    mgr, journal = env.open()
    make(mgr, "f", mode="FanOutWithAck")
    a, b = Consumer(), Consumer()
    sa = mgr.subscribe("f", "a", a, 1)
    mgr.subscribe("f", "b", b, 1)
    publish(mgr, "f", "m1", "m2")
    assert a.seen == b.seen == [("m1", 1)]
    assert mgr.ack(sa, "m1")  # b still holds its copy

    mgr2, journal2 = await env.restart(journal)
    assert ready(mgr2, "f") == [("m1", 1), ("m2", 0)]
    a2, b2 = Consumer(), Consumer()
    sa2 = mgr2.subscribe("f", "a", a2, 1, dispatch=False)
    sb2 = mgr2.subscribe("f", "b", b2, 1)
    assert a2.seen == b2.seen == [("m1", 2)]
    assert mgr2.ack(sa2, "m1") and mgr2.ack(sb2, "m1")
    assert a2.seen[-1] == b2.seen[-1] == ("m2", 1)
    assert mgr2.ack(sb2, "m2")  # only one copy of m2 acked

    mgr3, journal3 = await env.restart(journal2)
    assert ready(mgr3, "f") == [("m2", 1)]
    a3, b3 = Consumer(), Consumer()
    sa3 = mgr3.subscribe("f", "a", a3, 1, dispatch=False)
    sb3 = mgr3.subscribe("f", "b", b3, 1)
    assert mgr3.ack(sa3, "m2") and mgr3.ack(sb3, "m2")
    mgr4, _ = await env.restart(journal3)
    assert ready(mgr4, "f") == []


# -- durability callbacks --------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(FsyncPolicy))
async def test_when_durable_fires_with_none(
    env: Env, policy: FsyncPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FaultyOs()
    mgr, journal = env.open(fsync=policy, fsync_interval_ms=5, system=fake)
    make(mgr, "q")
    results: list[tuple[int, Exception | None, int]] = []
    seg_path = env.segments()[-1][1]

    def waiter(i: int) -> Callable[[Exception | None], None]:
        # at callback time the record must be in the file already
        return lambda err: results.append((i, err, seg_path.stat().st_size))

    publish(mgr, "q", "m1")
    fake.calls.clear()
    journal.when_durable(waiter(1))
    publish(mgr, "q", "m2")
    journal.when_durable(waiter(2))
    assert results == []  # never called back synchronously
    await wait_for(lambda: len(results) == 2)
    size = seg_path.stat().st_size
    assert [(i, err) for i, err, _ in results] == [(1, None), (2, None)]
    assert all(at_size == size for _, _, at_size in results)
    assert "write" in fake.calls
    if policy is FsyncPolicy.ALWAYS:
        # an fsync that started after the write preceded the callbacks
        assert fake.calls.index("fsync") > fake.calls.index("write")
    # a waiter with nothing new to write still gets its callback
    assert await durable(journal) is None
    if policy is FsyncPolicy.INTERVAL:
        before = fake.calls.count("fsync")
        publish(mgr, "q", "m3")
        await wait_for(lambda: fake.calls.count("fsync") > before)


async def test_group_commit_shares_fsyncs(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FaultyOs()
    mgr, journal = env.open(fsync=FsyncPolicy.ALWAYS, system=fake)
    make(mgr, "q")
    await durable(journal)
    fake.calls.clear()
    done: list[Exception | None] = []
    for i in range(50):
        publish(mgr, "q", f"m{i}")
        journal.when_durable(done.append)
    await wait_for(lambda: len(done) == 50)
    assert done == [None] * 50
    assert fake.calls.count("fsync") <= 2
    assert fake.calls.count("write") <= 2


# -- torn tails and damage -------------------------------------------------------------------


async def _three_messages(env: Env) -> Path:
    mgr, journal = env.open()
    make(mgr, "q")
    publish(mgr, "q", "m1", "m2", "m3")
    await env.close(journal)
    return env.segments()[-1][1]


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param("half", id="half-record"),
        pytest.param("zeros", id="zero-filled"),
        pytest.param("prefix", id="three-bytes"),
    ],
)
async def test_torn_tail_is_truncated(env: Env, tail: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = await _three_messages(env)
    good_size = path.stat().st_size
    record = encode_record(Publish(99, "q", "m4", 1, 0, 1, 0, {"a": "b"}, b"{}" * 20), 1)
    junk = {"half": record[: len(record) // 2], "zeros": b"\x00" * 100, "prefix": record[:3]}
    with path.open("ab") as fh:
        fh.write(junk[tail])
    logs = LogRecorder()
    monkeypatch.setattr(journal_mod, "log", logs)
    monkeypatch.setattr(recovery_mod, "log", logs)

    mgr, _ = env.open()
    assert ready(mgr, "q") == [("m1", 0), ("m2", 0), ("m3", 0)]
    assert path.stat().st_size == good_size
    warnings = logs.at("warning")
    assert len(warnings) == 1
    event, fields = warnings[0]
    assert "torn" in event
    assert fields["file"] == str(path)
    assert fields["offset"] == good_size
    assert fields["dropped_bytes"] == len(junk[tail])


@pytest.mark.parametrize("damage", [None, "payload-length", "queue-length"])
async def test_a_large_message_cut_off_past_the_scan_limit_is_a_torn_tail(
    env: Env, damage: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill during a large message's write can leave more of it than recovery scans a
    byte at a time (8 MiB): a PUBLISH whose head is whole and agrees with its prefix, its
    payload cut off, is a torn tail all the same. A damaged head is not: refuse to start."""
    path = await _three_messages(env)
    good_size = path.stat().st_size
    big = b'{"d":"' + b"x" * (10 * 1024 * 1024) + b'"}'
    record = bytearray(encode_record(Publish(99, "q", "big", 1, 0, 1, 0, {"a": "b"}, big), 1))
    head = RECORD_PREFIX.size + recovery_mod._PUBLISH_QUEUE  # where the queue's name starts
    if damage == "payload-length":
        at = head + 2 + 1 + 2 + 3 + 2 + (2 + 1) * 2  # queue "q", id "big", one header
        record[at + 3] ^= 0x01  # the payload length no longer ends the record where it should
    elif damage == "queue-length":
        record[head + 1] = 0xFF  # a queue name running into the id and beyond
    with path.open("ab") as fh:
        fh.write(record[: len(record) - 1024 * 1024])  # 9 MiB of it: past the scan limit
    logs = LogRecorder()
    monkeypatch.setattr(journal_mod, "log", logs)
    monkeypatch.setattr(recovery_mod, "log", logs)
    if damage is not None:
        with pytest.raises(JournalCorrupt):
            env.open()
        return
    mgr, _ = env.open()
    assert ready(mgr, "q") == [("m1", 0), ("m2", 0), ("m3", 0)]
    assert path.stat().st_size == good_size
    assert [event for event, _ in logs.at("warning")] == ["truncating torn journal tail"]


async def test_damaged_last_record_is_a_torn_tail(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = await _three_messages(env)
    data = bytearray(path.read_bytes())
    last = list(iter_records(bytes(data)))[-1]
    data[last.offset + last.size - 1] ^= 0x10
    path.write_bytes(bytes(data))
    logs = LogRecorder()
    monkeypatch.setattr(journal_mod, "log", logs)
    monkeypatch.setattr(recovery_mod, "log", logs)
    mgr, _ = env.open()
    assert ready(mgr, "q") == [("m1", 0), ("m2", 0)]
    assert path.stat().st_size == last.offset
    assert len(logs.at("warning")) == 1


async def test_flip_in_the_middle_is_corrupt(env: Env) -> None:
    path = await _three_messages(env)
    data = bytearray(path.read_bytes())
    entries = list(iter_records(bytes(data)))
    target = next(
        e for e in entries if isinstance(e.record, Publish) and e.record.message_id == "m2"
    )
    data[target.offset + 20] ^= 0x01
    path.write_bytes(bytes(data))
    size = len(data)
    with pytest.raises(JournalCorrupt) as info:
        env.open()
    message = str(info.value)
    assert str(path) in message
    assert f"offset {target.offset}" in message
    assert path.stat().st_size == size  # nothing cut
    env.open_journals.clear()  # never started


async def test_flip_in_an_older_segment_is_corrupt(env: Env) -> None:
    path = await _three_messages(env)
    mgr, journal = env.open()  # a second segment
    publish(mgr, "q", "m4")
    await env.close(journal)
    assert len(env.segments()) == 2
    data = bytearray(path.read_bytes())
    last = list(iter_records(bytes(data)))[-1]
    data[last.offset + last.size - 1] ^= 0x01  # the very last record of the older segment
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt) as info:
        env.open()
    assert str(path) in str(info.value)
    assert f"offset {last.offset}" in str(info.value)
    env.open_journals.clear()


@pytest.mark.parametrize("which", ["older", "last"])
async def test_bad_magic_is_corrupt(env: Env, which: str) -> None:
    await _three_messages(env)
    _mgr, journal = env.open()
    await env.close(journal)
    segs = env.segments()
    path = segs[0][1] if which == "older" else segs[-1][1]
    data = bytearray(path.read_bytes())
    data[0:4] = b"XXXX"
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt) as info:
        env.open()
    assert str(path) in str(info.value)
    assert "magic" in str(info.value)
    env.open_journals.clear()


async def test_short_last_segment_is_removed(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    await _three_messages(env)
    number = env.segments()[-1][0] + 1
    torn = recovery_mod.segment_path(env.directory, number)
    torn.write_bytes(b"VMQJ\x00\x01\x00")  # a header cut off by a crash
    logs = LogRecorder()
    monkeypatch.setattr(journal_mod, "log", logs)
    monkeypatch.setattr(recovery_mod, "log", logs)
    mgr, journal = env.open()
    assert ready(mgr, "q") == [("m1", 0), ("m2", 0), ("m3", 0)]
    assert len(logs.at("warning")) == 1
    # the new segment took the free number and is a whole segment
    assert journal.active == number
    assert torn.read_bytes()[:SEGMENT_HEADER_SIZE] == records_mod.encode_segment_header(number)
    publish(mgr, "q", "m4")
    mgr2, _ = await env.restart(journal)
    assert [m for m, _ in ready(mgr2, "q")] == ["m1", "m2", "m3", "m4"]


# -- rotation and reclamation ----------------------------------------------------------------

PAYLOAD = b'{"data":"' + b"x" * 80 + b'"}'


async def _publish_batches(
    mgr: QueueManager, journal: Journal, queue: str, count: int, prefix: str
) -> None:
    for start in range(0, count, 10):
        for i in range(start, min(start + 10, count)):
            mgr.publish(queue, f"{prefix}{i}", PAYLOAD, {})
        assert await durable(journal) is None


async def _ack_batches(mgr: QueueManager, journal: Journal, sub: Subscription) -> None:
    while sub.inflight:
        for mid in list(sub.inflight)[:10]:
            assert mgr.ack(sub, mid)
        assert await durable(journal) is None


async def _compact_oldest(env: Env, mgr: QueueManager, journal: Journal) -> Subscription:
    """Churn through queue "work" (300 publishes, all acked: five segments and more) and
    maintain until the oldest segment, where what the test keeps was written, is compacted
    away; the work queue's subscription."""
    sub = mgr.subscribe("work", "w", Consumer(), 10_000)
    await _publish_batches(mgr, journal, "work", 300, "w")
    await _ack_batches(mgr, journal, sub)
    oldest = env.segments()[0][1]
    assert len(env.segments()) >= 5
    journal.maintain()  # compacts the oldest: what is live there is copied to the active one
    await wait_for(lambda: not oldest.exists())
    return sub


async def _reclaim_all(env: Env, journal: Journal) -> None:
    """Maintain until only the active segment (or one more) is left."""
    for _ in range(5):
        await maintained(journal)
        await durable(journal)
    assert len(env.segments()) <= 2


async def test_acks_of_a_read_settle_in_the_journal_and_release_segments(env: Env) -> None:
    """ack_many (a read's acks, settled in one settled_all) is as durable as one ack each:
    nothing acked comes back, the rest does, and the settled segment can be reclaimed."""
    mgr, journal = env.open()
    make(mgr, "q")
    c = Consumer()
    sub = mgr.subscribe("q", "s", c, 10)
    publish(mgr, "q", "a", "b", "c", "d")
    assert await durable(journal) is None
    first = env.segments()[0][0]
    assert mgr.ack_many(sub, ["a", "x", "c", "d"]) == ["x"]
    assert live(journal) == 1
    mgr2, journal2 = await env.restart(journal)
    assert ready(mgr2, "q") == [("b", 1)]
    c2 = Consumer()
    sub2 = mgr2.subscribe("q", "s", c2, 10)
    assert mgr2.ack_many(sub2, ["b"]) == []
    assert await durable(journal2) is None
    await maintained(journal2)
    assert first not in [n for n, _ in env.segments()]
    mgr3, _ = await env.restart(journal2)
    assert ready(mgr3, "q") == []


async def test_a_turns_deliveries_and_acks_keep_each_messages_record_order(env: Env) -> None:
    """The journal gathers a turn's consecutive deliveries of a queue into one run of DELIVER
    records (a client's PUBLISH may go in between): still one DELIVER a delivery, each after
    its message's PUBLISH and before its SETTLE, with its attempts, whatever breaks a run (a
    redelivery, another queue, an ack), and acks whose seqs do not follow on settled too."""
    mgr, journal = env.open()
    make(mgr, "q")
    make(mgr, "r")
    c, d = Consumer(), Consumer()
    sub = mgr.subscribe("q", "s", c, 10)
    mgr.subscribe("r", "s", d, 10)
    # all in one turn: no flush in between
    publish(mgr, "q", "a", "b")
    publish(mgr, "r", "x")
    publish(mgr, "q", "c", "d", "e", "f")
    assert mgr.ack_many(sub, ["e", "f"]) == []  # one run, while their DELIVERs gather
    assert mgr.nack(sub, "b", requeue=True)  # redelivered at once, attempts 2
    assert mgr.ack_many(sub, ["a", "c", "d"]) == []  # (b between: not one run)
    publish(mgr, "q", "g")
    assert [m.id for m in c.got] == list("abcdefbg")  # (b delivered twice)
    assert await durable(journal) is None
    records = env.records()
    seqs = {r.message_id: r.seq for r in records if isinstance(r, Publish)}
    at = {id(r): i for i, r in enumerate(records)}

    def where(kind: type[Publish | Deliver | Settle], mid: str) -> list[int]:
        return [at[id(r)] for r in records if isinstance(r, kind) and r.seq == seqs[mid]]

    delivered = [(r.seq, r.queue, r.attempts) for r in records if isinstance(r, Deliver)]
    expected = [(seqs[m], "q", 1) for m in "abcdef"] + [(seqs["x"], "r", 1)]
    expected += [(seqs["b"], "q", 2), (seqs["g"], "q", 1)]
    assert sorted(delivered) == sorted(expected)
    for mid in "abcdefgx":
        (published,) = where(Publish, mid)
        assert all(published < i for i in where(Deliver, mid))
        assert all(i < j for i in where(Deliver, mid) for j in where(Settle, mid))
    assert [r.attempts for r in records if isinstance(r, Deliver) and r.seq == seqs["b"]] == [1, 2]
    mgr2, _ = await env.restart(journal)
    assert ready(mgr2, "q") == [("b", 2), ("g", 1)]
    assert ready(mgr2, "r") == [("x", 1)]


async def test_a_delivery_past_the_records_attempts_is_refused_at_once(env: Env) -> None:
    """A DELIVER record's attempts is a u16: a delivery past it is refused in the delivery,
    as it was when each one was encoded at once, not later in the flush (the deliveries
    gathered before it are written)."""
    mgr, journal = env.open()
    make(mgr, "q")
    c = Consumer()
    sub = mgr.subscribe("q", "s", c, 10)
    publish(mgr, "q", "a", "b")
    c.got[1].attempts = 0xFFFF
    with pytest.raises((OverflowError, struct.error)):
        mgr.nack(sub, "b", requeue=True)
    assert await durable(journal) is None
    delivered = [(r.seq, r.attempts) for r in env.records() if isinstance(r, Deliver)]
    assert delivered == [(c.got[0].seq, 1), (c.got[1].seq, 1)]


async def test_rotation_then_reclaim_everything_settled(env: Env) -> None:
    mgr, journal = env.open(segment_size=4096)
    make(mgr, "r")
    c = Consumer()
    sub = mgr.subscribe("r", "s", c, 10_000)
    await _publish_batches(mgr, journal, "r", 300, "m")
    assert len(c.got) == 300
    await _ack_batches(mgr, journal, sub)
    before = env.segments()
    assert len(before) >= 5
    # each closed segment stays within one batch of the limit
    for _n, path in before[:-1]:
        assert path.stat().st_size < 4096 + 10 * 200
    await maintained(journal)
    after = env.segments()
    assert len(after) <= 2
    assert after[-1][0] == journal.active
    mgr2, _ = await env.restart(journal, segment_size=4096)
    assert set(mgr2.queues) == {"r"}
    assert ready(mgr2, "r") == []


@pytest.mark.parametrize("run", [journal_mod.COMPACT_RUN, 7], ids=["one-turn", "turns-of-7"])
async def test_reclaim_never_deletes_a_segment_with_live_messages(env: Env, run: int) -> None:
    mgr, journal = env.open(segment_size=4096)
    journal.compact_run = run  # (a large backlog is compacted over several loop turns)
    make(mgr, "r")
    c = Consumer()
    sub = mgr.subscribe("r", "s", c, 10_000)
    await _publish_batches(mgr, journal, "r", 200, "m")
    # ack every other message: every segment keeps live messages (more than 10 %)
    for i in range(0, 200, 2):
        assert mgr.ack(sub, f"m{i}")
    await durable(journal)
    before = [n for n, _ in env.segments()]
    assert live(journal) == 100
    journal.maintain()
    await durable(journal)
    await wait_for(lambda: not any(seg.deleting for seg in journal.segments.values()))
    # The oldest segment pins later ones with only a few live messages, so it may be
    # compacted: its messages copied forward, never dropped.
    assert live(journal) == 100
    after = [n for n, _ in env.segments()]
    assert set(after) - set(before) <= {journal.active}
    mgr2, _ = await env.restart(journal, segment_size=4096)
    assert [m for m, _ in ready(mgr2, "r")] == [f"m{i}" for i in range(1, 200, 2)]


async def test_recovered_messages_release_their_segments(env: Env) -> None:
    mgr, journal = env.open()
    make(mgr, "q")
    publish(mgr, "q", "a", "b", "c")
    mgr2, journal2 = await env.restart(journal)
    first = env.segments()[0][0]
    c = Consumer()
    sub = mgr2.subscribe("q", "s", c, 10)
    for mid in "abc":
        assert mgr2.ack(sub, mid)
    assert await durable(journal2) is None
    await maintained(journal2)
    assert first not in [n for n, _ in env.segments()]
    mgr3, _ = await env.restart(journal2)
    assert ready(mgr3, "q") == []


async def test_compaction_moves_a_long_lived_message(env: Env) -> None:
    mgr, journal = env.open(segment_size=4096)
    make(mgr, "hold")
    make(mgr, "work")
    holder = Consumer()
    mgr.subscribe("hold", "h", holder, 1)
    mgr.publish("hold", "keep", PAYLOAD, {"x": "y"})
    assert holder.seen == [("keep", 1)]  # delivered, never acked
    await _compact_oldest(env, mgr, journal)
    assert live(journal) == 1
    await _reclaim_all(env, journal)

    mgr2, _ = await env.restart(journal, segment_size=4096)
    assert ready(mgr2, "hold") == [("keep", 1)]
    assert ready(mgr2, "work") == []
    publishes = [r for r in env.records() if isinstance(r, Publish) and r.queue == "hold"]
    assert len({r.seq for r in publishes}) == 1
    h2 = Consumer()
    mgr2.subscribe("hold", "h", h2, 1)
    assert h2.seen == [("keep", 2)]
    assert dict(h2.got[0].headers) == {"x": "y"}


async def test_compacted_copy_is_settled_and_reclaimed(env: Env) -> None:
    mgr, journal = env.open(segment_size=4096)
    make(mgr, "hold")
    make(mgr, "work")
    holder = Consumer()
    hsub = mgr.subscribe("hold", "h", holder, 1)
    mgr.publish("hold", "keep", PAYLOAD, {})
    sub = await _compact_oldest(env, mgr, journal)
    assert mgr.ack(hsub, "keep")
    # push the segment holding the copy out of the active position, then reclaim
    await _publish_batches(mgr, journal, "work", 60, "z")
    await _ack_batches(mgr, journal, sub)
    await _reclaim_all(env, journal)
    mgr2, _ = await env.restart(journal, segment_size=4096)
    assert ready(mgr2, "hold") == []


@pytest.mark.parametrize("run", [journal_mod.COMPACT_RUN, 1], ids=["one-turn", "turns-of-1"])
async def test_compaction_of_fan_out_copies(env: Env, run: int) -> None:
    """A fan-out message held by two subscribers is one message: compaction writes it once
    (or at least recovery sees it once), and acking both copies frees its new segment. (In
    turns of one message, its two copies are looked at in different turns.)"""
    mgr, journal = env.open(segment_size=4096)
    journal.compact_run = run
    make(mgr, "fan", mode="FanOutWithAck")
    make(mgr, "work")
    a, b = Consumer(), Consumer()
    sa = mgr.subscribe("fan", "a", a, 1)
    sb = mgr.subscribe("fan", "b", b, 1)
    mgr.publish("fan", "f", PAYLOAD, {})
    assert a.seen == b.seen == [("f", 1)]
    sub = await _compact_oldest(env, mgr, journal)
    assert live(journal) == 1
    assert mgr.ack(sa, "f") and mgr.ack(sb, "f")
    assert live(journal) == 0
    await _publish_batches(mgr, journal, "work", 60, "z")
    await _ack_batches(mgr, journal, sub)
    await _reclaim_all(env, journal)  # every publish is settled
    mgr2, _ = await env.restart(journal, segment_size=4096)
    assert ready(mgr2, "fan") == []


async def test_deleted_queue_releases_its_segments(env: Env) -> None:
    """Messages still in a deleted queue are gone (QUEUE_DELETE), so their segments must not
    be held forever."""
    mgr, journal = env.open(segment_size=4096)
    make(mgr, "gone")
    await _publish_batches(mgr, journal, "gone", 200, "g")
    assert len(env.segments()) >= 4
    assert live(journal) == 200
    mgr.delete_queue("gone")
    assert live(journal) == 0
    assert await durable(journal) is None
    await maintained(journal)
    assert len(env.segments()) <= 2
    mgr2, _ = await env.restart(journal, segment_size=4096)
    assert "gone" not in mgr2.queues


# -- disk failure ----------------------------------------------------------------------------


@pytest.mark.parametrize("partial", [False, True], ids=["nothing-written", "half-written"])
async def test_write_failure_refuses_durable_publishes_then_recovers(
    env: Env, monkeypatch: pytest.MonkeyPatch, partial: bool
) -> None:
    fake = FaultyOs()
    logs = LogRecorder()
    monkeypatch.setattr(journal_mod, "log", logs)
    monkeypatch.setattr(recovery_mod, "log", logs)
    mgr, journal = env.open(system=fake)
    make(mgr, "d")
    make(mgr, "mem", durable=False)
    publish(mgr, "d", "m1")
    assert await durable(journal) is None

    fake.fail_writes = True
    fake.partial_first = partial
    assert mgr.publish("d", "m2", b"{}", {}) is PublishOutcome.ACCEPTED_DURABLE
    err = await durable(journal)
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    assert journal.available is False
    assert len(logs.at("error")) == 1
    with pytest.raises(PersistenceUnavailable):
        mgr.publish("d", "m3", b"{}", {})
    assert mgr.publish("mem", "x", b"{}", {}) is PublishOutcome.ACCEPTED  # not journaled
    # consumers keep being served; their acks are kept for later
    # m2's publisher got the error and no consumer had it yet: it was withdrawn
    c = Consumer()
    sub = mgr.subscribe("d", "s", c, 10)
    assert c.seen == [("m1", 1)]
    assert mgr.ack(sub, "m1")
    err2 = await durable(journal)
    assert isinstance(err2, OSError)
    journal.maintain()  # still failing
    assert journal.available is False
    # what is on disk now is whole records only (a half-written batch was cut back)
    seg = env.segments()[-1][1]
    list(iter_records(seg.read_bytes()))

    fake.fail_writes = False
    journal.maintain()
    assert journal.available is True
    assert await durable(journal) is None
    publish(mgr, "d", "m4")
    assert await durable(journal) is None

    mgr2, _ = await env.restart(journal)
    assert c.seen[-1] == ("m4", 1)
    assert ready(mgr2, "d") == [("m4", 1)]
    assert "mem" not in mgr2.queues


@pytest.mark.parametrize("encoder", ["compiled", "pure"])
async def test_a_failed_batch_withdraws_its_publishes_from_inside_the_encoded_records(
    env: Env, monkeypatch: pytest.MonkeyPatch, encoder: str
) -> None:
    """A write batch's small records are one encoded chunk (journal/batch.py); the publishes
    withdrawn after a failed write are cut out of it, between records that stay (a delivered
    message's, records with headers or a large payload written on their own)."""
    monkeypatch.setattr(journal_mod, "log", LogRecorder())
    fake = FaultyOs()
    mgr, journal = env.open(system=fake)
    if encoder == "pure":
        journal.use_encoder(PyRecordBuffer())
    make(mgr, "d")
    assert await durable(journal) is None
    c = Consumer()
    mgr.subscribe("d", "s", c, 1)
    fake.fail_writes = True
    publish(mgr, "d", "m1")  # delivered at once: not withdrawn
    mgr.publish("d", "m2", b"{}", {"h": "v"})
    publish(mgr, "d", "m3")
    publish(mgr, "d", "m4", payload=b'"' + b"x" * 20_000 + b'"')
    publish(mgr, "d", "m5", "m6")
    assert c.seen == [("m1", 1)]
    assert isinstance(await durable(journal), OSError)
    assert ready(mgr, "d") == []  # every message no consumer had was withdrawn
    fake.fail_writes = False
    journal.maintain()
    assert journal.available is True
    publish(mgr, "d", "m7")
    assert await durable(journal) is None
    mgr2, _ = await env.restart(journal)
    assert ready(mgr2, "d") == [("m1", 1), ("m7", 0)]


async def test_fsync_failure_reports_to_waiters(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FaultyOs()
    mgr, journal = env.open(system=fake)
    make(mgr, "d")
    await durable(journal)

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(fake, "fsync", failing_fsync)
    publish(mgr, "d", "m1")
    err = await durable(journal)
    assert isinstance(err, OSError) and err.errno == errno.EIO
    assert journal.available is False
    with pytest.raises(PersistenceUnavailable):
        mgr.publish("d", "m2", b"{}", {})
    monkeypatch.setattr(fake, "fsync", os.fsync)
    journal.maintain()
    assert journal.available is True
    publish(mgr, "d", "m3")
    assert await durable(journal) is None
    mgr2, _ = await env.restart(journal)
    assert [m for m, _ in ready(mgr2, "d")] == ["m1", "m3"]


# -- on-disk shape ---------------------------------------------------------------------------


async def test_every_segment_starts_with_the_queue_definitions(env: Env) -> None:
    mgr, journal = env.open(segment_size=4096)
    make(mgr, "a")
    make(mgr, "b", durable=False)
    await _publish_batches(mgr, journal, "a", 100, "m")
    segs = env.segments()
    assert len(segs) >= 3
    for number, path in segs:
        data = path.read_bytes()
        assert records_mod.check_segment_header(data) == number
        first = next(iter_records(data)).record
        assert isinstance(first, QueueCreate) and first.name == "a"
    assert not any(isinstance(r, Deliver) for r in env.records())


async def test_close_at_a_rotation_boundary_is_clean(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() writes what is buffered and stops: no write after the file is closed (which
    would log a failure) and no segment without the queue definitions at its head."""
    logs = LogRecorder()
    monkeypatch.setattr(journal_mod, "log", logs)
    monkeypatch.setattr(recovery_mod, "log", logs)
    mgr, journal = env.open(segment_size=200)
    make(mgr, "q")
    for i in range(5):  # more than a segment, all buffered in this loop turn
        mgr.publish("q", f"m{i}", b"x" * 50, {})
    await env.close(journal)
    for _ in range(5):
        await asyncio.sleep(0)
    assert logs.at("error") == []
    assert journal.available
    for _number, path in env.segments():
        records = list(iter_records(path.read_bytes()))
        assert records and isinstance(records[0].record, QueueCreate)
    mgr2, _ = env.open(segment_size=200)
    assert [m for m, _ in ready(mgr2, "q")] == [f"m{i}" for i in range(5)]


async def test_broker_recovers_from_its_data_dir(tmp_path: Path) -> None:
    from vibemq_server.app import create_broker
    from vibemq_server.config import Config

    config = Config(
        host="127.0.0.1",
        port=0,
        data_dir=tmp_path / "data",
        drain_timeout_s=1.0,
        mqtt={"port": 0},
        amqp={"port": 0},
        http={"port": 0},
    )
    first = create_broker(config)
    await first.start()
    try:
        first.manager.create_queue("q", first.manager.options_from({"maxQueueSize": 9}))
        first.manager.publish("q", "m1", b"{}", {})
    finally:
        await first.stop()
    assert list_segments(tmp_path / "data" / "journal")
    second = create_broker(config)
    await second.start()
    try:
        assert second.manager.queues["q"].options.max_queue_size == 9
        assert [m.id for m in second.manager.queues["q"].ready()] == ["m1"]
    finally:
        await second.stop()


async def test_seq_is_never_reused_after_everything_was_settled(env: Env) -> None:
    """Recovery continues the seq after the highest ever journaled, not after the highest
    still live: docs/journal.md promises seqs are never reused (Spark relies on it)."""
    mgr, journal = env.open()
    make(mgr, "q")
    c = Consumer()
    sub = mgr.subscribe("q", "s", c, 100)
    publish(mgr, "q", "a", "b", "c")
    for mid in ("a", "b", "c"):
        assert mgr.ack(sub, mid)
    top = mgr.next_seq
    await durable(journal)
    mgr2, _ = await env.restart(journal)
    assert mgr2.next_seq >= top


# -- rotation off the loop -----------------------------------------------------------------


class RotationOs(SystemCalls):
    """fsyncs that count those run on the event loop's thread, and that hold (or fail) the
    first one a rotation runs (the journal is rotating then) until the test says."""

    def __init__(self, fail: bool = False) -> None:
        self.loop_thread = threading.get_ident()
        self.on_loop = 0
        self.journal: Journal | None = None
        self.fail = fail
        self.gate = threading.Event()
        self.held = threading.Event()

    def fsync(self, fd: int) -> None:
        if threading.get_ident() == self.loop_thread:
            self.on_loop += 1
        elif self.journal is not None and self.journal._rotating and not self.held.is_set():
            self.held.set()
            self.gate.wait(10)
            if self.fail:
                raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)


async def _publish_until_a_rotation_holds(mgr: QueueManager, fake: RotationOs) -> int:
    """Publish to "q" (letting the loop turn) until a rotation waits in its fsync; how many."""
    n = 0
    while not fake.held.is_set():
        assert n < 5000, "no rotation"
        for _ in range(10):
            mgr.publish("q", f"m{n}", PAYLOAD, {})
            n += 1
        await asyncio.sleep(0.005)
    return n


async def test_a_rotation_syncs_and_makes_the_new_segment_off_the_loop(env: Env) -> None:
    """The sealed segment's fsync and the new one's (header, directory) run in a worker: on
    a contended disk they froze every connection. What is recorded meanwhile waits for the
    new segment and is written there, durable once it is."""
    fake = RotationOs()
    mgr, journal = env.open(system=fake, segment_size=4096)
    fake.journal = journal
    at_start = fake.on_loop  # (start opens its first segment on the loop)
    make(mgr, "q")
    n = await _publish_until_a_rotation_holds(mgr, fake)
    new = journal.active
    waiting = asyncio.ensure_future(durable(journal))
    for _ in range(10):
        mgr.publish("q", f"m{n}", PAYLOAD, {})
        n += 1
    await asyncio.sleep(0.05)  # (the loop turns; nothing can be durable before the gate)
    assert not waiting.done()
    fake.gate.set()
    assert await waiting is None
    assert fake.on_loop == at_start
    assert new in [number for number, _ in env.segments()]
    mgr2, _ = await env.restart(journal, segment_size=4096)
    assert [mid for mid, _ in ready(mgr2, "q")] == [f"m{i}" for i in range(n)]


async def test_a_failed_rotation_refuses_then_recovers_into_the_new_segment(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = RotationOs(fail=True)
    monkeypatch.setattr(journal_mod, "log", LogRecorder())
    mgr, journal = env.open(system=fake, segment_size=4096)
    fake.journal = journal
    make(mgr, "q")
    n = await _publish_until_a_rotation_holds(mgr, fake)
    waiting = asyncio.ensure_future(durable(journal))
    await asyncio.sleep(0)
    fake.gate.set()
    assert isinstance(await waiting, OSError)  # never a false "durable"
    assert not journal.available
    journal.maintain()  # storage is back: the new segment is made, the records written
    assert journal.available
    assert await durable(journal) is None
    kept = [mid for mid, _ in ready(mgr, "q")]
    assert kept == [f"m{i}" for i in range(n)]
    mgr2, _ = await env.restart(journal, segment_size=4096)
    assert [mid for mid, _ in ready(mgr2, "q")] == kept
