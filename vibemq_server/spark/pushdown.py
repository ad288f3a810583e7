"""Spark filters on ``queue`` and ``timestamp`` turned into the reader's :class:`RowFilter`.

``DataSourceReader.pushFilters`` (PySpark 4.1+) hands the reader the conjuncts of a query's
filter; those on the queue (``=``, ``IN``) and on the record time (``<``, ``<=``, ``>``, ``>=``)
narrow the scan exactly (the scanner drops the rows, planning skips segments by time), so Spark
does not evaluate them again. Everything else goes back to Spark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

from vibemq_server.spark.journal_reader import RowFilter

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def _micros(value: Any) -> int | None:
    if not isinstance(value, datetime):
        return None
    if value.tzinfo is None:  # PySpark's local-time form of a TIMESTAMP
        value = value.astimezone(UTC)
    return int((value - _EPOCH) // _US)


def _ceil_ms(us: int) -> int:
    return -(-us // 1000)


# (filter class, column) -> how it narrows a RowFilter (records carry whole milliseconds:
# timestamp = ms * 1000 us), or None when the value is not one it can use
_Narrow = Callable[[RowFilter, Any], RowFilter | None]


def _queues(current: RowFilter, names: Iterable[Any]) -> RowFilter | None:
    wanted = frozenset(names)
    if not all(isinstance(n, str) for n in wanted):
        return None
    queues = wanted & current.queues if current.queues else wanted
    if not queues:  # no queue can match: an empty time range reads nothing
        return replace(current, queues=wanted, start_ms=1, end_ms=0)
    return replace(current, queues=queues)


def _at_least(current: RowFilter, ms: int) -> RowFilter:
    return replace(current, start_ms=ms if current.start_ms is None else max(ms, current.start_ms))


def _below(current: RowFilter, ms: int) -> RowFilter:
    return replace(current, end_ms=ms if current.end_ms is None else min(ms, current.end_ms))


def _time(bound: Callable[[RowFilter, int], RowFilter], to_ms: Callable[[int], int]) -> _Narrow:
    def narrow(current: RowFilter, value: Any) -> RowFilter | None:
        us = _micros(value)
        return None if us is None else bound(current, to_ms(us))

    return narrow


_RULES: dict[tuple[type[Filter], str], _Narrow] = {
    (EqualTo, "queue"): lambda f, v: _queues(f, [v]),
    (In, "queue"): lambda f, v: _queues(f, v),
    (GreaterThanOrEqual, "timestamp"): _time(_at_least, _ceil_ms),
    (GreaterThan, "timestamp"): _time(_at_least, lambda us: us // 1000 + 1),
    (LessThan, "timestamp"): _time(_below, _ceil_ms),
    (LessThanOrEqual, "timestamp"): _time(_below, lambda us: us // 1000 + 1),
}


def push(current: RowFilter, filters: list[Filter]) -> tuple[RowFilter, list[Filter]]:
    """The row filter narrowed by the filters it can apply, and the filters it cannot."""
    rest = []
    for f in filters:
        attribute: tuple[str, ...] = getattr(f, "attribute", ())
        rule = _RULES.get((type(f), attribute[0])) if len(attribute) == 1 else None
        narrowed = rule(current, getattr(f, "value", None)) if rule else None
        if narrowed is None:
            rest.append(f)
        else:
            current = narrowed
    return current, rest
