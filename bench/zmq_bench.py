"""ZeroMQ bridge benchmark: PUSH -> broker -> SUB throughput next to the native VibeMQ path,
and the RFC 50/MME codec's encode/decode rates.

Phases (each run ``--runs`` times, medians reported):

* zmq -- one PUSH process sends ``--messages`` messages ``[address, p1, p2, p3]`` (three
  64-byte parts) to the broker's PULL socket; one SUB process (subscribed to the address,
  past the slow-joiner probe) counts them off the broker's PUB socket. **msg/s** = messages
  received / (last received - first sent). The broker runs with ``zmq.sndhwm`` raised to the
  message count (``VIBEMQ_ZMQ__SNDHWM``) so the SUB loses nothing and the rate is not
  inflated by drops; with the default (1,000) a SUB slower than the broker loses messages.
* native -- the same broker, the same message count, through the native VibeMQ path of
  ``bench/vibemq_bench.py`` (1 publisher process -> RoundRobin queue -> 1 subscriber process
  with acks; ``bench.common.run_throughput``). The ratio zmq / native is printed.
* codec -- in process: ``mme.encode`` / ``mme.decode`` of 3 x 64 B frames and of 1 x 1 MiB,
  messages/s and MB/s of encoded bytes.

    .venv/bin/python -m bench.zmq_bench --runs 3 --json zmq.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import shlex
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import VibeMQBroker
from bench.common import (
    BenchError,
    cpu_seconds,
    install_sigterm_exit,
    raise_nofile_limit,
    run_throughput,
)
from bench.vibemq_driver import VibeDriver
from vibemq_server.protocol import mme

ADDRESS = b"bench.zmq"
PART = 64
PARTS = 3
PROBE = ADDRESS + b".probe"


# --------------------------------------------------------------------------------------------
# zmq throughput


@dataclass
class ZmqResult:
    messages: int
    received: int = 0
    rate: float = 0.0
    elapsed_s: float = 0.0
    broker_cpu_s: float | None = None
    sub_cpu_s: float = 0.0
    errors: list[str] = field(default_factory=list)


def _sub_main(endpoint: str, pull: str, total: int, timeout: float, pipe: Connection) -> None:
    import zmq

    ctx = zmq.Context()
    try:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)  # the SUB side keeps everything: count, not drop
        sub.connect(endpoint)
        sub.subscribe(ADDRESS)
        probe = ctx.socket(zmq.PUSH)
        probe.connect(pull)
        for _ in range(200):  # slow joiner: probes until one comes back (bounded)
            probe.send_multipart([PROBE, b"p"])
            if sub.poll(50):
                break
        else:
            raise BenchError("the SUB subscription never reached the broker")
        probe.close(0)
        while sub.poll(200):  # drain the probes still in flight
            sub.recv_multipart()
        pipe.send(("ready", None))
        received = 0
        deadline = time.monotonic() + timeout
        # The Cython methods under pyzmq's sugar, as the bridge itself uses (docs/zmq.md).
        recv, get = zmq.backend.Socket.recv, zmq.backend.Socket.get
        rcvmore, noblock = int(zmq.RCVMORE), int(zmq.NOBLOCK)
        while received < total:
            if not sub.poll(2000):
                if time.monotonic() > deadline or received:
                    break  # nothing for 2 s after messages flowed: the rest was dropped
                continue
            while received < total:  # drain what is there without polling per message
                try:
                    head = recv(sub, noblock)
                except zmq.Again:
                    break
                while get(sub, rcvmore):
                    recv(sub, noblock)
                if head == ADDRESS:
                    received += 1
        pipe.send(
            (
                "done",
                {
                    "received": received,
                    "t_last_ns": time.monotonic_ns(),
                    "cpu_s": _process_cpu(),
                },
            )
        )
    except Exception as exc:
        pipe.send(("error", f"sub: {exc!r}"))
    finally:
        ctx.destroy(0)


def _push_main(endpoint: str, total: int, pipe: Connection) -> None:
    import zmq

    ctx = zmq.Context()
    try:
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.SNDHWM, 10_000)
        push.connect(endpoint)
        parts = [ADDRESS] + [bytes([65 + i]) * PART for i in range(PARTS)]
        pipe.send(("ready", None))
        t0 = time.monotonic_ns()
        send = zmq.backend.Socket.send
        more = int(zmq.SNDMORE)
        head, last = parts[:-1], parts[-1]
        for _ in range(total):
            for part in head:
                send(push, part, more)
            send(push, last, 0)
        push.close(linger=-1)  # wait until everything is handed to the broker
        pipe.send(("done", {"t_first_ns": t0, "t_sent_ns": time.monotonic_ns()}))
    except Exception as exc:
        pipe.send(("error", f"push: {exc!r}"))
    finally:
        ctx.term()


def _process_cpu() -> float:
    """CPU seconds of this process, all threads (libzmq's I/O thread included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _expect(pipe: Connection, what: str, timeout: float) -> Any:
    if not pipe.poll(timeout):
        raise BenchError(f"no '{what}' from worker within {timeout:.0f}s")
    kind, value = pipe.recv()
    if kind != what:
        raise BenchError(str(value))
    return value


def run_zmq(
    pull: str, pub: str, total: int, timeout: float, broker: VibeMQBroker | None
) -> ZmqResult:
    result = ZmqResult(total)
    ctx = mp.get_context("spawn")
    sub_rx, sub_tx = ctx.Pipe(duplex=False)
    push_rx, push_tx = ctx.Pipe(duplex=False)
    sub = ctx.Process(target=_sub_main, args=(pub, pull, total, timeout, sub_tx))
    push = ctx.Process(target=_push_main, args=(pull, total, push_tx))
    try:
        sub.start()
        _expect(sub_rx, "ready", 30)
        cpu0 = cpu_seconds(broker.pids()) if broker is not None else None
        push.start()
        _expect(push_rx, "ready", 30)
        pushed = _expect(push_rx, "done", timeout)
        got = _expect(sub_rx, "done", timeout + 10)
        if cpu0 is not None and broker is not None:
            result.broker_cpu_s = round(cpu_seconds(broker.pids()) - cpu0, 2)
        result.received = got["received"]
        result.sub_cpu_s = round(got["cpu_s"], 2)
        result.elapsed_s = (got["t_last_ns"] - pushed["t_first_ns"]) / 1e9
        if result.received < total:
            result.errors.append(f"only {result.received:,}/{total:,} received")
            # t_last was taken 2 s after the last message: do not count the wait.
            result.elapsed_s -= 2.0
        if result.elapsed_s > 0:
            result.rate = result.received / result.elapsed_s
    except BenchError as exc:
        result.errors.append(str(exc))
    finally:
        for proc in (push, sub):
            proc.join(5)
            if proc.is_alive():
                proc.kill()
    return result


# --------------------------------------------------------------------------------------------
# codec


def bench_codec(frames: list[bytes], seconds: float = 1.0) -> dict[str, float]:
    """Messages/s and MB/s (encoded bytes, 10^6) of encode and of decode."""
    wire = mme.encode(frames)
    out: dict[str, float] = {}
    for name, fn, arg in (("encode", mme.encode, frames), ("decode", mme.decode, wire)):
        n = 0
        batch = 1
        t0 = time.perf_counter()
        elapsed = 0.0
        while elapsed < seconds:
            for _ in range(batch):
                fn(arg)  # type: ignore[operator]
            n += batch
            batch = min(batch * 2, 100_000)
            elapsed = time.perf_counter() - t0
        out[f"{name}_msg_s"] = n / elapsed
        out[f"{name}_mb_s"] = n * len(wire) / elapsed / 1e6
    return out


# --------------------------------------------------------------------------------------------
# CLI


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--warmup", type=int, default=10_000, help="untimed, per path")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--window", type=int, default=2000, help="native: max unacked publishes")
    p.add_argument("--batch", type=int, default=100, help="native: publishes per write")
    p.add_argument("--prefetch", type=int, default=1000, help="native")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--codec-seconds", type=float, default=1.0)
    p.add_argument("--no-native", action="store_true")
    p.add_argument("--no-codec", action="store_true")
    p.add_argument("--server-arg", action="append", default=[], help="extra vibemq-server arg")
    p.add_argument("--server-cmd", help="command that starts the server (e.g. under cProfile)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    install_sigterm_exit()
    raise_nofile_limit()
    report: dict[str, Any] = {"load_before": os.getloadavg(), "runs": []}
    zmq_rates: list[float] = []
    native_rates: list[float] = []
    ratios: list[float] = []  # per run: both paths measured under the same load
    status = 0
    for run in range(1, args.runs + 1):
        broker = VibeMQBroker(
            shlex.split(args.server_cmd) if args.server_cmd else None,
            extra_args=[
                "--zmq-pull",
                "tcp://127.0.0.1:0",
                "--zmq-pub",
                "tcp://127.0.0.1:0",
                *args.server_arg,
            ],
            env={"VIBEMQ_ZMQ__SNDHWM": str(max(args.messages, args.warmup) + 10_000)},
        )
        try:
            broker.start()
            assert broker.tmp is not None
            ready = json.loads((broker.tmp / "ready.json").read_text())
            pull, pub = ready["zmq_pull"], ready["zmq_pub"]
            entry: dict[str, Any] = {"run": run}
            if args.warmup:
                run_zmq(pull, pub, args.warmup, 60, None)
            zres = run_zmq(pull, pub, args.messages, args.timeout, broker)
            entry["zmq"] = asdict(zres)
            zmq_rates.append(zres.rate)
            line = (
                f"[run {run}] zmq PUSH->SUB {zres.rate:,.0f} msg/s ({zres.received:,} recv; "
                f"cpu s: broker {zres.broker_cpu_s}, sub {zres.sub_cpu_s})"
            )
            if not args.no_native:

                def driver(b: VibeMQBroker = broker) -> VibeDriver:
                    return VibeDriver(
                        b.host, b.port, f"bench-{uuid.uuid4().hex[:8]}", prefetch=args.prefetch
                    )

                if args.warmup:
                    run_throughput(
                        driver(), args.warmup, window=args.window, batch=args.batch, timeout=60
                    )
                nres = run_throughput(
                    driver(),
                    args.messages,
                    window=args.window,
                    batch=args.batch,
                    timeout=args.timeout,
                    broker_pids=broker.pids,
                )
                entry["native"] = asdict(nres)
                native_rates.append(nres.deliver_rate)
                line += (
                    f"; native VibeMQ {nres.deliver_rate:,.0f} msg/s (cpu s: broker "
                    f"{nres.broker_cpu_s}, sub {nres.subscriber_cpu_s:.2f})"
                )
                if nres.deliver_rate:
                    ratios.append(zres.rate / nres.deliver_rate)
                    line += f"; ratio {ratios[-1]:.2f}"
            errors = zres.errors + (entry.get("native", {}).get("errors") or [])
            if errors:
                line += f"; errors: {errors}"
                status = 1
            print(line, flush=True)
            report["runs"].append(entry)
        except (BenchError, OSError) as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            report["error"] = str(exc)
            status = 1
        finally:
            broker.stop()
    summary: dict[str, Any] = {"zmq_msg_s": _median(zmq_rates)}
    if native_rates:
        summary["native_msg_s"] = _median(native_rates)
        summary["ratio"] = _median(ratios)
    print(
        f"[throughput] median of {len(zmq_rates)}: zmq {summary['zmq_msg_s']:,.0f} msg/s"
        + (
            f", native {summary['native_msg_s']:,.0f} msg/s, ratio {summary.get('ratio', 0):.2f}"
            if native_rates
            else ""
        ),
        flush=True,
    )
    if not args.no_codec:
        cases = {
            "small 3x64B": [b"a" * PART] * PARTS,
            "large 1x1MiB": [b"b" * (1 << 20)],
        }
        codec: dict[str, dict[str, float]] = {}
        for name, frames in cases.items():
            runs = [bench_codec(frames, args.codec_seconds) for _ in range(args.runs)]
            med = {k: _median([r[k] for r in runs]) for k in runs[0]}
            codec[name] = med
            print(
                f"[codec] {name}: encode {med['encode_msg_s']:,.0f} msg/s "
                f"{med['encode_mb_s']:,.1f} MB/s; decode {med['decode_msg_s']:,.0f} msg/s "
                f"{med['decode_mb_s']:,.1f} MB/s",
                flush=True,
            )
        summary["codec"] = codec
    report["summary"] = summary
    report["load_after"] = os.getloadavg()
    print(f"load average before {report['load_before']}, after {report['load_after']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
