"""Starting a real `vibemq-server` process in tests: its command line and a clean environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any VIBEMQ_* setting of the outer shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEMQ_")}
    env.update(extra)
    return env


def server_args(data_dir: Path, ready: Path, *flags: str) -> list[str]:
    """`python -m vibemq_server` on 127.0.0.1, any free port, JSON logs, a ready file."""
    return [
        sys.executable,
        "-m",
        "vibemq_server",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--mqtt-port",
        "0",
        "--amqp-port",
        "0",
        "--ready-file",
        str(ready),
        "--data-dir",
        str(data_dir),
        "--log-format",
        "json",
        *flags,
    ]
