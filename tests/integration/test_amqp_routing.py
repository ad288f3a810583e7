"""AMQP 0-9-1 routing against a real broker: the default and ``amq.*`` exchanges, declared
direct / fanout / topic / headers exchanges, exchange flags (passive, durable, auto-delete,
internal), exchange.delete if-unused, exchange-to-exchange bindings, queue declare
(server-named, passive, durable, exclusive, auto-delete), bind / unbind / purge / delete with
their counts, mandatory publishes and basic.return; the address space shared with MQTT and the
VibeMQ protocol; and durable exchanges, bindings, queues and persistent messages across a real
broker restart.

Clients are real: pika's ``BlockingConnection``, aio-pika, paho-mqtt and the VibeMQ client
library, against a broker on its own thread (:class:`amqputil.AmqpBroker`) or, for the
restart, a ``vibemq-server`` process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Callable
from typing import Any

import aio_pika
import pika
import pika.adapters.blocking_connection as blocking
import pika.exceptions
import pytest
from amqputil import (
    WAIT,
    AmqpBroker,
    PikaClients,
    assert_empty,
    consume,
    get_all,
    get_async,
    get_message,
    pika_params,
    pump_until,
    queue_counts,
)
from mqttutil import Paho
from serverproc import ServerProcess
from waits import wait_until

from vibemq_server.client import Client
from vibemq_server.journal.records import Publish, iter_records
from vibemq_server.journal.recovery import list_segments

pytestmark = pytest.mark.timeout(60)


def routed(
    channel: blocking.BlockingChannel,
    exchange: str,
    queues: list[str],
    publishes: list[tuple[str, dict[str, Any] | None]],
) -> dict[str, set[str]]:
    """Publish ``(routing key, headers)`` s to ``exchange`` (each body names its publish) and
    return, per queue, the publishes that reached it."""
    for n, (key, headers) in enumerate(publishes):
        props = pika.BasicProperties(headers=headers) if headers is not None else None
        channel.basic_publish(exchange, key, f"{n}".encode(), props)
    labels = [f"{key}|{json.dumps(headers, sort_keys=True)}" for key, headers in publishes]
    return {q: {labels[int(body)] for body in get_all(channel, q)} for q in queues}


def declare_queues(channel: blocking.BlockingChannel, *names: str) -> None:
    for name in names:
        channel.queue_declare(name)


def channel_error(
    conn: pika.BlockingConnection, action: Callable[[blocking.BlockingChannel], Any]
) -> int:
    """Run ``action`` on a new channel, which the broker must close; the reply code."""
    channel = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        action(channel)
        channel.basic_qos()
    return info.value.reply_code


# --------------------------------------------------------------------------------------------
# The default exchange


def test_default_exchange_routes_by_queue_name(ch: blocking.BlockingChannel) -> None:
    declare_queues(ch, "dq1", "dq2")
    ch.basic_publish("", "dq1", b"one")
    ch.basic_publish("", "dq2", b"two")
    ch.basic_publish("", "nobody", b"lost")
    method, _props, body = get_message(ch, "dq1")
    assert (method.exchange, method.routing_key, body) == ("", "dq1", b"one")
    assert get_all(ch, "dq2") == [b"two"]
    assert get_all(ch, "dq1") == []


def test_default_exchange_cannot_be_declared_bound_or_deleted(
    conn: pika.BlockingConnection,
) -> None:
    conn.channel().queue_declare("dq")
    assert channel_error(conn, lambda c: c.exchange_declare("", "direct")) == 403
    assert channel_error(conn, lambda c: c.queue_bind("dq", "", "dq")) == 403
    assert channel_error(conn, lambda c: c.exchange_delete("")) == 403


# --------------------------------------------------------------------------------------------
# Exchange types: predeclared amq.* and declared ones


DIRECT_BINDINGS = [("q1", "a", None), ("q2", "b", None), ("q3", "a", None), ("q3", "c", None)]
DIRECT_PUBLISHES: list[tuple[str, dict[str, Any] | None]] = [
    ("a", None),
    ("b", None),
    ("c", None),
    ("d", None),
    ("", None),
]
DIRECT_EXPECTED = {"q1": {"a"}, "q2": {"b"}, "q3": {"a", "c"}}

FANOUT_BINDINGS = [("q1", "", None), ("q2", "ignored", None)]
FANOUT_PUBLISHES: list[tuple[str, dict[str, Any] | None]] = [("x", None), ("", None)]
FANOUT_EXPECTED = {"q1": {"x", ""}, "q2": {"x", ""}}

TOPIC_BINDINGS = [
    ("q1", "a.*", None),
    ("q2", "a.#", None),
    ("q3", "#", None),
    ("q4", "*.b.*", None),
    ("q5", "a.b.c", None),
    ("q6", "#.c", None),
    ("q7", "a.#.c", None),
    ("q8", "*", None),
]
TOPIC_PUBLISHES: list[tuple[str, dict[str, Any] | None]] = [
    ("a", None),
    ("a.b", None),
    ("a.b.c", None),
    ("x.b.y", None),
    ("a.x.y.c", None),
    ("c", None),
    ("", None),
    ("b.a", None),
]
TOPIC_EXPECTED = {
    "q1": {"a.b"},
    "q2": {"a", "a.b", "a.b.c", "a.x.y.c"},
    "q3": {"a", "a.b", "a.b.c", "x.b.y", "a.x.y.c", "c", "", "b.a"},
    "q4": {"a.b.c", "x.b.y"},
    "q5": {"a.b.c"},
    "q6": {"a.b.c", "a.x.y.c", "c"},
    "q7": {"a.b.c", "a.x.y.c"},
    "q8": {"a", "c"},
}

_DOC = {"format": "pdf", "type": "report"}
HEADERS_BINDINGS = [
    ("q1", "", {"x-match": "all", **_DOC}),
    ("q2", "", {"x-match": "any", **_DOC}),
    ("q3", "", {"format": "pdf"}),  # x-match defaults to all
    ("q4", "", {"x-match": "all"}),  # no headers to match: everything
]
HEADERS_PUBLISHES: list[tuple[str, dict[str, Any] | None]] = [
    ("k", {"format": "pdf", "type": "report"}),
    ("k", {"format": "pdf", "type": "report", "extra": 1}),
    ("k", {"format": "pdf"}),
    ("k", {"type": "report"}),
    ("k", {"format": "zip"}),
    ("k", None),
]


def _h(headers: dict[str, Any] | None) -> str:
    return f"k|{json.dumps(headers, sort_keys=True)}"


HEADERS_EXPECTED = {
    "q1": {_h(HEADERS_PUBLISHES[0][1]), _h(HEADERS_PUBLISHES[1][1])},
    "q2": {_h(HEADERS_PUBLISHES[i][1]) for i in range(4)},
    "q3": {_h(HEADERS_PUBLISHES[i][1]) for i in range(3)},
    "q4": {_h(headers) for _key, headers in HEADERS_PUBLISHES},
}

TYPES = {
    "direct": (DIRECT_BINDINGS, DIRECT_PUBLISHES, DIRECT_EXPECTED),
    "fanout": (FANOUT_BINDINGS, FANOUT_PUBLISHES, FANOUT_EXPECTED),
    "topic": (TOPIC_BINDINGS, TOPIC_PUBLISHES, TOPIC_EXPECTED),
    "headers": (HEADERS_BINDINGS, HEADERS_PUBLISHES, HEADERS_EXPECTED),
}


@pytest.mark.parametrize(
    ("exchange", "kind"),
    [
        ("amq.direct", "direct"),
        ("amq.fanout", "fanout"),
        ("amq.topic", "topic"),
        ("amq.headers", "headers"),
        ("amq.match", "headers"),
        ("my.direct", "direct"),
        ("my.fanout", "fanout"),
        ("my.topic", "topic"),
        ("my.headers", "headers"),
    ],
)
def test_exchange_routing(ch: blocking.BlockingChannel, exchange: str, kind: str) -> None:
    bindings, publishes, expected = TYPES[kind]
    if not exchange.startswith("amq."):
        ch.exchange_declare(exchange, kind)
    else:
        ch.exchange_declare(exchange, kind, passive=True)
    queues = sorted(expected)
    declare_queues(ch, *queues)
    for queue, key, args in bindings:
        ch.queue_bind(queue, exchange, key, arguments=args)
    got = routed(ch, exchange, queues, publishes)
    if kind != "headers":
        got = {q: {label.split("|")[0] for label in labels} for q, labels in got.items()}
    assert got == expected


def test_binding_is_idempotent_and_unbind_stops_routing(ch: blocking.BlockingChannel) -> None:
    ch.queue_declare("ub")
    ch.queue_bind("ub", "amq.direct", "k")
    ch.queue_bind("ub", "amq.direct", "k")  # the same binding twice is one binding
    ch.basic_publish("amq.direct", "k", b"once")
    assert get_all(ch, "ub") == [b"once"]
    ch.queue_unbind("ub", "amq.direct", "k")
    ch.queue_unbind("ub", "amq.direct", "k")  # a missing binding is fine, as in RabbitMQ
    ch.basic_publish("amq.direct", "k", b"gone")
    assert get_all(ch, "ub") == []


def test_headers_binding_arguments_are_part_of_the_binding(ch: blocking.BlockingChannel) -> None:
    ch.queue_declare("hb")
    ch.queue_bind("hb", "amq.headers", "", {"x-match": "any", "a": "1"})
    ch.queue_bind("hb", "amq.headers", "", {"x-match": "any", "b": "2"})
    ch.basic_publish("amq.headers", "", b"a", pika.BasicProperties(headers={"a": "1"}))
    ch.basic_publish("amq.headers", "", b"b", pika.BasicProperties(headers={"b": "2"}))
    ch.basic_publish("amq.headers", "", b"ab", pika.BasicProperties(headers={"a": "1", "b": "2"}))
    assert sorted(get_all(ch, "hb")) == [b"a", b"ab", b"b"]  # once each, even when both match
    ch.queue_unbind("hb", "amq.headers", "", {"x-match": "any", "a": "1"})
    ch.basic_publish("amq.headers", "", b"a2", pika.BasicProperties(headers={"a": "1"}))
    ch.basic_publish("amq.headers", "", b"b2", pika.BasicProperties(headers={"b": "2"}))
    assert get_all(ch, "hb") == [b"b2"]


async def test_aio_pika_declared_exchanges(amqp: AmqpBroker) -> None:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp.amqp_port}/", timeout=WAIT)
    try:
        channel = await conn.channel()
        topic = await channel.declare_exchange("aio.topic", aio_pika.ExchangeType.TOPIC)
        headers = await channel.declare_exchange("aio.headers", aio_pika.ExchangeType.HEADERS)
        q_topic = await channel.declare_queue("aio-topic-q")
        q_headers = await channel.declare_queue("aio-headers-q")
        await q_topic.bind(topic, "logs.*.error")
        await q_headers.bind(headers, arguments={"x-match": "any", "level": "error", "k": 1})
        await topic.publish(aio_pika.Message(b"t1"), "logs.web.error")
        await topic.publish(aio_pika.Message(b"t2"), "logs.web.info")
        await headers.publish(aio_pika.Message(b"h1", headers={"level": "error"}), "")
        await headers.publish(aio_pika.Message(b"h2", headers={"k": 1}), "")
        await headers.publish(aio_pika.Message(b"h3", headers={"level": "info"}), "")
        assert await aio_drain(q_topic) == [b"t1"]
        assert sorted(await aio_drain(q_headers)) == [b"h1", b"h2"]
    finally:
        await conn.close()


async def aio_drain(queue: aio_pika.abc.AbstractQueue) -> list[bytes]:
    out: list[bytes] = []
    while True:
        msg = await queue.get(no_ack=True, fail=False, timeout=WAIT)
        if msg is None:
            return out
        out.append(msg.body)


# --------------------------------------------------------------------------------------------
# exchange.declare flags, exchange.delete


def test_exchange_declare_passive(conn: pika.BlockingConnection, amqp: AmqpBroker) -> None:
    ch = conn.channel()
    for name in ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"):
        ch.exchange_declare(name, passive=True)
    ch.exchange_declare("px", "fanout")
    ch.exchange_declare("px", passive=True)
    ch.exchange_declare("px", "fanout")  # an equivalent redeclare is fine
    assert channel_error(conn, lambda c: c.exchange_declare("no-such-x", passive=True)) == 404
    assert not amqp.has_exchange("no-such-x")


def test_exchange_declare_durable_flag(ch: blocking.BlockingChannel, amqp: AmqpBroker) -> None:
    ch.exchange_declare("dur-x", "topic", durable=True)
    ch.exchange_declare("tmp-x", "topic", durable=False)

    def durable(name: str) -> bool:
        def look(b: Any) -> bool:
            return bool(b.adapters["amqp"].exchanges.get(name).durable)

        return amqp.call(look)

    assert durable("dur-x") and not durable("tmp-x")


def test_auto_delete_exchange_goes_with_its_last_binding(
    ch: blocking.BlockingChannel, amqp: AmqpBroker
) -> None:
    ch.exchange_declare("ad-x", "direct", auto_delete=True)
    ch.exchange_declare("ad-x", "direct", passive=True)  # no binding yet: it stays
    declare_queues(ch, "ad-q1", "ad-q2")
    ch.queue_bind("ad-q1", "ad-x", "k")
    ch.queue_bind("ad-q2", "ad-x", "k")
    ch.queue_unbind("ad-q1", "ad-x", "k")
    assert amqp.has_exchange("ad-x")
    ch.basic_publish("ad-x", "k", b"still")
    assert get_all(ch, "ad-q2") == [b"still"]
    ch.queue_delete("ad-q2")  # its last binding goes with the queue
    assert not amqp.has_exchange("ad-x")


def test_internal_exchange_only_through_exchange_bindings(
    conn: pika.BlockingConnection,
) -> None:
    ch = conn.channel()
    ch.exchange_declare("front", "topic")
    ch.exchange_declare("inner", "fanout", internal=True)
    ch.exchange_bind("inner", "front", "orders.#")
    ch.queue_declare("inner-q")
    ch.queue_bind("inner-q", "inner", "")
    ch.basic_publish("front", "orders.new", b"via front")
    ch.basic_publish("front", "other", b"not routed")
    assert get_all(ch, "inner-q") == [b"via front"]
    assert channel_error(conn, lambda c: c.basic_publish("inner", "", b"direct")) == 403
    assert get_all(conn.channel(), "inner-q") == []


def test_exchange_delete_if_unused(conn: pika.BlockingConnection, amqp: AmqpBroker) -> None:
    ch = conn.channel()
    ch.exchange_declare("del-x", "direct")
    ch.queue_declare("del-q")
    ch.queue_bind("del-q", "del-x", "k")
    assert channel_error(conn, lambda c: c.exchange_delete("del-x", if_unused=True)) == 406
    assert amqp.has_exchange("del-x")
    ch.queue_unbind("del-q", "del-x", "k")
    ch.exchange_delete("del-x", if_unused=True)
    assert not amqp.has_exchange("del-x")
    ch.exchange_delete("del-x")  # deleting what is not there is fine (as RabbitMQ)


def test_exchange_delete_removes_its_bindings(
    conn: pika.BlockingConnection, amqp: AmqpBroker
) -> None:
    ch = conn.channel()
    ch.exchange_declare("gone-x", "fanout")
    ch.queue_declare("gone-q")
    ch.queue_bind("gone-q", "gone-x", "")
    ch.exchange_delete("gone-x")
    ch.exchange_declare("gone-x", "fanout")  # a new exchange of the same name: no bindings
    ch.basic_publish("gone-x", "", b"nothing bound")
    assert get_all(ch, "gone-q") == []


# --------------------------------------------------------------------------------------------
# Exchange-to-exchange bindings


def test_exchange_to_exchange_bind_and_unbind(ch: blocking.BlockingChannel) -> None:
    ch.exchange_declare("e2e-src", "topic")
    ch.exchange_declare("e2e-dst", "fanout")
    ch.exchange_bind("e2e-dst", "e2e-src", "sensors.*")
    declare_queues(ch, "e2e-q", "e2e-direct-q")
    ch.queue_bind("e2e-q", "e2e-dst", "")
    ch.queue_bind("e2e-direct-q", "e2e-src", "#")
    ch.basic_publish("e2e-src", "sensors.t", b"through")
    ch.basic_publish("e2e-src", "other.t", b"src only")
    ch.basic_publish("e2e-dst", "anything", b"dst itself")
    assert get_all(ch, "e2e-q") == [b"through", b"dst itself"]
    assert get_all(ch, "e2e-direct-q") == [b"through", b"src only"]
    ch.exchange_unbind("e2e-dst", "e2e-src", "sensors.*")
    ch.basic_publish("e2e-src", "sensors.t", b"after unbind")
    assert get_all(ch, "e2e-q") == []
    assert get_all(ch, "e2e-direct-q") == [b"after unbind"]


def test_exchange_bindings_cycle_and_diamond_deliver_once(ch: blocking.BlockingChannel) -> None:
    for name in ("cy-a", "cy-b", "cy-c"):
        ch.exchange_declare(name, "fanout")
    ch.exchange_bind("cy-b", "cy-a")  # a -> b -> a: a cycle
    ch.exchange_bind("cy-a", "cy-b")
    ch.exchange_bind("cy-c", "cy-a")  # a -> c, b -> c: a diamond
    ch.exchange_bind("cy-c", "cy-b")
    ch.queue_declare("cy-q")
    for name in ("cy-a", "cy-b", "cy-c"):
        ch.queue_bind("cy-q", name, "")
    ch.basic_publish("cy-a", "", b"m")
    assert get_all(ch, "cy-q") == [b"m"]


# --------------------------------------------------------------------------------------------
# queue.declare


def test_server_named_queues(ch: blocking.BlockingChannel, amqp: AmqpBroker) -> None:
    first = ch.queue_declare("").method.queue
    second = ch.queue_declare("", exclusive=True).method.queue
    assert first.startswith("amq.gen-") and second.startswith("amq.gen-")
    assert first != second
    assert amqp.has_queue(first) and amqp.has_queue(second)
    ch.basic_publish("", first, b"to a generated name")
    assert get_all(ch, first) == [b"to a generated name"]


def test_empty_queue_name_means_the_last_declared(ch: blocking.BlockingChannel) -> None:
    name = ch.queue_declare("").method.queue
    ch.queue_bind("", "amq.fanout")  # RabbitMQ: "" is the channel's last declared queue
    ch.basic_publish("amq.fanout", "", b"to the last")
    assert get_all(ch, name) == [b"to the last"]


def test_passive_queue_declare_reports_counts(
    conn: pika.BlockingConnection, clients: PikaClients, amqp: AmqpBroker
) -> None:
    ch = conn.channel()
    ch.queue_declare("pq")
    for n in range(3):
        ch.basic_publish("", "pq", str(n).encode())
    ok = ch.queue_declare("pq", passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == ("pq", 3, 0)
    consumer = clients.connect(amqp.amqp_port).channel()
    consumer.basic_qos(prefetch_count=1)
    consumer.basic_consume("pq", lambda *_: None)
    wait_until(lambda: queue_counts(ch, "pq") == (2, 1), "one message out, one consumer")
    assert channel_error(conn, lambda c: c.queue_declare("nope", passive=True)) == 404
    assert not amqp.has_queue("nope")  # a passive declare never creates


def test_basic_get_is_not_a_consumer(conn: pika.BlockingConnection, amqp: AmqpBroker) -> None:
    """basic.get keeps an internal subscription per channel; AMQP must not see it as a
    consumer (declare-ok's count, if-unused, exclusive consume, auto-delete)."""
    ch = conn.channel()
    ch.queue_declare("getq")
    ch.basic_publish("", "getq", b"1")
    assert get_message(ch, "getq")[2] == b"1"
    assert queue_counts(ch, "getq") == (0, 0)
    other = conn.channel()
    tag = other.basic_consume("getq", lambda *_: None, exclusive=True)
    assert queue_counts(ch, "getq") == (0, 1)
    other.basic_cancel(tag)
    assert ch.queue_delete("getq", if_unused=True).method.message_count == 0
    assert not amqp.has_queue("getq")
    # An auto-delete queue goes with its last consumer even if a channel got from it.
    ch.queue_declare("get-ad", auto_delete=True)
    assert_empty(ch, "get-ad")
    tag = other.basic_consume("get-ad", lambda *_: None)
    other.basic_cancel(tag)
    wait_until(lambda: not amqp.has_queue("get-ad"), "the auto-delete queue to go")


def test_durable_queue_flag(ch: blocking.BlockingChannel, amqp: AmqpBroker) -> None:
    ch.queue_declare("durable-q", durable=True)
    ch.queue_declare("transient-q", durable=False)
    assert amqp.queue_durable("durable-q")
    assert not amqp.queue_durable("transient-q")
    ch.queue_declare("durable-q", durable=True)  # equivalent: fine


def test_exclusive_queue_is_deleted_with_its_connection(
    clients: PikaClients, amqp: AmqpBroker
) -> None:
    owner = clients.connect(amqp.amqp_port)
    other = clients.connect(amqp.amqp_port).channel()
    och = owner.channel()
    och.queue_declare("excl-q", exclusive=True)
    och.queue_bind("excl-q", "amq.fanout")
    och.basic_publish("", "excl-q", b"mine")
    assert queue_counts(och, "excl-q") == (1, 0)  # the owner may use it on any channel
    assert queue_counts(owner.channel(), "excl-q") == (1, 0)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        other.basic_get("excl-q")
    assert info.value.reply_code == 405
    owner.close()
    wait_until(lambda: not amqp.has_queue("excl-q"), "the exclusive queue to go")
    ch = clients.connect(amqp.amqp_port).channel()
    ch.basic_publish("amq.fanout", "", b"no binding left")
    ch.queue_declare("excl-q")  # the name is free again, for anyone
    assert get_all(ch, "excl-q") == []


def test_exclusive_queue_goes_when_connection_drops(clients: PikaClients, amqp: AmqpBroker) -> None:
    owner = clients.connect(amqp.amqp_port)
    owner.channel().queue_declare("excl-drop", exclusive=True)
    owner._impl._transport._sock.close()  # an abrupt end, without connection.close
    wait_until(lambda: not amqp.has_queue("excl-drop"), "the exclusive queue to go")


def test_auto_delete_queue_goes_with_its_last_consumer(
    conn: pika.BlockingConnection, amqp: AmqpBroker
) -> None:
    ch1, ch2 = conn.channel(), conn.channel()
    ch1.queue_declare("ad-q", auto_delete=True)
    assert amqp.has_queue("ad-q")  # never consumed from: it stays
    tag1 = ch1.basic_consume("ad-q", lambda *_: None)
    tag2 = ch2.basic_consume("ad-q", lambda *_: None)
    ch1.basic_cancel(tag1)
    assert amqp.has_queue("ad-q")
    ch2.basic_cancel(tag2)
    wait_until(lambda: not amqp.has_queue("ad-q"), "the auto-delete queue to go")


def test_auto_delete_queue_goes_when_its_consumer_channel_closes(
    conn: pika.BlockingConnection, amqp: AmqpBroker
) -> None:
    ch = conn.channel()
    ch.queue_declare("ad-close", auto_delete=True)
    ch.basic_consume("ad-close", lambda *_: None)
    ch.close()
    wait_until(lambda: not amqp.has_queue("ad-close"), "the auto-delete queue to go")


# --------------------------------------------------------------------------------------------
# bind / unbind / purge / delete with counts


def test_bind_purge_delete_counts(conn: pika.BlockingConnection, amqp: AmqpBroker) -> None:
    ch = conn.channel()
    ch.queue_declare("cnt-q")
    ch.queue_bind("cnt-q", "amq.direct", "cnt")
    for n in range(3):
        ch.basic_publish("amq.direct", "cnt", str(n).encode())
    assert queue_counts(ch, "cnt-q") == (3, 0)
    assert ch.queue_purge("cnt-q").method.message_count == 3
    assert queue_counts(ch, "cnt-q") == (0, 0)
    assert ch.queue_purge("cnt-q").method.message_count == 0
    for n in range(2):
        ch.basic_publish("amq.direct", "cnt", str(n).encode())
    ch.queue_unbind("cnt-q", "amq.direct", "cnt")
    ch.basic_publish("amq.direct", "cnt", b"unrouted")
    assert queue_counts(ch, "cnt-q") == (2, 0)
    assert ch.queue_delete("cnt-q").method.message_count == 2
    assert not amqp.has_queue("cnt-q")
    assert ch.queue_delete("cnt-q").method.message_count == 0  # absent: fine, as RabbitMQ


def test_queue_delete_if_unused_and_if_empty(
    conn: pika.BlockingConnection, amqp: AmqpBroker
) -> None:
    ch = conn.channel()
    ch.queue_declare("cond-q")
    ch.basic_publish("", "cond-q", b"x")
    consumer = conn.channel()
    tag = consumer.basic_consume("cond-q", lambda *_: None, auto_ack=False)
    assert channel_error(conn, lambda c: c.queue_delete("cond-q", if_unused=True)) == 406
    consumer.basic_cancel(tag)
    consumer.close()  # its unacknowledged delivery goes back
    wait_until(lambda: queue_counts(ch, "cond-q") == (1, 0), "the message back, no consumer")
    assert channel_error(conn, lambda c: c.queue_delete("cond-q", if_empty=True)) == 406
    assert get_all(ch, "cond-q") == [b"x"]
    assert ch.queue_delete("cond-q", if_unused=True, if_empty=True).method.message_count == 0
    assert not amqp.has_queue("cond-q")


def test_queue_delete_removes_its_bindings(ch: blocking.BlockingChannel) -> None:
    ch.queue_declare("qdel")
    ch.queue_bind("qdel", "amq.topic", "qdel.#")
    ch.queue_delete("qdel")
    ch.queue_declare("qdel")
    ch.basic_publish("amq.topic", "qdel.x", b"no binding")
    assert get_all(ch, "qdel") == []


# --------------------------------------------------------------------------------------------
# mandatory and basic.return


def test_mandatory_unroutable_publish_is_returned(
    conn: pika.BlockingConnection,
) -> None:
    ch = conn.channel()
    returned: list[tuple[Any, pika.BasicProperties, bytes]] = []
    ch.add_on_return_callback(
        lambda _ch, method, props, body: returned.append((method, props, body))
    )
    ch.queue_declare("routable")
    ch.queue_bind("routable", "amq.direct", "yes")
    props = pika.BasicProperties(message_id="m-1", headers={"h": "v"})
    ch.basic_publish("amq.direct", "no-route", b"bounce", props, mandatory=True)
    ch.basic_publish("amq.direct", "yes", b"fine", mandatory=True)
    ch.basic_publish("amq.direct", "no-route", b"dropped quietly")  # not mandatory
    ch.basic_publish("", "missing-queue", b"bounce too", mandatory=True)
    pump_until(conn, lambda: len(returned) >= 2, "two basic.returns")
    assert get_all(ch, "routable") == [b"fine"]  # a barrier: all four publishes are routed
    conn.process_data_events(0)
    assert len(returned) == 2
    (m1, p1, b1), (m2, _p2, b2) = returned
    assert (m1.reply_code, m1.reply_text, m1.exchange, m1.routing_key) == (
        312,
        "NO_ROUTE",
        "amq.direct",
        "no-route",
    )
    assert b1 == b"bounce" and p1.message_id == "m-1" and p1.headers == {"h": "v"}
    assert (m2.reply_code, m2.exchange, m2.routing_key, b2) == (
        312,
        "",
        "missing-queue",
        b"bounce too",
    )


def test_default_exchange_cannot_reach_internal_queues(
    amqp: AmqpBroker, conn: pika.BlockingConnection
) -> None:
    """The adapters' "$" queues (here the AMQP adapter's own durable tables, which recovery
    would read back as exchanges, bindings and queue arguments) route nowhere."""
    internal = ["$amqp.bindings", "$amqp.exchanges", "$amqp.queues"]
    assert all(amqp.has_queue(name) for name in internal)
    ch = conn.channel()
    returned: list[str] = []
    ch.add_on_return_callback(
        lambda _ch, method, _props, _body: returned.append(method.routing_key)
    )
    ch.queue_declare("visible")
    for name in internal:
        ch.basic_publish("", name, b"evil", mandatory=True)
    ch.basic_publish("", "visible", b"fine", mandatory=True)
    assert get_all(ch, "visible") == [b"fine"]  # a barrier: every publish is routed
    pump_until(conn, lambda: len(returned) >= len(internal), "a basic.return each")
    assert returned == internal
    counts = amqp.call(lambda b: [b.manager.queues[n].message_count for n in internal])
    assert counts == [0, 0, 0]


def test_mandatory_with_confirms_pika(ch: blocking.BlockingChannel) -> None:
    ch.confirm_delivery()
    ch.queue_declare("conf-q")
    ch.basic_publish("", "conf-q", b"ok", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("amq.topic", "nobody.home", b"x", mandatory=True)
    assert get_all(ch, "conf-q") == [b"ok"]


async def test_mandatory_return_aio_pika(amqp: AmqpBroker) -> None:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp.amqp_port}/", timeout=WAIT)
    try:
        channel = await conn.channel(on_return_raises=True)
        with pytest.raises(aio_pika.exceptions.DeliveryError) as info:
            await channel.default_exchange.publish(
                aio_pika.Message(b"nowhere"), "no-such-queue", mandatory=True, timeout=WAIT
            )
        assert info.value.message is not None
        assert info.value.message.body == b"nowhere"
        queue = await channel.declare_queue("aio-mand")
        await channel.default_exchange.publish(aio_pika.Message(b"somewhere"), "aio-mand")
        assert await aio_drain(queue) == [b"somewhere"]
    finally:
        await conn.close()


# --------------------------------------------------------------------------------------------
# Cross-protocol: MQTT


def test_amqp_publish_to_amq_topic_reaches_mqtt_subscriber(
    ch: blocking.BlockingChannel, paho: Callable[[], Paho]
) -> None:
    sub = paho()
    assert sub.subscribe(("sensors/+/temp", 1)) == [1]
    assert sub.subscribe(("fence", 0)) == [0]
    ch.basic_publish("amq.topic", "sensors.room1.temp", b"21.5")
    ch.basic_publish("amq.topic", "sensors.room1.humidity", b"40")  # no match
    ch.basic_publish("amq.topic", "sensors.room1.temp.raw", b"no")  # + is one level
    ch.basic_publish("amq.topic", "fence", b"")
    before = sub.until("fence")
    assert [(m.topic, m.payload) for m in before] == [("sensors/room1/temp", b"21.5")]


def test_mqtt_publish_reaches_amqp_queue_bound_to_amq_topic(
    ch: blocking.BlockingChannel, paho: Callable[[], Paho]
) -> None:
    ch.queue_declare("sensor-events")
    ch.queue_bind("sensor-events", "amq.topic", "sensors.#")
    pub = paho()
    pub.publish("sensors/room2/temp", b"\x00\x01binary", qos=1)
    pub.publish("other/room2/temp", b"not bound", qos=1)
    pub.publish("sensors", b"zero words after", qos=1)
    method, props, body = get_message(ch, "sensor-events")
    assert body == b"\x00\x01binary"  # the original bytes, not base64
    assert (method.exchange, method.routing_key) == ("amq.topic", "sensors.room2.temp")
    assert props.headers is not None and props.headers.get("mqttTopic") == "sensors/room2/temp"
    wait_until(lambda: queue_counts(ch, "sensor-events")[0] == 1, "the second match")
    assert get_all(ch, "sensor-events") == [b"zero words after"]


# --------------------------------------------------------------------------------------------
# Cross-protocol: the VibeMQ protocol


async def test_vibemq_and_amqp_consumers_compete_on_one_queue(
    aio: aio_pika.abc.AbstractConnection, vibemq: Callable[[], Any]
) -> None:
    channel = await aio.channel()
    await channel.set_qos(prefetch_count=1)
    queue = await channel.declare_queue("orders", durable=True)
    amqp_got: list[bytes] = []

    async def on_message(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        amqp_got.append(msg.body)
        await msg.ack()

    await queue.consume(on_message)
    client = await vibemq()
    sub = await client.subscribe("orders", prefetch=1)
    vibemq_got: list[bytes] = []
    publisher = await aio.channel()
    sent = [json.dumps({"order": n}).encode() for n in range(40)]
    for body in sent:
        await publisher.default_exchange.publish(aio_pika.Message(body), "orders")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while len(amqp_got) + len(vibemq_got) < len(sent):
        assert loop.time() < deadline, f"{len(amqp_got)} + {len(vibemq_got)} of {len(sent)}"
        with contextlib.suppress(TimeoutError):
            msg = await sub.get(timeout=0.05)
            vibemq_got.append(msg.raw)
            await msg.ack()
    assert sorted(amqp_got + vibemq_got) == sorted(sent)  # each message exactly once
    assert amqp_got and vibemq_got, "both consumers got a share"


async def test_vibemq_publish_reaches_amqp_consumer_as_json(
    aio: aio_pika.abc.AbstractConnection, vibemq: Callable[[], Any]
) -> None:
    channel = await aio.channel()
    queue = await channel.declare_queue("orders", durable=True)
    client = await vibemq()
    await client.publish("orders", {"id": 7, "items": ["a", "b"]}, headers={"source": "web"})
    msg = await get_async(queue)
    assert json.loads(msg.body) == {"id": 7, "items": ["a", "b"]}
    assert msg.content_type == "application/json"
    assert msg.headers.get("source") == "web"
    assert (msg.exchange, msg.routing_key) == ("", "orders")


async def test_vibemq_created_queue_is_visible_to_amqp(
    aio: aio_pika.abc.AbstractConnection, vibemq: Callable[[], Any]
) -> None:
    client = await vibemq()
    await client.publish("invoices", {"n": 1})  # the queue is created by the publish
    channel = await aio.channel()
    queue = await channel.declare_queue("invoices", passive=True)
    assert queue.declaration_result.message_count == 1
    msg = await get_async(queue)
    assert json.loads(msg.body) == {"n": 1}


async def test_amqp_binary_body_reaches_vibemq_base64(
    aio: aio_pika.abc.AbstractConnection, vibemq: Callable[[], Any]
) -> None:
    channel = await aio.channel()
    await channel.declare_queue("orders", durable=True)
    client = await vibemq()
    sub = await client.subscribe("orders")
    body = b"\x00\xff\xfe not json \x80"
    await channel.default_exchange.publish(
        aio_pika.Message(
            body, content_type="application/octet-stream", headers={"tenant": "acme", "n": 5}
        ),
        "orders",
    )
    msg = await sub.get(timeout=WAIT)
    assert msg.headers.get("payloadEncoding") == "base64"
    assert msg.payload_bytes == body
    assert msg.headers.get("tenant") == "acme"
    assert msg.headers.get("contentType") == "application/octet-stream"
    await msg.ack()
    # A JSON body arrives as it is.
    await channel.default_exchange.publish(aio_pika.Message(b'{"ok": true}'), "orders")
    msg = await sub.get(timeout=WAIT)
    assert "payloadEncoding" not in msg.headers
    assert msg.payload == {"ok": True}
    await msg.ack()


async def test_amqp_roundtrip_through_vibemq_publish_keeps_bytes(
    aio: aio_pika.abc.AbstractConnection,
) -> None:
    """An AMQP consumer gets back exactly the bytes and properties an AMQP publisher sent,
    whatever the core stores in between."""
    channel = await aio.channel()
    queue = await channel.declare_queue("bytes-q")
    body = bytes(range(256))
    await channel.default_exchange.publish(
        aio_pika.Message(body, content_type="image/png", correlation_id="c-9", priority=3),
        "bytes-q",
    )
    msg = await get_async(queue)
    assert msg.body == body
    assert (msg.content_type, msg.correlation_id, msg.priority) == ("image/png", "c-9", 3)


# --------------------------------------------------------------------------------------------
# Durability across a real broker restart


def test_durable_topology_and_persistent_messages_survive_restart(server: ServerProcess) -> None:
    server.start()
    conn = pika.BlockingConnection(pika_params(server.amqp_port))
    ch = conn.channel()
    ch.confirm_delivery()
    # Durable: two exchanges bound to each other, a queue bound to both, a headers binding.
    ch.exchange_declare("d.events", "topic", durable=True)
    ch.exchange_declare("d.audit", "fanout", durable=True)
    ch.exchange_declare("d.match", "headers", durable=True)
    ch.exchange_bind("d.audit", "d.events", "orders.#")
    ch.queue_declare("d.orders", durable=True)
    ch.queue_declare("d.audit-log", durable=True)
    ch.queue_declare("d.matched", durable=True)
    ch.queue_bind("d.orders", "d.events", "orders.*")
    ch.queue_bind("d.audit-log", "d.audit", "")
    ch.queue_bind("d.matched", "d.match", "", {"x-match": "any", "kind": "invoice"})
    # Transient: gone after the restart.
    ch.exchange_declare("t.events", "topic", durable=False)
    ch.queue_declare("t.queue", durable=False)
    ch.queue_bind("t.queue", "t.events", "#")
    ch.queue_bind("t.queue", "d.events", "#")  # a binding with a transient end is transient
    persistent = pika.BasicProperties(
        delivery_mode=2,
        content_type="text/plain",
        headers={"k": "v", "n": 1},
        message_id="p-1",
        correlation_id="corr",
        priority=4,
    )
    ch.basic_publish("d.events", "orders.new", b"order 1", persistent)
    ch.basic_publish(
        "d.match",
        "",
        b"invoice",
        pika.BasicProperties(delivery_mode=2, headers={"kind": "invoice"}),
    )
    assert queue_counts(ch, "d.orders") == (1, 0)
    assert queue_counts(ch, "d.audit-log") == (1, 0)
    assert queue_counts(ch, "d.matched") == (1, 0)
    conn.close()
    server.stop()

    server.start()
    conn = pika.BlockingConnection(pika_params(server.amqp_port))
    try:
        ch = conn.channel()
        for name in ("d.events", "d.audit", "d.match"):
            ch.exchange_declare(name, passive=True)
        assert queue_counts(ch, "d.orders") == (1, 0)
        assert queue_counts(ch, "d.audit-log") == (1, 0)
        assert queue_counts(ch, "d.matched") == (1, 0)
        method, props, body = get_message(ch, "d.orders")
        assert body == b"order 1"
        assert (method.exchange, method.routing_key) == ("d.events", "orders.new")
        assert props.delivery_mode == 2
        assert props.content_type == "text/plain"
        assert props.headers == {"k": "v", "n": 1}
        assert (props.message_id, props.correlation_id, props.priority) == ("p-1", "corr", 4)
        assert get_all(ch, "d.audit-log") == [b"order 1"]
        assert get_all(ch, "d.matched") == [b"invoice"]
        # The bindings work after the restart, the exchange-to-exchange one too.
        ch.basic_publish("d.events", "orders.paid", b"order 2")
        ch.basic_publish("d.events", "orders.eu.paid", b"audit only")
        ch.basic_publish("d.match", "", b"inv 2", pika.BasicProperties(headers={"kind": "invoice"}))
        assert get_all(ch, "d.orders") == [b"order 2"]
        assert get_all(ch, "d.audit-log") == [b"order 2", b"audit only"]
        assert get_all(ch, "d.matched") == [b"inv 2"]
        # The transient ones are gone.
        assert channel_error(conn, lambda c: c.exchange_declare("t.events", passive=True)) == 404
        assert channel_error(conn, lambda c: c.queue_declare("t.queue", passive=True)) == 404
        # A declare equal to the restored one is fine; a different one is not.
        ch = conn.channel()
        ch.exchange_declare("d.events", "topic", durable=True)
        ch.queue_declare("d.orders", durable=True)
        assert channel_error(conn, lambda c: c.queue_declare("d.orders", durable=False)) == 406
    finally:
        with contextlib.suppress(Exception):
            conn.close()
    server.stop()


async def test_a_raw_binary_body_comes_back_after_a_restart_for_every_protocol(
    server: ServerProcess,
) -> None:
    """An AMQP body is stored raw (payloadEncoding: raw) and written to the journal in the
    VibeMQ form (marked payloadRaw): after a restart it is raw again, an AMQP consumer gets the
    same bytes, a VibeMQ one base64 for a binary body and the JSON as it is for a JSON one."""
    server.start()
    body = b"\x00\xff raw \x80"
    conn = pika.BlockingConnection(pika_params(server.amqp_port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("d.bin", durable=True)
    persistent = pika.BasicProperties(delivery_mode=2)
    for payload in (body, body, b'{"ok": 1}'):
        ch.basic_publish("", "d.bin", payload, persistent)
    conn.close()
    server.stop()
    # The records hold the VibeMQ form, as they always did (recovery and Spark read them).
    records = [
        e.record
        for _n, path in list_segments(server.data_dir / "journal")
        for e in iter_records(path.read_bytes(), path=str(path))
        if isinstance(e.record, Publish) and e.record.queue == "d.bin"
    ]
    b64 = b'"' + base64.b64encode(body) + b'"'
    assert [
        (r.headers.get("payloadEncoding"), r.headers.get("payloadRaw"), r.payload) for r in records
    ] == [("base64", "1", b64), ("base64", "1", b64), (None, "1", b'{"ok": 1}')]

    server.start()
    conn = pika.BlockingConnection(pika_params(server.amqp_port))
    try:
        assert get_message(conn.channel(), "d.bin")[2] == body
    finally:
        conn.close()
    client = await Client.connect(
        "127.0.0.1", server.ports["vibemq"], reconnect=False, request_timeout=WAIT
    )
    try:
        sub = await client.subscribe("d.bin")
        msg = await sub.get(timeout=WAIT)
        assert msg.headers.get("payloadEncoding") == "base64"
        assert msg.payload_bytes == body
        await msg.ack()
        msg = await sub.get(timeout=WAIT)
        assert "payloadEncoding" not in msg.headers
        assert msg.payload == {"ok": 1}
        await msg.ack()
    finally:
        await client.close()
    server.stop()


def test_consumer_sees_messages_published_before_restart(server: ServerProcess) -> None:
    server.start()
    conn = pika.BlockingConnection(pika_params(server.amqp_port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("d.work", durable=True)
    for n in range(20):
        ch.basic_publish("", "d.work", f"job {n}".encode(), pika.BasicProperties(delivery_mode=2))
    # Half of them acknowledged before the restart: only the other half comes back.
    for _ in range(10):
        method, _props, _body = get_message(ch, "d.work", auto_ack=False)
        ch.basic_ack(method.delivery_tag)
    assert queue_counts(ch, "d.work") == (10, 0)
    conn.close()
    server.stop()

    server.start()
    conn = pika.BlockingConnection(pika_params(server.amqp_port))
    try:
        got = [body for _m, _p, body in consume(conn.channel(), "d.work", 10)]
        assert got == [f"job {n}".encode() for n in range(10, 20)]
    finally:
        conn.close()
    server.stop()
