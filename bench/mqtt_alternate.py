"""One ``bench.mqtt_bench`` scenario on several brokers at once, in alternating rounds.

``mqtt_bench`` measures one broker after the other, so on a busy machine a change in load
between them decides the ratio. Here every broker is started first (one VibeMQ per checkout
given, its modules imported from there: ``PYTHONPATH``; Mosquitto with ``--mosquitto``), then
each round runs the scenario once on every broker, the order reversed every other round, and
reads each broker's CPU (user + system, its whole process group) around its run. Reported:
the medians of deliveries/s and of broker CPU per message (the steadier figure under load:
it does not count the time a broker waited for a core).

    .venv/bin/python -m bench.mqtt_alternate . --mosquitto --scenario v5-shared4 --rounds 5
    git archive main | tar -x -C /tmp/before          # (plus its compiled .so, if any)
    .venv/bin/python -m bench.mqtt_alternate /tmp/before . --mosquitto --rounds 5
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import Broker, MosquittoBroker, VibeMQBroker
from bench.common import cpu_seconds, install_sigterm_exit

REPO = Path(__file__).resolve().parent.parent
_RESULT = re.compile(r"\] \S+\s+([\d,]+) deliveries/s\s+([\d,]+)/")


def run_once(port: int, scenario: str, messages: int, warmup: int) -> tuple[float, int]:
    """One run of ``scenario`` against the broker on ``port``: (deliveries/s, deliveries)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.mqtt_bench",
            "--target",
            f"127.0.0.1:{port}",
            "--scenarios",
            scenario,
            "--runs",
            "1",
            "--samples",
            "0",
            "--warmup",
            str(warmup),
            "--messages",
            str(messages),
            "--fanout-messages",
            str(messages),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    ).stdout
    found = _RESULT.search(out)
    if found is None:
        raise RuntimeError(f"no result from mqtt_bench:\n{out[-2000:]}")
    return float(found.group(1).replace(",", "")), int(found.group(2).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("checkouts", nargs="*", type=Path, help="a VibeMQ checkout per broker")
    p.add_argument("--mosquitto", action="store_true", help="Mosquitto too")
    p.add_argument("--scenario", default="v5-shared4", help="a bench.mqtt_bench scenario")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--messages", type=int, default=100_000, help="published a run")
    p.add_argument("--warmup", type=int, default=2000, help="QoS 0 messages first, each run")
    a = p.parse_args(argv)
    install_sigterm_exit()
    brokers: dict[str, tuple[Broker, int]] = {}
    results: dict[str, list[tuple[float, float]]] = {}
    try:
        for checkout in a.checkouts:
            top = str(checkout.resolve())
            vibemq = VibeMQBroker(env={"PYTHONPATH": top}, mqtt=True)
            vibemq.start()
            brokers[top] = (vibemq, vibemq.mqtt_port)
        if a.mosquitto:
            mosquitto = MosquittoBroker()
            mosquitto.start()
            brokers["mosquitto"] = (mosquitto, mosquitto.port)
        results = {name: [] for name in brokers}
        for n in range(a.rounds):
            names = list(brokers) if n % 2 == 0 else list(brokers)[::-1]
            for name in names:
                broker, port = brokers[name]
                pids = broker.pids()
                before = cpu_seconds(pids)
                rate, count = run_once(port, a.scenario, a.messages, a.warmup)
                # (the warm-up's messages are in the CPU too, alike for every broker)
                us = (cpu_seconds(pids) - before) * 1e6 / max(1, count)
                results[name].append((rate, us))
                print(
                    f"round {n + 1} {name:40} {rate:10,.0f} deliveries/s  broker {us:5.2f} µs/msg",
                    flush=True,
                )
    finally:
        for broker, _ in brokers.values():
            broker.stop()
    print(f"{a.scenario}, {a.rounds} rounds, load average {os.getloadavg()[0]:.1f}")
    for name, runs in results.items():
        if runs:
            rate = statistics.median(r for r, _ in runs)
            us = statistics.median(u for _, u in runs)
            print(f"{name:40} median {rate:10,.0f} deliveries/s  broker {us:5.2f} µs/msg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
