"""A flooding connection is read fairly: one large read per loop turn, on every protocol.

Issue 12's stall: libuv reads a readable socket again and again in one loop turn while each
read fills uvloop's 256 KB buffer (up to 32 times), so a publisher with megabytes waiting was
handled for seconds on a busy machine before the loop came back to anyone else; the
consumer's acks waited all that time with its window full and messages ready. Now a
connection whose read filled the transport's buffer (``READ_SIZE``) is not read again until
the loop has turned; after a shorter one libuv stops reading it by itself, and after one that
completed a payload's fill the next read decides, so the transport does not pause it then (no
pause and resume calls for nothing), unless the payload was a large one (``READ_SIZE`` or
more): then the next read is a header's only (``HEAD_SIZE``), which does not pause.

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
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop
from listenerspy import start_broker
from test_large_frames import _context, _Sender
from test_liveness_property import CLIENTS

from vibemq_server.config import Config
from vibemq_server.protocol.bigcopy import payload_fill
from vibemq_server.server.transport import HEAD_SIZE, READ_SIZE, StreamTransport

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
    full = [r for r in reads if r[1] == READ_SIZE]
    assert len(full) >= 2, f"the flood of {size} bytes came in short reads: {reads}"
    # After a read that filled the buffer, nothing more of this connection in the same turn.
    for (turn, size_), (next_turn, _) in itertools.pairwise(reads):
        if size_ == READ_SIZE:
            assert next_turn > turn, f"read again in loop turn {turn}: {reads}"


#: The fills the next test's session has its reads go into, one after the other (the next
#: reads then go into the transport's own buffer of READ_SIZE: one full, one short).
FILLS = (100_000, 10_000, 100_000)
REST = READ_SIZE + 100_000


async def _pauses(sent: int, fills: Callable[[int], int | None]) -> list[list[int]]:
    """[loop turn, bytes, whether the socket was read at the next turn's start] of each read
    of a connection with ``sent`` bytes waiting before the transport takes its socket, whose
    session has its reads go into a fill of ``fills(n)`` bytes (None: none) after its n-th."""
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * sent)
    peer = socket.create_connection(listener.getsockname())
    server_side, _ = listener.accept()
    listener.close()
    reads: list[list[int]] = []
    turn = 0

    def ticker() -> None:  # counts loop turns (a callback runs once per turn)
        nonlocal turn
        turn += 1
        if not reads or reads[-1][2] < 0:
            loop.call_soon(ticker)

    class Reads(_Sender):
        """Has its reads go into the fills ``fills`` asks for, and records each."""

        def __init__(self, link: StreamTransport) -> None:
            super().__init__(link, b"")
            self.seen = 0
            self.fill(0)

        def fill(self, n: int) -> None:
            size = fills(n)
            if size is not None:
                self.link.read_into(payload_fill(size))

        def data_received(self, data: bytes) -> None:
            link = self.link
            read = [turn, link.bytes_received - self.seen, -1]
            self.seen = link.bytes_received
            reads.append(read)
            self.fill(len(reads))
            transport = link.transport
            assert transport is not None

            def check() -> None:  # (before the transport's own callback of this turn)
                read[2] = int(transport.is_reading())

            loop.call_soon(check)

    try:
        await asyncio.wait_for(asyncio.to_thread(peer.sendall, b"x" * sent), TIMEOUT_S)
        context = _context()
        loop.call_soon(ticker)
        await loop.connect_accepted_socket(
            lambda: StreamTransport(Reads, conn_id="t", context=context), server_side
        )
        async with asyncio.timeout(TIMEOUT_S):
            while sum(size for _, size, _ in reads) < sent or reads[-1][2] < 0:
                await asyncio.sleep(0.01)
        return reads
    finally:
        peer.close()


def test_only_a_read_that_filled_the_transports_buffer_pauses_reading() -> None:
    """libuv reads a socket again in the same turn only after a read that filled the buffer
    it was offered: the transport pauses it after one that filled its own buffer, not after
    one that completed a fill (the next read decides) nor after a short one."""
    reads = uvloop.run(_pauses(sum(FILLS) + REST, lambda n: FILLS[n] if n < len(FILLS) else None))
    assert [size for _, size, _ in reads] == [*FILLS, READ_SIZE, REST - READ_SIZE], reads
    *filled, (turn, _, paused), (_, _, last) = reads
    assert all(t == turn for t, _, _ in filled), reads  # not paused: read on in the same turn
    assert not paused, reads  # a full read into READ_SIZE: paused until the loop turned
    assert last, reads  # a short one: not paused (libuv stopped by itself)


#: a payload of READ_SIZE or more: after it, the next read is a header's (HEAD_SIZE)
LARGE = READ_SIZE + 50_000


def test_after_a_large_payload_the_next_read_takes_a_header_only() -> None:
    """A read that completes a large payload's fill pauses (one large message a loop turn);
    the next read takes HEAD_SIZE bytes only (the next header: the session starts the next
    payload's fill from it, so the kernel reads that payload straight into it) and does not
    pause (the fill's read decides)."""

    def fills(n: int) -> int | None:  # a large payload after each header's read
        return LARGE if n in (0, 2) else None

    tail = 100
    reads = uvloop.run(_pauses(2 * LARGE + HEAD_SIZE + tail, fills))
    assert [size for _, size, _ in reads] == [LARGE, HEAD_SIZE, LARGE, tail], reads
    (first, _, paused), (head, _, _), (second, _, paused_again), (last, _, _) = reads
    assert not paused and first < head, reads  # the large payload's read paused reading
    assert second == head, reads  # the header's read did not: its fill's read in that turn
    assert not paused_again and second < last, reads
