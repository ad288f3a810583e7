"""Types of the compiled frame glue (``_glue.c``)."""

def glue(*parts: bytes | bytearray | memoryview) -> bytes:
    """The ``parts`` joined, as ``b"".join(parts)``."""
