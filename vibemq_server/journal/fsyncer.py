"""The journal's fsync threads: requests in, completions out, one eventfd to wake the loop.

The journal hands each fsync to one of a few long-lived threads and reads its completions
back when the eventfd becomes readable (``loop.add_reader``): one loop wake-up per batch of
completed fsyncs, no Future per fsync, no callback chain. :mod:`._fsyncer` (C, optional)
runs the threads without the GIL, so a completed fsync never waits for the busy loop to
hand the GIL over (py-spy showed the executor's worker waiting for it five times longer
than it spent in ``fsync``, before and after each one). :class:`PyFsyncs` is the same in
Python: the fallback, and what a journal with its own ``SystemCalls`` (the tests' failing
or gated fsync) uses.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

#: (the fsync's number, how long it took in seconds, its error or None)
Completion = tuple[int, float, Exception | None]


class Fsyncs(Protocol):
    """fsync threads fed by ``request`` and drained by ``completed``."""

    def fileno(self) -> int:
        """The eventfd that becomes readable when fsyncs have completed."""
        ...

    def request(self, fd: int, number: int, /) -> None:
        """fsync ``fd`` in a thread; ``number`` names it in ``completed``."""
        ...

    def completed(self) -> list[Completion]:
        """The fsyncs completed since the last call, in the order they completed (and the
        eventfd read empty)."""
        ...

    def close(self) -> None:
        """Finish the requested fsyncs, stop the threads, close the eventfd."""
        ...


class PyFsyncs:
    """:class:`Fsyncs` with Python threads calling ``fsync`` (a ``SystemCalls.fsync``)."""

    def __init__(self, fsync: Callable[[int], None], threads: int) -> None:
        self._fsync = fsync
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._cond = threading.Condition()
        self._requests: deque[tuple[int, int] | None] = deque()
        self._done: list[Completion] = []
        self._threads = [
            threading.Thread(target=self._run, name="vibemq-fsync", daemon=True)
            for _ in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def fileno(self) -> int:
        if self._efd < 0:
            raise ValueError("closed")
        return self._efd

    def request(self, fd: int, number: int, /) -> None:
        if self._efd < 0:
            raise ValueError("closed")
        with self._cond:
            self._requests.append((fd, number))
            self._cond.notify()

    def completed(self) -> list[Completion]:
        if self._efd >= 0:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._efd)
        with self._cond:
            done, self._done = self._done, []
        return done

    def close(self) -> None:
        if self._efd < 0:
            return
        with self._cond:
            self._requests.extend([None] * len(self._threads))
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()
        os.close(self._efd)
        self._efd = -1

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._requests:
                    cond.wait()
                request = self._requests.popleft()
            if request is None:
                return
            fd, number = request
            err: Exception | None = None
            started = time.perf_counter()
            try:
                self._fsync(fd)
            except Exception as exc:  # reported to the journal, which fails its waiters
                err = exc
            completion = (number, time.perf_counter() - started, err)
            with cond:
                self._done.append(completion)
            os.eventfd_write(self._efd, 1)


def new_fsyncs(fsync: Callable[[int], None], threads: int, *, native: bool) -> Fsyncs:
    """The C threads when built and ``native`` (the real ``os.fsync``), else Python's."""
    if native and Compiled is not None:
        return Compiled(threads)
    return PyFsyncs(fsync, threads)


Compiled: Callable[[int], Fsyncs] | None
try:
    from vibemq_server.journal._fsyncer import Fsyncs as _CFsyncs
except ImportError:  # not built: Python threads
    Compiled = None
else:
    Compiled = _CFsyncs
