"""VibeMQ load generator.

Phases (default: throughput and latency):

* throughput -- 1 publisher process -> 1 subscriber process, 64-byte JSON payloads, a
  RoundRobin queue with acks (Subscribe header ``prefetch``). The publisher writes pre-encoded
  Publish frames in batches, keeping at most ``--window`` publishes without a PublishAck; the
  subscriber scans length prefixes, slices the fixed-width id out of each Deliver and answers
  with pre-built Ack frames, one write per read.
* latency -- sequential publish -> Deliver -> Ack round trips, ``--samples`` of them.
* ``--tls``: throughput and latency over the plain listener, then over the TLS one of the
  same broker (a self-signed certificate made with openssl), side by side.
* ``--permissions``: the broker gets a users file with two users, ``full`` (``.*``: no check
  at all) and ``scoped`` (``^bench-`` for configure, write and read: every publish, subscribe
  and declare judged by a regex, cached per address); throughput is measured as each, in
  ``--rounds`` alternating rounds, and the median ratio scoped/full is the permission cost.
* memory (``--memory``) -- 1,000,000 messages into a queue nobody consumes; broker VmRSS.
* connections (``--connections``) -- 10,000 concurrent connections (Connect/ConnectAck each),
  held open, Ping/Pong on a sample; broker VmRSS.

The broker is started as ``vibemq-server --port 0 --ready-file ...`` unless ``--target
host:port`` names a running one (then ``--broker-pid`` enables the RSS readings).

    .venv/bin/python -m bench.vibemq_bench --all --json vibemq.json
    .venv/bin/python -m bench.vibemq_bench --tls --json vibemq-tls.json
    .venv/bin/python -m bench.vibemq_bench --permissions --rounds 5 --no-latency
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import VibeMQBroker
from bench.common import (
    BenchError,
    BlockingConn,
    encode_batches,
    install_sigterm_exit,
    make_tls_cert,
    publish_pipelined,
    raise_nofile_limit,
    rss_kib,
    run_latency,
    run_loop,
    run_throughput,
)
from bench.vibemq_driver import (
    CONNECT,
    CONNECT_ACK,
    PING,
    PONG,
    QUEUE_INFO,
    U32,
    VibeDriver,
    decode,
    frame,
    handshake,
    request,
)


def _mib(kib: int | None) -> str:
    return f"{kib / 1024:,.1f} MiB" if kib is not None else "n/a"


# --------------------------------------------------------------------------------------------
# memory


@dataclass
class MemoryResult:
    messages: int
    acked: int = 0
    publish_rate: float = 0.0
    rss_before_kib: int | None = None
    rss_after_kib: int | None = None
    bytes_per_message: float | None = None
    queue_info: str = ""
    errors: list[str] = field(default_factory=list)


def run_memory(
    host: str,
    port: int,
    pid: int | None,
    messages: int,
    *,
    window: int,
    batch: int,
    timeout: float,
) -> MemoryResult:
    result = MemoryResult(messages)
    driver = VibeDriver(host, port, f"bench-mem-{uuid.uuid4().hex[:8]}")
    print(f"[memory] encoding {messages:,} publishes", flush=True)
    batches, sizes = encode_batches(driver, messages, batch)
    conn = driver.connect_publisher()
    driver.create_queue(conn, {"mode": "RoundRobin", "maxQueueSize": max(2_000_000, messages)})
    if pid:
        result.rss_before_kib = rss_kib(pid)
    print(f"[memory] publishing {messages:,} messages, no subscriber", flush=True)
    stats = run_loop(publish_pipelined(conn, batches, sizes, window, driver.ack_counter(), timeout))
    del batches
    result.acked = stats.acked
    if stats.error:
        result.errors.append(stats.error)
    if stats.t_end_ns > stats.t_start_ns:
        result.publish_rate = stats.acked / ((stats.t_end_ns - stats.t_start_ns) / 1e9)
    time.sleep(1.0)
    if pid:
        result.rss_after_kib = rss_kib(pid)
        if result.rss_before_kib is not None and result.rss_after_kib is not None and stats.acked:
            delta = result.rss_after_kib - result.rss_before_kib
            result.bytes_per_message = delta * 1024 / stats.acked
    try:
        info_conn = BlockingConn(host, port)
        handshake(info_conn, "info")
        reply = request(info_conn, frame(QUEUE_INFO, "qi-1", driver.queue), QUEUE_INFO)
        result.queue_info = reply.payload.decode(errors="replace")
        info_conn.close()
    except (BenchError, OSError) as exc:
        result.errors.append(f"QueueInfo: {exc!r}")
    conn.close()
    return result


# --------------------------------------------------------------------------------------------
# connections


@dataclass
class ConnectionsResult:
    target: int
    opened: int = 0
    failed: int = 0
    open_seconds: float = 0.0
    ping_sample: int = 0
    pong_ok: int = 0
    ping_p50_us: float = 0.0
    rss_before_kib: int | None = None
    rss_after_kib: int | None = None
    errors: list[str] = field(default_factory=list)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (n,) = U32.unpack(await reader.readexactly(4))
    return await reader.readexactly(n)


async def _open_one(
    host: str, port: int, i: int, sem: asyncio.Semaphore
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    async with sem:
        reader, writer = await asyncio.open_connection(host, port)
        cid = f"k{i:06d}"
        writer.write(frame(CONNECT, cid))
        body = await _read_frame(reader)
        if body[1] != CONNECT_ACK:
            writer.close()
            raise BenchError(f"connection {i}: {decode(body).error or body[1]}")
        return reader, writer


async def _connections(
    host: str, port: int, pid: int | None, count: int, sample: int, timeout: float
) -> ConnectionsResult:
    result = ConnectionsResult(count)
    if pid:
        result.rss_before_kib = rss_kib(pid)
    sem = asyncio.Semaphore(200)
    t0 = time.monotonic()
    tasks = [asyncio.ensure_future(_open_one(host, port, i, sem)) for i in range(count)]
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    result.open_seconds = time.monotonic() - t0
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    first_errors: list[str] = []
    for task in done:
        exc = task.exception()
        if exc is None:
            conns.append(task.result())
        else:
            result.failed += 1
            if len(first_errors) < 3:
                first_errors.append(repr(exc))
    result.failed += len(pending)
    result.opened = len(conns)
    result.errors.extend(first_errors)
    print(
        f"[connections] {result.opened:,} open ({result.failed} failed) "
        f"in {result.open_seconds:.1f}s; holding",
        flush=True,
    )
    await asyncio.sleep(1.0)
    if pid:
        result.rss_after_kib = rss_kib(pid)
    rtts: list[int] = []
    for reader, writer in random.sample(conns, min(sample, len(conns))):
        result.ping_sample += 1
        t = time.perf_counter_ns()
        writer.write(frame(PING, f"p{result.ping_sample}"))
        try:
            body = await asyncio.wait_for(_read_frame(reader), 10)
        except (TimeoutError, asyncio.IncompleteReadError, OSError) as exc:
            result.errors.append(f"ping: {exc!r}")
            continue
        if body[1] == PONG:
            result.pong_ok += 1
            rtts.append(time.perf_counter_ns() - t)
    if rtts:
        rtts.sort()
        result.ping_p50_us = rtts[len(rtts) // 2] / 1000
    for _reader, writer in conns:
        writer.close()
    for _reader, writer in conns:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1)
    return result


def run_connections(
    host: str, port: int, pid: int | None, count: int, sample: int, timeout: float
) -> ConnectionsResult:
    return run_loop(_connections(host, port, pid, count, sample, timeout))


# --------------------------------------------------------------------------------------------
# CLI


def _throughput_and_latency(
    args: argparse.Namespace,
    report: dict[str, Any],
    prefix: str,
    host: str,
    port: int,
    tls_ca: str | None,
    pids: Any,
    login: tuple[str, str] | None = None,
) -> None:
    """The throughput and latency phases on one listener (``prefix``: "" or "tls-"), as an
    anonymous client or as ``login``."""

    def driver() -> VibeDriver:
        return VibeDriver(
            host,
            port,
            f"bench-{uuid.uuid4().hex[:8]}",
            prefetch=args.prefetch,
            tls_ca=tls_ca,
            login=login,
        )

    label = "over TLS " if tls_ca else ""
    if not args.no_throughput:
        if args.warmup:
            run_throughput(driver(), args.warmup, window=args.window, batch=args.batch, timeout=60)
        thr = run_throughput(
            driver(),
            args.messages,
            window=args.window,
            batch=args.batch,
            timeout=args.timeout,
            broker_pids=pids,
        )
        report[f"{prefix}throughput"] = asdict(thr)
        print(
            f"[throughput] {label}{thr.delivered:,}/{thr.messages:,} delivered: "
            f"{thr.deliver_rate:,.0f} msg/s delivered, {thr.publish_rate:,.0f} msg/s "
            f"published (acked); cpu s: broker {thr.broker_cpu_s}, publisher "
            f"{thr.publisher_cpu_s:.2f}, subscriber {thr.subscriber_cpu_s:.2f} over "
            f"{thr.elapsed_s:.2f}s" + (f"; errors: {thr.errors}" if thr.errors else ""),
            flush=True,
        )
    if not args.no_latency:
        lat = run_latency(driver(), args.samples, timeout=args.timeout)
        report[f"{prefix}latency"] = asdict(lat)
        print(
            f"[latency] {label}{lat.samples} round trips: p50 {lat.p50_us:.0f}us "
            f"p95 {lat.p95_us:.0f}us p99 {lat.p99_us:.0f}us max {lat.max_us:.0f}us"
            + (f"; errors: {lat.errors}" if lat.errors else ""),
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", help="host:port of a running broker (default: start one)")
    p.add_argument("--broker-pid", type=int, help="pid of the --target broker, for VmRSS")
    p.add_argument("--server-arg", action="append", default=[], help="extra vibemq-server arg")
    p.add_argument(
        "--server-cmd",
        help="command that starts the server instead of vibemq-server (e.g. under cProfile)",
    )
    p.add_argument("--messages", type=int, default=200_000, help="throughput messages")
    p.add_argument("--warmup", type=int, default=10_000, help="messages before the timed run")
    p.add_argument("--window", type=int, default=2000, help="max unacked publishes")
    p.add_argument("--batch", type=int, default=100, help="publishes per write")
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument("--samples", type=int, default=5000, help="latency round trips")
    p.add_argument("--timeout", type=float, default=300.0, help="per phase, seconds")
    p.add_argument("--no-throughput", action="store_true")
    p.add_argument("--no-latency", action="store_true")
    p.add_argument("--memory", action="store_true", help="run the 1M-message memory phase")
    p.add_argument("--memory-messages", type=int, default=1_000_000)
    p.add_argument("--connections", action="store_true", help="run the 10k connections phase")
    p.add_argument("--connection-count", type=int, default=10_000)
    p.add_argument("--ping-sample", type=int, default=200)
    p.add_argument("--all", action="store_true", help="every phase")
    p.add_argument(
        "--tls", action="store_true", help="throughput and latency over TLS too (vs plain)"
    )
    p.add_argument(
        "--permissions",
        action="store_true",
        help="throughput as a user with regex permissions vs one with .* (alternating)",
    )
    p.add_argument("--rounds", type=int, default=3, help="--permissions: rounds of each")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    if args.all:
        args.memory = args.connections = True

    install_sigterm_exit()
    nofile = raise_nofile_limit()
    report: dict[str, Any] = {"nofile": nofile}
    broker: VibeMQBroker | None = None
    pid: int | None = args.broker_pid
    try:
        if args.target:
            host, _, port_s = args.target.rpartition(":")
            host, port = host or "127.0.0.1", int(port_s)
        else:
            extra = list(args.server_arg)
            if args.connections and "--max-connections" not in extra:
                extra += ["--max-connections", str(args.connection_count + 100)]
            command = shlex.split(args.server_cmd) if args.server_cmd else None
            tls = None
            if args.tls:
                cert_dir = Path(tempfile.mkdtemp(prefix="bench-tls-"))
                tls = make_tls_cert(cert_dir)
            if args.permissions:
                extra += ["--users-file", str(_permission_users())]
            broker = VibeMQBroker(command, extra_args=extra, tls=tls)
            broker.start()
            host, port, pid = broker.host, broker.port, broker.main_pid
        print(f"VibeMQ at {host}:{port} (pid {pid or 'unknown'}), RLIMIT_NOFILE {nofile}")
        pids = broker.pids if broker is not None else None

        if args.permissions:
            _permission_rounds(args, report, host, port, pids)
            return _finish(args, report, broker)
        _phases(args, report, host, port, pid, pids, broker)
    except (BenchError, OSError) as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        report["error"] = str(exc)
    except BaseException:
        if broker is not None:
            broker.stop()
        raise
    return _finish(args, report, broker)


def _phases(
    args: argparse.Namespace,
    report: dict[str, Any],
    host: str,
    port: int,
    pid: int | None,
    pids: Any,
    broker: VibeMQBroker | None,
) -> None:
    variants: list[tuple[str, int, str | None]] = [("", port, None)]
    if args.tls:
        if broker is None or broker.tls is None:
            raise BenchError("--tls measures a broker the bench starts (not --target)")
        variants.append(("tls-", broker.tls_port, str(broker.tls[0])))
    for prefix, vport, tls_ca in variants:
        _throughput_and_latency(args, report, prefix, host, vport, tls_ca, pids)
    if args.connections:
        con = run_connections(
            host, port, pid, args.connection_count, args.ping_sample, args.timeout
        )
        report["connections"] = asdict(con)
        print(
            f"[connections] {con.opened:,}/{con.target:,} held, {con.failed} failed, "
            f"opened in {con.open_seconds:.1f}s; Ping/Pong {con.pong_ok}/{con.ping_sample} "
            f"(p50 {con.ping_p50_us:.0f}us); RSS {_mib(con.rss_before_kib)} -> "
            f"{_mib(con.rss_after_kib)}" + (f"; errors: {con.errors}" if con.errors else ""),
            flush=True,
        )
    if args.memory:
        mem = run_memory(
            host,
            port,
            pid,
            args.memory_messages,
            window=args.window,
            batch=args.batch,
            timeout=args.timeout,
        )
        report["memory"] = asdict(mem)
        bpm = f"{mem.bytes_per_message:,.0f}" if mem.bytes_per_message else "n/a"
        print(
            f"[memory] {mem.acked:,}/{mem.messages:,} acked at {mem.publish_rate:,.0f} msg/s;"
            f" RSS {_mib(mem.rss_before_kib)} -> {_mib(mem.rss_after_kib)}"
            f" ({bpm} bytes/message); QueueInfo {mem.queue_info[:200]}"
            + (f"; errors: {mem.errors}" if mem.errors else ""),
            flush=True,
        )


def _finish(args: argparse.Namespace, report: dict[str, Any], broker: VibeMQBroker | None) -> int:
    if broker is not None:
        if os.environ.get("BENCH_SHOW_LOG"):
            print(broker.log_tail(40))
        broker.stop()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if "error" in report else 0


#: --permissions: the two users' patterns (the queues are bench-<hex>)
_PERMISSION_USERS = {
    "full": {"configure": ".*", "write": ".*", "read": ".*"},
    "scoped": {"configure": "^bench-", "write": "^bench-", "read": "^bench-"},
}


def _permission_users() -> Path:
    """A users file with the two users (password: their name)."""
    from vibemq_server.auth.passwords import hash_password
    from vibemq_server.auth.users import User, UserStore

    path = Path(tempfile.mkdtemp(prefix="bench-users-")) / "users.json"
    UserStore(path).save(
        {
            name: User(name, hash_password(name), [], dict(patterns))
            for name, patterns in _PERMISSION_USERS.items()
        }
    )
    return path


def _permission_rounds(
    args: argparse.Namespace, report: dict[str, Any], host: str, port: int, pids: Any
) -> None:
    rates: dict[str, list[float]] = {name: [] for name in _PERMISSION_USERS}
    cpu: dict[str, list[float]] = {name: [] for name in _PERMISSION_USERS}
    for round_no in range(args.rounds):
        order = list(_PERMISSION_USERS)
        if round_no % 2:
            order.reverse()  # neither always goes first
        for name in order:
            key = f"{name}-{round_no}-"
            _throughput_and_latency(args, report, key, host, port, None, pids, (name, name))
            result = report[f"{key}throughput"]
            rates[name].append(result["deliver_rate"])
            if result.get("broker_cpu_s") is not None:
                cpu[name].append(result["broker_cpu_s"] / max(1, result["delivered"]) * 1e6)

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2] if values else float("nan")

    full, scoped = median(rates["full"]), median(rates["scoped"])
    full_cpu, scoped_cpu = median(cpu["full"]), median(cpu["scoped"])
    report["permission_cost"] = {
        "full": full,
        "scoped": scoped,
        "ratio": scoped / full,
        "broker_cpu_us_per_message": {"full": full_cpu, "scoped": scoped_cpu},
    }
    print(
        f"[permissions] median delivered msg/s: full {full:,.0f}, scoped {scoped:,.0f}: "
        f"ratio {scoped / full:.3f}; broker CPU per message: full {full_cpu:.1f} us, "
        f"scoped {scoped_cpu:.1f} us ({scoped_cpu / full_cpu - 1:+.1%}) over {args.rounds} "
        "rounds each",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
