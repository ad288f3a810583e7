"""Why a management operation was refused, in kinds an HTTP router (or a CLI) maps onto its
own answers: the HTTP listener answers ``NotFound`` 404, ``Invalid`` 400 naming the field,
``Conflict`` 409, ``Forbidden`` 403, ``Unavailable`` 503 (http/app.py)."""

from __future__ import annotations


class ManagementError(Exception):
    """A refused management operation; ``field`` names the request's bad field, if one."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class NotFound(ManagementError):
    """What the operation names is not there (or its protocol is off)."""


class Invalid(ManagementError):
    """A value that cannot be used (a bad pattern, an unknown type, bad arguments)."""


class Conflict(ManagementError):
    """It exists with other settings, or is in use."""


class Forbidden(ManagementError):
    """Reserved names: the default exchange, ``amq.*``, the adapters' ``$`` queues."""


class Unavailable(ManagementError):
    """The broker cannot do it now (the journal is failing)."""
