"""The core's notion of time: an injected callable returning wall-clock milliseconds.

Wall-clock (not monotonic) because TTL expiry must mean the same thing after a restart.
Tests pass a ManualClock and advance it instead of sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

Clock = Callable[[], int]

# (Final: compiled, a static; ``time.time_ns`` was a module attribute lookup every publish)
_TIME_NS: Final = time.time_ns


def wall_clock_ms() -> int:
    return _TIME_NS() // 1_000_000


class ManualClock:
    """A clock that only moves when told to."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms
