"""AMQP 0-9-1 queue arguments against a real broker with pika: dead-lettering
(x-dead-letter-exchange, x-dead-letter-routing-key, ``x-death``, reject-publish-dlx),
per-message ``expiration``, x-max-priority, x-expires, x-max-length-bytes, and durable queue
arguments across an in-process broker restart on the same data directory.

Every wait is bounded (``WAIT``); sleeps only let a message's own TTL run out, they never
measure the broker.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

import pika
import pika.adapters.blocking_connection as blocking
import pika.exceptions
import pytest
from amqputil import (
    AmqpBroker,
    PikaClients,
    assert_empty,
    consume,
    get_message,
    queue_counts,
)
from waits import wait_until

pytestmark = pytest.mark.timeout(60)


def dead_letter_setup(ch: blocking.BlockingChannel, dead: str = "dead") -> None:
    """A fanout exchange ``dlx`` with the queue ``dead`` bound to it."""
    ch.exchange_declare("dlx", "fanout")
    ch.queue_declare(dead)
    ch.queue_bind(dead, "dlx")


def reject_one(ch: blocking.BlockingChannel, queue: str) -> bytes:
    """basic.get with manual ack, then reject without requeue; the body."""
    method, _props, body = get_message(ch, queue, auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=False)
    return body


def deaths(props: pika.BasicProperties) -> list[dict[str, Any]]:
    headers = props.headers or {}
    value = headers.get("x-death")
    assert isinstance(value, list) and value, f"no x-death header in {headers!r}"
    return value


def assert_first_death(
    props: pika.BasicProperties, *, reason: str, queue: str, exchange: str, keys: list[str]
) -> dict[str, Any]:
    death = deaths(props)[0]
    assert death["count"] == 1
    assert death["reason"] == reason
    assert death["queue"] == queue
    assert death["exchange"] == exchange
    assert death["routing-keys"] == keys
    assert isinstance(death["time"], datetime.datetime)
    headers = props.headers or {}
    assert headers["x-first-death-exchange"] == exchange
    assert headers["x-first-death-queue"] == queue
    assert headers["x-first-death-reason"] == reason
    return death


# --------------------------------------------------------------------------------------------
# (1) dead-lettering


def test_rejected_message_is_dead_lettered_with_x_death(ch: blocking.BlockingChannel) -> None:
    dead_letter_setup(ch)
    ch.exchange_declare("work", "direct")
    ch.queue_declare("src", arguments={"x-dead-letter-exchange": "dlx"})
    ch.queue_bind("src", "work", "k1")
    ch.basic_publish(
        "work",
        "k1",
        b"bad",
        pika.BasicProperties(headers={"mine": "kept"}, content_type="text/plain"),
    )
    assert reject_one(ch, "src") == b"bad"

    _method, props, body = get_message(ch, "dead")
    assert body == b"bad"
    assert props.content_type == "text/plain"
    assert (props.headers or {})["mine"] == "kept"
    death = assert_first_death(props, reason="rejected", queue="src", exchange="work", keys=["k1"])
    assert "original-expiration" not in death
    assert len(deaths(props)) == 1
    assert_empty(ch, "src")


def test_nack_without_requeue_is_dead_lettered(ch: blocking.BlockingChannel) -> None:
    dead_letter_setup(ch)
    ch.queue_declare("src", arguments={"x-dead-letter-exchange": "dlx"})
    ch.basic_publish("", "src", b"nacked")
    method, _props, _body = get_message(ch, "src", auto_ack=False)
    ch.basic_nack(method.delivery_tag, requeue=False)
    _method, props, body = get_message(ch, "dead")
    assert body == b"nacked"
    assert_first_death(props, reason="rejected", queue="src", exchange="", keys=["src"])


def test_reject_with_requeue_is_not_dead_lettered(ch: blocking.BlockingChannel) -> None:
    dead_letter_setup(ch)
    ch.queue_declare("src", arguments={"x-dead-letter-exchange": "dlx"})
    ch.basic_publish("", "src", b"again")
    method, _props, _body = get_message(ch, "src", auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, _props, body = get_message(ch, "src", auto_ack=True)
    assert body == b"again" and method.redelivered
    assert_empty(ch, "dead")


def test_queue_ttl_expiry_is_dead_lettered(ch: blocking.BlockingChannel) -> None:
    dead_letter_setup(ch)
    ch.queue_declare("ttlq", arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 50})
    ch.basic_publish("", "ttlq", b"old")
    _method, props, body = get_message(ch, "dead")
    assert body == b"old"
    death = assert_first_death(props, reason="expired", queue="ttlq", exchange="", keys=["ttlq"])
    assert "original-expiration" not in death
    assert_empty(ch, "ttlq")


def test_per_message_expiration_is_dead_lettered(ch: blocking.BlockingChannel) -> None:
    dead_letter_setup(ch)
    ch.queue_declare("pmq", arguments={"x-dead-letter-exchange": "dlx"})
    ch.basic_publish("", "pmq", b"short-lived", pika.BasicProperties(expiration="50"))
    _method, props, body = get_message(ch, "dead")
    assert body == b"short-lived"
    death = assert_first_death(props, reason="expired", queue="pmq", exchange="", keys=["pmq"])
    assert death["original-expiration"] == "50"
    # The dead letter itself no longer carries the per-message TTL.
    assert props.expiration is None
    assert_empty(ch, "pmq")


def test_max_length_drop_head_is_dead_lettered(ch: blocking.BlockingChannel) -> None:
    dead_letter_setup(ch)
    ch.queue_declare("mlq", arguments={"x-dead-letter-exchange": "dlx", "x-max-length": 1})
    ch.basic_publish("", "mlq", b"first")
    ch.basic_publish("", "mlq", b"second")
    _method, props, body = get_message(ch, "dead")
    assert body == b"first"
    assert_first_death(props, reason="maxlen", queue="mlq", exchange="", keys=["mlq"])
    _method, _props, body = get_message(ch, "mlq")
    assert body == b"second"
    assert_empty(ch, "dead")


def test_dead_letter_routing_key_overrides_the_key(ch: blocking.BlockingChannel) -> None:
    ch.exchange_declare("dlx-direct", "direct")
    ch.queue_declare("dead-other")
    ch.queue_bind("dead-other", "dlx-direct", "other")
    ch.queue_declare("dead-original")
    ch.queue_bind("dead-original", "dlx-direct", "src")
    ch.queue_declare(
        "src",
        arguments={
            "x-dead-letter-exchange": "dlx-direct",
            "x-dead-letter-routing-key": "other",
        },
    )
    ch.basic_publish("", "src", b"rerouted")
    reject_one(ch, "src")
    method, props, body = get_message(ch, "dead-other")
    assert body == b"rerouted"
    assert method.routing_key == "other"
    assert method.exchange == "dlx-direct"
    # x-death keeps the key the message was published with.
    assert_first_death(props, reason="rejected", queue="src", exchange="", keys=["src"])
    assert_empty(ch, "dead-original")


def test_dead_lettering_without_routing_key_keeps_the_original_key(
    ch: blocking.BlockingChannel,
) -> None:
    ch.exchange_declare("dlx-direct", "direct")
    ch.queue_declare("dead-original")
    ch.queue_bind("dead-original", "dlx-direct", "orig")
    ch.exchange_declare("work", "direct")
    ch.queue_declare("src", arguments={"x-dead-letter-exchange": "dlx-direct"})
    ch.queue_bind("src", "work", "orig")
    ch.basic_publish("work", "orig", b"same-key")
    reject_one(ch, "src")
    method, _props, body = get_message(ch, "dead-original")
    assert body == b"same-key"
    assert method.routing_key == "orig"


def test_dead_lettering_twice_through_a_queue_counts(ch: blocking.BlockingChannel) -> None:
    # A dead-letters to B through the default exchange, B back to A.
    ch.queue_declare(
        "qa", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "qb"}
    )
    ch.queue_declare(
        "qb", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "qa"}
    )
    ch.basic_publish("", "qa", b"ping-pong")
    reject_one(ch, "qa")  # A -> B
    reject_one(ch, "qb")  # B -> A
    reject_one(ch, "qa")  # A -> B again
    _method, props, body = get_message(ch, "qb")
    assert body == b"ping-pong"
    got = deaths(props)
    assert len(got) == 2, got
    by_queue = {(d["queue"], d["reason"]): d for d in got}
    assert by_queue[("qa", "rejected")]["count"] == 2
    assert by_queue[("qb", "rejected")]["count"] == 1
    # The most recent death comes first.
    assert got[0]["queue"] == "qa"
    headers = props.headers or {}
    assert headers["x-first-death-queue"] == "qa"
    assert headers["x-first-death-reason"] == "rejected"
    assert headers["x-first-death-exchange"] == ""
    assert_empty(ch, "qa")


def test_reject_publish_dlx_nacks_and_dead_letters(ch: blocking.BlockingChannel) -> None:
    dead_letter_setup(ch)
    ch.queue_declare(
        "full",
        arguments={
            "x-dead-letter-exchange": "dlx",
            "x-max-length": 1,
            "x-overflow": "reject-publish-dlx",
        },
    )
    ch.confirm_delivery()
    ch.basic_publish("", "full", b"fits")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", "full", b"refused")
    _method, props, body = get_message(ch, "dead")
    assert body == b"refused"
    assert_first_death(props, reason="maxlen", queue="full", exchange="", keys=["full"])
    # The queue kept the older message.
    _method, _props, body = get_message(ch, "full")
    assert body == b"fits"
    assert_empty(ch, "full")


def test_reject_publish_does_not_dead_letter(ch: blocking.BlockingChannel) -> None:
    dead_letter_setup(ch)
    ch.queue_declare(
        "full",
        arguments={
            "x-dead-letter-exchange": "dlx",
            "x-max-length": 1,
            "x-overflow": "reject-publish",
        },
    )
    ch.confirm_delivery()
    ch.basic_publish("", "full", b"fits")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", "full", b"refused")
    assert_empty(ch, "dead")
    _method, _props, body = get_message(ch, "full")
    assert body == b"fits"


def test_dead_letter_to_missing_exchange_is_dropped(ch: blocking.BlockingChannel) -> None:
    ch.queue_declare("src", arguments={"x-dead-letter-exchange": "nowhere"})
    ch.basic_publish("", "src", b"lost")
    reject_one(ch, "src")
    assert_empty(ch, "src")
    # The channel and the queue still work.
    ch.basic_publish("", "src", b"next")
    _method, _props, body = get_message(ch, "src")
    assert body == b"next"


# --------------------------------------------------------------------------------------------
# (2) per-message expiration without a queue TTL


def test_expired_message_at_the_head_is_never_delivered_by_get(
    ch: blocking.BlockingChannel,
) -> None:
    ch.queue_declare("q")
    ch.basic_publish("", "q", b"stale", pika.BasicProperties(expiration="20"))
    ch.basic_publish("", "q", b"fresh")
    ch.basic_publish("", "q", b"long", pika.BasicProperties(expiration="60000"))
    time.sleep(0.2)  # let the 20 ms TTL run out (not a measurement of the broker)
    _method, _props, body = get_message(ch, "q")
    assert body == b"fresh"
    _method, props, body = get_message(ch, "q")
    assert body == b"long"
    assert props.expiration == "60000"
    assert_empty(ch, "q")


def test_expired_message_at_the_head_is_never_delivered_to_a_consumer(
    ch: blocking.BlockingChannel,
) -> None:
    ch.queue_declare("q")
    ch.basic_publish("", "q", b"stale", pika.BasicProperties(expiration="20"))
    ch.basic_publish("", "q", b"fresh")
    time.sleep(0.2)
    got = [body for _method, _props, body in consume(ch, "q", 1)]
    assert got == [b"fresh"]
    assert_empty(ch, "q")


def test_expiration_zero_expires_at_once(ch: blocking.BlockingChannel) -> None:
    ch.queue_declare("q")
    ch.basic_publish("", "q", b"now-or-never", pika.BasicProperties(expiration="0"))
    ch.basic_publish("", "q", b"after")
    time.sleep(0.05)
    _method, _props, body = get_message(ch, "q")
    assert body == b"after"


# --------------------------------------------------------------------------------------------
# (3) x-max-priority


def test_max_priority_orders_by_priority(ch: blocking.BlockingChannel) -> None:
    ch.queue_declare("pq", arguments={"x-max-priority": 10})
    for priority in (1, 9, 5, 0):
        ch.basic_publish("", "pq", f"p{priority}".encode(), pika.BasicProperties(priority=priority))
    got = [get_message(ch, "pq")[2] for _ in range(4)]
    assert got == [b"p9", b"p5", b"p1", b"p0"]
    assert_empty(ch, "pq")


def test_max_priority_equal_priorities_stay_fifo(ch: blocking.BlockingChannel) -> None:
    ch.queue_declare("pq", arguments={"x-max-priority": 10})
    # No priority property counts as priority 0.
    sent = [("a", 5), ("b", 9), ("c", 5), ("d", None), ("e", 9), ("f", 5), ("g", None)]
    for body, priority in sent:
        ch.basic_publish("", "pq", body.encode(), pika.BasicProperties(priority=priority))
    got = [get_message(ch, "pq")[2] for _ in range(len(sent))]
    assert got == [b"b", b"e", b"a", b"c", b"f", b"d", b"g"]


def test_max_priority_order_for_a_consumer(ch: blocking.BlockingChannel) -> None:
    ch.queue_declare("pq", arguments={"x-max-priority": 10})
    # (Distinct bands: the broker folds 0..10 onto four levels, so 9 and 10 would tie.)
    for priority in (1, 9, 5, 0, 7):
        ch.basic_publish("", "pq", f"p{priority}".encode(), pika.BasicProperties(priority=priority))
    # The queue has all five before the consumer starts (basic.get is synchronous).
    assert queue_counts(ch, "pq") == (5, 0)
    got = [body for _method, _props, body in consume(ch, "pq", 5)]
    assert got == [b"p9", b"p7", b"p5", b"p1", b"p0"]


def test_max_priority_out_of_range_is_refused(amqp: AmqpBroker, clients: PikaClients) -> None:
    ch = clients.connect(amqp.amqp_port).channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("pq", arguments={"x-max-priority": 256})
    assert info.value.reply_code == 406


# --------------------------------------------------------------------------------------------
# (4) x-expires


def queue_gone(conn: pika.BlockingConnection, name: str) -> bool:
    """A passive declare on a fresh channel: True when the broker answers 404."""
    channel = conn.channel()
    try:
        channel.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return True
    channel.close()
    return False


def test_unused_queue_expires_and_used_one_does_not(amqp: AmqpBroker, clients: PikaClients) -> None:
    conn = clients.connect(amqp.amqp_port)
    ch = conn.channel()
    ch.queue_declare("kept", arguments={"x-expires": 300})
    ch.basic_consume("kept", lambda *_a: None, auto_ack=True, consumer_tag="keeper")
    ch.queue_declare("expiring", arguments={"x-expires": 300})
    ch.basic_publish("", "expiring", b"goes with the queue")

    wait_until(lambda: not amqp.has_queue("expiring"), "the unused queue expires")
    assert queue_gone(conn, "expiring")
    # Declared before the expired one, but its consumer keeps it in use.
    assert not queue_gone(conn, "kept")
    assert amqp.has_queue("kept")

    # Without its consumer it expires too.
    ch.basic_cancel("keeper")
    wait_until(lambda: not amqp.has_queue("kept"), "the queue expires after its consumer left")
    assert queue_gone(conn, "kept")


def test_redeclare_resets_x_expires(amqp: AmqpBroker, clients: PikaClients) -> None:
    conn = clients.connect(amqp.amqp_port)
    ch = conn.channel()
    ch.queue_declare("renewed", arguments={"x-expires": 1000})
    # Redeclaring it (passively, or with the same arguments) keeps it in use.
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        ch.queue_declare("renewed", arguments={"x-expires": 1000})
        time.sleep(0.1)
    assert amqp.has_queue("renewed")
    wait_until(lambda: not amqp.has_queue("renewed"), "the queue expires once left alone")


def test_x_expires_must_be_positive(amqp: AmqpBroker, clients: PikaClients) -> None:
    ch = clients.connect(amqp.amqp_port).channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("bad", arguments={"x-expires": 0})
    assert info.value.reply_code == 406


# --------------------------------------------------------------------------------------------
# (5) x-max-length-bytes


def body(i: int) -> bytes:
    """A JSON string of 6 bytes (stored as is, so its size is exact)."""
    return b'"m%03d"' % i


def test_max_length_bytes_drop_head_keeps_the_newest(ch: blocking.BlockingChannel) -> None:
    ch.queue_declare("bytesq", arguments={"x-max-length-bytes": 18})  # three bodies
    for i in range(6):
        ch.basic_publish("", "bytesq", body(i))
    assert queue_counts(ch, "bytesq") == (3, 0)
    got = [get_message(ch, "bytesq")[2] for _ in range(3)]
    assert got == [body(3), body(4), body(5)]
    assert_empty(ch, "bytesq")


def test_max_length_bytes_drop_head_dead_letters(ch: blocking.BlockingChannel) -> None:
    dead_letter_setup(ch)
    ch.queue_declare(
        "bytesq", arguments={"x-max-length-bytes": 12, "x-dead-letter-exchange": "dlx"}
    )
    for i in range(3):
        ch.basic_publish("", "bytesq", body(i))
    _method, props, got = get_message(ch, "dead")
    assert got == body(0)
    assert deaths(props)[0]["reason"] == "maxlen"
    assert [get_message(ch, "bytesq")[2] for _ in range(2)] == [body(1), body(2)]


def test_max_length_bytes_reject_publish_nacks(ch: blocking.BlockingChannel) -> None:
    ch.queue_declare("bytesq", arguments={"x-max-length-bytes": 12, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", "bytesq", body(0))
    ch.basic_publish("", "bytesq", body(1))
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", "bytesq", body(2))
    assert queue_counts(ch, "bytesq") == (2, 0)
    # Room again once one is consumed.
    assert get_message(ch, "bytesq")[2] == body(0)
    ch.basic_publish("", "bytesq", body(3))
    assert [get_message(ch, "bytesq")[2] for _ in range(2)] == [body(1), body(3)]


def test_max_length_bytes_refuses_a_message_bigger_than_the_limit(
    ch: blocking.BlockingChannel,
) -> None:
    ch.queue_declare("bytesq", arguments={"x-max-length-bytes": 4})
    ch.basic_publish("", "bytesq", b'"ab"')
    ch.basic_publish("", "bytesq", body(1))  # 6 bytes can never fit
    assert queue_counts(ch, "bytesq") == (1, 0)
    assert get_message(ch, "bytesq")[2] == b'"ab"'


# --------------------------------------------------------------------------------------------
# (6) durable queue arguments across a restart


def test_durable_dead_letter_arguments_survive_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    src_args = {"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dl"}

    first = AmqpBroker(data)
    first.start()
    pikas = PikaClients()
    try:
        ch = pikas.connect(first.amqp_port).channel()
        ch.exchange_declare("dlx", "direct", durable=True)
        ch.queue_declare("dead", durable=True)
        ch.queue_bind("dead", "dlx", "dl")
        ch.queue_declare("src", durable=True, arguments=src_args)
        ch.confirm_delivery()
        ch.basic_publish("", "src", b"before", pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", "src", b"before-2", pika.BasicProperties(delivery_mode=2))
    finally:
        pikas.close_all()
        first.stop()

    second = AmqpBroker(data)
    second.start()
    pikas = PikaClients()
    try:
        ch = pikas.connect(second.amqp_port).channel()
        # Same arguments: accepted; different ones: 406 PRECONDITION_FAILED.
        ch.queue_declare("src", durable=True, arguments=src_args)
        assert reject_one(ch, "src") == b"before"
        _method, props, got = get_message(ch, "dead")
        assert got == b"before"
        assert_first_death(props, reason="rejected", queue="src", exchange="", keys=["src"])
        # A message published after the restart is dead-lettered as well.
        ch.basic_publish("", "src", b"after", pika.BasicProperties(delivery_mode=2))
        assert reject_one(ch, "src") == b"before-2"
        assert reject_one(ch, "src") == b"after"
        assert [get_message(ch, "dead")[2] for _ in range(2)] == [b"before-2", b"after"]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("src", durable=True, arguments={"x-dead-letter-exchange": "other"})
        assert info.value.reply_code == 406
    finally:
        pikas.close_all()
        second.stop()
