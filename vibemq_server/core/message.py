"""The message as the core stores it: protocol-neutral, compact (slots), payload as raw bytes."""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum

EMPTY_HEADERS: Mapping[str, str] = {}


class Priority(IntEnum):
    LOW = 0
    NORMAL = 1
    HIGH = 2
    CRITICAL = 3


_PRIORITY_NAMES = {p.name.lower(): p for p in Priority} | {str(int(p)): p for p in Priority}


def parse_priority(value: str | None) -> Priority:
    """The ``priority`` header, case-insensitive by name or by number; unknown means Normal."""
    if not value:
        return Priority.NORMAL
    return _PRIORITY_NAMES.get(value.lower(), Priority.NORMAL)


class StoredMessage:
    """One message in a queue. ``attempts`` counts deliveries made so far."""

    __slots__ = (
        "attempts",
        "expires_at",
        "group",
        "headers",
        "id",
        "payload",
        "priority",
        "published_at",
        "queue",
        "seg",
        "seq",
        "single",
        "target",
    )

    def __init__(
        self,
        msg_id: str,
        queue: str,
        payload: bytes,
        headers: Mapping[str, str],
        published_at: int,
        expires_at: int = 0,
        priority: Priority = Priority.NORMAL,
        attempts: int = 0,
    ) -> None:
        self.id = msg_id
        self.queue = queue
        self.payload = payload
        self.headers = headers
        self.published_at = published_at
        self.expires_at = expires_at
        self.priority = priority
        self.attempts = attempts
        # A fan-out copy that came back unacked goes to one subscriber, not to all again.
        self.single = False
        # The subscription a timed-out fan-out copy belongs to (a Subscription; typed loosely
        # to keep this module free of the queue module).
        self.target: object = None
        # Journal identity: a broker-wide sequence number and the segment holding the record.
        self.seq = 0
        self.seg = 0
        # Fan-out copies share one counter of copies not yet settled: the message is settled
        # in the journal when the last copy is.
        self.group: list[int] | None = None

    def copy(self) -> StoredMessage:
        dup = StoredMessage(
            self.id,
            self.queue,
            self.payload,
            self.headers,
            self.published_at,
            self.expires_at,
            self.priority,
            self.attempts,
        )
        dup.seq = self.seq
        dup.seg = self.seg
        dup.group = self.group
        return dup

    def expired(self, now: int) -> bool:
        return 0 < self.expires_at <= now
