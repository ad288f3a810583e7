"""Exceptions raised by the VibeMQ client.

Every failure is a :class:`VibeMQError` carrying the wire ``code`` (``QUEUE_NOT_FOUND``,
``AUTH_FAILED``, ...) so callers can branch on one attribute. Failures that never reached the
server get client-side codes (``CONNECTION_LOST``, ``CONNECTION_FAILED``, ``TIMEOUT``) and
their own subclasses, because "retry later" and "the server said no" call for different handling.
"""

from __future__ import annotations


class VibeMQError(Exception):
    """An error reported by the server (``code`` is its ``errorCode``) or by the client."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class ConnectionFailed(VibeMQError):
    """The TCP connection or the Connect handshake could not be established."""

    def __init__(self, message: str) -> None:
        super().__init__("CONNECTION_FAILED", message)


class ConnectionLost(VibeMQError):
    """The connection dropped (or the client was closed) before the request was answered.

    A publish that fails this way may or may not have reached the queue: the client never
    resends it by itself, because doing so could duplicate the message.
    """

    def __init__(self, message: str = "connection lost") -> None:
        super().__init__("CONNECTION_LOST", message)


class RequestTimeout(VibeMQError):
    """The server did not answer within the request timeout."""

    def __init__(self, message: str) -> None:
        super().__init__("TIMEOUT", message)


class PublishBatchError(VibeMQError):
    """Some messages of a ``publish_many`` batch were refused (the others were stored).

    ``code`` and ``message`` are those of the first refusal in batch order; ``results`` has
    one entry per message, in order: its id when the broker stored it, else its error.
    """

    def __init__(self, results: list[str | VibeMQError]) -> None:
        errors = [r for r in results if isinstance(r, VibeMQError)]
        first = errors[0] if errors else VibeMQError("SERVER_ERROR")
        super().__init__(
            first.code, f"{len(errors)} of {len(results)} publishes refused; first: {first}"
        )
        self.results = results

    @property
    def errors(self) -> dict[int, VibeMQError]:
        """The refused messages: their index in the batch -> the error."""
        return {i: r for i, r in enumerate(self.results) if isinstance(r, VibeMQError)}
