"""The journal's own work per message, without sockets: ``Journal.published``, ``delivered``
and ``settled_all`` (a read's acks) for ``--messages`` messages of one durable queue, a flush
every ``--batch`` (as one loop turn would), ``fsync = never`` (the fsync runs in the writer
thread anyway). Prints CPU µs per message (best of ``--rounds``); on a busy machine count
instructions instead, which do not move with the load (``--rounds 0`` is the baseline: the
same start-up and messages, no journal calls; subtract and divide by ``--messages``)::

    .venv/bin/python -m bench.journal_cost --messages 200000
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python -m bench.journal_cost --messages 20000 --rounds 1   # then --rounds 0
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path

import structlog

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vibemq_server.core.manager import QueueManager
from vibemq_server.core.message import EMPTY_HEADERS, StoredMessage
from vibemq_server.core.persistence import SettleReason
from vibemq_server.journal.journal import FsyncPolicy, Journal


async def run(messages: int, batch: int, rounds: int) -> list[float]:
    journal = Journal(Path(tempfile.mkdtemp(prefix="bench-journal-cost-")), fsync=FsyncPolicy.NEVER)
    manager = QueueManager()
    manager.persistence = journal
    journal.recover(manager)
    journal.start(manager)
    queue, _ = manager.create_queue("bench-durable-queue", manager.options_from({"durable": True}))
    payload = b'{"n":%08d,"pad":"' + b"x" * 42 + b'"}'  # 64 bytes once formatted
    msgs = []
    for i in range(messages):
        msg = StoredMessage(
            f"m-{i:08d}", queue.name, payload % i, EMPTY_HEADERS, 1_700_000_000_000 + i // 40
        )
        msg.seq = i + 1
        msgs.append(msg)
    results = []
    for _ in range(rounds):
        started = time.process_time()
        for k in range(0, messages, batch):
            chunk = msgs[k : k + batch]
            for msg in chunk:
                journal.published(queue, msg, True)
            for msg in chunk:
                msg.attempts += 1
                journal.delivered(queue, msg)
            journal.settled_all(queue, chunk, SettleReason.ACKED)
            journal._flush()
        if messages:
            results.append((time.process_time() - started) / messages * 1e6)
    await journal.close()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=500, help="messages per flush")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    results = asyncio.run(run(args.messages, args.batch, args.rounds))
    if results:
        runs = ", ".join(f"{r:.2f}" for r in results)
        print(f"journal CPU per message: best {min(results):.2f} us (rounds: {runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
