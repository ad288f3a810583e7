"""The native 1 -> 1 path with acks in one process, without sockets: CPU per message.

A publisher session and a subscriber session (``vibemq_server.server.session.Session``) on one
``QueueManager``, each behind a link that only collects what would be written, a transient
queue: every round feeds the publisher one read of ``--batch`` Publish frames (as the load
generator writes them), then the subscriber one read of an Ack per Deliver it was sent. What
is timed is the broker's own work on the path (codec, session, core) -- no event loop, no
socket, no other process -- so it is repeatable on a busy machine where the socket
benchmarks are not: compare the pure and the compiled build (``scripts/compile.py``) or two
commits with it. Best of ``--repeat`` runs (the least disturbed), ``time.process_time``.

    PYTHONPATH=. .venv/bin/python -m bench.native_micro
    PYTHONPATH=. .venv/bin/python -m bench.native_micro --messages 200000 --batch 100

Large payloads (issue 16): ``--size 65536 --read 256000`` sends ``bench.common.make_payload``
JSON texts of that size, the publisher's stream cut into reads of ``--read`` bytes (uvloop's
read size), as they come off the socket; the figure is then also given per MB. A payload the
session fills in place (``Link.read_into``) gets its reads copied straight in, as the kernel
reads them on a socket: that copy is not timed (the socket read's own, made either way).

    PYTHONPATH=. .venv/bin/python -m bench.native_micro --messages 4000 --size 65536 --read 256000

Under callgrind, the instructions of the sessions' ``data_received`` (the compiled build's
entry point) a 64 KiB message, comparable with ``bench.mqtt_route_cost 400`` (divide by 400;
count the payload's ``memcpy`` and the JSON check, ``jsoncheck_valid``, apart)::

    PYTHONPATH=$PWD valgrind --tool=callgrind --callgrind-out-file=native64.out \
        --toggle-collect='CPyPy_server___session___Session___data_received' \
        .venv/bin/python -m bench.native_micro --messages 400 --size 65536 --read 256000 --repeat 1
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import structlog

from bench.common import make_payload
from vibemq_server.buildinfo import describe
from vibemq_server.config import Config
from vibemq_server.core import QueueManager
from vibemq_server.logs import configure_logging
from vibemq_server.protocol import CommandType, FrameDecoder, Message, encode
from vibemq_server.protocol.bigcopy import Fill, read_through
from vibemq_server.server.allocator import tune_allocator
from vibemq_server.server.session import Session

#: 64 bytes of JSON, as the socket benchmarks send
PAYLOAD = json.dumps({"seq": 0, "data": "x" * 42}).encode()
assert len(PAYLOAD) == 64


class CollectingLink:
    """A transport that is always writable and keeps what the session writes."""

    peer_identity: str | None = None
    over_tls = False
    reading_paused = False
    writable = True

    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        self.peer_host = "127.0.0.1"
        self.log: Any = structlog.get_logger("micro")
        self.out: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.out.append(data)

    def send_parts(self, parts: list[bytes]) -> None:
        self.out.extend(parts)

    def take(self) -> bytes:
        data = b"".join(self.out)
        self.out.clear()
        return data

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        pass

    def call_soon(self, callback: Callable[[], None]) -> None:
        callback()

    def offload(self, work: Callable[[], Any], then: Callable[[Any], None]) -> None:
        then(work())

    def time(self) -> float:
        return 0.0

    #: the session's fill its next bytes are read into (``Link.read_into``), if any
    into: Fill | None = None

    def read_into(self, fill: Fill) -> None:
        self.into = fill if len(fill) else None


def feed(session: Session, link: CollectingLink, data: bytes) -> float:
    """One read to the session as the transport passes it on, and the CPU seconds the
    session spent: while it has asked for its next bytes in a fill (``read_into``), they go
    straight there (the socket read's own copy, made by the kernel either way: not timed)
    and the session is told with ``data_received(b"")``."""
    spent = 0.0

    def received(chunk: bytes) -> None:
        nonlocal spent
        t0 = time.process_time()
        session.data_received(chunk)
        spent += time.process_time() - t0

    read_through(data, lambda: link.into, received)
    return spent


def ack_frames(deliveries: bytes, decoder: FrameDecoder, with_queue: bool = False) -> bytes:
    """An Ack (header messageId, as the client library sends it) per Deliver in
    ``deliveries``; ``with_queue``: with the Deliver's queue in its queue field, as the
    client library sends it too."""
    out = []
    for body in decoder.feed(deliveries):
        if body[1] == CommandType.DELIVER:
            n = body[2] << 8 | body[3]
            msg_id = body[4 : 4 + n].decode()
            queue = ""
            if with_queue:
                qn = body[4 + n] << 8 | body[5 + n]
                queue = body[6 + n : 6 + n + qn].decode()
            out.append(
                encode(Message(CommandType.ACK, f"a{msg_id}", queue, headers={"messageId": msg_id}))
            )
    return b"".join(out)


def run(
    messages: int, batch: int, prefetch: int, size: int = 0, read: int = 0
) -> tuple[float, int]:
    """CPU seconds for ``messages`` through the path, and how many were acked."""
    config = Config(queue_defaults={"durable": False})
    manager = QueueManager(config.queue_defaults)
    pub_link, sub_link = CollectingLink("pub"), CollectingLink("sub")
    pub = Session(pub_link, manager, config)  # type: ignore[arg-type]
    sub = Session(sub_link, manager, config)  # type: ignore[arg-type]
    pub.data_received(encode(Message(CommandType.CONNECT, "c1")))
    sub.data_received(encode(Message(CommandType.CONNECT, "c2")))
    subscribe = Message(CommandType.SUBSCRIBE, "s", "bench", headers={"prefetch": str(prefetch)})
    sub.data_received(encode(subscribe))
    pub_link.take()
    sub_link.take()
    # The publisher's reads, encoded beforehand (the generator's work, not the broker's).
    reads = [
        b"".join(
            encode(
                Message(
                    CommandType.PUBLISH,
                    f"m{i}",
                    "bench",
                    make_payload(i, size) if size else PAYLOAD,
                )
            )
            for i in range(start, min(start + batch, messages))
        )
        for start in range(0, messages, batch)
    ]
    if read:  # the stream as the socket gives it: reads of ``read`` bytes, frames cut anywhere
        stream = b"".join(reads)
        reads = [stream[at : at + read] for at in range(0, len(stream), read)]
    client = FrameDecoder()
    spent = 0.0
    for data in reads:
        spent += feed(pub, pub_link, data)
        acks = ack_frames(sub_link.take(), client)
        pub_link.take()
        t0 = time.process_time()
        sub.data_received(acks)
        spent += time.process_time() - t0
    acked = manager.queues["bench"].n_acked
    return spent, acked


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=100, help="Publish frames per publisher read")
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=5, help="runs; the best is reported")
    p.add_argument("--size", type=int, default=0, help="payload bytes (0: the 64-byte one)")
    p.add_argument("--read", type=int, default=0, help="publisher read size (0: one per batch)")
    a = p.parse_args(argv)
    configure_logging("warning")
    tune_allocator(os.environ)  # (as the broker does at start: no page faults per payload)
    gc.freeze()
    best = float("inf")
    for _ in range(a.repeat):
        spent, acked = run(a.messages, a.batch, a.prefetch, a.size, a.read)
        if acked != a.messages:
            print(f"only {acked:,} of {a.messages:,} acked", file=sys.stderr)
            return 1
        best = min(best, spent)
    us = best / a.messages * 1e6
    per_mb = f", {us / (a.size / 1e6) / 1000:.3f} ms/MB" if a.size else ""
    print(
        f"native 1 -> 1 in process ({describe()}, payload {a.size or len(PAYLOAD)} B): "
        f"{us:.2f} us CPU/message{per_mb}, best of {a.repeat}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
