"""Debian's ``amqp-tools`` (rabbitmq-c's command-line clients) against the AMQP listener, unchanged.

``amqp-declare-queue``, ``amqp-publish``, ``amqp-get`` and ``amqp-consume`` run as real
processes against an in-process broker (``broker_factory``). Every subprocess is started with
``asyncio.create_subprocess_exec`` so the broker's event loop keeps running while it waits,
and every wait is bounded. aio-pika (on the same loop) binds queues and looks at consumer
counts where the tools cannot.

If the binaries are missing the tests fail (they never skip): install Debian's ``amqp-tools``
(``scripts/test.sh`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Awaitable, Callable

import aio_pika
import aio_pika.abc
import pytest

from vibemq_server.server import Broker

BrokerFactory = Callable[..., Awaitable[Broker]]
HOST = "127.0.0.1"
WAIT = 20.0
"""Bound of every wait on a tool (each normally takes milliseconds)."""


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: these tests need Debian's amqp-tools "
            "(apt-get install amqp-tools; scripts/test.sh installs it)"
        )
    return path


def url(broker: Broker) -> str:
    return f"amqp://guest:guest@{HOST}:{broker.amqp_port}"


async def run_tool(name: str, *args: str, stdin: bytes | None = None) -> bytes:
    """Run ``name args...`` to completion (bounded); assert it exits 0; return its stdout."""
    proc = await asyncio.create_subprocess_exec(
        tool(name),
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), WAIT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, (name, args, proc.returncode, out, err)
    return out


async def consumer_count(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    result = declared.declaration_result
    return int(result.consumer_count or 0)


async def wait_for_consumer(
    channel: aio_pika.abc.AbstractChannel, queue: str, proc: asyncio.subprocess.Process
) -> None:
    async def poll() -> None:
        while await consumer_count(channel, queue) < 1:
            if proc.returncode is not None:
                return
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(poll(), WAIT)
    except TimeoutError:
        raise AssertionError(f"amqp-consume never subscribed to {queue!r}") from None
    if proc.returncode is not None:
        _, err = await proc.communicate()
        raise AssertionError(f"amqp-consume exited early ({proc.returncode}): {err!r}")


async def start_consume(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        tool("amqp-consume"),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finish(proc: asyncio.subprocess.Process) -> bytes:
    """Wait (bounded) for a backgrounded tool to exit 0; return its stdout."""
    try:
        out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, (proc.returncode, out, err)
    return out


async def test_declare_queue_prints_name_and_is_durable(
    broker: Broker, channel: aio_pika.abc.AbstractChannel
) -> None:
    out = await run_tool("amqp-declare-queue", "--url", url(broker), "-q", "tools-q", "-d")
    assert out.strip() == b"tools-q"
    # Declaring it again with the same (durable) arguments is fine; a non-durable redeclare is
    # refused, which shows the queue really is durable.
    await run_tool("amqp-declare-queue", "--url", url(broker), "-q", "tools-q", "-d")
    assert await consumer_count(channel, "tools-q") == 0
    with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
        await channel.declare_queue("tools-q", durable=False)


async def test_publish_default_exchange_then_get(broker: Broker) -> None:
    u = url(broker)
    await run_tool("amqp-declare-queue", "--url", u, "-q", "tools-q", "-d")
    await run_tool("amqp-publish", "--url", u, "-r", "tools-q", "-b", "hello")
    out = await run_tool("amqp-get", "--url", u, "-q", "tools-q")
    assert out == b"hello"
    # amqp-get acknowledged it: the queue is empty now, and amqp-get on an empty queue fails.
    proc = await asyncio.create_subprocess_exec(
        tool("amqp-get"),
        "--url",
        u,
        "-q",
        "tools-q",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode != 0
    assert out == b""


async def test_publish_body_from_stdin(broker: Broker) -> None:
    u = url(broker)
    await run_tool("amqp-declare-queue", "--url", u, "-q", "tools-q", "-d")
    body = b"line one\nline two\x00\xff"
    await run_tool("amqp-publish", "--url", u, "-r", "tools-q", stdin=body)
    assert await run_tool("amqp-get", "--url", u, "-q", "tools-q") == body


async def test_consume_receives_message_published_afterwards(
    broker: Broker, channel: aio_pika.abc.AbstractChannel
) -> None:
    u = url(broker)
    await run_tool("amqp-declare-queue", "--url", u, "-q", "tools-q", "-d")
    proc = await start_consume("--url", u, "-q", "tools-q", "-c", "1", "cat")
    try:
        await wait_for_consumer(channel, "tools-q", proc)
        await run_tool("amqp-publish", "--url", u, "-r", "tools-q", "-b", "hello")
        assert await finish(proc) == b"hello"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    # The delivery was acknowledged and the consumer is gone.
    assert await consumer_count(channel, "tools-q") == 0
    queue = await channel.declare_queue("tools-q", passive=True)
    assert queue.declaration_result.message_count == 0


async def test_consume_several_messages_in_order(
    broker: Broker, channel: aio_pika.abc.AbstractChannel
) -> None:
    u = url(broker)
    await run_tool("amqp-declare-queue", "--url", u, "-q", "tools-q", "-d")
    proc = await start_consume("--url", u, "-q", "tools-q", "-c", "3", "-p", "1", "cat")
    try:
        await wait_for_consumer(channel, "tools-q", proc)
        for i in range(3):
            await run_tool("amqp-publish", "--url", u, "-r", "tools-q", "-b", f"m{i};")
        assert await finish(proc) == b"m0;m1;m2;"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_publish_to_amq_topic_reaches_bound_queue(
    broker: Broker, channel: aio_pika.abc.AbstractChannel
) -> None:
    u = url(broker)
    await run_tool("amqp-declare-queue", "--url", u, "-q", "topic-q", "-d")
    await run_tool("amqp-declare-queue", "--url", u, "-q", "other-q", "-d")
    topic_q = await channel.declare_queue("topic-q", passive=True)
    other_q = await channel.declare_queue("other-q", passive=True)
    await topic_q.bind("amq.topic", "a.*")
    await other_q.bind("amq.topic", "x.#")
    await run_tool("amqp-publish", "--url", u, "-e", "amq.topic", "-r", "a.b", "-b", "via topic")
    assert await run_tool("amqp-get", "--url", u, "-q", "topic-q") == b"via topic"
    other = await channel.declare_queue("other-q", passive=True)
    assert other.declaration_result.message_count == 0


async def test_consume_binds_its_queue_to_amq_topic(
    broker: Broker, channel: aio_pika.abc.AbstractChannel
) -> None:
    """``amqp-consume -e amq.topic -r 'a.#'`` with no ``-q`` declares a server-named exclusive
    queue, binds it and consumes; a publish to ``a.b.c`` reaches it."""
    u = url(broker)
    proc = await start_consume("--url", u, "-e", "amq.topic", "-r", "a.#", "-c", "1", "cat")
    try:
        # The queue name is the broker's choice, so probe by publishing until it arrives:
        # publishes before the binding exists are simply unroutable and dropped.
        async def publish_until_done() -> None:
            while proc.returncode is None:
                await run_tool(
                    "amqp-publish", "--url", u, "-e", "amq.topic", "-r", "a.b.c", "-b", "t"
                )
                await asyncio.sleep(0.05)

        publisher = asyncio.create_task(publish_until_done())
        try:
            assert await finish(proc) == b"t"
        finally:
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
