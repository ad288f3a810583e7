"""The allocator's thresholds at start (``server/allocator.py``)."""

from __future__ import annotations

import sys

import pytest

from vibemq_server.server.allocator import tune_allocator, tuned


@pytest.mark.parametrize("name", ["MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"])
def test_an_operators_tunable_wins(name: str) -> None:
    assert tune_allocator({name: "1048576"}) is False


def test_glibc_takes_the_thresholds() -> None:
    # Linux with glibc (this project's machines and CI): mallopt accepts both values.
    assert sys.platform == "linux"
    assert tune_allocator({}) is True
    assert tuned()  # (the transport then hands reads on cut to length: transport.COPY_BELOW)
