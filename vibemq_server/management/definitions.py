"""Definitions: a broker's queues, AMQP exchanges and bindings, users and permissions as one
JSON document (RabbitMQ's definitions), exported from one broker and imported into another.

Export never holds a plain password: users come with their scrypt hashes (the users file's);
users of the config's plain ``users`` table are configuration, not definitions, and are left
out. The broker's own state is left out too: ``$``-named queues (MQTT sessions, durable
tables), AMQP's predeclared exchanges, exclusive queues (a connection's own).

Import validates the whole document first (pydantic: an error names the field), then creates
what is missing and leaves what exists: something that exists with other settings (a queue's
options, an exchange's type, a user's hash) is reported as a conflict and not changed. Users
are written through the users file's own locked, atomic writer (``UserStore.change``, as
``vibemq-server users``) and are in force at once.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vibemq_server import __version__
from vibemq_server.auth import User, UserStore
from vibemq_server.auth.passwords import check_hash
from vibemq_server.config import DeliveryMode, OverflowStrategy
from vibemq_server.core import CoreError, QueueManager, QueueOptions
from vibemq_server.core.exchanges import (
    EXCHANGE,
    QUEUE,
    Exchanges,
    ExchangeType,
    canonical_arguments,
    decode_arguments,
)
from vibemq_server.core.permissions import check_patterns
from vibemq_server.server.broker import Broker

FORMAT_VERSION = 1


@runtime_checkable
class AmqpQueues(Protocol):
    """What definitions use of the AMQP adapter (``AmqpServer``), when it runs."""

    exchanges: Exchanges | None

    def queue_definition(self, name: str) -> dict[str, Any] | None: ...

    def declare_queue(
        self, name: str, durable: bool, auto_delete: bool, arguments: Mapping[str, Any]
    ) -> None: ...

    def queue_options(self, durable: bool, args: Mapping[str, Any]) -> QueueOptions: ...


# -- the document ----------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _client_name(name: str) -> str:
    if name.startswith("$"):
        raise ValueError("names starting with '$' are the broker's own")
    return name


class QueueOptionsDef(_Strict):
    """The core's queue options (docs/protocol.md, CreateQueue); a missing one is the
    broker's default (``queue_defaults``)."""

    delivery_mode: DeliveryMode | None = None
    max_queue_size: int | None = Field(None, ge=1)
    message_ttl_ms: int | None = Field(None, ge=0)
    enable_dead_letter_queue: bool | None = None
    dead_letter_queue_name: str | None = None
    max_retry_attempts: int | None = Field(None, ge=1)
    ack_timeout_ms: int | None = Field(None, ge=1)
    overflow_strategy: OverflowStrategy | None = None


class QueueDef(_Strict):
    name: str = Field(min_length=1, max_length=255)
    durable: bool = True
    #: AMQP: deleted when its last consumer goes
    auto_delete: bool = False
    options: QueueOptionsDef = Field(default_factory=QueueOptionsDef)
    #: AMQP x-arguments, for a queue declared over AMQP (they make its options)
    arguments: dict[str, Any] | None = None

    _name = field_validator("name")(_client_name)


class ExchangeDef(_Strict):
    name: str = Field(min_length=1, max_length=255)
    type: ExchangeType
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = Field(default_factory=dict)


class BindingDef(_Strict):
    source: str = Field(description='an exchange ("" is the default exchange: not bindable)')
    destination: str = Field(min_length=1)
    destination_type: Literal["queue", "exchange"]
    routing_key: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)


class UserDef(_Strict):
    name: str = Field(min_length=1)
    password_hash: str
    tags: list[str] = Field(default_factory=list)

    @field_validator("password_hash")
    @classmethod
    def _hash(cls, value: str) -> str:
        try:
            check_hash(value)
        except (ValueError, KeyError, IndexError) as exc:
            raise ValueError(f"not a password hash this broker reads ({exc})") from None
        return value


class PermissionDef(_Strict):
    user: str = Field(min_length=1)
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"

    @model_validator(mode="after")
    def _patterns(self) -> PermissionDef:
        try:
            check_patterns({"configure": self.configure, "write": self.write, "read": self.read})
        except re.error as exc:
            raise ValueError(f"a pattern does not compile: {exc}") from None
        return self


class Definitions(_Strict):
    """One broker's definitions (the document of export and import)."""

    format: int = FORMAT_VERSION
    vibemq_version: str | None = None
    users: list[UserDef] = Field(default_factory=list)
    permissions: list[PermissionDef] = Field(default_factory=list)
    queues: list[QueueDef] = Field(default_factory=list)
    exchanges: list[ExchangeDef] = Field(default_factory=list)
    bindings: list[BindingDef] = Field(default_factory=list)

    @field_validator("format")
    @classmethod
    def _format(cls, value: int) -> int:
        if value != FORMAT_VERSION:
            raise ValueError(f"unknown definitions format {value} (this broker: {FORMAT_VERSION})")
        return value

    @model_validator(mode="after")
    def _unique(self) -> Definitions:
        for what, names in (
            ("users", [u.name for u in self.users]),
            ("permissions", [p.user for p in self.permissions]),
            ("queues", [q.name for q in self.queues]),
            ("exchanges", [x.name for x in self.exchanges]),
        ):
            seen: set[str] = set()
            for name in names:
                if name in seen:
                    raise ValueError(f"{what}: {name!r} is given twice")
                seen.add(name)
        return self


def parse_definitions(raw: str | bytes | Mapping[str, Any]) -> Definitions:
    """A document (JSON text or decoded), or pydantic's ValidationError naming the field."""
    if isinstance(raw, str | bytes):
        return Definitions.model_validate_json(raw)
    return Definitions.model_validate(raw)


ConflictKind = Literal["user", "permission", "queue", "exchange", "binding"]


class Conflict(BaseModel):
    kind: ConflictKind
    name: str
    reason: str


class ImportReport(BaseModel):
    """What an import did: created, already there as given (unchanged), conflicts (left as
    they are on the broker)."""

    created: dict[str, list[str]]
    unchanged: dict[str, list[str]]
    conflicts: list[Conflict]

    @property
    def ok(self) -> bool:
        return not self.conflicts


# -- export ----------------------------------------------------------------------------------


def _amqp(broker: Broker) -> AmqpQueues | None:
    adapter = broker.adapters.get("amqp")
    return adapter if isinstance(adapter, AmqpQueues) else None


def _json_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """An argument table as JSON (bytes, decimals and timestamps tagged: core.exchanges)."""
    doc: dict[str, Any] = json.loads(canonical_arguments(arguments))
    return doc


def _options_def(options: QueueOptions) -> QueueOptionsDef:
    return QueueOptionsDef(
        delivery_mode=options.delivery_mode,
        max_queue_size=options.max_queue_size,
        message_ttl_ms=options.message_ttl_ms,
        enable_dead_letter_queue=options.enable_dead_letter_queue,
        dead_letter_queue_name=options.dead_letter_queue_name,
        max_retry_attempts=options.max_retry_attempts,
        ack_timeout_ms=options.ack_timeout_ms,
        overflow_strategy=options.overflow_strategy,
    )


def export_definitions(broker: Broker) -> Definitions:
    """The broker's definitions now, sorted by name (the same broker exports the same
    document)."""
    users = broker.auth.users
    amqp = _amqp(broker)
    queues: list[QueueDef] = []
    for name in sorted(broker.manager.queues):
        if name.startswith("$"):
            continue
        queue = broker.manager.queues[name]
        declared = amqp.queue_definition(name) if amqp is not None else None
        if declared is not None and declared["exclusive"]:
            continue  # a connection's own: gone with it
        queues.append(
            QueueDef(
                name=name,
                durable=queue.options.durable,
                auto_delete=bool(declared and declared["auto_delete"]),
                options=_options_def(queue.options),
                arguments=_json_arguments(declared["arguments"]) if declared else None,
            )
        )
    exported = {q.name for q in queues}
    exchanges: list[ExchangeDef] = []
    bindings: list[BindingDef] = []
    table = amqp.exchanges if amqp is not None else None
    if table is not None:
        for exchange in sorted(table.all(), key=lambda x: x.name):
            if not exchange.name or exchange.name.startswith("amq."):
                continue  # predeclared by every broker
            exchanges.append(
                ExchangeDef(
                    name=exchange.name,
                    type=exchange.type,
                    durable=exchange.durable,
                    auto_delete=exchange.auto_delete,
                    internal=exchange.internal,
                    arguments=_json_arguments(exchange.arguments),
                )
            )
        for binding in table.bindings():
            if binding.dest_kind == QUEUE and binding.destination not in exported:
                continue  # an exclusive or internal queue's
            bindings.append(
                BindingDef(
                    source=binding.source,
                    destination=binding.destination,
                    destination_type="queue" if binding.dest_kind == QUEUE else "exchange",
                    routing_key=binding.routing_key,
                    arguments=json.loads(binding.arguments),
                )
            )
        bindings.sort(key=lambda b: (b.source, b.destination_type, b.destination, b.routing_key))
    return Definitions(
        vibemq_version=__version__,
        users=[
            UserDef(name=name, password_hash=users[name].password_hash, tags=list(users[name].tags))
            for name in sorted(users)
        ],
        permissions=[PermissionDef(user=name, **users[name].permissions) for name in sorted(users)],
        queues=queues,
        exchanges=exchanges,
        bindings=bindings,
    )


# -- import ----------------------------------------------------------------------------------


class _Import:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.manager: QueueManager = broker.manager
        self.amqp = _amqp(broker)
        self.created: dict[str, list[str]] = {k: [] for k in _KINDS}
        self.unchanged: dict[str, list[str]] = {k: [] for k in _KINDS}
        self.conflicts: list[Conflict] = []

    def conflict(self, kind: ConflictKind, name: str, reason: str) -> None:
        self.conflicts.append(Conflict(kind=kind, name=name, reason=reason))

    def report(self) -> ImportReport:
        return ImportReport(
            created=self.created, unchanged=self.unchanged, conflicts=self.conflicts
        )

    # users and permissions

    def users(self, doc: Definitions) -> None:
        if not doc.users and not doc.permissions:
            return
        wanted = {u.name: u for u in doc.users}
        permissions = {
            p.user: {"configure": p.configure, "write": p.write, "read": p.read}
            for p in doc.permissions
        }

        def edit(users: dict[str, User]) -> None:
            for name, user in wanted.items():
                existing = users.get(name)
                if existing is None:
                    users[name] = User(name, user.password_hash, list(user.tags))
                    if name in permissions:
                        users[name].permissions = dict(permissions[name])
                    self.created["users"].append(name)
                    continue
                differs = [
                    what
                    for what, same in (
                        ("password_hash", existing.password_hash == user.password_hash),
                        ("tags", existing.tags == user.tags),
                        (
                            "permissions",
                            permissions.get(name, existing.permissions) == existing.permissions,
                        ),
                    )
                    if not same
                ]
                if differs:
                    self.conflict("user", name, f"exists with other {', '.join(differs)}")
                else:
                    self.unchanged["users"].append(name)
            for name, perms in permissions.items():
                if name in wanted:
                    continue
                if name not in users:
                    self.conflict("permission", name, "no such user")
                elif users[name].permissions != perms:
                    self.conflict("permission", name, "the user has other permissions")

        # The users file's own writer: locked, re-read, written atomically (0600, fsync).
        UserStore(self.broker.config.users_path).change(edit)
        if self.created["users"]:
            self.broker.auth.reload()  # in force now, not at the next check of the file

    # queues

    def _options(self, queue: QueueDef) -> QueueOptions:
        given = queue.options.model_dump(exclude_none=True)
        defaults = self.manager.options_from()
        return QueueOptions(
            **{
                **{f.name: getattr(defaults, f.name) for f in dataclasses.fields(QueueOptions)},
                **given,
                "durable": queue.durable,
            }
        )

    def queue(self, queue: QueueDef) -> None:
        name = queue.name
        existing = self.manager.queues.get(name)
        if queue.arguments is not None:
            if self.amqp is None:
                self.conflict("queue", name, "has AMQP arguments but AMQP is off")
                return
            arguments = decode_arguments(json.dumps(queue.arguments))
            if existing is None:
                try:
                    self.amqp.declare_queue(name, queue.durable, queue.auto_delete, arguments)
                except CoreError as exc:
                    self.conflict("queue", name, str(exc))
                    return
                self.created["queues"].append(name)
                return
            declared = self.amqp.queue_definition(name)
            current = declared["arguments"] if declared is not None else None
            if current != arguments:
                self.conflict("queue", name, "exists with other arguments")
            elif declared is not None and declared["auto_delete"] != queue.auto_delete:
                self.conflict("queue", name, "exists with other auto_delete")
            elif existing.options.durable != queue.durable:
                self.conflict("queue", name, "exists with other durable")
            else:
                self.unchanged["queues"].append(name)
            return
        options = self._options(queue)
        if existing is None:
            self.manager.create_queue(name, options)
            self.created["queues"].append(name)
            return
        differs = [
            f.name
            for f in dataclasses.fields(QueueOptions)
            if getattr(existing.options, f.name) != getattr(options, f.name)
        ]
        if differs:
            self.conflict("queue", name, f"exists with other {', '.join(differs)}")
        else:
            self.unchanged["queues"].append(name)

    # exchanges and bindings

    def exchange(self, exchange: ExchangeDef) -> None:
        name = exchange.name
        table = self.amqp.exchanges if self.amqp is not None else None
        if table is None:
            self.conflict("exchange", name, "AMQP is off")
            return
        arguments = decode_arguments(json.dumps(exchange.arguments))
        existing = table.get(name)
        if existing is None:
            try:
                table.declare(
                    name,
                    exchange.type,
                    durable=exchange.durable,
                    auto_delete=exchange.auto_delete,
                    internal=exchange.internal,
                    arguments=arguments,
                )
            except CoreError as exc:
                self.conflict("exchange", name, str(exc))
                return
            self.created["exchanges"].append(name)
            return
        differs = [
            what
            for what, old, new in (
                ("type", existing.type, exchange.type),
                ("durable", existing.durable, exchange.durable),
                ("auto_delete", existing.auto_delete, exchange.auto_delete),
                ("internal", existing.internal, exchange.internal),
                ("arguments", existing.arguments, arguments),
            )
            if old != new
        ]
        if differs:
            self.conflict("exchange", name, f"exists with other {', '.join(differs)}")
        else:
            self.unchanged["exchanges"].append(name)

    def binding(self, binding: BindingDef) -> None:
        label = (
            f"{binding.source} -> {binding.destination_type} {binding.destination} "
            f"({binding.routing_key!r})"
        )
        table = self.amqp.exchanges if self.amqp is not None else None
        if table is None:
            self.conflict("binding", label, "AMQP is off")
            return
        kind = QUEUE if binding.destination_type == "queue" else EXCHANGE
        arguments = decode_arguments(json.dumps(binding.arguments))
        key = canonical_arguments(arguments)
        there = any(
            (b.source, b.dest_kind, b.destination, b.routing_key, b.arguments)
            == (binding.source, kind, binding.destination, binding.routing_key, key)
            for b in table.bindings()
        )
        if there:
            self.unchanged["bindings"].append(label)
            return
        if kind == QUEUE and binding.destination not in self.manager.queues:
            self.conflict("binding", label, f"no queue {binding.destination!r}")
            return
        try:
            if kind == QUEUE:
                table.bind_queue(
                    binding.destination, binding.source, binding.routing_key, arguments
                )
            else:
                table.bind_exchange(
                    binding.destination, binding.source, binding.routing_key, arguments
                )
        except CoreError as exc:
            self.conflict("binding", label, str(exc))
            return
        self.created["bindings"].append(label)


_KINDS = ("users", "queues", "exchanges", "bindings")


def import_definitions(
    broker: Broker, document: Definitions | str | bytes | Mapping[str, Any]
) -> ImportReport:
    """Create what the document has and the broker lacks; report the rest. A document that
    does not validate raises pydantic's ValidationError before anything is changed."""
    doc = document if isinstance(document, Definitions) else parse_definitions(document)
    run = _Import(broker)
    run.users(doc)
    for queue in doc.queues:
        run.queue(queue)
    for exchange in doc.exchanges:
        run.exchange(exchange)
    for binding in doc.bindings:
        run.binding(binding)
    return run.report()
