"""A durable key -> message map kept in the journal by way of an internal queue.

Adapters keep small durable state (MQTT retained messages and persistent sessions) without a
storage format of their own: every entry is a message of an internal durable queue, parked
by key and never delivered. Replacing or deleting an entry settles the old message, so the
journal's recovery, compaction and reclamation treat entries like any live message.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from vibemq_server.config import DeliveryMode, OverflowStrategy
from vibemq_server.core.manager import QueueManager
from vibemq_server.core.message import StoredMessage
from vibemq_server.core.persistence import SettleReason
from vibemq_server.core.queue import Queue, QueueOptions

_NEVER = 2**62  # ms: entries are never delivered, so their ack timers never run


def table_options(durable: bool) -> QueueOptions:
    return QueueOptions(
        DeliveryMode.ROUND_ROBIN,
        2**62,
        0,
        False,
        "",
        2**31,
        _NEVER,
        OverflowStrategy.DROP_NEWEST,
        durable,
    )


class DurableTable:
    """Entries by key; durable when the queue is and the manager has persistence."""

    def __init__(self, manager: QueueManager, name: str, *, durable: bool = True) -> None:
        self.manager = manager
        queue = manager.queues.get(name)
        if queue is None:
            queue, _ = manager.create_queue(name, table_options(durable))
        # Recovery put the surviving entries back as queued messages, oldest first: park
        # them, a later entry for a key replacing (and settling) an earlier one.
        for msg in queue.take_all():
            manager.memory_bytes -= len(msg.payload)
            self._park(queue, msg)
        self.queue: Queue = queue

    def _park(self, queue: Queue, msg: StoredMessage) -> None:
        old = queue.parked.pop(msg.id, None)
        if old is not None:
            self._settle(queue, old)
        queue.parked[msg.id] = msg

    def _settle(self, queue: Queue, msg: StoredMessage) -> None:
        persistence = self.manager.persistence
        if queue.options.durable and persistence is not None:
            persistence.settled(queue, msg, SettleReason.ACKED, "replaced")

    def __len__(self) -> int:
        return len(self.queue.parked)

    def __contains__(self, key: str) -> bool:
        return key in self.queue.parked

    def get(self, key: str) -> StoredMessage | None:
        return self.queue.parked.get(key)

    def items(self) -> Iterator[tuple[str, StoredMessage]]:
        return iter(list(self.queue.parked.items()))

    def put(
        self, key: str, payload: bytes, headers: Mapping[str, str], expires_at: int = 0
    ) -> StoredMessage:
        """Set an entry (recorded in the journal before this returns). ``expires_at`` (the
        manager's clock, ms; 0 = never) is only kept, with the entry and in the journal: the
        table's user decides when an entry has expired (``drop_expired``)."""
        manager = self.manager
        now = manager.clock()
        msg = StoredMessage(key, self.queue.name, payload, headers, now, expires_at)
        msg.seq = manager.next_seq
        manager.next_seq += 1
        self._park(self.queue, msg)
        persistence = manager.persistence
        if self.queue.options.durable and persistence is not None:
            persistence.published(self.queue, msg)
        return msg

    def drop_expired(self) -> int:
        """Delete the entries whose ``expires_at`` has passed; the earliest ``expires_at``
        of those left (0: none expires)."""
        now = self.manager.clock()
        gone: list[str] = []
        due = 0
        for key, msg in self.queue.parked.items():
            expires = msg.expires_at
            if not expires:
                continue
            if expires <= now:
                gone.append(key)
            elif not due or expires < due:
                due = expires
        for key in gone:
            self.delete(key)
        return due

    def delete(self, key: str) -> bool:
        msg = self.queue.parked.pop(key, None)
        if msg is None:
            return False
        self._settle(self.queue, msg)
        return True
