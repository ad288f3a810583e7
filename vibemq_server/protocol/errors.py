"""The one error type every VibeMQ protocol failure raises, and the wire error codes."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Error codes sent in ``errorCode`` (documented and the original's code's own)."""

    AUTH_REQUIRED = "AUTH_REQUIRED"
    AUTH_FAILED = "AUTH_FAILED"
    NOT_AUTHENTICATED = "NOT_AUTHENTICATED"
    NOT_AUTHORIZED = "NOT_AUTHORIZED"
    CONNECTION_LIMIT = "CONNECTION_LIMIT"
    RATE_LIMITED = "RATE_LIMITED"
    INVALID_MESSAGE = "INVALID_MESSAGE"
    INVALID_PAYLOAD = "INVALID_PAYLOAD"
    INVALID_QUEUE = "INVALID_QUEUE"
    UNKNOWN_COMMAND = "UNKNOWN_COMMAND"
    QUEUE_NOT_FOUND = "QUEUE_NOT_FOUND"
    QUEUE_EXISTS = "QUEUE_EXISTS"
    QUEUE_FULL = "QUEUE_FULL"
    SERVER_ERROR = "SERVER_ERROR"


class ProtocolError(Exception):
    """A malformed or refused input. ``fatal`` means the connection must close after replying."""

    def __init__(
        self, code: ErrorCode, message: str, *, fatal: bool = False, message_id: str = ""
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.fatal = fatal
        self.message_id = message_id
