"""Types of the compiled columnar scanner (``_colscan.c``)."""

from collections.abc import Sequence
from typing import Any

def scan(
    buf: bytes,
    pos: int,
    base: int,
    segment: int,
    kinds: Sequence[bytes],
    reasons: Sequence[bytes],
    queues: Sequence[bytes],
    lo: int | None,
    hi: int | None,
    max_rows: int,
    max_bytes: int,
) -> tuple[int, int, str | None, int, int, int, tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]:
    """(status, pos, error, rows, payload_utf8, options_utf8, columns, keys, values)"""

def walk(buf: bytes, pos: int, max_records: int) -> tuple[int, int]:
    """(pos, count) of whole records from ``pos``; ``max_records`` -1 = no limit."""
