"""Two builds of the broker side by side: native and our MQTT QoS 1, 1 -> 1 with acks.

One ``vibemq-server`` per checkout given (its modules imported from there: ``PYTHONPATH``),
all started at once, transient queues; then ``--rounds`` rounds, each running every path on
every broker in turn (``common.run_throughput``: window 1,000, batch 100, prefetch 1,000),
and the median deliveries/s and the broker's CPU per message (summed over the rounds / their
deliveries: ``common.cpu_us_per_message``). Every broker has its MQTT listener on and the
native queues are named as ``bench.paths_bench`` names them (``vibemq_driver.path_queue``), so
that the two benches measure the native paths alike. On a busy machine what matters
is the comparison inside one run: the pure and the compiled build (``scripts/compile.py`` in
one of the checkouts) meet the same load at the same time.

    git worktree add /tmp/pure HEAD            # (or: git archive HEAD | tar -x -C /tmp/pure)
    .venv/bin/python scripts/compile.py         # this checkout: compiled
    .venv/bin/python -m bench.build_ab /tmp/pure . --rounds 5

``--paths native,durable`` adds the native path on a durable queue (each broker runs
``--fsync always``; the transient paths are not journaled either way) and prints the ratio
durable / transient per checkout (issue 15's goal: at least 0.5x).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import VibeMQBroker
from bench.common import (
    Driver,
    ThroughputResult,
    cpu_us_per_message,
    install_sigterm_exit,
    run_throughput,
)
from bench.mqtt_driver import MqttDriver
from bench.vibemq_driver import VibeDriver, path_queue

PATHS = ("native", "mqtt", "durable")


def driver(path: str, broker: VibeMQBroker, prefetch: int) -> Driver:
    if path == "mqtt":
        tag = uuid.uuid4().hex[:8]
        return MqttDriver(broker.host, broker.mqtt_port, f"b/{tag}", name="vibemq-mqtt")
    durable = path == "durable"
    return VibeDriver(broker.host, broker.port, path_queue(durable), prefetch, durable=durable)


def run_path(
    path: str,
    broker: VibeMQBroker,
    messages: int,
    timeout: float,
    prefetch: int = 1000,
    broker_pids: Callable[[], list[int]] | None = None,
    timed: Callable[[bool], None] | None = None,
) -> ThroughputResult:
    """One 1 -> 1 run of ``path`` with acks: window 1,000 and batches of 100 for every path."""
    return run_throughput(
        driver(path, broker, prefetch),
        messages,
        window=1000,
        batch=100,
        timeout=timeout,
        broker_pids=broker_pids,
        timed=timed,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("checkouts", nargs="+", type=Path, help="a checkout per broker")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--paths", default="native,mqtt", help=f"comma list of {', '.join(PATHS)}")
    a = p.parse_args(argv)
    paths = [x.strip() for x in a.paths.split(",") if x.strip()]
    if bad := set(paths) - set(PATHS):
        p.error(f"unknown paths {sorted(bad)}")
    install_sigterm_exit()
    brokers: dict[str, VibeMQBroker] = {}
    # (deliveries/s, broker CPU s, deliveries) a run
    results: dict[tuple[str, str], list[tuple[float, float | None, int]]] = {}
    try:
        for i, checkout in enumerate(a.checkouts):
            top = str(checkout.resolve())
            label = top if top not in brokers else f"{top} #{i + 1}"  # the same one twice
            env = {"VIBEMQ_QUEUE_DEFAULTS__DURABLE": "false", "PYTHONPATH": top}
            fsync = ["--fsync", "always"] if "durable" in paths else []
            # the MQTT listener on whatever the paths, as in a deployed broker and in
            # bench.paths_bench: every native publish is also offered to MQTT's address sink
            broker = VibeMQBroker(extra_args=fsync, env=env, mqtt=True)
            broker.start()
            brokers[label] = broker
        for n in range(a.rounds):
            for top, broker in brokers.items():
                for path in paths:
                    r = run_path(
                        path, broker, a.messages, a.timeout, a.prefetch, broker_pids=broker.pids
                    )
                    us = (r.broker_cpu_s or 0.0) / max(1, r.delivered) * 1e6
                    run = (r.deliver_rate, r.broker_cpu_s, r.delivered)
                    results.setdefault((top, path), []).append(run)
                    print(
                        f"round {n + 1} {path:6} {top}: {r.deliver_rate:,.0f} msg/s {us:.1f} us/msg"
                    )
    finally:
        for broker in brokers.values():
            broker.stop()
    print(f"\n{'checkout':50} {'path':6} {'msg/s':>9} {'us/msg':>7}  (medians; us/msg: summed)")
    for (top, path), runs in results.items():
        rate = statistics.median(x for x, _, _ in runs)
        us = cpu_us_per_message((cpu, n) for _, cpu, n in runs) or 0.0
        print(f"{top:50} {path:6} {rate:9,.0f} {us:7.2f}")
    if {"native", "durable"} <= set(paths):
        for top in brokers:
            ratios = [
                d[0] / n[0]
                for n, d in zip(results[(top, "native")], results[(top, "durable")], strict=True)
            ]
            each = ", ".join(f"{r:.2f}" for r in ratios)
            print(
                f"{top}: durable / transient {statistics.median(ratios):.2f}x "
                f"(median of the rounds' ratios: {each})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
