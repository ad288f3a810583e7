"""The ``vibemq-server users`` command in tests: run as its own process, the password on
stdin (never an argument)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from serverproc import clean_env


def users(
    users_file: Path, *args: str, password: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``vibemq-server users ...`` as its own process; the password on stdin."""
    return subprocess.run(
        [sys.executable, "-m", "vibemq_server", "users", "--users-file", str(users_file), *args],
        input=None if password is None else password + "\n",
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )


def add_user(users_file: Path, name: str, password: str, *flags: str) -> None:
    done = users(users_file, "add", name, "--password-stdin", *flags, password=password)
    assert done.returncode == 0, done.stderr
