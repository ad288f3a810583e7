"""The tests' one way to wait for something: poll a condition, fail after a bounded time.

``wait_until`` is for synchronous tests (a broker on its own thread or process); ``wait_for``
for async tests, whose broker shares their event loop and must keep running meanwhile. Every
wait here is bounded; none of them measures speed.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

T = TypeVar("T")

TIMEOUT = 5.0


def wait_until(pred: Callable[[], bool], what: str = "", timeout: float = TIMEOUT) -> None:
    """Poll ``pred`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what or pred}")
        time.sleep(0.005)


async def wait_for(cond: Callable[[], bool], timeout: float = TIMEOUT, what: str = "") -> None:
    """Poll ``cond`` in the event loop until it holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, f"condition not met in {timeout}s: {what or cond}"
        await asyncio.sleep(0.001)


class _Durable(Protocol):
    def when_durable(self, callback: Callable[[Exception | None], None], /) -> None: ...


async def durable(journal: _Durable, timeout: float = TIMEOUT) -> Exception | None:
    """What ``journal.when_durable`` calls back with (None: what was written is fsynced),
    waited for in the event loop; fail after ``timeout`` seconds."""
    fut: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def done(err: Exception | None) -> None:
        if not fut.done():
            fut.set_result(err)

    journal.when_durable(done)
    return await asyncio.wait_for(fut, timeout)


class _Deleting(Protocol):
    deleting: bool


class _Reclaims(Protocol):
    @property
    def segments(self) -> Mapping[int, _Deleting]: ...

    def maintain(self) -> None: ...


async def maintained(journal: _Reclaims, timeout: float = TIMEOUT) -> None:
    """The housekeeping's ``journal.maintain()``, and the segment deletions it started (in the
    journal's index thread; a compaction's once its copies are durable) done."""
    journal.maintain()
    await wait_for(
        lambda: not any(seg.deleting for seg in journal.segments.values()),
        timeout,
        what="the segments' deletions",
    )


def recv_by(sock: socket.socket, deadline: float, size: int) -> bytes:
    """A raw client's one read on its blocking socket, by ``deadline`` (``time.monotonic``):
    up to ``size`` bytes, ``b""`` once the broker has closed or reset the connection;
    AssertionError when the deadline passes first."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise AssertionError("timed out waiting for the broker")
    sock.settimeout(remaining)
    try:
        return sock.recv(size)
    except TimeoutError:
        raise AssertionError("timed out waiting for the broker") from None
    except (ConnectionResetError, BrokenPipeError):
        return b""


def read_until_closed(
    read: Callable[[float], None],
    pending: deque[T],
    closed: type[BaseException],
    timeout: float = TIMEOUT,
) -> list[T]:
    """A raw client's ``wait_closed``: call ``read(deadline)`` (it appends what arrives to
    ``pending``, raises ``closed`` once the broker has closed the socket, AssertionError on
    timeout) until the broker closes; return everything that arrived first, ``pending``
    emptied."""
    deadline = time.monotonic() + timeout
    received = list(pending)
    pending.clear()
    while True:
        try:
            read(deadline)
        except closed:
            return received
        except AssertionError:
            raise AssertionError(
                f"the broker did not close the connection within {timeout}s"
            ) from None
        received.extend(pending)
        pending.clear()
