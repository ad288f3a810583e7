"""Instructions of the AMQP frame parser a message when its frames are cut over small reads,
for callgrind (issue 15: a small frame cut over reads): ``pub``, 4,000 basic.publishes of
``--body`` bytes (method, content header and body frames, fused as the broker parses them);
``ack``, 20,000 basic.acks; both fed in reads of ``--read`` bytes (1,500: a segment's worth,
as a broker reads a client that is not pipelining). Only ``FrameParser.feed`` is counted::

    PYTHONPATH=$PWD valgrind --tool=callgrind --callgrind-out-file=pub.out \\
        --toggle-collect='CPyPy_amqp___codec___FrameParser___feed' \\
        .venv/bin/python -m bench.amqp_parse_cost pub --body 2048
    callgrind_annotate pub.out | grep -E 'PROGRAM TOTALS|memcpy'

(the compiled build's entry point: instructions a message are the PROGRAM TOTALS over the
count). Without callgrind it prints the CPU microseconds a message, best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import time

from bench.amqp_driver import encode_ack, encode_publish
from vibemq_server.adapters.amqp.codec import PROTOCOL_HEADER, FrameParser


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("kind", choices=("pub", "ack"))
    ap.add_argument("--body", type=int, default=2048, help="body bytes of a publish")
    ap.add_argument("--read", type=int, default=1500, help="bytes a read")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    if args.kind == "pub":
        count = 4000
        stream = encode_publish(b"bench", b"x" * args.body) * count
    else:
        count = 20_000
        stream = b"".join(encode_ack(tag + 1) for tag in range(count))
    step = args.read
    reads = [stream[a : a + step] for a in range(0, len(stream), step)]
    best = float("inf")
    for _ in range(args.repeat):
        parser = FrameParser(1 << 20, fuse_publish=True)
        parser.feed(PROTOCOL_HEADER)
        t0 = time.process_time()
        got = sum(len(parser.feed(read)) for read in reads)
        best = min(best, time.process_time() - t0)
        # (a publish is one fused frame when read whole, three when cut: at least one each)
        if not count <= got <= 3 * count:
            raise SystemExit(f"decoded {got} frames for {count} messages")
    print(f"{args.kind} body {args.body} reads {step}: {best / count * 1e6:.3f} us a message")


if __name__ == "__main__":
    main()
