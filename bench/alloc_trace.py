"""Which memory a large payload's copy writes: the broker's allocations traced (issue 16).

A 64 KiB payload's one copy costs ~0.85 µs into a block written within the last MiB and
1.6-3.5 µs into an older one (``bench.payload_copy_micro``). This says which the broker
gets: uprobes on the C library's ``malloc``, ``realloc`` and ``free`` (``perf probe``, added
under the group ``vibemq_alloc`` and deleted again at the end), ``perf record`` of the
broker over ``--messages`` of ``large_bench``'s 1 -> 1 load after ``--warmup`` more, each
protocol on a broker of its own. Then, at each payload's allocation (blocks of the payload's
size plus ``bytes``' 33): how many payload blocks were live (allocated, not freed yet), and
how many MiB of large blocks (4 KiB or more) had been allocated since that memory was last
handed out, i.e. how long ago it was written. It counts, it does not time: a loaded
machine changes the regime the broker runs in (docs/performance.md, "Fourteenth round,
native at 64 KiB"), not what is counted in it. Needs root (uprobes) and ``perf``.

    .venv/bin/python -m bench.alloc_trace
    .venv/bin/python -m bench.alloc_trace --protocols native --messages 3000 --out /tmp/at
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import VibeMQBroker
from bench.common import run_throughput
from bench.large_bench import VIBEMQ_LIMITS
from bench.large_profile import driver

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
GROUP = "vibemq_alloc"
#: (event, probe): the size asked for and the address given back, and the address freed
PROBES = (
    ("malloc", "malloc sz=%di:u64"),
    ("malloc_ret", "malloc%return ret=$retval"),
    ("realloc", "realloc ptr=%di:u64 sz=%si:u64"),
    ("realloc_ret", "realloc%return ret=$retval"),
    ("free", "free ptr=%di:u64"),
)
#: a "large" block: what the distance since a block's memory was last handed out counts
LARGE = 4096
_EVENT = re.compile(rf"{GROUP}:(\w+): \(\w+(?: <- \w+)?\) (.*)$")


def add_probes() -> None:
    for name, spec in PROBES:
        subprocess.run(
            ["perf", "probe", "-q", "-x", LIBC, "--add", f"{GROUP}:{name}={spec}"], check=True
        )


def delete_probes() -> None:
    subprocess.run(["perf", "probe", "-q", "--del", f"{GROUP}:*"], check=False)


def events(path: str) -> Iterator[tuple[str, dict[str, str]]]:
    """(event, its arguments) of a recording, in order."""
    out = subprocess.run(["perf", "script", "-i", path], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        m = _EVENT.search(line)
        if m is not None:
            yield m.group(1), dict(kv.split("=", 1) for kv in m.group(2).split())


def analyse(path: str, size: int) -> str:
    """At each payload block's allocation: the payload blocks live, and the MiB of large
    blocks allocated since its memory was last handed out (see the docstring)."""
    block = size + 33  # (a bytes object's header and trailing NUL)
    pending: int | None = None
    live: dict[int, int] = {}
    handed: list[tuple[int, int, int]] = []  # (start, end, large bytes allocated before it)
    allocated = 0
    depths: list[int] = []
    ages: list[int] = []
    # payload blocks freed in a row (no large block allocated between): the Acks of one
    # read of the subscriber's, 4 a turn in lockstep at 64 KiB, dozens once it fell behind
    runs: list[int] = []
    run = 0
    before_read = 0  # runs the next large allocation after which is a read's (larger) block
    for event, args in events(path):
        if event == "free":
            if live.pop(int(args["ptr"]), None) == block:
                run += 1
        elif event in ("malloc", "realloc"):
            if event == "realloc":
                live.pop(int(args["ptr"]), None)
            pending = int(args["sz"])
        elif pending is not None:  # (the return of the call just seen)
            n, pending = pending, None
            addr = int(args["ret"], 16)
            if n < LARGE:
                continue
            if run:
                runs.append(run)
                before_read += n > block
                run = 0
            if n == block:
                depths.append(len(live))
                live[addr] = n
                for start, end, before in reversed(handed[-5000:]):
                    if start < addr + n and addr < end:
                        ages.append(allocated - before)
                        break
            handed.append((addr, addr + n, allocated))
            allocated += n
    if not depths:
        return "no payload blocks seen"
    depths.sort()
    ages.sort()
    runs.sort()

    def at(values: list[int], q: float) -> int:
        return values[min(len(values) - 1, int(len(values) * q))]

    mib = 1024 * 1024
    return (
        f"{len(depths)} payload blocks; live at each: median {at(depths, 0.5)}, p90 "
        f"{at(depths, 0.9)}, 8 or fewer at {100 * sum(d <= 8 for d in depths) / len(depths):.0f} %"
        f"; MiB since its memory was last handed out: p10 {at(ages, 0.1) / mib:.2f}, median "
        f"{at(ages, 0.5) / mib:.2f}, p90 {at(ages, 0.9) / mib:.2f}, under 1 MiB "
        f"{100 * sum(a < mib for a in ages) / max(1, len(ages)):.0f} %; freed in a row: median "
        f"{at(runs or [0], 0.5)}, p90 {at(runs or [0], 0.9)}, max {max(runs or [0])}, in runs"
        f" of more than 8: {100 * sum(r for r in runs if r > 8) / max(1, sum(runs)):.0f} %, runs"
        f" right before a read's block: {100 * before_read / max(1, len(runs)):.0f} %"
    )


def trace(proto: str, args: argparse.Namespace) -> str:
    """One protocol's broker recorded over ``args.messages``; the recording's path."""
    window = max(2, min(1000, 8 * 1024 * 1024 // args.size))
    broker = VibeMQBroker(mqtt=True, env=dict(VIBEMQ_LIMITS))
    broker.start()
    out = f"{args.out}-{proto}.data"
    try:
        load = driver(proto, broker, args.size, args.native_prefetch)
        run_throughput(load, args.warmup, window=window, batch=1, timeout=120)
        target = ",".join(map(str, broker.pids()))
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-e", f"{GROUP}:*", "-p", target, "-o", out],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # (attached before the run starts)
        load = driver(proto, broker, args.size, args.native_prefetch)
        res = run_throughput(load, args.messages, window=window, batch=1, timeout=120)
        perf.send_signal(signal.SIGINT)
        perf.wait()
        if res.errors or res.delivered != args.messages:
            raise SystemExit(f"{proto}: {res.delivered} of {args.messages} {res.errors}")
    finally:
        broker.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--protocols", default="native,mqtt")
    parser.add_argument("--native-prefetch", type=int, default=1000, help="as large_bench's")
    parser.add_argument("--out", default="/tmp/alloc-trace", help="PREFIX-PROTO.data")
    args = parser.parse_args(argv)
    delete_probes()  # (left over from an interrupted run)
    add_probes()
    try:
        paths = [(proto, trace(proto, args)) for proto in args.protocols.split(",")]
    finally:
        delete_probes()
    for proto, path in paths:
        print(f"{proto:6} {args.size:>8} B: {analyse(path, args.size)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
