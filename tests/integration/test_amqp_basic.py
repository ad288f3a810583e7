"""AMQP 0-9-1 basic class, confirms and transactions with real clients against a real broker.

pika's BlockingConnection drives a broker running on a thread of its own
(:class:`amqputil.AmqpBroker`); aio-pika and pika's asyncio adapter run on the test's
event loop against an in-process broker (``broker_factory``). Every wait is bounded.

What is asserted is what a RabbitMQ user relies on: the 14 basic properties and the body
arrive exactly as published; consumers (no-ack, exclusive, tags, cancel from either side);
redelivery (flag and position); basic.get; ack/nack/reject with ``multiple`` and ``requeue``;
basic.recover; prefetch per consumer and per channel; round robin; x-message-ttl;
x-max-length with both overflow behaviours; publisher confirms; transactions; a slow consumer
leaving messages in its queue; the memory high watermark (connection.blocked / unblocked).
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aio_pika
import aio_pika.abc
import pika
import pika.exceptions
import pytest
from amqputil import (
    PROPERTY_NAMES,
    QUIET,
    WAIT,
    AmqpBroker,
    PikaClients,
    RawAmqp,
    all_basic_properties,
    amqp_brokers,
    consumer,
    get,
    get_all,
    pika_params,
    properties_dict,
    pump_until,
    queue_counts,
)
from pamqp import commands
from pika.adapters.asyncio_connection import AsyncioConnection
from waits import wait_until

from vibemq_server.server import Broker

UTC = datetime.UTC
BrokerFactory = Callable[..., Awaitable[Broker]]


def port_of(broker: Broker) -> int:
    """The AMQP port of an in-process broker (``broker_factory``)."""
    assert broker.amqp_port
    return broker.amqp_port


def publish_n(channel: Any, queue: str, n: int, prefix: str = "m") -> list[bytes]:
    bodies = [f"{prefix}{i}".encode() for i in range(n)]
    for body in bodies:
        channel.basic_publish("", queue, body)
    return bodies


# Every field type pika can encode (pika 1.x has no encoder for floats: those are covered
# with aio-pika below). Datetimes travel as whole seconds, decoded as UTC.
PIKA_HEADERS: dict[str, Any] = {
    "str": "héllo",
    "int": 42,
    "negative": -7,
    "long": 2**40,
    "true": True,
    "false": False,
    "nested": {"inner": "x", "n": 1, "deeper": {"list": [1, "a"]}},
    "list": [1, "two", True, None, {"k": "v"}, [3]],
    "bytes": b"\x00\xffraw",
    "decimal": decimal.Decimal("3.14"),
    "datetime": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC),
    "none": None,
    "empty": "",
}


# --------------------------------------------------------------------------------------------
# basic.publish: properties and body arrive unchanged


def test_every_basic_property_and_header_type_survive_deliver_and_get(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("props")
    sent = all_basic_properties(dict(PIKA_HEADERS))
    body = bytes(range(256)) * 3  # not UTF-8, not JSON
    channel.basic_publish("", "props", body, sent)
    channel.basic_publish("", "props", body, sent)

    got = get(channel, "props")
    assert got.body == body
    assert properties_dict(got.properties) == properties_dict(sent)
    assert got.properties.expiration is None

    receiver = pikas.channel()
    collector = consumer(receiver, "props", auto_ack=True)
    (delivery,) = collector.wait_for(1)
    assert delivery.body == body
    assert properties_dict(delivery.properties) == properties_dict(sent)
    assert delivery.method.exchange == ""
    assert delivery.method.routing_key == "props"


def test_properties_survive_an_exchange_and_an_empty_body(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.exchange_declare("props.x", "direct")
    channel.queue_declare("props2")
    channel.queue_bind("props2", "props.x", "k")
    sent = pika.BasicProperties(content_type="text/plain", headers={"a": 1}, priority=0)
    channel.basic_publish("props.x", "k", b"", sent)
    channel.basic_publish("props.x", "k", b"{}", pika.BasicProperties())

    first = get(channel, "props2")
    assert first.body == b""
    assert first.method.exchange == "props.x" and first.method.routing_key == "k"
    assert properties_dict(first.properties) == properties_dict(sent)
    second = get(channel, "props2")
    assert second.body == b"{}"
    # No property set: none comes back (a JSON body gets no invented content type).
    assert properties_dict(second.properties) == properties_dict(pika.BasicProperties())


async def test_aio_pika_every_property_and_float_headers(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory()
    headers: dict[str, Any] = {
        "str": "s",
        "int": 7,
        "float": 2.5,
        "negative_float": -0.125,  # pamqp sends 32-bit floats: exact values
        "bool": True,
        "nested": {"f": 0.25, "l": [1.5, "x"]},
        "list": [1, "a", 3.75, False],
        "bytes": bytearray(b"\x01\x02"),
        "decimal": decimal.Decimal("12.345"),
        "datetime": datetime.datetime(2023, 1, 2, 3, 4, 5, tzinfo=UTC),
        "none": None,
    }
    sent = aio_pika.Message(
        b"\x00aio\xff",
        content_type="application/octet-stream",
        content_encoding="identity",
        headers=headers,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        priority=3,
        correlation_id="c-1",
        reply_to="replies",
        message_id="id-1",
        timestamp=datetime.datetime(2024, 2, 3, 4, 5, 6, tzinfo=UTC),
        type="kind",
        user_id="guest",
        app_id="aio",
    )
    names = [n for n in PROPERTY_NAMES if n != "cluster_id"]  # (not in aio-pika's Message)
    async with asyncio.timeout(WAIT * 2):
        connection = await aio_pika.connect(host="127.0.0.1", port=port_of(broker), timeout=WAIT)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("aio-props")
            await channel.default_exchange.publish(sent, routing_key="aio-props")
            async with queue.iterator() as messages:
                async for message in messages:
                    await message.ack()
                    break
            assert message.body == sent.body
            assert {n: getattr(message, n) for n in names} == {n: getattr(sent, n) for n in names}
            assert message.routing_key == "aio-props"


# --------------------------------------------------------------------------------------------
# basic.consume


def test_no_ack_consumer_leaves_nothing_unacked(amqp: AmqpBroker, pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("noack")
    bodies = publish_n(channel, "noack", 5)
    collector = consumer(channel, "noack", auto_ack=True)
    assert [d.body for d in collector.wait_for(5)] == bodies
    assert all(not d.redelivered for d in collector.got)
    assert amqp.unacked("noack") == 0
    channel.close()
    # Nothing comes back when the channel closes: no-ack deliveries were settled on sending.
    assert queue_counts(pikas.channel(), "noack") == (0, 0)


def test_exclusive_consumer_refuses_others(pikas: PikaClients) -> None:
    owner = pikas.channel()
    owner.queue_declare("excl")
    owner.basic_consume("excl", lambda *a: None, exclusive=True, consumer_tag="owner")

    other = pikas.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        other.basic_consume("excl", lambda *a: None)
    assert refused.value.reply_code == 403
    assert "ACCESS_REFUSED" in refused.value.reply_text

    # An exclusive consume on a queue that already has a consumer is refused too.
    owner.queue_declare("shared")
    owner.basic_consume("shared", lambda *a: None)
    third = pikas.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        third.basic_consume("shared", lambda *a: None, exclusive=True)
    assert refused.value.reply_code == 403

    # Once the exclusive consumer is cancelled, others may consume.
    owner.basic_cancel("owner")
    again = pikas.channel()
    again.basic_consume("excl", lambda *a: None)
    assert queue_counts(again, "excl") == (0, 1)


def test_consumer_tags_given_and_server_generated(amqp: AmqpBroker, pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("tags")
    collector = consumer(channel, "tags", auto_ack=True, consumer_tag="my-tag")
    channel.basic_publish("", "tags", b"one")
    assert collector.wait_for(1)[0].method.consumer_tag == "my-tag"

    raw = RawAmqp(amqp.amqp_port)
    try:
        raw.open()
        raw.rpc(1, commands.Queue.Declare(queue="tags2"), commands.Queue.DeclareOk)
        ok = raw.rpc(
            1, commands.Basic.Consume(queue="tags2", no_ack=True), commands.Basic.ConsumeOk
        )
        assert ok.consumer_tag is not None and ok.consumer_tag.startswith("amq.ctag-")
        second = raw.rpc(
            1, commands.Basic.Consume(queue="tags2", no_ack=True), commands.Basic.ConsumeOk
        )
        assert second.consumer_tag is not None and second.consumer_tag.startswith("amq.ctag-")
        assert second.consumer_tag != ok.consumer_tag
        channel.basic_publish("", "tags2", b"two")
        deliver, _header, body = raw.message(1)
        assert body == b"two"
        assert deliver.consumer_tag in (ok.consumer_tag, second.consumer_tag)
        # Reusing a tag on the channel is a connection error (530 NOT_ALLOWED), as in RabbitMQ.
        raw.method(1, commands.Basic.Consume(queue="tags2", consumer_tag=ok.consumer_tag))
        close = raw.expect(commands.Connection.Close, 0)
        assert close.reply_code == 530
    finally:
        raw.close()


def test_basic_cancel_stops_deliveries(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("cancel")
    collector = consumer(channel, "cancel", auto_ack=True, consumer_tag="c1")
    publish_n(channel, "cancel", 2)
    collector.wait_for(2)
    channel.basic_cancel("c1")
    publish_n(channel, "cancel", 3, prefix="after")
    assert queue_counts(channel, "cancel") == (3, 0)
    assert len(collector.settle()) == 2
    assert get_all(channel, "cancel") == [b"after0", b"after1", b"after2"]


def test_queue_deletion_cancels_consumers_pika(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("doomed")
    cancelled: list[Any] = []
    channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method))
    channel.basic_consume("doomed", lambda *a: None, consumer_tag="victim")

    pikas.channel().queue_delete("doomed")
    pump_until(channel.connection, lambda: bool(cancelled), "basic.cancel from the broker")
    assert [m.consumer_tag for m in cancelled] == ["victim"]
    assert isinstance(cancelled[0], pika.spec.Basic.Cancel)
    # The channel is still usable.
    channel.queue_declare("doomed2")
    channel.basic_publish("", "doomed2", b"x")
    assert get(channel, "doomed2").body == b"x"


async def test_queue_deletion_cancels_consumers_aio_pika(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory()
    async with asyncio.timeout(WAIT * 2):
        connection = await aio_pika.connect(host="127.0.0.1", port=port_of(broker), timeout=WAIT)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("aio-doomed")
            cancelled: asyncio.Future[str] = asyncio.get_running_loop().create_future()

            def on_cancel(frame: Any) -> None:
                if not cancelled.done():
                    cancelled.set_result(frame.consumer_tag)

            underlay = await channel.get_underlay_channel()
            underlay.on_consumer_cancel_callbacks.add(on_cancel)

            async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                pass

            tag = await queue.consume(ignore)
            other = await connection.channel()
            await other.queue_delete("aio-doomed")
            assert await cancelled == tag
            # The channel goes on working.
            again = await channel.declare_queue("aio-after")
            await channel.default_exchange.publish(aio_pika.Message(b"ok"), "aio-after")
            message = await again.get(timeout=WAIT, fail=True)
            assert message is not None and message.body == b"ok"
            await message.ack()


# --------------------------------------------------------------------------------------------
# Redelivery, basic.get, ack / nack / reject, recover


def test_nack_requeue_comes_back_first_and_redelivered(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("requeue")
    publish_n(channel, "requeue", 3)
    first = get(channel, "requeue", auto_ack=False)
    assert first.body == b"m0" and not first.redelivered
    channel.basic_nack(first.tag, requeue=True)

    again = get(channel, "requeue", auto_ack=False)
    assert again.body == b"m0" and again.redelivered
    channel.basic_ack(again.tag)
    rest = get(channel, "requeue", auto_ack=False)
    assert rest.body == b"m1" and not rest.redelivered


def test_closing_a_channel_with_unacked_redelivers_them(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("unacked")
    bodies = publish_n(channel, "unacked", 3)
    holder = pikas.channel()
    collector = consumer(holder, "unacked")
    collector.wait_for(3)
    assert all(not d.redelivered for d in collector.got)
    holder.close()

    receiver = pikas.channel()
    again = consumer(receiver, "unacked", auto_ack=True).wait_for(3)
    assert [d.body for d in again] == bodies
    assert all(d.redelivered for d in again)


def test_closing_a_connection_with_unacked_redelivers_them(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("unacked-conn")
    publish_n(channel, "unacked-conn", 2)
    holder = pikas.channel()
    consumer(holder, "unacked-conn").wait_for(2)
    holder.connection.close()
    wait_until(lambda: queue_counts(channel, "unacked-conn") == (2, 0), "messages requeued")
    first = get(channel, "unacked-conn")
    assert first.body == b"m0" and first.redelivered


def test_basic_get_ok_and_get_empty_message_count(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("getq")
    publish_n(channel, "getq", 3)
    counts = []
    for expected in (b"m0", b"m1", b"m2"):
        got = get(channel, "getq", auto_ack=False)
        assert got.body == expected and not got.redelivered
        assert isinstance(got.method, pika.spec.Basic.GetOk)
        assert got.method.exchange == "" and got.method.routing_key == "getq"
        counts.append(got.method.message_count)
        channel.basic_ack(got.tag)
    assert counts == [2, 1, 0]
    method, props, body = channel.basic_get("getq")
    assert (method, props, body) == (None, None, None)  # basic.get-empty


def test_ack_multiple(amqp: AmqpBroker, pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("ackm")
    publish_n(channel, "ackm", 5)
    holder = pikas.channel()
    got = consumer(holder, "ackm").wait_for(5)
    holder.basic_ack(got[2].tag, multiple=True)
    wait_until(lambda: amqp.unacked("ackm") == 2, "two left unacked")
    holder.close()
    assert get_all(channel, "ackm") == [b"m3", b"m4"]


def test_nack_multiple_requeue_puts_them_back_at_the_head(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("nackm")
    publish_n(channel, "nackm", 6)
    held = [get(channel, "nackm", auto_ack=False) for _ in range(4)]
    channel.basic_nack(held[2].tag, multiple=True, requeue=True)  # m0, m1, m2 back

    again = [get(channel, "nackm", auto_ack=True) for _ in range(5)]
    assert [d.body for d in again] == [b"m0", b"m1", b"m2", b"m4", b"m5"]
    assert [d.redelivered for d in again] == [True, True, True, False, False]
    channel.basic_ack(held[3].tag)  # m3 was still held by this channel
    assert get_all(channel, "nackm") == []


def test_nack_and_reject_without_requeue_drop(amqp: AmqpBroker, pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("drop")
    publish_n(channel, "drop", 6)
    held = [get(channel, "drop", auto_ack=False) for _ in range(6)]
    channel.basic_reject(held[0].tag, requeue=False)
    channel.basic_nack(held[1].tag, requeue=False)
    channel.basic_reject(held[2].tag, requeue=True)
    channel.basic_nack(held[4].tag, multiple=True, requeue=False)  # m3 and m4
    back = get(channel, "drop", auto_ack=True)
    assert back.body == b"m2" and back.redelivered
    assert amqp.unacked("drop") == 1  # m5
    channel.close()
    other = pikas.channel()
    assert get_all(other, "drop") == [b"m5"]


def test_basic_recover_redelivers_unacked(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("recover")
    publish_n(channel, "recover", 3)
    collector = consumer(channel, "recover")
    collector.wait_for(3)
    channel.basic_recover(requeue=True)
    got = collector.wait_for(6)
    assert [d.body for d in got] == [b"m0", b"m1", b"m2"] * 2
    assert [d.redelivered for d in got] == [False] * 3 + [True] * 3
    assert len({d.tag for d in got}) == 6
    channel.basic_ack(got[-1].tag, multiple=True)  # the old tags are settled by recover
    channel.close()
    assert queue_counts(pikas.channel(), "recover") == (0, 0)


# --------------------------------------------------------------------------------------------
# basic.qos and round robin


def test_prefetch_per_consumer(amqp: AmqpBroker, pikas: PikaClients) -> None:
    publisher = pikas.channel()
    publisher.queue_declare("prefetch")
    publish_n(publisher, "prefetch", 10)
    channel = pikas.channel()
    channel.basic_qos(prefetch_count=3)
    first = consumer(channel, "prefetch")
    first.wait_for(3)
    assert queue_counts(publisher, "prefetch") == (7, 1)
    assert len(first.settle()) == 3

    # A second consumer on the same channel gets a prefetch of its own.
    second = consumer(channel, "prefetch")
    second.wait_for(3)
    assert queue_counts(publisher, "prefetch") == (4, 2)
    assert amqp.unacked("prefetch") == 6

    channel.basic_ack(first.got[0].tag)
    first.wait_for(4)
    assert queue_counts(publisher, "prefetch") == (3, 2)
    assert len(second.settle()) == 3 and len(first.got) == 4


def test_prefetch_global_is_channel_wide(amqp: AmqpBroker, pikas: PikaClients) -> None:
    publisher = pikas.channel()
    publisher.queue_declare("gq1")
    publisher.queue_declare("gq2")
    publish_n(publisher, "gq1", 5)
    publish_n(publisher, "gq2", 5)
    channel = pikas.channel()
    channel.basic_qos(prefetch_count=4, global_qos=True)
    one = consumer(channel, "gq1")
    two = consumer(channel, "gq2")
    conn = channel.connection
    pump_until(conn, lambda: len(one.got) + len(two.got) >= 4, "4 deliveries")
    assert queue_counts(publisher, "gq1")[0] + queue_counts(publisher, "gq2")[0] == 6
    one.settle()
    assert len(one.got) + len(two.got) == 4

    settled = (one.got or two.got)[0]
    channel.basic_ack(settled.tag)
    pump_until(conn, lambda: len(one.got) + len(two.got) >= 5, "a 5th delivery")
    assert queue_counts(publisher, "gq1")[0] + queue_counts(publisher, "gq2")[0] == 5


def test_an_ack_under_a_global_prefetch_refills_the_channels_other_queues(
    tmp_path: Path,
) -> None:
    """The channel-wide window is shared: an ack from one queue's consumer frees room for
    the channel's consumers of other queues too (a lost wake-up otherwise; the
    housekeeping timer, which would hide it, is made too slow to matter)."""
    with amqp_brokers(tmp_path) as make:
        pikas = PikaClients(make(housekeeping_interval_ms=3_600_000).amqp_port, **QUIET)
        try:
            publisher = pikas.channel()
            publisher.queue_declare("gw1")
            publisher.queue_declare("gw2")
            publish_n(publisher, "gw1", 1)
            publish_n(publisher, "gw2", 2)
            channel = pikas.channel()
            channel.basic_qos(prefetch_count=1, global_qos=True)
            one = consumer(channel, "gw1")
            one.wait_for(1)
            two = consumer(channel, "gw2")  # the channel's window is full: nothing yet
            assert len(two.settle()) == 0
            channel.basic_ack(one.got[0].tag)  # gw1 is empty now; gw2's consumer has room
            two.wait_for(1)
            channel.basic_ack(two.got[0].tag)
            two.wait_for(2)
        finally:
            pikas.close_all()


def test_round_robin_between_two_consumers(pikas: PikaClients) -> None:
    publisher = pikas.channel()
    publisher.queue_declare("rr")
    a = consumer(pikas.channel(), "rr", auto_ack=True)
    b = consumer(pikas.channel(), "rr", auto_ack=True)
    assert queue_counts(publisher, "rr") == (0, 2)
    bodies = publish_n(publisher, "rr", 10)
    a.wait_for(5)
    b.wait_for(5)
    assert len(a.settle()) == 5 and len(b.settle()) == 5
    assert sorted(a.bodies + b.bodies) == sorted(bodies)
    # Strict alternation: one consumer has the even messages, the other the odd ones.
    assert {tuple(a.bodies), tuple(b.bodies)} == {tuple(bodies[0::2]), tuple(bodies[1::2])}


# --------------------------------------------------------------------------------------------
# Queue arguments: x-message-ttl, x-max-length / x-overflow


def test_message_ttl_expires_messages_that_are_never_delivered(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("ttl", arguments={"x-message-ttl": 100})
    holder = pikas.channel()
    holder.basic_qos(prefetch_count=1)
    publish_n(channel, "ttl", 1, prefix="held")
    collector = consumer(holder, "ttl")
    (held,) = collector.wait_for(1)
    publish_n(channel, "ttl", 4, prefix="late")
    assert queue_counts(channel, "ttl")[0] == 4
    wait_until(lambda: queue_counts(channel, "ttl")[0] == 0, "the queued messages expired")
    holder.basic_ack(held.tag)
    assert len(collector.settle()) == 1
    assert channel.basic_get("ttl")[0] is None
    # A fresh message is delivered as usual.
    channel.basic_publish("", "ttl", b"fresh")
    assert [d.body for d in collector.wait_for(2)] == [b"held0", b"fresh"]


def test_max_length_drop_head_drops_the_oldest(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("maxlen", arguments={"x-max-length": 3})
    publish_n(channel, "maxlen", 5)
    assert queue_counts(channel, "maxlen") == (3, 0)
    assert get_all(channel, "maxlen") == [b"m2", b"m3", b"m4"]


def test_max_length_reject_publish_nacks_with_confirms(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("maxrej", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    channel.basic_publish("", "maxrej", b"a")
    channel.basic_publish("", "maxrej", b"b")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "maxrej", b"c")
    assert channel.is_open
    assert get_all(channel, "maxrej") == [b"a", b"b"]
    channel.basic_publish("", "maxrej", b"d")  # room again: acked
    assert get_all(channel, "maxrej") == [b"d"]


# --------------------------------------------------------------------------------------------
# Publisher confirms


async def test_confirms_pika_asyncio_every_publish_acked_once(
    broker_factory: BrokerFactory,
) -> None:
    """pika's asyncio adapter: the acks (some with ``multiple``) cover every publish once."""
    broker = await broker_factory()
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[AsyncioConnection] = loop.create_future()
    total = 300
    acked: list[int] = []
    nacked: list[int] = []
    multiples: list[bool] = []
    done = loop.create_future()
    state = {"confirmed_upto": 0}

    def on_confirm(frame: Any) -> None:
        method = frame.method
        tag = method.delivery_tag
        if method.multiple:
            multiples.append(True)
            covered = list(range(state["confirmed_upto"] + 1, tag + 1))
        else:
            covered = [tag]
        state["confirmed_upto"] = max(state["confirmed_upto"], tag)
        (acked if isinstance(method, pika.spec.Basic.Ack) else nacked).extend(covered)
        if len(acked) + len(nacked) >= total and not done.done():
            done.set_result(None)

    def on_channel(channel: Any) -> None:
        def on_declared(_frame: Any) -> None:
            channel.confirm_delivery(on_confirm)
            for i in range(total):
                channel.basic_publish("", "confirms", f"c{i}".encode())

        channel.queue_declare("confirms", callback=on_declared)

    def on_open(connection: AsyncioConnection) -> None:
        opened.set_result(connection)
        connection.channel(on_open_callback=on_channel)

    def on_error(_connection: Any, error: BaseException) -> None:
        if not opened.done():
            opened.set_exception(error)

    connection = AsyncioConnection(
        pika_params(port_of(broker), **QUIET),
        on_open_callback=on_open,
        on_open_error_callback=on_error,
        custom_ioloop=loop,
    )
    try:
        async with asyncio.timeout(WAIT * 2):
            await opened
            await done
        assert nacked == []
        assert sorted(acked) == list(range(1, total + 1))  # each exactly once
    finally:
        if connection.is_open:
            closed = loop.create_future()
            connection.add_on_close_callback(lambda *_: closed.set_result(None))
            connection.close()
            async with asyncio.timeout(WAIT):
                await closed
    assert broker.manager.queues["confirms"].message_count == total


async def test_confirms_aio_pika_and_durable_persistent(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory()
    async with asyncio.timeout(WAIT * 3):
        connection = await aio_pika.connect(host="127.0.0.1", port=port_of(broker), timeout=WAIT)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            transient = await channel.declare_queue("aio-confirm")
            durable = await channel.declare_queue("aio-durable", durable=True)
            results = await asyncio.gather(
                *(
                    channel.default_exchange.publish(aio_pika.Message(b"t%d" % i), "aio-confirm")
                    for i in range(100)
                )
            )
            assert all(isinstance(r, commands.Basic.Ack) for r in results)
            persistent = await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        aio_pika.Message(
                            b"p%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                        ),
                        "aio-durable",
                    )
                    for i in range(20)
                )
            )
            assert all(isinstance(r, commands.Basic.Ack) for r in persistent)
            declared = await channel.declare_queue("aio-confirm", passive=True)
            assert declared.declaration_result.message_count == 100
            del transient
            bodies = []
            for _ in range(20):
                message = await durable.get(timeout=WAIT, fail=True)
                assert message is not None
                assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
                bodies.append(message.body)
                await message.ack()
            assert bodies == [b"p%d" % i for i in range(20)]


def test_confirms_pika_blocking_durable_persistent(pikas: PikaClients) -> None:
    channel = pikas.channel()
    channel.queue_declare("durable-confirm", durable=True)
    channel.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
    for i in range(10):
        channel.basic_publish("", "durable-confirm", b"d%d" % i, persistent)  # raises on nack
    got = [get(channel, "durable-confirm") for _ in range(10)]
    assert [d.body for d in got] == [b"d%d" % i for i in range(10)]
    assert all(d.properties.delivery_mode == 2 for d in got)


# --------------------------------------------------------------------------------------------
# Transactions


def test_tx_publishes_are_invisible_until_commit(pikas: PikaClients) -> None:
    observer = pikas.channel()
    observer.queue_declare("txq")
    tx = pikas.channel()
    tx.tx_select()
    publish_n(tx, "txq", 3, prefix="t")
    assert queue_counts(observer, "txq") == (0, 0)
    tx.tx_commit()
    assert queue_counts(observer, "txq") == (3, 0)

    publish_n(tx, "txq", 2, prefix="rolled")
    tx.tx_rollback()
    tx.tx_commit()  # nothing left to commit
    assert queue_counts(observer, "txq") == (3, 0)
    assert get_all(observer, "txq") == [b"t0", b"t1", b"t2"]


def test_tx_acks_apply_at_commit(amqp: AmqpBroker, pikas: PikaClients) -> None:
    publisher = pikas.channel()
    publisher.queue_declare("txack")
    publish_n(publisher, "txack", 4)
    tx = pikas.channel()
    tx.tx_select()
    first = [get(tx, "txack", auto_ack=False) for _ in range(2)]
    tx.basic_ack(first[1].tag, multiple=True)
    assert amqp.unacked("txack") == 2  # not yet
    tx.tx_commit()
    assert amqp.unacked("txack") == 0

    second = [get(tx, "txack", auto_ack=False) for _ in range(2)]
    tx.basic_ack(second[0].tag)
    tx.basic_reject(second[1].tag, requeue=False)
    tx.tx_rollback()
    assert amqp.unacked("txack") == 2  # the acks were discarded, the messages still held
    tx.close()
    again = [get(publisher, "txack") for _ in range(2)]
    assert [d.body for d in again] == [b"m2", b"m3"]
    assert all(d.redelivered for d in again)


# --------------------------------------------------------------------------------------------
# Flow control: a slow consumer, the memory high watermark


def test_slow_consumer_leaves_messages_in_the_queue(tmp_path: Path) -> None:
    limit = 64 * 1024
    with amqp_brokers(tmp_path) as make:
        broker = make(write_buffer_high_bytes=limit)
        pikas = PikaClients(broker.amqp_port, **QUIET)
        raw = RawAmqp(broker.amqp_port, rcvbuf=32 * 1024)
        try:
            raw.open()
            raw.rpc(1, commands.Queue.Declare(queue="slow"), commands.Queue.DeclareOk)
            raw.rpc(1, commands.Basic.Qos(prefetch_count=60_000), commands.Basic.QosOk)
            raw.rpc(
                1,
                commands.Basic.Consume(queue="slow", consumer_tag="slow"),
                commands.Basic.ConsumeOk,
            )
            # The consumer now stops reading its socket.
            publisher = pikas.channel()
            body = b"s" * 32 * 1024
            published = 0
            ready = 0
            while ready < 100:
                assert published < 4096, "messages never started waiting in the queue"
                for _ in range(64):
                    publisher.basic_publish("", "slow", body)
                published += 64
                ready, consumers = queue_counts(publisher, "slow")
                assert consumers == 1
            # New messages wait there. The kernel may still take some more for the consumer
            # now and then (loopback send buffers grow on their own), but not everything.
            grown = ready
            for _ in range(10):
                for _ in range(64):
                    publisher.basic_publish("", "slow", body)
                published += 64
                ready = queue_counts(publisher, "slow")[0]
                if ready > grown + 64:
                    break
            assert ready > grown + 64, (ready, grown, published)
            # What the broker holds for the consumer's socket is bounded by its write buffer
            # limit (its own pending output and the transport's, each at most the limit plus
            # the delivery that crossed it), whatever was published.
            held = max(broker.buffered_output().values())
            assert held <= 2 * (limit + len(body) + 1024), held
            assert held < published * len(body) // 10

            # The consumer reads again: everything arrives, in order.
            tags = []
            for _ in range(published):
                deliver, _header, got = raw.message(1)
                assert got == body
                tags.append(deliver.delivery_tag)
                if len(tags) % 256 == 0:
                    raw.method(1, commands.Basic.Ack(delivery_tag=tags[-1], multiple=True))
            raw.method(1, commands.Basic.Ack(delivery_tag=tags[-1], multiple=True))
            assert tags == list(range(1, published + 1))
            wait_until(lambda: queue_counts(publisher, "slow") == (0, 1), "queue drained")
            assert broker.unacked("slow") == 0
        finally:
            raw.close()
            pikas.close_all()


def _fill_until_blocked(broker: AmqpBroker, channel: Any, queue: str) -> int:
    """Confirmed publishes until the broker is over its memory high watermark."""
    body = b"w" * 4096
    for published in range(1, 1000):
        channel.basic_publish("", queue, body)
        if broker.memory()[1]:
            return published
    raise AssertionError("the memory high watermark was never reached")


def test_memory_high_watermark_blocks_and_unblocks_publishers(tmp_path: Path) -> None:
    with amqp_brokers(tmp_path) as make:
        broker = make(memory_high_watermark_bytes=64 * 1024)
        pikas = PikaClients(broker.amqp_port, **QUIET)
        try:
            publisher_conn = pikas.connect(blocked_connection_timeout=60)
            events: list[str] = []
            publisher_conn.add_on_connection_blocked_callback(
                lambda _c, frame: events.append(f"blocked:{frame.method.reason}")
            )
            publisher_conn.add_on_connection_unblocked_callback(
                lambda _c, _frame: events.append("unblocked")
            )
            publisher = publisher_conn.channel()
            publisher.queue_declare("mem")
            publisher.confirm_delivery()
            published = _fill_until_blocked(broker, publisher, "mem")

            pump_until(publisher_conn, lambda: bool(events), "connection.blocked")
            assert events == ["blocked:memory high watermark"]

            # A consumer (manual acks, on another connection) drains the queue.
            drainer = pikas.channel()
            collector = consumer(drainer, "mem")
            got = collector.wait_for(published)
            drainer.basic_ack(got[-1].tag, multiple=True)
            pump_until(publisher_conn, lambda: len(events) == 2, "connection.unblocked")
            assert events == ["blocked:memory high watermark", "unblocked"]
            assert not broker.memory()[1]

            # The publisher goes on (a confirmed publish).
            publisher.basic_publish("", "mem", b"after")
            assert collector.wait_for(published + 1)[-1].body == b"after"
        finally:
            pikas.close_all()


def test_memory_alarm_does_not_stop_a_consumer_acking(tmp_path: Path) -> None:
    """While the broker is over its watermark, a connection that only consumes must still be
    read (its acks are what frees memory), as in RabbitMQ, where only publishers block."""
    with amqp_brokers(tmp_path) as make:
        broker = make(memory_high_watermark_bytes=64 * 1024)
        pikas = PikaClients(broker.amqp_port, **QUIET)
        try:
            publisher = pikas.channel()
            publisher.queue_declare("mem2")
            publisher.confirm_delivery()
            published = _fill_until_blocked(broker, publisher, "mem2")
            drainer = pikas.channel()
            drainer.basic_qos(prefetch_count=5)
            collector = consumer(drainer, "mem2")
            for count in range(1, published + 1):
                got = collector.wait_for(count)
                drainer.basic_ack(got[count - 1].tag)
            assert len(collector.settle()) == published
            wait_until(lambda: not broker.memory()[1], "memory alarm cleared")
        finally:
            pikas.close_all()
