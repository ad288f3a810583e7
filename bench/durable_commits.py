"""Group commit as the durable bench drives it: fsyncs per second, messages per fsync, and
broker CPU per message, for one or more checkouts side by side (issue 15).

One ``vibemq-server --fsync always`` per checkout (its modules from there: ``PYTHONPATH``),
started at once; each round runs native 1 -> 1 on a durable queue (window 1,000, batch 100,
prefetch 1,000: ``common.run_throughput``, as ``build_ab --paths durable``) on every broker in
turn, and reads the journal's fsync count and the bytes written from the broker's /metrics
before and after; then the round trip of one message at a time (``common.run_latency``, as
``paths_bench``'s latency: publish, delivery, ack, PublishAck), p50 and p99. Medians over the
rounds.

    python -m bench.durable_commits /tmp/base . --rounds 5
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import urllib.request
import uuid
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import VibeMQBroker
from bench.common import install_sigterm_exit, run_latency, run_throughput
from bench.vibemq_driver import VibeDriver

_FSYNCS = re.compile(r"^vibemq_journal_fsync_duration_seconds_count (\S+)$", re.M)
_FSYNC_SUM = re.compile(r"^vibemq_journal_fsync_duration_seconds_sum (\S+)$", re.M)


def _journal(broker: VibeMQBroker) -> tuple[float, float]:
    """(fsyncs so far, seconds spent in them) from the broker's /metrics."""
    assert broker.tmp is not None, "not started"
    http = json.loads((broker.tmp / "ready.json").read_text())["http"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10).read().decode()
    count, total = _FSYNCS.search(text), _FSYNC_SUM.search(text)
    assert count is not None and total is not None, "no journal metrics"
    return float(count.group(1)), float(total.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("checkouts", nargs="+", type=Path, help="a checkout per broker")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--samples", type=int, default=2000, help="round trips per round")
    p.add_argument("--timeout", type=float, default=120.0)
    a = p.parse_args(argv)
    install_sigterm_exit()
    brokers: dict[str, VibeMQBroker] = {}
    rows: dict[str, list[tuple[float, ...]]] = {}
    try:
        for checkout in a.checkouts:
            top = str(checkout.resolve())
            env = {"VIBEMQ_QUEUE_DEFAULTS__DURABLE": "false", "PYTHONPATH": top}
            broker = VibeMQBroker(extra_args=["--fsync", "always"], env=env)
            broker.start()
            brokers[top] = broker
        for n in range(a.rounds):
            for top, broker in brokers.items():
                drv = VibeDriver(
                    broker.host, broker.port, f"dc-{uuid.uuid4().hex[:8]}", 1000, durable=True
                )
                f0, s0 = _journal(broker)
                r = run_throughput(
                    drv,
                    a.messages,
                    window=1000,
                    batch=100,
                    timeout=a.timeout,
                    broker_pids=broker.pids,
                )
                f1, s1 = _journal(broker)
                fsyncs = max(1.0, f1 - f0)
                secs = a.messages / max(1.0, r.deliver_rate)
                us = (r.broker_cpu_s or 0.0) / max(1, r.delivered) * 1e6
                row: tuple[float, ...] = (
                    r.deliver_rate,
                    us,
                    fsyncs / secs,
                    a.messages / fsyncs,
                    (s1 - s0) / fsyncs * 1e3,
                )
                qname = f"dl-{uuid.uuid4().hex[:8]}"
                lat = run_latency(
                    VibeDriver(broker.host, broker.port, qname, 1000, durable=True),
                    a.samples,
                    timeout=a.timeout,
                )
                row = (*row, lat.p50_us, lat.p99_us)
                rows.setdefault(top, []).append(row)
                print(
                    f"round {n + 1} {top}: {row[0]:,.0f} msg/s {row[1]:.1f} us/msg "
                    f"{row[2]:,.0f} fsyncs/s {row[3]:.0f} msg/fsync {row[4]:.2f} ms/fsync "
                    f"latency p50 {row[5]:.0f} us p99 {row[6]:.0f} us {lat.errors or ''}",
                    flush=True,
                )
    finally:
        for broker in brokers.values():
            broker.stop()
    head = f"{'msg/s':>9} {'us/msg':>7} {'fsync/s':>8} {'msg/fsync':>9} {'ms/fsync':>8}"
    print(f"\n{'checkout':40} {head} {'p50 us':>7} {'p99 us':>7}  (medians)")
    for top, runs in rows.items():
        m = [statistics.median(x[i] for x in runs) for i in range(7)]
        print(
            f"{top:40} {m[0]:9,.0f} {m[1]:7.1f} {m[2]:8,.0f} {m[3]:9.0f} {m[4]:8.2f} "
            f"{m[5]:7.0f} {m[6]:7.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
