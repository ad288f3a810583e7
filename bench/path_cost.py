"""The broker's work a message on the native and the MQTT QoS 1 paths, in one process, fed
the bytes ``bench.paths_bench``'s raw generators write (issue 15: native at least our MQTT).

A publisher and a subscriber connection of the protocol -- the native ``Session`` or the
``MqttConnection`` behind a real ``MqttServer`` -- on one ``QueueManager``, each behind a link
that only collects what would be written, a transient queue (prefetch 1,000): every round feeds
the publisher one read of ``--batch`` pre-encoded publishes (``VibeDriver``/``MqttDriver``
``publish_batch``), then the subscriber one read of the acks that driver's scanner answers the
deliveries with, each read inside the core's ``hold``/``release`` as in the broker (one
clock reading a read). Only the connections' ``data_received`` is the broker's work; under
callgrind count that alone (the compiled build's entry points)::

    PYTHONPATH=$PWD valgrind --tool=callgrind --callgrind-out-file=native.out \\
        --toggle-collect='CPyPy_server___session___Session___data_received' \\
        .venv/bin/python -m bench.path_cost native --messages 20000
    PYTHONPATH=$PWD valgrind --tool=callgrind --callgrind-out-file=mqtt.out \\
        --toggle-collect='CPyPy_mqtt___connection___MqttConnection___data_received' \\
        .venv/bin/python -m bench.path_cost mqtt --messages 20000
    callgrind_annotate --inclusive=yes native.out | head -60

(instructions a message: the PROGRAM TOTALS over ``--messages``). ``routed`` is ``native``
with the MQTT adapter's address sink registered on the manager, as in the broker (every
native publish is handed to it too); count it with the native toggle. Without callgrind it prints
the CPU microseconds a message of those calls, best of ``--repeat``.

``durable`` is the native path on a durable queue: a real ``Journal`` (the broker's payload
forms) in a temporary directory with ``fsync = always`` and its real fsync threads, run in an
asyncio loop. After each publisher read the loop runs until that read's PublishAcks are out
(the journal's flush, fsync and the completion on the loop, as in the broker); the broker's
work is then also the journal's loop callbacks, so count those too::

    PYTHONPATH=$PWD valgrind --tool=callgrind --callgrind-out-file=durable.out \
        --toggle-collect='CPyPy_server___session___Session___data_received' \
        --toggle-collect='CPyPy_journal___Journal____flush' \
        --toggle-collect='CPyPy_journal___Journal____on_synced' \
        .venv/bin/python -m bench.path_cost durable --messages 20000

Without callgrind it prints the loop thread's CPU (``thread_time``: the fsync threads'
excluded) a message over the whole run, the loop's own turns included.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

from bench.mqtt_driver import MqttDeliveryScanner, MqttDriver
from bench.native_micro import CollectingLink as MicroLink
from bench.vibemq_driver import VibeDeliveryScanner, VibeDriver
from vibemq_server.adapters.mqtt.codec import encode as mqtt_encode
from vibemq_server.adapters.mqtt.connection import MqttConnection
from vibemq_server.adapters.mqtt.packets import Connect, Subscribe
from vibemq_server.adapters.mqtt.server import MqttServer
from vibemq_server.auth import Authenticator
from vibemq_server.config import Config
from vibemq_server.core import QueueManager
from vibemq_server.journal.journal import FsyncPolicy, Journal
from vibemq_server.logs import configure_logging
from vibemq_server.protocol import CommandType, Message, encode
from vibemq_server.protocol.bigcopy import Fill
from vibemq_server.server.adapter import AdapterContext
from vibemq_server.server.broker import with_payload_forms
from vibemq_server.server.session import Session
from vibemq_server.server.transport import LinkState, ReadBatch

PREFETCH = 1000


class Conn(Protocol):
    def data_received(self, data: bytes) -> None: ...


def _no_flush() -> None:
    """A LinkState's flush, scheduled: ``take`` collects the output."""


class CollectingLink(MicroLink):
    """``native_micro``'s link (always writable, keeps what the connection writes), with what
    the MQTT connection calls besides, and ``send`` the list's own append."""

    def __init__(self, conn_id: str) -> None:
        super().__init__(conn_id)
        # a bound C method: the link costs as little as it can
        self.send = self.out.append  # type: ignore[method-assign]
        # what the broker's transport gives a session to read instead of ``writable`` and
        # to send through (natively) instead of ``send``: its pieces are this link's output
        self.link_state = LinkState(1 << 40, _no_flush)

    def take(self) -> bytes:
        self.out.extend(self.link_state.take())
        return super().take()

    def read_into(self, fill: Fill) -> None:
        raise AssertionError("64-byte payloads are never filled in place")

    def replace_session(self, session: object) -> None:
        pass

    def close_by_operator(self, reason: str) -> None:
        pass


def native_pair(
    manager: QueueManager, config: Config, durable: bool = False
) -> tuple[Conn, Conn, CollectingLink, CollectingLink, Any]:
    pub_link, sub_link = CollectingLink("pub"), CollectingLink("sub")
    pub = Session(pub_link, manager, config)  # type: ignore[arg-type]
    sub = Session(sub_link, manager, config)  # type: ignore[arg-type]
    pub.data_received(encode(Message(CommandType.CONNECT, "c1")))
    sub.data_received(encode(Message(CommandType.CONNECT, "c2")))
    options = b'{"mode":"RoundRobin","durable":%s}' % (b"true" if durable else b"false")
    create = Message(CommandType.CREATE_QUEUE, "cq", "bench", options)
    sub.data_received(encode(create))
    subscribe = Message(CommandType.SUBSCRIBE, "s", "bench", headers={"prefetch": str(PREFETCH)})
    sub.data_received(encode(subscribe))
    return pub, sub, pub_link, sub_link, VibeDriver("127.0.0.1", 0, "bench")


def mqtt_server(manager: QueueManager, config: Config) -> MqttServer:
    """An MQTT adapter on ``manager``: registered as an address sink, as in the broker."""
    server = MqttServer(
        AdapterContext(
            config, manager, lambda _c: True, lambda _c: None, ReadBatch(), Authenticator(config)
        )
    )
    server.restore()
    return server


def routed_pair(
    manager: QueueManager, config: Config
) -> tuple[Conn, Conn, CollectingLink, CollectingLink, Any]:
    """``native_pair`` with the MQTT adapter's sink registered, as in the broker: every
    native publish is also handed to it (no MQTT subscriber matches the queue's name)."""
    mqtt_server(manager, config)
    return native_pair(manager, config)


def mqtt_pair(
    manager: QueueManager, config: Config
) -> tuple[Conn, Conn, CollectingLink, CollectingLink, Any]:
    server = mqtt_server(manager, config)
    pub_link, sub_link = CollectingLink("pub"), CollectingLink("sub")
    pub = MqttConnection(pub_link, server)  # type: ignore[arg-type]
    sub = MqttConnection(sub_link, server)  # type: ignore[arg-type]
    pub.data_received(mqtt_encode(Connect("bench-pub", clean_session=True, keep_alive=600)))
    sub.data_received(mqtt_encode(Connect("bench-sub", clean_session=True, keep_alive=600)))
    sub.data_received(mqtt_encode(Subscribe(1, (("bench/t", 1),))))
    return pub, sub, pub_link, sub_link, MqttDriver("127.0.0.1", 0, "bench/t")


def run(path: str, messages: int, batch: int) -> tuple[float, int]:
    """CPU seconds of the connections' ``data_received`` for ``messages``, and how many
    deliveries the subscriber acked."""
    config = Config(queue_defaults={"durable": False})
    manager = QueueManager(config.queue_defaults)
    make = {"native": native_pair, "routed": routed_pair, "mqtt": mqtt_pair}[path]
    pub, sub, pub_link, sub_link, driver = make(manager, config)
    pub_link.take()
    sub_link.take()
    scanner = MqttDeliveryScanner() if path == "mqtt" else VibeDeliveryScanner()
    reads = [
        driver.publish_batch(start, min(batch, messages - start))
        for start in range(0, messages, batch)
    ]
    spent = 0.0
    acked = 0
    clock = time.process_time
    # each read inside the core's hold/release, as the broker's ReadBatch has it
    hold, release = manager.hold, manager.release
    for data in reads:
        t0 = clock()
        hold()
        pub.data_received(data)
        release()
        spent += clock() - t0
        out = bytearray(sub_link.take())
        _used, delivered, acks = scanner.feed(out)
        acked += delivered
        pub_link.take()
        t0 = clock()
        hold()
        sub.data_received(acks)
        release()
        spent += clock() - t0
    return spent, acked


async def run_durable(messages: int, batch: int) -> tuple[float, int]:
    """``run`` on a durable queue: the loop thread's CPU seconds over the whole run, and how
    many deliveries the subscriber acked."""
    directory = Path(tempfile.mkdtemp(prefix="bench-path-cost-"))
    config = Config(queue_defaults={"durable": True})
    manager = QueueManager(config.queue_defaults)
    journal = with_payload_forms(Journal(directory / "journal", fsync=FsyncPolicy.ALWAYS))
    manager.persistence = journal
    journal.recover(manager)
    journal.start(manager)
    try:
        pub, sub, pub_link, sub_link, driver = native_pair(manager, config, durable=True)
        await durable_point(journal)
        pub_link.take()
        sub_link.take()
        scanner = VibeDeliveryScanner()
        reads = [
            driver.publish_batch(start, min(batch, messages - start))
            for start in range(0, messages, batch)
        ]
        acked = 0
        # each read inside the core's hold/release, as in ``run`` and the broker's ReadBatch
        # (without it every publish read the clock: ~430 instructions a message the broker
        # does not spend)
        hold, release = manager.hold, manager.release
        t0 = time.thread_time()
        for data in reads:
            hold()
            pub.data_received(data)
            release()
            await durable_point(journal)  # this read's PublishAcks are out
            _used, delivered, acks = scanner.feed(bytearray(sub_link.take()))
            acked += delivered
            pub_link.take()
            hold()
            sub.data_received(acks)
            release()
        await durable_point(journal)  # the last acks' records written
        spent = time.thread_time() - t0
        await journal.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return spent, acked


async def durable_point(journal: Journal) -> None:
    """Until everything recorded so far is durable (one waiter more, behind the read's)."""
    done = asyncio.get_running_loop().create_future()
    journal.when_durable(lambda _err: done.done() or done.set_result(None))
    await done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("path", choices=("native", "routed", "mqtt", "durable"))
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=100, help="publishes per publisher read")
    p.add_argument("--repeat", type=int, default=1, help="runs; the best is reported")
    a = p.parse_args(argv)
    configure_logging("warning")
    gc.freeze()
    best = float("inf")
    for _ in range(a.repeat):
        if a.path == "durable":
            spent, acked = asyncio.run(run_durable(a.messages, a.batch))
        else:
            spent, acked = run(a.path, a.messages, a.batch)
        if acked != a.messages:
            print(f"only {acked:,} of {a.messages:,} delivered", file=sys.stderr)
            return 1
        best = min(best, spent)
    print(f"{a.path}: {best / a.messages * 1e6:.2f} us CPU/message, best of {a.repeat}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
