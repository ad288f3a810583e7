"""Workloads run against a real broker process with the project's client (for Spark tests)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from vibemq_server.client import Client


@dataclass
class Workload:
    published: int = 0  # into "orders"
    acked: int = 0
    redelivered: int = 0
    expired_to_dlq: int = 0


async def _receive(sub: object, count: int, timeout: float) -> list[object]:
    got: list[object] = []
    async with asyncio.timeout(timeout):
        async for msg in sub:  # type: ignore[attr-defined]
            got.append(msg)
            if len(got) == count:
                break
    return got


async def orders_workload(
    port: int, orders: int = 40, unacked: int = 10, expiring: int = 5
) -> Workload:
    """``orders`` messages into queue "orders": ``unacked`` of them delivered to a consumer that
    goes away without acking (so they are delivered again) and then every one acked; plus
    ``expiring`` messages into "ephemeral" (TTL 200 ms, dead-letter queue) that expire into
    "ephemeral.dlq" with reason MessageExpired."""
    w = Workload()
    async with await Client.connect("127.0.0.1", port) as client:
        await client.create_queue("orders", enable_dead_letter_queue=True)
        await client.create_queue("ephemeral", message_ttl_ms=200, enable_dead_letter_queue=True)
        for i in range(orders):
            await client.publish(
                "orders", {"order": i, "note": "é" * (i % 7)}, headers={"shop": f"s{i % 3}"}
            )
        w.published = orders
        for i in range(expiring):
            await client.publish("ephemeral", {"tick": i})
        # A consumer that takes some messages and disappears without acking.
        first = await Client.connect("127.0.0.1", port)
        sub = await first.subscribe("orders", prefetch=unacked)
        await _receive(sub, unacked, 10)
        await first.close()
        w.redelivered = unacked
        async with await client.subscribe("orders", prefetch=100) as sub2:
            for msg in await _receive(sub2, orders, 20):
                await msg.ack()  # type: ignore[attr-defined]
        w.acked = orders
        deadline = time.monotonic() + 15
        while (await client.queue_info("ephemeral"))[
            "messageCount"
        ] and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert (await client.queue_info("ephemeral.dlq"))["messageCount"] == expiring
        w.expired_to_dlq = expiring
        await client.ping()
    return w


async def publish_more(port: int, queue: str, count: int) -> None:
    async with await Client.connect("127.0.0.1", port) as client:
        for i in range(count):
            await client.publish(queue, {"more": i})


async def consume(port: int, queue: str, count: int, timeout: float = 30) -> list[bytes]:
    async with (
        await Client.connect("127.0.0.1", port) as client,
        await client.subscribe(queue, prefetch=500) as sub,
    ):
        msgs = await _receive(sub, count, timeout)
        for msg in msgs:
            await msg.ack()  # type: ignore[attr-defined]
        return [msg.raw for msg in msgs]  # type: ignore[attr-defined]
