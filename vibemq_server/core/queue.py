"""A queue: its options, its ready messages, its subscriptions, and the dispatch loop.

Ready messages wait here, never in a connection's buffer: a subscription only receives while
its consumer is writable and under its prefetch limit, so a slow consumer makes messages wait
in the queue, where overflow limits apply.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, Protocol

from vibemq_server.config import DeliveryMode, OverflowStrategy
from vibemq_server.core.clock import Clock
from vibemq_server.core.message import ANY_SUBSCRIBER, Priority, StoredMessage, as_fan_out
from vibemq_server.core.native import i64, mypyc_attr

#: ``dict.pop`` itself, called as ``_DICT_POP(d, k, None)``: compiled, ``d.pop(k, None)``
#: looks the method up by name on every call, and a get then a del looks the key up twice
_DICT_POP: Final = dict.pop


@mypyc_attr(allow_interpreted_subclasses=True)
class Consumer:
    """What the core needs of a subscriber's connection, whatever protocol it speaks: every
    consumer (the native session, MQTT's and AMQP's) subclasses it and overrides all three.

    A base class, not a Protocol: the compiled queue and manager then read ``writable`` and
    call ``deliver`` through the class's vtable, where a Protocol's are a lookup by name
    (~580 instructions a delivery for ``writable``). Subclasses written in Python (the
    tests') are allowed and called the slow way.

    A consumer may also have ``deliver_many(sub, msgs)`` (see ``DeliverMany``): a
    FanOutWithoutAck queue then hands it a run of messages in one call, the same list
    object to every subscriber of the run, so a protocol can encode the run once."""

    __slots__ = ()  # (the slotted consumers stay slotted, run as pure Python)

    @property
    def writable(self) -> bool:
        raise NotImplementedError

    def deliver(self, sub: Subscription, msg: StoredMessage) -> None:
        raise NotImplementedError

    def subscription_cancelled(self, sub: Subscription, reason: str) -> None:
        raise NotImplementedError


#: a consumer's ``deliver_many``: ``msgs`` in order, one list shared by a run's subscribers,
#: never changed once handed over
DeliverMany = Callable[["Subscription", list[StoredMessage]], None]

#: the most messages of a FanOutWithoutAck queue handed over at once: writability is checked
#: between runs, so a subscriber's output can overshoot its bound by one run at most
FAN_OUT_RUN = 256


class QueueHost:
    """What a queue needs of the manager that owns it (``QueueManager`` is the one host).

    Declared here so that this module stays below the manager in the import layers: the
    manager imports the queue, never the other way round. A base class (``QueueManager``
    subclasses it and overrides every method), not a Protocol: the compiled queue calls
    ``send`` and reads ``holding`` through the vtable, not by name with boxed arguments."""

    #: the broker's clock (ms), for TTLs met during dispatch
    clock: Clock
    #: bytes held by ready messages broker-wide; a fan-out adds its copies' share
    memory_bytes: int
    #: dispatch of FanOutWithoutAck queues is held back until ``release`` (a read is being
    #: handled: its publishes are handed over in runs, once it is done)
    holding: bool

    def send(self, sub: Subscription, msg: StoredMessage, now: int = 0) -> None:
        """Deliver one message to one subscription (accounting, journal, the consumer).
        ``now``: the clock's reading when the caller has just taken it (0: read it)."""
        raise NotImplementedError

    def expire(self, queue: Queue, msg: StoredMessage) -> None:
        """A message's TTL passed while it waited: dead-letter or drop it."""
        raise NotImplementedError

    def send_to_all(self, queue: Queue, msgs: list[StoredMessage]) -> None:
        """Deliver a run of messages of a queue without acks to every one of its
        subscriptions (each of them writable): the same objects to each, accounted for once."""
        raise NotImplementedError

    def defer(self, queue: Queue) -> None:
        """Dispatch ``queue`` when the hold is released."""
        raise NotImplementedError

    def after_dequeue(self, queue: Queue) -> None:
        """Messages left the queue: wake publishers waiting for room."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class QueueOptions:
    delivery_mode: DeliveryMode
    max_queue_size: int
    message_ttl_ms: int
    enable_dead_letter_queue: bool
    dead_letter_queue_name: str
    max_retry_attempts: int
    ack_timeout_ms: int
    overflow_strategy: OverflowStrategy
    durable: bool = True

    @property
    def needs_ack(self) -> bool:
        return self.delivery_mode is not DeliveryMode.FAN_OUT_WITHOUT_ACK


class Subscription:
    """One consumer's subscription to one queue, with its unacknowledged deliveries.

    An Ack reads only this object (and the message), not its queue: with 10,000 queues
    the queue is another cold line an Ack. So the ack count is kept here while it is
    attached (``Queue.n_acked`` adds it up), and ``waiting`` says whether the queue may hold
    ready messages for it to refill (the compiled build lays the fields out in the order
    declared here: what an Ack and a delivery read first).

    Its deliveries are held in delivery order: the first two in fields of its own (``h0``,
    ``h1``, each with its id's hash), any more in a dict by id (``more``, newer than those
    two). With 10,000 queues a subscription holds one or two at a time, and a dict of its
    own was three more cold objects a message (the dict, its keys, rebuilt every few inserts
    since CPython does not reuse a deleted entry); the fields share its lines. Read them
    through ``hold``, ``holds``, ``release``, ``held``, ``first_held``, ``n_held``."""

    __slots__ = (
        "attached",
        "consumer",
        "deferred",
        "deliver_many",
        "durable",
        "h0",
        "h1",
        "id",
        "k0",
        "k1",
        "label",
        "more",
        "n_acked",
        "n_held",
        "prefetch",
        "queue",
        "timed",
        "waiting",
    )

    #: deliveries held (unacknowledged)
    n_held: int
    #: the oldest delivery held and its id's hash (None: none inline); ``h1`` is set only
    #: while ``h0`` is, and is newer
    h0: StoredMessage | None
    k0: i64
    h1: StoredMessage | None
    k1: i64
    #: deliveries held after those two, by id in delivery order (None: none): while it is
    #: set every new one goes here, so the order is ``h0``, ``h1``, then these
    more: dict[str, StoredMessage] | None
    queue: Queue
    prefetch: int
    #: acks while attached (then folded into the queue's, see ``Queue._detach``)
    n_acked: int
    #: the queue may hold ready messages: set on every attached subscription when its
    #: queue's count leaves 0 (``Queue._count_up``), cleared by an Ack that finds it at 0;
    #: an Ack refills only when set
    waiting: bool
    #: in its queue's ``subscriptions`` (False once removed: AMQP's basic.cancel keeps
    #: the deliveries, whose later Acks count on the queue itself)
    attached: bool
    #: its queue's options say durable (they never change): an Ack journals without
    #: reading the queue
    durable: bool
    #: the manager's ``tick`` has an entry for it in its heap of ack deadlines
    timed: bool
    deliver_many: DeliverMany | None
    label: bytes
    consumer: Consumer
    id: str
    #: messages of its queue handed to it while it still held a delivery of the same id (a
    #: publisher reused the id, and an Ack names a message by id): by id, in arrival order,
    #: each sent once that id is settled here (``Queue._undefer``); None: none (the usual)
    deferred: dict[str, deque[StoredMessage]] | None

    def __init__(self, sub_id: str, queue: Queue, consumer: Consumer, prefetch: int) -> None:
        # Held in delivery order and the ack timeout is per queue, so the first held are
        # always the first to time out: the timeout scan stops at the first live one. Each
        # message holds its own ack deadline (``StoredMessage.deadline``).
        self.n_held = 0
        self.h0 = None
        self.k0 = 0
        self.h1 = None
        self.k1 = 0
        self.more = None
        self.queue = queue
        self.prefetch = prefetch
        self.n_acked = 0
        self.waiting = True
        self.attached = False
        self.durable = queue.options.durable
        self.timed = False
        #: the consumer's ``deliver_many``, when it has one (see Consumer)
        self.deliver_many = getattr(consumer, "deliver_many", None)
        #: the consumer's own bytes for this subscription, made once (b"": none), e.g. its
        #: protocol's encoding of the queue's name: a delivery reads it here, where the
        #: subscription is at hand, not in a cache of every name (with 10,000 queues each
        #: entry there is another cold line a delivery)
        self.label = b""
        self.consumer = consumer
        self.id = sub_id
        self.deferred = None

    def has_capacity(self) -> bool:
        return self.consumer.writable and self.n_held < self.prefetch

    def count_acks(self, n: int) -> None:
        """``n`` more of its deliveries acknowledged (on its queue once detached)."""
        if self.attached:
            self.n_acked += n
        else:
            self.queue.acked_gone += n

    # -- the deliveries held ------------------------------------------------------------------

    def hold(self, msg: StoredMessage) -> bool:
        """Hold ``msg`` as delivered, unless a delivery of its id is held already (False:
        an Ack names a message by id, so one subscription cannot hold two of one id)."""
        msg_id = msg.id
        h0 = self.h0
        key: i64 = 0
        if h0 is not None:
            key = hash(msg_id)
            if self._inline(msg_id, key):
                return False
        more = self.more
        if more is not None:
            # (the check and the insert in one lookup; another message of that id: held)
            if more.setdefault(msg_id, msg) is not msg:
                return False
        elif h0 is None:
            self.h0 = msg
            self.k0 = hash(msg_id)
        elif self.h1 is None:
            self.h1 = msg
            self.k1 = key
        else:
            self.more = {msg_id: msg}
        self.n_held += 1
        return True

    def holds(self, msg_id: str) -> bool:
        """A delivery of ``msg_id`` is held."""
        if self.h0 is not None and self._inline(msg_id, hash(msg_id)):
            return True
        more = self.more
        return more is not None and msg_id in more

    def _inline(self, msg_id: str, key: i64) -> bool:
        """``h0`` or ``h1`` is a delivery of ``msg_id`` (``key``: its hash). The hashes
        are compared first: with many queues a held message and its id are cold lines."""
        h0 = self.h0
        if h0 is not None and self.k0 == key and h0.id == msg_id:
            return True
        h1 = self.h1
        return h1 is not None and self.k1 == key and h1.id == msg_id

    def release(self, msg_id: str) -> StoredMessage | None:
        """Take the delivery of ``msg_id`` out (None: none held). Acks come mostly in
        delivery order: the oldest is looked at first."""
        h0 = self.h0
        if h0 is not None:
            if h0.id == msg_id:
                self.h0 = self.h1
                self.k0 = self.k1
                self.h1 = None
                self.n_held -= 1
                return h0
            h1 = self.h1
            if h1 is not None and h1.id == msg_id:
                self.h1 = None
                self.n_held -= 1
                return h1
        more = self.more
        if more is None:
            return None
        msg = _DICT_POP(more, msg_id, None)  # (one lookup: a get and a del were two)
        if msg is not None:
            self.n_held = n = self.n_held - 1
            if n == (0 if h0 is None else 1 if self.h1 is None else 2):
                self.more = None  # (emptied: a fresh dict next time, not its spent keys)
        return msg

    def held(self) -> list[StoredMessage]:
        """The deliveries held, in delivery order."""
        out = [m for m in (self.h0, self.h1) if m is not None]
        if self.more is not None:
            out.extend(self.more.values())
        return out

    def first_held(self) -> StoredMessage | None:
        """The oldest delivery held (None: none)."""
        if self.h0 is not None:
            return self.h0
        return next(iter(self.more.values())) if self.more is not None else None

    def release_all(self) -> list[StoredMessage]:
        """Take every delivery held out; they are returned in delivery order."""
        out = self.held()
        self.h0 = self.h1 = None
        self.more = None
        self.n_held = 0
        return out

    @property
    def inflight(self) -> dict[str, StoredMessage]:
        """The deliveries held by id, in delivery order (a copy: for readers and tests)."""
        return {m.id: m for m in self.held()}


class StatsLike(Protocol):
    """A queue's counters, read-only: a ``Queue`` itself, or ``QueueStats`` (the totals)."""

    @property
    def n_published(self) -> int: ...
    @property
    def n_delivered(self) -> int: ...
    @property
    def n_acked(self) -> int: ...
    @property
    def n_redelivered(self) -> int: ...
    @property
    def n_dead_lettered(self) -> int: ...
    @property
    def n_expired(self) -> int: ...
    @property
    def n_dropped(self) -> int: ...


@dataclass(slots=True)
class QueueStats:
    """Counters summed over queues (the deleted queues' totals, a scrape's sums): the same
    names as a ``Queue``'s own counters."""

    n_published: int = 0
    n_delivered: int = 0
    n_acked: int = 0
    n_redelivered: int = 0
    n_dead_lettered: int = 0
    n_expired: int = 0
    n_dropped: int = 0

    def add(self, other: StatsLike) -> None:
        """Add another queue's counts to these (a deleted queue's, into the totals)."""
        self.n_published += other.n_published
        self.n_delivered += other.n_delivered
        self.n_acked += other.n_acked
        self.n_redelivered += other.n_redelivered
        self.n_dead_lettered += other.n_dead_lettered
        self.n_expired += other.n_expired
        self.n_dropped += other.n_dropped


class Queue:
    """A queue. Its ready messages (one FIFO, or one per priority level, highest served
    first) and its counters are fields of this one object: at 10,000 queues each message
    meets a queue cold in the caches, and each separate object (a store, a stats record) was
    another line to fetch. The fields every publish, delivery and Ack reads come first (the
    compiled build lays the fields out in the order declared here); the ``__init__`` is
    written out (a dataclass's generated one runs interpreted there)."""

    __slots__ = (
        "_dispatching",
        "_levels",
        "_rr",
        "acked_gone",
        "count",
        "created_at",
        "dead_letter_hook",
        "deleted",
        "fan_out",
        "lone",
        "manager",
        "message_ttls",
        "n_dead_lettered",
        "n_deferred",
        "n_delivered",
        "n_dropped",
        "n_expired",
        "n_published",
        "n_redelivered",
        "name",
        "nbytes",
        "needs_ack",
        "options",
        "parked",
        "room_waiters",
        "shared",
        "subscriptions",
    )

    # -- what a message touches, first --
    #: ready messages, those parked on a subscription included (``n_deferred``)
    count: int
    #: the one subscription when there is exactly one (the usual case), else None: the
    #: publish and refill paths reach it without touching the list (two more cold lines)
    lone: Subscription | None
    options: QueueOptions
    name: str
    manager: QueueHost
    n_published: int
    n_delivered: int
    _dispatching: bool
    deleted: bool
    #: the options' ``needs_ack`` and "is a fan-out mode", kept at hand for every delivery
    needs_ack: bool
    fan_out: bool
    #: FanOutWithoutAck: one message object for all subscribers, handed over in runs
    shared: bool
    # -- the rest --
    #: the ready messages' payload bytes
    nbytes: int
    #: change it only through add_subscription / remove_subscription / drop_subscriptions
    subscriptions: list[Subscription]
    # Some message has its own TTL (so expiry must be checked even without a queue TTL).
    message_ttls: bool
    # the other counters (all of them read by HTTP and metrics; ``QueueStats`` sums them)
    #: acks of subscriptions no longer attached (the attached ones count their own: an Ack
    #: does not touch the queue); ``n_acked`` is the sum
    acked_gone: int
    n_redelivered: int
    n_dead_lettered: int
    n_expired: int
    n_dropped: int
    _rr: int
    created_at: int
    room_waiters: list[Callable[[], None]]
    #: one FIFO, or one per priority level (lowest first)
    _levels: list[deque[StoredMessage]]
    # Messages held by key outside delivery (a DurableTable's entries): live for the journal.
    parked: dict[str, StoredMessage]
    # An adapter's dead-lettering for this queue (see QueueManager.dead_letter).
    dead_letter_hook: Callable[[Queue, StoredMessage, str], object] | None
    #: ready messages parked on a subscription that still holds their id (see ``park``):
    #: counted in ``count`` and ``nbytes`` too, so that an Ack of that id dispatches
    n_deferred: int

    def __init__(
        self, name: str, options: QueueOptions, created_at: int, manager: QueueHost
    ) -> None:
        self.count = 0
        self.lone = None
        self.options = options
        self.name = name
        self.manager = manager
        self.n_published = 0
        self.n_delivered = 0
        self._dispatching = False
        self.deleted = False
        self.needs_ack = options.needs_ack
        self.fan_out = options.delivery_mode in _FAN_OUT
        self.shared = self.fan_out and not self.needs_ack
        self.nbytes = 0
        self.subscriptions = []
        self.message_ttls = False
        self.acked_gone = 0
        self.n_redelivered = 0
        self.n_dead_lettered = 0
        self.n_expired = 0
        self.n_dropped = 0
        self._rr = 0
        self.created_at = created_at
        self.room_waiters = []
        prioritised = options.delivery_mode is DeliveryMode.PRIORITY_BASED
        self._levels = [deque() for _ in range(len(Priority) if prioritised else 1)]
        self.parked = {}
        self.dead_letter_hook = None
        self.n_deferred = 0

    @property
    def message_count(self) -> int:
        return self.count

    @property
    def n_acked(self) -> int:
        """Deliveries acknowledged: its subscriptions' own counts and those of the gone."""
        return self.acked_gone + sum(s.n_acked for s in self.subscriptions)

    @property
    def unacked_count(self) -> int:
        return sum(s.n_held for s in self.subscriptions)

    @property
    def full(self) -> bool:
        return self.count >= self.options.max_queue_size

    # -- subscriptions ----------------------------------------------------------------------

    def add_subscription(self, sub: Subscription) -> None:
        self.subscriptions.append(sub)
        sub.attached = True
        sub.waiting = True  # (it may have come while messages wait)
        self._subscriptions_changed()

    def remove_subscription(self, sub: Subscription) -> bool:
        """Take ``sub`` out (False: it was not here)."""
        if sub not in self.subscriptions:
            return False
        self.subscriptions.remove(sub)
        self._detach(sub)
        self._subscriptions_changed()
        return True

    def drop_subscriptions(self) -> list[Subscription]:
        """Take every subscription out (the queue is deleted); they are returned."""
        subs, self.subscriptions = self.subscriptions, []
        for sub in subs:
            self._detach(sub)
        self._subscriptions_changed()
        return subs

    def _detach(self, sub: Subscription) -> None:
        """``sub`` is no longer attached: its acks count here from now on, and what was
        parked on it is ready for the others again."""
        if sub.deferred is not None:
            self._unpark_all(sub)
        self.acked_gone += sub.n_acked
        sub.n_acked = 0
        sub.attached = False

    def _subscriptions_changed(self) -> None:
        subs = self.subscriptions
        self.lone = subs[0] if len(subs) == 1 else None

    # -- the ready messages --------------------------------------------------------------

    def _level(self, msg: StoredMessage) -> deque[StoredMessage]:
        levels = self._levels
        return levels[msg.priority] if len(levels) > 1 else levels[0]

    def ready(self) -> Iterator[StoredMessage]:
        """The ready messages in the order they would be delivered (the parked first)."""
        if self.n_deferred:
            yield from self._parked()
        for level in reversed(self._levels):
            yield from level

    def ready_list(self) -> list[StoredMessage]:
        """``list(ready())``, a level at a time (a million messages in a few ms, not 40)."""
        out = self._parked() if self.n_deferred else []
        for level in reversed(self._levels):
            out.extend(level)
        return out

    def push(self, msg: StoredMessage) -> None:
        self._level(msg).append(msg)
        self.nbytes += len(msg.payload)
        if not self.count:
            self._count_up()
        self.count += 1

    def push_all(self, msgs: list[StoredMessage]) -> None:
        if len(self._levels) == 1:
            self._levels[0].extend(msgs)
            self.nbytes += sum(len(m.payload) for m in msgs)
            if not self.count and msgs:
                self._count_up()
            self.count += len(msgs)
        else:
            for msg in msgs:
                self.push(msg)

    def push_front(self, msg: StoredMessage) -> None:
        self._level(msg).appendleft(msg)
        self.nbytes += len(msg.payload)
        if not self.count:
            self._count_up()
        self.count += 1

    def _count_up(self) -> None:
        """Ready messages wait from now on: every subscription's Ack must look (its
        ``waiting``; while the count stays above 0 they all stay set)."""
        for sub in self.subscriptions:
            sub.waiting = True

    def pop_ready(self) -> StoredMessage | None:
        for level in reversed(self._levels):
            if level:
                msg = level.popleft()
                self.nbytes -= len(msg.payload)
                self.count -= 1
                return msg
        return None

    def pop_if_newest(self, msg: StoredMessage) -> bool:
        """Take ``msg`` back if it is the last one appended at its level."""
        level = self._level(msg)
        if level and level[-1] is msg:
            level.pop()
            self.nbytes -= len(msg.payload)
            self.count -= 1
            return True
        return False

    def pop_oldest_lowest(self) -> StoredMessage | None:
        """The message DropOldest sacrifices: the oldest of the lowest priority present
        (a parked one when nothing else is left)."""
        for level in self._levels:
            if level:
                msg = level.popleft()
                self.nbytes -= len(msg.payload)
                self.count -= 1
                return msg
        for sub in self.subscriptions if self.n_deferred else ():
            if sub.deferred is not None:
                return self._unpark(sub, next(iter(sub.deferred)))
        return None

    def pop_expired(self, now: int) -> Iterator[StoredMessage]:
        """Expired messages at the heads (TTL is per queue, so heads expire first), and
        the parked ones."""
        for level in self._levels:
            while level and level[0].expired(now):
                msg = level.popleft()
                self.nbytes -= len(msg.payload)
                self.count -= 1
                yield msg
        if self.n_deferred:
            yield from self._expired_parked(now)

    def take_all(self) -> list[StoredMessage]:
        out = self._parked() if self.n_deferred else []
        out.extend(m for level in self._levels for m in level)
        for level in self._levels:
            level.clear()
        for sub in self.subscriptions if self.n_deferred else ():
            sub.deferred = None
        self.n_deferred = 0
        self.nbytes = 0
        self.count = 0
        return out

    # -- messages parked on a subscription (a reused message id) ----------------------------

    def park(self, sub: Subscription, msg: StoredMessage) -> None:
        """``sub`` still holds a delivery of ``msg``'s id and no other subscriber can take
        it: it waits on ``sub`` until that delivery is settled (acked, rejected, timed out)
        or ``sub`` leaves, while the messages behind it go on. Still a ready message: in
        ``count`` (an Ack of the id then dispatches, overflow limits apply), ``nbytes``,
        ``ready()`` (browsing, the journal's compaction), TTL expiry."""
        parked = sub.deferred
        if parked is None:
            parked = sub.deferred = {}
        same = parked.get(msg.id)
        if same is None:
            parked[msg.id] = deque((msg,))
        else:
            same.append(msg)
        self.n_deferred += 1
        self.nbytes += len(msg.payload)
        if not self.count:
            self._count_up()
        self.count += 1

    def _unpark(self, sub: Subscription, msg_id: str) -> StoredMessage:
        """Take the first message parked on ``sub`` under ``msg_id`` out of the queue."""
        parked = sub.deferred
        assert parked is not None
        same = parked[msg_id]
        msg = same.popleft()
        if not same:
            del parked[msg_id]
            if not parked:
                sub.deferred = None
        self.n_deferred -= 1
        self.nbytes -= len(msg.payload)
        self.count -= 1
        return msg

    def _unpark_all(self, sub: Subscription) -> None:
        """``sub`` leaves: its parked messages go back to the head of the queue, in the
        order they were published (still counted: they only change place)."""
        parked = sub.deferred
        assert parked is not None
        sub.deferred = None
        msgs = sorted((m for same in parked.values() for m in same), key=_published)
        self.n_deferred -= len(msgs)
        for msg in reversed(msgs):
            if self.fan_out:  # (its copy, like a returned one: to one subscriber, not all)
                as_fan_out(msg).target = ANY_SUBSCRIBER
            self._level(msg).appendleft(msg)

    def _expired_parked(self, now: int) -> list[StoredMessage]:
        """Take the parked messages whose TTL has passed out of the queue."""
        out: list[StoredMessage] = []
        for sub in self.subscriptions:
            parked = sub.deferred
            for msg_id, same in list(parked.items()) if parked is not None else ():
                while same and same[0].expired(now):
                    out.append(self._unpark(sub, msg_id))
        return out

    def _parked(self) -> list[StoredMessage]:
        """The parked messages, by subscription, by id, in arrival order."""
        out: list[StoredMessage] = []
        for sub in self.subscriptions:
            if sub.deferred is not None:
                for same in sub.deferred.values():
                    out.extend(same)
        return out

    def _undefer(self, now: int) -> None:
        """Send each parked message that can go now: to its subscription once that no longer
        holds its id, or to another with room that does not (one per id and subscriber: a
        second of the same id waits for the first)."""
        manager = self.manager
        for sub in list(self.subscriptions):
            parked = sub.deferred
            for msg_id in list(parked) if parked is not None else ():
                while sub.deferred is not None and msg_id in sub.deferred:
                    if not sub.holds(msg_id) and sub.has_capacity():
                        taker = sub
                    else:
                        other = self.other_taker(sub, msg_id)
                        if other is None:
                            break
                        taker = other
                    msg = self._unpark(sub, msg_id)
                    if msg.expires_at and msg.expired(now):
                        manager.expire(self, msg)
                    else:
                        manager.send(taker, msg, now)

    def other_taker(self, sub: Subscription, msg_id: str) -> Subscription | None:
        """A subscription other than ``sub`` with room that does not hold ``msg_id`` (none
        in a fan-out queue: each copy is its subscriber's)."""
        for other in self.subscriptions if self.lone is None and not self.fan_out else ():
            if other is not sub and other.has_capacity() and not other.holds(msg_id):
                return other
        return None

    # -- dispatch -------------------------------------------------------------------------

    def _next_with_capacity(self) -> Subscription | None:
        subs = self.subscriptions
        n = len(subs)
        start = self._rr
        for i in range(n):
            idx = (start + i) % n
            sub = subs[idx]
            if sub.n_held < sub.prefetch and sub.consumer.writable:
                self._rr = idx + 1 if idx + 1 < n else 0
                return sub
        return None

    def deliver_now(self, msg: StoredMessage) -> bool:
        """Hand a new message straight to a subscriber when nothing waits ahead of it (what
        enqueue + dispatch would do, without the round trip through the store)."""
        if self.count or self._dispatching:
            return False
        if self.fan_out:
            subs = self.subscriptions
            if not self.shared or not subs or self.manager.holding:
                return False  # (held: the read's publishes go out in one run at its end)
            for each in subs:
                if not each.consumer.writable:
                    return False
            self._dispatching = True
            try:
                self.manager.send_to_all(self, [msg])
            finally:
                self._dispatching = False
            return True
        lone = self.lone
        if lone is not None:  # (the usual case, without the round-robin bookkeeping)
            sub = lone
            if sub.n_held >= sub.prefetch or not sub.consumer.writable:
                return False
        else:
            found = self._next_with_capacity()
            if found is None:
                return False
            sub = found
        self._dispatching = True
        try:
            self.manager.send(sub, msg, msg.published_at)
        finally:
            self._dispatching = False
        return True

    def dispatch(self) -> None:
        """Hand ready messages to subscriptions that can take them, until one side runs out."""
        if self._dispatching or not self.count:
            return
        lone = self.lone
        if lone is not None and not self.fan_out:
            # A publish into a backed-up queue lands here every time: when its one subscriber
            # has no room, say so without setting up the dispatch loop.
            if lone.n_held >= lone.prefetch or not lone.consumer.writable:
                self.manager.after_dequeue(self)
                return
        elif not self.subscriptions:
            return
        if self.shared and self.manager.holding:
            self.manager.defer(self)
            return
        self._dispatching = True
        try:
            if self.fan_out:
                self._dispatch_fan_out()
            else:
                self._dispatch_one_each()
        finally:
            self._dispatching = False
        self.manager.after_dequeue(self)

    def _dispatch_one_each(self) -> None:
        manager = self.manager
        # One clock reading per run (TTL checks and ack deadlines): a run is bounded by the
        # subscribers' prefetch and takes a few ms at most, finer than the timer that
        # checks expiries and ack timeouts (tick).
        now = manager.clock()
        if self.n_deferred:  # (their ids may have been settled since: they go first)
            self._undefer(now)
        while self.count:
            lone = self.lone
            if lone is not None:  # (the usual case, without the round-robin bookkeeping)
                sub = lone
                if sub.n_held >= sub.prefetch or not sub.consumer.writable:
                    return
            else:
                found = self._next_with_capacity()
                if found is None:
                    return
                sub = found
            msg = self.pop_ready()
            if msg is None:
                return
            if msg.expires_at and msg.expired(now):
                manager.expire(self, msg)
                self._rr = (self._rr - 1) % len(self.subscriptions)  # nobody got this turn
                continue
            manager.send(sub, msg, now)

    def _dispatch_fan_out(self) -> None:
        # A fan-out message leaves the queue only when every subscriber can take it, so the
        # slowest subscriber paces the queue and nothing piles up per subscriber.
        if not self.needs_ack:
            self._dispatch_without_ack()
            return
        manager = self.manager
        subs = self.subscriptions
        if self.n_deferred:
            self._undefer(manager.clock())
        while self.count:
            head = self.pop_ready()
            if head is None:
                return
            if head.expires_at and head.expired(manager.clock()):
                manager.expire(self, head)
                continue
            if head.single:
                sub = self._redelivery_target(head)
                if sub is None:
                    self.push_front(head)
                    return
                manager.send(sub, head)
                continue
            if not all(s.has_capacity() for s in subs):
                self.push_front(head)
                return
            # (a subscriber that still holds the id gets its copy parked: ``send``)
            # Each copy is accounted for when it is sent; only ``head`` was counted on enqueue.
            manager.memory_bytes += len(head.payload) * (len(subs) - 1)
            fan = as_fan_out(head)  # (head itself: a fan-out queue holds FanOutMessages)
            fan.group = [len(subs)]
            for i, sub in enumerate(subs):
                manager.send(sub, fan if i == len(subs) - 1 else fan.copy())

    def _dispatch_without_ack(self) -> None:
        # FanOutWithoutAck: nothing is tracked per subscriber (no in-flight entry, no
        # deadline, nothing comes back), so every subscriber is handed the same message
        # objects, not copies, in runs of up to FAN_OUT_RUN (one call per subscriber and
        # run where the consumer has deliver_many), and the accounting is done once.
        manager = self.manager
        subs = self.subscriptions
        now = manager.clock()  # (one reading per dispatch, as in _dispatch_one_each)
        while self.count:
            for sub in subs:
                if not sub.consumer.writable:
                    return
            run: list[StoredMessage] = []
            while self.count and len(run) < FAN_OUT_RUN:
                head = self.pop_ready()
                if head is None:
                    break
                if head.expires_at and head.expired(now):
                    manager.expire(self, head)
                    continue
                run.append(head)
            if run:
                manager.send_to_all(self, run)

    def _redelivery_target(self, msg: StoredMessage) -> Subscription | None:
        """Where a returned fan-out copy goes: back to the subscriber that did not ack it,
        when it is still here; otherwise to any one subscriber."""
        target = msg.target
        if isinstance(target, Subscription) and target in self.subscriptions:
            # (parked on it by ``send`` while it still holds the id)
            return target if target.has_capacity() else None
        return self._next_with_capacity()


def _published(msg: StoredMessage) -> int:
    return msg.published_at


_FAN_OUT = frozenset({DeliveryMode.FAN_OUT_WITH_ACK, DeliveryMode.FAN_OUT_WITHOUT_ACK})
