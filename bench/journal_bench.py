"""Durable journal benchmarks for VibeMQ (``vibemq_server/journal``).

Phases (``--phases``, default all but ``rabbitmq``):

* ``publish`` -- persistent publish throughput: 1 publisher pipelining ``--window`` (1,000)
  unacknowledged publishes of 64-byte JSON payloads (pre-encoded frames, ``--batch`` per
  write), no subscriber, a RoundRobin queue with ``maxQueueSize`` 10,000,000 (nothing is
  dropped). Counted: PublishAcks. Once per ``--fsync`` policy (always, interval with
  ``--fsync-interval`` 10 ms, never), each run on a fresh ``--data-dir`` under ``--data-root``
  (default the system temp dir; its filesystem is printed -- use a real disk, not tmpfs).
  Reported: msg/s (acks / (last ack - first write)), PublishAck latency percentiles (write of
  the batch holding the message -> its PublishAck arriving), acks per socket read (roughly
  the group-commit size), broker CPU seconds, raw ``fsync`` latency of the filesystem.
* ``recovery`` -- a journal of ``--recovery-messages`` (1,000,000) 64-byte messages, generated
  directly as segment files (``--recovery-source generate``, the default: segment header +
  QueueCreate at the start of every segment + one Publish record per message, rotating at
  ``--segment-size`` like the broker) or by publishing through a ``--fsync never`` broker and
  stopping it (``--recovery-source publish``). Then, per run: ``vibemq-server`` start until
  the ready file appears (and the same for an empty data dir, the baseline), the broker's
  VmRSS after recovery, QueueInfo to confirm the count; and ``Journal.recover`` timed
  in-process in a fresh child process (time, VmRSS growth).
* ``e2e`` -- 1 publisher -> 1 subscriber, RoundRobin with acks, via ``common.run_throughput``
  (the vibemq_bench throughput phase) with durable queues (``--fsync always`` and
  ``interval``) and in-memory queues (``VIBEMQ_QUEUE_DEFAULTS__DURABLE=false``).
* ``rabbitmq`` -- the same end-to-end scenario against RabbitMQ with a durable queue
  (``--rabbit-queue-type classic|quorum``), persistent messages (delivery-mode 2) and
  publisher confirms.

    .venv/bin/python -m bench.journal_bench --json journal.json
    .venv/bin/python -m bench.journal_bench --phases publish --runs 5
    .venv/bin/python -m bench.journal_bench --phases publish --policies always --runs 1 \\
        --server-cmd "$PWD/.venv/bin/python -m cProfile -o /tmp/journal-{policy}.prof \\
        -m vibemq_server"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shlex
import shutil
import statistics
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.amqp_driver import (
    EMPTY_TABLE,
    FRAME_BODY,
    FRAME_HEADER,
    AmqpDriver,
    longstr,
    method,
    shortstr,
)
from bench.amqp_driver import U16 as AMQP_U16
from bench.amqp_driver import U32 as AMQP_U32
from bench.amqp_driver import frame as amqp_frame
from bench.brokers import NotInstalled, RabbitMQBroker, VibeMQBroker
from bench.common import (
    BenchError,
    BlockingConn,
    cpu_seconds,
    encode_batches,
    install_sigterm_exit,
    make_payload,
    percentiles_us,
    publish_pipelined,
    raise_nofile_limit,
    rss_kib,
    run_loop,
    run_throughput,
)
from bench.vibemq_driver import QUEUE_INFO, VibeAckCounter, VibeDriver, frame, handshake, request

POLICIES = ("always", "interval", "never")
BIG_QUEUE = 10_000_000
NON_DURABLE_ENV = "VIBEMQ_QUEUE_DEFAULTS__DURABLE"


# --------------------------------------------------------------------------------------------
# helpers


def filesystem_of(path: Path) -> str:
    """``fstype (source) mounted on target`` for the filesystem holding ``path``."""
    best = ("", "", "")
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    real = str(path.resolve())
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        source, target, fstype = parts[0], parts[1].replace("\\040", " "), parts[2]
        inside = real == target or real.startswith(target.rstrip("/") + "/")
        if inside and len(target) >= len(best[1]):
            best = (source, target, fstype)
    source, target, fstype = best
    return f"{fstype} ({source} on {target})" if fstype else "unknown"


def fsync_latency_us(directory: Path, rounds: int = 200, size: int = 4096) -> dict[str, float]:
    """Append ``size`` bytes and fsync, ``rounds`` times: the disk's floor for ``always``."""
    path = directory / f"fsync-probe-{os.getpid()}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    samples: list[int] = []
    try:
        block = b"x" * size
        for _ in range(rounds):
            os.write(fd, block)
            t = time.perf_counter_ns()
            os.fsync(fd)
            samples.append(time.perf_counter_ns() - t)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return percentiles_us(samples)


@contextlib.contextmanager
def env_set(name: str, value: str | None) -> Iterator[None]:
    """Set (or leave alone when None) an environment variable the broker will inherit."""
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def server_command(template: str | None, **fields: str) -> list[str] | None:
    """``--server-cmd`` with ``{policy}``/``{run}``/``{mode}`` filled in (for per-run
    profile files)."""
    if not template:
        return None
    text = template
    for key, value in fields.items():
        text = text.replace("{" + key + "}", value)
    return shlex.split(text)


def start_vibemq(
    command: list[str] | None, data_dir: Path, args: list[str], env: dict[str, str] | None = None
) -> VibeMQBroker:
    broker = VibeMQBroker(command, extra_args=["--data-dir", str(data_dir), *args])
    with contextlib.ExitStack() as stack:
        for key, value in (env or {}).items():
            stack.enter_context(env_set(key, value))
        broker.start(timeout=300)
    return broker


def queue_count(host: str, port: int, queue: str) -> str:
    conn = BlockingConn(host, port, timeout=60)
    try:
        handshake(conn, "info")
        reply = request(conn, frame(QUEUE_INFO, "qi-1", queue), QUEUE_INFO)
        return reply.payload.decode(errors="replace")
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# phase: persistent publish throughput + PublishAck latency


class _TimedPub(asyncio.Protocol):
    """Pipelined publisher that remembers when each message was written and records the
    PublishAck latency of every message (acks on one connection arrive in publish order)."""

    def __init__(
        self,
        batches: list[bytes],
        sizes: list[int],
        window: int,
        leftover: bytes,
        done: asyncio.Future[None],
    ) -> None:
        self.batches = batches
        self.sizes = sizes
        self.window = window
        self.counter = VibeAckCounter()
        self.buf = bytearray(leftover)
        self.done = done
        self.total = sum(sizes)
        self.next = 0
        self.sent = 0
        self.acked = 0
        self.reads_with_acks = 0
        self.sent_ns: list[int] = []
        self.latency_ns: list[int] = []
        self.t_start = 0
        self.t_end = 0
        self.error = ""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.t_start = time.monotonic_ns()
        self.pump()

    def pump(self) -> None:
        out: list[bytes] = []
        room = self.window - (self.sent - self.acked)
        batches, sizes = self.batches, self.sizes
        now = time.monotonic_ns()
        while self.next < len(batches) and sizes[self.next] <= room:
            out.append(batches[self.next])
            n = sizes[self.next]
            room -= n
            self.sent += n
            self.sent_ns.extend([now] * n)
            self.next += 1
        if out and self.transport is not None:
            self.transport.writelines(out)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        buf = self.buf
        buf += data
        try:
            consumed, acked = self.counter.feed(buf)
        except BenchError as exc:
            self.finish(str(exc))
            return
        if consumed:
            del buf[:consumed]
        if acked:
            sent = self.sent_ns
            self.latency_ns.extend(now - sent[i] for i in range(self.acked, self.acked + acked))
            self.acked += acked
            self.reads_with_acks += 1
            if self.acked >= self.total:
                self.finish("")
                return
            self.pump()

    def finish(self, error: str) -> None:
        if not self.done.done():
            self.t_end = time.monotonic_ns()
            self.error = error
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.finish(f"connection lost: {exc!r}")


async def _timed_publish(
    conn: BlockingConn, batches: list[bytes], sizes: list[int], window: int, timeout: float
) -> _TimedPub:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    proto = _TimedPub(batches, sizes, window, bytes(conn.buf), done)
    conn.buf.clear()
    conn.sock.setblocking(False)
    transport, _ = await loop.create_connection(lambda: proto, sock=conn.sock)
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout)
    except TimeoutError:
        proto.finish(f"timeout after {timeout:.0f}s with {proto.acked} acked")
    transport.close()
    return proto


@dataclass
class PublishRun:
    policy: str
    messages: int
    acked: int = 0
    rate: float = 0.0
    p50_us: float = 0.0
    p95_us: float = 0.0
    p99_us: float = 0.0
    max_us: float = 0.0
    acks_per_read: float = 0.0
    broker_cpu_s: float = 0.0
    journal_bytes: int = 0
    errors: list[str] = field(default_factory=list)


def publish_run(policy: str, run: int, data_root: Path, a: argparse.Namespace) -> PublishRun:
    result = PublishRun(policy, a.messages)
    data_dir = Path(tempfile.mkdtemp(prefix=f"jb-{policy}-", dir=data_root))
    flags = ["--fsync", policy, "--fsync-interval", str(a.fsync_interval)]
    flags += ["--segment-size", str(a.segment_size), *a.server_arg]
    broker = start_vibemq(
        server_command(a.server_cmd, policy=policy, run=str(run)), data_dir, flags
    )
    try:
        driver = VibeDriver(broker.host, broker.port, f"jb-{uuid.uuid4().hex[:8]}")
        conn = driver.connect_publisher()
        driver.create_queue(conn, {"mode": "RoundRobin", "maxQueueSize": BIG_QUEUE})
        if a.warmup:
            wb, ws = encode_batches(driver, a.warmup, a.batch)
            warm = run_loop(
                publish_pipelined(conn, wb, ws, a.window, driver.ack_counter(), a.timeout)
            )
            if warm.error:
                result.errors.append(f"warmup: {warm.error}")
            conn = driver.connect_publisher()
        driver.id_prefix = "t"
        batches, sizes = encode_batches(driver, a.messages, a.batch)
        cpu0 = cpu_seconds(broker.pids())
        proto = run_loop(_timed_publish(conn, batches, sizes, a.window, a.timeout))
        result.broker_cpu_s = round(cpu_seconds(broker.pids()) - cpu0, 2)
        conn.close()
        result.acked = proto.acked
        if proto.error:
            result.errors.append(proto.error)
        if proto.t_end > proto.t_start:
            result.rate = proto.acked / ((proto.t_end - proto.t_start) / 1e9)
        pct = percentiles_us(proto.latency_ns)
        for key in ("p50_us", "p95_us", "p99_us", "max_us"):
            setattr(result, key, round(pct.get(key, 0.0), 1))
        if proto.reads_with_acks:
            result.acks_per_read = round(proto.acked / proto.reads_with_acks, 1)
    except (BenchError, OSError) as exc:
        result.errors.append(str(exc))
    finally:
        if os.environ.get("BENCH_SHOW_LOG"):
            print(broker.log_tail(40))
        broker.stop()
        result.journal_bytes = dir_bytes(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
    return result


def phase_publish(data_root: Path, a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for policy in a.policies:
        runs: list[PublishRun] = []
        for i in range(a.runs):
            r = publish_run(policy, i, data_root, a)
            runs.append(r)
            print(
                f"[publish] fsync={policy} run {i + 1}: {r.acked:,}/{r.messages:,} acked, "
                f"{r.rate:,.0f} msg/s; PublishAck p50 {r.p50_us:,.0f}us p95 {r.p95_us:,.0f}us "
                f"p99 {r.p99_us:,.0f}us max {r.max_us:,.0f}us; {r.acks_per_read} acks/read; "
                f"broker cpu {r.broker_cpu_s}s" + (f"; errors: {r.errors}" if r.errors else ""),
                flush=True,
            )
        ok = [r for r in runs if not r.errors] or runs
        summary = {
            key: round(median([getattr(r, key) for r in ok]), 1)
            for key in ("rate", "p50_us", "p95_us", "p99_us", "max_us", "acks_per_read")
        }
        out[policy] = {"median": summary, "runs": [asdict(r) for r in runs]}
        print(
            f"[publish] fsync={policy} MEDIAN of {len(ok)}: {summary['rate']:,.0f} msg/s, "
            f"p50 {summary['p50_us']:,.0f}us p99 {summary['p99_us']:,.0f}us",
            flush=True,
        )
    return out


# --------------------------------------------------------------------------------------------
# phase: recovery


def generate_journal(
    journal_dir: Path, queue: str, messages: int, segment_size: int, payload_size: int = 64
) -> dict[str, Any]:
    """Segment files as a broker with one durable queue and ``messages`` unconsumed publishes
    would leave them: header, QueueCreate, Publish records; a new segment (header +
    QueueCreate again) once the current one reaches ``segment_size``."""
    from vibemq_server.core.manager import QueueManager, options_to_dict
    from vibemq_server.journal.records import (
        QueueCreate,
        encode_publish,
        encode_record,
        encode_segment_header,
    )

    journal_dir.mkdir(parents=True, exist_ok=True)
    manager = QueueManager()
    opts = manager.options_from({"mode": "RoundRobin", "maxQueueSize": BIG_QUEUE})
    options_json = json.dumps(options_to_dict(opts), separators=(",", ":")).encode()
    now = int(time.time() * 1000)
    create = QueueCreate(queue, now, options_json)
    segment = 0
    fh = None
    size = 0
    files = 0
    total = 0
    t0 = time.monotonic()
    chunk: list[bytes] = []
    chunk_bytes = 0
    try:
        for i in range(messages):
            if fh is None or size >= segment_size:
                if fh is not None:
                    fh.write(b"".join(chunk))
                    chunk, chunk_bytes = [], 0
                    fh.close()
                segment += 1
                files += 1
                fh = open(journal_dir / f"{segment:020d}.seg", "wb")  # noqa: SIM115
                head = encode_segment_header(segment) + encode_record(create, now)
                fh.write(head)
                size = len(head)
                total += size
            rec = encode_publish(
                now, i + 1, queue, f"m{i:08d}", now, 0, 1, 0, {}, make_payload(i, payload_size)
            )
            chunk.append(rec)
            chunk_bytes += len(rec)
            size += len(rec)
            total += len(rec)
            if chunk_bytes >= 1 << 20:
                fh.write(b"".join(chunk))
                chunk, chunk_bytes = [], 0
        if fh is not None:
            fh.write(b"".join(chunk))
            os.fsync(fh.fileno())
    finally:
        if fh is not None:
            fh.close()
    return {
        "source": "generate",
        "segments": files,
        "bytes": total,
        "seconds": round(time.monotonic() - t0, 2),
    }


def publish_journal(data_dir: Path, queue: str, messages: int, a: argparse.Namespace) -> dict:
    """Fill a journal by publishing through a ``--fsync never`` broker, then stop it."""
    t0 = time.monotonic()
    broker = start_vibemq(
        None, data_dir, ["--fsync", "never", "--segment-size", str(a.segment_size)]
    )
    try:
        driver = VibeDriver(broker.host, broker.port, queue)
        conn = driver.connect_publisher()
        driver.create_queue(conn, {"mode": "RoundRobin", "maxQueueSize": BIG_QUEUE})
        batches, sizes = encode_batches(driver, messages, 100)
        stats = run_loop(
            publish_pipelined(conn, batches, sizes, 2000, driver.ack_counter(), a.timeout)
        )
        if stats.error or stats.acked != messages:
            raise BenchError(f"filling the journal: {stats.acked} acked, {stats.error}")
        conn.close()
    finally:
        broker.stop(grace=120)
    journal = data_dir / "journal"
    return {
        "source": "publish",
        "segments": len(list(journal.glob("*.seg"))),
        "bytes": dir_bytes(journal),
        "seconds": round(time.monotonic() - t0, 2),
    }


def _recover_child(journal_dir: str, pipe: Any) -> None:
    """In a fresh process: Journal.recover on a QueueManager; seconds and VmRSS growth."""
    try:
        import gc
        import logging

        import structlog

        from vibemq_server.core.manager import QueueManager
        from vibemq_server.journal import FsyncPolicy, Journal

        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
        gc.collect()
        before = rss_kib(os.getpid()) or 0
        manager = QueueManager()
        journal = Journal(Path(journal_dir), fsync=FsyncPolicy.NEVER)
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        journal.recover(manager)
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        after = rss_kib(os.getpid()) or 0
        count = sum(q.count for q in manager.queues.values())
        pipe.send(
            (
                "done",
                {
                    "seconds": seconds,
                    "cpu_s": cpu,
                    "messages": count,
                    "rss_growth_kib": after - before,
                    "rss_kib": after,
                },
            )
        )
    except Exception as exc:  # report, do not hang the parent
        pipe.send(("error", repr(exc)))


def recover_in_process(journal_dir: Path) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    rx, tx = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_recover_child, args=(str(journal_dir), tx))
    proc.start()
    try:
        if not rx.poll(600):
            raise BenchError("in-process recovery did not finish within 600 s")
        kind, value = rx.recv()
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    if kind != "done":
        raise BenchError(f"in-process recovery: {value}")
    return cast(dict[str, Any], value)


def _timed_start(data_dir: Path, a: argparse.Namespace, run: int) -> tuple[VibeMQBroker, float]:
    command = server_command(a.server_cmd, policy="recovery", run=str(run))
    t0 = time.monotonic()
    broker = start_vibemq(command, data_dir, ["--fsync", "always"])
    return broker, time.monotonic() - t0


def phase_recovery(data_root: Path, a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"messages": a.recovery_messages}
    data_dir = Path(tempfile.mkdtemp(prefix="jb-recovery-", dir=data_root))
    empty_dir = Path(tempfile.mkdtemp(prefix="jb-empty-", dir=data_root))
    journal = data_dir / "journal"
    queue = "jb-recovery"
    try:
        print(
            f"[recovery] writing a journal of {a.recovery_messages:,} messages "
            f"({a.recovery_source})",
            flush=True,
        )
        if a.recovery_source == "generate":
            out["journal"] = generate_journal(journal, queue, a.recovery_messages, a.segment_size)
        else:
            out["journal"] = publish_journal(data_dir, queue, a.recovery_messages, a)
        original = {p.name for p in journal.glob("*.seg")}
        print(f"[recovery] journal: {out['journal']}", flush=True)
        runs: list[dict[str, Any]] = []
        for i in range(a.runs):
            row: dict[str, Any] = {}
            broker, row["empty_start_s"] = _timed_start(empty_dir, a, i)
            row["empty_rss_kib"] = broker.rss_kib()
            broker.stop()
            broker, row["start_s"] = _timed_start(data_dir, a, i)
            try:
                row["rss_kib"] = broker.rss_kib()
                info = queue_count(broker.host, broker.port, queue)
                row["queue_info"] = info[:200]
            finally:
                broker.stop(grace=60)
            # each start opens a fresh segment: drop them so every run reads the same input
            for p in journal.glob("*.seg"):
                if p.name not in original:
                    p.unlink()
            row["in_process"] = recover_in_process(journal)
            for p in journal.glob("*.seg"):
                if p.name not in original:
                    p.unlink()
            runs.append(row)
            ip = row["in_process"]
            print(
                f"[recovery] run {i + 1}: vibemq-server ready in {row['start_s']:.2f}s "
                f"(empty data dir {row['empty_start_s']:.2f}s), RSS "
                f"{row['rss_kib'] / 1024:,.0f} MiB (empty {row['empty_rss_kib'] / 1024:,.0f} "
                f"MiB); Journal.recover in-process {ip['seconds']:.2f}s "
                f"(cpu {ip['cpu_s']:.2f}s, {ip['messages']:,} messages, RSS +"
                f"{ip['rss_growth_kib'] / 1024:,.0f} MiB); QueueInfo {row['queue_info'][:120]}",
                flush=True,
            )
        out["runs"] = runs
        out["median"] = {
            "start_s": round(median([r["start_s"] for r in runs]), 2),
            "empty_start_s": round(median([r["empty_start_s"] for r in runs]), 2),
            "rss_mib": round(median([r["rss_kib"] / 1024 for r in runs]), 1),
            "recover_s": round(median([r["in_process"]["seconds"] for r in runs]), 2),
            "recover_rss_growth_mib": round(
                median([r["in_process"]["rss_growth_kib"] / 1024 for r in runs]), 1
            ),
        }
        print(f"[recovery] MEDIAN of {len(runs)}: {out['median']}", flush=True)
    finally:
        if not os.environ.get("BENCH_KEEP_TMP"):
            shutil.rmtree(data_dir, ignore_errors=True)
            shutil.rmtree(empty_dir, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------------
# phase: end to end, durable vs in-memory (and RabbitMQ durable)

E2E_MODES: dict[str, tuple[list[str], dict[str, str]]] = {
    "durable-always": (["--fsync", "always"], {}),
    "durable-interval": (["--fsync", "interval", "--fsync-interval", "10"], {}),
    "memory": (["--fsync", "always"], {NON_DURABLE_ENV: "false"}),
}


def _e2e_line(tag: str, thr: Any) -> str:
    return (
        f"{tag}: {thr.delivered:,}/{thr.messages:,} delivered at {thr.deliver_rate:,.0f} msg/s, "
        f"publish {thr.publish_rate:,.0f} msg/s; cpu s broker {thr.broker_cpu_s or 0:.1f}, pub "
        f"{thr.publisher_cpu_s:.1f}, sub {thr.subscriber_cpu_s:.1f}"
        + (f"; errors: {thr.errors}" if thr.errors else "")
    )


def phase_e2e(data_root: Path, a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in a.e2e_modes:
        flags, env = E2E_MODES[mode]
        runs: list[dict[str, Any]] = []
        for i in range(a.runs):
            data_dir = Path(tempfile.mkdtemp(prefix=f"jb-e2e-{mode}-", dir=data_root))
            command = server_command(a.server_cmd, policy=mode, run=str(i))
            broker = start_vibemq(command, data_dir, [*flags, *a.server_arg], env)
            try:

                def drv(b: VibeMQBroker = broker) -> VibeDriver:
                    return VibeDriver(b.host, b.port, f"jb-{uuid.uuid4().hex[:8]}", prefetch=1000)

                if a.warmup:
                    run_throughput(drv(), a.warmup, window=2000, batch=a.batch, timeout=60)
                thr = run_throughput(
                    drv(),
                    a.e2e_messages,
                    window=2000,
                    batch=a.batch,
                    timeout=a.timeout,
                    broker_pids=broker.pids,
                )
            finally:
                broker.stop()
                journal_bytes = dir_bytes(data_dir)
                shutil.rmtree(data_dir, ignore_errors=True)
            row = asdict(thr)
            row["journal_bytes_after"] = journal_bytes
            runs.append(row)
            print(
                f"[e2e] {mode} run {i + 1} "
                + _e2e_line("", thr)[2:]
                + f"; journal {journal_bytes / 1e6:.1f} MB",
                flush=True,
            )
        ok = [r for r in runs if not r["errors"]] or runs
        out[mode] = {
            "median": {
                "deliver_rate": round(median([r["deliver_rate"] for r in ok])),
                "publish_rate": round(median([r["publish_rate"] for r in ok])),
            },
            "runs": runs,
        }
        print(f"[e2e] {mode} MEDIAN of {len(ok)}: {out[mode]['median']}", flush=True)
    return out


@dataclass
class DurableAmqpDriver(AmqpDriver):
    """AmqpDriver with a durable queue (classic or quorum) and persistent messages."""

    queue_type: str = "classic"
    name: str = "rabbitmq-durable"

    def declare_options(self) -> tuple[bytes, bytes]:
        table = EMPTY_TABLE
        if self.queue_type != "classic":
            entry = shortstr(b"x-queue-type") + b"S" + longstr(self.queue_type.encode())
            table = AMQP_U32.pack(len(entry)) + entry
        # bits: passive=1 durable=2 -> durable, not exclusive, not auto-delete
        return b"\x02", table

    def publish_batch(self, start: int, count: int) -> bytes:
        pub = method(
            1, 60, 40, AMQP_U16.pack(0) + shortstr(b"") + shortstr(self.queue.encode()) + b"\0"
        )
        out: list[bytes] = []
        for i in range(start, start + count):
            body = make_payload(i, self.payload_size)
            # content header with property flags: delivery-mode (bit 12) = 2, persistent
            header = amqp_frame(FRAME_HEADER, 1, struct.pack(">HHQHB", 60, 0, len(body), 0x1000, 2))
            out.append(pub + header + amqp_frame(FRAME_BODY, 1, body))
        return b"".join(out)


def phase_rabbitmq(a: argparse.Namespace) -> dict[str, Any]:
    broker = RabbitMQBroker()
    out: dict[str, Any] = {"queue_type": a.rabbit_queue_type}
    try:
        t0 = time.monotonic()
        broker.start()
        out["startup_s"] = round(time.monotonic() - t0, 1)
        assert broker.tmp is not None
        out["filesystem"] = filesystem_of(broker.tmp)
        runs: list[dict[str, Any]] = []
        for i in range(a.runs):

            def drv() -> DurableAmqpDriver:
                return DurableAmqpDriver(
                    broker.host,
                    broker.port,
                    f"jb-{uuid.uuid4().hex[:8]}",
                    prefetch=1000,
                    queue_type=a.rabbit_queue_type,
                )

            if a.warmup:
                run_throughput(drv(), a.warmup, window=2000, batch=a.batch, timeout=60)
            thr = run_throughput(
                drv(),
                a.e2e_messages,
                window=2000,
                batch=a.batch,
                timeout=a.timeout,
                broker_pids=broker.pids,
            )
            runs.append(asdict(thr))
            print(
                f"[rabbitmq] durable {a.rabbit_queue_type} run {i + 1} " + _e2e_line("", thr)[2:],
                flush=True,
            )
        ok = [r for r in runs if not r["errors"]] or runs
        out["median"] = {
            "deliver_rate": round(median([r["deliver_rate"] for r in ok])),
            "publish_rate": round(median([r["publish_rate"] for r in ok])),
        }
        out["runs"] = runs
        print(f"[rabbitmq] MEDIAN of {len(ok)}: {out['median']}", flush=True)
    except NotInstalled as exc:
        out["skipped"] = str(exc)
        print(f"[rabbitmq] SKIPPED: {exc}", flush=True)
    finally:
        broker.stop()
    return out


# --------------------------------------------------------------------------------------------
# CLI


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--phases",
        type=_csv,
        default=["publish", "recovery", "e2e"],
        help="comma list of publish,recovery,e2e,rabbitmq",
    )
    p.add_argument("--runs", type=int, default=3, help="repeats per configuration (medians)")
    p.add_argument(
        "--data-root",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="where the fresh data dirs go (a real disk, not tmpfs)",
    )
    p.add_argument("--policies", type=_csv, default=list(POLICIES))
    p.add_argument("--messages", type=int, default=200_000, help="publish phase, timed")
    p.add_argument("--warmup", type=int, default=10_000, help="untimed messages first")
    p.add_argument("--window", type=int, default=1000, help="publish phase: max unacked")
    p.add_argument("--batch", type=int, default=100, help="publishes per write")
    p.add_argument("--fsync-interval", type=int, default=10, help="ms, for interval")
    p.add_argument("--segment-size", type=int, default=64 * 1024 * 1024)
    p.add_argument("--recovery-messages", type=int, default=1_000_000)
    p.add_argument("--recovery-source", choices=("generate", "publish"), default="generate")
    p.add_argument("--e2e-messages", type=int, default=200_000)
    p.add_argument("--e2e-modes", type=_csv, default=list(E2E_MODES))
    p.add_argument("--rabbit-queue-type", choices=("classic", "quorum"), default="classic")
    p.add_argument("--server-arg", action="append", default=[], help="extra vibemq-server arg")
    p.add_argument(
        "--server-cmd", help="instead of vibemq-server; {policy} and {run} are substituted"
    )
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    for policy in a.policies:
        if policy not in POLICIES:
            p.error(f"unknown policy {policy!r}")
    for mode in a.e2e_modes:
        if mode not in E2E_MODES:
            p.error(f"unknown e2e mode {mode!r} (one of {', '.join(E2E_MODES)})")

    install_sigterm_exit()
    raise_nofile_limit()
    data_root: Path = a.data_root
    data_root.mkdir(parents=True, exist_ok=True)
    fs = filesystem_of(data_root)
    fsync = fsync_latency_us(data_root)
    report: dict[str, Any] = {
        "data_root": str(data_root),
        "filesystem": fs,
        "fsync_4k_us": {k: round(v, 1) for k, v in fsync.items()},
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
    }
    print(
        f"data root {data_root}: {fs}; fsync(4 KiB append) p50 {fsync['p50_us']:,.0f}us "
        f"p99 {fsync['p99_us']:,.0f}us; {os.cpu_count()} cpus, load {os.getloadavg()}",
        flush=True,
    )
    if "tmpfs" in fs:
        print("WARNING: the data root is on tmpfs: fsync costs nothing there", flush=True)
    try:
        if "publish" in a.phases:
            report["publish"] = phase_publish(data_root, a)
        if "recovery" in a.phases:
            report["recovery"] = phase_recovery(data_root, a)
        if "e2e" in a.phases:
            report["e2e"] = phase_e2e(data_root, a)
        if "rabbitmq" in a.phases:
            report["rabbitmq"] = phase_rabbitmq(a)
    except (BenchError, OSError) as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        report["error"] = str(exc)
    if a.json:
        a.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {a.json}")
    return 1 if "error" in report else 0


if __name__ == "__main__":
    raise SystemExit(main())
