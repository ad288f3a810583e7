"""The overview's message rates: the core's counters sampled, differences over intervals."""

from __future__ import annotations

from vibemq_server.core import QueueManager
from vibemq_server.http.rates import COUNTERS, RateSampler, Sample, totals


def test_totals_sum_every_queue_in_counter_order() -> None:
    manager = QueueManager()
    manager.create_queue("a")
    manager.create_queue("b")
    for i in range(3):
        manager.publish("a", f"a{i}", b"1", {}, route=False)
    manager.publish("b", "b0", b"1", {}, route=False)
    manager.queues["b"].n_dropped = 7
    sums = dict(zip(COUNTERS, totals(manager), strict=True))
    assert sums["published"] == 4 and sums["dropped"] == 7 and sums["acked"] == 0


def test_series_is_per_second_per_interval_and_never_negative() -> None:
    manager = QueueManager()
    sampler = RateSampler(manager)
    zero = (0,) * len(COUNTERS)
    ten = (10,) + (0,) * (len(COUNTERS) - 1)
    sampler.samples.extend(
        [Sample(100.0, 1.0, zero), Sample(105.0, 6.0, ten), Sample(110.0, 11.0, zero)]
    )
    first, second = sampler.series()
    assert first["at"] == 105.0 and first["published"] == 2.0 and first["dropped"] == 0.0
    assert second["published"] == 0.0  # a deleted queue took its counts: clamped, not negative
    assert set(sampler.current()) == set(COUNTERS.values())
