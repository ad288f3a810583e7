"""Shared fixtures: real brokers on port 0, started in the test's own event loop."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from brokersettings import broker_settings
from hypothesis import settings

from vibemq_server.app import create_broker
from vibemq_server.buildinfo import HOT_MODULES, compiled_modules, stale_modules
from vibemq_server.config import Config
from vibemq_server.logs import configure_logging
from vibemq_server.server import Broker

configure_logging("warning")

# CI runs the property tests with a fixed seed (a landing must not hang on a lucky draw);
# developers' runs stay random and keep finding new cases. HYPOTHESIS_PROFILE overrides.
# No deadline: a per-example time limit is a timed assertion, and fails on a busy machine.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("dev", print_blob=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_configure(config: pytest.Config) -> None:
    # scripts/test.sh runs the suite a second time against the compiled build: make sure it
    # is that build, not pure Python again after a silent fallback.
    if os.environ.get("VIBEMQ_EXPECT_COMPILED") == "1":
        done = compiled_modules()
        if done != list(HOT_MODULES):
            missing = sorted(set(HOT_MODULES) - set(done))
            raise pytest.UsageError(f"VIBEMQ_EXPECT_COMPILED=1 but not compiled: {missing}")
    # A module compiled in place and edited since would test the old code.
    if stale := stale_modules():
        raise pytest.UsageError(
            f"compiled modules older than their source: {stale} (rebuild them: python "
            "scripts/compile.py, or remove them: python scripts/compile.py --clean)"
        )


BrokerFactory = Callable[..., Awaitable[Broker]]


@pytest.fixture
async def broker_factory(tmp_path: Path) -> AsyncIterator[BrokerFactory]:
    started: list[Broker] = []

    async def make(**overrides: Any) -> Broker:
        settings = broker_settings(tmp_path / f"data{len(started)}", overrides)
        broker = create_broker(Config(**settings))
        await broker.start()
        started.append(broker)
        return broker

    yield make
    for broker in started:
        await broker.stop()


@pytest.fixture
async def broker(broker_factory: BrokerFactory) -> Broker:
    return await broker_factory()
