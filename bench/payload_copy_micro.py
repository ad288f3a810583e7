"""A large payload's one copy out of its socket read, by how many payloads the broker holds.

Issue 16 (docs/performance.md, "Fourteenth round, native at 64 KiB"): perf put the 64 KiB
payload's copy (``rep movsb``, the same instructions either way) ~0.8 µs slower a message on
the native broker than on our MQTT one. This replays the broker's order in one process, with
nothing else between: a 256,000-byte socket read lands in a fresh ``bytes``
(``_bigcopy.ReadBuffer``, as the transport reads), each whole payload in it is sliced out
(the copy, timed alone), optionally JSON-checked (``--checks``, timed alone too: ``src``
over the read right before the copy, ``dst`` over the copy right after it, ``late`` over
each copy once all of the read's are made, the broker's order today), then sent through a
second socket (the delivery's ``writev`` reads it) and kept until ``depth`` payloads are
held, then the oldest freed (``fifo``: acks free them in delivery order) or the newest
(``lifo``, for contrast). The copy's destination is the block the allocator hands back,
freed ``depth`` payloads ago: how warm it is is the question.

    .venv/bin/python -m bench.payload_copy_micro
    .venv/bin/python -m bench.payload_copy_micro --depths 16,128 --checks none --orders fifo,lifo

Needs the C extensions (``scripts/build_ext.sh``). Wall-clock: the medians of each copy's
and each check's ``perf_counter_ns`` (its ~50 ns included), best compared within one run.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import socket
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vibemq_server.protocol._bigcopy import ReadBuffer
from vibemq_server.protocol._jsoncheck import valid
from vibemq_server.server.allocator import tune_allocator
from vibemq_server.server.transport import COPY_BELOW, READ_SIZE

#: bytes of a frame before its payload (a native Publish's head, about)
HEAD = 64


def one_run(
    size: int, depth: int, check: str, order: str, reads: int
) -> tuple[float, float, float]:
    """The copies' median, the checks' median, and their sum, µs."""
    frame = HEAD + size
    payload = b'{"k":"' + b"x" * (size - 8) + b'"}'
    stream = (b"h" * HEAD + payload) * (2 * READ_SIZE // frame + 2)
    src, dst = socket.socketpair()
    src.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * READ_SIZE)
    out, drain = socket.socketpair()
    out.setblocking(False)
    drain.setblocking(False)
    sink = bytearray(READ_SIZE)
    reader = ReadBuffer(COPY_BELOW)
    held: collections.deque[bytes] = collections.deque()
    times: list[int] = []
    checks: list[int] = []
    try:
        for _ in range(reads):
            src.sendall(stream[:READ_SIZE])
            buf = reader.get(READ_SIZE)
            data = reader.take(dst.recv_into(buf))
            pos = HEAD
            copies: list[bytes] = []
            while pos + size <= len(data):
                if check == "src":
                    t0 = time.perf_counter_ns()
                    valid(memoryview(data)[pos : pos + size])
                    checks.append(time.perf_counter_ns() - t0)
                t0 = time.perf_counter_ns()
                copy = data[pos : pos + size]
                times.append(time.perf_counter_ns() - t0)
                if check == "dst":
                    t0 = time.perf_counter_ns()
                    valid(copy)
                    checks.append(time.perf_counter_ns() - t0)
                copies.append(copy)
                pos += frame
            for copy in copies:
                if check == "late":
                    t0 = time.perf_counter_ns()
                    valid(copy)
                    checks.append(time.perf_counter_ns() - t0)
                with contextlib.suppress(BlockingIOError):
                    out.send(copy)  # (the delivery: the kernel reads the copy)
                held.append(copy)
            del copies
            try:
                while drain.recv_into(sink):
                    pass
            except BlockingIOError:
                pass
            while len(held) > depth:
                if order == "fifo":
                    held.popleft()
                else:
                    held.pop()
            del data
    finally:
        for sock in (src, dst, out, drain):
            sock.close()
    return median(times), median(checks), median(times) + median(checks)


def median(values: list[int]) -> float:
    """µs (0 for none)."""
    return sorted(values)[len(values) // 2] / 1000 if values else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--depths", default="4,16,64,128,512,1000", help="payloads held")
    parser.add_argument("--checks", default="none,src,dst,late", help="where the JSON check runs")
    parser.add_argument("--orders", default="fifo", help="which held payload is freed")
    parser.add_argument("--reads", type=int, default=3000, help="socket reads a case")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--untuned", action="store_true", help="glibc's adaptive thresholds (no tune_allocator)"
    )
    args = parser.parse_args(argv)
    if args.size + HEAD > READ_SIZE:
        parser.error(f"--size: a whole payload must fit in one read ({READ_SIZE} bytes)")
    if not args.untuned:
        tune_allocator(os.environ)
    for _ in range(args.repeat):
        for order in args.orders.split(","):
            for depth in map(int, args.depths.split(",")):
                for check in args.checks.split(","):
                    copy, checked, both = one_run(args.size, depth, check, order, args.reads)
                    print(
                        f"{args.size} B, {depth:5} held ({order}), check {check:4}: median "
                        f"copy {copy:.2f} µs, check {checked:.2f} µs, both {both:.2f} µs",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
