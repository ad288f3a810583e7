"""Native against our MQTT with big payloads, per message (issue 16): one VibeMQ, no peers.

The cases of ``bench.large_bench`` (the same load generator, payloads, window and native
prefetch) alternating on one broker, and per message delivered: the broker's read and write
system calls and bytes beyond the payload (``/proc/PID/io``: syscr, syscw, rchar, wchar)
and its minor page faults (``/proc/PID/stat``: minflt) besides its CPU per MB, and that CPU
a message in user space and in the kernel (utime, stime; sampled at the clock tick), and its
RSS a second after the round (what the allocator kept of the burst); and the publisher's
and the subscriber's CPU a message, user and kernel (the load generators share the cores
with the broker). ``--checkout DIR`` runs the broker from another checkout (``PYTHONPATH``),
e.g. one compiled broker under two versions of the generators.
``--perf PREFIX`` records the broker (``perf record -g``) during each protocol's last round
into ``PREFIX-native.data`` / ``PREFIX-mqtt.data``, to compare
where each spends (``perf report -i ... --no-children --sort dso,sym -g none``).
``--strace PREFIX`` instead runs each protocol on a broker of its own launched under
``strace -f -c -e trace=memory`` (attaching to a running one does not work here) and
writes its counts of mmap, munmap, brk ... into ``PREFIX-PROTO.txt`` when it stops
(``--strace-calls all``: every system call). ``--callgrind PREFIX`` runs each protocol twice
on a broker of its own under ``valgrind --tool=callgrind`` (a fifth of ``--messages``, then
all of them; ``PREFIX-PROTO-N.out``) and prints the broker's user-space instructions a
message (the difference of the two totals over the difference of the counts: start-up and
shutdown cancel out): everything the broker runs for a message, transport, uvloop and the
allocator included, where ``bench.native_micro`` and ``bench.mqtt_route_cost`` count the
sessions' ``data_received`` only. (Valgrind hides AVX-512: the JSON check is counted on its
AVX2 path.) With ``--cache-sim`` callgrind simulates this VM's caches too (``CACHE_SIM``) and
each protocol's simulated L1d and L2 misses a message are printed (the kernel's copies are
not simulated).

    .venv/bin/python -m bench.large_profile --size 1048576 --messages 2000 --rounds 3
    .venv/bin/python -m bench.large_profile --size 65536 --messages 20000 --perf /tmp/p64
    .venv/bin/python -m bench.large_profile --size 1048576 --messages 500 --rounds 1 \
        --strace /tmp/s1m
    .venv/bin/python -m bench.large_profile --size 1048576 --messages 200 --callgrind /tmp/c1m
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Final

from bench.brokers import REPO, VibeMQBroker
from bench.common import Driver, run_throughput
from bench.large_bench import VIBEMQ_LIMITS
from bench.mqtt_driver import MqttDriver
from bench.vibemq_driver import VibeDriver

_IO_KEYS = ("rchar", "wchar", "syscr", "syscw")
_KEYS = (*_IO_KEYS, "minflt", "utime", "stime")
_TICK = os.sysconf("SC_CLK_TCK")


def io_counts(pids: list[int]) -> dict[str, int]:
    """The processes' read/write calls and bytes so far (``/proc/PID/io``)."""
    out = dict.fromkeys(_KEYS, 0)
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/io").read_text()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in out:
                out[key] += int(value)
        # (fields after the command's closing parenthesis: minflt is the 10th of stat,
        # utime and stime the 14th and 15th)
        fields = stat.rpartition(")")[2].split()
        out["minflt"] += int(fields[7])
        out["utime"] += int(fields[11])
        out["stime"] += int(fields[12])
    return out


def driver(proto: str, broker: VibeMQBroker, size: int, prefetch: int) -> Driver:
    if proto == "native":
        return VibeDriver(
            broker.host, broker.port, "bench-large", prefetch, size, durable=False, name="vibemq"
        )
    return MqttDriver(broker.host, broker.mqtt_port, "bench/large", size, "vibemq")


def rss_mib(broker: VibeMQBroker) -> float:
    """The broker's resident set at rest (a moment after a round: what the allocator kept)."""
    time.sleep(1.0)
    return (broker.rss_kib() or 0) / 1024


def start_broker(
    strace: str | None, proto: str, calls: str = "memory", checkout: str | None = None
) -> VibeMQBroker:
    """A broker with the bench's limits (``checkout``'s modules: ``PYTHONPATH``); under
    ``strace -c`` (the system calls of the class ``calls``) into ``STRACE-PROTO.txt``."""
    env = dict(VIBEMQ_LIMITS)
    if checkout is not None:
        env["PYTHONPATH"] = checkout
    if strace is None:
        broker = VibeMQBroker(mqtt=True, env=env)
    else:
        env.setdefault("PYTHONPATH", str(REPO))  # (as start() sets it for its own command)
        out = f"{strace}-{proto}.txt"
        command = ["strace", "-f", "-c", "-e", f"trace={calls}", "-o", out]
        broker = VibeMQBroker([*command, *VibeMQBroker.default_command()], mqtt=True, env=env)
    broker.start()
    return broker


#: ``--cache-sim``: callgrind's simulated caches, this VM's (lscpu): L1d 48 KiB 12-way, and
#: as the "last level" the 1 MiB L2 a core has (not the shared 32 MiB L3, which holds a
#: window of 64 KiB payloads whole): a miss there is what makes a copy wait here
CACHE_SIM: Final = ("--cache-sim=yes", "--D1=49152,12,64", "--LL=1048576,16,64")


def callgrind_totals(path: str) -> tuple[list[str], list[int]]:
    """The events a callgrind output file counts and their totals (``events:``, ``totals:``)."""
    events: list[str] = []
    for line in Path(path).read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("totals:"):
            return events, [int(v) for v in line.split()[1:]]
    raise ValueError(f"{path}: no totals line")


def callgrind_costs(
    prefix: str,
    size: int,
    messages: int,
    prefetch: int,
    window: int,
    batch: int,
    cache_sim: bool = False,
) -> None:
    """Each protocol's broker user-space instructions a message (see the docstring); with
    ``cache_sim`` also its simulated cache misses a message (``CACHE_SIM``)."""
    env = dict(VIBEMQ_LIMITS, PYTHONPATH=str(REPO))
    for proto in ("native", "mqtt"):
        counts = (max(1, messages // 5), messages)
        totals = []
        for n in counts:
            out = f"{prefix}-{proto}-{n}.out"
            command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
            if cache_sim:
                command += CACHE_SIM
            broker = VibeMQBroker([*command, *VibeMQBroker.default_command()], mqtt=True, env=env)
            broker.start(timeout=600)  # (start-up under valgrind takes tens of seconds)
            try:
                load = driver(proto, broker, size, prefetch)
                res = run_throughput(load, n, window=window, batch=batch, timeout=900)
            finally:
                broker.stop(grace=300)  # (callgrind writes its file at exit)
            if res.errors or res.delivered != n:
                raise SystemExit(f"{proto}: {res.delivered} of {n} delivered {res.errors}")
            events, total = callgrind_totals(out)
            totals.append(total)
        per = [(b - a) / (counts[1] - counts[0]) for a, b in zip(*totals, strict=True)]
        print(
            f"{proto:6} {size:>8} B: {per[0]:,.0f} instructions a message (callgrind)", flush=True
        )
        if cache_sim:
            misses = ", ".join(
                f"{e} {v:,.0f}" for e, v in zip(events, per, strict=True) if e != "Ir"
            )
            print(f"{proto:6} {size:>8} B: a message {misses}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024 * 1024)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-bytes", type=int, default=8 * 1024 * 1024)
    parser.add_argument("--native-prefetch", type=int, default=1000, help="as large_bench's")
    parser.add_argument("--perf", help="perf record the last round into PREFIX-PROTO.data")
    parser.add_argument(
        "--strace", help="each protocol on a broker under strace -c: PREFIX-PROTO.txt"
    )
    parser.add_argument("--strace-calls", default="memory", help="strace's -e trace= class")
    parser.add_argument(
        "--callgrind", help="each protocol's broker under callgrind: instructions a message"
    )
    parser.add_argument(
        "--cache-sim",
        action="store_true",
        help="with --callgrind: simulated L1d and L2 misses a message too (CACHE_SIM)",
    )
    parser.add_argument(
        "--checkout", help="run the broker from this checkout (PYTHONPATH), e.g. a baseline"
    )
    args = parser.parse_args(argv)
    size = args.size
    window = max(2, min(1000, args.window_bytes // size))
    batch = max(1, min(100, 64 * 1024 // size))
    prefetch = args.native_prefetch or window
    if args.callgrind:
        callgrind_costs(
            args.callgrind, size, args.messages, prefetch, window, batch, args.cache_sim
        )
        return 0
    broker = None if args.strace else start_broker(None, "", checkout=args.checkout)
    try:
        for r in range(args.rounds):
            order = ("native", "mqtt") if r % 2 == 0 else ("mqtt", "native")
            for proto in order:
                own = (
                    None
                    if broker
                    else start_broker(args.strace, proto, args.strace_calls, args.checkout)
                )
                used = broker or own
                assert used is not None
                try:
                    run_one(args, proto, used, size, prefetch, window, batch, r)
                finally:
                    if own is not None:
                        own.stop()
    finally:
        if broker is not None:
            broker.stop()
    return 0


def run_one(
    args: argparse.Namespace,
    proto: str,
    broker: VibeMQBroker,
    size: int,
    prefetch: int,
    window: int,
    batch: int,
    r: int,
) -> None:
    """One protocol's round on ``broker``, its line printed."""
    pids = broker.pids()
    perf = None
    if args.perf and r == args.rounds - 1:
        out = f"{args.perf}-{proto}.data"
        target = ",".join(map(str, pids))
        perf = subprocess.Popen(
            ["perf", "record", "-F", "1999", "-g", "-o", out, "-p", target],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)  # (attached before the run starts)
    before = io_counts(pids)
    res = run_throughput(
        driver(proto, broker, size, prefetch),
        args.messages,
        window=window,
        batch=batch,
        timeout=120,
        broker_pids=broker.pids,
    )
    after = io_counts(pids)
    if perf is not None:
        perf.send_signal(signal.SIGINT)
        perf.wait()
    n = res.delivered or 1

    def us(seconds: float) -> str:
        return f"{seconds * 1e6 / n:.0f}"

    per = {k: (after[k] - before[k]) / n for k in _KEYS}
    cpu = res.broker_cpu_s or 0.0
    print(
        f"{proto:6} {size:>8} B: {res.deliver_rate:9,.0f} msg/s, broker "
        f"{cpu * 1000 / (n * size / 1e6):.3f} ms CPU/MB; per message: reads "
        f"{per['syscr']:.2f}, writes {per['syscw']:.2f}, bytes read beyond the "
        f"payload {per['rchar'] - size:+.0f}, written {per['wchar'] - size:+.0f}, "
        f"minor faults {per['minflt']:.1f}, CPU µs user {per['utime'] * 1e6 / _TICK:.0f} "
        f"system {per['stime'] * 1e6 / _TICK:.0f}; RSS after it {rss_mib(broker):.0f} MiB; "
        f"clients' CPU µs a message: publisher {us(res.publisher_user_s)} user "
        f"{us(res.publisher_sys_s)} system, subscriber {us(res.subscriber_user_s)} user "
        f"{us(res.subscriber_sys_s)} system",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
