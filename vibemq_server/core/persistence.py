"""What the core tells a persistence layer (the journal), without knowing how it stores it."""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from vibemq_server.core.message import StoredMessage
    from vibemq_server.core.queue import Queue


class SettleReason(IntEnum):
    """Why a message left its queue for good (the journal stores the number)."""

    ACKED = 0
    DROPPED = 1  # overflow, or retries exhausted without a dead-letter queue
    EXPIRED = 2  # TTL passed, no dead-letter queue
    DEAD_LETTERED = 3  # moved to the dead-letter queue (a publish there follows)
    DELIVERED_NO_ACK = 4  # delivered where no ack is expected (FanOutWithoutAck)
    MOVED = 5  # moved to another queue by an operator (a publish there follows)


class Persistence(Protocol):
    """Called by the core for durable queues only, in the order things happen."""

    @property
    def available(self) -> bool:
        """False while storage is failing: durable publishes are then refused."""
        ...

    @property
    def epoch(self) -> int:
        """Counts flushes: everything recorded under one epoch becomes durable together."""
        ...

    def queue_created(self, queue: Queue) -> None: ...

    def queue_deleted(self, name: str) -> None: ...

    def published(self, queue: Queue, msg: StoredMessage, client: bool = False, /) -> None:
        """``client``: a client's publish, which may be withdrawn if storing it fails
        (positional: a keyword costs the compiled callee a slow argument parse, every
        durable publish)."""
        ...

    def delivered(self, queue: Queue, msg: StoredMessage) -> None: ...

    def settled(
        self, queue: Queue, msg: StoredMessage, reason: SettleReason, detail: str = ""
    ) -> None: ...

    def settled_all(self, queue: Queue, msgs: list[StoredMessage], reason: SettleReason) -> None:
        """``settled`` for each of ``msgs`` in order, without detail (the acks of a read)."""
        ...

    def when_durable(self, callback: Callable[[Exception | None], None]) -> None:
        """Call back once everything recorded so far is as durable as configured."""
        ...

    def commit_early(self) -> None:
        """A safe point (no publish half recorded): start making what is recorded so far
        durable now, if that can start at once, rather than at the end of the loop turn.
        Never calls back from inside; may do nothing."""
        ...
