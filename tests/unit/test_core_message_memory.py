"""What a queued message owns: the pieces publishers share, the fan-out fields only where a
fan-out queue needs them (issue 15: a million queued messages in at most 400 MiB)."""

from __future__ import annotations

import sys

from vibemq_server.buildinfo import compiled_modules
from vibemq_server.core import ManualClock, QueueManager, StoredMessage, Subscription
from vibemq_server.core.message import ANY_SUBSCRIBER, EMPTY_HEADERS, FanOutMessage
from vibemq_server.core.queue import Consumer

#: the compiled build (mypyc) stores a message's ints unboxed, in the object itself: there is
#: no int object to share, and the object is a little bigger for holding them
COMPILED = "vibemq_server.core.message" in compiled_modules()


class Taker(Consumer):
    """A consumer that records what it is given (the core's port, not the broker)."""

    writable = True

    def __init__(self) -> None:
        self.got: list[StoredMessage] = []

    def deliver(self, sub: Subscription, msg: StoredMessage) -> None:
        self.got.append(msg)

    def subscription_cancelled(self, sub: Subscription, reason: str) -> None:
        pass


def queued(mgr: QueueManager, name: str) -> list[StoredMessage]:
    return list(mgr.queues[name].ready())


def test_publishers_share_the_name_the_empty_headers_and_the_clock_reading(
    mgr: QueueManager, clock: ManualClock
) -> None:
    mgr.create_queue("q", mgr.options_from({"durable": False}))
    name = "".join(["q"])  # an equal string, not the queue's own object (as a decoder makes)
    for i in range(3):
        mgr.publish(name, f"m{i}", b"{}", {})
    clock.advance(1)
    mgr.publish(name, "m3", b"{}", {"k": "v"})
    a, b, c, d = queued(mgr, "q")
    assert all(m.queue is mgr.queues["q"].name for m in (a, b, c, d))
    assert a.headers is b.headers is EMPTY_HEADERS and d.headers == {"k": "v"}
    assert a.published_at == b.published_at == c.published_at
    if not COMPILED:
        assert a.published_at is b.published_at is c.published_at  # one int object
    assert d.published_at == a.published_at + 1
    assert a.seq == 0  # a transient message has no journal identity


def test_a_plain_message_has_no_fan_out_slots() -> None:
    msg = StoredMessage("m", "q", b"{}", EMPTY_HEADERS, 1)
    assert msg.group is None and msg.target is None and not msg.single
    assert not hasattr(msg, "__dict__")
    if COMPILED:
        # a native class: eleven fields, the ints among them unboxed (no int objects besides)
        assert sys.getsizeof(msg) <= 144
    elif sys.implementation.name == "cpython":
        # eleven slots (the ack deadline among them) and the GC header: one 128-byte block
        # (a 13-slot message took 144)
        assert sys.getsizeof(msg) <= 128
        assert sys.getsizeof(msg) < sys.getsizeof(msg.copy())


def test_fan_out_queues_hold_fan_out_messages_from_every_entry(mgr: QueueManager) -> None:
    mgr.create_queue("fan", mgr.options_from({"mode": "FanOutWithAck", "durable": False}))
    mgr.publish("fan", "p", b"{}", {})
    # a dead letter into a fan-out queue named as the dead-letter queue
    mgr.create_queue(
        "src", mgr.options_from({"enableDeadLetterQueue": True, "deadLetterQueueName": "fan"})
    )
    sub = mgr.subscribe("src", "s", Taker(), 1)
    mgr.publish("src", "d2", b"{}", {})
    assert mgr.nack(sub, "d2", requeue=False)
    # recovered messages (plain ones, as the journal rebuilds them)
    mgr.restore_messages(mgr.queues["fan"], [StoredMessage("r", "fan", b"{}", {}, 1)])
    held = queued(mgr, "fan")
    assert [m.id for m in held] == ["p", "d2", "r"]
    assert all(type(m) is FanOutMessage for m in held)


def test_a_timed_out_fan_out_copy_goes_back_to_its_subscriber_only(
    mgr: QueueManager, clock: ManualClock
) -> None:
    mgr.create_queue("fan", mgr.options_from({"mode": "FanOutWithAck", "ackTimeout": 100}))
    a, b = Taker(), Taker()
    sa = mgr.subscribe("fan", "a", a, 10)
    mgr.subscribe("fan", "b", b, 10)
    mgr.publish("fan", "m", b"{}", {})
    assert mgr.ack(sa, "m")
    clock.advance(100)
    mgr.tick()  # b's copy timed out: back to b, not to everyone again
    assert [m.id for m in a.got] == ["m"]
    assert [m.id for m in b.got] == ["m", "m"] and b.got[1].single
    assert b.got[1].target is not None and b.got[1].target is not ANY_SUBSCRIBER


def test_a_copy_whose_subscriber_left_goes_to_any_one(mgr: QueueManager) -> None:
    mgr.create_queue("fan", mgr.options_from({"mode": "FanOutWithAck"}))
    a, b = Taker(), Taker()
    mgr.subscribe("fan", "a", a, 10)
    sb = mgr.subscribe("fan", "b", b, 10)
    mgr.publish("fan", "m", b"{}", {})
    mgr.unsubscribe(sb)  # b's unacked copy goes back, its subscriber gone
    assert [m.id for m in a.got] == ["m"]  # a still holds its own copy: it waits
    held = queued(mgr, "fan")
    assert [m.id for m in held] == ["m"] and held[0].target is ANY_SUBSCRIBER
