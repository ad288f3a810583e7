"""Types of the compiled Ack peek (``_ackpeek.c``)."""

def ack_target(body: bytes, /) -> str | None:
    """The ``messageId`` of the usual ASCII Ack body; None for any other body."""
