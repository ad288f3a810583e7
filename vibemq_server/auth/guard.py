"""Per source address: failed logins slowed down, and new connections rate-limited.

After the n-th failed login from an address (n counted until ``forget_after`` seconds pass
without a failure) the refusal is held back ``base * 2**(n-1)`` seconds, at most ``max_delay``:
the client waits for its answer, so a password cannot be guessed at line rate. The caller
delays its refusal on a timer; nothing here sleeps. Both tables are bounded in size.
"""

from __future__ import annotations

import time
from collections.abc import Callable

_MAX_ADDRESSES = 65_536


def _bound(table: dict[str, object]) -> None:
    if len(table) > _MAX_ADDRESSES:
        for key in list(table)[: _MAX_ADDRESSES // 2]:  # the oldest half (insertion order)
            del table[key]


class LoginGuard:
    def __init__(
        self,
        base_delay: float,
        max_delay: float,
        connection_rate: float = 0.0,
        connection_burst: int = 20,
        forget_after: float = 60.0,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.rate = connection_rate
        self.burst = float(connection_burst)
        self.forget_after = forget_after
        self.now = now
        #: address -> (failures, time of the last one)
        self._failures: dict[str, tuple[int, float]] = {}
        #: address -> (tokens, time of the last refill)
        self._buckets: dict[str, tuple[float, float]] = {}

    def failures(self, address: str) -> int:
        count, last = self._failures.get(address, (0, 0.0))
        return count if self.now() - last < self.forget_after else 0

    def failed(self, address: str) -> float:
        """Count a failed login; how long its refusal is to be held back (seconds)."""
        count = self.failures(address) + 1
        self._failures.pop(address, None)
        self._failures[address] = (count, self.now())
        _bound(self._failures)  # type: ignore[arg-type]
        return min(self.max_delay, self.base_delay * float(1 << min(count - 1, 30)))

    def allow_connection(self, address: str) -> bool:
        """A token bucket per address (``rate`` per second, ``burst`` at once); 0 = no limit."""
        if not self.rate:
            return True
        now = self.now()
        tokens, last = self._buckets.pop(address, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[address] = (tokens - 1.0 if allowed else tokens, now)
        _bound(self._buckets)  # type: ignore[arg-type]
        return allowed
