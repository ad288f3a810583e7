"""Replies that may go out only once the persistence has made durable what they confirm.

A reply joins the batch of the persistence's current flush epoch, and each batch registers one
``when_durable`` callback: a thousand publishes recorded before one flush cost one callback and
are answered with one write. A batch grown long (``EARLY_COMMIT`` replies) asks the
persistence to commit early, at that safe point between two publishes, so every protocol gets
it. The protocol says what a batch becomes (acks on success, errors or a dropped connection on
failure); this module knows no protocol.

Batches are handed over in the order they were opened, whatever order the persistence calls
back in (a failing journal fails its newest waiters before the batch its fsync thread still
holds), so a protocol that must acknowledge in order (MQTT) can rely on the order here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final, Generic, TypeVar

from vibemq_server.core.native import mypyc_attr

T = TypeVar("T")

#: replies in one batch after which ``add`` asks the persistence to commit early (every so
#: many more while the batch stays open): a publisher's window of a thousand publishes read in
#: one turn is then committed in parts whose fsyncs overlap the processing of the next part,
#: and the first part's replies go out while the rest waits (a pipeline, not a cycle).
EARLY_COMMIT: Final = 64


@mypyc_attr(allow_interpreted_subclasses=True)
class Flushes:
    """What this needs of a persistence (``core.persistence.Persistence`` subclasses it).

    A base class, not a Protocol: the compiled ``add`` reads ``epoch`` a reply and calls
    ``commit_early`` through the vtable, where a Protocol's are a lookup by name (~400
    instructions a durable publish). Subclasses written in Python (the tests') are allowed and
    called the slow way; one that sets ``epoch`` on its instances declares it as a class
    attribute (it shadows the base's read-only property)."""

    __slots__ = ()

    @property
    def epoch(self) -> int:
        """Counts flushes: everything recorded under one epoch becomes durable together."""
        raise NotImplementedError

    def when_durable(self, callback: Callable[[Exception | None], None]) -> None:
        """Call back once everything recorded so far is as durable as configured."""
        raise NotImplementedError

    def commit_early(self) -> None:
        """A safe point (no publish half recorded): start making what is recorded so far
        durable now, if that can start at once, rather than at the end of the loop turn.
        Never calls back from inside; may do nothing."""
        raise NotImplementedError


class _Batch(Generic[T]):
    __slots__ = ("err", "items", "settled")

    def __init__(self, item: T) -> None:
        self.items = [item]
        self.settled = False
        self.err: Exception | None = None


class DurableReplies(Generic[T]):
    """One connection's replies waiting for the persistence, batched by flush epoch.

    ``done(items, err)`` gets every batch exactly once, in the order of ``add``: ``err`` is
    None when the batch's flush made it durable, else the persistence's error.
    """

    __slots__ = ("_done", "_epoch", "_handing_over", "_open", "_persistence", "_waiting")

    def __init__(
        self, persistence: Flushes, done: Callable[[list[T], Exception | None], None]
    ) -> None:
        self._persistence = persistence
        self._done = done
        self._open: _Batch[T] | None = None  # the batch new replies join
        self._epoch = -1  # the epoch it was opened in
        self._waiting: deque[_Batch[T]] = deque()  # every batch not yet handed over
        self._handing_over = False

    @property
    def waiting(self) -> bool:
        """Replies are waiting for the persistence."""
        return bool(self._waiting)

    def add(self, item: T) -> None:
        """``item`` goes out with everything recorded so far, once that is durable."""
        batch = self._open
        if batch is not None and self._epoch == self._persistence.epoch:
            items = batch.items
            items.append(item)
            if len(items) % EARLY_COMMIT == 0:
                # A safe point (the publish this confirms is recorded whole): a long batch
                # starts its commit now, overlapping the rest of the read's processing.
                self._persistence.commit_early()
            return
        self._open_batch(item)

    def _open_batch(self, item: T) -> None:
        # (apart from ``add``: the callback's closure made the compiled ``add`` allocate its
        # environment on every call, where one call in a batch needs it)
        batch = _Batch(item)
        self._open = batch
        self._epoch = self._persistence.epoch
        self._waiting.append(batch)
        # Registered after the item is in: a persistence may call back at once.
        self._persistence.when_durable(lambda err: self._settled(batch, err))

    def follow(self, item: T) -> bool:
        """Queue a reply that needs no flush behind those waiting, so replies keep their
        order; it shares the fate (and error) of the batch it waits in. False when nothing
        waits: send it now."""
        if not self._waiting:
            return False
        self._waiting[-1].items.append(item)
        return True

    def _settled(self, batch: _Batch[T], err: Exception | None) -> None:
        if batch.settled:
            return  # a persistence calling back twice must not answer twice
        batch.settled = True
        batch.err = err
        if batch is self._open:
            self._open = None
        if self._handing_over:
            return  # ``done`` added a reply that settled at once: the loop below takes it
        self._handing_over = True
        try:
            waiting = self._waiting
            while waiting and waiting[0].settled:
                head = waiting.popleft()
                self._done(head.items, head.err)
        finally:
            self._handing_over = False
