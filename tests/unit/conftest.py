"""Fixtures of the core's unit tests: a manual clock and a queue manager on it."""

from __future__ import annotations

import pytest

from vibemq_server.config import QueueDefaults
from vibemq_server.core import ManualClock, QueueManager


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def mgr(clock: ManualClock) -> QueueManager:
    return QueueManager(QueueDefaults(), clock)
