"""Issue 15's many-queues curve in one process, without sockets: CPU per message by queue count.

``bench.many_queues --connections per-process`` in miniature: for each count of queues,
``min(20, count)`` publisher sessions and as many subscriber sessions
(``vibemq_server.server.session.Session``) on one ``QueueManager``, behind links that only
collect what would be written. Queue ``i`` belongs to pair ``i % 20``; the subscriber of a
pair is subscribed to all of its queues, the publisher publishes to them in turn (message
``j`` to the pair's queue ``j mod n``), ``--batch`` Publish frames a read, as the socket
benchmark's generators write them. The subscriber answers each read's Delivers with Acks
``--lag`` rounds later, so up to ``batch * (lag + 1)`` messages are in flight per pair (900
by default, 18,000 at 20 pairs: the socket benchmark's window is 1,000 per publisher; more
than the prefetch would pile messages up in the queue). The manager's housekeeping ``tick``
runs every ``--tick-every`` messages, as often as the broker's 100 ms timer at the socket
benchmark's rate. What is timed
is the broker's own work (codec, session, core): no event loop, no socket, no other process,
so the curve holds on a busy machine. Best of ``--repeat`` runs per count, counts alternating.

    PYTHONPATH=. .venv/bin/python -m bench.manyq_micro
    PYTHONPATH=. .venv/bin/python -m bench.manyq_micro --counts 1,10000 --messages 100000

Under callgrind (instructions and, with ``--cache-sim=yes``, cache misses per message):
``--counts 10000 --repeat 1`` with ``--toggle-collect`` on the sessions' ``data_received``.
"""

from __future__ import annotations

import argparse
import collections
import gc
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.native_micro import PAYLOAD, CollectingLink, ack_frames
from vibemq_server.buildinfo import describe
from vibemq_server.config import Config
from vibemq_server.core import QueueManager
from vibemq_server.core.queue import Consumer
from vibemq_server.logs import configure_logging
from vibemq_server.protocol import CommandType, FrameDecoder, Message, encode
from vibemq_server.server.session import Session

PAIRS = 20
#: the cyclic collector's runs per generation during each ``run`` (its last one is printed)
_GC_RUNS: list[list[int]] = []


def _session(manager: QueueManager, config: Config, name: str) -> tuple[Session, CollectingLink]:
    link = CollectingLink(name)
    session = Session(link, manager, config)  # type: ignore[arg-type]
    session.data_received(encode(Message(CommandType.CONNECT, f"c-{name}")))
    link.take()
    return session, link


def run(
    count: int,
    messages: int,
    batch: int,
    lag: int,
    prefetch: int,
    tick_every: int,
    ack_queue: bool = False,
) -> tuple[float, int]:
    """CPU seconds for ``messages`` through ``count`` queues, and how many were acked."""
    config = Config(queue_defaults={"durable": False})
    manager = QueueManager(config.queue_defaults)
    pairs = min(PAIRS, count)
    per_pair = messages // pairs
    work = []
    for k in range(pairs):
        queues = [f"mq-{i}" for i in range(k, count, pairs)]
        pub, pub_link = _session(manager, config, f"pub{k}")
        sub, sub_link = _session(manager, config, f"sub{k}")
        for q in queues:
            sub.data_received(
                encode(
                    Message(CommandType.SUBSCRIBE, f"s-{q}", q, headers={"prefetch": str(prefetch)})
                )
            )
        sub_link.take()
        n = len(queues)
        frames = [
            encode(Message(CommandType.PUBLISH, f"m{k}-{j:08d}", queues[j % n], PAYLOAD))
            for j in range(per_pair)
        ]
        reads = [b"".join(frames[i : i + batch]) for i in range(0, per_pair, batch)]
        work.append((pub, pub_link, sub, sub_link, reads, FrameDecoder(), collections.deque()))
    gc.collect()
    gc0 = [g["collections"] for g in gc.get_stats()]
    spent = 0.0
    rounds = max(len(w[4]) for w in work)
    clock = time.process_time
    since_tick = 0
    for r in range(rounds + lag):
        since_tick += pairs * batch
        if tick_every and since_tick >= tick_every:
            since_tick = 0
            t0 = clock()
            manager.tick()
            spent += clock() - t0
        for pub, pub_link, sub, sub_link, reads, client, pending in work:
            if r < len(reads):
                t0 = clock()
                pub.data_received(reads[r])
                spent += clock() - t0
                pub_link.take()
            # the subscriber's Acks for what it got, answered ``lag`` rounds later
            pending.append(ack_frames(sub_link.take(), client, ack_queue))
            if len(pending) > lag or r >= len(reads):
                acks = pending.popleft()
                if acks:
                    t0 = clock()
                    sub.data_received(acks)
                    spent += clock() - t0
    for _, _, sub, sub_link, _, client, pending in work:
        pending.append(ack_frames(sub_link.take(), client, ack_queue))
        while pending:
            acks = pending.popleft()
            if acks:
                t0 = clock()
                sub.data_received(acks)
                spent += clock() - t0
    acked = sum(q.n_acked for q in manager.queues.values())
    _GC_RUNS.append([g["collections"] - c for g, c in zip(gc.get_stats(), gc0, strict=True)])
    return spent, acked


class _Idle(Consumer):
    """A consumer that takes every delivery and does nothing with it."""

    writable = True

    def deliver(self, sub: object, msg: object) -> None:
        pass

    def subscription_cancelled(self, sub: object, reason: str) -> None:
        pass


def tick_cost(count: int, ticks: int = 100) -> float:
    """CPU ms of one ``tick`` with ``count`` queues, each with a subscription holding one
    delivery (none due)."""
    config = Config(queue_defaults={"durable": False})
    manager = QueueManager(config.queue_defaults)
    consumer = _Idle()
    for i in range(count):
        manager.subscribe(f"q{i}", f"s{i}", consumer, 1000)
        manager.publish(f"q{i}", f"m{i}", b"{}", {})
    t0 = time.process_time()
    for _ in range(ticks):
        manager.tick()
    return (time.process_time() - t0) / ticks * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--counts", default="1,10,100,1000,10000")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=100, help="Publish frames per publisher read")
    p.add_argument("--lag", type=int, default=8, help="rounds before a read's Acks are sent")
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument(
        "--tick-every",
        type=int,
        default=2000,
        help="messages between two housekeeping ticks (the broker ticks every 100 ms:\n"
        "2,000 is 20,000 msg/s, the socket benchmark's rate; 0: no tick)",
    )
    p.add_argument("--repeat", type=int, default=3, help="runs per count; the best is reported")
    p.add_argument(
        "--acks",
        choices=("queue", "bare"),
        default="bare",
        help="bare: an empty queue field in each Ack; queue: the Deliver's queue, as the\n"
        "client library sends it",
    )
    p.add_argument(
        "--tick-cost",
        action="store_true",
        help="only time the manager's tick, each queue's subscription holding a delivery",
    )
    a = p.parse_args(argv)
    counts = [int(c) for c in a.counts.split(",")]
    configure_logging("warning")
    if a.tick_cost:
        for count in counts:
            print(f"  {count:>6,} queues: tick {tick_cost(count):.3f} ms CPU ({describe()})")
        return 0
    # The broker's collector settings (cli.serve): with the default gen-0 threshold the
    # collector would walk the in-flight messages of every queue far more often than there.
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    best = dict.fromkeys(counts, float("inf"))
    collections = {count: [0, 0, 0] for count in counts}
    for _ in range(a.repeat):
        for count in counts:
            spent, acked = run(
                count, a.messages, a.batch, a.lag, a.prefetch, a.tick_every, a.acks == "queue"
            )
            expected = a.messages // min(PAIRS, count) * min(PAIRS, count)
            if acked != expected:
                print(f"{count} queues: only {acked:,} of {expected:,} acked", file=sys.stderr)
                return 1
            best[count] = min(best[count], spent / expected * 1e6)
            collections[count] = _GC_RUNS[-1]
    print(f"many queues in process ({describe()}), best of {a.repeat}, lag {a.lag}, acks {a.acks}:")
    for count in counts:
        rel = best[count] / best[counts[0]]
        gcs = "/".join(map(str, collections[count]))
        print(
            f"  {count:>6,} queues: {best[count]:6.2f} us CPU/message  ({rel:.2f}x)"
            f"  gc runs gen0/1/2 in the last run: {gcs}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
