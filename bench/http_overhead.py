"""What the management HTTP listener costs the message paths (issue 14).

Three broker setups, each a fresh ``vibemq-server`` process with MQTT on, measured in
``--rounds`` alternating rounds (the order rotates each round, so none always goes first):

* ``off``: ``--no-http``;
* ``idle``: the listener on, nobody asking;
* ``scraped``: the listener on and a client fetching ``/metrics`` and ``/api/overview`` once a
  second (what a Prometheus server and an open dashboard do) for the whole measurement.

In each, the native protocol's 1 -> 1 throughput with acks (``bench.vibemq_bench``) and MQTT
QoS 1 1 -> 1 (``bench.mqtt_bench``) run against the same broker. Reported: medians per setup
and the ratios idle/off and scraped/off (the goal: within 5 %), the broker's CPU per message
over each whole run (steadier than rates on a shared machine; the scraped runs include the
scrapes' own cost), the scrapes made and the slowest one. Then, unless
``--scrape-queues 0``, one broker with that many queues (10,000 by default, created over the
native protocol) is scraped over real HTTP: ``/metrics``, ``/api/overview`` and
``/api/queues`` (a page of 100), each ``--scrape-runs`` times, median and slowest (the goal:
under a second).

    .venv/bin/python -m bench.http_overhead --rounds 5
    .venv/bin/python -m bench.http_overhead --rounds 3 --messages 100000 --json http.json

Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.brokers import VibeMQBroker
from bench.common import cpu_seconds
from bench.vibemq_driver import CREATE_QUEUE, frame, handshake, read_message

SETUPS = ("off", "idle", "scraped")
SCRAPED_PATHS = ("/metrics", "/api/overview")


class Scraper(threading.Thread):
    """GETs ``paths`` once a second until stopped; counts them and keeps the slowest."""

    def __init__(self, base: str, paths: tuple[str, ...] = SCRAPED_PATHS) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.paths = paths
        self.stop_event = threading.Event()
        self.count = 0
        self.failures = 0
        self.slowest_s = 0.0

    def run(self) -> None:
        while not self.stop_event.is_set():
            for path in self.paths:
                started = time.perf_counter()
                try:
                    with urllib.request.urlopen(self.base + path, timeout=10) as reply:
                        reply.read()
                    self.count += 1
                except OSError:
                    self.failures += 1
                self.slowest_s = max(self.slowest_s, time.perf_counter() - started)
            self.stop_event.wait(1.0)


def _find(doc: Any, key: str) -> Any:
    """The first value of ``key`` anywhere in a JSON document (depth first)."""
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        for value in doc.values():
            found = _find(value, key)
            if found is not None:
                return found
    elif isinstance(doc, list):
        for value in doc:
            found = _find(value, key)
            if found is not None:
                return found
    return None


def _run_json(argv: list[str], timeout: float) -> Any:
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        out = Path(tmp) / "out.json"
        done = subprocess.run(
            [sys.executable, "-m", *argv, "--json", str(out)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if not out.exists():
            raise RuntimeError(f"{argv[0]} wrote nothing:\n{done.stdout[-2000:]}{done.stderr}")
        return json.loads(out.read_text())


def measure(setup: str, args: argparse.Namespace) -> dict[str, Any]:
    broker = VibeMQBroker(extra_args=["--no-http"] if setup == "off" else [], mqtt=True)
    broker.start()
    scraper: Scraper | None = None
    try:
        if setup == "scraped":
            ready = json.loads((broker.tmp / "ready.json").read_text())
            scraper = Scraper(f"http://127.0.0.1:{ready['http']}")
            scraper.start()
        pids = broker.pids()
        cpu0 = cpu_seconds(pids)
        native = _run_json(
            [
                "bench.vibemq_bench",
                "--target",
                f"127.0.0.1:{broker.port}",
                "--broker-pid",
                str(broker.main_pid),
                "--no-latency",
                "--warmup",
                "5000",
                "--messages",
                str(args.messages),
            ],
            args.timeout,
        )
        cpu1 = cpu_seconds(pids)
        mqtt = _run_json(
            [
                "bench.mqtt_bench",
                "--target",
                f"127.0.0.1:{broker.mqtt_port}",
                "--scenarios",
                "qos1-1to1",
                "--runs",
                "1",
                "--samples",
                "10",
                "--messages",
                str(args.messages),
            ],
            args.timeout,
        )
        cpu2 = cpu_seconds(pids)
    finally:
        if scraper is not None:
            scraper.stop_event.set()
            scraper.join(15)
        broker.stop()
    # the broker's CPU over each whole run (warm-up and all, the scrapes included) per
    # message: steadier than the rates on a shared machine
    native_messages = args.messages + 5000
    return {
        "native": _find(native, "deliver_rate"),
        "mqtt": _find(_find(mqtt, "qos1-1to1"), "deliveries_per_s"),
        "native_cpu_us": (cpu1 - cpu0) / native_messages * 1e6,
        "mqtt_cpu_us": (cpu2 - cpu1) / (args.messages + 20_000) * 1e6,
        "scrapes": scraper.count if scraper else 0,
        "scrape_failures": scraper.failures if scraper else 0,
        "slowest_scrape_s": scraper.slowest_s if scraper else 0.0,
    }


def _create_queues(port: int, count: int) -> None:
    """``count`` queues over one native connection, pipelined in batches."""
    from bench.common import BlockingConn

    conn = BlockingConn("127.0.0.1", port)
    try:
        handshake(conn, "queues")
        body = json.dumps({"maxQueueSize": 1000}).encode()
        for start in range(0, count, 500):
            batch = range(start, min(count, start + 500))
            conn.send(
                b"".join(frame(CREATE_QUEUE, f"cq{i}", f"scrape.q{i:06d}", body) for i in batch)
            )
            for _ in batch:
                read_message(conn)
    finally:
        conn.close()


def scrape_many(args: argparse.Namespace) -> dict[str, Any]:
    broker = VibeMQBroker(mqtt=False)
    broker.start()
    try:
        _create_queues(broker.port, args.scrape_queues)
        ready = json.loads((broker.tmp / "ready.json").read_text())
        base = f"http://127.0.0.1:{ready['http']}"
        out: dict[str, Any] = {"queues": args.scrape_queues}
        for path in ("/metrics", "/api/overview", "/api/queues?page_size=100&sort=messageCount"):
            times: list[float] = []
            size = 0
            for _ in range(args.scrape_runs):
                started = time.perf_counter()
                with urllib.request.urlopen(base + path, timeout=60) as reply:
                    size = len(reply.read())
                times.append(time.perf_counter() - started)
            out[path] = {
                "median_s": statistics.median(times),
                "slowest_s": max(times),
                "bytes": size,
            }
        return out
    finally:
        broker.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--timeout", type=float, default=300.0, help="per measurement, seconds")
    p.add_argument("--scrape-queues", type=int, default=10_000, help="0: skip that phase")
    p.add_argument("--scrape-runs", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    socket.setdefaulttimeout(60)

    results: dict[str, list[dict[str, Any]]] = {s: [] for s in SETUPS}
    for round_no in range(args.rounds):
        shift = round_no % len(SETUPS)
        for setup in SETUPS[shift:] + SETUPS[:shift]:
            r = measure(setup, args)
            results[setup].append(r)
            print(
                f"[round {round_no + 1}] {setup:<8} native {r['native'] or 0:>9,.0f} msg/s  "
                f"mqtt qos1 {r['mqtt'] or 0:>9,.0f} msg/s"
                + (
                    f"  scrapes {r['scrapes']} (slowest {r['slowest_scrape_s'] * 1000:.0f} ms,"
                    f" failed {r['scrape_failures']})"
                    if setup == "scraped"
                    else ""
                ),
                flush=True,
            )

    def median(setup: str, key: str) -> float:
        values = [r[key] for r in results[setup] if r[key]]
        return statistics.median(values) if values else float("nan")

    summary: dict[str, Any] = {"rounds": args.rounds, "messages": args.messages}
    print()
    print(f"{'':<26}{'off':>10}{'idle':>12}{'scraped':>12}{'idle/off':>10}{'scraped/off':>12}")
    for key, label in (
        ("native", "native 1->1 acks msg/s"),
        ("mqtt", "MQTT QoS 1 1->1 msg/s"),
        ("native_cpu_us", "native broker CPU us/msg"),
        ("mqtt_cpu_us", "MQTT broker CPU us/msg"),
    ):
        off, idle, scraped = (median(s, key) for s in SETUPS)
        summary[key] = {"off": off, "idle": idle, "scraped": scraped}
        print(
            f"{label:<26}{off:>10,.1f}{idle:>12,.1f}{scraped:>12,.1f}"
            f"{idle / off:>10.3f}{scraped / off:>12.3f}"
        )
    if args.scrape_queues:
        many = scrape_many(args)
        summary["scrape_many"] = many
        print(f"\nscrapes of a broker with {args.scrape_queues:,} queues over HTTP:")
        for path, r in many.items():
            if isinstance(r, dict):
                print(
                    f"  GET {path:<48} median {r['median_s'] * 1000:7.1f} ms  slowest "
                    f"{r['slowest_s'] * 1000:7.1f} ms  {r['bytes']:,} bytes"
                )
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": results}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
