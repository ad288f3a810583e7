"""The protocol-free core with an injected clock: delivery modes, acks, redelivery, TTL,
dead letters, overflow and flow control, without sockets and without sleeping."""

from __future__ import annotations

import pytest

from vibemq_server.config import DeliveryMode, OverflowStrategy, QueueDefaults
from vibemq_server.core import (
    InvalidQueueOptions,
    ManualClock,
    PublishOutcome,
    Queue,
    QueueExists,
    QueueManager,
    QueueNotFound,
    StoredMessage,
    Subscription,
)
from vibemq_server.core.manager import SWEEP_PER_TICK
from vibemq_server.core.queue import Consumer


class Recorder(Consumer):
    """A consumer that records what it is given (the core's port, not the broker)."""

    writable = True  # (shadows Consumer's read-only property: instances may set it)

    def __init__(self, writable: bool = True) -> None:
        self.writable = writable
        self.got: list[tuple[str, int, dict[str, str]]] = []
        self.cancelled: list[str] = []

    def deliver(self, sub: Subscription, msg: StoredMessage) -> None:
        self.got.append((msg.id, msg.attempts, dict(msg.headers)))

    def subscription_cancelled(self, sub: Subscription, reason: str) -> None:
        self.cancelled.append(reason)

    @property
    def ids(self) -> list[str]:
        return [g[0] for g in self.got]


class RunRecorder(Recorder):
    """A consumer that takes a FanOutWithoutAck queue's runs whole (``deliver_many``)."""

    def __init__(self, writable: bool = True) -> None:
        super().__init__(writable)
        self.runs: list[list[StoredMessage]] = []

    def deliver_many(self, sub: Subscription, msgs: list[StoredMessage]) -> None:
        self.runs.append(msgs)
        for msg in msgs:
            self.deliver(sub, msg)


def make(mgr: QueueManager, name: str = "q", **options: object) -> None:
    mgr.create_queue(name, mgr.options_from(options))


def publish(mgr: QueueManager, queue: str, *ids: str, **headers: str) -> list[PublishOutcome]:
    return [mgr.publish(queue, i, b"{}", headers) for i in ids]


def test_round_robin_rotates(mgr: QueueManager) -> None:
    a, b, c = Recorder(), Recorder(), Recorder()
    for i, r in enumerate((a, b, c)):
        mgr.subscribe("q", f"s{i}", r, 100)
    publish(mgr, "q", *[f"m{i}" for i in range(6)])
    assert (a.ids, b.ids, c.ids) == (["m0", "m3"], ["m1", "m4"], ["m2", "m5"])


def test_fan_out_with_ack_copies_and_needs_acks(mgr: QueueManager) -> None:
    make(mgr, mode="FanOutWithAck")
    a, b = Recorder(), Recorder()
    sa = mgr.subscribe("q", "a", a, 1)
    sb = mgr.subscribe("q", "b", b, 1)
    publish(mgr, "q", "m1", "m2")
    assert a.ids == ["m1"] and b.ids == ["m1"]
    assert mgr.ack(sa, "m1")
    assert b.ids == ["m1"]  # the slowest subscriber paces a fan-out queue
    assert mgr.ack(sb, "m1")
    assert a.ids == ["m1", "m2"] and b.ids == ["m1", "m2"]
    assert mgr.queues["q"].unacked_count == 2


def test_fan_out_without_ack(mgr: QueueManager) -> None:
    make(mgr, mode=2)  # by number, as the original accepts
    a, b = Recorder(), Recorder()
    sa = mgr.subscribe("q", "a", a, 1)
    mgr.subscribe("q", "b", b, 1)
    publish(mgr, "q", "m1", "m2", "m3")
    assert a.ids == b.ids == ["m1", "m2", "m3"]
    assert not sa.inflight
    assert not mgr.ack(sa, "m1")


def test_fan_out_without_ack_waits_for_every_subscriber_and_counts_each(
    mgr: QueueManager,
) -> None:
    make(mgr, mode="FanOutWithoutAck")
    a, b = Recorder(), Recorder(writable=False)
    mgr.subscribe("q", "a", a, 1)
    mgr.subscribe("q", "b", b, 1)
    publish(mgr, "q", "m1", "m2")
    queue = mgr.queues["q"]
    assert a.ids == b.ids == []  # b cannot take it: it waits in the queue, for both
    assert queue.message_count == 2 and mgr.memory_bytes == 4
    b.writable = True
    queue.dispatch()
    assert a.got == b.got == [("m1", 1, {}), ("m2", 1, {})]
    assert queue.n_delivered == 4 and queue.n_redelivered == 0
    assert queue.message_count == 0 and mgr.memory_bytes == 0


def test_fan_out_without_ack_held_publishes_go_out_in_one_run(mgr: QueueManager) -> None:
    make(mgr, mode="FanOutWithoutAck")
    a, b = RunRecorder(), RunRecorder()
    mgr.subscribe("q", "a", a, 1)
    mgr.subscribe("q", "b", b, 1)
    mgr.hold()  # (what the broker does while it handles a read)
    publish(mgr, "q", "m1", "m2", "m3")
    assert a.got == b.got == []
    mgr.release()
    assert len(a.runs) == 1 and a.runs[0] is b.runs[0]  # one list for all: encoded once
    assert a.ids == b.ids == ["m1", "m2", "m3"]
    queue = mgr.queues["q"]
    assert queue.n_delivered == 6 and queue.message_count == 0 and mgr.memory_bytes == 0
    publish(mgr, "q", "m4")  # not held: at once
    assert a.ids[-1] == b.ids[-1] == "m4"


def test_a_full_held_queue_is_handed_over_before_it_overflows(mgr: QueueManager) -> None:
    make(mgr, mode="FanOutWithoutAck", maxQueueSize=2, overflowStrategy="DropNewest")
    a = RunRecorder()
    mgr.subscribe("q", "a", a, 1)
    mgr.hold()
    outcomes = publish(mgr, "q", *[f"m{i}" for i in range(5)])
    mgr.release()
    assert outcomes == [PublishOutcome.ACCEPTED] * 5
    assert a.ids == [f"m{i}" for i in range(5)]
    assert mgr.queues["q"].n_dropped == 0


def test_priority_based_highest_first_fifo_within_level(mgr: QueueManager) -> None:
    make(mgr, deliveryMode="PriorityBased")
    for mid, prio in [
        ("l1", "Low"),
        ("n1", "normal"),
        ("c1", "CRITICAL"),
        ("h1", "High"),
        ("n2", "Normal"),
        ("c2", "Critical"),
        ("x1", "bogus"),
    ]:
        mgr.publish("q", mid, b"{}", {"priority": prio})
    r = Recorder()
    mgr.subscribe("q", "s", r, 100)
    assert r.ids == ["c1", "c2", "h1", "n1", "n2", "x1", "l1"]


def test_prefetch_limits_unacked(mgr: QueueManager) -> None:
    r = Recorder()
    sub = mgr.subscribe("q", "s", r, 2)
    publish(mgr, "q", "m1", "m2", "m3", "m4")
    assert r.ids == ["m1", "m2"]
    mgr.ack(sub, "m1")
    assert r.ids == ["m1", "m2", "m3"]
    assert mgr.queues["q"].message_count == 1


def test_unwritable_consumer_makes_messages_wait_in_queue(mgr: QueueManager) -> None:
    r = Recorder(writable=False)
    mgr.subscribe("q", "s", r, 100)
    publish(mgr, "q", "m1", "m2")
    assert r.ids == [] and mgr.queues["q"].message_count == 2
    r.writable = True
    mgr.queues["q"].dispatch()
    assert r.ids == ["m1", "m2"]


def test_disconnect_redelivers_with_attempts(mgr: QueueManager) -> None:
    a = Recorder()
    sa = mgr.subscribe("q", "a", a, 10)
    publish(mgr, "q", "m1", "m2")
    mgr.ack(sa, "m1")
    mgr.unsubscribe(sa)
    b = Recorder()
    mgr.subscribe("q", "b", b, 10)
    assert b.got == [("m2", 2, {})]


def test_ack_timeout_redelivery_then_dead_letter(mgr: QueueManager, clock: ManualClock) -> None:
    make(mgr, ackTimeout=1000, maxRetryAttempts=2, enableDeadLetterQueue=True)
    r = Recorder()
    mgr.subscribe("q", "s", r, 10)
    publish(mgr, "q", "m1")
    clock.advance(999)
    mgr.tick()
    assert r.got == [("m1", 1, {})]
    clock.advance(1)
    mgr.tick()
    assert r.got[-1] == ("m1", 2, {})
    clock.advance(1000)
    mgr.tick()
    assert len(r.got) == 2  # two attempts made: the third failure dead-letters it
    dlq = mgr.queues["q.dlq"]
    assert dlq.message_count == 1
    d = Recorder()
    mgr.subscribe("q.dlq", "d", d, 10)
    (mid, attempts, headers) = d.got[0]
    assert (mid, attempts) == ("m1", 1)
    assert headers["deadLetterReason"] == "MaxRetriesExceeded"
    assert headers["originalQueue"] == "q"
    assert headers["originalDeliveryAttempts"] == "2"


def test_ttl_expired_never_delivered(mgr: QueueManager, clock: ManualClock) -> None:
    make(mgr, "dl", messageTtl=500, enableDeadLetterQueue=True, deadLetterQueueName="graveyard")
    make(mgr, "drop", messageTtl=500)
    publish(mgr, "dl", "m1")
    publish(mgr, "drop", "m2")
    clock.advance(500)
    # expiry is checked at dispatch even before the timer has swept
    r = Recorder()
    mgr.subscribe("drop", "s", r, 10)
    assert r.ids == []
    mgr.tick()
    assert mgr.queues["dl"].message_count == 0
    g = Recorder()
    mgr.subscribe("graveyard", "g", g, 10)
    assert g.got[0][0] == "m1" and g.got[0][2]["deadLetterReason"] == "MessageExpired"
    assert mgr.queues["drop"].n_expired == 1


def test_tick_times_out_only_attached_subscriptions(mgr: QueueManager, clock: ManualClock) -> None:
    make(mgr, ackTimeout=1000)
    a, b = Recorder(), Recorder()
    sa = mgr.subscribe("q", "a", a, 1)
    sb = mgr.subscribe("q", "b", b, 1)
    publish(mgr, "q", "m1", "m2")
    assert (a.ids, b.ids) == (["m1"], ["m2"])
    mgr.detach(sb)  # (AMQP basic.cancel: its delivery waits for its ack)
    clock.advance(1000)
    mgr.tick()
    assert a.got == [("m1", 1, {}), ("m1", 2, {})]
    assert "m2" in sb.inflight and len(b.got) == 1
    assert mgr.ack(sa, "m1") and mgr.ack(sb, "m2")
    mgr.tick()


def test_tick_times_out_each_subscription_when_its_first_deadline_passes(
    mgr: QueueManager, clock: ManualClock
) -> None:
    # (tick looks at a subscription when its first deadline may have passed, not every tick)
    make(mgr, "fast", ackTimeout=1000)
    make(mgr, "slow", ackTimeout=3000)
    f, s = Recorder(), Recorder()
    sf = mgr.subscribe("fast", "f", f, 10)
    mgr.subscribe("slow", "s", s, 10)
    publish(mgr, "slow", "s1")
    publish(mgr, "fast", "f1")
    clock.advance(500)
    publish(mgr, "fast", "f2")
    clock.advance(500)
    mgr.tick()  # f1's deadline: f2 is not due yet, s1 neither
    assert f.got == [("f1", 1, {}), ("f2", 1, {}), ("f1", 2, {})]
    assert s.got == [("s1", 1, {})]
    assert mgr.ack(sf, "f1") and mgr.ack(sf, "f2")
    clock.advance(1000)
    mgr.tick()  # fast holds nothing now: nothing comes back
    assert len(f.got) == 3
    publish(mgr, "fast", "f3")  # watched again from its new delivery on
    clock.advance(1000)
    mgr.tick()
    assert f.got[-1] == ("f3", 2, {}) and s.got[-1] == ("s1", 2, {})


def test_each_delivery_keeps_its_own_ack_deadline(mgr: QueueManager, clock: ManualClock) -> None:
    # (the deadline lives on the delivered message: an ack out of order, a redelivery and a
    # fan-out copy each keep their own)
    make(mgr, "q", ackTimeout=1000)
    make(mgr, "fan", mode="FanOutWithAck", ackTimeout=1000)
    r, a, b = Recorder(), Recorder(), Recorder()
    sub = mgr.subscribe("q", "s", r, 10)
    sa = mgr.subscribe("fan", "a", a, 10)
    mgr.subscribe("fan", "b", b, 10)
    t0 = clock()
    publish(mgr, "q", "m1", "m2")
    publish(mgr, "fan", "f1")
    clock.advance(600)
    publish(mgr, "q", "m3")
    assert [m.deadline - t0 for m in sub.inflight.values()] == [1000, 1000, 1600]
    assert mgr.ack(sub, "m1")  # (the first one: the next deadline is m2's)
    assert mgr.ack(sa, "f1")  # (a's copy only: b's is still due)
    clock.advance(400)
    mgr.tick()  # m2 and b's copy come back; m3 is not due
    assert r.ids == ["m1", "m2", "m3", "m2"] and b.ids == ["f1", "f1"] and a.ids == ["f1"]
    assert [(m.id, m.deadline - t0) for m in sub.inflight.values()] == [("m3", 1600), ("m2", 2000)]
    clock.advance(600)
    mgr.tick()
    assert r.ids[-1] == "m3" and list(sub.inflight) == ["m2", "m3"]


def test_ack_held_settles_each_ack_at_its_subscription(mgr: QueueManager) -> None:
    make(mgr, "a")
    make(mgr, "b")
    r = Recorder()
    sa = mgr.subscribe("a", "sa", r, 2)
    sb = mgr.subscribe("b", "sb", r, 10)
    publish(mgr, "a", "m1", "m2", "m4")  # (m4 waits: a's prefetch is 2)
    publish(mgr, "b", "m3")
    holders = {"m1": sa, "m2": sa, "m3": sb, "m9": sb}
    touched: dict[str, Queue] = {}
    assert mgr.ack_held(holders, ["m3", "m1", "m7", "m9"], touched) == ["m7", "m9"]
    assert list(sa.inflight) == ["m2"] and not sb.inflight
    assert holders == {"m2": sa}
    # only a queue with a ready message needs a refill (b has none)
    assert touched == {"a": sa.queue}
    sa.queue.dispatch()
    assert list(sa.inflight) == ["m2", "m4"]
    assert (sa.queue.n_acked, sb.queue.n_acked) == (1, 1)


def test_tick_sweeps_a_bounded_share_of_idle_queues(mgr: QueueManager) -> None:
    # A consumer that became writable without saying so (a lost wake-up) is still served
    # by the timer's safety net: SWEEP_PER_TICK queues a tick, every queue in turn.
    n = SWEEP_PER_TICK * 2 + 10
    consumers = [Recorder(writable=False) for _ in range(n)]
    for i, r in enumerate(consumers):
        mgr.subscribe(f"q{i}", "s", r, 1)
        publish(mgr, f"q{i}", "m")
    for r in consumers:
        r.writable = True
    served = []
    for _ in range(3):
        mgr.tick()
        served.append(sum(1 for r in consumers if r.ids))
    assert served == [SWEEP_PER_TICK, 2 * SWEEP_PER_TICK, n]


def test_a_restored_message_with_its_own_ttl_expires(mgr: QueueManager, clock: ManualClock) -> None:
    make(mgr)
    queue = mgr.queues["q"]
    msg = StoredMessage("m1", "q", b"{}", {}, clock(), clock() + 100)
    mgr.restore_messages(queue, [msg])
    clock.advance(100)
    mgr.tick()
    assert queue.message_count == 0 and queue.n_expired == 1


def test_overflow_drop_oldest(mgr: QueueManager) -> None:
    make(mgr, maxQueueSize=2, overflowStrategy="DropOldest")
    assert publish(mgr, "q", "m1", "m2", "m3") == [PublishOutcome.ACCEPTED] * 3
    r = Recorder()
    mgr.subscribe("q", "s", r, 10)
    assert r.ids == ["m2", "m3"]


def test_overflow_drop_newest(mgr: QueueManager) -> None:
    make(mgr, maxQueueSize=2, overflowStrategy="DropNewest")
    outcomes = publish(mgr, "q", "m1", "m2", "m3")
    assert outcomes[-1] is PublishOutcome.REJECTED_FULL
    r = Recorder()
    mgr.subscribe("q", "s", r, 10)
    assert r.ids == ["m1", "m2"]


def test_overflow_block_publisher_and_room_waiter(mgr: QueueManager) -> None:
    make(mgr, maxQueueSize=1, overflowStrategy="BlockPublisher")
    assert publish(mgr, "q", "m1", "m2") == [PublishOutcome.ACCEPTED, PublishOutcome.BLOCKED]
    woken: list[bool] = []
    mgr.wait_for_room("q", lambda: woken.append(True))
    assert not woken
    r = Recorder()
    mgr.subscribe("q", "s", r, 10)
    assert woken == [True]
    assert publish(mgr, "q", "m2") == [PublishOutcome.ACCEPTED]


def test_overflow_redirect_to_dlq(mgr: QueueManager) -> None:
    make(mgr, maxQueueSize=1, overflowStrategy="RedirectToDlq", enableDeadLetterQueue="true")
    assert publish(mgr, "q", "m1", "m2") == [PublishOutcome.ACCEPTED] * 2
    assert mgr.queues["q.dlq"].message_count == 1
    r = Recorder()
    mgr.subscribe("q.dlq", "s", r, 10)
    assert r.got[0][0] == "m2" and r.got[0][2]["deadLetterReason"] == "QueueOverflow"


def test_redirect_without_dlq_rejects(mgr: QueueManager) -> None:
    make(mgr, maxQueueSize=1, overflowStrategy=3)
    assert publish(mgr, "q", "m1", "m2")[-1] is PublishOutcome.REJECTED_FULL


def test_delete_queue_tells_subscribers(mgr: QueueManager) -> None:
    r = Recorder()
    mgr.subscribe("q", "s", r, 10)
    mgr.delete_queue("q")
    assert r.cancelled == ["queue_deleted"]
    assert "q" not in mgr.queues
    with pytest.raises(QueueNotFound):
        mgr.delete_queue("q")


def test_create_queue_idempotent_or_exists(mgr: QueueManager) -> None:
    _, created = mgr.create_queue("q", mgr.options_from({"maxQueueSize": 5}))
    assert created
    _, created = mgr.create_queue("q", mgr.options_from({"maxQueueSize": "5"}))
    assert not created
    with pytest.raises(QueueExists):
        mgr.create_queue("q", mgr.options_from({"maxQueueSize": 6}))


@pytest.mark.parametrize(
    "options",
    [
        {"mode": "Sideways"},
        {"mode": 9},
        {"maxQueueSize": 0},
        {"maxQueueSize": "ten"},
        {"messageTtl": -1},
        {"enableDeadLetterQueue": "maybe"},
        {"overflowStrategy": "Explode"},
        {"maxRetryAttempts": True},
    ],
)
def test_invalid_options(mgr: QueueManager, options: dict[str, object]) -> None:
    with pytest.raises(InvalidQueueOptions):
        mgr.options_from(options)


def test_options_by_name_and_number(mgr: QueueManager) -> None:
    o = mgr.options_from({"mode": "fanoutwithack", "overflowStrategy": "2"})
    assert o.delivery_mode is DeliveryMode.FAN_OUT_WITH_ACK
    assert o.overflow_strategy is OverflowStrategy.BLOCK_PUBLISHER


def test_auto_create_off(clock: ManualClock) -> None:
    mgr = QueueManager(QueueDefaults(), clock, auto_create=False)
    with pytest.raises(QueueNotFound):
        mgr.publish("nope", "m", b"{}", {})
    with pytest.raises(QueueNotFound):
        mgr.subscribe("nope", "s", Recorder(), 1)


def test_memory_watermark_blocks_and_releases(clock: ManualClock) -> None:
    mgr = QueueManager(QueueDefaults(max_queue_size=100_000), clock, memory_high_watermark=1000)
    for i in range(11):
        mgr.publish("q", f"m{i}", b"x" * 100, {})
    assert mgr.memory_blocked
    woken: list[bool] = []
    mgr.wait_for_memory(lambda: woken.append(True))
    r = Recorder()
    sub = mgr.subscribe("q", "s", r, 100)
    mgr.tick()
    assert woken == [True] and not mgr.memory_blocked
    for mid in r.ids:
        mgr.ack(sub, mid)
    assert mgr.memory_bytes == 0


def test_duplicate_id_waits_for_first_ack(mgr: QueueManager) -> None:
    r = Recorder()
    sub = mgr.subscribe("q", "s", r, 10)
    publish(mgr, "q", "same", "same")
    assert r.ids == ["same"]
    mgr.ack(sub, "same")
    assert r.ids == ["same", "same"]
    mgr.ack(sub, "same")
    assert mgr.queues["q"].n_acked == 2


def test_queue_info_live_figures(mgr: QueueManager) -> None:
    make(mgr, maxQueueSize=42)
    publish(mgr, "q", "m1", "m2")
    r = Recorder()
    mgr.subscribe("q", "s", r, 1)
    info = mgr.queue_info("q")
    assert info["name"] == "q"
    assert info["messageCount"] == 1
    assert info["subscriberCount"] == 1
    assert info["deliveryMode"] == "RoundRobin"
    assert info["maxSize"] == 42
    assert info["createdAt"].endswith("Z")
    assert info["unackedCount"] == 1


def test_ack_many_settles_in_order_and_returns_unknown_ids(mgr: QueueManager) -> None:
    make(mgr, mode="FanOutWithAck")
    a, b = Recorder(), Recorder()
    sa = mgr.subscribe("q", "a", a, 10)
    sb = mgr.subscribe("q", "b", b, 10)
    publish(mgr, "q", "m1", "m2", "m3")
    assert mgr.ack_many(sa, ["m1", "x", "m3", "m1"]) == ["x", "m1"]
    assert list(sa.inflight) == ["m2"]
    assert mgr.queues["q"].n_acked == 2
    assert a.ids == ["m1", "m2", "m3"]  # no refill: the caller dispatches
    assert mgr.ack_many(sb, ["m1", "m2", "m3"]) == []
    assert mgr.queues["q"].unacked_count == 1
