"""Write a synthetic journal with the journal's own encoders, fast, for benchmarks and demos.

    python -m vibemq_server.spark.generate DATA_DIR --messages 1000000 [--queues 4]

Each message is a PUBLISH, one or more DELIVERs and a SETTLE, as the broker writes them: most
are acknowledged, some are redelivered, some dead-lettered (SETTLE DEAD_LETTERED followed by a
PUBLISH into ``<queue>.dlq`` with the dead-letter headers) and some expire. Segments rotate at
``--segment-size`` bytes and each starts with a QUEUE_CREATE per queue, like the broker's.
Deterministic for a given ``--seed``. It writes files directly and never fsyncs: it is a test
fixture generator, not a broker.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from vibemq_server.core.persistence import SettleReason
from vibemq_server.journal.records import (
    QueueCreate,
    encode_deliver,
    encode_publish,
    encode_record,
    encode_segment_header,
    encode_settle,
)
from vibemq_server.journal.recovery import segment_path

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@dataclass
class Stats:
    """What was generated, to check readers against."""

    messages: int = 0
    records: int = 0
    segments: int = 0
    bytes: int = 0
    acked: int = 0
    dead_lettered: int = 0
    expired: int = 0
    redelivered: int = 0
    per_queue: dict[str, int] = field(default_factory=dict)


class _SegmentWriter:
    def __init__(self, directory: Path, segment_size: int, queues: list[str]) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.queues = queues
        self.number = 0
        self.size = 0
        self.parts: list[bytes] = []
        self.stats = Stats()

    def _flush(self) -> None:
        if self.number:
            segment_path(self.directory, self.number).write_bytes(b"".join(self.parts))
        self.parts = []

    def open_next(self, ts: int) -> None:
        self._flush()
        self.number += 1
        self.stats.segments += 1
        self.parts = [encode_segment_header(self.number)]
        self.size = len(self.parts[0])
        self.stats.bytes += self.size
        for name in self.queues:
            options = {"durable": True, "enableDeadLetterQueue": not name.endswith(".dlq")}
            self.add(encode_record(QueueCreate(name, START_MS, json.dumps(options).encode()), ts))

    def add(self, data: bytes) -> None:
        self.parts.append(data)
        self.size += len(data)
        self.stats.bytes += len(data)
        self.stats.records += 1

    def maybe_rotate(self, ts: int) -> None:
        if self.size >= self.segment_size:
            self.open_next(ts)

    def close(self) -> None:
        self._flush()


def generate(
    data_dir: str | Path,
    messages: int,
    *,
    queues: int = 4,
    segment_size: int = 64 * 1024 * 1024,
    payload_size: int = 100,
    seed: int = 7,
    start_ms: int = START_MS,
    rate_per_ms: float = 1.0,
) -> Stats:
    """Write ``messages`` messages into ``<data_dir>/journal/``; returns what it wrote."""
    rng = random.Random(seed)
    directory = Path(data_dir) / "journal"
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"q{i}" for i in range(queues)]
    dlqs = [f"{name}.dlq" for name in names]
    w = _SegmentWriter(directory, segment_size, names + dlqs)
    w.open_next(start_ms)
    stats = w.stats
    seq = 0
    filler = "x" * payload_size
    step = 1.0 / rate_per_ms
    for i in range(messages):
        ts = start_ms + int(i * step)
        queue = names[i % queues]
        seq += 1
        size = rng.randint(payload_size // 2, payload_size * 2)
        payload = json.dumps({"n": i, "body": filler[:size]}).encode()
        headers = {"source": "generator"} if i % 3 == 0 else {}
        w.add(encode_publish(ts, seq, queue, f"m{i}", ts, 0, 1, 0, headers, payload))
        stats.messages += 1
        stats.per_queue[queue] = stats.per_queue.get(queue, 0) + 1
        roll = rng.random()
        deliveries = 1 if roll < 0.9 else rng.randint(2, 4)
        t = ts
        for attempt in range(1, deliveries + 1):
            t += rng.randint(1, 20)
            w.add(encode_deliver(t, seq, queue, attempt))
        if deliveries > 1:
            stats.redelivered += 1
        t += rng.randint(1, 200)
        if roll < 0.97:
            w.add(encode_settle(t, seq, queue, SettleReason.ACKED, ""))
            stats.acked += 1
        elif roll < 0.99:
            w.add(encode_settle(t, seq, queue, SettleReason.DEAD_LETTERED, "MaxRetriesExceeded"))
            seq += 1
            dl_headers = {
                "deadLetterReason": "MaxRetriesExceeded",
                "originalQueue": queue,
                "deadLetteredAt": str(t),
                "originalDeliveryAttempts": str(deliveries),
            }
            dlq = dlqs[i % queues]
            w.add(encode_publish(t, seq, dlq, f"m{i}", t, 0, 1, 0, dl_headers, payload))
            stats.dead_lettered += 1
            stats.per_queue[dlq] = stats.per_queue.get(dlq, 0) + 1
        else:
            w.add(encode_settle(t, seq, queue, SettleReason.EXPIRED, ""))
            stats.expired += 1
        w.maybe_rotate(t)
    w.close()
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("data_dir")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--segment-size", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--payload-size", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    stats = generate(
        args.data_dir,
        args.messages,
        queues=args.queues,
        segment_size=args.segment_size,
        payload_size=args.payload_size,
        seed=args.seed,
    )
    print(json.dumps(stats.__dict__))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
