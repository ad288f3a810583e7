"""The queue index sidecars of sealed segments: written off the loop for the sealed segments
reclaim keeps (one all settled by then is deleted unindexed), equal to what a walk of the
segment finds, never trusted once stale or damaged, rebuilt at start, removed with
their segment; a sidecar write killed with SIGKILL leaves nothing that is trusted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from waits import wait_for

from vibemq_server.config import QueueDefaults
from vibemq_server.core import Consumer, ManualClock, QueueManager, Subscription
from vibemq_server.journal import journal as journal_mod
from vibemq_server.journal import qindex
from vibemq_server.journal.journal import Journal
from vibemq_server.journal.records import (
    SEGMENT_HEADER_SIZE,
    encode_deliver,
    encode_publish,
    encode_segment_header,
    iter_records,
)
from vibemq_server.journal.recovery import list_segments

PAYLOAD = b'{"n": "' + b"x" * 100 + b'"}'


class Broker:
    """A QueueManager on a journal directory, opened and closed as a broker does."""

    def __init__(self, directory: Path, clock: ManualClock) -> None:
        self.directory = directory
        self.clock = clock
        self.journal: Journal | None = None

    def open(self) -> tuple[QueueManager, Journal]:
        mgr = QueueManager(QueueDefaults(), self.clock)
        self.journal = Journal(self.directory, clock=self.clock, segment_size=4096)
        self.journal.recover(mgr)
        self.journal.start(mgr)
        mgr.persistence = self.journal
        return mgr, self.journal

    async def close(self) -> None:
        if self.journal is not None:
            await self.journal.close()
            self.journal = None


@pytest.fixture
async def broker(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Broker]:
    b = Broker(tmp_path / "journal", clock)
    yield b
    await b.close()


async def _durable(journal: Journal) -> None:
    done: list[Exception | None] = []
    journal.when_durable(done.append)
    await wait_for(lambda: bool(done), what="durable")
    assert done == [None]


async def _publish(mgr: QueueManager, journal: Journal, count: int) -> None:
    """``count`` messages over three queues, ten at a time (each batch one write)."""
    for start in range(0, count, 10):
        for i in range(start, min(start + 10, count)):
            mgr.publish(f"q{i % 3}", f"m{i}", PAYLOAD, {})
        await _durable(journal)


def _expected(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Each queue's record ranges, adjacent records coalesced, from decoding every record."""
    out: dict[str, list[tuple[int, int]]] = {}
    for e in iter_records(path.read_bytes()):
        queue = getattr(e.record, "queue", getattr(e.record, "name", ""))
        ranges = out.setdefault(queue, [])
        if ranges and ranges[-1][1] == e.offset:
            ranges[-1] = (ranges[-1][0], e.offset + e.size)
        else:
            ranges.append((e.offset, e.offset + e.size))
    return out


def _sealed_indexed(journal: Journal) -> bool:
    """Every sealed segment that reclaim kept has its sidecar (the oldest may be compacted
    meanwhile: being deleted, it gets none)."""
    return all(
        qindex.load(seg.path) is not None
        for seg in journal.segments.values()
        if seg.indexed and not seg.deleting
    )


async def _keep_sealed(journal: Journal) -> list[int]:
    """The housekeeping's reclaim once the last rotation is done: the sealed segments it
    keeps, whose indexes it asks for."""
    await wait_for(lambda: not journal._rotating, what="the last rotation")
    journal.maintain()
    return [n for n, seg in journal.segments.items() if seg.indexed and not seg.deleting]


async def test_sealed_segments_get_a_sidecar_equal_to_their_records(broker: Broker) -> None:
    mgr, journal = broker.open()
    for name in ("q0", "q1", "q2"):
        mgr.create_queue(name, mgr.options_from({}))
    await _publish(mgr, journal, 120)
    assert len(journal.segments) >= 3
    kept = await _keep_sealed(journal)  # what they hold is live: kept
    assert len(kept) >= 2 and journal.active not in kept
    await wait_for(lambda: _sealed_indexed(journal), what="sidecars of sealed segments")
    assert not qindex.index_path(journal.segments[journal.active].path).exists()
    for number in kept:
        seg = journal.segments[number]
        index = qindex.load(seg.path)
        assert index is not None and index.segment == number
        assert index.end == index.size == seg.path.stat().st_size
        assert {q: s.ranges for q, s in index.queues.items()} == _expected(seg.path)
        # one queue asked for: its ranges, the others' times but no ranges
        one = qindex.load(seg.path, frozenset({"q1"}))
        assert one is not None and one.queues["q1"].ranges == index.queues["q1"].ranges
        assert (
            one.queues["q0"].ranges == [] and one.queues["q0"].max_ts == index.queues["q0"].max_ts
        )


async def test_restart_indexes_the_last_segment_and_recovers_as_before(broker: Broker) -> None:
    mgr, journal = broker.open()
    mgr.create_queue("q0", mgr.options_from({}))
    mgr.create_queue("q1", mgr.options_from({}))
    mgr.create_queue("q2", mgr.options_from({}))
    await _publish(mgr, journal, 60)
    last = journal.segments[journal.active].path
    await broker.close()
    assert not qindex.index_path(last).exists()
    # a crash's leftovers: a temporary sidecar and the sidecar of a segment gone
    (last.parent / f"{qindex.index_path(last).name}.123.tmp").write_bytes(b"half")
    (last.parent / "00000000000000009999.qidx").write_bytes(b"orphan")
    mgr2, _journal2 = broker.open()
    assert sorted(mgr2.queues[q].count for q in ("q0", "q1", "q2")) == [20, 20, 20]
    await wait_for(lambda: qindex.load(last) is not None, what="the last segment indexed")
    await wait_for(
        lambda: (
            sorted(p.name for p in last.parent.glob("*.qidx*"))
            == sorted(qindex.index_path(p).name for _n, p in list_segments(last.parent)[:-1])
        ),
        what="leftovers removed",
    )


async def _consumed(mgr: QueueManager, journal: Journal, keep_up: bool) -> Subscription:
    """A consumer on queue "q0" and 200 messages published to it ten at a time, each batch
    made durable (and acked then, with ``keep_up``)."""
    mgr.create_queue("q0", mgr.options_from({}))
    sub = mgr.subscribe("q0", "s", _Taker(), 10_000)
    for start in range(0, 200, 10):
        for i in range(start, start + 10):
            mgr.publish("q0", f"m{i}", PAYLOAD, {})
        await _durable(journal)
        if keep_up:
            for mid in list(sub.inflight):
                assert mgr.ack(sub, mid)
            await _durable(journal)
    return sub


async def test_reclaimed_segments_lose_their_sidecars(broker: Broker) -> None:
    mgr, journal = broker.open()
    sub = await _consumed(mgr, journal, keep_up=False)
    assert await _keep_sealed(journal)
    await wait_for(lambda: _sealed_indexed(journal), what="sidecars")
    while sub.inflight:
        for mid in list(sub.inflight)[:10]:
            assert mgr.ack(sub, mid)
        await _durable(journal)
    journal.maintain()
    await broker.close()
    directory = broker.directory
    segments = {p.stem for _n, p in list_segments(directory)}
    assert {p.stem for p in directory.glob("*.qidx")} <= segments


async def test_a_segment_settled_by_its_first_reclaim_is_deleted_unindexed(
    broker: Broker,
) -> None:
    """A consumer that keeps up: what a sealed segment holds is settled before the next
    maintain, which deletes it; no index is built for it (it would have no reader)."""
    mgr, journal = broker.open()
    await _consumed(mgr, journal, keep_up=True)
    await wait_for(lambda: not journal._rotating, what="the last rotation")
    sealed = [seg for number, seg in journal.segments.items() if number != journal.active]
    assert len(sealed) >= 2 and all(seg.live == 0 for seg in sealed)
    journal.maintain()
    assert not any(seg.indexed for seg in sealed)
    await wait_for(
        lambda: all(seg.number not in journal.segments for seg in sealed), what="deleted"
    )
    assert not any(seg.path.exists() for seg in sealed)
    await broker.close()
    assert list(broker.directory.glob("*.qidx*")) == []


class _Taker(Consumer):
    writable = True

    def deliver(self, sub: object, msg: object) -> None:
        pass

    def subscription_cancelled(self, sub: object, reason: str) -> None:
        pass


# -- a segment written by hand: stale, damaged, cut -------------------------------------------


def _segment(tmp_path: Path, count: int = 30) -> tuple[Path, bytes]:
    parts = [encode_segment_header(1)]
    for i in range(count):
        queue = f"q{i % 3}"
        parts.append(encode_publish(1000 + i, i, queue, f"m{i}", 1000 + i, 0, 0, 1, {}, PAYLOAD))
        parts.append(encode_deliver(1000 + i, i, queue, 1))
    path = tmp_path / "00000000000000000001.seg"
    data = b"".join(parts)
    path.write_bytes(data)
    return path, data


def test_index_times_and_ranges(tmp_path: Path) -> None:
    assert qindex.INDEX_SUFFIX == journal_mod.INDEX_SUFFIX
    path, data = _segment(tmp_path)
    index = qindex.ensure(path)
    assert index is not None and index.end == len(data)
    assert {q: qindex.ranges_of(s) for q, s in index.queues.items()} == _expected(path)
    assert (index.queues["q0"].min_ts, index.queues["q0"].max_ts) == (1000, 1027)
    assert len(qindex.ranges_of(index.queues["q1"])) == 10  # PUBLISH + DELIVER coalesced
    loaded = qindex.load(path)
    assert loaded is not None and qindex.encode(loaded) == qindex.encode(index)


def test_stale_sidecar_is_not_trusted(tmp_path: Path) -> None:
    path, data = _segment(tmp_path)
    assert qindex.ensure(path) is not None
    path.write_bytes(data + encode_deliver(2000, 99, "q0", 1))  # grown
    assert qindex.load(path) is None
    rebuilt = qindex.ensure(path)
    assert rebuilt is not None and rebuilt.end == path.stat().st_size
    # same size, another last record
    other = data[: -len(encode_deliver(1029, 29, "q2", 1))] + encode_deliver(1029, 29, "q2", 2)
    assert len(other) == len(data)
    path.write_bytes(data)
    assert qindex.ensure(path) is not None
    path.write_bytes(other)
    assert qindex.load(path) is None
    # another segment's sidecar beside it
    qindex.index_path(path).write_bytes(
        qindex.encode(qindex.SegmentIndex(2, len(other), len(other), 0, 0, 0))
    )
    assert qindex.load(path) is None


def test_damaged_sidecar_is_not_trusted(tmp_path: Path) -> None:
    path, _data = _segment(tmp_path)
    assert qindex.ensure(path) is not None
    good = qindex.index_path(path).read_bytes()
    for where in range(0, len(good), max(1, len(good) // 40)):
        bad = bytearray(good)
        bad[where] ^= 0x21
        qindex.index_path(path).write_bytes(bytes(bad))
        assert qindex.load(path) is None, where
    for cut in range(0, len(good), max(1, len(good) // 40)):
        qindex.index_path(path).write_bytes(good[:cut])
        assert qindex.load(path) is None, cut


def test_cut_tail_is_left_out_and_damage_gets_no_index(tmp_path: Path) -> None:
    path, data = _segment(tmp_path)
    records = list(iter_records(data))
    cut = records[-1].offset + 5
    path.write_bytes(data[:cut])
    index = qindex.ensure(path)
    assert index is not None and index.end == records[-1].offset and index.size == cut
    path.write_bytes(data + bytes(100))  # zero-filled tail
    index = qindex.ensure(path)
    assert index is not None and index.end == len(data)
    bad = bytearray(data)
    bad[records[10].offset + 12] ^= 0x40  # a flip with records after it
    path.write_bytes(bytes(bad))
    assert qindex.build(path) is None
    assert qindex.ensure(path) is None and qindex.load(path) is None
    path.write_bytes(encode_segment_header(1))  # no records
    empty = qindex.ensure(path)
    assert empty is not None and empty.queues == {} and empty.end == SEGMENT_HEADER_SIZE


_KILLED_WRITER = """
import sys, time
from pathlib import Path
from vibemq_server.journal import journal as journal_mod
from vibemq_server.journal import qindex
def stall(src, dst):
    print("written", flush=True)
    time.sleep(60)
qindex.os.replace = stall
path = Path(sys.argv[1])
qindex.write(path, qindex.build(path))
"""


def test_sigkill_during_a_sidecar_write_leaves_nothing_trusted(tmp_path: Path) -> None:
    path, _data = _segment(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(path)], stdout=subprocess.PIPE, env=env
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"written\n"  # the temporary file, not renamed
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert not qindex.index_path(path).exists()
    assert [p.name for p in tmp_path.glob("*.tmp")] != []
    assert qindex.load(path) is None
    qindex.clean(tmp_path)
    assert list(tmp_path.glob("*.tmp")) == []
    assert qindex.ensure(path) is not None


def test_the_compiled_walk_is_built() -> None:
    """The broker indexes sealed segments with the C walk (GIL released); without it the
    Python loop serves, some 30 times slower (a failure here, not a skip, as test_bigcopy)."""
    assert qindex.index_scan is not None


def _walks(data: bytes) -> tuple[bytes | None, bytes | None]:
    """The sidecar bytes of both walks over one segment's bytes (None: damaged)."""
    fast = qindex.build_compiled(data, 1)
    pure = qindex.build_pure(data, 1)
    return (
        None if fast is None else qindex.encode(fast),
        None if pure is None else qindex.encode(pure),
    )


@settings(max_examples=150, deadline=None)
@given(
    picks=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.integers(0, 3)), max_size=40),
    cut=st.integers(0, 4000),
    flip=st.one_of(st.none(), st.integers(0, 4000)),
    zeros=st.integers(0, 64),
)
def test_compiled_walk_equals_python_walk(
    picks: list[tuple[int, int, int]], cut: int, flip: int | None, zeros: int
) -> None:
    """Same sidecar from both walks over random segments: queues interleaved, times out of
    order, cut tails, zero-filled tails, a flipped byte anywhere."""
    parts = [encode_segment_header(1)]
    for i, (queue, kind, jitter) in enumerate(picks):
        name, ts = f"q{queue}", 1000 + i - 3 * jitter
        if kind == 0:
            parts.append(encode_publish(ts, i, name, f"m{i}", ts, 0, 0, 1, {}, PAYLOAD[: 10 + i]))
        elif kind == 1:
            parts.append(encode_deliver(ts, i, name, 1))
        else:
            parts.append(encode_publish(ts, i, "é" + name, "x", ts, 0, 0, 1, {"h": "v"}, b"{}"))
    data = bytearray(b"".join(parts))
    if flip is not None and SEGMENT_HEADER_SIZE <= flip < len(data):
        data[flip] ^= 0x20
    data = data[: max(SEGMENT_HEADER_SIZE, len(data) - cut % (len(data) + 1))] + bytes(zeros)
    fast, pure = _walks(bytes(data))
    assert fast == pure


def test_a_name_that_is_not_utf8_goes_to_the_python_walk(tmp_path: Path) -> None:
    """The C walk takes a name's bytes as they are; a name Python cannot decode makes build()
    use the Python loop, which treats that record as bad (here: damage, records follow)."""
    good = encode_deliver(1000, 1, "q1", 1)
    bad = bytearray(encode_deliver(1000, 2, "q2", 1))
    name_at = bad.index(b"q2")
    bad[name_at] = 0xFF
    body = bytes(bad[8:])
    bad[4:8] = zlib.crc32(body).to_bytes(4, "big")
    path = tmp_path / "00000000000000000001.seg"
    path.write_bytes(encode_segment_header(1) + good + bytes(bad) + good)
    assert qindex.build(path) is None
