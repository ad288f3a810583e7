"""The benches that compare the transient and the durable native path (bench.paths_bench,
bench.build_ab) measure them alike: the broker's CPU a message summed over the runs (a
journal rotation that falls in one run of three counts at its rate, not as that run's median
or not at all) and queues named the same way."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

# bench/ is a top-level package of the repository, not installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import cpu_us_per_message, median_of
from bench.vibemq_driver import path_queue


def test_a_rare_costly_run_counts_at_its_rate() -> None:
    # three runs of 100,000 messages, one of them with a segment's rotation (+50 ms)
    runs = [(0.20, 100_000), (0.20, 100_000), (0.25, 100_000)]
    assert median_of(cpu / n * 1e6 for cpu, n in runs) == 2.0
    assert abs((cpu_us_per_message(runs) or 0) - 0.65 / 300_000 * 1e6) < 1e-9


def test_runs_without_a_cpu_figure_are_left_out() -> None:
    assert cpu_us_per_message([]) is None
    assert cpu_us_per_message([(None, 100)]) is None
    assert cpu_us_per_message([(None, 100), (0.001, 1_000)]) == 1.0


@given(st.lists(st.tuples(st.floats(0, 10), st.integers(1, 10**6)), min_size=1))
def test_the_figure_lies_between_the_runs_own(runs: list[tuple[float, int]]) -> None:
    each = [cpu / n * 1e6 for cpu, n in runs]
    got = cpu_us_per_message(runs)
    assert got is not None
    assert min(each) * (1 - 1e-9) <= got <= max(each) * (1 + 1e-9)


def test_the_native_queues_are_named_alike_in_both_benches() -> None:
    transient, durable = path_queue(False), path_queue(True)
    assert transient.startswith("native-") and durable.startswith("native-durable-")
    assert len(path_queue(True)) == len(durable) and path_queue(True) != durable
