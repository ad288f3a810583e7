"""Queue redeclaration as RabbitMQ judges it: which arguments must repeat, and its 406 wording.

A queue.declare of an existing queue must repeat ``durable``, ``auto_delete`` and every
argument in :data:`EQUIVALENT` (RabbitMQ 3.10's classic-queue list, in the order it checks
them); other arguments (``x-foo``) are not compared. Two values are equivalent when they are
of one type class (every integer type is one class, ``float`` and ``double`` another) and
equal, or, across classes, when they are the very same value (a ``longstr`` and a ``binary``
with the same bytes). The reply texts are RabbitMQ's, checked against rabbitmq-server 3.10:

    inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received the value '10' of
    type 'signedint' but current is none
    inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received '20' but current is '10'

Values carry their wire type (:class:`~vibemq_server.adapters.amqp.codec.FieldTable`); a value
without one (restored from an older journal record) gets the type pika would send it as.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from vibemq_server.core import CoreError

#: The arguments a redeclare must repeat, in RabbitMQ's order (the first difference is named).
EQUIVALENT: tuple[str, ...] = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-queue-type",
    "x-queue-master-locator",
)

#: Arguments whose absence means a value: RabbitMQ takes a missing x-queue-type as "classic".
_DEFAULTS: dict[str, tuple[str, Any]] = {"x-queue-type": ("longstr", "classic")}

Typed = tuple[str, Any]
"""An argument's (RabbitMQ type name, value)."""

_CLASSES: dict[str, str] = {
    "byte": "int",
    "unsignedbyte": "int",
    "short": "int",
    "unsignedshort": "int",
    "signedint": "int",
    "unsignedint": "int",
    "long": "int",
    "decimal": "int",
    "float": "float",
    "double": "float",
}


class QueueMismatch(CoreError):
    """A redeclare that differs from the queue: AMQP 406 PRECONDITION_FAILED."""


def _int_type(value: int) -> str:
    return "signedint" if -(2**31) <= value < 2**31 else "long"


def _named(name: str) -> Callable[[Any], str]:
    return lambda _value: name


_INFERRED: tuple[tuple[Any, Callable[[Any], str]], ...] = (
    (bool, _named("bool")),  # before int
    (int, _int_type),
    (float, _named("double")),
    (str, _named("longstr")),
    (bytes | bytearray, _named("binary")),
    (Decimal, _named("decimal")),
    (dt.datetime, _named("timestamp")),
    (Mapping, _named("table")),
    (list | tuple, _named("array")),
)


def infer_type(value: Any) -> str:
    """The type pika encodes a Python value as (for values that lost their wire type)."""
    for kind, name in _INFERRED:
        if isinstance(value, kind):
            return name(value)
    return "void"


def typed_arguments(args: Mapping[str, Any]) -> dict[str, Typed]:
    """The compared arguments of a declare, each with its wire type."""
    types: Mapping[str, str] = getattr(args, "types", {})
    return {
        key: (types.get(key) or infer_type(args[key]), args[key])
        for key in EQUIVALENT
        if key in args
    }


def _same(value: Any) -> Any:
    """Erlang's view of a value: longstr and binary are both binaries."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def _equivalent(old: Typed, new: Typed) -> bool:
    (old_type, old_value), (new_type, new_value) = old, new
    a, b = _same(old_value), _same(new_value)
    if _CLASSES.get(old_type, old_type) == _CLASSES.get(new_type, new_type):
        return bool(a == b)
    # Across type classes only the very same value passes (Erlang's pattern match: 5 is not
    # 5.0, 1 is not true; a longstr and a binary of the same bytes are).
    return type(a) is type(b) and bool(a == b)


def _shown(value: Any) -> str:
    """A value as RabbitMQ's texts print it (Erlang's ~ts / ~tp)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _side(typed: Typed | None, both: bool) -> str:
    if typed is None:
        return "none"
    if both:
        return f"'{_shown(typed[1])}'"
    return f"the value '{_shown(typed[1])}' of type '{typed[0]}'"


def inequivalent(what: str, queue: str, received: str, current: str) -> QueueMismatch:
    return QueueMismatch(
        f"inequivalent arg '{what}' for queue '{queue}' in vhost '/': "
        f"received {received} but current is {current}"
    )


def check_flags(queue: str, durable: tuple[bool, bool], auto_delete: tuple[bool, bool]) -> None:
    """durable, then auto_delete, each as (current, received): RabbitMQ's first two checks."""
    for what, (current, received) in (("durable", durable), ("auto_delete", auto_delete)):
        if current != received:
            raise inequivalent(what, queue, f"'{_shown(received)}'", f"'{_shown(current)}'")


def check_arguments(
    queue: str, current: Mapping[str, Typed], received: Mapping[str, Typed]
) -> None:
    """Raise QueueMismatch, worded as RabbitMQ does, at the first argument that differs."""
    for key in EQUIVALENT:
        old = current.get(key) or _DEFAULTS.get(key)
        new = received.get(key) or _DEFAULTS.get(key)
        if old is None and new is None:
            continue
        if old is not None and new is not None and _equivalent(old, new):
            continue
        both = old is not None and new is not None
        raise inequivalent(key, queue, _side(new, both), _side(old, both))


# -- validation of a new queue's arguments (RabbitMQ's declare_args checks and wording) -------

_INTEGERS = frozenset(
    {"byte", "unsignedbyte", "short", "unsignedshort", "signedint", "unsignedint", "long"}
)
_OVERFLOWS = frozenset({"drop-head", "reject-publish", "reject-publish-dlx"})
_STRINGS = frozenset({"longstr", "binary"})


class InvalidQueueArgument(CoreError):
    """A new queue's argument of the wrong type or value: AMQP 406 PRECONDITION_FAILED."""


def _integer(kind: str, value: Any) -> str | None:
    if kind not in _INTEGERS:
        return f'"expected integer, got {kind}"'
    return f"{{value_negative,{value}}}" if value < 0 else None


def _positive(kind: str, value: Any, args: Mapping[str, Any]) -> str | None:
    error = _integer(kind, value)
    return error or ("{value_zero,0}" if value == 0 else None)


def _non_negative(kind: str, value: Any, args: Mapping[str, Any]) -> str | None:
    return _integer(kind, value)


def _priority(kind: str, value: Any, args: Mapping[str, Any]) -> str | None:
    error = _integer(kind, value)
    return error or (f"{{max_value_exceeded,{value}}}" if value > 255 else None)


def _string(kind: str, value: Any, args: Mapping[str, Any]) -> str | None:
    return None if kind in _STRINGS else f"{{unacceptable_type,{kind}}}"


def _dead_letter_key(kind: str, value: Any, args: Mapping[str, Any]) -> str | None:
    if kind not in _STRINGS:
        return f"{{unacceptable_type,{kind}}}"
    return None if "x-dead-letter-exchange" in args else "routing_key_but_no_dlx_defined"


def _overflow(kind: str, value: Any, args: Mapping[str, Any]) -> str | None:
    if kind not in _STRINGS:
        return f"{{unacceptable_type,{kind}}}"
    return None if _shown(value) in _OVERFLOWS else "invalid_overflow"


#: RabbitMQ's validators of the arguments this broker implements, in its order.
_VALIDATORS: tuple[tuple[str, Callable[[str, Any, Mapping[str, Any]], str | None]], ...] = (
    ("x-expires", _positive),
    ("x-message-ttl", _non_negative),
    ("x-dead-letter-exchange", _string),
    ("x-dead-letter-routing-key", _dead_letter_key),
    ("x-max-length", _non_negative),
    ("x-max-length-bytes", _non_negative),
    ("x-max-priority", _priority),
    ("x-overflow", _overflow),
)


def validate_arguments(queue: str, args: Mapping[str, Any]) -> None:
    """A new queue's arguments, or InvalidQueueArgument worded as RabbitMQ words it."""
    types: Mapping[str, str] = getattr(args, "types", {})
    dlx = args.get("x-dead-letter-exchange")
    if dlx is not None:
        kind = types.get("x-dead-letter-exchange") or infer_type(dlx)
        if kind not in _STRINGS:  # RabbitMQ's channel looks at the dead-letter exchange first
            raise InvalidQueueArgument(
                f"invalid type '{kind}' for arg 'x-dead-letter-exchange' in queue '{queue}' "
                "in vhost '/'"
            )
    for key, check in _VALIDATORS:
        if key in args:
            value = args[key]
            error = check(types.get(key) or infer_type(value), value, args)
            if error is not None:
                raise InvalidQueueArgument(
                    f"invalid arg '{key}' for queue '{queue}' in vhost '/': {error}"
                )
