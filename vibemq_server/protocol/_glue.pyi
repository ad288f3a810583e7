"""Types of the compiled frame glue (``_glue.c``)."""

def glue(*parts: bytes | bytearray | memoryview) -> bytes:
    """The ``parts`` joined, as ``b"".join(parts)``."""

def publish_ack(msg_id: str, queue: str, /) -> bytes | None:
    """The PublishAck frame when ``msg_id`` and ``queue`` are ASCII; None otherwise."""

def publish_acks(echoes: list[str], /) -> bytes | None:
    """The PublishAcks of ``[id, queue, id, queue, ...]`` one after the other when all are
    ASCII; None otherwise."""

def deliver(msg_id: str, piece: bytes, payload: bytes, tail: bytes, /) -> bytes | None:
    """The Deliver frame when ``msg_id`` is ASCII (and the rest exact bytes); None otherwise."""
