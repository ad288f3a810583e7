"""The client library a user calls vs the raw load generator, against one broker, one run.

Publish side (a fresh transient queue each run, no subscriber, 64-byte JSON):

* ``raw-publish`` -- bench.common.publish_pipelined: pre-encoded Publish frames, ``--window``
  unacked at most, counting PublishAcks by scanning length prefixes.
* ``client-publish`` -- ``await client.publish(queue, payload)`` from ``--window`` concurrent
  tasks (each publishes its share one after another): a bounded window of awaits in flight.
* ``client-publish-many`` -- ``await client.publish_many(queue, chunk)`` with chunks of
  ``--batch`` payloads, ``--window // --batch`` chunks in flight.

Consume side (the queue is filled with ``--messages`` first by the raw publisher, then drained;
prefetch ``--prefetch``; the time is from Subscribe to the last delivery):

* ``raw-consume`` -- bench.common.consume_counting: one pre-built Ack per Deliver, one write
  per read.
* ``client-consume`` -- ``async for msg in sub: await msg.ack()``.
* ``client-consume-batched`` -- ``async for msg in sub:`` collecting ``--ack-batch`` messages,
  then ``await sub.ack_many(batch)``.

Every scenario runs once per round, the order rotating between rounds; the table gives the
medians over ``--rounds`` rounds and the ratio of each client figure to its raw counterpart.

    PYTHONPATH=$PWD .venv/bin/python -m bench.client_bench --rounds 5 --json client.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import VibeMQBroker
from bench.common import (
    BenchError,
    consume_counting,
    encode_batches,
    install_sigterm_exit,
    make_payload,
    publish_pipelined,
    run_loop,
)
from bench.vibemq_driver import SUBSCRIBE, VibeDriver, frame
from vibemq_server.client import Client, ReceivedMessage

Scenario = Callable[[argparse.Namespace, str, int], Coroutine[Any, Any, float]]


#: raw connections handed to an event loop transport: kept referenced, because collecting a
#: BlockingConn closes its socket's descriptor, which the transport closes as well -- by then
#: possibly reused by the next connection
_ADOPTED: list[object] = []


def _queue() -> str:
    return f"bench-client-{uuid.uuid4().hex[:8]}"


async def _raw_fill(args: argparse.Namespace, host: str, port: int, queue: str) -> float:
    """Publish ``--messages`` with the raw generator into ``queue``; returns acked msg/s."""
    driver = VibeDriver(host, port, queue, max_queue_size=max(2_000_000, args.messages))
    batches, sizes = encode_batches(driver, args.messages, 100)
    conn = await asyncio.to_thread(driver.connect_publisher)
    _ADOPTED.append(conn)
    await asyncio.to_thread(
        driver.create_queue,
        conn,
        {"mode": "RoundRobin", "maxQueueSize": max(2_000_000, args.messages)},
    )
    stats = await publish_pipelined(conn, batches, sizes, args.window, driver.ack_counter(), 300)
    if stats.error:
        raise BenchError(f"raw publisher: {stats.error}")
    return stats.acked / ((stats.t_end_ns - stats.t_start_ns) / 1e9)


async def raw_publish(args: argparse.Namespace, host: str, port: int) -> float:
    return await _raw_fill(args, host, port, _queue())


async def _client(host: str, port: int, queue: str, messages: int) -> Client:
    client = await Client.connect(host, port, reconnect=False)
    options = {"max_queue_size": max(2_000_000, messages)}
    await client.create_queue(queue, "RoundRobin", **options)  # type: ignore[arg-type]
    return client


async def client_publish(args: argparse.Namespace, host: str, port: int) -> float:
    queue = _queue()
    client = await _client(host, port, queue, args.messages)
    payloads = [make_payload(i) for i in range(args.messages)]
    workers = args.window

    async def worker(k: int) -> None:
        for i in range(k, len(payloads), workers):
            await client.publish(queue, payloads[i])

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(workers)))
    rate: float = args.messages / (time.perf_counter() - t0)
    await client.close()
    return rate


async def client_publish_many(args: argparse.Namespace, host: str, port: int) -> float:
    queue = _queue()
    client = await _client(host, port, queue, args.messages)
    payloads = [make_payload(i) for i in range(args.messages)]
    chunks = [payloads[i : i + args.batch] for i in range(0, len(payloads), args.batch)]
    workers = max(1, args.window // args.batch)

    async def worker(k: int) -> None:
        for i in range(k, len(chunks), workers):
            await client.publish_many(queue, chunks[i])

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(workers)))
    rate: float = args.messages / (time.perf_counter() - t0)
    await client.close()
    return rate


async def raw_consume(args: argparse.Namespace, host: str, port: int) -> float:
    queue = _queue()
    await _raw_fill(args, host, port, queue)
    driver = VibeDriver(host, port, queue, prefetch=args.prefetch)
    t0 = time.monotonic_ns()  # the clock of SubStats
    conn = await asyncio.to_thread(driver.connect_publisher)  # a plain handshake
    _ADOPTED.append(conn)
    # Subscribe without waiting for the SubscribeAck: deliveries of the full queue may come
    # before it, and the scanner skips every frame but Deliver.
    headers = {"prefetch": str(args.prefetch)}
    conn.send(frame(SUBSCRIBE, f"s-{queue}", queue, headers=headers))
    stats = await consume_counting(conn, args.messages, driver.delivery_scanner(), 300)
    if stats.error:
        raise BenchError(f"raw consumer: {stats.error}")
    return stats.delivered / ((stats.t_end_ns - t0) / 1e9)


async def _client_consume(args: argparse.Namespace, host: str, port: int, ack_batch: int) -> float:
    queue = _queue()
    await _raw_fill(args, host, port, queue)
    t0 = time.perf_counter()
    client = await Client.connect(host, port, reconnect=False)
    sub = await client.subscribe(queue, prefetch=args.prefetch)
    seen = 0
    pending: list[ReceivedMessage] = []
    async with asyncio.timeout(300):
        async for msg in sub:
            seen += 1
            if ack_batch <= 1:
                await msg.ack()
            else:
                pending.append(msg)
                if len(pending) >= ack_batch or seen == args.messages:
                    await sub.ack_many(pending)
                    pending = []
            if seen == args.messages:
                break
    rate = seen / (time.perf_counter() - t0)
    await client.close()
    return rate


async def client_consume(args: argparse.Namespace, host: str, port: int) -> float:
    return await _client_consume(args, host, port, 1)


async def client_consume_batched(args: argparse.Namespace, host: str, port: int) -> float:
    return await _client_consume(args, host, port, args.ack_batch)


SCENARIOS: dict[str, Scenario] = {
    "raw-publish": raw_publish,
    "client-publish": client_publish,
    "client-publish-many": client_publish_many,
    "raw-consume": raw_consume,
    "client-consume": client_consume,
    "client-consume-batched": client_consume_batched,
}
#: each client scenario's raw counterpart, for the ratio
RAW_OF = {
    "client-publish": "raw-publish",
    "client-publish-many": "raw-publish",
    "client-consume": "raw-consume",
    "client-consume-batched": "raw-consume",
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", help="host:port of a running broker (default: start one)")
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--window", type=int, default=1000, help="publishes in flight")
    p.add_argument("--batch", type=int, default=100, help="payloads per publish_many call")
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument("--ack-batch", type=int, default=100, help="messages per ack_many call")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", action="append", choices=list(SCENARIOS), help="run just these")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    install_sigterm_exit()
    broker: VibeMQBroker | None = None
    names = args.only or list(SCENARIOS)
    rates: dict[str, list[float]] = {name: [] for name in names}
    try:
        if args.target:
            host, _, port_s = args.target.rpartition(":")
            host, port = host or "127.0.0.1", int(port_s)
        else:
            broker = VibeMQBroker(env={"VIBEMQ_QUEUE_DEFAULTS__DURABLE": "false"})
            broker.start()
            host, port = broker.host, broker.port
        print(f"VibeMQ at {host}:{port}; {args.messages:,} messages per run", flush=True)
        for round_no in range(args.rounds):
            shift = round_no % len(names)
            for name in names[shift:] + names[:shift]:  # rotate who goes first
                rate: float = run_loop(SCENARIOS[name](args, host, port))
                rates[name].append(rate)
                print(f"  round {round_no + 1} {name:24} {rate:>10,.0f} msg/s", flush=True)
    finally:
        if broker is not None:
            broker.stop()
    report: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "json"}}
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\nmedians over {args.rounds} rounds:")
    for name in names:
        raw = RAW_OF.get(name)
        ratio = medians[name] / medians[raw] if raw in medians else None
        text = f" ({ratio:.2f}x {raw})" if ratio is not None else ""
        print(f"  {name:24} {medians[name]:>10,.0f} msg/s{text}")
        report[name] = {"runs": rates[name], "median": medians[name], "ratio_to_raw": ratio}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
