"""Rate-limited warnings about dropped messages: silent loss made visible (issue 14).

The first drop on a queue (or another key, such as an MQTT session) is logged at warning
level at once; after that at most one line per ``interval_ms`` per key, with the count of
drops since the previous line. A drop costs one dict look-up and an int add while a line is
held back; ``flush`` (on the housekeeping timer) writes the held-back counts when due.
"""

from __future__ import annotations

from typing import Any

import structlog

from vibemq_server.core.clock import Clock

log = structlog.get_logger("vibemq.core")

#: At most one line per key per minute after the first.
DROP_LOG_INTERVAL_MS = 60_000

#: What the first line of a key advises, by drop reason (README.md, "When a queue is full").
HINTS = {
    "QueueOverflow": "the queue is full and its overflow strategy drops messages; to refuse "
    "publishes instead use overflowStrategy DropNewest or BlockPublisher, or raise "
    "maxQueueSize (queue_defaults.max_queue_size)",
    "MaxRetriesExceeded": "a message used up its delivery attempts and the queue has no "
    "dead-letter queue (enableDeadLetterQueue) to keep it",
    "SessionBound": "an MQTT client does not keep up: messages beyond "
    "mqtt.max_queued_messages for its session are dropped",
}


class DropLog:
    """Warning lines about drops, by key, at most one per ``interval_ms`` per key."""

    __slots__ = ("_clock", "_held", "_interval", "_kind", "_next")

    def __init__(
        self, clock: Clock, kind: str = "queue", interval_ms: int = DROP_LOG_INTERVAL_MS
    ) -> None:
        self._clock = clock
        self._kind = kind
        self._interval = interval_ms
        #: key -> when its next line may be written (ms)
        self._next: dict[str, int] = {}
        #: key -> [drops not yet logged, the reason of the first of them, fields]
        self._held: dict[str, list[Any]] = {}

    def dropped(self, key: str, reason: str, total: int) -> None:
        """One message of ``key`` was dropped (``total``: its drops so far)."""
        held = self._held.get(key)
        if held is not None:
            held[0] += 1
            held[2] = total
            return
        now = self._clock()
        if now >= self._next.get(key, 0):
            self._line(key, 1, reason, total, first=key not in self._next)
            self._next[key] = now + self._interval
        else:
            self._held[key] = [1, reason, total]

    def flush(self) -> None:
        """Write the held-back counts whose minute has passed."""
        if not self._held:
            return
        now = self._clock()
        for key, (count, reason, total) in list(self._held.items()):
            if now >= self._next.get(key, 0):
                del self._held[key]
                self._line(key, count, reason, total, first=False)
                self._next[key] = now + self._interval

    def forget(self, key: str) -> None:
        """The key is gone (a deleted queue): a new one of that name starts afresh."""
        self._next.pop(key, None)
        self._held.pop(key, None)

    def _line(self, key: str, count: int, reason: str, total: int, *, first: bool) -> None:
        fields: dict[str, Any] = {self._kind: key}
        if first:
            fields["hint"] = HINTS.get(reason, "")
        log.warning(
            "first message dropped" if first else "messages dropped",
            **fields,
            dropped=count,
            dropped_total=total,
            reason=reason,
            next_line_after_s=self._interval // 1000,
        )
