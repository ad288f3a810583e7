"""Silent loss made visible: every drop path counts into its queue's stats, and the first drop
of a queue is a warning line at once, the next ones at most one line a minute with their
count (structlog capture; the core's clock is a ManualClock, so nothing sleeps)."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from vibemq_server.config import QueueDefaults
from vibemq_server.core import ManualClock, QueueManager, StoredMessage, Subscription
from vibemq_server.core.drops import DROP_LOG_INTERVAL_MS
from vibemq_server.core.queue import Consumer

Logs = list[MutableMapping[str, Any]]


class Sink(Consumer):
    """A consumer that takes everything (the core's port)."""

    writable = True

    def __init__(self) -> None:
        self.got: list[str] = []

    def deliver(self, sub: Subscription, msg: StoredMessage) -> None:
        self.got.append(msg.id)

    def subscription_cancelled(self, sub: Subscription, reason: str) -> None:
        pass


@pytest.fixture
def logs() -> Iterator[Logs]:
    with capture_logs() as entries:
        yield entries


def drop_lines(logs: Logs) -> Logs:
    return [e for e in logs if e["event"] in ("first message dropped", "messages dropped")]


def fill(mgr: QueueManager, queue: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        mgr.publish(queue, f"m{i}", b"{}", {})


def test_drop_oldest_counts_every_drop_and_logs_the_first_at_once(
    mgr: QueueManager, clock: ManualClock, logs: Logs
) -> None:
    mgr.create_queue("q", mgr.options_from({"maxQueueSize": 2}))
    fill(mgr, "q", 5)
    assert mgr.queues["q"].n_dropped == 3
    assert [m.id for m in mgr.queues["q"].ready()] == ["m3", "m4"]
    lines = drop_lines(logs)
    assert len(lines) == 1, lines
    first = lines[0]
    assert first["event"] == "first message dropped"
    assert first["log_level"] == "warning"
    assert (first["queue"], first["dropped"], first["reason"]) == ("q", 1, "QueueOverflow")
    assert "DropNewest" in first["hint"] and "maxQueueSize" in first["hint"]


def test_later_drops_make_at_most_one_line_a_minute_with_their_count(
    mgr: QueueManager, clock: ManualClock, logs: Logs
) -> None:
    mgr.create_queue("q", mgr.options_from({"maxQueueSize": 1}))
    fill(mgr, "q", 2)  # one drop: the first line
    fill(mgr, "q", 4, start=2)  # four more within the minute: held back
    mgr.tick()
    assert len(drop_lines(logs)) == 1
    clock.advance(DROP_LOG_INTERVAL_MS - 1)
    mgr.tick()
    assert len(drop_lines(logs)) == 1
    clock.advance(1)
    mgr.tick()  # the minute has passed: the held-back count goes out, once
    mgr.tick()
    lines = drop_lines(logs)
    assert len(lines) == 2, lines
    assert lines[1]["event"] == "messages dropped"
    assert (lines[1]["dropped"], lines[1]["dropped_total"]) == (4, 5)
    # Quiet until the next minute again, whatever the drops meanwhile.
    fill(mgr, "q", 3, start=6)
    mgr.tick()
    assert len(drop_lines(logs)) == 2
    clock.advance(DROP_LOG_INTERVAL_MS)
    mgr.tick()
    lines = drop_lines(logs)
    assert len(lines) == 3 and lines[2]["dropped"] == 3
    assert mgr.queues["q"].n_dropped == 8


def test_each_queue_has_its_own_first_line(mgr: QueueManager, logs: Logs) -> None:
    for name in ("a", "b"):
        mgr.create_queue(name, mgr.options_from({"maxQueueSize": 1}))
        fill(mgr, name, 3)
    assert [line["queue"] for line in drop_lines(logs)] == ["a", "b"]


def test_drop_newest_counts_and_logs(mgr: QueueManager, logs: Logs) -> None:
    mgr.create_queue("q", mgr.options_from({"maxQueueSize": 1, "overflowStrategy": "DropNewest"}))
    fill(mgr, "q", 3)
    assert mgr.queues["q"].n_dropped == 2
    assert [m.id for m in mgr.queues["q"].ready()] == ["m0"]
    assert len(drop_lines(logs)) == 1


def test_redirect_without_dlq_is_refused_and_counted(mgr: QueueManager, logs: Logs) -> None:
    mgr.create_queue(
        "q", mgr.options_from({"maxQueueSize": 1, "overflowStrategy": "RedirectToDlq"})
    )
    fill(mgr, "q", 2)
    assert mgr.queues["q"].n_dropped == 1
    assert len(drop_lines(logs)) == 1


def test_dead_letter_queue_overflow_counts_on_the_dlq(clock: ManualClock, logs: Logs) -> None:
    mgr = QueueManager(QueueDefaults(max_queue_size=2), clock)
    mgr.create_queue(
        "q",
        mgr.options_from(
            {"maxQueueSize": 1, "overflowStrategy": "RedirectToDlq", "enableDeadLetterQueue": True}
        ),
    )
    fill(mgr, "q", 5)  # m0 stays; m1..m4 to the DLQ, which holds 2
    assert mgr.queues["q"].n_dead_lettered == 4
    assert mgr.queues["q.dlq"].n_dropped == 2
    assert [line["queue"] for line in drop_lines(logs)] == ["q.dlq"]


def test_retries_exhausted_without_dlq_is_a_logged_drop(
    mgr: QueueManager, clock: ManualClock, logs: Logs
) -> None:
    mgr.create_queue("q", mgr.options_from({"maxRetryAttempts": 1, "ackTimeout": 10}))
    sink = Sink()
    mgr.subscribe("q", "s", sink, 10)
    fill(mgr, "q", 1)
    clock.advance(11)
    mgr.tick()
    assert sink.got == ["m0"]
    assert mgr.queues["q"].n_dropped == 1
    lines = drop_lines(logs)
    assert len(lines) == 1 and lines[0]["reason"] == "MaxRetriesExceeded"


def test_expiry_reject_and_purge_count_without_a_warning(
    mgr: QueueManager, clock: ManualClock, logs: Logs
) -> None:
    """Meant so: a TTL, a consumer's reject without a dead-letter queue, an operator's purge
    are counted as drops but are not silent loss."""
    mgr.create_queue("q", mgr.options_from({"messageTtl": 5}))
    fill(mgr, "q", 2)
    clock.advance(6)
    mgr.tick()
    sink = Sink()
    sub = mgr.subscribe("q", "s", sink, 10)
    fill(mgr, "q", 1, start=2)
    assert mgr.nack(sub, "m2", requeue=False)
    mgr.unsubscribe(sub)
    fill(mgr, "q", 3, start=3)
    assert mgr.purge("q") == 3
    queue = mgr.queues["q"]
    assert (queue.n_expired, queue.n_dropped) == (2, 2 + 1 + 3)
    assert drop_lines(logs) == []


def test_a_deleted_queue_keeps_its_counts_in_the_totals_and_starts_afresh(
    mgr: QueueManager, logs: Logs
) -> None:
    mgr.create_queue("q", mgr.options_from({"maxQueueSize": 1}))
    fill(mgr, "q", 3)
    mgr.delete_queue("q")
    assert (mgr.retired_stats.n_published, mgr.retired_stats.n_dropped) == (3, 2)
    mgr.create_queue("q", mgr.options_from({"maxQueueSize": 1}))
    fill(mgr, "q", 2)
    assert [line["event"] for line in drop_lines(logs)] == ["first message dropped"] * 2
