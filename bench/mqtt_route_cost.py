"""Instructions the broker spends on a QoS 1 MQTT 3.1.1 message, in process, for callgrind
(issue 16, 64 KiB): one publisher and one subscriber connection (``MqttEntry`` over a real
``MqttServer`` and ``QueueManager``, as the broker makes them) behind a minimal link that
keeps what is sent; ``COUNT`` PUBLISHes of ``SIZE`` bytes fed in reads of 256,000 bytes (as
the broker reads them under ``bench.large_bench``), and after each read the subscriber's
PUBACKs for what it got. Parser, routing, delivery, the publisher's PUBACK and the
subscriber's: everything but the sockets::

    PYTHONPATH=$PWD valgrind --tool=callgrind --callgrind-out-file=route.out \\
        --toggle-collect='CPyPy_mqtt___connection___MqttConnection___data_received' \\
        .venv/bin/python -m bench.mqtt_route_cost 400
    callgrind_annotate route.out | grep -E 'PROGRAM TOTALS|__memcpy_avx_unaligned_erms \\['

(the compiled build's entry point, the connections' ``data_received``: the harness's own work
and the start-up are left out; divide by 400; the payload's ``memcpy`` is counted apart, it
is the same in every build). Payloads of at least ``LARGE_PAYLOAD`` (a delivery's header
comes apart from its payload, and the subscriber acknowledges it by its last two bytes).

Without callgrind it checks that every message arrives and is acknowledged, and prints the
wall-clock time a message (``--size``, default 65,536). A PUBLISH large enough to be filled in
place (1 MiB: ``Link.read_into``) has its reads copied straight into the fill, as the
transport's socket reads are, outside ``data_received`` (not counted), as ``bench.native_micro``
does: ``mqtt_route_cost 60 --size 1048576`` is the counterpart of ``native_micro --messages 60
--size 1048576 --read 256000``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

import structlog

from vibemq_server.adapters.mqtt.codec import encode
from vibemq_server.adapters.mqtt.connection5 import MqttEntry
from vibemq_server.adapters.mqtt.packets import Connect, Publish, Subscribe
from vibemq_server.adapters.mqtt.server import MqttServer
from vibemq_server.auth import Authenticator
from vibemq_server.config import Config
from vibemq_server.core import QueueManager
from vibemq_server.protocol.bigcopy import Fill, read_through
from vibemq_server.protocol.names import valid_queue_name
from vibemq_server.server.adapter import AdapterContext
from vibemq_server.server.transport import ReadBatch

READ = 256_000


class BenchLink:
    """What the transport gives a connection, minus the socket: what is sent is kept (a list
    per read, as the transport gathers it for one writev)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.log = structlog.get_logger("bench")
        self.peer_host = "127.0.0.1"
        self.peer_identity = None
        self.over_tls = False
        self.writable = True
        self.reading_paused = False
        self.session: Any = None
        self.sent: list[bytes] = []
        #: the payload the session asked its next bytes to be read into (``read_into``)
        self.into: Fill | None = None

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def send_parts(self, parts: Any) -> None:
        self.sent.extend(parts)

    def read_into(self, fill: Fill) -> None:
        self.into = fill if len(fill) else None

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.loop.call_later(delay, callback)

    def offload(self, work: Callable[[], Any], then: Callable[[Any], None]) -> None:
        then(work())

    def time(self) -> float:
        return self.loop.time()

    def replace_session(self, session: Any) -> None:
        self.session = session

    def take(self) -> bytes:
        out, self.sent = b"".join(self.sent), []
        return out


async def run(count: int, size: int) -> float:
    loop = asyncio.get_running_loop()
    config = Config(mqtt={"max_inflight": 1000})
    manager = QueueManager(config.queue_defaults, name_validator=valid_queue_name)
    batch = ReadBatch()
    server = MqttServer(
        AdapterContext(
            config, manager, lambda _c: True, lambda _c: None, batch, Authenticator(config)
        )
    )
    server.restore()
    pub, sub = BenchLink(loop), BenchLink(loop)
    for link, name in ((pub, "pub"), (sub, "sub")):
        link.session = server.new_session(link)  # type: ignore[arg-type]
        assert isinstance(link.session, MqttEntry)
        link.session.data_received(encode(Connect(name, clean_session=True)))
        await asyncio.sleep(0)
    sub.session.data_received(encode(Subscribe(1, (("bench/large", 1),))))
    pub.take(), sub.take()
    stream = b"".join(
        encode(Publish("bench/large", b"x" * size, 1, packet_id=i % 65_535 + 1))
        for i in range(count)
    )
    reads = [stream[a : a + READ] for a in range(0, len(stream), READ)]
    acked = delivered = 0

    def received(data: bytes) -> None:
        batch.begin()
        pub.session.data_received(data)
        batch.end()

    start = time.perf_counter()
    for read in reads:
        # (a PUBLISH filled in place, from 1 MiB: its reads copied straight in, as the
        # transport's socket reads are, then data_received(b""))
        read_through(read, lambda: pub.into, received)
        # A large delivery comes as its header (ending in the packet id), then its payload:
        # the subscriber acknowledges each header (the harness's own work kept small).
        heads = [b"\x40\x02" + p[-2:] for p in sub.sent if p[0] == 0x32 and len(p) < 64]
        sub.sent = []
        if heads:
            delivered += len(heads)
            batch.begin()
            sub.session.data_received(b"".join(heads))
            batch.end()
        acked += sum(map(len, pub.sent)) // 4
        pub.sent = []
    elapsed = time.perf_counter() - start
    if delivered != count or acked != count:
        raise SystemExit(f"delivered {delivered}, acknowledged {acked} of {count}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int, nargs="?", default=400)
    parser.add_argument("--size", type=int, default=65_536)
    args = parser.parse_args()
    elapsed = asyncio.run(run(args.count, args.size))
    print(f"{args.count} messages of {args.size} bytes: {elapsed / args.count * 1e6:.1f} µs each")


if __name__ == "__main__":
    main()
