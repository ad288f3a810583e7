"""The C allocator's thresholds, set once at start so large messages reuse memory.

Every read of a large message is a fresh ``bytes`` of up to 256 KiB and every payload a fresh
``bytes`` of its size, freed again a moment later. glibc's malloc adapts its thresholds to
such blocks (after an mmap'd block of S bytes is freed, blocks up to S come from the heap and
the heap's free top is given back to the kernel beyond 2·S), so with messages of a megabyte or
so the heap top is trimmed (``brk``) and grown again all the time, and every new page is a page
fault the copy into it pays for: perf puts 10-15 % of the broker's CPU at 1 MiB in
those faults. Fixed thresholds stop the churn: blocks up to ``MMAP_THRESHOLD`` come from the
heap, and up to ``TRIM_THRESHOLD`` of free heap is kept for the next message instead of being
returned. (Setting either turns glibc's adaptation off, hence both.)

An operator's own ``MALLOC_TRIM_THRESHOLD_`` / ``MALLOC_MMAP_THRESHOLD_`` (glibc's environment
tunables, read before we start) win: nothing is changed when either is set. Elsewhere than
glibc (no ``mallopt``, or it refuses) nothing changes either.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

#: glibc's ``mallopt`` parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: Blocks up to this come from the heap: the largest glibc accepts (HEAP_MAX / 2 on 64-bit),
#: so 16 MiB payloads and uvloop's 256 KiB reads reuse heap memory. Larger ones are mmap'd
#: and unmapped on free as before (a 64 MiB message does not stay resident).
MMAP_THRESHOLD = 32 * 1024 * 1024
#: Free heap kept at its top before it is given back: a window of 1 MiB messages' worth. An
#: idle broker after a burst of large messages keeps at most this much more than it needs
#: (measured: 61 MiB idle, 109 MiB after 16 MiB messages with 64 MiB here, 61 with glibc's
#: adaptive default; see docs/performance.md, issue 16).
TRIM_THRESHOLD = 32 * 1024 * 1024

_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def tune_allocator(environ: Mapping[str, str]) -> bool:
    """Fix the allocator's thresholds (see the module docstring). True when they were set."""
    if any(name in environ for name in _ENV):
        return False
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: the C library's among them
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt answers 1 on success; the mmap one first (the trim one alone would freeze the
    # mmap threshold at its 128 KiB default).
    _state.tuned = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    return _state.tuned


class _State:
    tuned = False


_state = _State()


def tuned() -> bool:
    """Whether :func:`tune_allocator` set the thresholds in this process: then a large
    block shrunk in place (a socket read cut to its length, server/transport.py) does not
    give the heap back to be faulted in again by the next read."""
    return _state.tuned
