"""A flooding connection is read fairly: one large read per loop turn, on every protocol.

Issue 12's stall: libuv reads a readable socket again and again in one loop turn while each
read fills uvloop's 256 KB buffer (up to 32 times), so a publisher with megabytes waiting was
handled for seconds on a busy machine before the loop came back to anyone else; the
consumer's acks waited all that time with its window full and messages ready. Now a
connection that got a large read (``FAIR_READ_BYTES``) is not read again until the loop has
turned.

Deterministic: the whole flood is in the kernel's buffer before the broker's connection
(made by the factory its listener was started with) gets the socket, on uvloop as in
production; each read is recorded with the loop turn it happened in.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import tempfile
import threading
from pathlib import Path

import pytest
import uvloop
from listenerspy import start_broker
from test_liveness_property import CLIENTS

from vibemq_server.config import Config
from vibemq_server.server.transport import FAIR_READ_BYTES

#: publishes in the flood: some 1 MB whatever the protocol, several full reads
FLOOD = 8_000
TIMEOUT_S = 20.0


def _drain(sock: socket.socket) -> None:
    """Read and drop what the broker answers (acks), so that it never waits for us."""
    with contextlib.suppress(OSError):
        while sock.recv(1 << 20):
            pass


async def _reads(protocol: str, data_dir: Path) -> tuple[list[tuple[int, int]], int]:
    """(loop turn, size) of each read of the flooding connection, and the flood's size."""
    loop = asyncio.get_running_loop()
    config = Config(
        host="127.0.0.1",
        port=0,
        data_dir=data_dir,
        drain_timeout_s=0.05,
        queue_defaults={"durable": False},
        mqtt={"port": 0},
        amqp={"port": 0, "heartbeat_s": 0},
        http={"enabled": False},
    )
    broker, factories = await start_broker(config)
    client = CLIENTS[protocol]()
    flood = client.handshake_publisher() + client.publish(0, FLOOD)
    listener = socket.create_server(("127.0.0.1", 0))
    # Room in the kernel for the whole flood before the broker reads any of it.
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * len(flood))
    peer = socket.create_connection(listener.getsockname())
    server_side, _ = listener.accept()
    listener.close()
    drainer = threading.Thread(target=_drain, args=(peer,), daemon=True)
    try:
        await asyncio.wait_for(asyncio.to_thread(peer.sendall, flood), TIMEOUT_S)
        drainer.start()
        turn = 0
        reads: list[tuple[int, int]] = []
        received = 0

        def ticker() -> None:  # counts loop turns (a callback runs once per turn)
            nonlocal turn
            turn += 1
            if received < len(flood):
                loop.call_soon(ticker)

        inner = factories[client.listener]()

        class Recording(asyncio.Protocol):
            """The broker's connection, with each read recorded (the transport is slotted,
            and compiled in one build: it is wrapped, not patched)."""

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                inner.connection_made(transport)

            def data_received(self, data: bytes) -> None:
                nonlocal received
                reads.append((turn, len(data)))
                received += len(data)
                inner.data_received(data)

            def eof_received(self) -> bool | None:
                return inner.eof_received()

            def connection_lost(self, exc: Exception | None) -> None:
                inner.connection_lost(exc)

            def pause_writing(self) -> None:
                inner.pause_writing()

            def resume_writing(self) -> None:
                inner.resume_writing()

        loop.call_soon(ticker)
        await loop.connect_accepted_socket(Recording, server_side)
        async with asyncio.timeout(TIMEOUT_S):
            while received < len(flood):
                await asyncio.sleep(0.01)
        return reads, len(flood)
    finally:
        peer.close()
        await broker.stop()


@pytest.mark.parametrize("protocol", ["native", "mqtt", "amqp"])
def test_a_flooding_connection_gets_one_large_read_per_loop_turn(protocol: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        reads, size = uvloop.run(_reads(protocol, Path(tmp)))
    large = [r for r in reads if r[1] >= FAIR_READ_BYTES]
    assert len(large) >= 2, f"the flood of {size} bytes came in small reads: {reads}"
    # After a large read, nothing more of this connection in the same loop turn.
    for (turn, size_), (next_turn, _) in itertools.pairwise(reads):
        if size_ >= FAIR_READ_BYTES:
            assert next_turn > turn, f"read again in loop turn {turn}: {reads}"
