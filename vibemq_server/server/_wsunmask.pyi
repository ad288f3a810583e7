"""Types of the compiled WebSocket unmasking routine (``_wsunmask.c``)."""

def unmask_run(buf: bytes, pos: int, max_message: int, /) -> tuple[bytes, int]:
    """The whole masked binary frames from ``pos``, unmasked and joined; where they stop."""
