"""A publisher reusing a message id its subscriber still holds: only that message waits.

An Ack names a message by id, so a subscriber never holds two deliveries of one id. The
second one waits: given to another subscriber that does not hold the id, else parked on
this one until that delivery is settled, while the messages behind it keep flowing. Each
way a parked message can be woken (ack, batch ack, reject, requeue, ack timeout, TTL,
unsubscribe, AMQP-style detach, purge, queue deletion, overflow) is exercised here on the
core with the injected clock; tests/integration/test_native_reused_id.py does it over a
socket with the client library."""

from __future__ import annotations

from test_core import Recorder, make, publish

from vibemq_server.core import ManualClock, QueueManager, Subscription
from vibemq_server.journal.journal import Journal


def held_back(mgr: QueueManager, queue: str = "q") -> list[str]:
    """The ids of the messages parked on the queue's subscriptions."""
    return [m.id for m in mgr.queues[queue].ready() if m.id in _parked_ids(mgr, queue)]


def _parked_ids(mgr: QueueManager, queue: str) -> set[str]:
    out: set[str] = set()
    for sub in mgr.queues[queue].subscriptions:
        out.update(sub.deferred or ())
    return out


def consume_in_batches(mgr: QueueManager, sub: Subscription, rec: Recorder, k: int) -> None:
    """A consumer that acks only once it holds ``k`` messages, then all of them at once (the
    native session's path: ``ack_many``, then one refill)."""
    while len(sub.inflight) >= k:
        mgr.ack_many(sub, list(sub.inflight))
        sub.queue.dispatch()


def test_batch_acking_consumer_is_not_stalled_by_a_reused_id(mgr: QueueManager) -> None:
    """The stall of the report: prefetch 10, the consumer acks once it holds 4; the publisher
    reuses "x" while "x" is held. Before, the second "x" stopped the whole queue: the
    consumer held 1 and waited for 3 more, forever."""
    rec = Recorder()
    sub = mgr.subscribe("q", "s", rec, 10)
    publish(mgr, "q", "x", "x", "a", "b", "c")
    assert rec.ids == ["x", "a", "b", "c"]  # the second "x" waits; a, b, c do not
    assert held_back(mgr) == ["x"]
    consume_in_batches(mgr, sub, rec, 4)
    assert rec.ids == ["x", "a", "b", "c", "x"]  # woken by the batch's Ack of "x"
    assert rec.got[-1][1] == 1  # a first delivery, not a redelivery
    assert not held_back(mgr) and list(sub.inflight) == ["x"]


def test_a_stream_of_reused_ids_all_arrive_to_a_batch_acking_consumer(mgr: QueueManager) -> None:
    rec = Recorder()
    sub = mgr.subscribe("q", "s", rec, 20)
    ids = [f"id{i % 7}" for i in range(200)]  # every id reused many times, interleaved
    for i, msg_id in enumerate(ids):
        mgr.publish("q", msg_id, str(i).encode(), {})
        consume_in_batches(mgr, sub, rec, 5)
    mgr.ack_many(sub, list(sub.inflight))
    sub.queue.dispatch()
    while sub.inflight:  # the tail: one per id at a time
        mgr.ack_many(sub, list(sub.inflight))
        sub.queue.dispatch()
    assert sorted(rec.ids) == sorted(ids)
    queue = mgr.queues["q"]
    assert queue.count == 0 and queue.n_deferred == 0 and queue.nbytes == 0
    assert mgr.memory_bytes == 0 and queue.n_acked == 200


def test_parked_message_counts_as_ready_in_stats_and_memory(mgr: QueueManager) -> None:
    rec = Recorder()
    mgr.subscribe("q", "s", rec, 10)
    mgr.publish("q", "x", b"12345", {})
    mgr.publish("q", "x", b"123", {})
    info = mgr.queue_info("q")
    assert info["messageCount"] == 1 and info["unackedCount"] == 1
    assert mgr.queues["q"].nbytes == 3 and mgr.memory_bytes == 3
    assert [m.payload for m in mgr.browse("q")] == [b"123"]


def test_another_subscriber_that_does_not_hold_the_id_takes_it(mgr: QueueManager) -> None:
    a, b = Recorder(), Recorder()
    sa = mgr.subscribe("q", "a", a, 10)
    mgr.subscribe("q", "b", b, 10)
    publish(mgr, "q", "x", "y", "x")  # a: x, b: y, then "x" is a's turn: b takes it
    assert (a.ids, b.ids) == (["x"], ["y", "x"])
    assert not held_back(mgr) and list(sa.inflight) == ["x"]


def test_parked_when_every_subscriber_holds_the_id_and_woken_by_its_ack(
    mgr: QueueManager,
) -> None:
    a, b = Recorder(), Recorder()
    mgr.subscribe("q", "a", a, 10)
    sb = mgr.subscribe("q", "b", b, 10)
    publish(mgr, "q", "x", "x", "x", "y", "z")
    assert a.ids[0] == b.ids[0] == "x"  # the third "x" is parked; y and z go
    assert sorted(a.ids[1:] + b.ids[1:]) == ["y", "z"] and held_back(mgr) == ["x"]
    mgr.ack(sb, "x")
    assert b.ids[-1] == "x" and not held_back(mgr)  # b holds "x" no more: it takes it


def test_a_subscriber_without_room_is_not_given_the_held_back_message(mgr: QueueManager) -> None:
    a, b = Recorder(), Recorder(writable=False)
    sa = mgr.subscribe("q", "a", a, 10)
    mgr.subscribe("q", "b", b, 10)
    publish(mgr, "q", "x", "x")
    assert a.ids == ["x"] and b.ids == [] and held_back(mgr) == ["x"]
    mgr.ack(sa, "x")
    assert a.ids == ["x", "x"]


def test_parked_message_woken_by_reject_and_by_requeue(mgr: QueueManager) -> None:
    rec = Recorder()
    sub = mgr.subscribe("q", "s", rec, 10)
    publish(mgr, "q", "x", "x", "x")
    mgr.nack(sub, "x", requeue=False)  # rejected (dropped: no DLQ), the next "x" goes out
    assert rec.ids == ["x", "x"] and held_back(mgr) == ["x"]
    mgr.nack(sub, "x", requeue=True)  # back to the head; the parked "x" is sent first
    assert rec.ids == ["x", "x", "x"]
    assert mgr.queues["q"].count == 1  # the requeued one now waits for its turn
    mgr.ack(sub, "x")
    assert rec.ids == ["x", "x", "x", "x"] and rec.got[-1][1] == 2  # the requeued, redelivered


def test_parked_message_woken_by_the_ack_timeout(mgr: QueueManager, clock: ManualClock) -> None:
    make(mgr, ackTimeout=1000, maxRetryAttempts=5)
    rec = Recorder()
    sub = mgr.subscribe("q", "s", rec, 10)
    publish(mgr, "q", "x", "x", "a")
    assert rec.ids == ["x", "a"]
    clock.advance(1001)
    mgr.tick()  # x and a time out: the parked "x" goes first, then a; the returned x parks
    assert rec.ids == ["x", "a", "x", "a"] and [g[1] for g in rec.got] == [1, 1, 1, 2]
    assert held_back(mgr) == ["x"] and list(sub.inflight) == ["x", "a"]
    mgr.ack(sub, "x")
    assert rec.ids[-1] == "x" and rec.got[-1][1] == 2 and not held_back(mgr)


def test_parked_message_expires_into_the_dead_letter_queue(
    mgr: QueueManager, clock: ManualClock
) -> None:
    make(mgr, messageTtl=500, enableDeadLetterQueue=True)
    rec = Recorder()
    mgr.subscribe("q", "s", rec, 10)
    publish(mgr, "q", "x")
    clock.advance(100)
    publish(mgr, "q", "x")
    clock.advance(550)  # the parked one has expired (a delivery never does)
    mgr.tick()
    assert not held_back(mgr) and mgr.queues["q"].count == 0
    assert [m.id for m in mgr.queues["q.dlq"].ready()] == ["x"]
    assert mgr.queues["q"].n_expired == 1 and mgr.memory_bytes == 2


def test_unsubscribe_puts_parked_messages_back_for_the_others(mgr: QueueManager) -> None:
    a, b = Recorder(), Recorder(writable=False)
    sa = mgr.subscribe("q", "a", a, 10)
    sb = mgr.subscribe("q", "b", b, 10)
    publish(mgr, "q", "x", "x", "y", "y")
    assert a.ids == ["x", "y"] and held_back(mgr) == ["x", "y"]
    b.writable = True
    mgr.unsubscribe(sa)  # its deliveries first, then what was parked on it, in order
    assert b.ids == ["x", "y"] and [g[1] for g in b.got] == [2, 2]
    assert held_back(mgr) == ["x", "y"]  # now parked on b, which holds both ids
    mgr.ack_many(sb, ["x", "y"])
    sb.queue.dispatch()
    assert b.ids == ["x", "y", "x", "y"] and [g[1] for g in b.got] == [2, 2, 1, 1]
    assert mgr.queues["q"].count == 0 and mgr.memory_bytes == 0


def test_detach_puts_parked_messages_back_and_dispatches(mgr: QueueManager) -> None:
    """AMQP's basic.cancel: the deliveries stay with the detached subscription, the parked
    message is the others' at once."""
    a, b = Recorder(), Recorder(writable=False)
    sa = mgr.subscribe("q", "a", a, 10)
    mgr.subscribe("q", "b", b, 10)
    publish(mgr, "q", "x", "x")
    b.writable = True
    mgr.detach(sa)
    assert b.ids == ["x"] and list(sa.inflight) == ["x"] and not held_back(mgr)


def test_purge_and_delete_account_for_parked_messages(mgr: QueueManager) -> None:
    rec = Recorder()
    mgr.subscribe("q", "s", rec, 10)
    publish(mgr, "q", "x", "x", "x")
    assert mgr.purge("q") == 2
    assert mgr.memory_bytes == 0 and mgr.queues["q"].nbytes == 0 and not held_back(mgr)
    publish(mgr, "q", "x")
    mgr.delete_queue("q")
    assert mgr.memory_bytes == 0


def test_drop_oldest_sacrifices_a_parked_message_when_nothing_else_is_left(
    mgr: QueueManager,
) -> None:
    make(mgr, maxQueueSize=1, overflowStrategy="DropOldest")
    rec = Recorder()
    mgr.subscribe("q", "s", rec, 10)
    publish(mgr, "q", "x", "x")  # the second is parked: the queue is full
    mgr.publish("q", "x", b"new", {})
    assert [m.payload for m in mgr.queues["q"].ready()] == [b"new"]
    assert mgr.queues["q"].count == 1 and mgr.queues["q"].n_dropped == 1


def test_get_passes_over_a_held_id(mgr: QueueManager) -> None:
    rec = Recorder(writable=False)  # a getter: never pushed to
    sub = mgr.subscribe("q", "g", rec, 1000)
    publish(mgr, "q", "x", "x", "a")
    first = mgr.take(sub)
    assert first is not None and first.id == "x"
    second = mgr.take(sub)
    assert second is not None and second.id == "a"  # before: None, "x" blocked the get
    assert mgr.take(sub) is None
    assert [m.id for m in mgr.queues["q"].ready()] == ["x"]
    mgr.ack(sub, "x")
    third = mgr.take(sub)
    assert third is not None and third.id == "x"


def test_compaction_keeps_a_parked_message_live(mgr: QueueManager) -> None:
    """The journal's compaction copies a queue's live messages forward: a parked one is
    one of them (it is still in the queue for recovery)."""
    rec = Recorder()
    mgr.subscribe("q", "s", rec, 10)
    publish(mgr, "q", "x", "x", "a")
    live = Journal._all_messages(mgr.queues["q"])
    assert sorted(m.id for m in live) == ["a", "x", "x"]


def test_fan_out_parks_the_copy_of_a_subscriber_holding_the_id(mgr: QueueManager) -> None:
    """FanOutWithAck: a subscriber still holding the id gets its copy parked, the others get
    theirs, and the queue goes on (before: it waited for that Ack whole)."""
    make(mgr, mode="FanOutWithAck")
    a, b = Recorder(), Recorder()
    sa = mgr.subscribe("q", "a", a, 10)
    sb = mgr.subscribe("q", "b", b, 10)
    publish(mgr, "q", "x")
    mgr.ack(sb, "x")  # b is done with the first "x"; a still holds it
    publish(mgr, "q", "x", "y")
    assert a.ids == ["x", "y"] and b.ids == ["x", "x", "y"]
    assert held_back(mgr) == ["x"] and mgr.queue_info("q")["messageCount"] == 1
    mgr.ack(sa, "x")
    assert a.ids == ["x", "y", "x"] and not held_back(mgr)
    for sub in (sa, sb):
        mgr.ack_many(sub, list(sub.inflight))
    assert mgr.queues["q"].count == 0 and mgr.memory_bytes == 0


def test_fan_out_parked_copy_goes_to_one_other_subscriber_when_its_own_leaves(
    mgr: QueueManager,
) -> None:
    make(mgr, mode="FanOutWithAck")
    a, b = Recorder(), Recorder()
    sa = mgr.subscribe("q", "a", a, 10)
    sb = mgr.subscribe("q", "b", b, 10)
    publish(mgr, "q", "x")
    mgr.ack(sb, "x")
    publish(mgr, "q", "x")  # a's copy parked, b's delivered
    mgr.unsubscribe(sa)  # a's delivery and its parked copy: each to one subscriber (b)
    assert b.ids == ["x", "x"] and held_back(mgr) == ["x", "x"]
    for _ in range(2):
        mgr.ack(sb, "x")
    assert b.ids == ["x", "x", "x", "x"] and not held_back(mgr)
    mgr.ack(sb, "x")
    assert mgr.queues["q"].count == 0 and mgr.queues["q"].unacked_count == 0
    assert mgr.memory_bytes == 0
