"""The core's management operations: browsing a queue without consuming it, and moving
messages out of a dead-letter queue back to where they came from (or to a named queue)."""

from __future__ import annotations

import pytest
from test_core import Recorder, make, publish

from vibemq_server.config import QueueDefaults
from vibemq_server.core import ManualClock, QueueManager, QueueNotFound, StoredMessage
from vibemq_server.core.persistence import Persistence, SettleReason


class Settles(Persistence):
    """A persistence layer that records settles and publishes (the core's port)."""

    available = True
    epoch = 0

    def __init__(self) -> None:
        self.settles: list[tuple[str, str, SettleReason, str]] = []
        self.publishes: list[tuple[str, str]] = []

    def queue_created(self, queue: object) -> None: ...

    def queue_deleted(self, name: str) -> None: ...

    def published(self, queue: object, msg: StoredMessage, client: bool = False, /) -> None:
        self.publishes.append((msg.queue, msg.id))

    def delivered(self, queue: object, msg: StoredMessage) -> None: ...

    def settled(
        self, queue: object, msg: StoredMessage, reason: SettleReason, detail: str = ""
    ) -> None:
        self.settles.append((msg.queue, msg.id, reason, detail))

    def settled_all(self, queue: object, msgs: list[StoredMessage], reason: SettleReason) -> None:
        for msg in msgs:
            self.settled(queue, msg, reason)

    def when_durable(self, callback: object) -> None: ...

    def commit_early(self) -> None: ...


@pytest.fixture
def mgr() -> QueueManager:
    return QueueManager(QueueDefaults(), ManualClock())


def dead_letter_all(mgr: QueueManager, queue: str, *ids: str) -> None:
    """Publish ``ids`` into ``queue`` and reject each once: they land in its DLQ."""
    publish(mgr, queue, *ids)
    r = Recorder()
    sub = mgr.subscribe(queue, "s", r, 1000)
    for msg_id in ids:
        assert mgr.nack(sub, msg_id, requeue=False)
    mgr.unsubscribe(sub)


def test_browse_lists_ready_messages_without_taking_them(mgr: QueueManager) -> None:
    make(mgr, "q")
    publish(mgr, "q", "a", "b", "c", "d")
    before = mgr.queue_info("q")
    assert [m.id for m in mgr.browse("q")] == ["a", "b", "c", "d"]
    assert [m.id for m in mgr.browse("q", offset=1, limit=2)] == ["b", "c"]
    assert mgr.browse("q", offset=10) == []
    assert mgr.queue_info("q") == before  # nothing delivered, counted or moved
    r = Recorder()
    mgr.subscribe("q", "s", r, 10)
    assert r.ids == ["a", "b", "c", "d"]  # still all there, in order


def test_browse_in_delivery_order_of_priorities_and_skips_expired(
    mgr: QueueManager,
) -> None:
    make(mgr, "p", mode="PriorityBased", messageTtl=100)
    mgr.publish("p", "low", b"", {"priority": "low"})
    mgr.publish("p", "high", b"", {"priority": "high"})
    assert [m.id for m in mgr.browse("p")] == ["high", "low"]
    assert isinstance(mgr.clock, ManualClock)
    mgr.clock.advance(200)
    assert mgr.browse("p") == []


def test_browse_missing_queue(mgr: QueueManager) -> None:
    with pytest.raises(QueueNotFound):
        mgr.browse("nope")


def test_move_sends_dead_letters_back_to_their_queues(mgr: QueueManager) -> None:
    make(mgr, "a", enableDeadLetterQueue=True, deadLetterQueueName="dlq")
    make(mgr, "b", enableDeadLetterQueue=True, deadLetterQueueName="dlq")
    dead_letter_all(mgr, "a", "a1", "a2")
    dead_letter_all(mgr, "b", "b1")
    assert mgr.queues["dlq"].message_count == 3
    result = mgr.move_messages("dlq")
    assert result.moved == {"a": 2, "b": 1} and result.kept == 0
    assert mgr.queues["dlq"].message_count == 0
    got = Recorder()
    mgr.subscribe("a", "s", got, 10)
    assert got.ids == ["a1", "a2"]
    # the dead-letter headers are gone: the message is as it was published
    assert all("originalQueue" not in h and "deadLetterReason" not in h for _, _, h in got.got)


def test_move_keeps_what_cannot_go_back(mgr: QueueManager) -> None:
    make(mgr, "a", enableDeadLetterQueue=True, deadLetterQueueName="dlq", maxQueueSize=1)
    make(mgr, "gone", enableDeadLetterQueue=True, deadLetterQueueName="dlq")
    dead_letter_all(mgr, "a", "a1")
    dead_letter_all(mgr, "gone", "g1")
    mgr.delete_queue("gone")
    mgr.publish("dlq", "stray", b"x", {})  # no originalQueue header
    mgr.publish("a", "fill", b"x", {})  # a is full now
    result = mgr.move_messages("dlq")
    assert result.moved == {} and result.kept == 3
    # kept in their order, and nothing was dropped anywhere
    assert [m.id for m in mgr.browse("dlq")] == ["a1", "g1", "stray"]
    assert mgr.queues["a"].n_dropped == 0 and mgr.queues["dlq"].n_dropped == 0
    mgr.purge("a")
    assert mgr.move_messages("dlq").moved == {"a": 1}
    assert [m.id for m in mgr.browse("dlq")] == ["g1", "stray"]


def test_move_to_a_named_queue_with_a_limit(mgr: QueueManager) -> None:
    make(mgr, "src")
    make(mgr, "dst")
    publish(mgr, "src", "1", "2", "3")
    assert mgr.move_messages("src", target="dst", limit=2).moved == {"dst": 2}
    assert [m.id for m in mgr.browse("src")] == ["3"]
    assert [m.id for m in mgr.browse("dst")] == ["1", "2"]
    assert mgr.move_messages("src", target="src").kept == 1  # not into itself


def test_move_memory_and_journal(mgr: QueueManager) -> None:
    journal = Settles()
    mgr.persistence = journal
    make(mgr, "a", enableDeadLetterQueue=True, deadLetterQueueName="dlq")
    dead_letter_all(mgr, "a", "m")
    memory = mgr.memory_bytes
    journal.settles.clear()
    journal.publishes.clear()
    assert mgr.move_messages("dlq").total == 1
    assert mgr.memory_bytes == memory  # left one queue, entered another
    assert journal.settles == [("dlq", "m", SettleReason.MOVED, "a")]
    assert journal.publishes == [("a", "m")]


def test_move_missing_queue(mgr: QueueManager) -> None:
    with pytest.raises(QueueNotFound):
        mgr.move_messages("nope")
