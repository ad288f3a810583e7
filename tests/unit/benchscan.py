"""Feeding the load generators' byte-stream scanners (bench/*_driver.py) read by read, shared
by their tests: any cuts of a stream into reads, and what a scanner or counter made of them."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

# bench/ is a top-level package of the repository, not installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import AckCounter, BodySkip, DeliveryScanner, ReadArea


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def run_scanner(scanner: DeliveryScanner, data: bytes, cuts: list[int]) -> tuple[int, bytes, int]:
    """(deliveries counted, the acks written, bytes left unconsumed), read by read into a
    ``ReadArea`` as the load generator's subscriber reads (scanned in place, a delivery's
    body skipped by its length)."""
    reads = ReadArea()
    delivered = 0
    acks = b""
    for part in chunked(data, cuts):
        n, reply = reads.feed(part, scanner)
        delivered += n
        acks += reply
    return delivered, acks, reads.held + getattr(scanner, "_skip", BodySkip()).left


def run_counter(counter: AckCounter, data: bytes, cuts: list[int]) -> tuple[int, int]:
    """(acks counted, bytes left unconsumed), read by read."""
    buf = bytearray()
    acked = 0
    for part in chunked(data, cuts):
        buf += part
        used, n = counter.feed(buf)
        del buf[:used]
        acked += n
    return acked, len(buf)
