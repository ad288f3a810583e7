"""What the core tells a persistence layer (the journal), without knowing how it stores it."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

from vibemq_server.core.durable_replies import Flushes
from vibemq_server.core.native import mypyc_attr

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


@mypyc_attr(allow_interpreted_subclasses=True)
class Persistence(Flushes):
    """Called by the core for durable queues only, in the order things happen.

    A base class (the journal subclasses it), not a Protocol: the compiled manager and
    sessions then call ``published``, ``delivered`` and ``settled_all`` through the vtable,
    where a Protocol's are looked up by name and their arguments parsed (some 250-400
    instructions a call, three calls a durable message). The tests' doubles subclass it too
    (called the slow way); ``available`` and ``epoch`` they may declare as class attributes."""

    __slots__ = ()

    @property
    def available(self) -> bool:
        """False while storage is failing: durable publishes are then refused."""
        raise NotImplementedError

    def queue_created(self, queue: Queue) -> None:
        raise NotImplementedError

    def queue_deleted(self, name: str) -> None:
        raise NotImplementedError

    def published(self, queue: Queue, msg: StoredMessage, client: bool = False, /) -> None:
        """``client``: a client's publish, which may be withdrawn if storing it fails
        (positional: a keyword costs the compiled callee a slow argument parse, every
        durable publish)."""
        raise NotImplementedError

    def delivered(self, queue: Queue, msg: StoredMessage) -> None:
        raise NotImplementedError

    def settled(
        self, queue: Queue, msg: StoredMessage, reason: SettleReason, detail: str = ""
    ) -> None:
        raise NotImplementedError

    def settled_all(self, queue: Queue, msgs: list[StoredMessage], reason: SettleReason) -> None:
        """``settled`` for each of ``msgs`` in order, without detail (the acks of a read)."""
        raise NotImplementedError
