"""Types of the compiled large-copy helper (``_bigcopy.c``)."""

from collections.abc import Sequence

NOGIL_FROM: int

def join_range(parts: Sequence[bytes | bytearray | memoryview], start: int, stop: int, /) -> bytes:
    """Bytes ``start:stop`` of the buffers in ``parts``, joined (the GIL released when large)."""
