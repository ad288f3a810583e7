"""The open-file limit: raised to the hard limit at start, and what it allows.

Every connection is a descriptor. Many systems start a process with a soft limit of 1,024
however high the hard one is; the broker raises its soft limit to the hard limit (as
Mosquitto and RabbitMQ do) and says how many connections that leaves room for.
"""

from __future__ import annotations

import contextlib
import resource

#: descriptors kept for what is not a connection: listeners, journal segments, the event
#: loop's own, the worker threads', the management listener's
RESERVED_FDS = 64


def raise_open_files() -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit to its hard limit (when the hard one is unlimited:
    to the kernel's per-process ceiling, fs.nr_open). Returns (soft, hard) as they are
    afterwards; a refusal leaves them as they were."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else _nr_open()
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def connection_capacity(soft: int, max_connections: int) -> int:
    """How many connections the broker can hold: its ``max_connections``, or fewer when the
    open-file limit runs out first."""
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(0, min(max_connections, soft - RESERVED_FDS))


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return 1_048_576
