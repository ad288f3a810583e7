"""Types of the compiled large-copy helper (``_bigcopy.c``)."""

from collections.abc import Sequence

NOGIL_FROM: int

def join_range(parts: Sequence[bytes | bytearray | memoryview], start: int, stop: int, /) -> bytes:
    """Bytes ``start:stop`` of the buffers in ``parts``, joined (the GIL released when large)."""

class ReadBuffer:
    """A socket read's buffer that becomes the read's bytes without a copy."""

    def __init__(self, copy_below: int = 0) -> None: ...
    def get(self, size: int, /) -> ReadBuffer:
        """Itself, a writable buffer of ``size`` bytes (a fresh bytes inside) for a read."""

    def take(self, n: int, /) -> bytes:
        """The first ``n`` bytes read, as the bytes object itself (no copy)."""

    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __len__(self) -> int: ...

class PayloadFill:
    """A payload's bytes object, filled in place (the rest read straight into it)."""

    def __init__(self, size: int) -> None: ...
    def write(self, data: bytes | bytearray | memoryview, /) -> int:
        """Copy as much of ``data`` as there is room for; how much that was."""

    def advance(self, n: int, /) -> bool:
        """``n`` more bytes were read into the exported rest; True once full."""

    def take(self) -> bytes:
        """The full payload (the bytes object itself); once."""

    @property
    def filled(self) -> int: ...
    @property
    def full(self) -> bool: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __len__(self) -> int: ...
