"""Issue 15's AMQP figures cross-checked with a real client: pika against RabbitMQ and VibeMQ.

``bench.paths_bench --groups amqp`` drives both brokers with a raw-frame generator. This runs
the same pattern through pika (the client the integration tests use), so that the ratio is
not an artifact of the generator: one publisher process (``BlockingConnection``,
``basic_publish`` of 64-byte bodies to the default exchange, no confirms) and one consumer
process (``basic_qos(prefetch_count=1000)``, ``basic_consume``, ``basic_ack(tag,
multiple=True)`` every N deliveries), alternating brokers per round, medians. pika itself
tops out near 10-15k msg/s, so the client is the limit here: read the broker CPU per
message beside the rates.

    .venv/bin/python -m bench.amqp_client_check --rounds 3 --messages 50000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
import uuid
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import Broker, RabbitMQBroker, VibeMQBroker
from bench.common import cpu_seconds

BODY = b"x" * 64


def _params(port: int) -> Any:
    import pika

    return pika.ConnectionParameters(
        "127.0.0.1",
        port,
        credentials=pika.PlainCredentials("guest", "guest"),
        heartbeat=0,
        blocked_connection_timeout=60,
        socket_timeout=30,
    )


def publisher(port: int, queue: str, total: int, pipe: Connection) -> None:
    import pika

    conn = pika.BlockingConnection(_params(port))
    channel = conn.channel()
    channel.queue_declare(queue)
    pipe.send("ready")
    pipe.recv()
    for _ in range(total):
        channel.basic_publish("", queue, BODY)
    conn.close()
    pipe.send("done")


def consumer(port: int, queue: str, total: int, ack_every: int, pipe: Connection) -> None:
    import pika

    conn = pika.BlockingConnection(_params(port))
    channel = conn.channel()
    channel.queue_declare(queue)
    channel.basic_qos(prefetch_count=1000)
    state = {"n": 0, "first": 0.0, "last": 0.0}

    def on_message(ch: Any, method: Any, _props: Any, _body: bytes) -> None:
        state["n"] += 1
        now = time.monotonic()
        state["first"] = state["first"] or now
        state["last"] = now
        if state["n"] % ack_every == 0 or state["n"] == total:
            ch.basic_ack(method.delivery_tag, multiple=True)

    channel.basic_consume(queue, on_message)
    pipe.send("ready")
    deadline = time.monotonic() + 300
    while state["n"] < total and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.5)
    channel.queue_delete(queue)
    conn.close()
    pipe.send((state["n"], state["first"], state["last"]))


def run(broker: Broker, port: int, total: int, ack_every: int) -> tuple[float, float]:
    """(deliveries/s, broker CPU µs per delivery) for one run."""
    ctx = mp.get_context("spawn")
    queue = f"pika-{uuid.uuid4().hex[:8]}"
    sub_pipe, sub_child = ctx.Pipe()
    pub_pipe, pub_child = ctx.Pipe()
    sub = ctx.Process(target=consumer, args=(port, queue, total, ack_every, sub_child))
    sub.start()
    assert sub_pipe.poll(60) and sub_pipe.recv() == "ready"
    pub = ctx.Process(target=publisher, args=(port, queue, total, pub_child))
    pub.start()
    assert pub_pipe.poll(60) and pub_pipe.recv() == "ready"
    cpu0 = cpu_seconds(broker.pids())
    pub_pipe.send("go")
    assert sub_pipe.poll(320), "the consumer did not finish"
    delivered, first, last = sub_pipe.recv()
    cpu = cpu_seconds(broker.pids()) - cpu0
    pub.join(30)
    sub.join(30)
    if delivered < total:
        raise RuntimeError(f"{broker.name}: {delivered}/{total} delivered")
    return delivered / max(last - first, 1e-9), cpu / delivered * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--ack-every", default="1,10,100")
    a = p.parse_args(argv)
    acks = [int(n) for n in a.ack_every.split(",")]
    vibe = VibeMQBroker(amqp=True, env={"VIBEMQ_QUEUE_DEFAULTS__DURABLE": "false"})
    rabbit = RabbitMQBroker()
    vibe.start()
    try:
        rabbit.start()
        peers = [("vibemq", vibe, vibe.amqp_port), ("rabbitmq", rabbit, rabbit.port)]
        results: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for rnd in range(a.rounds):
            for n in acks:
                order = peers if rnd % 2 == 0 else peers[::-1]
                for name, broker, port in order:
                    rate, cpu = run(broker, port, a.messages, n)
                    results.setdefault((name, n), []).append((rate, cpu))
                    print(
                        f"round {rnd + 1} ack every {n:<3} {name:<8} {rate:>9,.0f} msg/s "
                        f"broker {cpu:.1f} us/msg",
                        flush=True,
                    )
    finally:
        vibe.stop()
        rabbit.stop()
    print("\npika 1 -> 1, 64 B, prefetch 1000, medians")
    print(
        f"{'acks every':<11}{'VibeMQ msg/s':>14}{'µs/msg':>8}{'RabbitMQ msg/s':>16}{'µs/msg':>8}"
        f"{'ratio':>7}"
    )
    for n in acks:
        v = [statistics.median(x) for x in zip(*results[("vibemq", n)], strict=True)]
        r = [statistics.median(x) for x in zip(*results[("rabbitmq", n)], strict=True)]
        print(f"{n:<11}{v[0]:>14,.0f}{v[1]:>8.1f}{r[0]:>16,.0f}{r[1]:>8.1f}{v[0] / r[0]:>6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
