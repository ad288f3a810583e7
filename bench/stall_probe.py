"""Issue 15: is a slow 1 -> 1 round a stall in the broker, or CPU-bound?

One broker (transient queues, MQTT listener on; ``--fsync always`` as ``paths_bench`` runs
it with ``--fsync``), then ``--rounds`` rounds of ``build_ab``'s paths
(``common.run_throughput``: window 1,000, batch 100, prefetch 1,000). During each run's
timed interval (the publisher's first write to its last ack) a thread reads, every
``--interval`` seconds, the state of the broker's process and of the two generator
processes (``/proc/PID/stat``: R running or waiting for a CPU, S/D asleep), and around the
interval the broker's ``schedstat`` (time on a CPU, time waiting for one). Printed per run:
the broker's share of the interval on a CPU, waiting for one and asleep, and the share of
samples with all three processes asleep. A stall (the broker idle while the window is not
full: a liveness bug) shows as all three asleep; a broker asleep while a generator runs is
generator-bound; a broker waiting for a CPU is the cores' load.

    .venv/bin/python -m bench.stall_probe --rounds 5 --messages 200000 --fsync

Nothing here asserts on anything.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import VibeMQBroker
from bench.build_ab import run_path
from bench.common import install_sigterm_exit
from bench.sock_counts import run_args

ASLEEP = frozenset("SDI")
HEADS = ("on CPU", "waiting", "asleep", "stalled")


def _stat(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command (field 3 first), or [] if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return []


def schedstat(pid: int) -> tuple[int, int]:
    """(ns on a CPU, ns waiting for one), summed over the process's threads."""
    run = wait = 0
    for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            on_cpu, waiting, _ = path.read_text().split()
        except (OSError, ValueError):
            continue
        run += int(on_cpu)
        wait += int(waiting)
    return run, wait


def children(parent: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat(int(name))) and int(fields[1]) == parent:
            out.append(int(name))
    return out


class Sampler(threading.Thread):
    """Counts, while ``active``, the samples where the broker and both generators exist and
    how many of them found the broker asleep, and all three asleep."""

    def __init__(self, broker_pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.broker_pid, self.interval = broker_pid, interval
        self.active = False
        self.stopped = False
        self.samples = self.broker_asleep = self.all_asleep = 0

    def reset(self) -> None:
        self.samples = self.broker_asleep = self.all_asleep = 0

    def run(self) -> None:
        me = os.getpid()
        kids: list[int] = []
        while not self.stopped:
            time.sleep(self.interval)
            if not self.active:
                kids = []
                continue
            if len(kids) < 2:  # (the run's publisher and subscriber, once)
                kids = [k for k in children(me) if k != self.broker_pid]
                continue
            states = [_stat(pid)[:1] for pid in (self.broker_pid, *kids)]
            if all(states):
                self.samples += 1
                asleep = [s[0] in ASLEEP for s in states]
                self.broker_asleep += asleep[0]
                self.all_asleep += all(asleep)


def main(argv: list[str] | None = None) -> int:
    p = run_args(__doc__, 5, 200_000)
    p.add_argument("--interval", type=float, default=0.002, help="seconds between samples")
    p.add_argument("--fsync", action="store_true", help="the broker with --fsync always")
    a = p.parse_args(argv)
    paths = [x.strip() for x in a.paths.split(",") if x.strip()]
    install_sigterm_exit()
    env = {"VIBEMQ_QUEUE_DEFAULTS__DURABLE": "false", "PYTHONPATH": str(a.checkout.resolve())}
    broker = VibeMQBroker(extra_args=["--fsync", "always"] if a.fsync else [], env=env, mqtt=True)
    broker.start()
    broker_pid = broker.main_pid or 0
    sampler = Sampler(broker_pid, a.interval)
    sampler.start()
    start: list[int] = []
    split: list[float] = []

    def timed(begin: bool) -> None:
        now = [time.monotonic_ns(), *schedstat(broker_pid)]
        if begin:
            start[:] = now
        else:
            wall, run, wait = (y - x for x, y in zip(start, now, strict=True))
            split[:] = [run / wall, wait / wall, (wall - run - wait) / wall]
        sampler.active = begin

    rows: dict[str, list[list[float]]] = {}
    try:
        for n in range(a.rounds):
            # the paths' order rotates so that none always goes first
            for path in paths[n % len(paths) :] + paths[: n % len(paths)]:
                sampler.reset()
                split[:] = [0.0, 0.0, 0.0]
                r = run_path(path, broker, a.messages, a.timeout, timed=timed)
                stalled = sampler.all_asleep / max(1, sampler.samples)
                rows.setdefault(path, []).append([r.deliver_rate, *split, stalled])
                print(
                    f"round {n + 1} {path:6} {r.deliver_rate:9,.0f} msg/s; broker on a CPU "
                    f"{split[0]:.0%}, waiting for one {split[1]:.0%}, asleep {split[2]:.0%}; "
                    f"all three asleep in {sampler.all_asleep} of {sampler.samples} samples "
                    f"{r.errors or ''}",
                    flush=True,
                )
    finally:
        sampler.stopped = True
        broker.stop()
    print(f"\n{'(medians)':8} {'msg/s':>9}" + "".join(f"{h:>8}" for h in HEADS))
    for path, runs in rows.items():
        m = [statistics.median(run[i] for run in runs) for i in range(5)]
        print(f"{path:8} {m[0]:9,.0f}" + "".join(f"{x:8.1%}" for x in m[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
