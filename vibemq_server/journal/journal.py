"""The durable journal: append-only segment files, group commit, recovery and reclamation.

Records are gathered during a loop tick and written with one ``os.write``; with
``fsync = always`` the writers' callbacks (PublishAcks) run only after an ``fsync`` that
started after their data was written, and every publish that arrived meanwhile shares the
next one (group commit). fsync runs in worker threads so the loop keeps serving, and up to
``FSYNCS_IN_FLIGHT`` of them at once (pipelined group commit): while one runs, the next
group is written and its fsync started, instead of every group waiting for the whole of
the previous fsync. The fsyncs run in long-lived threads (journal/fsyncer.py) that wake the
loop once per batch of completions. While every fsync slot is busy a flush writes nothing:
the records and their waiters gather (one write and one epoch per commit, not per loop turn)
until a slot frees, which is the earliest their fsync could start anyway.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Final

import structlog

from vibemq_server.core.buffers import JOIN_ALL, PASS_THROUGH, coalesce
from vibemq_server.core.clock import Clock, wall_clock_ms
from vibemq_server.core.manager import options_to_dict
from vibemq_server.core.message import EMPTY_HEADERS, StoredMessage
from vibemq_server.core.persistence import Persistence, SettleReason
from vibemq_server.journal.batch import RecordSink, new_record_buffer, without_publishes
from vibemq_server.journal.fsyncer import Fsyncs, new_fsyncs
from vibemq_server.journal.records import (
    SEGMENT_HEADER_SIZE,
    QueueCreate,
    QueueDelete,
    QueueRecords,
    Record,
    encode_record,
    encode_segment_header,
)
from vibemq_server.journal.recovery import PayloadForm, recover, segment_path
from vibemq_server.journal.stats import BATCH_BUCKETS, FSYNC_BUCKETS_S, FixedHistogram
from vibemq_server.journal.sysio import SYSTEM, SystemCalls

if TYPE_CHECKING:
    from vibemq_server.core.manager import QueueManager
    from vibemq_server.core.queue import Queue

log = structlog.get_logger("vibemq.journal")

Waiter = Callable[[Exception | None], None]


#: fsyncs running at once under ``fsync = always``. With one, a group that gathers while an
#: fsync runs waits for it to end before its own starts: two fsync latencies for most
#: publishes. With more, its fsync starts at once (a later fsync covers every byte written
#: before it started, so it also completes the groups of earlier ones still running). Four:
#: early commits (``commit_early``) take up to three within one loop turn, whose completions
#: the loop sees only at the next turn, and the end of the turn keeps one.
FSYNCS_IN_FLIGHT = 4

#: fsync slots an early commit (``commit_early``) leaves free for the flush at the end of the
#: loop turn: with none left, the rest of the turn's publishes would wait for the early
#: fsync to complete before theirs could start.
_EARLY_SPARE: Final = 1

#: the queue index beside a sealed segment (qindex.INDEX_SUFFIX)
INDEX_SUFFIX = ".qidx"
# Live messages few enough to copy forward at once when they pin older segments.
_SMALL_LIVE = 1000
#: messages a compaction looks at per loop turn
COMPACT_RUN: Final = 20_000
#: buffers per os.writev (Linux's IOV_MAX)
_IOV_MAX = 1024
# (Final: the compiled build reads it as a constant, not from the module's dict every publish)
_PASS_THROUGH: Final = PASS_THROUGH
#: a DELIVER record's attempts is a u16
_MAX_ATTEMPTS: Final = 0xFFFF


class FsyncPolicy(StrEnum):
    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(slots=True)
class _Segment:
    number: int
    path: Path
    live: int = 0  # publishes in this segment not yet settled
    published: int = 0  # publishes ever written to it
    deleting: bool = False
    indexed: bool = False  # its queue index asked for (sealed and kept: see _index_kept)


class Journal(Persistence):
    """The core's Persistence on segment files in one directory."""

    def __init__(
        self,
        directory: Path,
        *,
        fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
        fsync_interval_ms: int = 10,
        segment_size: int = 64 * 1024 * 1024,
        clock: Clock = wall_clock_ms,
        system: SystemCalls = SYSTEM,
    ) -> None:
        self.directory = directory
        #: the file system calls (the tests give a failing or gated fsync, a full disk)
        self.sys = system
        self.policy = fsync
        self.fsync_interval = fsync_interval_ms / 1000
        self.segment_size = segment_size
        self.clock = clock
        self.segments: dict[int, _Segment] = {}
        self.active = 0
        self._fd = -1
        self._size = 0
        self._buf: list[bytes] = []
        # The per-message records (PUBLISH without headers, DELIVER, SETTLE) gathered since
        # the last flush, encoded in place (journal/batch.py). Its bytes go to _buf, in order,
        # before any other record is added there and at the flush.
        self._enc: RecordSink = new_record_buffer()
        self._enc_fields: Callable[[int, int, int, int], None]
        self._enc_seq: Callable[[int], None]
        self._enc_publish: Callable[[bytes, str, bytes], None]
        self._enc_deliver_run: Callable[[bytes, int, int, int], None]
        self._enc_settle_all: Callable[[bytes, list[int], int], None]
        self._enc_settle_run: Callable[[bytes, int, int, int], None]
        # The DELIVER records not yet encoded: a run of consecutive seqs of one queue with
        # the same attempts (a loop turn's deliveries to a subscriber), passed to the encoder
        # in one call when the run breaks, before any SETTLE (a message's DELIVER precedes its
        # SETTLE), before a new stamp and before the batch's bytes are taken (so no later
        # than the batch they were recorded in); a client's PUBLISH (a new seq) goes in
        # between. Unboxed ints kept, not a seq boxed and a call a delivery. (0: none)
        self._run_records: QueueRecords | None = None
        self._run_first = 0
        self._run_count = 0
        self._run_attempts = 0
        # The PUBLISH fields the encoder holds (``RecordSink.fields``): passed when a message's
        # differ (once a clock tick), not four ints boxed for every publish. (-1: none yet)
        self._fields_at = -1
        self._fields_expires = -1
        self._fields_priority: object = None
        self._fields_attempts = -1
        # The seq the encoder gives its next PUBLISH (``RecordSink.seq``): a client's
        # publishes follow on, so it is passed only when one does not. (-1: not known)
        self._next_seq = -1
        self.use_encoder(self._enc)
        self._waiters: list[Waiter] = []  # written with the next flush
        self._sync_waiters: list[Waiter] = []  # written, waiting for an fsync
        # fsyncs running, in the order they started: (number, the waiters they complete)
        self._in_flight: deque[tuple[int, list[Waiter]]] = deque()
        self._fsyncs_started = 0
        # fsyncs whose worker has not returned yet. Not len(_in_flight): a later fsync that
        # ends first takes the earlier ones' batches off _in_flight while they still run on
        # the segment's fd, which must stay open (not rotated, not closed) until they return.
        self._fsyncs_running = 0
        # An fsync failed (until the journal is written and synced again, see _try_recover).
        self._sync_failed: Exception | None = None
        self._dirty = False  # written since the last fsync (interval policy)
        self._flush_scheduled = False
        # A flush found every fsync slot busy and left its records gathering: the next
        # completed fsync flushes.
        self._flush_deferred = False
        # A rotation is under way in a worker thread (the sealed segment's last fsync, the new
        # one's header and name): records gather meanwhile, for the new segment.
        self._rotating = False
        # A rotation failed: (the sealed segment's fd, its path), still open; maintain()
        # makes the new segment before anything is written again.
        self._unopened: tuple[int, Path] | None = None
        #: messages a compaction looks at per loop turn (the tests make it small)
        self.compact_run = COMPACT_RUN
        # Inside commit_early (a session's handler): failures call back in a later callback.
        self._early = False
        #: commits started early, at a safe point within a loop turn (for the metrics)
        self.early_commits = 0
        self._failed: Exception | None = None
        self._retry: bytes = b""
        # Client publishes recorded since the last write: withdrawn if their write fails
        # (their records are found then, by seq and queue: nothing more is kept a publish).
        self._batch_publishes: list[StoredMessage] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fsyncs: Fsyncs | None = None  # the fsync threads (from start)
        # builds the queue index of each sealed segment (qindex.py): off the loop, and not on
        # the fsync workers, whose latency every durable publish waits for
        self._indexer = concurrent.futures.ThreadPoolExecutor(1, "vibemq-qidx")
        self._manager: QueueManager | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._epoch = 0
        self._queue_records: dict[str, QueueRecords] = {}  # each queue's record encoder
        self._last_records: QueueRecords | None = None  # the one used last (a dict lookup less)
        # The timestamp of the DELIVER and SETTLE records of the batch being gathered
        # (0: none yet): one clock reading per flush instead of one per record.
        self._batch_ts = 0
        self._active_seg: _Segment | None = None
        self.recovered_messages = 0
        #: for the metrics: bytes written, fsync latency, acknowledgements per group commit,
        #: how long recovery took
        self.bytes_written = 0
        self.fsync_seconds = FixedHistogram(FSYNC_BUCKETS_S)
        self.commit_batch = FixedHistogram(BATCH_BUCKETS)
        self.recovery_seconds = 0.0
        #: the form a message's payload and headers take in its record, and its inverse for
        #: recovery (set by the broker to the protocols' payload rule: a byte protocol's raw
        #: bytes are written in the VibeMQ form, so records and their readers stay as they
        #: were, and come back raw); None: as stored
        self.payload_form: PayloadForm | None = None
        self.payload_restore: PayloadForm | None = None

    def use_encoder(self, enc: RecordSink) -> None:
        """Encode the per-message records with ``enc`` (the tests give the pure one)."""
        self._drain()
        self._enc = enc
        # its per-message methods bound once: a call through a protocol-typed attribute looks
        # the method up by name every time (in the compiled build), a bound one is called
        self._enc_fields = enc.fields
        self._fields_at = -1  # (a new encoder holds none of ours)
        self._enc_seq = enc.seq
        self._next_seq = -1  # (nor our next seq)
        self._enc_publish = enc.publish
        self._enc_deliver_run = enc.deliver_run
        self._enc_settle_all = enc.settle_all
        self._enc_settle_run = enc.settle_run

    # -- recovery ----------------------------------------------------------------------------

    def recover(self, manager: QueueManager) -> None:
        """Rebuild queues and messages from the segments; cut a torn tail; refuse damage."""
        started = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        found = recover(self.directory, manager, self.payload_restore)
        manager.next_seq = max(manager.next_seq, found.max_seq + 1)
        for number, path in found.segments:
            self.segments[number] = _Segment(
                number, path, found.live.get(number, 0), found.published.get(number, 0)
            )
        self.recovered_messages = found.messages
        self.recovery_seconds = time.monotonic() - started
        log.info(
            "journal recovered",
            segments=len(self.segments),
            queues=found.queues,
            messages=found.messages,
        )

    # -- running -----------------------------------------------------------------------------

    def start(self, manager: QueueManager) -> None:
        """Open a fresh segment (after recovery) and start recording."""
        self._loop = asyncio.get_running_loop()
        self._manager = manager
        if self.policy is not FsyncPolicy.NEVER:
            # (the C threads call the real fsync: only for the real system calls)
            native = type(self.sys) is SystemCalls
            fsyncs = new_fsyncs(self._fsync_fd, FSYNCS_IN_FLIGHT, native=native)
            self._fsyncs = fsyncs
            self._loop.add_reader(fsyncs.fileno(), self._on_synced)
        self._open_segment(max(self.segments, default=0) + 1)
        # Segments sealed before this start (the last one by a stop or a crash) get the queue
        # indexes they lack; what a crash left half written goes.
        sealed = []
        for number, seg in sorted(self.segments.items()):
            if number != self.active:
                seg.indexed = True
                sealed.append(seg.path)
        self._indexer.submit(_index_sealed, self.directory, sealed)
        if self.policy is FsyncPolicy.INTERVAL:
            self._timer = self._loop.call_later(self.fsync_interval, self._interval_sync)

    def _open_segment(self, number: int) -> None:
        self._fd = self._create_segment(number)
        self._use_segment(number)

    def _create_segment(self, number: int) -> int:
        """Create segment ``number`` with its header, durable with its name; its fd. System
        calls only (a rotation runs it in a worker thread)."""
        path = segment_path(self.directory, number)
        fd = self.sys.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        header = encode_segment_header(number)
        try:
            if self.sys.write(fd, header) != len(header):
                raise OSError(f"short write of the header of {path}")
            if self.policy is not FsyncPolicy.NEVER:
                self.sys.fsync(fd)
                dir_fd = self.sys.open(self.directory, os.O_RDONLY)
                try:
                    self.sys.fsync(dir_fd)  # the new file's name must survive a crash too
                finally:
                    self.sys.close(dir_fd)
        except OSError:
            self.sys.close(fd)
            raise
        return fd

    def _use_segment(self, number: int) -> None:
        """Segment ``number`` is the active one from now on: what is recorded counts in it.
        Every segment starts with the definitions of the durable queues, so older segments
        can be reclaimed without losing any queue."""
        self._size = SEGMENT_HEADER_SIZE
        self.active = number
        path = segment_path(self.directory, number)
        self.segments[number] = self._active_seg = _Segment(number, path)
        if self._manager is not None:
            for queue in self._manager.queues.values():
                if queue.options.durable and not queue.deleted:
                    self.queue_created(queue)

    @property
    def available(self) -> bool:
        return self._failed is None

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def _syncing(self) -> bool:
        """Some fsync is running (its worker has not returned: the segment's fd is in use)."""
        return self._fsyncs_running > 0

    def _append(self, record: Record) -> None:
        self._add(encode_record(record, self.clock()))

    def _add(self, data: bytes) -> None:
        self._drain()
        self._buf.append(data)
        if not self._flush_scheduled:
            self._schedule_flush()

    def _drain(self) -> None:
        """The encoded records into _buf (before another record goes there, and to write)."""
        if self._run_count:
            self._put_delivers()
        if len(self._enc):
            self._buf.append(self._enc.take())

    def _schedule_flush(self) -> None:
        if self._loop is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def queue_created(self, queue: Queue) -> None:
        options = json.dumps(options_to_dict(queue.options), separators=(",", ":")).encode()
        self._append(QueueCreate(queue.name, queue.created_at, options))

    def queue_deleted(self, name: str) -> None:
        self._append(QueueDelete(name))
        if self._manager is not None and name in self._manager.queues:
            queue = self._manager.queues[name]
            for msg in self._distinct_messages(queue):
                self._release(msg)

    def _records(self, name: str) -> QueueRecords:
        """The record encoder of queue ``name``."""
        records = self._last_records
        # (identity: a queue's messages and records all carry the queue's own name string)
        if records is not None and records.name is name:
            return records
        records = self._queue_records.get(name)
        if records is None:
            if len(self._queue_records) > 10_000:
                self._queue_records.clear()  # bounded: deleted queues' encoders do not pile up
            records = self._queue_records[name] = QueueRecords(name)
        self._last_records = records
        return records

    def _stamp(self) -> int:
        """The clock, kept as the batch's timestamp (and the encoder's, so the records do not
        pass it again) until the flush that a record being added schedules (so never older
        than one loop turn)."""
        now = self.clock()
        if self._loop is not None:
            self._batch_ts = now
        if self._run_count:
            self._put_delivers()  # (at the stamp they were recorded under)
        self._enc.stamp(now)
        return now

    def published(self, queue: Queue, msg: StoredMessage, client: bool = False, /) -> None:
        name = queue.name
        records = self._records(name)
        payload, headers = msg.payload, msg.headers
        # (most messages share the one empty mapping: known by identity, where a truth test
        # of a Mapping is a generic call, two a publish)
        with_headers = headers is not EMPTY_HEADERS and bool(headers)
        if with_headers and self.payload_form is not None:
            # (the form changes only messages with headers: a raw one says so in them)
            payload, headers = self.payload_form(payload, headers)
        # The record's timestamp is the publish time itself: no second clock read.
        if with_headers or len(payload) >= _PASS_THROUGH:
            # headers, or a payload that the write passes through rather than copies
            self._drain()
            self._buf.append(
                records.publish(
                    msg.published_at,
                    msg.seq,
                    msg.id,
                    msg.published_at,
                    msg.expires_at,
                    msg.priority,
                    msg.attempts,
                    headers,
                    payload,
                )
            )
        else:
            if (
                msg.published_at != self._fields_at
                or msg.expires_at != self._fields_expires
                or msg.priority is not self._fields_priority
                or msg.attempts != self._fields_attempts
            ):
                self._set_fields(msg)
            seq = msg.seq
            if seq != self._next_seq:
                self._enc_seq(seq)
            self._enc_publish(records.name16, msg.id, payload)
            self._next_seq = seq + 1  # (after: a refused publish leaves the encoder's seq)
        if client:
            self._batch_publishes.append(msg)
        elif self._run_count:
            self._put_delivers()  # (an existing message's record: after its DELIVER)
        if not self._flush_scheduled:
            self._schedule_flush()
        msg.seg = self.active
        seg = self._active_seg
        if seg is None or seg.number != self.active:
            seg = self.segments[self.active]
        seg.live += 1
        seg.published += 1

    def _set_fields(self, msg: StoredMessage) -> None:
        """The encoder's PUBLISH fields from now on: ``msg``'s (kept once it took them)."""
        self._enc_fields(msg.published_at, msg.expires_at, msg.priority, msg.attempts)
        self._fields_at = msg.published_at
        self._fields_expires = msg.expires_at
        self._fields_priority = msg.priority
        self._fields_attempts = msg.attempts

    def delivered(self, queue: Queue, msg: StoredMessage) -> None:
        if not self._batch_ts:
            self._stamp()  # (the encoder keeps the batch's timestamp)
        records = self._records(queue.name)
        seq = msg.seq
        attempts = msg.attempts
        if (
            records is self._run_records
            and seq == self._run_first + self._run_count
            and attempts == self._run_attempts
        ):
            self._run_count += 1
        else:
            if self._run_count:
                self._put_delivers()
            if attempts > _MAX_ATTEMPTS:
                # (the encoder refuses it here, in the delivery, as it did a record at a time:
                # not later, in the flush)
                self._enc_deliver_run(records.name16, seq, 1, attempts)
            self._run_records = records
            self._run_first = seq
            self._run_count = 1
            self._run_attempts = attempts
        if not self._flush_scheduled:
            self._schedule_flush()

    def _put_delivers(self) -> None:
        """The gathered run of DELIVER records into the encoder."""
        records = self._run_records
        assert records is not None
        count = self._run_count
        self._run_count = 0
        self._enc_deliver_run(records.name16, self._run_first, count, self._run_attempts)

    def settled(
        self, queue: Queue, msg: StoredMessage, reason: SettleReason, detail: str = ""
    ) -> None:
        if not self._batch_ts:
            self._stamp()
        if self._run_count:
            self._put_delivers()
        records = self._records(queue.name)
        self._enc.settle(records.name16, msg.seq, reason, detail)
        if not self._flush_scheduled:
            self._schedule_flush()
        seg = self.segments.get(msg.seg)
        if seg is not None:
            seg.live -= 1
        msg.seg = 0

    def settled_all(self, queue: Queue, msgs: list[StoredMessage], reason: SettleReason) -> None:
        """``settled`` for each of ``msgs`` (a read's acks), in order: their records in one
        call to the encoder."""
        if not self._batch_ts:
            self._stamp()
        if self._run_count:
            self._put_delivers()
        segments = self.segments
        active = self._active_seg
        # consecutive seqs (acks of a run of deliveries, in order) are passed as their run,
        # others as their list (not built unless one breaks the run)
        first = nxt = msgs[0].seq if msgs else 0
        run = True
        for msg in msgs:
            if msg.seq != nxt:
                run = False
            nxt += 1
            if active is not None and msg.seg == active.number:
                active.live -= 1  # (most acks settle messages of the segment being written)
            else:
                seg = segments.get(msg.seg)
                if seg is not None:
                    seg.live -= 1
            msg.seg = 0
        name16 = self._records(queue.name).name16
        if run:
            self._enc_settle_run(name16, first, len(msgs), reason)
        else:
            self._enc_settle_all(name16, [msg.seq for msg in msgs], reason)
        if not self._flush_scheduled:
            self._schedule_flush()

    def _release(self, msg: StoredMessage) -> None:
        seg = self.segments.get(msg.seg)
        if seg is not None:
            seg.live -= 1
        msg.seg = 0

    def when_durable(self, callback: Waiter) -> None:
        self._waiters.append(callback)
        if not self._flush_scheduled and self._loop is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def commit_early(self) -> None:
        """A safe point (every publish so far recorded whole, none half): when an fsync slot
        is free beside the one kept for the end of the loop turn, write what gathered and
        start its fsync now, so that it runs while the rest of the turn is processed instead
        of after it (the durable window becomes a pipeline, not a cycle). Its waiters hear
        back in a later turn, as always, never from inside this call. Otherwise nothing: the
        flush at the end of the turn commits it all."""
        if (
            self._fsyncs_running + _EARLY_SPARE < FSYNCS_IN_FLIGHT
            and not self._rotating
            and self._waiters
            and self.policy is FsyncPolicy.ALWAYS
            and self._failed is None
            and not self._closing
            and self._fsyncs is not None
            and self._fd >= 0
        ):
            self.early_commits += 1
            self._early = True
            try:
                self._commit()
            finally:
                self._early = False

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._commit()

    def _commit(self) -> None:
        """Write what gathered and start its fsync (or hand it to a running fsync's end)."""
        self._batch_ts = 0
        if self._fd < 0:
            return  # closed: the broker is shutting down and nobody waits any more
        if self._rotating or (
            self._fsyncs_running >= FSYNCS_IN_FLIGHT
            and self.policy is FsyncPolicy.ALWAYS
            and self._failed is None
            and not self._closing
        ):
            # Every fsync slot is busy: what a write now would sync cannot start syncing
            # before a slot frees; or the segment is being rotated, and what is recorded
            # goes to the new one. Gather until then (_synced or _rotated flushes): one
            # write and one epoch per commit. (_batch_ts starts over: a record's time stays
            # this turn's.)
            self._flush_deferred = True
            return
        self._flush_deferred = False
        self._epoch += 1
        if self._failed is not None:
            self._fail_waiters(self._failed)
            return
        self._drain()
        if self._buf:
            records, self._buf = self._buf, []
            publishes, self._batch_publishes = self._batch_publishes, []
            try:
                self._write_all(records)
            except OSError as exc:
                self._withdraw(records, publishes)
                self._fail(exc, b"".join(records))
                return
        waiters, self._waiters = self._waiters, []
        if self.policy is FsyncPolicy.ALWAYS:
            if waiters:
                self._sync_waiters.extend(waiters)
                if self._fsyncs_running < FSYNCS_IN_FLIGHT:
                    self._start_sync()
        else:
            for waiter in waiters:
                waiter(None)
        if not self._syncing:
            self._maybe_rotate()

    def _write(self, data: bytes) -> None:
        start = self._size
        view = memoryview(data)
        try:
            while view:
                n = self.sys.write(self._fd, view)
                view = view[n:]
                self._size += n
                self.bytes_written += n
        except OSError:
            # Half a batch on disk would put a torn record before later good ones: cut it.
            self._size = start
            with contextlib.suppress(OSError):
                self.sys.ftruncate(self._fd, start)
            raise
        self._dirty = True

    def _write_all(self, records: list[bytes]) -> None:
        """Write a batch of records: joined when small; else with ``os.writev``, runs of
        small records joined and large ones (a large message's) as they are, not copied
        into the batch."""
        # (One compiled pass instead of coalesce's interpreted one per record: without a
        # large record, coalesce would join them all anyway.)
        total = 0
        large = False
        for record in records:
            size = len(record)
            total += size
            if size >= PASS_THROUGH:
                large = True
        if total <= JOIN_ALL or not large:
            self._write(b"".join(records))
            return
        pieces = coalesce(records)
        start = self._size
        try:
            first = 0
            while first < len(pieces):
                n = self.sys.writev(self._fd, pieces[first : first + _IOV_MAX])
                self._size += n
                self.bytes_written += n
                while first < len(pieces) and n >= len(pieces[first]):
                    n -= len(pieces[first])
                    first += 1
                if n:  # a piece written in part: the rest of it next
                    pieces[first] = memoryview(pieces[first])[n:]
        except OSError:
            # as in _write: no torn record before later good ones
            self._size = start
            with contextlib.suppress(OSError):
                self.sys.ftruncate(self._fd, start)
            raise
        self._dirty = True

    def _start_sync(self) -> None:
        fsyncs = self._fsyncs
        assert fsyncs is not None
        batch, self._sync_waiters = self._sync_waiters, []
        self._dirty = False
        self._fsyncs_started = number = self._fsyncs_started + 1
        self._in_flight.append((number, batch))
        self._fsyncs_running += 1
        fsyncs.request(self._fd, number)

    def _fsync_fd(self, fd: int) -> None:
        """fsync in a Python fsync thread (``self.sys`` looked up each time: tests swap it)."""
        self.sys.fsync(fd)

    def _on_synced(self) -> None:
        """The fsync threads' eventfd is readable: handle what they completed."""
        fsyncs = self._fsyncs
        if fsyncs is None:
            return
        for number, seconds, exc in fsyncs.completed():
            self._synced(number, seconds, exc)

    def _done_through(self, number: int) -> list[list[Waiter]]:
        """The batches of fsync ``number`` and of every fsync started before it that is
        still running (the data of all of them was written before ``number`` started),
        taken off the running list in order."""
        done: list[list[Waiter]] = []
        in_flight = self._in_flight
        while in_flight and in_flight[0][0] <= number:
            done.append(in_flight.popleft()[1])
        return done

    def _synced(self, number: int, seconds: float, exc: Exception | None) -> None:
        self._fsyncs_running -= 1
        batches = self._done_through(number)
        if exc is not None or self._sync_failed is not None:
            # (a writeback error is reported to one fsync only: after a failed one, a later
            # one's success proves nothing about the bytes before it)
            self._dirty = True
            if exc is not None:
                self._sync_failed = exc
                self._fail(exc, b"")
            for batch in batches:
                for waiter in batch:
                    waiter(self._failed or self._sync_failed)
            if self._flush_deferred:
                self._flush()  # (fails the gathered waiters: _failed is set)
            return
        self.fsync_seconds.observe(seconds)
        for batch in batches:
            if batch:
                self.commit_batch.observe(len(batch))
            for waiter in batch:
                waiter(None)
        if self._flush_deferred:
            # a slot is free: write what gathered meanwhile and start its fsync
            self._flush()
            return
        if self._sync_waiters and self._failed is None:
            if self._fsyncs_running < FSYNCS_IN_FLIGHT:
                self._start_sync()
        elif not self._fsyncs_running:
            self._maybe_rotate()

    def _withdraw(self, records: list[bytes], publishes: list[StoredMessage]) -> None:
        """The write of these records failed and their publishers get an error: take the
        messages no consumer has yet back out of their queues, and drop their records."""
        manager = self._manager
        if manager is None:
            return
        drop: set[tuple[int, str]] = set()
        for msg in reversed(publishes):  # (newest first: only the newest can be taken back)
            # (a message's queue is the one named by it: a queue deleted since, or another of
            # that name, does not hold it and refuses)
            queue = manager.queues.get(msg.queue)
            if queue is not None and manager.withdraw(queue, msg):
                drop.add((msg.seq, msg.queue))
                self._release(msg)
        if drop:
            for i, chunk in enumerate(records):
                records[i] = without_publishes(chunk, drop)

    def _fail(self, exc: Exception, unwritten: bytes) -> None:
        """Storage failed: refuse durable publishes, keep the records to write them later."""
        if self._failed is None:
            log.error("journal write failed; refusing durable publishes", error=str(exc))
        self._failed = exc
        self._retry = unwritten + self._retry
        self._fail_waiters(exc)

    def _fail_waiters(self, exc: Exception) -> None:
        waiters = self._waiters + self._sync_waiters
        self._waiters, self._sync_waiters = [], []
        if self._early and self._loop is not None:
            # (an early commit runs inside a session's handler: its waiters hear back after)
            self._loop.call_soon(self._call_waiters, waiters, exc)
            return
        self._call_waiters(waiters, exc)

    @staticmethod
    def _call_waiters(waiters: list[Waiter], exc: Exception) -> None:
        for waiter in waiters:
            waiter(exc)

    def _maybe_rotate(self) -> None:
        if (
            self._size < self.segment_size
            or self._syncing
            or self._closing
            or self._rotating
            or self._failed is not None
        ):
            return
        old_fd = self._fd
        sealed = segment_path(self.directory, self.active)
        number = self.active + 1
        loop = self._loop
        if loop is None or self.policy is FsyncPolicy.NEVER:
            # (no fsync to wait for)
            try:
                fd = self._create_segment(number)
            except OSError as exc:
                # Stay on the old segment (it is still open) and retry once storage recovers.
                self._remove_partial_segment(number)
                self._fail(exc, b"")
                return
            self._use_segment(number)
            self._switch(old_fd, fd)
            return
        # The sealed segment's last fsync and the new one's (header, then its name in the
        # directory) run in a worker: on the loop, a contended disk froze every connection
        # for the three of them. What is recorded meanwhile counts in the new segment and
        # is written there once it exists (_commit gathers, _rotated flushes).
        self._rotating = True
        self._use_segment(number)
        future = loop.run_in_executor(None, self._seal_and_create, old_fd, number)
        future.add_done_callback(lambda done: self._rotated(old_fd, sealed, done))

    def _seal_and_create(self, old_fd: int, number: int) -> int:
        """(In a worker thread) sync the sealed segment, then make segment ``number``."""
        self.sys.fsync(old_fd)
        return self._create_segment(number)

    def _rotated(self, old_fd: int, sealed: Path, done: asyncio.Future[int]) -> None:
        self._rotating = False
        exc = done.exception()
        if exc is None:
            self._switch(old_fd, done.result())
        else:
            # Nothing more goes to the sealed segment (what was recorded since counts in the
            # new one): maintain() makes the new segment once storage recovers.
            self._unopened = (old_fd, sealed)
            self._drop_unopened()
            self._fail(exc if isinstance(exc, OSError) else OSError(str(exc)), b"")
        if self._flush_deferred:
            self._flush()

    def _switch(self, old_fd: int, fd: int) -> None:
        """The new segment exists: write there from now on; the sealed one is closed (its
        queue index is built if reclaim keeps it: _index_kept)."""
        self._fd = fd
        self.sys.close(old_fd)

    def _drop_unopened(self) -> None:
        """What a failed rotation left of the (active) new segment goes: made again later."""
        with contextlib.suppress(OSError):
            segment_path(self.directory, self.active).unlink()

    def _remove_partial_segment(self, number: int) -> None:
        if number not in self.segments:
            with contextlib.suppress(OSError):
                segment_path(self.directory, number).unlink()

    def maintain(self) -> None:
        """Called on a timer: retry after a failure, reclaim settled segments."""
        loop = self._loop
        if loop is None:
            return
        if self._failed is not None:
            self._try_recover()
            return
        self._reclaim()

    def _interval_sync(self) -> None:
        if self._dirty and not self._syncing and not self._rotating and self._failed is None:
            self._start_sync()
        assert self._loop is not None
        self._timer = self._loop.call_later(self.fsync_interval, self._interval_sync)

    def _try_recover(self) -> None:
        unopened = self._unopened
        if unopened is not None:
            # (storage is failing: durable publishes are refused anyway, so these fsyncs on
            # the loop keep nobody from being served)
            old_fd, _sealed = unopened
            try:
                fd = self._seal_and_create(old_fd, self.active)
            except OSError as exc:
                self._drop_unopened()
                self._failed = exc
                return
            self._unopened = None
            self._switch(old_fd, fd)
        self._drain()
        data = self._retry + b"".join(self._buf)
        try:
            self._write(data)
            if self.policy is not FsyncPolicy.NEVER:
                self.sys.fsync(self._fd)
        except OSError as exc:
            self._failed = exc
            return
        self._retry = b""
        self._buf.clear()
        self._batch_publishes.clear()  # written: nothing left to withdraw
        self._failed = None
        self._sync_failed = None
        log.info("journal writable again")

    def _reclaim(self) -> None:
        """Delete the oldest segments whose every publish is settled; move the few live
        messages out of an old, mostly settled segment so it can go too."""
        if self._rotating:
            return  # (the new segment, with the queues' definitions, is not on disk yet)
        closed = [n for n in self.segments if n != self.active]
        for number in closed:
            seg = self.segments[number]
            if seg.deleting:
                break
            if seg.live <= 0:
                seg.deleting = True
                self._delete(seg)
                continue
            # Compact when few of its messages are alive, or when a handful of live messages
            # hold back later closed segments (a restart's small segment, a parked message).
            behind = len(closed) - closed.index(number) - 1
            if seg.live * 10 <= seg.published or (behind >= 2 and seg.live <= _SMALL_LIVE):
                self._compact(seg)
            break
        self._index_kept(closed)

    def _index_kept(self, closed: list[int]) -> None:
        """Build the queue index of the sealed segments that reclaim kept, once each. Not at
        the rotation: while consumers keep up, a sealed segment is all settled by the next
        maintain and deleted, and its index (~25 ms of CPU a 64 MiB segment, a tenth of a
        microsecond a durable message) was built for no reader; until it is built, a
        reader scans the segment whole."""
        kept: list[Path] = []
        for number in closed:
            seg = self.segments.get(number)
            if seg is not None and not seg.indexed and not seg.deleting:
                seg.indexed = True
                kept.append(seg.path)
        if kept:
            self._indexer.submit(_index_sealed, None, kept)

    def _delete(self, seg: _Segment) -> None:
        """Unlink ``seg`` and its sidecar in the index thread: on the loop, freeing the pages
        of a 64 MiB segment no one maps held every connection for ~30 ms. Until it is done
        (``_deleted``), ``deleting`` keeps reclaim from it and from the segments after it."""
        loop = self._loop
        if loop is None or self._closing:
            self._deleted(seg, _unlink_segment(seg.path))
            return
        future = loop.run_in_executor(self._indexer, _unlink_segment, seg.path)
        future.add_done_callback(
            lambda done: (
                self._deleted(seg, None, True)
                if done.cancelled()
                else self._deleted(seg, done.result())
            )
        )

    def _deleted(self, seg: _Segment, error: OSError | None, cancelled: bool = False) -> None:
        """``seg``'s files are gone, or not (``error``; ``cancelled``: the journal closed
        first): then reclaim tries again later, or the next start does."""
        if cancelled or error is not None:
            if error is not None:
                log.warning("cannot delete segment", file=str(seg.path), error=str(error))
            seg.deleting = False
            return
        self.segments.pop(seg.number, None)
        log.debug("segment reclaimed", file=str(seg.path))

    def _compact(self, seg: _Segment) -> None:
        """Re-record the live messages of ``seg`` in the active segment; delete ``seg`` once
        the copies are durable. Every durable message is looked at, so a large backlog is
        gone through ``compact_run`` messages a loop turn (a million in one pass held the
        loop for about 100 ms); ``reclaim`` waits meanwhile (``deleting``)."""
        manager = self._manager
        if manager is None:
            return
        seg.deleting = True
        # Who holds a message may change between turns, so each queue's messages are taken
        # at the start; one settled meanwhile no longer points at ``seg`` and is skipped.
        work = [
            (queue, self._all_messages(queue))
            for queue in manager.queues.values()
            if queue.options.durable
        ]
        self._compact_run(seg, work, 0, 0, 0, {})

    def _compact_run(
        self,
        seg: _Segment,
        work: list[tuple[Queue, list[StoredMessage]]],
        index: int,
        start: int,
        moved: int,
        first: dict[int, StoredMessage],
    ) -> None:
        """From message ``start`` of queue ``index`` of ``work`` on, ``compact_run`` of them
        this turn; ``first``: the messages of this queue recorded so far, by seq (fan-out
        copies share one: one record, and all copies point at it)."""
        if self._closing:
            seg.deleting = False  # (kept: what was copied is a harmless second record)
            return
        budget = self.compact_run
        number = seg.number
        while index < len(work):
            queue, msgs = work[index]
            stop = min(len(msgs), start + budget)
            if not queue.deleted:
                for i in range(start, stop):
                    msg = msgs[i]
                    if msg.seg != number:
                        continue
                    recorded = first.get(msg.seq)
                    if recorded is not None:
                        msg.seg = recorded.seg
                        continue
                    seg.live -= 1
                    self.published(queue, msg)
                    first[msg.seq] = msg
                    moved += 1
            budget -= stop - start
            if stop < len(msgs):
                assert self._loop is not None  # (maintain, which compacts, runs on it)
                self._loop.call_soon(self._compact_run, seg, work, index, stop, moved, first)
                return
            index += 1
            start = 0
            first = {}
        seg.live = 0
        log.debug("segment compacted", file=str(seg.path), moved=moved)

        def done(err: Exception | None) -> None:
            if err is None:
                self._delete(seg)
            else:
                seg.deleting = False

        self.when_durable(done)

    @classmethod
    def _distinct_messages(cls, queue: Queue) -> list[StoredMessage]:
        """One message per seq (fan-out copies share theirs)."""
        seen: set[int] = set()
        out = []
        for msg in cls._all_messages(queue):
            if msg.seq not in seen:
                seen.add(msg.seq)
                out.append(msg)
        return out

    @staticmethod
    def _all_messages(queue: Queue) -> list[StoredMessage]:
        msgs = queue.ready_list()
        msgs.extend(queue.parked.values())
        for sub in queue.subscriptions:
            msgs.extend(sub.held())
        return msgs

    async def close(self) -> None:
        """Write and sync what is buffered, then close the active segment."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        while self._rotating:
            await asyncio.sleep(0.001)
        self._flush()
        while self._syncing:
            await asyncio.sleep(0.001)
        if self._fd >= 0:
            if self._failed is None and self.policy is not FsyncPolicy.NEVER:
                self.sys.fsync(self._fd)
            self.sys.close(self._fd)
            self._fd = -1
        fsyncs, self._fsyncs = self._fsyncs, None
        if fsyncs is not None:
            if self._loop is not None:
                # (typed as object: uvloop's remove_reader returns None where asyncio's
                # returns a bool, and the compiled journal checks what a call returns)
                remove: Callable[[int], object] = self._loop.remove_reader
                remove(fsyncs.fileno())
            fsyncs.close()
        # an index being built is finished (a half one would only be rebuilt); those not
        # started are left to the next start
        indexer = self._indexer
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: indexer.shutdown(wait=True, cancel_futures=True)
        )


def _unlink_segment(path: Path) -> OSError | None:
    """Delete a segment file and its sidecar (in the index thread); the error, if any."""
    try:
        path.unlink(missing_ok=True)
        path.with_suffix(INDEX_SUFFIX).unlink(missing_ok=True)
    except OSError as exc:
        return exc
    return None


def _index_sealed(directory: Path | None, paths: list[Path]) -> None:
    """Build the queue indexes of sealed segments (in the index thread); ``directory``: clear
    what a crash left there first."""
    # (imported here: ``python -m vibemq_server.journal.qindex`` runs it as __main__)
    from vibemq_server.journal import qindex

    try:
        if directory is not None:
            qindex.clean(directory)
        for path in paths:
            qindex.ensure(path)
    except Exception as exc:  # an index is an optimisation: readers scan without it
        log.warning("cannot build a queue index", error=str(exc))
