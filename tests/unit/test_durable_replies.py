"""DurableReplies: replies batched by the persistence's flush epoch come back exactly once, in
the order they were added, each with its own flush's error; with a persistence the test
steps like the journal (including its out-of-order failure path) and with the real Journal."""

from __future__ import annotations

import errno
import itertools
import os
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from waits import wait_for

from vibemq_server.config import QueueDefaults
from vibemq_server.core import ManualClock, PublishOutcome, QueueManager
from vibemq_server.core.durable_replies import EARLY_COMMIT, DurableReplies, Flushes
from vibemq_server.journal.journal import _EARLY_SPARE, FSYNCS_IN_FLIGHT, FsyncPolicy, Journal
from vibemq_server.journal.sysio import SystemCalls

Waiter = Callable[[Exception | None], None]


class SteppedPersistence(Flushes):
    """A persistence whose flushes the test drives, in the journal's shape: a flush takes
    what waits for it to an fsync stage, fsyncs finish in order, and a failure fails what
    waits for the next flush first, then what the fsync stage holds (as ``Journal._fail``
    does, so callbacks can come newest first)."""

    epoch = 0  # (a class attribute: it shadows the base's read-only property)

    def __init__(self) -> None:
        self.epoch = 0
        self.waiting: list[tuple[int, Waiter]] = []
        self.syncing: deque[list[tuple[int, Waiter]]] = deque()
        self.registered: list[int] = []  # the epoch of every when_durable
        self.outcome: dict[int, Exception | None] = {}  # what each epoch's flush gave
        self.early = 0  # commit_early calls

    def when_durable(self, callback: Waiter) -> None:
        self.registered.append(self.epoch)
        self.waiting.append((self.epoch, callback))

    def _call(self, group: list[tuple[int, Waiter]], err: Exception | None) -> None:
        for epoch, callback in group:
            self.outcome[epoch] = err
            callback(err)

    def commit_early(self) -> None:
        self.early += 1
        self.flush()

    def flush(self) -> None:
        self.epoch += 1
        if self.waiting:
            self.syncing.append(self.waiting)
            self.waiting = []

    def synced(self, err: Exception | None) -> None:
        if self.syncing:
            self._call(self.syncing.popleft(), err)

    def fail(self, err: Exception) -> None:
        self.epoch += 1
        group, self.waiting = self.waiting, []
        for held in self.syncing:
            group.extend(held)
        self.syncing.clear()
        self._call(group, err)


ops = st.lists(
    st.sampled_from(["add", "add", "add", "follow", "flush", "synced", "sync_error", "fail"]),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(ops)
def test_every_reply_comes_back_once_in_order_with_its_flush_error(script: list[str]) -> None:
    persistence = SteppedPersistence()
    handed: list[tuple[int, Exception | None]] = []  # (item, error) in hand-over order
    batches: list[list[int]] = []

    def done(items: list[int], err: Exception | None) -> None:
        batches.append(list(items))
        handed.extend((item, err) for item in items)

    replies: DurableReplies[int] = DurableReplies(persistence, done)
    added: list[int] = []
    epoch_of: dict[int, int] = {}  # durable item -> the epoch it was added in
    for n, op in enumerate(script):
        if op == "add":
            replies.add(n)
            added.append(n)
            epoch_of[n] = persistence.epoch
        elif op == "follow":
            added.append(n)
            if not replies.follow(n):
                handed.append((n, None))  # nothing waits: the protocol sends it now
        elif op == "flush":
            persistence.flush()
        elif op == "synced":
            persistence.synced(None)
        elif op == "sync_error":
            persistence.synced(OSError(errno.EIO, f"fsync {n}"))
        else:
            persistence.fail(OSError(errno.ENOSPC, f"write {n}"))
        # Nothing comes back before its flush did.
        for item, _ in handed:
            if item in epoch_of:
                assert epoch_of[item] in persistence.outcome
    persistence.flush()
    while persistence.syncing:
        persistence.synced(None)

    assert [item for item, _ in handed] == added
    assert not replies.waiting
    for item, err in handed:
        if item in epoch_of:
            assert err is persistence.outcome[epoch_of[item]]
    # One callback per epoch that had replies, and a batch never spans two epochs.
    assert persistence.registered == sorted(set(epoch_of.values()))
    for batch in batches:
        assert len({epoch_of[i] for i in batch if i in epoch_of}) <= 1


class AtOnce(Flushes):
    """A persistence that is always durable: it calls back inside ``when_durable``."""

    epoch = 0

    def when_durable(self, callback: Waiter) -> None:
        callback(None)

    def commit_early(self) -> None:
        pass


def test_a_reply_added_while_handing_over_keeps_its_place() -> None:
    handed: list[str] = []
    replies: DurableReplies[str] = DurableReplies(AtOnce(), lambda items, err: on_done(items))

    def on_done(items: list[str]) -> None:
        handed.extend(items)
        if items == ["a"]:
            replies.add("b")  # settles at once, within this hand-over
            handed.append("after b")

    replies.add("a")
    replies.add("c")
    assert handed == ["a", "after b", "b", "c"]
    assert not replies.waiting


def test_a_long_batch_asks_for_an_early_commit_every_early_commit_replies() -> None:
    persistence = SteppedPersistence()
    batches: list[list[int]] = []
    replies: DurableReplies[int] = DurableReplies(persistence, lambda i, e: batches.append(i))
    total = 2 * EARLY_COMMIT + 44
    for n in range(total):
        replies.add(n)
    assert persistence.early == 2
    persistence.flush()
    while persistence.syncing:
        persistence.synced(None)
    assert [len(b) for b in batches] == [EARLY_COMMIT, EARLY_COMMIT, 44]
    assert [n for b in batches for n in b] == list(range(total))


# -- with the real journal -------------------------------------------------------------------


class SlowFsyncOs(SystemCalls):
    """The journal's system calls: fsync waits until released, writes fail on demand (a
    full disk); everything else is the real call."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.fail_writes = False

    def write(self, fd: int, data: Any) -> int:
        if self.fail_writes:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        assert self.release.wait(10), "fsync never released"
        os.fsync(fd)


def open_journal(directory: Path, **kw: Any) -> tuple[QueueManager, Journal]:
    clock = ManualClock()
    manager = QueueManager(QueueDefaults(), clock)
    journal = Journal(directory, clock=clock, **kw)
    journal.recover(manager)
    journal.start(manager)
    manager.persistence = journal
    manager.create_queue("d", manager.options_from({"durable": True}))
    return manager, journal


async def test_with_the_journal_one_batch_per_flush(tmp_path: Path) -> None:
    manager, journal = open_journal(tmp_path / "journal", fsync=FsyncPolicy.ALWAYS)
    batches: list[tuple[list[str], Exception | None]] = []
    replies: DurableReplies[str] = DurableReplies(journal, lambda i, e: batches.append((i, e)))
    try:
        for round_ in range(3):
            ids = [f"m{round_}.{i}" for i in range(5)]
            for mid in ids:
                assert manager.publish("d", mid, b"{}", {}) is PublishOutcome.ACCEPTED_DURABLE
                replies.add(mid)
            await wait_for(lambda: not replies.waiting, what="the flush")
            assert batches[-1] == (ids, None)
        assert len(batches) == 3
    finally:
        await journal.close()


async def test_with_the_journal_a_failed_write_waits_behind_the_fsync_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal fails the newest waiters while an older batch is still in its fsync: the
    replies still come back oldest first, each with its own outcome."""
    fake = SlowFsyncOs()
    fake.release.set()  # opening a segment syncs at once
    manager, journal = open_journal(tmp_path / "journal", fsync=FsyncPolicy.ALWAYS, system=fake)
    fake.release.clear()
    batches: list[tuple[list[str], Exception | None]] = []
    replies: DurableReplies[str] = DurableReplies(journal, lambda i, e: batches.append((i, e)))
    try:
        manager.publish("d", "a", b"{}", {})
        replies.add("a")
        await wait_for(lambda: journal._syncing, what="the first batch's fsync")
        fake.fail_writes = True
        manager.publish("d", "b", b"{}", {})
        replies.add("b")
        await wait_for(lambda: not journal.available, what="the failed write")
        assert batches == []  # "b" failed first, but "a" is still being synced
        fake.release.set()
        await wait_for(lambda: not replies.waiting, what="the fsync")
        assert [items for items, _ in batches] == [["a"], ["b"]]
        assert batches[0][1] is None
        err = batches[1][1]
        assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    finally:
        fake.release.set()
        fake.fail_writes = False
        journal.maintain()
        await journal.close()


class GatedFsyncOs(SystemCalls):
    """The journal's system calls, each fsync held until the test opens its own gate (in the
    order the fsyncs started); everything else is the real call. ``workers_only``: the loop
    thread's own fsyncs (opening a segment, rotating) are not held."""

    def __init__(self, *, workers_only: bool = False) -> None:
        self.gates: list[threading.Event] = []
        self.lock = threading.Lock()
        self.open_all = False
        self.workers_only = workers_only

    def fsync(self, fd: int) -> None:
        if self.workers_only and threading.current_thread() is threading.main_thread():
            os.fsync(fd)
            return
        gate = threading.Event()
        with self.lock:
            self.gates.append(gate)
            if self.open_all:
                gate.set()
        assert gate.wait(10), "fsync never released"
        os.fsync(fd)

    def release_all(self) -> None:
        with self.lock:
            self.open_all = True
            for gate in self.gates:
                gate.set()


async def test_with_the_journal_a_second_fsync_runs_while_the_first_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pipelined group commit: a batch written while an fsync runs gets its own fsync at
    once; when that one ends first, it completes the older batch too (its bytes were written
    before it started), and the replies still come back oldest first."""
    fake = GatedFsyncOs()
    fake.open_all = True  # opening a segment syncs at once
    manager, journal = open_journal(tmp_path / "journal", fsync=FsyncPolicy.ALWAYS, system=fake)
    fake.open_all = False
    opened = len(fake.gates)
    batches: list[tuple[list[str], Exception | None]] = []
    replies: DurableReplies[str] = DurableReplies(journal, lambda i, e: batches.append((i, e)))
    try:
        manager.publish("d", "a", b"{}", {})
        replies.add("a")
        await wait_for(lambda: len(fake.gates) == opened + 1, what="the first batch's fsync")
        manager.publish("d", "b", b"{}", {})
        replies.add("b")
        await wait_for(lambda: len(fake.gates) == opened + 2, what="the second batch's fsync")
        assert batches == []
        fake.gates[opened + 1].set()  # the second fsync ends first
        await wait_for(lambda: not replies.waiting, what="both batches")
        assert batches == [(["a"], None), (["b"], None)]
        fake.gates[opened].set()  # the first ends late: nothing left for it to complete
        await wait_for(lambda: not journal._syncing, what="the first fsync")
        assert len(batches) == 2
    finally:
        fake.release_all()
        await journal.close()


async def test_with_the_journal_a_segment_is_not_rotated_under_an_fsync_still_running(
    tmp_path: Path,
) -> None:
    """The later of two fsyncs ends first and completes both batches; the earlier one still
    runs on the segment's fd. A full segment must not be rotated (its fd closed) until that
    one returns: closed under it, the fsync failed (EBADF) and the journal refused publishes
    ("the journal cannot be written", seen in the kill -9 loop under load)."""
    fake = GatedFsyncOs(workers_only=True)
    manager, journal = open_journal(
        tmp_path / "journal", fsync=FsyncPolicy.ALWAYS, system=fake, segment_size=64
    )
    first_segment = journal.active
    batches: list[tuple[list[str], Exception | None]] = []
    replies: DurableReplies[str] = DurableReplies(journal, lambda i, e: batches.append((i, e)))
    try:
        manager.publish("d", "a", b"{}", {})
        replies.add("a")
        await wait_for(lambda: len(fake.gates) == 1, what="the first batch's fsync")
        manager.publish("d", "b", b"{}", {})
        replies.add("b")
        await wait_for(lambda: len(fake.gates) == 2, what="the second batch's fsync")
        fake.gates[1].set()  # the second fsync ends first: both batches are durable
        await wait_for(lambda: not replies.waiting, what="both batches")
        assert batches == [(["a"], None), (["b"], None)]
        assert journal._syncing  # the first fsync is still running ...
        assert journal.active == first_segment  # ... so the full segment stays open
        fake.gates[0].set()
        await wait_for(lambda: not journal._syncing, what="the first fsync")
        await wait_for(lambda: journal.active > first_segment, what="the rotation")
        assert journal.available
        manager.publish("d", "c", b"{}", {})
        replies.add("c")
        fake.release_all()
        await wait_for(lambda: not replies.waiting, what="a publish after the rotation")
        assert batches[-1] == (["c"], None)
    finally:
        fake.release_all()
        await journal.close()


async def test_with_the_journal_a_long_batch_commits_early_and_answers_in_parts(
    tmp_path: Path,
) -> None:
    """A window of publishes handled in one turn: after ``EARLY_COMMIT`` of them the journal
    writes and starts their fsync at once (one slot kept for the end of the turn, which
    commits the rest); the first part is answered when its own fsync ends, never from inside
    ``add``, and the parts come back in order."""
    fake = GatedFsyncOs(workers_only=True)
    manager, journal = open_journal(tmp_path / "journal", fsync=FsyncPolicy.ALWAYS, system=fake)
    batches: list[tuple[list[int], Exception | None]] = []
    replies: DurableReplies[int] = DurableReplies(journal, lambda i, e: batches.append((i, e)))
    early = FSYNCS_IN_FLIGHT - _EARLY_SPARE  # early commits one turn can start
    total = (early + 2) * EARLY_COMMIT
    try:
        written = journal.bytes_written
        for n in range(total):
            assert manager.publish("d", f"m{n}", b"{}", {}) is PublishOutcome.ACCEPTED_DURABLE
            replies.add(n)
            if n + 1 == EARLY_COMMIT:
                # written, and its fsync started after the write, within the turn
                assert journal.early_commits == 1
                assert journal.bytes_written > written
                assert journal._fsyncs_running == 1
        # no more than the slots left beside the end of the turn's
        assert journal.early_commits == early
        assert batches == []
        await wait_for(lambda: len(fake.gates) == early + 1, what="the end of the turn's fsync")
        fake.gates[0].set()  # the first part's fsync ends: only its replies go out
        await wait_for(lambda: len(batches) == 1, what="the first part")
        assert batches == [(list(range(EARLY_COMMIT)), None)]
        fake.gates[early].set()  # the end of the turn's ends: it completes all the others
        await wait_for(lambda: not replies.waiting, what="the rest")
        parts = [EARLY_COMMIT * k for k in range(1, early + 1)] + [total]
        assert batches[1:] == [
            (list(range(start, stop)), None) for start, stop in itertools.pairwise(parts)
        ]
    finally:
        fake.release_all()
        await journal.close()


async def test_with_the_journal_an_early_commit_that_fails_answers_after_the_handler(
    tmp_path: Path,
) -> None:
    """A write failing in an early commit fails its replies, but not from inside ``add`` (the
    session is still handling its read): in a later callback, in order."""
    fake = SlowFsyncOs()
    fake.release.set()
    manager, journal = open_journal(tmp_path / "journal", fsync=FsyncPolicy.ALWAYS, system=fake)
    batches: list[tuple[list[int], Exception | None]] = []
    replies: DurableReplies[int] = DurableReplies(journal, lambda i, e: batches.append((i, e)))
    try:
        for n in range(EARLY_COMMIT):
            if n + 1 == EARLY_COMMIT:
                fake.fail_writes = True
            assert manager.publish("d", f"m{n}", b"{}", {}) is PublishOutcome.ACCEPTED_DURABLE
            replies.add(n)
        assert journal.early_commits == 1
        assert not journal.available
        assert batches == []  # not from inside add
        await wait_for(lambda: not replies.waiting, what="the failure")
        assert [items for items, _ in batches] == [list(range(EARLY_COMMIT))]
        err = batches[0][1]
        assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    finally:
        fake.fail_writes = False
        journal.maintain()
        await journal.close()
