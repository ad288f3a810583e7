"""The system calls the journal makes on its segment files, as one replaceable object.

The journal is compiled in the compiled build, where replacing its module's ``os`` would not
be seen; the tests give a ``Journal`` a subclass of ``SystemCalls`` instead (a full disk, a
slow or gated fsync). The calls are per write batch and per fsync, never per message.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


class SystemCalls:
    """``os``'s file calls, as the journal uses them."""

    def open(self, path: Path, flags: int, mode: int = 0o777) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        return os.writev(fd, buffers)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def close(self, fd: int) -> None:
        os.close(fd)


#: the real ones
SYSTEM = SystemCalls()
