"""Definitions export and import (vibemq_server/management/definitions.py) between real
brokers: queues made by the native client and by pika, AMQP exchanges and bindings, users made
by ``vibemq-server users``. Exported from one broker, imported into a fresh one, exported
again: the same document; imported again: nothing to do; a different one: conflicts reported,
nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest
from amqputil import HOST, WAIT, AmqpBroker, PikaClients
from userskit import add_user, users

from vibemq_server.auth import UserStore
from vibemq_server.client import Client
from vibemq_server.management.definitions import export_definitions, import_definitions

Brokers = Callable[..., AmqpBroker]


@pytest.fixture
def pikas_of() -> Iterator[Callable[[AmqpBroker], PikaClients]]:
    made: list[PikaClients] = []

    def make(broker: AmqpBroker) -> PikaClients:
        clients = PikaClients(broker.amqp_port, heartbeat=0)
        made.append(clients)
        return clients

    yield make
    for clients in made:
        clients.close_all()


async def _populate(source: AmqpBroker, pikas: PikaClients) -> None:
    client = await Client.connect(HOST, source.port, reconnect=False, request_timeout=WAIT)
    try:
        await client.create_queue(
            "orders",
            "PriorityBased",
            max_queue_size=500,
            message_ttl_ms=60_000,
            enable_dead_letter_queue=True,
            overflow_strategy="DropNewest",
            max_retry_attempts=3,
            ack_timeout_ms=5_000,
        )
        await client.publish("orders", {"id": 1})  # messages are not definitions
    finally:
        await client.close()
    ch = pikas.channel()
    ch.exchange_declare("events", "topic", durable=True)
    ch.exchange_declare("hdrs", "headers", durable=True, arguments={"alternate-exchange": "events"})
    ch.exchange_declare("scratch", "fanout", durable=False, auto_delete=True)
    ch.queue_declare(
        "audit",
        durable=True,
        arguments={
            "x-max-length": 100,
            "x-message-ttl": 30_000,
            "x-dead-letter-exchange": "events",
        },
    )
    ch.queue_declare("transient", durable=False, auto_delete=True)
    ch.queue_bind("audit", "events", "order.*")
    ch.queue_bind("audit", "hdrs", "", arguments={"x-match": "all", "kind": "audit"})
    ch.exchange_bind("hdrs", "events", "#")
    ch.exchange_bind("scratch", "events", "order.created")
    # an exclusive queue is its connection's own: neither it nor its binding is exported
    private = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(private, "events", "#")


async def test_export_import_export_round_trip(
    tmp_path: Path, brokers: Brokers, pikas_of: Callable[[AmqpBroker], PikaClients]
) -> None:
    source_users = tmp_path / "data0" / "users.json"
    add_user(source_users, "alice", "alice-pw", "--tag", "administrator")
    add_user(source_users, "bob", "bob-pw")
    done = users(source_users, "permit", "bob", "--configure", "^bob\\.", "--read", "^(bob|orders)")
    assert done.returncode == 0, done.stderr
    source = brokers(allow_anonymous=True)
    await _populate(source, pikas_of(source))

    doc = source.call(export_definitions)
    assert [u.name for u in doc.users] == ["alice", "bob"]
    assert doc.users[0].tags == ["administrator"]
    assert doc.users[0].password_hash.startswith("$scrypt$")
    assert "alice-pw" not in doc.model_dump_json()
    bob = next(p for p in doc.permissions if p.user == "bob")
    assert (bob.configure, bob.write, bob.read) == ("^bob\\.", ".*", "^(bob|orders)")
    assert [q.name for q in doc.queues] == ["audit", "orders", "transient"]
    orders = doc.queues[1]
    assert orders.arguments is None
    assert orders.options.max_queue_size == 500
    assert orders.options.overflow_strategy == "DropNewest"
    audit = doc.queues[0]
    assert audit.arguments == {
        "x-dead-letter-exchange": "events",
        "x-max-length": 100,
        "x-message-ttl": 30_000,
    }
    assert doc.queues[2].auto_delete and not doc.queues[2].durable
    assert [x.name for x in doc.exchanges] == ["events", "hdrs", "scratch"]
    assert doc.exchanges[1].arguments == {"alternate-exchange": "events"}
    assert len(doc.bindings) == 4

    target = brokers(allow_anonymous=True)
    report = target.call(lambda b: import_definitions(b, doc.model_dump_json()))
    assert report.conflicts == []
    assert sorted(report.created["queues"]) == ["audit", "orders", "transient"]
    assert sorted(report.created["users"]) == ["alice", "bob"]
    assert len(report.created["bindings"]) == 4

    again = target.call(export_definitions)
    assert again == doc

    # the users file was written (by the users file's own writer) and is in force
    stored = UserStore(tmp_path / "data1" / "users.json").load()
    assert stored["bob"].password_hash == doc.users[1].password_hash
    assert stored["bob"].permissions["read"] == "^(bob|orders)"
    login = pika.BlockingConnection(
        pika.ConnectionParameters(
            HOST,
            target.amqp_port,
            credentials=pika.PlainCredentials("alice", "alice-pw"),
            connection_attempts=1,
            socket_timeout=WAIT,
            stack_timeout=WAIT,
        )
    )
    login.close()

    # imported twice: nothing to do
    second = target.call(lambda b: import_definitions(b, doc))
    assert second.conflicts == []
    assert all(not names for names in second.created.values())
    assert sorted(second.unchanged["queues"]) == ["audit", "orders", "transient"]
    assert len(second.unchanged["bindings"]) == 4


async def test_conflicts_are_reported_and_nothing_changes(
    tmp_path: Path, brokers: Brokers, pikas_of: Callable[[AmqpBroker], PikaClients]
) -> None:
    add_user(tmp_path / "data0" / "users.json", "alice", "alice-pw", "--tag", "administrator")
    source = brokers(allow_anonymous=True)
    await _populate(source, pikas_of(source))
    doc = source.call(export_definitions)
    target = brokers(allow_anonymous=True)
    assert target.call(lambda b: import_definitions(b, doc)).conflicts == []

    changed = doc.model_dump(mode="json")
    changed["queues"][1]["options"]["max_queue_size"] = 999  # orders
    changed["queues"][0]["arguments"]["x-max-length"] = 5  # audit
    changed["exchanges"][0]["type"] = "direct"  # events
    changed["users"][0]["tags"] = []
    changed["queues"].append({"name": "fresh", "options": {"message_ttl_ms": 10}})
    changed["bindings"].append(
        {"source": "events", "destination": "missing", "destination_type": "queue"}
    )
    report = target.call(lambda b: import_definitions(b, changed))
    found = {(c.kind, c.name): c.reason for c in report.conflicts}
    assert found[("queue", "orders")] == "exists with other max_queue_size"
    assert found[("queue", "audit")] == "exists with other arguments"
    assert found[("exchange", "events")] == "exists with other type"
    assert found[("user", "alice")] == "exists with other tags"
    assert found[("binding", "events -> queue missing ('')")] == "no queue 'missing'"
    assert len(found) == 5
    assert report.created["queues"] == ["fresh"]

    # what exists stayed as it was
    after = target.call(export_definitions)
    assert {q.name: q for q in after.queues}["orders"].options.max_queue_size == 500
    assert {x.name: x for x in after.exchanges}["events"].type == "topic"
    assert after.users == doc.users
    fresh = {q.name: q for q in after.queues}["fresh"]
    assert fresh.options.message_ttl_ms == 10
    # options the document leaves out are the broker's defaults
    default_size = target.call(lambda b: b.config.queue_defaults.max_queue_size)
    assert fresh.options.max_queue_size == default_size


async def test_imported_definitions_survive_a_restart(
    tmp_path: Path, brokers: Brokers, pikas_of: Callable[[AmqpBroker], PikaClients]
) -> None:
    source = brokers(allow_anonymous=True)
    await _populate(source, pikas_of(source))
    doc = source.call(export_definitions)
    # the target broker is stopped by the test (brokers() would stop it a second time)
    data = tmp_path / "target"
    target = AmqpBroker(data, allow_anonymous=True, amqp={"port": 0}).start()
    try:
        assert target.call(lambda b: import_definitions(b, doc)).conflicts == []
    finally:
        target.stop()
    again = AmqpBroker(data, allow_anonymous=True, amqp={"port": 0}).start()
    try:
        after = again.call(export_definitions)
    finally:
        again.stop()
    # what is durable was journaled by the import: back after the restart, as it was
    durable_queues = [q for q in doc.queues if q.durable]
    durable_exchanges = [x for x in doc.exchanges if x.durable]
    kept = {q.name for q in durable_queues} | {x.name for x in durable_exchanges} | {"amq.topic"}
    assert after.queues == durable_queues
    assert after.exchanges == durable_exchanges
    assert after.bindings == [b for b in doc.bindings if b.source in kept and b.destination in kept]
    assert [q.name for q in after.queues] == ["audit", "orders"]
