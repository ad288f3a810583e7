"""Fixed-bucket histograms the journal keeps as plain ints (read by the metrics).

Observing costs a short scan of a few bucket bounds and two adds; nothing here knows
Prometheus. ``counts[i]`` counts the observations in bucket ``i`` alone (not cumulative);
the last slot is for those above every bound (``+Inf``).
"""

from __future__ import annotations

from bisect import bisect_left

#: fsync latency buckets, seconds
FSYNC_BUCKETS_S: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
#: group-commit batch buckets: acknowledgements released by one fsync
BATCH_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class FixedHistogram:
    """Counts of observations per bucket (upper bounds inclusive), and their sum."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), ending with (+Inf, count)."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out
