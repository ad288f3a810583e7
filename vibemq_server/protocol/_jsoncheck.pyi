"""Types of the compiled JSON checker (``_jsoncheck.c``)."""

MAX_DEPTH: int
NOGIL_FROM: int

def valid(data: bytes | bytearray | memoryview, /) -> bool:
    """Whether the bytes are one UTF-8 JSON text (RFC 8259)."""
