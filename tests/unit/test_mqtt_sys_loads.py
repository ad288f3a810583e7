"""The $SYS load averages (adapters/mqtt/sys_topics.py): per-minute rates of the MQTT
counters as exponentially-decaying averages over 1, 5 and 15 minutes, on a manual clock."""

from __future__ import annotations

import math

import pytest

from vibemq_server.adapters.mqtt.sys_topics import Loads
from vibemq_server.server.stats import ProtocolStats

KEY = "$SYS/broker/load/messages/received/{}"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_first_update_is_the_baseline_then_rates_decay_in() -> None:
    clock, stats = Clock(), ProtocolStats("mqtt")
    loads = Loads(clock)
    stats.messages_received = 1_000  # before the first look: not a rate
    loads.update(stats)
    assert loads.values[KEY.format("1min")] == 0.0
    clock.now += 60
    stats.messages_received += 120  # 120 per minute for one minute
    loads.update(stats)
    assert loads.values[KEY.format("1min")] == pytest.approx(120 * (1 - math.exp(-1)))
    assert loads.values[KEY.format("5min")] == pytest.approx(120 * (1 - math.exp(-0.2)))
    assert loads.values[KEY.format("15min")] == pytest.approx(120 * (1 - math.exp(-60 / 900)))
    one_minute = loads.values[KEY.format("1min")]
    clock.now += 60  # a quiet minute: the averages fall
    loads.update(stats)
    assert loads.values[KEY.format("1min")] == pytest.approx(one_minute * math.exp(-1))


def test_a_steady_rate_is_approached() -> None:
    clock, stats = Clock(), ProtocolStats("mqtt")
    loads = Loads(clock)
    loads.update(stats)
    for _ in range(60):  # an hour at 30 messages a minute, looked at every minute
        clock.now += 60
        stats.messages_received += 30
        stats.bytes_sent += 3_000
        loads.update(stats)
    assert loads.values[KEY.format("1min")] == pytest.approx(30)
    assert loads.values[KEY.format("15min")] == pytest.approx(30, rel=0.02)
    assert loads.values["$SYS/broker/load/bytes/sent/5min"] == pytest.approx(3_000, rel=1e-4)
