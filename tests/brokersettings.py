"""The one set of broker settings the test fixtures start from: loopback, every port 0.

A listener section given as a dict is merged into its defaults, so a test that sets one MQTT or
AMQP option keeps port 0 unless it names a port itself (replacing the section bound 1883).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def broker_settings(data_dir: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "drain_timeout_s": 2.0,
        "mqtt": {"port": 0},
        "amqp": {"port": 0},
        "http": {"port": 0, "tls_port": 0},
        "data_dir": data_dir,
    }
    for key, value in overrides.items():
        default = settings.get(key)
        if isinstance(default, dict) and isinstance(value, dict):
            settings[key] = {**default, **value}
        else:
            settings[key] = value
    return settings
