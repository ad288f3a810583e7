"""Cross-protocol routing in the core (vibemq_server/core/routing.py, ``QueueManager.route``):
a publish at an address, from any protocol or from a native Publish, reaches every registered
sink exactly once, the queue of that name when the rules say so, and reports whether a copy
was journaled. Sinks here are small recorders standing in for the adapters' subscriptions;
durability goes through a real Journal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from vibemq_server.config import QueueDefaults
from vibemq_server.core import (
    ManualClock,
    PublishOutcome,
    QueueManager,
    StoredMessage,
    Subscription,
)
from vibemq_server.core.queue import Consumer as CoreConsumer
from vibemq_server.core.routing import AddressSink, MessageSource, ready
from vibemq_server.journal.journal import Journal
from vibemq_server.protocol.names import valid_queue_name

pytestmark = pytest.mark.timeout(60)


class Sink(AddressSink):
    """A protocol's subscriptions to addresses: records what the core hands it. ``durable``:
    what it reports (a copy journaled); ``take``: whether it asks for the message."""

    def __init__(self, name: str, *, durable: bool = False, take: bool = True) -> None:
        self.name = name
        self.durable = durable
        self.take = take
        self.got: list[tuple[str, str | None, AddressSink | None]] = []

    def deliver(self, address: str, message: MessageSource, origin: AddressSink | None) -> bool:
        msg_id = message().id if self.take else None
        self.got.append((address, msg_id, origin))
        return self.durable

    def __repr__(self) -> str:
        return f"Sink({self.name})"


class Consumer(CoreConsumer):
    writable = True  # (shadows Consumer's read-only property: instances may set it)

    def __init__(self) -> None:
        self.writable = True
        self.got: list[str] = []

    def deliver(self, sub: Subscription, msg: StoredMessage) -> None:
        self.got.append(msg.id)

    def subscription_cancelled(self, sub: Subscription, reason: str) -> None:
        pass


class Source:
    """A lazily built message, counting how often it was built."""

    def __init__(self, address: str, msg_id: str = "m1") -> None:
        self.address = address
        self.msg_id = msg_id
        self.built = 0
        self.msg: StoredMessage | None = None

    def __call__(self) -> StoredMessage:
        if self.msg is None:
            self.built += 1
            self.msg = StoredMessage(self.msg_id, self.address, b'"x"', {"h": "v"}, 0)
        return self.msg


def bounded(mgr: QueueManager, name: str, overflow: str) -> None:
    """A queue of one message that refuses the next (``DropNewest``, ``BlockPublisher``)."""
    mgr.create_queue(name, mgr.options_from({"maxQueueSize": 1, "overflowStrategy": overflow}))


@pytest.fixture
def mgr() -> QueueManager:
    return QueueManager(QueueDefaults(), ManualClock(), name_validator=valid_queue_name)


def sinks(mgr: QueueManager, *names: str, durable: bool = False) -> list[Sink]:
    out = [Sink(n, durable=durable) for n in names]
    for sink in out:
        mgr.register_sink(sink)
    return out


def test_a_publish_from_each_origin_reaches_each_sink_once(mgr: QueueManager) -> None:
    mqtt, amqp, zmq = sinks(mgr, "mqtt", "amqp", "zmq")
    origins: list[AddressSink | None] = [None, mqtt, amqp, zmq]
    for n, origin in enumerate(origins):
        for sink in (mqtt, amqp, zmq):
            sink.got.clear()
        mgr.route(f"a.{n}", Source(f"a.{n}", f"m{n}"), origin)
        for sink in (mqtt, amqp, zmq):
            # Once each, the publisher's own sink included, told whose publish it is.
            assert sink.got == [(f"a.{n}", f"m{n}", origin)], (sink, origin)


def test_a_native_publish_reaches_each_sink_once_as_origin_none(mgr: QueueManager) -> None:
    mqtt, amqp = sinks(mgr, "mqtt", "amqp")
    consumer = Consumer()
    mgr.subscribe("orders", "s", consumer, 10)
    assert mgr.publish("orders", "n1", b"{}", {}) is PublishOutcome.ACCEPTED
    assert consumer.got == ["n1"]
    assert mqtt.got == amqp.got == [("orders", "n1", None)]


def test_sinks_are_served_in_registration_order_and_registered_once(mgr: QueueManager) -> None:
    order: list[str] = []

    class Named(AddressSink):
        def __init__(self, name: str) -> None:
            self.name = name

        def deliver(self, address: str, message: MessageSource, origin: object) -> bool:
            order.append(self.name)
            return False

    first, second = Named("first"), Named("second")
    mgr.register_sink(first)
    mgr.register_sink(second)
    mgr.register_sink(first)  # again: changes nothing
    mgr.route("x", Source("x"))
    assert order == ["first", "second"]
    mgr.unregister_sink(first)
    order.clear()
    mgr.route("x", Source("x"))
    assert order == ["second"]


def test_a_sink_unregistering_during_a_delivery_does_not_skip_another(
    mgr: QueueManager,
) -> None:
    got: list[str] = []

    class Leaving(AddressSink):
        def deliver(self, address: str, message: MessageSource, origin: object) -> bool:
            got.append("leaving")
            mgr.unregister_sink(self)
            return False

    class Staying(AddressSink):
        def deliver(self, address: str, message: MessageSource, origin: object) -> bool:
            got.append("staying")
            return False

    mgr.register_sink(Leaving())
    mgr.register_sink(Staying())
    mgr.route("a", Source("a"))
    mgr.route("a", Source("a"))
    assert got == ["leaving", "staying", "staying"]


def test_route_fills_the_existing_queue_of_that_name_only(mgr: QueueManager) -> None:
    (sink,) = sinks(mgr, "sink")
    consumer = Consumer()
    mgr.subscribe("orders", "s", consumer, 10)
    mgr.route("orders", Source("orders", "m1"), sink)
    assert consumer.got == ["m1"]
    assert sink.got == [("orders", "m1", sink)]
    # No queue of that name: none is created (an address nobody reads piles nothing up).
    mgr.route("nobody.reads", Source("nobody.reads", "m2"), sink)
    assert "nobody.reads" not in mgr.queues
    # into_queue=False: the publisher filled its queues itself (AMQP's exchanges).
    mgr.route("orders", Source("orders", "m3"), sink, into_queue=False)
    assert consumer.got == ["m1"]
    assert [g[1] for g in sink.got] == ["m1", "m2", "m3"]


def test_route_never_fills_a_queue_clients_cannot_name(mgr: QueueManager) -> None:
    """Adapters keep their state in "$" queues (an MQTT session's, the durable tables):
    a publish at such an address must not land in them."""
    mgr.create_queue("$mqtt.s.victim")
    (sink,) = sinks(mgr, "sink")
    mgr.route("$mqtt.s.victim", Source("$mqtt.s.victim"), sink)
    assert mgr.queues["$mqtt.s.victim"].message_count == 0
    assert sink.got == [("$mqtt.s.victim", "m1", sink)]  # subscribers still hear it


def test_a_refusing_queue_does_not_keep_the_message_from_the_sinks(mgr: QueueManager) -> None:
    bounded(mgr, "full", "DropNewest")
    (sink,) = sinks(mgr, "sink")
    mgr.route("full", Source("full", "m1"))
    mgr.route("full", Source("full", "m2"))  # DropNewest: the queue refuses this one
    assert [m.id for m in mgr.queues["full"].ready()] == ["m1"]
    assert [g[1] for g in sink.got] == ["m1", "m2"]


def test_a_refused_native_publish_reaches_no_sink(mgr: QueueManager) -> None:
    """The native publisher is told (QueueFull) or retries (BlockPublisher): it is routed
    when it is taken, never twice."""
    bounded(mgr, "full", "DropNewest")
    bounded(mgr, "blocked", "BlockPublisher")
    (sink,) = sinks(mgr, "sink")
    for name in ("full", "blocked"):
        assert mgr.publish(name, "m1", b"{}", {}).accepted
        assert not mgr.publish(name, "m2", b"{}", {}).accepted
    assert sink.got == [("full", "m1", None), ("blocked", "m1", None)]
    assert mgr.publish("q", "m3", b"{}", {}, route=False).accepted  # into one queue only
    assert len(sink.got) == 2


def test_the_message_is_built_only_when_something_takes_it(mgr: QueueManager) -> None:
    idle = Sink("idle", take=False)
    mgr.register_sink(idle)
    source = Source("no.queue")
    mgr.route("no.queue", source, idle)
    assert source.built == 0 and idle.got == [("no.queue", None, idle)]
    mgr.create_queue("has.queue")
    source = Source("has.queue")
    mgr.route("has.queue", source, idle)
    assert source.built == 1  # for the queue


def test_ready_gives_the_message_itself() -> None:
    msg = StoredMessage("m", "q", b"{}", {}, 0)
    assert ready(msg)() is msg


def test_without_persistence_nothing_is_reported_durable(mgr: QueueManager) -> None:
    sinks(mgr, "journaling", durable=True)
    assert mgr.route("a", Source("a")) is False
    assert mgr.publish("q", "m", b"{}", {}) is PublishOutcome.ACCEPTED


# -- durability, with a real journal ------------------------------------------------------------


@pytest.fixture
async def journaled(tmp_path: Path) -> AsyncIterator[QueueManager]:
    clock = ManualClock()
    mgr = QueueManager(QueueDefaults(), clock, name_validator=valid_queue_name)
    journal = Journal(tmp_path / "journal", clock=clock)
    journal.recover(mgr)
    journal.start(mgr)
    mgr.persistence = journal
    yield mgr
    await journal.close()


async def test_a_sinks_durability_is_reported(journaled: QueueManager) -> None:
    mgr = journaled
    mgr.create_queue("transient", mgr.options_from({"durable": False}))
    plain, journaling = Sink("plain"), Sink("journaling", durable=True)
    mgr.register_sink(plain)
    assert mgr.route("a", Source("a"), plain) is False
    # A native publish into a transient queue waits for the journal when a sink journaled.
    assert mgr.publish("transient", "n1", b"{}", {}) is PublishOutcome.ACCEPTED
    mgr.register_sink(journaling)
    assert mgr.route("a", Source("a"), plain) is True
    assert mgr.route("a", Source("a"), journaling) is True
    assert mgr.publish("transient", "n2", b"{}", {}) is PublishOutcome.ACCEPTED_DURABLE
    assert mgr.publish("transient", "n3", b"{}", {}, route=False) is PublishOutcome.ACCEPTED


async def test_a_durable_queue_copy_is_reported(journaled: QueueManager) -> None:
    mgr = journaled
    mgr.create_queue("durable.q", mgr.options_from({"durable": True}))
    mgr.create_queue("transient.q", mgr.options_from({"durable": False}))
    (plain,) = sinks(mgr, "plain")
    assert mgr.route("durable.q", Source("durable.q"), plain) is True
    assert mgr.route("transient.q", Source("transient.q"), plain) is False
    assert mgr.route("durable.q", Source("durable.q"), plain, into_queue=False) is False
