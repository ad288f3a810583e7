"""AMQP exchanges and bindings as an operator sees them: list, detail, declare, delete, bind,
unbind -- RabbitMQ's management API in spirit (its field names, its answers).

Everything goes through the core's ``Exchanges`` of the AMQP adapter, the very methods the
adapter's ``exchange.declare``/``queue.bind`` handlers call: durable exchanges and the
bindings between durable ends land in the same journal tables (``$amqp.exchanges``,
``$amqp.bindings``) and come back after a restart. The adapter is reached through a
Protocol (``AmqpExchanges``): this layer imports no adapter. Synchronous, called from the
broker's event loop.

Arguments are plain JSON here (a JSON array is a list, a string a string); an argument value
AMQP carries that JSON lacks is shown as text: bytes as UTF-8 (base64 when they are not),
decimals and timestamps as strings.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections import Counter
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from vibemq_server.core import CoreError, PersistenceUnavailable, QueueNotFound
from vibemq_server.core.exchanges import (
    EXCHANGE,
    QUEUE,
    Binding,
    Exchange,
    ExchangeAccessRefused,
    ExchangeInUse,
    ExchangeMismatch,
    ExchangeNotFound,
    Exchanges,
    ExchangeType,
    InvalidArguments,
    InvalidExchangeType,
    canonical_arguments,
)
from vibemq_server.management.errors import (
    Conflict,
    Forbidden,
    Invalid,
    ManagementError,
    NotFound,
    Unavailable,
)
from vibemq_server.server.broker import Broker

#: the name the default exchange ("") goes by in a path (RabbitMQ's management API's)
DEFAULT_EXCHANGE_ALIAS = "amq.default"

DestinationType = Literal["queue", "exchange"]
_KINDS: dict[str, str] = {"queue": QUEUE, "exchange": EXCHANGE}


@runtime_checkable
class AmqpExchanges(Protocol):
    """What this module uses of the AMQP adapter (``AmqpServer``), when it runs: its
    exchanges (None until the journal is recovered)."""

    exchanges: Exchanges | None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExchangeOut(_Model):
    name: str = Field(description='"" is the default exchange (amq.default in a path)')
    type: ExchangeType
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]
    predeclared: bool = Field(description="the default exchange or amq.*: not changeable")
    bindings_out: int = Field(description="bindings it is the source of")
    bindings_in: int = Field(description="exchange-to-exchange bindings it is the destination of")


class ExchangeIn(_Model):
    """An exchange to declare (RabbitMQ's management API's fields)."""

    type: ExchangeType
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = Field(default_factory=dict)


class BindingOut(_Model):
    source: str
    destination: str
    destination_type: DestinationType
    routing_key: str
    arguments: dict[str, Any]
    durable: bool = Field(description="both ends durable: kept across restarts")


class BindingIn(_Model):
    source: str = Field(min_length=1, description="an exchange (the default one is implicit)")
    destination: str = Field(min_length=1)
    destination_type: DestinationType = "queue"
    routing_key: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)


# -- arguments as JSON -------------------------------------------------------------------------


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii")


def _plain(value: Any) -> Any:
    """An AMQP argument value as plain JSON."""
    if isinstance(value, bytes | bytearray | memoryview):
        return _text(bytes(value))
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def plain_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _plain(value) for key, value in arguments.items()}


# -- the adapter's table ------------------------------------------------------------------------


def exchange_table(broker: Broker) -> Exchanges:
    """The AMQP adapter's exchanges; NotFound when AMQP is off."""
    adapter = broker.adapters.get("amqp")
    table = adapter.exchanges if isinstance(adapter, AmqpExchanges) else None
    if table is None:
        raise NotFound("AMQP is off on this broker: it has no exchanges")
    return table


def _name(path_name: str) -> str:
    return "" if path_name == DEFAULT_EXCHANGE_ALIAS else path_name


def _predeclared(name: str) -> bool:
    return not name or name.startswith("amq.")


def _refused(exc: CoreError, field: str | None = None) -> ManagementError:
    """A core refusal as a management one (RabbitMQ's management API's answers)."""
    message = str(exc)
    kinds: tuple[tuple[type[CoreError], type[ManagementError]], ...] = (
        (ExchangeNotFound, NotFound),
        (QueueNotFound, NotFound),
        (ExchangeMismatch, Conflict),
        (ExchangeInUse, Conflict),
        (ExchangeAccessRefused, Forbidden),
        (InvalidExchangeType, Invalid),
        (InvalidArguments, Invalid),
        (PersistenceUnavailable, Unavailable),
    )
    for core, kind in kinds:
        if isinstance(exc, core):
            return kind(message, field if kind is Invalid else None)
    return Invalid(message, field)


def _binding_counts(table: Exchanges) -> tuple[Counter[str], Counter[str]]:
    """Per exchange: bindings it is the source of, exchange bindings into it (one pass)."""
    out: Counter[str] = Counter()
    into: Counter[str] = Counter()
    for binding in table.bindings():
        out[binding.source] += 1
        if binding.dest_kind == EXCHANGE:
            into[binding.destination] += 1
    return out, into


def _exchange_out(exchange: Exchange, counts: tuple[Counter[str], Counter[str]]) -> ExchangeOut:
    name = exchange.name
    return ExchangeOut(
        name=name,
        type=exchange.type,
        durable=exchange.durable,
        auto_delete=exchange.auto_delete,
        internal=exchange.internal,
        arguments=plain_arguments(exchange.arguments),
        predeclared=_predeclared(name),
        bindings_out=counts[0][name],
        bindings_in=counts[1][name],
    )


def list_exchanges(broker: Broker) -> list[ExchangeOut]:
    """Every exchange, the predeclared ones first, then in declaration order."""
    table = exchange_table(broker)
    counts = _binding_counts(table)
    return [_exchange_out(x, counts) for x in table.all()]


def get_exchange(broker: Broker, name: str) -> ExchangeOut:
    table = exchange_table(broker)
    exchange = table.get(_name(name))
    if exchange is None:
        raise NotFound(f"exchange {name!r} not found")
    return _exchange_out(exchange, _binding_counts(table))


def declare_exchange(broker: Broker, name: str, spec: ExchangeIn) -> tuple[ExchangeOut, bool]:
    """exchange.declare: (the exchange, whether it was created). An exchange that exists
    with the same settings is fine; with others it is a Conflict (AMQP's 406)."""
    table = exchange_table(broker)
    name = _name(name)
    existed = table.get(name) is not None
    try:
        exchange = table.declare(
            name,
            spec.type,
            durable=spec.durable,
            auto_delete=spec.auto_delete,
            internal=spec.internal,
            arguments=spec.arguments,
        )
    except CoreError as exc:
        raise _refused(exc, "arguments") from None
    return _exchange_out(exchange, _binding_counts(table)), not existed


def delete_exchange(broker: Broker, name: str, *, if_unused: bool = False) -> None:
    """exchange.delete, with the bindings it is the source or destination of."""
    table = exchange_table(broker)
    try:
        table.delete(_name(name), if_unused=if_unused)
    except CoreError as exc:
        raise _refused(exc) from None


# -- bindings ------------------------------------------------------------------------------------


def _binding_out(binding: Binding, durable: bool) -> BindingOut:
    return BindingOut(
        source=binding.source,
        destination=binding.destination,
        destination_type="queue" if binding.dest_kind == QUEUE else "exchange",
        routing_key=binding.routing_key,
        arguments=plain_arguments(binding.argument_table),
        durable=durable,
    )


def _durable(broker: Broker, table: Exchanges, binding: Binding) -> bool:
    source = table.get(binding.source)
    if binding.dest_kind == QUEUE:
        queue = broker.manager.queues.get(binding.destination)
        dest_durable = queue is not None and queue.options.durable
    else:
        dest = table.get(binding.destination)
        dest_durable = dest is not None and dest.durable
    return source is not None and source.durable and dest_durable


def list_bindings(
    broker: Broker,
    source: str | None = None,
    destination: str | None = None,
    destination_type: DestinationType | None = None,
) -> list[BindingOut]:
    """Every explicit binding (oldest first), of one source and/or destination if given.
    Bindings into the adapters' own ``$`` queues (MQTT's) are left out."""
    table = exchange_table(broker)
    kind = _KINDS[destination_type] if destination_type else None
    return [
        _binding_out(b, _durable(broker, table, b))
        for b in table.bindings()
        if (source is None or b.source == _name(source))
        and (destination is None or b.destination == destination)
        and (kind is None or b.dest_kind == kind)
        and not (b.dest_kind == QUEUE and b.destination.startswith("$"))
    ]


def _check_destination(spec: BindingIn) -> None:
    if spec.destination_type == "queue" and spec.destination.startswith("$"):
        raise Forbidden(f"queue {spec.destination!r} belongs to an adapter: not bound over HTTP")


def _find(table: Exchanges, spec: BindingIn) -> Binding | None:
    try:
        key = canonical_arguments(spec.arguments)
    except CoreError as exc:
        raise _refused(exc, "arguments") from None
    wanted = (spec.source, _KINDS[spec.destination_type], spec.destination, spec.routing_key, key)
    for binding in table.bindings():
        if (
            binding.source,
            binding.dest_kind,
            binding.destination,
            binding.routing_key,
            binding.arguments,
        ) == wanted:
            return binding
    return None


def create_binding(broker: Broker, spec: BindingIn) -> tuple[BindingOut, bool]:
    """queue.bind / exchange.bind: (the binding, whether it is new). 404 when an end is not
    there, 403 for the default exchange, 400 for arguments a headers exchange refuses."""
    table = exchange_table(broker)
    _check_destination(spec)
    existed = _find(table, spec) is not None
    try:
        if spec.destination_type == "queue":
            table.bind_queue(spec.destination, spec.source, spec.routing_key, spec.arguments)
        else:
            table.bind_exchange(spec.destination, spec.source, spec.routing_key, spec.arguments)
    except CoreError as exc:
        raise _refused(exc, "arguments") from None
    binding = _find(table, spec)
    assert binding is not None
    return _binding_out(binding, _durable(broker, table, binding)), not existed


def delete_binding(broker: Broker, spec: BindingIn) -> BindingOut:
    """queue.unbind / exchange.unbind of exactly this binding; NotFound when it is not there
    (AMQP's unbind says ok to that; an operator is told)."""
    table = exchange_table(broker)
    _check_destination(spec)
    binding = _find(table, spec)
    if binding is None:
        raise NotFound(
            f"no binding {spec.source!r} -> {spec.destination_type} {spec.destination!r} "
            f"with routing key {spec.routing_key!r} and these arguments"
        )
    removed = _binding_out(binding, _durable(broker, table, binding))
    try:
        if spec.destination_type == "queue":
            table.unbind_queue(spec.destination, spec.source, spec.routing_key, spec.arguments)
        else:
            table.unbind_exchange(spec.destination, spec.source, spec.routing_key, spec.arguments)
    except CoreError as exc:
        raise _refused(exc) from None
    return removed
