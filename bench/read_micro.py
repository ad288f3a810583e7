"""The read path alone: CPU per GB of MQTT 64 KiB PUBLISHes read and parsed, uvloop's own read
(``asyncio.Protocol``: each read copied into a new ``bytes``) against the transport's
(``BufferedProtocol`` + ``ReadBuffer``: the kernel reads into the ``bytes`` the parser gets),
and the transport's with a large payload filled in place (``filled``: the rest of a PUBLISH
whose header is in read straight into its payload, ``Link.read_into``; from ``FILL_FROM``).

A writer process sends the same stream to each in turn over loopback; the reader's CPU time
(``time.process_time``, this process only) from the first byte to the last is divided by
the bytes read. Alternating rounds, medians (docs/performance.md, issue 16, fifth round).

    PYTHONPATH=$PWD .venv/bin/python -m bench.read_micro --rounds 7
    PYTHONPATH=$PWD .venv/bin/python -m bench.read_micro --size 1048576 --messages 1024
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import statistics
import time
from typing import Any

import uvloop

from vibemq_server.adapters.mqtt.codec import MqttParser, encode
from vibemq_server.adapters.mqtt.packets import Publish
from vibemq_server.protocol.bigcopy import FILL_FROM, read_buffer, read_target
from vibemq_server.server.allocator import tune_allocator
from vibemq_server.server.transport import COPY_BELOW, READ_SIZE


def _writer(port: int, frame: bytes, count: int) -> None:
    chunk = frame * 16
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(count // 16):
            sock.sendall(chunk)


class _Counting(asyncio.BaseProtocol):
    def __init__(self, total: int, done: asyncio.Future[float]) -> None:
        self.parser = MqttParser(max_packet_size=1 << 24)
        self.total = total
        self.got = 0
        self.packets = 0
        self.started = 0.0
        self.done = done

    def take(self, data: bytes) -> None:
        if not self.got:
            self.started = time.process_time()
        self.got += len(data)
        self.packets += len(self.parser.feed(data))
        if self.got >= self.total and not self.done.done():
            self.done.set_result(time.process_time() - self.started)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        pass

    def eof_received(self) -> bool | None:
        return None


class Plain(_Counting, asyncio.Protocol):
    def data_received(self, data: bytes) -> None:
        self.take(data)


class Buffered(_Counting, asyncio.BufferedProtocol):
    reads = read_buffer(COPY_BELOW)

    def get_buffer(self, sizehint: int) -> Any:
        return self.reads.get(READ_SIZE)

    def buffer_updated(self, nbytes: int) -> None:
        self.take(self.reads.take(nbytes))


class Filled(Buffered):
    """As the transport with an MQTT connection: a large payload's rest read into it."""

    def __init__(self, total: int, done: asyncio.Future[float]) -> None:
        super().__init__(total, done)
        self.parser.fill_from = FILL_FROM

    def get_buffer(self, sizehint: int) -> Any:
        fill = self.parser.filling
        return read_target(fill) if fill is not None else self.reads.get(READ_SIZE)

    def buffer_updated(self, nbytes: int) -> None:
        fill = self.parser.filling
        if fill is None:
            self.take(self.reads.take(nbytes))
            return
        fill.advance(nbytes)
        self.got += nbytes
        self.packets += len(self.parser.feed(b""))
        if self.got >= self.total and not self.done.done():
            self.done.set_result(time.process_time() - self.started)


async def _one(kind: type[_Counting], frame: bytes, count: int) -> float:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[float] = loop.create_future()
    total = len(frame) * (count // 16 * 16)
    server = await loop.create_server(lambda: kind(total, done), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proc = multiprocessing.Process(target=_writer, args=(port, frame, count))
    proc.start()
    cpu = await asyncio.wait_for(done, 120)
    proc.join(30)
    server.close()
    return cpu * 1000 / (total / 1e9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--messages", type=int, default=16_000)
    args = parser.parse_args()
    tune_allocator(os.environ)  # as the broker does at start
    frame = encode(Publish("bench/t", b"x" * args.size, 1, False, False, 1))
    kinds: list[tuple[str, type[_Counting]]] = [
        ("plain", Plain),
        ("buffered", Buffered),
        ("filled", Filled),
    ]
    results: dict[str, list[float]] = {name: [] for name, _ in kinds}
    for r in range(args.rounds):
        for name, kind in kinds if r % 2 == 0 else kinds[::-1]:
            ms = uvloop.run(_one(kind, frame, args.messages))
            results[name].append(ms)
            print(f"round {r + 1} {name:9} {ms:7.1f} ms CPU per GB", flush=True)
    plain, buffered, filled = (statistics.median(results[k]) for k, _ in kinds)
    print(
        f"medians: plain {plain:.1f}, buffered {buffered:.1f}, filled {filled:.1f} ms/GB "
        f"(buffered {plain / buffered:.2f}x, filled {plain / filled:.2f}x plain)"
    )


if __name__ == "__main__":
    main()
