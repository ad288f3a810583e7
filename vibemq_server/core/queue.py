"""A queue: its options, its ready messages, its subscriptions, and the dispatch loop.

Ready messages wait here, never in a connection's buffer: a subscription only receives while
its consumer is writable and under its prefetch limit, so a slow consumer makes messages wait
in the queue, where overflow limits apply.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from vibemq_server.config import DeliveryMode, OverflowStrategy
from vibemq_server.core.clock import Clock
from vibemq_server.core.message import Priority, StoredMessage, as_fan_out
from vibemq_server.core.native import mypyc_attr


class DeliveryDeferred(Exception):
    """A delivery must wait (its message id is still unacked at that subscriber): stop dispatch."""


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
    declared here: what an Ack and a delivery read first)."""

    __slots__ = (
        "attached",
        "consumer",
        "deliver_many",
        "durable",
        "id",
        "inflight",
        "label",
        "n_acked",
        "prefetch",
        "queue",
        "timed",
        "waiting",
    )

    inflight: dict[str, StoredMessage]
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

    def __init__(self, sub_id: str, queue: Queue, consumer: Consumer, prefetch: int) -> None:
        # Insertion order is delivery order and the ack timeout is per queue, so the first
        # entries are always the first to time out: the timeout scan stops at the first live
        # one. Each message holds its own ack deadline (``StoredMessage.deadline``).
        self.inflight = {}
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

    def has_capacity(self) -> bool:
        return self.consumer.writable and len(self.inflight) < self.prefetch

    def count_acks(self, n: int) -> None:
        """``n`` more of its deliveries acknowledged (on its queue once detached)."""
        if self.attached:
            self.n_acked += n
        else:
            self.queue.acked_gone += n


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
    #: ready messages
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

    @property
    def message_count(self) -> int:
        return self.count

    @property
    def n_acked(self) -> int:
        """Deliveries acknowledged: its subscriptions' own counts and those of the gone."""
        return self.acked_gone + sum(s.n_acked for s in self.subscriptions)

    @property
    def unacked_count(self) -> int:
        return sum(len(s.inflight) for s in self.subscriptions)

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
        """``sub`` is no longer attached: its acks count here from now on."""
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
        """The ready messages in the order they would be delivered."""
        for level in reversed(self._levels):
            yield from level

    def ready_list(self) -> list[StoredMessage]:
        """``list(ready())``, a level at a time (a million messages in a few ms, not 40)."""
        out: list[StoredMessage] = []
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
        """The message DropOldest sacrifices: the oldest of the lowest priority present."""
        for level in self._levels:
            if level:
                msg = level.popleft()
                self.nbytes -= len(msg.payload)
                self.count -= 1
                return msg
        return None

    def pop_expired(self, now: int) -> Iterator[StoredMessage]:
        """Expired messages at the heads (TTL is per queue, so heads expire first)."""
        for level in self._levels:
            while level and level[0].expired(now):
                msg = level.popleft()
                self.nbytes -= len(msg.payload)
                self.count -= 1
                yield msg

    def take_all(self) -> list[StoredMessage]:
        out = [m for level in self._levels for m in level]
        for level in self._levels:
            level.clear()
        self.nbytes = 0
        self.count = 0
        return out

    # -- dispatch -------------------------------------------------------------------------

    def _next_with_capacity(self) -> Subscription | None:
        subs = self.subscriptions
        n = len(subs)
        start = self._rr
        for i in range(n):
            idx = (start + i) % n
            sub = subs[idx]
            if len(sub.inflight) < sub.prefetch and sub.consumer.writable:
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
            if len(sub.inflight) >= sub.prefetch or not sub.consumer.writable:
                return False
        else:
            found = self._next_with_capacity()
            if found is None:
                return False
            sub = found
        self._dispatching = True
        try:
            self.manager.send(sub, msg, msg.published_at)
        except DeliveryDeferred:
            pass  # send() put it back in the store
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
            if len(lone.inflight) >= lone.prefetch or not lone.consumer.writable:
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
        except DeliveryDeferred:
            pass
        finally:
            self._dispatching = False
        self.manager.after_dequeue(self)

    def _dispatch_one_each(self) -> None:
        manager = self.manager
        # One clock reading per run (TTL checks and ack deadlines): a run is bounded by the
        # subscribers' prefetch and takes a few ms at most, finer than the timer that
        # checks expiries and ack timeouts (tick).
        now = manager.clock()
        while self.count:
            lone = self.lone
            if lone is not None:  # (the usual case, without the round-robin bookkeeping)
                sub = lone
                if len(sub.inflight) >= sub.prefetch or not sub.consumer.writable:
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
            if not all(s.has_capacity() and head.id not in s.inflight for s in subs):
                self.push_front(head)
                return
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
            if target.has_capacity() and msg.id not in target.inflight:
                return target
            return None
        return self._next_with_capacity()


_FAN_OUT = frozenset({DeliveryMode.FAN_OUT_WITH_ACK, DeliveryMode.FAN_OUT_WITHOUT_ACK})
