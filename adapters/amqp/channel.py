"""One AMQP channel: consumers, delivery tags and acks, prefetch, publisher confirms, tx.

Consumers are core subscriptions (``AmqpConsumer`` is the core's Consumer); a delivery tag
maps to the subscription and message id it acknowledges. Publishes arrive as a method frame,
a content header and body frames, assembled here and routed by the server once complete.
The channel's state (open, awaiting content, closing) moves by ``states.CHANNEL_TRANSITIONS``.

What a channel uses of its connection is ``Owner`` below (the connection implements it), so
this module imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from vibemq_server.adapters.amqp.codec import (
    AmqpError,
    DeliverEncoder,
    GetOkEncoder,
    ReplyCode,
    encode_ack,
)
from vibemq_server.adapters.amqp.mapping import MessageMapper
from vibemq_server.adapters.amqp.states import CHANNEL_TRANSITIONS, ChannelState, Input
from vibemq_server.core import Consumer, Queue, QueueManager, StoredMessage, Subscription
from vibemq_server.core.buffers import PASS_THROUGH
from vibemq_server.server.stats import ProtocolStats
from vibemq_server.server.transport import Link

#: prefetch 0 means "no limit"
UNLIMITED = 2**31

BASIC_CLASS = 60

_CLOSING = ChannelState.CLOSING


class Consumers(Protocol):
    """What a channel uses of the broker's AMQP side."""

    mapper: MessageMapper
    #: the AMQP counters (deliveries count as messages sent)
    stats: ProtocolStats

    def consumer_ended(self, consumer: AmqpConsumer) -> None: ...


class Owner(Protocol):
    """What a channel uses of its connection."""

    conn_id: str
    manager: QueueManager
    frame_max: int

    @property
    def link(self) -> Link: ...

    @property
    def server(self) -> Consumers: ...

    def consumer_cancelled(self, channel: Channel, tag: str) -> None: ...


class AmqpConsumer(Consumer):
    """The core's Consumer for one basic.consume."""

    __slots__ = ("channel", "frames", "no_ack", "queue", "sub", "tag", "tag_bytes")

    def __init__(self, channel: Channel, tag: str, queue: str, no_ack: bool) -> None:
        self.channel = channel
        self.tag = tag
        self.tag_bytes = tag.encode()
        self.frames = DeliverEncoder(channel.number, self.tag_bytes, channel.conn.frame_max)
        self.queue = queue
        self.no_ack = no_ack
        self.sub: Subscription | None = None

    @property
    def writable(self) -> bool:
        return self.channel.can_deliver()

    def deliver(self, sub: Subscription, msg: StoredMessage) -> None:
        self.channel.deliver(self, sub, msg)

    def subscription_cancelled(self, sub: Subscription, reason: str) -> None:
        self.channel.cancelled_by_broker(self)


class _Getter(Consumer):
    """The core's Consumer behind basic.get: never pushed to, only pulled (manager.take)."""

    @property
    def writable(self) -> bool:
        return False

    def __init__(self) -> None:
        self.last: StoredMessage | None = None

    def deliver(self, sub: Subscription, msg: StoredMessage) -> None:
        self.last = msg

    def subscription_cancelled(self, sub: Subscription, reason: str) -> None:
        pass


def consumer_count(queue: Queue) -> int:
    """The queue's consumers as AMQP counts them (declare-ok, if-unused, exclusive consume,
    auto-delete, x-expires): every subscription but basic.get's internal ones."""
    return sum(1 for sub in queue.subscriptions if not isinstance(sub.consumer, _Getter))


class Pending:
    """A publish waiting for its content header and body."""

    __slots__ = (
        "body_size",
        "chunks",
        "exchange",
        "mandatory",
        "properties",
        "received",
        "routing_key",
    )

    def __init__(self, exchange: str, routing_key: str, mandatory: bool) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.body_size = -1  # until the content header
        self.properties = b""
        self.chunks: list[bytes | memoryview] = []
        self.received = 0


class Channel:
    # (slotted: every AMQP client opens one at least)
    __slots__ = (
        "_tags",
        "accepts",
        "confirm",
        "confirmed_upto",
        "conn",
        "consumers",
        "flow",
        "get_ok",
        "getters",
        "global_prefetch",
        "last_queue",
        "link",
        "next_tag",
        "number",
        "pending",
        "prefetch",
        "publish_seq",
        "state",
        "tx",
        "unacked",
    )

    def __init__(self, conn: Owner, number: int) -> None:
        self.conn = conn
        self.link = conn.link
        self.number = number
        self.state = ChannelState.OPEN
        #: what the current state accepts (read per method: no Enum hashing)
        self.accepts = CHANNEL_TRANSITIONS[ChannelState.OPEN]
        self.flow = True
        self.next_tag = 1
        #: delivery tag -> (subscription, message id, consumer or None for basic.get)
        self.unacked: dict[int, tuple[Subscription, str]] = {}
        self.consumers: dict[str, AmqpConsumer] = {}
        self.prefetch = 0  # per consumer, for consumers started after basic.qos
        self.global_prefetch = 0
        self.confirm = False
        self.publish_seq = 0
        self.tx: list[Callable[[], None]] | None = None
        self.pending: Pending | None = None
        self.getters: dict[str, tuple[Subscription, _Getter]] = {}
        self.get_ok: GetOkEncoder | None = None  # basic.get-ok frames, once there is a get
        self.last_queue = ""  # what an empty queue name means (RabbitMQ)
        self.confirmed_upto = 0  # every publish up to this seq is confirmed
        self._tags = 0

    # -- the state table ---------------------------------------------------------------------------

    def fire(self, event: Input) -> None:
        """Move to the state the table gives for ``event`` in the current one."""
        self.state = state = CHANNEL_TRANSITIONS[self.state][event]
        self.accepts = CHANNEL_TRANSITIONS[state]

    @property
    def closing(self) -> bool:
        """We sent channel.close: only close / close-ok count now."""
        return self.state is _CLOSING

    # -- delivery ----------------------------------------------------------------------------------

    def can_deliver(self) -> bool:
        return (
            self.flow
            and self.state is not _CLOSING
            and self.link.writable
            and (not self.global_prefetch or len(self.unacked) < self.global_prefetch)
        )

    def deliver(self, consumer: AmqpConsumer, sub: Subscription, msg: StoredMessage) -> None:
        tag = self.next_tag
        self.next_tag = tag + 1
        conn = self.conn
        server = conn.server
        properties, body, exchange, key = server.mapper.for_delivery(
            msg.payload,
            msg.headers,
            sub.queue.name,
            max(1, msg.expires_at - conn.manager.clock()) if msg.expires_at else 0,
        )
        server.stats.messages_sent += 1
        frames = consumer.frames
        if len(body) >= PASS_THROUGH:
            # The frames around the body (views of it, over one frame), not joined with it:
            # the transport writes a piece this large as it is (writev), no copy.
            self.link.send_parts(
                frames.parts(tag, msg.attempts > 1, exchange, key, properties, body)
            )
        else:
            self.link.send(frames.encode(tag, msg.attempts > 1, exchange, key, properties, body))
        if consumer.no_ack:
            conn.manager.ack(sub, msg.id, dispatch=False)
        else:
            self.unacked[tag] = (sub, msg.id)

    def new_consumer_tag(self) -> str:
        self._tags += 1
        return f"amq.ctag-{self.conn.conn_id}-{self.number}-{self._tags}"

    def cancelled_by_broker(self, consumer: AmqpConsumer) -> None:
        """Its queue was deleted: tell the client (consumer_cancel_notify), forget it."""
        self.consumers.pop(consumer.tag, None)
        self.conn.server.consumer_ended(consumer)
        consumer.sub = None
        self.conn.consumer_cancelled(self, consumer.tag)

    # -- acknowledgements ------------------------------------------------------------------------

    def _tags_for(self, delivery_tag: int, multiple: bool) -> list[int]:
        if multiple:
            if delivery_tag == 0:
                return list(self.unacked)
            # Tags are handed out in increasing order and ``unacked`` keeps insertion order:
            # the deliveries up to ``delivery_tag`` are a prefix of it (no full scan per ack).
            tags: list[int] = []
            append = tags.append
            for tag in self.unacked:
                if tag > delivery_tag:
                    break
                append(tag)
            return tags
        if delivery_tag not in self.unacked:
            raise AmqpError(
                ReplyCode.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - unknown delivery tag {delivery_tag}",
                self.number,
                BASIC_CLASS,
                80,
            )
        return [delivery_tag]

    def ack(self, delivery_tag: int, multiple: bool) -> set[str]:
        """Settle deliveries; returns the queues to refill (once per read, by the caller)."""
        manager = self.conn.manager
        unacked = self.unacked
        if not multiple:
            self._tags_for(delivery_tag, False)  # an unknown tag is a channel error
            sub, msg_id = unacked.pop(delivery_tag)
            manager.ack(sub, msg_id, dispatch=False)
            return self._freed({sub.queue.name})
        # A multiple ack settles each subscription's deliveries in one core call.
        by_sub: dict[Subscription, list[str]] = {}
        for tag in self._tags_for(delivery_tag, True):
            sub, msg_id = unacked.pop(tag)
            ids = by_sub.get(sub)
            if ids is None:
                by_sub[sub] = [msg_id]
            else:
                ids.append(msg_id)
        for sub, ids in by_sub.items():
            manager.ack_many(sub, ids)
        return self._freed({sub.queue.name for sub in by_sub})

    def nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> set[str]:
        manager = self.conn.manager
        queues: set[str] = set()
        # Each requeued message goes to the head of its queue: the newest first, so that
        # they end up in their original order (RabbitMQ keeps their positions).
        for tag in reversed(self._tags_for(delivery_tag, multiple)):
            sub, msg_id = self.unacked.pop(tag)
            manager.nack(sub, msg_id, requeue=requeue, dispatch=False)
            queues.add(sub.queue.name)
        return self._freed(queues)

    def _freed(self, queues: set[str]) -> set[str]:
        """The queues to refill once deliveries of ``queues`` are settled. Under a global
        (channel-wide) prefetch the room is the channel's: every consumer of the channel may
        take it, not only those of the settled deliveries' queues (which may be empty)."""
        if self.global_prefetch and queues:
            queues.update(consumer.queue for consumer in self.consumers.values())
        return queues

    def recover(self) -> set[str]:
        """basic.recover: every unacknowledged delivery goes back to its queue."""
        return self.nack(0, True, True)

    # -- publishing ------------------------------------------------------------------------------

    def content_header(self, body_size: int, properties: bytes, limit: int) -> bool:
        """True when the message is complete (an empty body)."""
        pending = self.pending
        if pending is None or pending.body_size >= 0:
            raise AmqpError(
                ReplyCode.UNEXPECTED_FRAME,
                f"UNEXPECTED_FRAME - content header on channel {self.number} without basic.publish",
                0,
            )
        if body_size > limit:
            # RabbitMQ's words (rabbit_channel: check_msg_size).
            raise AmqpError(
                ReplyCode.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - message size {body_size} is larger than configured "
                f"max size {limit}",
                self.number,
                BASIC_CLASS,
                40,
            )
        pending.body_size = body_size
        pending.properties = properties
        return body_size == 0

    def content_body(self, data: bytes | memoryview) -> bool:
        pending = self.pending
        if pending is None or pending.body_size < 0:
            raise AmqpError(
                ReplyCode.UNEXPECTED_FRAME,
                f"UNEXPECTED_FRAME - content body on channel {self.number} without a header",
                0,
            )
        pending.chunks.append(data)
        pending.received += len(data)
        if pending.received > pending.body_size:
            raise AmqpError(
                ReplyCode.FRAME_ERROR,
                "FRAME_ERROR - more content body than the header announced",
                0,
            )
        return pending.received == pending.body_size

    # -- closing ---------------------------------------------------------------------------------

    def release(self) -> set[str]:
        """The channel ends: consumers stop, unacknowledged deliveries go back."""
        manager = self.conn.manager
        queues: set[str] = set()
        for consumer in list(self.consumers.values()):
            self.conn.server.consumer_ended(consumer)
            if consumer.sub is not None:
                manager.unsubscribe(consumer.sub)
                queues.add(consumer.queue)
        self.consumers.clear()
        for sub, msg_id in reversed(self.unacked.values()):  # to the head: newest first
            if sub.queue.deleted:
                continue
            manager.nack(sub, msg_id, requeue=True, dispatch=False)
            queues.add(sub.queue.name)
        self.unacked.clear()
        for sub, _getter in self.getters.values():
            manager.unsubscribe(sub)
        self.getters.clear()
        self.pending = None
        return queues

    def confirm_ack(self, seq: int) -> bytes:
        return encode_ack(self.number, seq, False)
