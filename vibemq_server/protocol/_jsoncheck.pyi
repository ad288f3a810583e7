"""Types of the compiled JSON checker (``_jsoncheck.c``)."""

MAX_DEPTH: int
NOGIL_FROM: int
#: the plain-run step in use: "avx512vbmi", "avx2", "sse2" or "swar"
SIMD: str

def valid(data: bytes | bytearray | memoryview, /) -> bool:
    """Whether the bytes are one UTF-8 JSON text (RFC 8259)."""

class Checker:
    """A JSON check fed in parts (cut anywhere); ``finish()`` gives ``valid()`` of the whole."""

    def __init__(self) -> None: ...
    def feed(
        self, data: bytes | bytearray | memoryview, start: int = ..., stop: int = ..., /
    ) -> bool: ...
    def finish(self) -> bool: ...
