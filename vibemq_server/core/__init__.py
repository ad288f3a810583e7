"""The protocol-free core: queues, routing, consumers, acks, TTL and dead letters."""

from vibemq_server.core.clock import Clock, ManualClock, wall_clock_ms
from vibemq_server.core.manager import (
    CoreError,
    DeadLetterReason,
    InvalidQueueOptions,
    MoveResult,
    PersistenceUnavailable,
    PublishOutcome,
    QueueExists,
    QueueManager,
    QueueNotFound,
)
from vibemq_server.core.message import Priority, StoredMessage
from vibemq_server.core.persistence import Persistence, SettleReason
from vibemq_server.core.queue import Consumer, Queue, QueueOptions, Subscription
from vibemq_server.core.routing import AddressSink, MessageSource

__all__ = [
    "AddressSink",
    "Clock",
    "Consumer",
    "CoreError",
    "DeadLetterReason",
    "InvalidQueueOptions",
    "ManualClock",
    "MessageSource",
    "MoveResult",
    "Persistence",
    "PersistenceUnavailable",
    "Priority",
    "PublishOutcome",
    "Queue",
    "QueueExists",
    "QueueManager",
    "QueueNotFound",
    "QueueOptions",
    "SettleReason",
    "StoredMessage",
    "Subscription",
    "wall_clock_ms",
]
