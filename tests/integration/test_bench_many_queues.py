"""``bench.many_queues`` end to end on a real broker: client processes that report ready
only once set up and start on one "go" deliver every message, in both connection shapes,
and report their CPU, system calls and timeline (no figure is asserted on)."""

from __future__ import annotations

import argparse

import pytest

from bench.many_queues import measure


def _options(connections: str) -> argparse.Namespace:
    return argparse.Namespace(
        processes=2,
        messages=600,
        window=100,
        batch=10,
        prefetch=50,
        timeout=60.0,
        connections=connections,
        server_arg=[],
        baseline=None,
        acks="bare",
        client_nice=0,
        pin=False,
        nofile=4096,
    )


@pytest.mark.parametrize("connections", ["per-process", "per-queue"])
def test_every_message_delivered_and_counted(connections: str) -> None:
    r = measure(12, _options(connections))
    assert r["errors"] == []
    assert r["delivered"] == r["messages"] == 600
    assert r["mode"] == connections
    assert len(r["timeline"]) == 2  # one (start, end, CPU, switches, wait) per process
    for start, end, cpu_ms, _, _ in r["timeline"]:
        assert 0 <= start <= end and cpu_ms > 0
    # every process read something and the broker ran
    assert r["client_syscr_per_msg"] > 0 and r["broker_core_share"] > 0
