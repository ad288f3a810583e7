"""The broker raises its open-file soft limit to the hard limit at start (server/fdlimit.py)."""

from __future__ import annotations

import resource
import subprocess
import sys

from vibemq_server.server.fdlimit import RESERVED_FDS, connection_capacity

_CHILD = """
import resource
from vibemq_server.server.fdlimit import raise_open_files
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], *raise_open_files(), hard)
"""


def test_a_low_soft_limit_is_raised_to_the_hard_limit() -> None:
    # In a child process: this one's limit stays as it is.
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60, check=True
    )
    before, soft, hard, original_hard = (int(v) for v in done.stdout.split())
    assert before == 256
    assert hard == original_hard
    expected = hard if hard != resource.RLIM_INFINITY else soft
    assert soft == expected and soft > 256


def test_connection_capacity_is_the_smaller_of_the_limits() -> None:
    assert connection_capacity(20_000, 10_000) == 10_000
    assert connection_capacity(1_024, 10_000) == 1_024 - RESERVED_FDS
    assert connection_capacity(resource.RLIM_INFINITY, 10_000) == 10_000
