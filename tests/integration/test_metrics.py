"""The Prometheus exposition (``vibemq_server.metrics.render``) after real traffic from real
clients: the native client library, paho-mqtt and pika against a real broker on port 0. The
output is parsed with the Prometheus client's own parser and checked by ``promtool check
metrics`` (Debian's prometheus package, installed by scripts/_system.sh)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pika
import pytest
import zmq
import zmq.asyncio
from amqputil import AmqpBroker, PikaClients
from mqttkit import RawMqtt
from mqttutil import Clients, LogEntries, MakeBroker, Paho
from prometheus_client.parser import text_string_to_metric_families
from waits import wait_for, wait_until

from vibemq_server.client import Client
from vibemq_server.metrics import render
from vibemq_server.server import Broker

HOST = "127.0.0.1"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(broker: AmqpBroker) -> str:
    """One scrape, taken on the broker's own loop (as the HTTP listener will)."""
    body, content_type = broker.call(render)
    assert content_type.startswith("text/plain; version=0.0.4")
    return body.decode()


def parse(text: str) -> Samples:
    """Every sample by (name, labels), with the library's own parser."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {name}{labels}"
    return samples[key]


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def labelled(samples: Samples, name: str, label: str) -> set[str]:
    return {dict(labels)[label] for n, labels in samples if n == name}


def promtool(text: str) -> None:
    """``promtool check metrics``: the exposition parses and follows the naming rules."""
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: scripts/_system.sh installs Debian's prometheus"
    done = subprocess.run(
        [tool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60
    )
    problems = (done.stdout + done.stderr).decode()
    assert done.returncode == 0 and not problems.strip(), problems


# --------------------------------------------------------------------------------------------
# Real traffic of every protocol


async def test_metrics_after_real_traffic_of_every_protocol(
    amqp: AmqpBroker,
    vibemq: Callable[[], Any],
    paho: Callable[[], Paho],
    pikas: PikaClients,
) -> None:
    # Native: 10 publishes, all delivered and acknowledged.
    client: Client = await vibemq()
    for n in range(10):
        await client.publish("m.native", {"n": n})
    sub = await client.subscribe("m.native", prefetch=100)
    for _ in range(10):
        msg = await sub.get(timeout=5)
        await msg.ack()
    # MQTT: 5 QoS 1 publishes, one subscriber gets them.
    listener = paho()
    assert listener.subscribe(("t/#", 1)) == [1]
    talker = paho()
    for n in range(5):
        talker.publish("t/mqtt", f"{n}".encode(), qos=1)
    got = [listener.get() for _ in range(5)]
    assert [m.payload for m in got] == [b"0", b"1", b"2", b"3", b"4"]
    # AMQP: 7 publishes into a queue, 7 basic.get with acks.
    ch = pikas.channel()
    ch.queue_declare("m.amqp", durable=True)
    for n in range(7):
        ch.basic_publish("", "m.amqp", f"{n}".encode())
    for _ in range(7):
        method = None
        for _ in range(500):
            method, _, _ = ch.basic_get("m.amqp")
            if method is not None:
                break
        assert method is not None
        ch.basic_ack(method.delivery_tag)

    def settled() -> bool:
        s = parse(scrape(amqp))
        return (
            value(s, "vibemq_queue_messages_acked_total", queue="m.native") == 10
            and value(s, "vibemq_queue_messages_acked_total", queue="m.amqp") == 7
        )

    wait_until(settled, "acks counted")
    text = scrape(amqp)
    promtool(text)
    s = parse(text)

    # Per queue: the core's own counts.
    for queue, n in (("m.native", 10), ("m.amqp", 7)):
        assert value(s, "vibemq_queue_messages_published_total", queue=queue) == n
        assert value(s, "vibemq_queue_messages_delivered_total", queue=queue) == n
        assert value(s, "vibemq_queue_messages", queue=queue) == 0
        assert value(s, "vibemq_queue_messages_unacked", queue=queue) == 0
        assert value(s, "vibemq_queue_messages_dropped_total", queue=queue) == 0
    assert value(s, "vibemq_queue_consumers", queue="m.native") == 1
    assert value(s, "vibemq_queues_messages_published_total") >= 17
    assert value(s, "vibemq_queues") >= 2

    # Per protocol: messages, bytes, connections.
    assert value(s, "vibemq_messages_received_total", protocol="vibemq") == 10
    assert value(s, "vibemq_messages_sent_total", protocol="vibemq") == 10
    assert value(s, "vibemq_messages_received_total", protocol="mqtt") == 5
    assert value(s, "vibemq_messages_sent_total", protocol="mqtt") == 5
    assert value(s, "vibemq_messages_received_total", protocol="amqp") == 7
    assert value(s, "vibemq_messages_sent_total", protocol="amqp") == 7
    assert value(s, "vibemq_connections", protocol="vibemq") == 1
    assert value(s, "vibemq_connections", protocol="mqtt") == 2
    assert value(s, "vibemq_connections", protocol="amqp") == 1
    for protocol in ("vibemq", "mqtt", "amqp"):
        assert value(s, "vibemq_connections_opened_total", protocol=protocol) >= 1
        # at least the messages' payloads went each way
        assert value(s, "vibemq_received_bytes_total", protocol=protocol) > 0
        assert value(s, "vibemq_sent_bytes_total", protocol=protocol) > 0
    assert value(s, "vibemq_sent_bytes_total", protocol="mqtt") >= 5 * (2 + 6 + 2 + 1)

    # Journal: durable publishes were written and fsynced (fsync = always), in batches.
    assert value(s, "vibemq_journal_written_bytes_total") > 0
    assert value(s, "vibemq_journal_segments") >= 1
    assert value(s, "vibemq_journal_disk_bytes") > 0
    assert value(s, "vibemq_journal_available") == 1
    fsyncs = value(s, "vibemq_journal_fsync_duration_seconds_count")
    assert fsyncs >= 1
    assert value(s, "vibemq_journal_fsync_duration_seconds_bucket", le="+Inf") == fsyncs
    batches = value(s, "vibemq_journal_commit_batch_size_count")
    assert 1 <= batches <= fsyncs
    # every native publish's PublishAck and every AMQP... none confirmed here; MQTT PUBACKs
    # wait only when a durable queue took a copy: at least the 10 native acks were released
    assert value(s, "vibemq_journal_commit_batch_size_sum") >= 10
    assert value(s, "vibemq_journal_recovery_seconds") >= 0

    # Memory and the process.
    assert value(s, "vibemq_memory_alarm") == 0
    assert value(s, "vibemq_memory_high_watermark_bytes") == 512 * 1024 * 1024
    assert value(s, "process_resident_memory_bytes") > 0
    assert value(s, "vibemq_build_info", version=_version()) == 1
    assert {"python_info", "process_cpu_seconds_total"} <= names(s)


def _version() -> str:
    from vibemq_server import __version__

    return __version__


# --------------------------------------------------------------------------------------------
# Errors and refused logins


def test_auth_failures_and_protocol_errors_by_code(
    brokers: Callable[..., AmqpBroker], clients: PikaClients
) -> None:
    broker = brokers(users={"alice": "secret"}, allow_anonymous=False)
    mqtt_bad = Paho(broker.mqtt_port)
    mqtt_bad.username_pw_set("alice", "wrong")
    try:
        assert mqtt_bad.connect().is_failure
    finally:
        mqtt_bad.stop_loop()
    with pytest.raises(pika.exceptions.AMQPError):
        clients.connect(
            broker.amqp_port, credentials=pika.PlainCredentials("alice", "nope"), heartbeat=0
        )
    # A malformed MQTT packet (a reserved packet type) from a raw client.
    raw = RawMqtt(broker.mqtt_port)
    try:
        raw.send(b"\xf0\x00")
        raw.wait_closed()
    finally:
        raw.close()

    def counted() -> bool:
        s = parse(scrape(broker))
        return ("vibemq_protocol_errors_total", frozenset({("protocol", "mqtt")})) in {
            (n, frozenset((k, v) for k, v in labels if k == "protocol"))
            for n, labels in s
            if n == "vibemq_protocol_errors_total"
        }

    wait_until(counted, "the MQTT error counted")
    text = scrape(broker)
    promtool(text)
    s = parse(text)
    assert value(s, "vibemq_auth_failures_total", protocol="mqtt", reason="bad_credentials") == 1
    assert value(s, "vibemq_auth_failures_total", protocol="amqp", reason="bad_credentials") == 1
    assert labelled(s, "vibemq_protocol_errors_total", "code") >= {"reserved_packet_type"}
    assert (
        value(s, "vibemq_protocol_errors_total", protocol="mqtt", code="reserved_packet_type") == 1
    )


# --------------------------------------------------------------------------------------------
# Cardinality: the N deepest queues only, totals over all


async def test_per_queue_series_only_for_the_deepest_queues(
    broker_factory: Callable[..., Any],
) -> None:
    broker: Broker = await broker_factory(metrics={"per_queue_limit": 3})
    manager = broker.manager
    for n in range(10):
        manager.create_queue(f"depth.{n}")
        for i in range(n):
            manager.publish(f"depth.{n}", f"m{i}", b"{}", {})
    body, _ = render(broker)
    s = parse(body.decode())
    assert labelled(s, "vibemq_queue_messages", "queue") == {"depth.9", "depth.8", "depth.7"}
    assert labelled(s, "vibemq_queue_messages_published_total", "queue") == {
        "depth.9",
        "depth.8",
        "depth.7",
    }
    assert value(s, "vibemq_queues_exported") == 3
    assert value(s, "vibemq_queues") == len(manager.queues)
    assert value(s, "vibemq_queues_messages") == sum(range(10))
    assert value(s, "vibemq_queues_messages_published_total") == sum(range(10))

    broker.config.metrics.per_queue_limit = 0
    s = parse(render(broker)[0].decode())
    assert not labelled(s, "vibemq_queue_messages", "queue")
    assert value(s, "vibemq_queues_messages") == sum(range(10))

    broker.config.metrics.per_queue_limit = -1
    s = parse(render(broker)[0].decode())
    assert labelled(s, "vibemq_queue_messages", "queue") == set(manager.queues)


async def test_totals_stay_monotonic_when_a_queue_is_deleted(
    broker_factory: Callable[..., Any],
) -> None:
    broker: Broker = await broker_factory()
    manager = broker.manager
    manager.create_queue("gone")
    for i in range(4):
        manager.publish("gone", f"m{i}", b"{}", {})
    before = value(parse(render(broker)[0].decode()), "vibemq_queues_messages_published_total")
    manager.delete_queue("gone")
    s = parse(render(broker)[0].decode())
    assert value(s, "vibemq_queues_messages_published_total") == before == 4
    assert value(s, "vibemq_queues_messages") == 0


# --------------------------------------------------------------------------------------------
# Drops: counted per queue and logged (README, "When a queue is full")


def test_drop_oldest_drops_are_counted_and_logged_once(
    amqp: AmqpBroker, pikas: PikaClients, broker_log: LogEntries
) -> None:
    ch = pikas.channel()
    ch.queue_declare("small", durable=True, arguments={"x-max-length": 2})
    for n in range(6):
        ch.basic_publish("", "small", f"{n}".encode())

    def dropped() -> float:
        return value(parse(scrape(amqp)), "vibemq_queue_messages_dropped_total", queue="small")

    wait_until(lambda: dropped() == 4, "4 drops counted")
    s = parse(scrape(amqp))
    assert value(s, "vibemq_queue_messages", queue="small") == 2
    lines = [e for e in broker_log if e["event"] == "first message dropped"]
    assert [(e["queue"], e["log_level"]) for e in lines] == [("small", "warning")]


def test_mqtt_session_bound_drops_are_counted_and_logged(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients, broker_log: LogEntries
) -> None:
    """A clean session that does not acknowledge: one QoS 1 message in flight, two waiting,
    the rest dropped by the session's bound (no core queue counts those)."""
    broker = make_mqtt_broker(
        mqtt={"port": 0, "max_inflight": 1, "max_queued_messages": 2, "max_publisher_pause_s": 0.05}
    )
    slow = mqtt_clients.raw(broker.mqtt_port)
    slow.connect("slow")
    assert slow.subscribe("slow/#", 1) == 1
    talker = mqtt_clients.paho(broker.mqtt_port).connected()
    for n in range(8):
        talker.publish("slow/x", f"{n}".encode(), qos=1)

    def dropped() -> float:
        text = broker.call(lambda b: render(b)[0].decode())
        return value(parse(text), "vibemq_messages_dropped_total", protocol="mqtt")

    wait_until(lambda: dropped() == 5, "5 drops counted")
    lines = [e for e in broker_log if e["event"] == "first message dropped"]
    assert [(e.get("client_id"), e["reason"]) for e in lines] == [("slow", "SessionBound")]


async def test_zmq_bridge_messages_are_counted(broker_factory: Callable[..., Any]) -> None:
    broker: Broker = await broker_factory(
        zmq={"pull": "tcp://127.0.0.1:0", "pub": "tcp://127.0.0.1:0"}
    )
    endpoint = broker.ready()["zmq_pull"]
    assert isinstance(endpoint, str)
    ctx = zmq.asyncio.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    try:
        push.connect(endpoint)
        for n in range(3):
            await push.send_multipart([b"zmq.counted", f"{n}".encode()])
        await push.send_multipart([b"", b"no address: dropped"])

        def counts() -> tuple[float, float]:
            s = parse(render(broker)[0].decode())
            return (
                value(s, "vibemq_messages_received_total", protocol="zmq"),
                value(s, "vibemq_messages_dropped_total", protocol="zmq"),
            )

        await wait_for(lambda: counts() == (4, 1), what="the PULL messages counted")
    finally:
        push.close()
        ctx.term()
