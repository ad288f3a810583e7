"""Issue 16: 8 MiB and 64 MiB messages through every protocol and across protocols, durable and
transient, with real clients (paho-mqtt, pika, the client library) on a real server process;
what arrives has the sha256 of what was sent.

A few 64 MiB cases, not a matrix (CI time): each protocol sends one and receives one. Binary
payloads cross into VibeMQ as base64 and come back out as the same bytes (docs/mqtt.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from bigkit import MIB, AmqpEnd, MqttEnd, NativeEnd, blob, close_all, sha
from serverproc import ServerProcess


@dataclass(frozen=True)
class Case:
    src: str
    dst: str
    mib: int
    durable: bool

    @property
    def id(self) -> str:
        return (
            f"{self.src}-to-{self.dst}-{self.mib}MiB-{'durable' if self.durable else 'transient'}"
        )


CASES = [
    Case("mqtt", "mqtt", 8, False),
    Case("mqtt", "mqtt", 8, True),
    Case("amqp", "amqp", 8, True),
    Case("amqp", "amqp", 8, False),
    Case("native", "native", 8, True),
    Case("mqtt", "amqp", 8, False),
    Case("mqtt", "native", 8, True),
    Case("amqp", "mqtt", 8, True),
    Case("amqp", "native", 8, False),
    Case("native", "mqtt", 8, False),
    Case("native", "amqp", 8, True),
    # 64 MiB: each protocol sends one and receives one.
    Case("amqp", "native", 64, True),
    Case("native", "mqtt", 64, False),
    Case("mqtt", "amqp", 64, True),
]


@pytest.fixture
def big_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server process whose native queues are durable or not per the case (the native
    protocol has no per-queue durability: the broker's default)."""
    s = ServerProcess(tmp_path, tmp_path / "data")
    try:
        yield s
    finally:
        s.kill()


def _start(server: ServerProcess, durable: bool) -> ServerProcess:
    return server.start(VIBEMQ_QUEUE_DEFAULTS__DURABLE=str(durable).lower())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_big_message_arrives_whole(big_server: ServerProcess, case: Case) -> None:
    server = _start(big_server, case.durable)
    mqtt_port, amqp_port, port = server.ports["mqtt"], server.amqp_port, server.ports["vibemq"]
    address = f"big.{case.src}{case.dst}"
    payload = blob(case.mib * MIB, case.mib)
    ends: list[Any] = []
    try:
        # The receiving side first: a subscription, a queue.
        mqtt_sub: MqttEnd | None = None
        client_id = f"big-sub-{case.src}"
        if case.dst == "mqtt":
            mqtt_sub = MqttEnd(mqtt_port, durable=case.durable, client_id=client_id)
            mqtt_sub.subscribe(address)
            if case.durable:  # the message waits in the session's durable queue meanwhile
                mqtt_sub.close()
                mqtt_sub = None
            else:
                ends.append(mqtt_sub)
        elif case.dst == "amqp":
            consumer = AmqpEnd(amqp_port)
            ends.append(consumer)
            consumer.declare(address, durable=case.durable, bind=case.src != "native")
        else:
            NativeEnd(port).declare(address)

        if case.src == "mqtt":
            publisher = MqttEnd(mqtt_port)
            ends.append(publisher)
            publisher.send(address, payload)
        elif case.src == "amqp":
            amqp_pub = AmqpEnd(amqp_port)
            ends.append(amqp_pub)
            exchange = "amq.topic" if case.dst == "mqtt" else ""
            amqp_pub.send(address, payload, exchange=exchange, durable=case.durable)
        else:
            NativeEnd(port).send(address, payload, binary=True)

        if case.dst == "mqtt":
            if mqtt_sub is None:  # the persistent session comes back for it
                mqtt_sub = MqttEnd(mqtt_port, durable=True, client_id=client_id)
                ends.append(mqtt_sub)
            got = mqtt_sub.receive()
        elif case.dst == "amqp":
            got = consumer.receive(address)
        else:
            got = NativeEnd(port).receive(address)
        assert len(got) == len(payload)
        assert sha(got) == sha(payload)
    finally:
        close_all(ends)
