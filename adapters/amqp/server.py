"""The AMQP 0-9-1 side of one broker: listener, exchanges, queue declarations, routing, auth.

The listener is the shared ``StreamTransport`` (socket, write batching, flow control, the
connection limit) carrying each client's sans-IO ``AmqpConnection`` (connection.py); this
module is what those connections use of the broker (``base.Server``).

AMQP queues are the broker's queues: a VibeMQ subscriber of ``orders`` and an AMQP consumer
of ``orders`` compete on the same queue. A publish to the default exchange or to ``amq.topic``
is also a publish at the address of its routing key, handed to the core (``QueueManager.route``)
for every protocol's subscribers (MQTT subscriptions are, in effect, bound to ``amq.topic``);
and this server is the AMQP sink among them (``deliver``): a publish at an address from
another protocol reaches the AMQP queues bound to ``amq.topic`` with a matching key. Message
mapping: see ``mapping.py`` and docs/amqp.md.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
import ssl
from collections.abc import Callable, Mapping
from typing import Any, cast

import structlog

from vibemq_server.adapters.amqp.arguments import (
    EQUIVALENT,
    Typed,
    check_arguments,
    check_flags,
    infer_type,
    typed_arguments,
    validate_arguments,
)
from vibemq_server.adapters.amqp.channel import AmqpConsumer, consumer_count
from vibemq_server.adapters.amqp.codec import decode_properties, encode_properties, text
from vibemq_server.adapters.amqp.connection import AmqpConnection
from vibemq_server.adapters.amqp.mapping import EXCHANGE, ROUTING_KEY, MessageMapper
from vibemq_server.auth import Verdict
from vibemq_server.auth.authenticator import Offload
from vibemq_server.config import DeliveryMode, OverflowStrategy
from vibemq_server.core import (
    CoreError,
    DeadLetterReason,
    Priority,
    PublishOutcome,
    Queue,
    QueueOptions,
    StoredMessage,
)
from vibemq_server.core.exchanges import Exchanges, canonical_arguments, decode_arguments
from vibemq_server.core.permissions import Access
from vibemq_server.core.routing import AddressSink, MessageSource
from vibemq_server.core.table import DurableTable
from vibemq_server.server.adapter import AdapterContext
from vibemq_server.server.listeners import Listeners
from vibemq_server.server.transport import StreamTransport

log = structlog.get_logger("vibemq.amqp")

#: Without x-max-length an AMQP queue is unbounded, as in RabbitMQ (the memory high
#: watermark pauses publishers instead).
UNBOUNDED = 2**62
#: RabbitMQ's default consumer timeout: an unacknowledged delivery goes back after 30 min.
ACK_TIMEOUT_MS = 30 * 60 * 1000

QUEUES_TABLE = "$amqp.queues"
#: Header of a ``$amqp.queues`` record that holds every compared argument (the headers are
#: their wire types); older records hold only the adapter's own arguments.
_COMPARED = "$compared"
#: Queue arguments the adapter itself implements (the rest map onto core queue options).
_KEPT_ARGS = frozenset(
    {
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-priority",
        "x-overflow",
        "x-expires",
        "x-max-length-bytes",
    }
)
_HAS_EXPIRATION = 0x0100
# Enum members as module constants: an Enum attribute lookup is a Python-level call.
_ACCEPTED = PublishOutcome.ACCEPTED
_ACCEPTED_DURABLE = PublishOutcome.ACCEPTED_DURABLE
_NORMAL = Priority.NORMAL
_HAS_PRIORITY = 0x0800
_DEATH_REASONS = {
    DeadLetterReason.REJECTED: "rejected",
    DeadLetterReason.MAX_RETRIES_EXCEEDED: "delivery_limit",
    DeadLetterReason.MESSAGE_EXPIRED: "expired",
    DeadLetterReason.QUEUE_OVERFLOW: "maxlen",
}

_OVERFLOW = {
    "drop-head": OverflowStrategy.DROP_OLDEST,
    "reject-publish": OverflowStrategy.DROP_NEWEST,
    "reject-publish-dlx": OverflowStrategy.DROP_NEWEST,
}


class QueueArgumentError(CoreError):
    """An x-argument with a wrong type or value (AMQP 406)."""


def _int_arg(args: Mapping[str, Any], name: str, minimum: int) -> int | None:
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise QueueArgumentError(f"invalid arg '{name}' for queue: {value!r}")
    return value


class AmqpServer(AddressSink):
    def __init__(self, context: AdapterContext) -> None:
        config = context.config
        self.config = config
        self.cfg = config.amqp
        self.auth = context.auth
        self.manager = context.manager
        #: the broker's connection registry (connection limit, heartbeats)
        self.register = context.register
        self.unregister = context.unregister
        self.exchanges: Exchanges | None = None
        self.mapper = MessageMapper()
        #: the AMQP counters (bytes, connections, messages, errors by reply code)
        self.stats = context.stats.protocol("amqp")
        # what the connections of a listener share (one per TLS context)
        self._contexts = context.listener_contexts(log, self.stats)
        #: exclusive queue name -> the connection that owns it (compared by identity)
        self.exclusive: dict[str, object] = {}
        #: queue name -> its exclusive consumer
        self.exclusive_consumers: dict[str, AmqpConsumer] = {}
        #: x-arguments the core's queue options do not hold, by queue (dead-lettering,
        #: priorities); durable queues' are kept in the journal table ``$amqp.queues``
        self.queue_args: dict[str, dict[str, Any]] = {}
        #: the arguments a redeclare must repeat (arguments.EQUIVALENT), with their wire
        #: types, by queue declared over AMQP
        self.declared_args: dict[str, dict[str, Typed]] = {}
        self.queue_table: DurableTable | None = None
        self._last_used: dict[str, int] = {}
        #: auto-delete queues: deleted when their last consumer goes
        self.auto_delete: set[str] = set()
        self._ids = itertools.count(1)
        self._conn_ids = itertools.count(1)
        self._id_prefix = f"amqp-{os.urandom(4).hex()}-"
        self.listeners = Listeners(context.tls)
        self.port = 0
        #: output given during a read is written when the read is done (shared by protocols)
        self.batch = context.read_batch
        # The publish being routed at an address (routing key, payload, headers) and its
        # core form, built when another protocol's sink asks for it (see publish()).
        self._own: tuple[str, bytes, Mapping[str, str]] | None = None
        self._own_ttl = 0
        self._own_msg: StoredMessage | None = None
        self._own_message: MessageSource = self._core_message

    def restore(self) -> None:
        """After journal recovery: exchanges, bindings and queue arguments (dead-letter
        exchanges, priorities); hear other protocols' publishes (the AMQP sink)."""
        self.exchanges = Exchanges(self.manager)
        self.queue_table = DurableTable(self.manager, QUEUES_TABLE)
        for name, entry in self.queue_table.items():
            queue = self.manager.queues.get(name)
            if queue is None:
                self.queue_table.delete(name)
                continue
            try:
                args = decode_arguments(entry.payload.decode())
            except (ValueError, UnicodeDecodeError):
                log.warning("unreadable queue arguments dropped", queue=name)
                self.queue_table.delete(name)
                continue
            kept = {k: v for k, v in args.items() if k in _KEPT_ARGS}
            if kept:
                self._apply_args(name, kept)
            if _COMPARED in entry.headers:
                types = entry.headers
                self.declared_args[name] = {
                    k: (types.get(k) or infer_type(v), v)
                    for k, v in args.items()
                    if k in EQUIVALENT
                }
        self.manager.register_sink(self)

    async def start(self) -> None:
        host = self.cfg.host or self.config.host
        tls = self.config.tls
        await self.listeners.open(
            "amqp", self._accept, host, self.cfg.port if tls.plain_amqp else None
        )
        await self.listeners.open("amqp_tls", self._accept, host, tls.amqp_port, tls=True)
        self.port = self.listeners.port("amqp")

    def _accept(self, tls: ssl.SSLContext | None) -> StreamTransport:
        """A new socket: the shared transport, carrying an AMQP connection once the broker's
        connection limit let it in (over the limit the socket just closes)."""
        return StreamTransport(
            lambda link: AmqpConnection(link, self),
            conn_id=f"amqp_{next(self._conn_ids)}",
            context=self._contexts.get(tls),
        )

    def close(self) -> None:
        self.listeners.close()

    def ready(self) -> dict[str, int | str | None]:
        return dict(self.listeners.ports)

    def next_msg_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids)}"

    # -- authentication --------------------------------------------------------------------------

    def login(
        self,
        username: str,
        password: str,
        peer_host: str,
        then: Callable[[Verdict], None],
        offload: Offload,
    ) -> bool:
        """RabbitMQ's rules: ``guest``/``guest`` is the anonymous login (loopback only by
        default, as RabbitMQ's ``loopback_users``) unless a user named guest exists; any
        other credentials are checked, and refused (403) when they match nothing.
        ``Authenticator.login``'s contract: True when ``then`` was called already."""
        secret: str | None = password
        if username == "guest" and password == "guest" and "guest" not in self.auth.users:
            secret = None
        return self.auth.login(username, secret, peer_host, "amqp", then, offload)

    def access(self, user: str) -> Access:
        return self.auth.access(user)

    # -- queues ----------------------------------------------------------------------------------

    def declared(self, name: str, durable: bool, args: Mapping[str, Any]) -> None:
        """A queue was created by queue.declare: keep the arguments the core does not, and
        the ones a redeclare must repeat (with their wire types, for the 406 text)."""
        # Strings the client sent as byte arrays are kept as text (what the adapter compares).
        kept = {
            k: text(v) if isinstance(v, bytes | bytearray) else v
            for k, v in args.items()
            if k in _KEPT_ARGS
        }
        compared = typed_arguments(args)
        self.declared_args[name] = compared
        if kept:
            self._apply_args(name, kept)
        if durable and self.queue_table is not None:
            stored = {**kept, **{k: value for k, (_type, value) in compared.items()}}
            types = {k: kind for k, (kind, _value) in compared.items()}
            self.queue_table.put(
                name, canonical_arguments(stored).encode(), {**types, _COMPARED: "1"}
            )

    # -- definitions (the management API's export and import) -----------------------------------

    def queue_definition(self, name: str) -> dict[str, Any] | None:
        """How a queue was declared over AMQP: ``arguments`` (x-arguments, as declared),
        ``auto_delete``, ``exclusive``; None for a queue no AMQP client declared."""
        typed = self.declared_args.get(name)
        kept = self.queue_args.get(name)
        if typed is None and kept is None:
            return None
        arguments = {**(kept or {}), **{k: value for k, (_kind, value) in (typed or {}).items()}}
        return {
            "arguments": arguments,
            "auto_delete": name in self.auto_delete,
            "exclusive": name in self.exclusive,
        }

    def declare_queue(
        self, name: str, durable: bool, auto_delete: bool, arguments: Mapping[str, Any]
    ) -> None:
        """Create a queue as queue.declare would (definitions import); its arguments are
        checked as a client's (a CoreError when they are wrong)."""
        validate_arguments(name, arguments)
        options = self.queue_options(durable, arguments)
        self.manager.create_queue(name, options)
        self.declared(name, durable, arguments)
        if auto_delete:
            self.auto_delete.add(name)
        self.touch(name)

    def check_redeclare(
        self, queue: Queue, durable: bool, auto_delete: bool, args: Mapping[str, Any]
    ) -> None:
        """queue.declare of an existing queue: the same flags and compared arguments, or
        arguments.QueueMismatch (406) worded as RabbitMQ words it."""
        name = queue.name
        check_flags(name, (queue.options.durable, durable), (name in self.auto_delete, auto_delete))
        received = typed_arguments(args)
        current = self.declared_args.get(name)
        if current is None:
            if not received:
                return  # a queue from another protocol (or an older journal) taken as it is
            current = self._implied_args(queue)
        check_arguments(name, current, received)

    def _implied_args(self, queue: Queue) -> dict[str, Typed]:
        """The arguments a queue not declared over AMQP (or restored from an older journal
        record) stands for: its adapter arguments and its core limits."""
        args: dict[str, Any] = dict(self.queue_args.get(queue.name, {}))
        if queue.options.max_queue_size != UNBOUNDED:
            args["x-max-length"] = queue.options.max_queue_size
        if queue.options.message_ttl_ms:
            args["x-message-ttl"] = queue.options.message_ttl_ms
        return typed_arguments(args)

    def _apply_args(self, name: str, args: Mapping[str, Any]) -> None:
        self.queue_args[name] = dict(args)
        if "x-expires" in args:
            self.touch(name)
        queue = self.manager.queues.get(name)
        if queue is not None and "x-dead-letter-exchange" in args:
            queue.dead_letter_hook = self._dead_letter

    def queue_options(self, durable: bool, args: Mapping[str, Any]) -> QueueOptions:
        ttl = _int_arg(args, "x-message-ttl", 0)
        max_length = _int_arg(args, "x-max-length", 0)
        max_priority = _int_arg(args, "x-max-priority", 0)
        if max_priority is not None and max_priority > 255:
            raise QueueArgumentError(f"invalid arg 'x-max-priority' for queue: {max_priority}")
        _int_arg(args, "x-expires", 1)
        _int_arg(args, "x-max-length-bytes", 0)
        dlx = args.get("x-dead-letter-exchange")
        if dlx is not None and not isinstance(dlx, str | bytes | bytearray):
            raise QueueArgumentError(f"invalid arg 'x-dead-letter-exchange' for queue: {dlx!r}")
        overflow_name = args.get("x-overflow", "drop-head")
        if isinstance(overflow_name, bytes | bytearray):
            overflow_name = overflow_name.decode("utf-8", "replace")
        overflow = _OVERFLOW.get(str(overflow_name))
        if overflow is None:
            raise QueueArgumentError(f"invalid arg 'x-overflow' for queue: {overflow_name!r}")
        return QueueOptions(
            DeliveryMode.PRIORITY_BASED if max_priority else DeliveryMode.ROUND_ROBIN,
            max_length if max_length is not None else UNBOUNDED,
            ttl or 0,
            False,
            "",
            2**31,
            ACK_TIMEOUT_MS,
            overflow,
            durable,
        )

    def message_count(self, name: str) -> tuple[int, int]:
        queue = self.manager.queues.get(name)
        if queue is None:
            return 0, 0
        return queue.message_count, consumer_count(queue)

    def delete_queue(self, name: str) -> int:
        queue = self.manager.queues.get(name)
        count = queue.message_count if queue is not None else 0
        if queue is not None:
            self.manager.delete_queue(name)
        self.exclusive.pop(name, None)
        self.exclusive_consumers.pop(name, None)
        self._last_used.pop(name, None)
        had_args = self.queue_args.pop(name, None) is not None
        if (self.declared_args.pop(name, None) is not None or had_args) and (
            self.queue_table is not None
        ):
            self.queue_table.delete(name)
        self.auto_delete.discard(name)
        if self.exchanges is not None:
            self.exchanges.queue_deleted(name)
        return count

    def connection_gone(self, conn: object) -> None:
        """Exclusive queues die with their connection."""
        for name in [n for n, owner in self.exclusive.items() if owner is conn]:
            try:
                self.delete_queue(name)
            except CoreError:
                self.exclusive.pop(name, None)

    def consumer_ended(self, consumer: AmqpConsumer) -> None:
        if self.exclusive_consumers.get(consumer.queue) is consumer:
            del self.exclusive_consumers[consumer.queue]

    def consumer_gone(self, queue_name: str) -> None:
        """An auto-delete queue goes with its last consumer."""
        if queue_name not in self.auto_delete:
            return
        queue = self.manager.queues.get(queue_name)
        if queue is None or not consumer_count(queue):
            try:
                self.delete_queue(queue_name)
            except CoreError:
                self.auto_delete.discard(queue_name)

    # -- routing ---------------------------------------------------------------------------------

    def publish(
        self,
        exchange: str,
        routing_key: str,
        properties: bytes,
        body: bytes,
    ) -> tuple[int, bool, bool]:
        """Route one message. Returns (queues reached, any refused by a full queue, any
        journaled). The properties are decoded only when the broker needs them (a headers
        exchange, an expiration or a priority)."""
        manager = self.manager
        if exchange:
            exchanges = self.exchanges
            assert exchanges is not None
            kind = exchanges.get(exchange)
            needs_headers = kind is not None and kind.type == "headers"
            queues: list[str] | tuple[str, ...] = exchanges.route(
                exchange,
                routing_key,
                dict(decode_properties(properties).headers or {}) if needs_headers else None,
            )
        elif routing_key in manager.queues and routing_key[:1] != "$":
            queues = (routing_key,)
        else:
            # The default exchange routes by queue name, but never into the adapters' own
            # "$" queues (MQTT sessions, the durable tables): those are not clients' queues.
            queues = ()
        reached = 0
        refused = False
        durable = False
        payload, headers = self.mapper.to_core(exchange, routing_key, properties, body)
        ttl_ms = 0
        amqp_priority = -1
        flags = (properties[0] << 8 | properties[1]) if len(properties) >= 2 else 0
        if flags & (_HAS_EXPIRATION | _HAS_PRIORITY):
            # Only these two properties matter to the broker; decode just when present.
            props = decode_properties(properties)
            ttl_ms = _expiration_ms(props.expiration)
            if props.priority is not None:
                amqp_priority = props.priority
        queue_args = self.queue_args
        for name in queues:
            limits = queue_args.get(name)
            if (
                limits is not None
                and "x-max-length-bytes" in limits
                and not self._room_for_bytes(name, limits, len(payload))
            ):
                refused = True
                continue
            priority = None
            if amqp_priority >= 0 or limits is not None:
                # No priority property counts as 0 in a priority queue (as in RabbitMQ).
                priority = self._priority(name, max(amqp_priority, 0))
            if priority is None and "priority" not in headers:
                priority = _NORMAL  # what the core would make of no priority header
            try:
                outcome = manager.publish(
                    name,
                    f"{self._id_prefix}{next(self._ids)}",  # (next_msg_id, inlined)
                    payload,
                    headers,
                    route=False,
                    ttl_ms=ttl_ms,
                    priority=priority,
                )
            except CoreError as exc:
                log.warning("publish into queue failed", queue=name, error=str(exc))
                refused = True
                continue
            if outcome is _ACCEPTED:
                reached += 1
            elif outcome is _ACCEPTED_DURABLE:
                reached += 1
                durable = True
            else:
                refused = True
                if self.queue_args.get(name, {}).get("x-overflow") == "reject-publish-dlx":
                    queue = manager.queues.get(name)
                    if queue is not None:
                        dead = StoredMessage(self.next_msg_id(), name, payload, headers, 0)
                        self._dead_letter(queue, dead, DeadLetterReason.QUEUE_OVERFLOW)
        if not exchange or exchange == "amq.topic":
            # The routing key is an address for every protocol's subscriptions; the queues
            # were ours to fill (the exchanges did, above). The message for the others is
            # built only if one of them takes it (_core_message).
            # Never re-entered (another protocol's sink never publishes over AMQP).
            self._own = (routing_key, payload, headers)
            self._own_msg = None
            self._own_ttl = ttl_ms
            if manager.route(routing_key, self._own_message, self, into_queue=False):
                durable = True
        return reached, refused, durable

    def _core_message(self) -> StoredMessage:
        """The core form of the publish publish() is routing, for other protocols."""
        msg = self._own_msg
        if msg is None:
            assert self._own is not None
            address, payload, headers = self._own
            # (an expiration goes with it: an MQTT 5 subscriber gets what is left of it)
            expires = self.manager.clock() + self._own_ttl if self._own_ttl else 0
            msg = self._own_msg = StoredMessage(
                self.next_msg_id(), address, payload, headers, 0, expires
            )
        return msg

    def deliver(self, address: str, message: MessageSource, origin: AddressSink | None) -> bool:
        """The core's hand-over of a publish at ``address`` (the AMQP sink): to the queues
        bound to amq.topic, for a publish from another protocol (our own went through our
        exchanges already: amq.topic's bindings, or the default exchange's queue alone)."""
        exchanges = self.exchanges
        if origin is self or exchanges is None or not exchanges.has_bindings("amq.topic"):
            return False
        durable = False
        payload = b""
        headers: Mapping[str, str] | None = None
        ttl_ms = 0
        for name in exchanges.route("amq.topic", address):
            if name == address:
                continue  # the publish went into that queue already
            if headers is None:
                # Delivered as from amq.topic with the address as routing key (as RabbitMQ's
                # MQTT plugin does), not as from the default exchange with the queue's name.
                msg = message()
                payload = msg.payload
                headers = {**msg.headers, EXCHANGE: "amq.topic", ROUTING_KEY: address}
                if msg.expires_at:  # (an MQTT 5 message expiry)
                    ttl_ms = max(1, msg.expires_at - self.manager.clock())
            try:
                outcome = self.manager.publish(
                    name, self.next_msg_id(), payload, headers, route=False, ttl_ms=ttl_ms
                )
            except CoreError:
                continue
            durable |= outcome is PublishOutcome.ACCEPTED_DURABLE
        return durable

    # -- x-expires and x-max-length-bytes ---------------------------------------------------------

    def touch(self, name: str) -> None:
        """The queue was used (declared, consumed from, got from): x-expires starts again."""
        if "x-expires" in self.queue_args.get(name, {}):
            self._last_used[name] = self.manager.clock()

    def tick(self) -> None:
        """Delete queues unused for their x-expires (no consumers, no get, no redeclare)."""
        now = self.manager.clock()
        for name, last in list(self._last_used.items()):
            queue = self.manager.queues.get(name)
            if queue is None:
                del self._last_used[name]
                continue
            if consumer_count(queue):
                self._last_used[name] = now
                continue
            expires = self.queue_args.get(name, {}).get("x-expires")
            if isinstance(expires, int) and now - last >= expires:
                log.debug("queue expired (x-expires)", queue=name)
                del self._last_used[name]
                with contextlib.suppress(CoreError):
                    self.delete_queue(name)

    def _room_for_bytes(self, name: str, args: Mapping[str, Any], size: int) -> bool:
        """x-max-length-bytes: drop from the head (drop-head) or refuse (reject-publish*)."""
        queue = self.manager.queues.get(name)
        limit = args["x-max-length-bytes"]
        if queue is None or not isinstance(limit, int):
            return True
        if size > limit:
            return False
        while queue.nbytes + size > limit:
            if args.get("x-overflow", "drop-head") != "drop-head":
                return False
            if not self.manager.drop_oldest(queue):
                break
        return True

    # -- priorities and dead letters -----------------------------------------------------------

    def _priority(self, queue: str, amqp_priority: int) -> Priority | None:
        """AMQP priorities 0..x-max-priority onto the core's four levels, evenly."""
        max_priority = self.queue_args.get(queue, {}).get("x-max-priority")
        if not isinstance(max_priority, int) or max_priority <= 0:
            return None
        level = min(amqp_priority, max_priority) * len(Priority) // (max_priority + 1)
        return Priority(level)

    def _dead_letter(self, queue: Queue, msg: StoredMessage, reason: str) -> None:
        """Republish a dead message to the queue's dead-letter exchange, with ``x-death``
        written as RabbitMQ writes it."""
        args = self.queue_args.get(queue.name, {})
        exchanges = self.exchanges
        dlx = text(args.get("x-dead-letter-exchange"))
        if exchanges is None or (dlx and exchanges.get(dlx) is None):
            log.debug("dead letter dropped: no such exchange", queue=queue.name, exchange=dlx)
            return
        amqp_reason = _DEATH_REASONS.get(reason, "rejected")
        exchange, routing_key = self.mapper.origin(msg.headers, queue.name)
        raw, body = self.mapper.from_core(msg.payload, msg.headers)
        props = decode_properties(raw)
        headers: dict[str, Any] = dict(props.headers or {})
        old = headers.get("x-death")
        deaths: list[dict[str, Any]] = [
            dict(d) for d in (old if isinstance(old, list) else []) if isinstance(d, dict)
        ]
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        for index, death in enumerate(deaths):
            if death.get("queue") == queue.name and death.get("reason") == amqp_reason:
                death = dict(death, count=int(death.get("count", 0)) + 1, time=now)
                deaths.pop(index)
                deaths.insert(0, death)
                break
        else:
            death = {
                "count": 1,
                "reason": amqp_reason,
                "queue": queue.name,
                "time": now,
                "exchange": exchange,
                "routing-keys": [routing_key],
            }
            if props.expiration:
                death["original-expiration"] = props.expiration
            deaths.insert(0, death)
        headers["x-death"] = deaths
        headers.setdefault("x-first-death-exchange", exchange)
        headers.setdefault("x-first-death-queue", queue.name)
        headers.setdefault("x-first-death-reason", amqp_reason)
        props.headers = cast(Any, headers)
        props.expiration = None  # RabbitMQ drops the per-message TTL of a dead letter
        new_raw = encode_properties(props)
        key = text(args.get("x-dead-letter-routing-key")) or routing_key
        if dlx:
            targets = exchanges.route(dlx, key, headers)
        else:
            targets = [key] if key in self.manager.queues else []
        payload, core_headers = self.mapper.to_core(dlx, key, new_raw, body)
        for name in targets:
            if name == queue.name and amqp_reason != "rejected":
                continue  # RabbitMQ drops dead-letter cycles that no client breaks
            try:
                self.manager.publish(name, self.next_msg_id(), payload, core_headers, route=False)
            except CoreError as exc:
                log.warning("dead letter not stored", queue=name, error=str(exc))


def _expiration_ms(value: object) -> int:
    """The expiration property (milliseconds, as a string); 0 when absent or unusable. An
    expiration of "0" means "now": expire at once, which 1 ms gives."""
    try:
        ms = int(text(value))
    except ValueError:
        return 0
    return max(ms, 1) if ms >= 0 else 0
