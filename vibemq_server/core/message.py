"""The message as the core stores it: protocol-neutral, compact (slots), payload as raw bytes."""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Final

#: (Final: the compiled modules that import it read a C static, not this module's dict)
EMPTY_HEADERS: Final[Mapping[str, str]] = {}


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
    """One message in a queue. ``attempts`` counts deliveries made so far.

    A million of these wait in a deep queue, so every slot counts: eleven slots make a
    128-byte object (with the GC header), each two more cost 16 bytes. The fields only
    fan-out queues use live in :class:`FanOutMessage`; here they read as their defaults.
    Publishers share one empty ``headers`` (:data:`EMPTY_HEADERS`), one queue name and one
    ``published_at`` per clock tick, so a message owns little besides its id and payload."""

    __slots__ = (
        "attempts",
        "deadline",
        "expires_at",
        "headers",
        "id",
        "payload",
        "priority",
        "published_at",
        "queue",
        "seg",
        "seq",
    )

    #: fan-out copies share one counter of copies not yet settled: the message is settled
    #: in the journal when the last copy is (a slot of FanOutMessage; None here)
    group: list[int] | None = None
    #: the subscription a timed-out fan-out copy goes back to (a Subscription, or
    #: ANY_SUBSCRIBER; typed loosely to keep this module free of the queue module; a slot of
    #: FanOutMessage, None here)
    target: object = None

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
        # Journal identity: a broker-wide sequence number (0 in a transient queue) and the
        # segment holding the record.
        self.seq = 0
        self.seg = 0
        # While a subscription holds it unacknowledged: when its ack is due (ms). Kept on the
        # message, not in a second dict per subscription: with many queues every message
        # meets another subscription, and one dict less there is one cache miss less.
        self.deadline = 0

    @property
    def single(self) -> bool:
        """A fan-out copy that came back unacked goes to one subscriber, not to all again."""
        return self.target is not None

    def copy(self) -> FanOutMessage:
        """A fan-out copy (same journal identity and group)."""
        dup = FanOutMessage(
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


class FanOutMessage(StoredMessage):
    """A message of a fan-out queue: the fan-out bookkeeping gets its own slots."""

    __slots__ = ("group", "target")

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
        super().__init__(
            msg_id, queue, payload, headers, published_at, expires_at, priority, attempts
        )
        self.group = None
        self.target = None


#: the ``target`` of a returned fan-out copy whose subscriber is gone: any one will do
ANY_SUBSCRIBER = object()


def message_class(fan_out: bool) -> type[StoredMessage]:
    """The class of the messages of a queue (fan-out or not)."""
    return FanOutMessage if fan_out else StoredMessage


def as_fan_out(msg: StoredMessage) -> FanOutMessage:
    """``msg`` itself when it is a FanOutMessage, else a copy that is (journal identity kept)."""
    return msg if isinstance(msg, FanOutMessage) else msg.copy()
