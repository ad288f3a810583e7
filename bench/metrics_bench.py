"""The Prometheus scrape (``vibemq_server.metrics.render``) of a broker with many queues.

For each ``--queues`` count (default 10,000 and 100,000) a broker is started in this process
(listeners on port 0, a temporary data directory), that many in-memory queues are created
with a few ready messages each (0..``--max-depth``, so the top-N choice has work to do) and
some traffic counted on them; then ``render(broker)`` is timed ``--runs`` times, as the HTTP
listener calls it on the broker's loop. Reported per count: the median and slowest scrape,
the body size and how many queues got per-queue series (``--per-queue-limit``, default the
config's 100; -1 = every queue, to see what the knob saves).

    .venv/bin/python -m bench.metrics_bench
    .venv/bin/python -m bench.metrics_bench --queues 10000 --per-queue-limit -1
    .venv/bin/python -m bench.metrics_bench --queues 100000 --runs 3 --json metrics.json

Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from vibemq_server.app import create_broker
from vibemq_server.config import Config
from vibemq_server.metrics import render


async def measure(queues: int, runs: int, max_depth: int, per_queue_limit: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="vibemq-metrics-bench-") as tmp:
        config = Config(
            host="127.0.0.1",
            port=0,
            mqtt={"port": 0},
            amqp={"port": 0},
            data_dir=Path(tmp),
            metrics={"per_queue_limit": per_queue_limit},
        )
        broker = create_broker(config)
        await broker.start()
        try:
            manager = broker.manager
            options = manager.options_from({"durable": False})
            setup = time.perf_counter()
            for n in range(queues):
                name = f"bench.q{n}"
                queue, _ = manager.create_queue(name, options)
                for i in range(n % (max_depth + 1)):
                    manager.publish(name, f"m{i}", b'{"n":1}', {})
                queue.n_delivered = n  # counts as a busy broker's would be
                queue.acked_gone = n
            setup_s = time.perf_counter() - setup
            render(broker)  # the registry is built on the first scrape
            times: list[float] = []
            size = 0
            for _ in range(runs):
                started = time.perf_counter()
                body, _ = render(broker)
                times.append(time.perf_counter() - started)
                size = len(body)
            exported = sum(
                1
                for line in body.decode().splitlines()
                if line.startswith("vibemq_queue_messages{")
            )
        finally:
            await broker.stop()
    return {
        "queues": queues,
        "per_queue_limit": per_queue_limit,
        "setup_s": round(setup_s, 2),
        "scrape_median_s": round(statistics.median(times), 4),
        "scrape_max_s": round(max(times), 4),
        "body_bytes": size,
        "queues_exported": exported,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--queues", type=int, action="append", help="queue count (repeatable)")
    p.add_argument("--runs", type=int, default=5, help="scrapes timed per count")
    p.add_argument("--max-depth", type=int, default=5, help="ready messages per queue, at most")
    p.add_argument("--per-queue-limit", type=int, default=100, help="metrics.per_queue_limit")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    results = []
    for count in args.queues or [10_000, 100_000]:
        result = asyncio.run(measure(count, args.runs, args.max_depth, args.per_queue_limit))
        results.append(result)
        print(
            f"[metrics] {result['queues']:,} queues (per_queue_limit {result['per_queue_limit']}):"
            f" scrape median {result['scrape_median_s'] * 1000:.1f} ms,"
            f" max {result['scrape_max_s'] * 1000:.1f} ms;"
            f" body {result['body_bytes'] / 1024:.1f} KiB,"
            f" {result['queues_exported']} queues with series"
            f" (setup {result['setup_s']:.1f} s)",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
