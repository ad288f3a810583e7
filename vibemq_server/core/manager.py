"""The queue manager: every queue operation any protocol adapter can ask for.

Synchronous and protocol-free. Time comes from an injected clock; ``tick`` runs TTL expiry,
ack timeouts and the memory watermark, and the server calls it on a timer. A publish at an
address reaches the queue of that name and every protocol's subscribers through ``publish``
(a native Publish) or ``route`` (any other protocol's): see routing.py.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

import structlog

from vibemq_server.config import DeliveryMode, OverflowStrategy, QueueDefaults
from vibemq_server.core.clock import Clock, wall_clock_ms
from vibemq_server.core.drops import DropLog
from vibemq_server.core.message import (
    ANY_SUBSCRIBER,
    EMPTY_HEADERS,
    FanOutMessage,
    Priority,
    StoredMessage,
    as_fan_out,
    message_class,
    parse_priority,
)
from vibemq_server.core.persistence import Persistence, SettleReason
from vibemq_server.core.queue import (
    Consumer,
    Queue,
    QueueHost,
    QueueOptions,
    QueueStats,
    Subscription,
)
from vibemq_server.core.routing import AddressRouter, AddressSink, MessageSource, ready

log = structlog.get_logger("vibemq.core")


class CoreError(Exception):
    """A refused queue operation; adapters map the subclass onto their protocol's error."""


class QueueNotFound(CoreError):
    pass


class QueueExists(CoreError):
    pass


class InvalidQueueOptions(CoreError):
    pass


class PersistenceUnavailable(CoreError):
    """Storage is failing; durable publishes are refused rather than acknowledged falsely."""


class PublishOutcome(Enum):
    ACCEPTED = "accepted"
    ACCEPTED_DURABLE = "accepted_durable"  # acknowledge once persistence says it is durable
    REJECTED_FULL = "rejected_full"  # DropNewest (or RedirectToDlq without a DLQ)
    BLOCKED = "blocked"  # BlockPublisher: not taken; retry when the queue has room

    @property
    def accepted(self) -> bool:
        return self is PublishOutcome.ACCEPTED or self is PublishOutcome.ACCEPTED_DURABLE


#: how many queues ``tick``'s safety net dispatches at most per tick (see ``tick``)
SWEEP_PER_TICK = 1000

#: how many different sets of queue options share one object each (see ``_shared_options``)
_OPTIONS_SHARED: Final = 256

# Hot paths use these: an Enum member looked up on its class costs ~10x a global (pure
# Python; compiled, a member of a compiled module's enum is a C static either way, but
# SettleReason's module is interpreted: see the note on imported names in server/session.py)
_ACCEPTED: Final = PublishOutcome.ACCEPTED
_ACCEPTED_DURABLE: Final = PublishOutcome.ACCEPTED_DURABLE
_NORMAL: Final = Priority.NORMAL
_ACKED: Final = SettleReason.ACKED
#: ``dict.pop`` itself: compiled, ``d.pop(k, None)`` looks the method up by name on every
#: call (``_PyObject_GetMethod``, ``PyObject_VectorcallMethod``); the descriptor called
#: directly skips that: ~100 instructions fewer an Ack (a get and a del: a second lookup)
_DICT_POP: Final = dict.pop


class DeadLetterReason:
    MAX_RETRIES_EXCEEDED: Final = "MaxRetriesExceeded"
    MESSAGE_EXPIRED: Final = "MessageExpired"
    QUEUE_OVERFLOW: Final = "QueueOverflow"
    REJECTED: Final = "Rejected"


#: headers ``dead_letter`` adds; a message moved back out of its dead-letter queue loses them
DEAD_LETTER_HEADERS = frozenset(
    {"deadLetterReason", "originalQueue", "deadLetteredAt", "originalDeliveryAttempts"}
)


@dataclass(slots=True)
class MoveResult:
    """What ``QueueManager.move_messages`` did."""

    #: messages published into their destination, by destination queue
    moved: dict[str, int] = field(default_factory=dict)
    #: messages looked at and left where they were: no destination, destination missing or full
    kept: int = 0

    @property
    def total(self) -> int:
        return sum(self.moved.values())


def iso_ms(ms: int) -> str:
    return (
        dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


# Option names accepted from CreateQueue headers or its JSON payload (both camelCase), with
# the QueueOptions field each one sets.
_OPTION_KEYS: dict[str, str] = {
    "mode": "delivery_mode",
    "deliveryMode": "delivery_mode",
    "maxQueueSize": "max_queue_size",
    "messageTtl": "message_ttl_ms",
    "enableDeadLetterQueue": "enable_dead_letter_queue",
    "deadLetterQueueName": "dead_letter_queue_name",
    "maxRetryAttempts": "max_retry_attempts",
    "ackTimeout": "ack_timeout_ms",
    "overflowStrategy": "overflow_strategy",
    "durable": "durable",
}
_MODES = list(DeliveryMode)
_OVERFLOWS = list(OverflowStrategy)


def _enum_value(kind: list[Any], raw: object, what: str) -> Any:
    """An enum given by name (case-insensitive) or by its number, as the original accepts."""
    if (isinstance(raw, int) and not isinstance(raw, bool)) or (
        isinstance(raw, str) and raw.isdigit()
    ):
        idx = int(raw)
        if 0 <= idx < len(kind):
            return kind[idx]
    elif isinstance(raw, str):
        for member in kind:
            if member.value.lower() == raw.lower():
                return member
    raise InvalidQueueOptions(f"invalid {what}: {raw!r}")


def _int_value(raw: object, what: str, minimum: int) -> int:
    try:
        value: int = int(raw)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise InvalidQueueOptions(f"invalid {what}: {raw!r}") from None
    if isinstance(raw, bool) or value < minimum:
        raise InvalidQueueOptions(f"invalid {what}: {raw!r}")
    return value


def _bool_value(raw: object, what: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0"):
        return raw.lower() in ("true", "1")
    raise InvalidQueueOptions(f"invalid {what}: {raw!r}")


_PARSERS: dict[str, Callable[[object], Any]] = {
    "delivery_mode": lambda v: _enum_value(_MODES, v, "deliveryMode"),
    "max_queue_size": lambda v: _int_value(v, "maxQueueSize", 1),
    "message_ttl_ms": lambda v: _int_value(v, "messageTtl", 0),
    "enable_dead_letter_queue": lambda v: _bool_value(v, "enableDeadLetterQueue"),
    "dead_letter_queue_name": lambda v: str(v) if v else "",
    "max_retry_attempts": lambda v: _int_value(v, "maxRetryAttempts", 1),
    "ack_timeout_ms": lambda v: _int_value(v, "ackTimeout", 1),
    "overflow_strategy": lambda v: _enum_value(_OVERFLOWS, v, "overflowStrategy"),
    "durable": lambda v: _bool_value(v, "durable"),
}


def options_to_dict(o: QueueOptions) -> dict[str, Any]:
    """Queue options under the names ``options_from`` reads (for the journal)."""
    return {
        "mode": str(o.delivery_mode),
        "maxQueueSize": o.max_queue_size,
        "messageTtl": o.message_ttl_ms,
        "enableDeadLetterQueue": o.enable_dead_letter_queue,
        "deadLetterQueueName": o.dead_letter_queue_name,
        "maxRetryAttempts": o.max_retry_attempts,
        "ackTimeout": o.ack_timeout_ms,
        "overflowStrategy": str(o.overflow_strategy),
        "durable": o.durable,
    }


class QueueManager(QueueHost):
    """All queues of one broker."""

    def __init__(
        self,
        defaults: QueueDefaults | None = None,
        clock: Clock = wall_clock_ms,
        *,
        auto_create: bool = True,
        memory_high_watermark: int = 512 * 1024 * 1024,
        name_validator: Callable[[str], bool] | None = None,
    ) -> None:
        self.defaults = defaults or QueueDefaults()
        self.clock = clock
        # the broker's own clock is called natively (compiled) on the publish path; any
        # other (tests' ManualClock) through ``self.clock``
        self._wall = clock is wall_clock_ms
        self.auto_create = auto_create
        self.queues: dict[str, Queue] = {}
        self.memory_high = memory_high_watermark
        self.memory_low = memory_high_watermark * 8 // 10
        self.memory_bytes = 0
        self.memory_blocked = False
        #: queues that can hold messages with a TTL (their option, or a message's own)
        self._expiring: dict[str, Queue] = {}
        #: a heap of (when to look, tie-break, subscription): ``tick`` looks only at the
        #: subscriptions whose first ack deadline may have passed, not at every one that
        #: holds deliveries (10,000 of them with many queues, ten times a second). The time
        #: is never later than the first deadline: deliveries append later deadlines. A
        #: subscription with an entry here has ``timed`` set (one entry each).
        self._due: list[tuple[int, int, Subscription]] = []
        self._due_seq = 0
        #: equal queue options, one object each (see ``_shared_options``)
        self._options: dict[QueueOptions, QueueOptions] = {}
        #: the queues ``tick``'s safety net has still to dispatch in this round
        self._sweep_todo: list[Queue] = []
        #: see ``hold``: while True, FanOutWithoutAck queues wait in ``_deferred``
        self.holding = False
        self._deferred: dict[str, Queue] = {}
        self._memory_waiters: list[Callable[[], None]] = []
        self._valid_name = name_validator or (lambda _name: True)
        self.persistence: Persistence | None = None
        self.next_seq = 1
        self._last_now = 0
        #: while ``holding`` (one read is being handled): the clock's reading of that read's
        #: first publish, for the others (0: not read yet)
        self._read_now = 0
        #: every protocol's subscriptions to addresses (MQTT filters, AMQP amq.topic
        #: bindings, ZeroMQ prefixes): who hears a publish besides the queue of its name
        self.address_router = AddressRouter()
        #: its sinks, kept here too: a native publish reads them, and the router is
        #: interpreted (a generic attribute read a publish, compiled)
        self._sinks: tuple[AddressSink, ...] = ()
        #: warning lines about dropped messages, rate-limited per queue (drops.py)
        self.drop_log = DropLog(clock)
        #: the stats of deleted queues, added up: totals over all queues stay monotonic
        self.retired_stats = QueueStats()

    # -- options -----------------------------------------------------------------------------

    def options_from(self, raw: Mapping[str, object] | None = None) -> QueueOptions:
        """Queue options from camelCase names (headers or JSON), defaults for the rest."""
        d = self.defaults
        values: dict[str, Any] = {
            "delivery_mode": d.delivery_mode,
            "max_queue_size": d.max_queue_size,
            "message_ttl_ms": d.message_ttl_ms,
            "enable_dead_letter_queue": d.enable_dead_letter_queue,
            "dead_letter_queue_name": "",
            "max_retry_attempts": d.max_retry_attempts,
            "ack_timeout_ms": d.ack_timeout_ms,
            "overflow_strategy": d.overflow_strategy,
            "durable": d.durable,
        }
        for key, value in (raw or {}).items():
            field_name = _OPTION_KEYS.get(key)
            if field_name is not None and value is not None:
                values[field_name] = _PARSERS[field_name](value)
        return QueueOptions(**values)

    def _dlq_options(self, source: Queue) -> QueueOptions:
        d = self.defaults
        return QueueOptions(
            DeliveryMode.ROUND_ROBIN,
            d.max_queue_size,
            0,
            False,
            "",
            d.max_retry_attempts,
            d.ack_timeout_ms,
            OverflowStrategy.DROP_OLDEST,
            source.options.durable,
        )

    # -- queues ------------------------------------------------------------------------------

    def create_queue(self, name: str, options: QueueOptions | None = None) -> tuple[Queue, bool]:
        """Create a queue; an existing one with the same options is fine (like queue.declare).

        Returns the queue and whether it was created now.
        """
        options = options or self.options_from()
        existing = self.queues.get(name)
        if existing is not None:
            if existing.options != options:
                raise QueueExists(f"queue {name!r} exists with different options")
            return existing, False
        queue = Queue(name, self._shared_options(options), self.clock(), self)
        self.queues[name] = queue
        if options.message_ttl_ms:
            self._expiring[name] = queue
        if options.durable and self.persistence is not None:
            self.persistence.queue_created(queue)
        return queue, True

    def restore_queue(self, name: str, options: QueueOptions, created_at: int) -> Queue:
        """Recreate a queue from the journal (no journal record is written)."""
        queue = Queue(name, self._shared_options(options), created_at, self)
        self.queues[name] = queue
        if options.message_ttl_ms:
            self._expiring[name] = queue
        return queue

    def _shared_options(self, options: QueueOptions) -> QueueOptions:
        """One options object for all queues with equal options: every publish and delivery
        reads its queue's options, and with many queues one object stays in the cache where
        one per queue would not. (Bounded: past ``_OPTIONS_SHARED`` kinds, each its own.)"""
        shared = self._options.get(options)
        if shared is not None:
            return shared
        if len(self._options) < _OPTIONS_SHARED:
            self._options[options] = options
        return options

    def restore_messages(self, queue: Queue, msgs: list[StoredMessage]) -> None:
        """Put recovered messages back, in journal order (no record, no dispatch)."""
        if queue.fan_out:
            msgs = [as_fan_out(m) for m in msgs]
        queue.push_all(msgs)
        self.memory_bytes += sum(len(m.payload) for m in msgs)
        if any(m.expires_at for m in msgs):
            queue.message_ttls = True  # (a message's own TTL, from before the restart)
            self._expiring[queue.name] = queue
        if msgs:
            self.next_seq = max(self.next_seq, max(m.seq for m in msgs) + 1)

    def withdraw(self, queue: Queue, msg: StoredMessage) -> bool:
        """Take back a just-published message that storage failed to record, unless a
        consumer already has it. Only the newest messages can be withdrawn (in reverse)."""
        if queue.deleted or not queue.pop_if_newest(msg):
            return False
        self.memory_bytes -= len(msg.payload)
        queue.n_published -= 1
        return True

    def _durable(self, queue: Queue) -> Persistence | None:
        return self.persistence if queue.options.durable else None

    def _settle(
        self, queue: Queue, msg: StoredMessage, reason: SettleReason, detail: str = ""
    ) -> None:
        """Record that a message (or, for fan-out, its last outstanding copy) is done."""
        group = msg.group
        if group is not None:
            group[0] -= 1
            if group[0] > 0:
                return
        persistence = self._durable(queue)
        if persistence is not None:
            persistence.settled(queue, msg, reason, detail)

    def get(self, name: str) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            raise QueueNotFound(f"queue {name!r} not found")
        return queue

    def _get_or_create(self, name: str) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            if not self.auto_create:
                raise QueueNotFound(f"queue {name!r} not found")
            queue, _ = self.create_queue(name)
        return queue

    def delete_queue(self, name: str) -> None:
        queue = self.queues.get(name)
        if queue is None:
            raise QueueNotFound(f"queue {name!r} not found")
        # Persistence sees the queue still registered, with its messages, to release them.
        if queue.options.durable and self.persistence is not None:
            self.persistence.queue_deleted(name)
        del self.queues[name]
        self.drop_log.forget(name)
        self.retired_stats.add(queue)
        queue.deleted = True
        for sub in queue.drop_subscriptions():
            sub.release_all()
            sub.consumer.subscription_cancelled(sub, "queue_deleted")
        self.memory_bytes -= queue.nbytes
        queue.take_all()
        self._wake(queue)

    def queue_info(self, name: str) -> dict[str, Any]:
        q = self.get(name)
        o = q.options
        return {
            "name": q.name,
            "messageCount": q.message_count,
            "subscriberCount": len(q.subscriptions),
            "deliveryMode": str(o.delivery_mode),
            "maxSize": o.max_queue_size,
            "createdAt": iso_ms(q.created_at),
            "unackedCount": q.unacked_count,
            "messageTtl": o.message_ttl_ms,
            "overflowStrategy": str(o.overflow_strategy),
            "enableDeadLetterQueue": o.enable_dead_letter_queue,
            "deadLetterQueueName": self._dlq_name(q) if o.enable_dead_letter_queue else None,
            "maxRetryAttempts": o.max_retry_attempts,
            "ackTimeout": o.ack_timeout_ms,
            "stats": {
                "published": q.n_published,
                "delivered": q.n_delivered,
                "acked": q.n_acked,
                "redelivered": q.n_redelivered,
                "deadLettered": q.n_dead_lettered,
                "expired": q.n_expired,
                "dropped": q.n_dropped,
            },
        }

    # -- management views and moves ------------------------------------------------------------

    def browse(self, name: str, offset: int = 0, limit: int = 100) -> list[StoredMessage]:
        """Up to ``limit`` ready messages of a queue from ``offset``, in delivery order
        (highest priority first, oldest first), left where they are: nothing is delivered,
        counted or journaled. Expired messages the timer has not removed yet are skipped.
        In-flight (unacknowledged) deliveries are not ready, so not listed."""
        queue = self.get(name)
        now = self.clock()
        live = (m for m in queue.ready() if not m.expired(now))
        return list(itertools.islice(live, offset, offset + limit))

    def move_messages(
        self, name: str, *, target: str | None = None, limit: int | None = None
    ) -> MoveResult:
        """Move ready messages out of queue ``name``, oldest first: each to ``target``, or
        (``target`` None: a dead-letter queue sent back) to the queue its ``originalQueue``
        header names, without the dead-letter headers. A message is left in place when it has
        no destination, the destination does not exist, is ``name`` itself, or is full (a move
        never drops or blocks: nothing is made room for). ``limit``: at most that many moved.
        Each moved message is settled in ``name`` (``SettleReason.MOVED``) and published into
        its destination (journaled when that queue is durable)."""
        source = self.get(name)
        result = MoveResult()
        pending = deque(source.take_all())
        kept: list[StoredMessage] = []
        try:
            while pending:
                if limit is not None and result.total >= limit:
                    break
                msg = pending[0]
                dest_name = target if target is not None else msg.headers.get("originalQueue")
                dest = self.queues.get(dest_name) if dest_name else None
                if dest is None or dest is source or dest.full or not self._valid_name(dest.name):
                    kept.append(pending.popleft())
                    result.kept += 1
                    continue
                headers = {k: v for k, v in msg.headers.items() if k not in DEAD_LETTER_HEADERS}
                outcome = self.publish(
                    dest.name, msg.id, msg.payload, headers, route=False, priority=msg.priority
                )
                pending.popleft()
                if not outcome.accepted:  # not expected (checked full above); keep it safe
                    kept.append(msg)
                    result.kept += 1
                    continue
                self.memory_bytes -= len(msg.payload)
                self._settle(source, msg, SettleReason.MOVED, dest.name)
                result.moved[dest.name] = result.moved.get(dest.name, 0) + 1
        finally:
            # What stays goes back in its order (the store was emptied to walk it).
            source.push_all([*kept, *pending])
        self._wake(source)
        return result

    # -- publish / subscribe / ack -------------------------------------------------------------

    def publish(
        self,
        queue_name: str,
        msg_id: str,
        payload: bytes,
        headers: Mapping[str, str],
        *,
        route: bool = True,
        ttl_ms: int = 0,
        priority: Priority | None = None,
    ) -> PublishOutcome:
        """Publish into a queue (created if allowed). With ``route`` (a native VibeMQ
        Publish) the message is also a publish at the address ``queue_name`` for every
        protocol's subscribers (the registered sinks) once the queue has taken it: a refused
        publish is retried or reported by its publisher, and routed then. ``route=False``:
        into this one queue only (an adapter's own routing, a session's queue, a dead
        letter). ``ttl_ms``: the message's own time to live (the shorter of it and the
        queue's wins); ``priority``: instead of the ``priority`` header."""
        queue = self.queues.get(queue_name)
        if queue is None:
            queue = self._get_or_create(queue_name)
        opts = queue.options
        persistence = self.persistence if opts.durable else None
        if persistence is not None and not persistence.available:
            raise PersistenceUnavailable("the journal cannot be written; message not accepted")
        # The messages of one read (``hold``) arrived together: they are stamped with the
        # clock's reading at the first of them, the time their bytes came, not a clock call
        # each (``time.time_ns``: a generic call and a big-int division, ~400 instructions
        # compiled). A read (at most 256 KB) is handled in milliseconds. Outside a read (a
        # timer, an adapter's own publish): the clock each time.
        now = self._read_now
        if not now:
            now = wall_clock_ms() if self._wall else self.clock()
            if self.holding:
                self._read_now = now
        # Messages published in the same millisecond share one int (32 bytes each otherwise).
        if now == self._last_now:
            now = self._last_now
        else:
            self._last_now = now
        ttl = opts.message_ttl_ms
        if ttl_ms:
            ttl = min(ttl, ttl_ms) if ttl else ttl_ms
            queue.message_ttls = True
            self._expiring[queue_name] = queue
        if priority is None:
            priority = parse_priority(headers.get("priority")) if headers else _NORMAL
        # The queue's own name, not the publisher's copy of it; one shared empty mapping.
        # (Each class called by name: the compiled build then calls its constructor
        # directly, where a class picked by an expression goes through a generic call.)
        expires_at = now + ttl if ttl else 0
        msg: StoredMessage
        if queue.fan_out:
            msg = FanOutMessage(
                msg_id, queue.name, payload, headers or EMPTY_HEADERS, now, expires_at, priority
            )
        else:
            msg = StoredMessage(
                msg_id, queue.name, payload, headers or EMPTY_HEADERS, now, expires_at, priority
            )
        if persistence is not None:  # (a seq is the journal's identity of a message)
            msg.seq = self.next_seq
            self.next_seq += 1
        if queue.count >= opts.max_queue_size and self._deferred.get(queue_name) is queue:
            self._dispatch_held(queue)  # full only if its subscribers cannot take it now
        if queue.count >= opts.max_queue_size:
            outcome = self._overflow(queue, msg)
            if outcome is not None:
                # A refused publish is retried or reported by its publisher: route it then.
                if route and outcome.accepted and self._to_sinks(queue_name, ready(msg), None):
                    return PublishOutcome.ACCEPTED_DURABLE
                return outcome
        queue.n_published += 1
        self.memory_bytes += len(payload)
        if persistence is not None:
            persistence.published(queue, msg, True)  # (a client's: positional, see there)
        if not queue.deliver_now(msg):
            queue.push(msg)
            queue.dispatch()
        durable = persistence is not None
        if route and self._sinks and self._to_sinks(queue_name, ready(msg), None):
            durable = True
        if self.memory_bytes > self.memory_high:
            self.memory_blocked = True
        return _ACCEPTED_DURABLE if durable else _ACCEPTED

    # -- cross-protocol routing (routing.py) ------------------------------------------------------

    def register_sink(self, sink: AddressSink) -> None:
        """A protocol adapter's subscriptions to addresses: every publish at an address, from
        any protocol (its own included), is handed to ``sink.deliver`` from now on."""
        self.address_router.register(sink)
        self._sinks = self.address_router.sinks

    def unregister_sink(self, sink: AddressSink) -> None:
        self.address_router.unregister(sink)
        self._sinks = self.address_router.sinks

    def route(
        self,
        address: str,
        message: MessageSource,
        origin: AddressSink | None = None,
        *,
        into_queue: bool = True,
    ) -> bool:
        """A publish at ``address`` by a protocol adapter (``origin``: its sink); a native
        Publish is :meth:`publish` instead. It goes into the queue of that name when
        ``into_queue``, that queue exists and clients may name it (a publish at an address
        never creates a queue); then to every registered sink, once each, the publisher's
        own included. The queue is one subscriber among the others: when it refuses the
        message (full, storage failing) that is logged and the others still get it.
        ``into_queue=False``: the publisher has put it into queues itself (AMQP's exchanges).
        True when some copy was journaled: the publisher acknowledges once it is durable."""
        durable = False
        if into_queue and address in self.queues and self._valid_name(address):
            durable = self._into_queue(address, message())
        # _to_sinks, inlined: this is every MQTT publish's path.
        for sink in self.address_router.sinks:
            if sink.deliver(address, message, origin) and self.persistence is not None:
                durable = True
        return durable

    def _into_queue(self, name: str, msg: StoredMessage) -> bool:
        # A message with its own expiry (an MQTT 5 Message Expiry Interval, an AMQP
        # expiration) keeps what is left of it in the queue.
        ttl_ms = max(1, msg.expires_at - self.clock()) if msg.expires_at else 0
        try:
            outcome = self.publish(
                name, msg.id, msg.payload, msg.headers, route=False, ttl_ms=ttl_ms
            )
        except CoreError as exc:
            log.warning("publish into queue failed", queue=name, error=str(exc))
            return False
        if not outcome.accepted:
            log.debug("queue refused a publish", queue=name, outcome=outcome.value)
        return outcome is PublishOutcome.ACCEPTED_DURABLE

    def _to_sinks(self, address: str, message: MessageSource, origin: AddressSink | None) -> bool:
        """Every sink, once each, in registration order; True when one journaled a copy
        (never without persistence: nothing would then wait for the journal)."""
        durable = False
        for sink in self.address_router.sinks:
            if sink.deliver(address, message, origin):
                durable = True
        return durable and self.persistence is not None

    def drop_oldest(self, queue: Queue) -> bool:
        """Make room: the oldest of the lowest priority goes (dead-lettered when the queue's
        adapter dead-letters overflow, else dropped). False when the queue is empty."""
        old = queue.pop_oldest_lowest()
        if old is None:
            return False
        self.memory_bytes -= len(old.payload)
        if queue.dead_letter_hook is not None:
            self.dead_letter(queue, old, DeadLetterReason.QUEUE_OVERFLOW)
        else:
            self._dropped(queue, DeadLetterReason.QUEUE_OVERFLOW)
            self._settle(queue, old, SettleReason.DROPPED, "QueueOverflow")
        return True

    def _dropped(self, queue: Queue, reason: str) -> None:
        """Count a message a queue lost (not an operator's purge) and say so in the log,
        rate-limited: the first drop of a queue at once, then once a minute at most."""
        queue.n_dropped += 1
        self.drop_log.dropped(queue.name, reason, queue.n_dropped)

    def _overflow(self, queue: Queue, msg: StoredMessage) -> PublishOutcome | None:
        """Apply the queue's overflow strategy; None means go on and enqueue ``msg``."""
        strategy = queue.options.overflow_strategy
        if strategy is OverflowStrategy.BLOCK_PUBLISHER:
            return PublishOutcome.BLOCKED
        if strategy is OverflowStrategy.DROP_OLDEST:
            self.drop_oldest(queue)
            return None
        if strategy is OverflowStrategy.REDIRECT_TO_DLQ and queue.options.enable_dead_letter_queue:
            queue.n_published += 1
            self.dead_letter(queue, msg, DeadLetterReason.QUEUE_OVERFLOW, stored=False)
            dlq = self.queues.get(self._dlq_name(queue))
            durable = dlq is not None and self._durable(dlq) is not None
            return PublishOutcome.ACCEPTED_DURABLE if durable else PublishOutcome.ACCEPTED
        self._dropped(queue, DeadLetterReason.QUEUE_OVERFLOW)
        return PublishOutcome.REJECTED_FULL

    def subscribe(
        self,
        queue_name: str,
        sub_id: str,
        consumer: Consumer,
        prefetch: int,
        *,
        dispatch: bool = True,
    ) -> Subscription:
        """Subscribe a consumer (again: its prefetch is updated). With ``dispatch=False`` the
        caller starts delivery itself, after it has confirmed the subscription."""
        queue = self._get_or_create(queue_name)
        existing = [s for s in queue.subscriptions if s.consumer is consumer]
        if existing:
            sub = existing[0]
            sub.prefetch = prefetch
        else:
            sub = Subscription(sub_id, queue, consumer, prefetch)
            queue.add_subscription(sub)
        if dispatch:
            queue.dispatch()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Remove a subscription; its unacknowledged deliveries go back to the queue."""
        queue = sub.queue
        queue.remove_subscription(sub)
        returned = sub.release_all()
        if not queue.deleted:
            self._return(queue, returned)
            queue.dispatch()

    def ack(self, sub: Subscription, msg_id: str, *, dispatch: bool = True) -> bool:
        """Settle a delivery. ``dispatch=False`` leaves refilling the subscriber to the
        caller (one dispatch after a batch of acks instead of one per ack)."""
        msg = sub.release(msg_id)
        if msg is None:
            return False
        self._acked(sub, msg)
        if dispatch and sub.waiting:
            queue = sub.queue
            if queue.count:
                queue.dispatch()
            else:
                sub.waiting = False
        return True

    def _acked(self, sub: Subscription, msg: StoredMessage) -> None:
        """Count and settle one Ack of ``sub``, reading the queue only when it must (a
        fan-out copy, a detached subscription): with many queues it is a cold line."""
        sub.count_acks(1)
        # (_settle does nothing for a message neither journaled nor one of fan-out copies)
        if msg.group is not None:
            self._settle(sub.queue, msg, _ACKED)
        elif sub.durable:
            persistence = self.persistence
            if persistence is not None:
                persistence.settled(sub.queue, msg, _ACKED)

    def ack_many(self, sub: Subscription, msg_ids: list[str]) -> list[str]:
        """Settle several deliveries of one subscription, in order, as ``ack`` with
        ``dispatch=False`` would one by one; the caller refills. Returns the ids this
        subscription did not hold (in order)."""
        queue = sub.queue
        persistence = self.persistence if sub.durable else None
        # journaled messages that are no fan-out copy: settled in the journal in one call
        journaled: list[StoredMessage] = []
        missing: list[str] = []
        settled = 0
        for msg_id in msg_ids:
            msg = sub.release(msg_id)
            if msg is None:
                missing.append(msg_id)
                continue
            settled += 1
            # (_settle does nothing for a message neither journaled nor one of fan-out copies)
            if msg.group is not None:
                self._settle(queue, msg, _ACKED)
            elif persistence is not None:
                journaled.append(msg)
        if journaled:
            assert persistence is not None
            persistence.settled_all(queue, journaled, _ACKED)
        sub.count_acks(settled)
        return missing

    def ack_held(
        self, holders: dict[str, Subscription], msg_ids: list[str], touched: dict[str, Queue]
    ) -> list[str]:
        """Settle Acks of a connection subscribed to many queues, each at the subscription
        ``holders`` names for it (its map of delivery id -> subscription; the entries are
        taken out), as ``ack`` with ``dispatch=False`` would one by one, in one call: a read's
        Acks each hit another queue there, so no run per subscription. The queues settled in
        that have ready messages go into ``touched`` (the caller refills them; an empty one has
        nothing to refill, and a publish into it meanwhile delivers itself: a queue is read
        only when its subscription's ``waiting`` says it may hold some); returns the ids
        not settled, in order (not in ``holders``, or no longer held there)."""
        rest: list[str] = []
        persistence = self.persistence
        # journaled messages that are no fan-out copy, by queue: settled in one call each
        # (by id: a queue is no dict key, and a name may outlive its queue)
        journaled: dict[int, tuple[Queue, list[StoredMessage]]] = {}
        for msg_id in msg_ids:
            sub = _DICT_POP(holders, msg_id, None)
            msg = sub.release(msg_id) if sub is not None else None
            if sub is None or msg is None:
                rest.append(msg_id)
                continue
            queue = sub.queue  # (not read here unless it must: a cold line, many queues)
            if sub.attached:  # (count_acks, inlined: a call is ~20 instructions an Ack here)
                sub.n_acked += 1
            else:
                queue.acked_gone += 1
            if sub.waiting:  # (else nothing waits: nothing to refill; a publish delivers)
                if queue.count:
                    touched[queue.name] = queue
                else:
                    sub.waiting = False
            # (_settle does nothing for a message neither journaled nor one of fan-out copies)
            if msg.group is not None:
                self._settle(queue, msg, _ACKED)
            elif persistence is not None and sub.durable:
                run = journaled.get(id(queue))
                if run is None:
                    journaled[id(queue)] = (queue, [msg])
                else:
                    run[1].append(msg)
        if journaled:
            assert persistence is not None
            for held, msgs in journaled.values():
                persistence.settled_all(held, msgs, _ACKED)
        return rest

    def detach(self, sub: Subscription) -> None:
        """Stop delivering to a subscription but leave its unacknowledged deliveries with it
        (AMQP basic.cancel: they can still be acked, or go back when the channel ends).
        What was parked on it (a reused id) is the others' again."""
        queue = sub.queue
        parked = sub.deferred is not None
        queue.remove_subscription(sub)
        if parked and not queue.deleted:
            queue.dispatch()

    def purge(self, name: str) -> int:
        """Drop every queued (not in-flight) message of a queue; how many there were."""
        queue = self.get(name)
        msgs = queue.take_all()
        for msg in msgs:
            self.memory_bytes -= len(msg.payload)
            queue.n_dropped += 1
            self._settle(queue, msg, SettleReason.DROPPED, "Purged")
        self._wake(queue)
        return len(msgs)

    def nack(self, sub: Subscription, msg_id: str, *, requeue: bool, dispatch: bool = True) -> bool:
        """Give a delivery back: to the head of its queue (``requeue``), or dead-letter it
        (dropped when the queue has no dead-letter queue)."""
        msg = sub.release(msg_id)
        if msg is None:
            return False
        queue = sub.queue
        if requeue:
            queue.push_front(msg)
            self.memory_bytes += len(msg.payload)
            if dispatch:
                queue.dispatch()
        else:
            self.dead_letter(queue, msg, DeadLetterReason.REJECTED)
            if dispatch and queue.count:
                queue.dispatch()  # (its room, and its id, are free again: as an Ack)
        return True

    def take(self, sub: Subscription) -> StoredMessage | None:
        """Pull the next message of the subscription's queue and deliver it to that
        subscription now (a client's "get"), whatever its capacity; None when empty.
        Messages whose id the subscription still holds (a publisher reused it) are passed
        over, and stay at the head: the next one is taken."""
        queue = sub.queue
        now = self.clock()
        held: list[StoredMessage] = []
        found: StoredMessage | None = None
        while queue.count:
            msg = queue.pop_ready()
            if msg is None:
                break
            if msg.expires_at and msg.expired(now):
                self.expire(queue, msg)
                continue
            if queue.needs_ack and sub.holds(msg.id):
                held.append(msg)
                continue
            self.send(sub, msg)
            found = msg
            break
        for msg in reversed(held):
            queue.push_front(msg)
        if found is not None:
            self.after_dequeue(queue)
        return found

    def send(self, sub: Subscription, msg: StoredMessage, now: int = 0) -> None:
        """Deliver one message to one subscription (called by the queue's dispatch).
        ``now``: the clock's reading when the caller has just taken it (a publish handed
        straight to a subscriber), so that it is not read twice; 0: read it here."""
        queue = sub.queue
        needs_ack = queue.needs_ack
        if needs_ack and not sub.hold(msg):  # (held from here on, unless its id is)
            self._held(sub, msg, now)
            return
        msg.attempts = attempts = msg.attempts + 1
        queue.n_delivered += 1
        if attempts > 1:
            queue.n_redelivered += 1
        self.memory_bytes -= len(msg.payload)
        if needs_ack:
            options = queue.options
            msg.deadline = deadline = (now or self.clock()) + options.ack_timeout_ms
            if not sub.timed:
                self._watch(sub, deadline)  # (tick checks its deadlines from then on)
            persistence = self.persistence
            if persistence is not None and options.durable:
                persistence.delivered(queue, msg)
        else:
            self._settle(queue, msg, SettleReason.DELIVERED_NO_ACK)
        sub.consumer.deliver(sub, msg)  # (through Consumer's vtable, compiled)

    def _held(self, sub: Subscription, msg: StoredMessage, now: int) -> None:
        """``sub`` still holds a delivery of ``msg``'s id (a publisher reused it): an Ack
        names a message by id, so ``sub`` cannot hold both. Another subscriber of the queue
        with room that does not hold it takes it; else it is parked on ``sub`` until that
        delivery is settled (``Queue.park``). Either way the messages behind it go on."""
        queue = sub.queue
        other = queue.other_taker(sub, msg.id)
        if other is not None:
            self.send(other, msg, now)
        else:
            queue.park(sub, msg)

    def send_to_all(self, queue: Queue, msgs: list[StoredMessage]) -> None:
        """Deliver a run of messages of a queue without acks (FanOutWithoutAck) to every one
        of its subscriptions, which the caller found writable: the same objects to each
        (nothing is tracked per delivery, so nothing needs a copy of its own), in one
        ``deliver_many`` call per subscription where the consumer has it; each message
        counted, settled and taken off the memory account once."""
        subs = queue.subscriptions
        n = len(subs)
        durable = self.persistence is not None and queue.options.durable
        redelivered = nbytes = 0
        for msg in msgs:
            msg.attempts += 1
            if msg.attempts > 1:
                redelivered += 1
            nbytes += len(msg.payload)
            if durable:
                self._settle(queue, msg, SettleReason.DELIVERED_NO_ACK)
        queue.n_delivered += n * len(msgs)
        queue.n_redelivered += n * redelivered
        self.memory_bytes -= nbytes
        for sub in subs:
            many = sub.deliver_many
            if many is not None:
                many(sub, msgs)
            else:
                deliver = sub.consumer.deliver
                for msg in msgs:
                    deliver(sub, msg)

    # -- holding dispatch while a read is handled ------------------------------------------

    def hold(self) -> None:
        """Hold back the dispatch of FanOutWithoutAck queues (a read is being handled): what
        is published meanwhile is handed over in runs on ``release``. The read's publishes
        share one reading of the clock (``publish``)."""
        self.holding = True
        self._read_now = 0

    def release(self) -> None:
        """Dispatch every queue held back since ``hold``. Always called after ``hold`` (the
        caller's ``finally``): a held queue with writable subscribers is never left alone."""
        self.holding = False
        self._read_now = 0
        while self._deferred:
            queues, self._deferred = self._deferred, {}
            for queue in queues.values():
                if queue.deleted:
                    continue
                try:
                    queue.dispatch()
                except Exception:  # one queue's failure must not strand the others
                    log.exception("dispatch failed", queue=queue.name)

    def defer(self, queue: Queue) -> None:
        self._deferred[queue.name] = queue

    def _dispatch_held(self, queue: Queue) -> None:
        """Dispatch one held queue now (it is full: its subscribers may make room)."""
        del self._deferred[queue.name]
        self.holding = False
        try:
            queue.dispatch()
        finally:
            self.holding = True

    # -- expiry, dead letters, timers ----------------------------------------------------------

    def _dlq_name(self, queue: Queue) -> str:
        return queue.options.dead_letter_queue_name or f"{queue.name}.dlq"

    def expire(self, queue: Queue, msg: StoredMessage) -> None:
        queue.n_expired += 1
        self.memory_bytes -= len(msg.payload)
        self.dead_letter(queue, msg, DeadLetterReason.MESSAGE_EXPIRED)

    def dead_letter(
        self, queue: Queue, msg: StoredMessage, reason: str, *, stored: bool = True
    ) -> bool:
        """Move a message to the queue's dead-letter queue, or drop it when there is none.
        ``stored`` is False for a message that never entered ``queue`` (RedirectToDlq).
        A queue with a ``dead_letter_hook`` (an adapter's own dead-lettering, e.g. AMQP's
        dead-letter exchanges) hands the message to it instead."""
        hook = queue.dead_letter_hook
        if hook is not None:
            queue.n_dead_lettered += 1
            if stored:
                self._settle(queue, msg, SettleReason.DEAD_LETTERED, reason)
            hook(queue, msg, reason)
            return True
        dlq_name = self._dlq_name(queue)
        if (
            not queue.options.enable_dead_letter_queue
            or dlq_name == queue.name
            or not self._valid_name(dlq_name)
        ):
            if reason == DeadLetterReason.MAX_RETRIES_EXCEEDED:
                self._dropped(queue, reason)
            else:
                # An expiry or a consumer's reject without a dead-letter queue: meant so.
                queue.n_dropped += 1
            log.debug("message dropped", queue=queue.name, message_id=msg.id, reason=reason)
            if stored:
                expired = reason == DeadLetterReason.MESSAGE_EXPIRED
                why = SettleReason.EXPIRED if expired else SettleReason.DROPPED
                self._settle(queue, msg, why, reason)
            return False
        queue.n_dead_lettered += 1
        dlq = self.queues.get(dlq_name)
        if dlq is None:
            dlq, _ = self.create_queue(dlq_name, self._dlq_options(queue))
        if stored:
            self._settle(queue, msg, SettleReason.DEAD_LETTERED, reason)
        now = self.clock()
        headers = dict(msg.headers)
        headers.update(
            deadLetterReason=reason,
            originalQueue=queue.name,
            deadLetteredAt=iso_ms(now),
            originalDeliveryAttempts=str(msg.attempts),
        )
        dead = message_class(dlq.fan_out)(
            msg.id, dlq_name, msg.payload, headers, now, 0, msg.priority
        )
        dead.seq = self.next_seq
        self.next_seq += 1
        if dlq.count >= dlq.options.max_queue_size:
            old = dlq.pop_oldest_lowest()
            if old is not None:
                self.memory_bytes -= len(old.payload)
                self._dropped(dlq, DeadLetterReason.QUEUE_OVERFLOW)
                self._settle(dlq, old, SettleReason.DROPPED, "QueueOverflow")
        dlq.n_published += 1
        dlq.push(dead)
        self.memory_bytes += len(dead.payload)
        persistence = self._durable(dlq)
        if persistence is not None:
            persistence.published(dlq, dead)
        dlq.dispatch()
        return True

    def _return(
        self, queue: Queue, msgs: list[StoredMessage], owner: Subscription | None = None
    ) -> None:
        """Put unacknowledged deliveries back at the head, in order, or dead-letter them.
        ``owner`` is the subscription that still holds them (an ack timeout)."""
        fan_out = queue.options.delivery_mode is DeliveryMode.FAN_OUT_WITH_ACK
        limit = queue.options.max_retry_attempts
        for msg in msgs:
            if msg.attempts >= limit:
                self.dead_letter(queue, msg, DeadLetterReason.MAX_RETRIES_EXCEEDED)
        for msg in reversed(msgs):
            if msg.attempts >= limit:
                continue
            if fan_out:
                msg = as_fan_out(msg)  # (msg itself: a fan-out queue holds FanOutMessages)
                msg.target = owner if owner is not None else ANY_SUBSCRIBER
            queue.push_front(msg)
            self.memory_bytes += len(msg.payload)

    def tick(self) -> None:
        """Expire messages, time out unacknowledged deliveries, re-check the memory bound.

        O(active), not O(queues): only queues that can hold expiring messages are looked
        at for TTLs, only subscriptions whose first ack deadline may have passed, and
        the queues either touched are dispatched. Dispatch and room waiters are otherwise
        event-driven; as a safety net for a lost wake-up, up to ``SWEEP_PER_TICK`` queues
        in turn are dispatched too (every queue each tick up to that many, else each queue
        once every ``len(queues) / SWEEP_PER_TICK`` ticks)."""
        now = self.clock()
        touched: dict[str, Queue] = {}
        for name, queue in list(self._expiring.items()):
            if queue.deleted:
                del self._expiring[name]
            elif queue.count:
                expired = list(queue.pop_expired(now))
                for msg in expired:
                    self.expire(queue, msg)
                if expired:
                    touched[name] = queue
        due = self._due
        while due and due[0][0] <= now:
            sub = heapq.heappop(due)[2]
            oldest = sub.first_held()
            if oldest is None:
                sub.timed = False  # (it comes back with its next delivery)
                continue
            queue = sub.queue
            first = oldest.deadline
            if first > now:
                self._requeue_due(sub, first)
                continue
            if sub not in queue.subscriptions:
                # Detached: its deliveries wait for their acks; looked at again later.
                self._requeue_due(sub, now + max(queue.options.ack_timeout_ms, 1))
                continue
            self._time_out(queue, sub, now)
            touched[queue.name] = queue
            oldest = sub.first_held()
            if oldest is not None:
                self._requeue_due(sub, oldest.deadline)
            else:
                sub.timed = False
        for queue in touched.values():
            if not queue.deleted:
                queue.dispatch()
                self._wake(queue)
        self._sweep()
        self.drop_log.flush()
        if self.memory_blocked and self.memory_bytes <= self.memory_low:
            self.memory_blocked = False
            waiters, self._memory_waiters = self._memory_waiters, []
            for waiter in waiters:
                waiter()

    def _watch(self, sub: Subscription, when: int) -> None:
        """Have ``tick`` look at ``sub``'s ack deadlines at ``when`` (ms)."""
        sub.timed = True
        self._requeue_due(sub, when)

    def _requeue_due(self, sub: Subscription, when: int) -> None:
        self._due_seq += 1
        heapq.heappush(self._due, (when, self._due_seq, sub))

    def _sweep(self) -> None:
        """The safety net of ``tick``: the next ``SWEEP_PER_TICK`` queues dispatched."""
        todo = self._sweep_todo
        if not todo:
            todo.extend(self.queues.values())
            todo.reverse()  # (popped from the end: in creation order)
        for _ in range(min(SWEEP_PER_TICK, len(todo))):
            queue = todo.pop()
            if not queue.deleted:
                queue.dispatch()
                self._wake(queue)

    def _time_out(self, queue: Queue, sub: Subscription, now: int) -> None:
        returned: list[StoredMessage] = []
        for msg in sub.held():
            if msg.deadline > now:
                break
            returned.append(msg)
        if not returned:
            return
        for msg in returned:
            sub.release(msg.id)
        self._return(queue, returned, sub)

    # -- publisher flow control ----------------------------------------------------------------

    def wait_for_room(self, queue_name: str, waiter: Callable[[], None]) -> None:
        queue = self.queues.get(queue_name)
        if queue is None or not queue.full:
            waiter()
            return
        queue.room_waiters.append(waiter)

    def wait_for_memory(self, waiter: Callable[[], None]) -> None:
        if not self.memory_blocked:
            waiter()
            return
        self._memory_waiters.append(waiter)

    def after_dequeue(self, queue: Queue) -> None:
        if queue.room_waiters:
            self._wake(queue)

    def _wake(self, queue: Queue) -> None:
        if queue.room_waiters and (queue.deleted or not queue.full):
            waiters, queue.room_waiters = queue.room_waiters, []
            for waiter in waiters:
                waiter()
