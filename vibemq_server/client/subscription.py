"""Subscriptions and the messages they deliver.

A :class:`Subscription` is an async iterator over :class:`ReceivedMessage` objects. It is fed by
the client's single reader task and survives reconnects: the client re-subscribes on the new
connection and the same iterator keeps yielding. It ends when the caller unsubscribes, when the
server deletes the queue (``UnsubscribeAck`` with ``reason: queue_deleted``), or when the client
is closed; it raises :class:`~vibemq_server.client.errors.ConnectionLost` when the connection is
gone for good (reconnect disabled or given up).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

from vibemq_server.protocol.payload import from_core, is_multipart, multipart_from_core

_UNPARSED: Any = object()


class _Owner(Protocol):
    """What a subscription needs from its client (kept abstract to avoid an import cycle)."""

    async def _ack(self, message: ReceivedMessage) -> None: ...

    async def _ack_many(self, messages: Sequence[ReceivedMessage]) -> None: ...

    async def _unsubscribe(self, subscription: Subscription) -> None: ...


def decode_multipart(message: ReceivedMessage) -> list[bytes]:
    """The parts of a multipart message (one published by a ZeroMQ PUSH peer or with
    ``publish_multipart``): its payload decoded from base64 and RFC 50/MME. Any other message
    is one part, its original bytes (``payload_bytes``), as a ZeroMQ SUB peer would get it.
    Raises :class:`~vibemq_server.protocol.mme.MmeError` for a malformed multipart body."""
    return multipart_from_core(message.raw, message.headers)


class ReceivedMessage:
    """One delivered message.

    ``payload`` is the JSON payload parsed on first access (``None`` when absent); ``raw`` is the
    exact UTF-8 JSON bytes; ``payload_bytes`` the bytes an MQTT (or other byte-oriented)
    publisher sent. Call :meth:`ack` once it is processed; an unacknowledged message is
    redelivered by the server after its ack timeout (``delivery_attempts`` then grows).
    """

    __slots__ = (
        "_acked",
        "_generation",
        "_owner",
        "_payload",
        "_wire",
        "headers",
        "id",
        "queue",
        "raw",
    )

    def __init__(
        self,
        owner: _Owner,
        generation: int,
        message_id: str,
        queue: str,
        raw: bytes,
        headers: Mapping[str, str],
        wire: bytes = b"",
    ) -> None:
        self._owner = owner
        # The id and queue fields of the Deliver as sent, so an Ack needs no encoding.
        self._wire = wire
        self._generation = generation  # which connection delivered it: acks must go back there
        self._acked = False
        self._payload: Any = _UNPARSED
        self.id = message_id
        self.queue = queue
        self.raw = raw
        self.headers: Mapping[str, str] = headers

    @property
    def payload(self) -> Any:
        """The payload as a Python value (parsed lazily, so consumers that only forward
        ``raw`` pay nothing)."""
        if self._payload is _UNPARSED:
            self._payload = json.loads(self.raw) if self.raw else None
        return self._payload

    @property
    def payload_bytes(self) -> bytes:
        """The payload's original bytes: a message published over MQTT (or another
        byte-oriented protocol) as non-JSON arrives base64-encoded with the header
        ``payloadEncoding: base64``; this undoes that (and is ``raw`` for anything else)."""
        return from_core(self.raw, self.headers)

    @property
    def is_multipart(self) -> bool:
        """Whether the payload is a multipart (ZeroMQ, RFC 50/MME) message."""
        return is_multipart(self.headers)

    @property
    def delivery_attempts(self) -> int:
        """How many times the server has delivered this message (1 on first delivery)."""
        try:
            return int(self.headers.get("deliveryAttempts", "1"))
        except ValueError:
            return 1

    @property
    def acked(self) -> bool:
        return self._acked

    async def ack(self) -> None:
        """Acknowledge the message. Idempotent; a no-op if the delivering connection was lost
        in the meantime (the server has already requeued the message then). While more
        deliveries already wait in the subscription, the Ack frame is held until the buffer
        is empty or the loop turns, so the acks of one read leave in a single write."""
        if self._acked:
            return
        self._acked = True
        await self._owner._ack(self)

    def to_dict(self) -> dict[str, Any]:
        """``{id, queue, payload, headers}``, handy for logging or JSON output."""
        return {
            "id": self.id,
            "queue": self.queue,
            "payload": self.payload,
            "headers": dict(self.headers),
        }

    def __repr__(self) -> str:
        return (
            f"ReceivedMessage(id={self.id!r}, queue={self.queue!r}, raw={self.raw[:60]!r}, "
            f"attempts={self.delivery_attempts})"
        )


class Subscription:
    """An active subscription to one queue; iterate it with ``async for``.

    Also an async context manager that unsubscribes on exit::

        async with await client.subscribe("jobs") as sub:
            async for msg in sub:
                ...
    """

    def __init__(self, owner: _Owner, queue: str, prefetch: int | None) -> None:
        self._owner = owner
        self.queue = queue
        self.prefetch = prefetch
        #: Server-side subscription id (changes when the client re-subscribes after a reconnect).
        self.id = ""
        #: Why the iterator ended: "unsubscribed", "queue_deleted", "closed", "error" or None.
        self.end_reason: str | None = None
        self._confirmed = False  # SubscribeAck seen: only confirmed ones are re-subscribed
        self._buffer: deque[ReceivedMessage] = deque()
        self._wakeup = asyncio.Event()
        self._ended = False
        self._error: BaseException | None = None

    @property
    def active(self) -> bool:
        return not self._ended

    # -- fed by the client --------------------------------------------------------------------

    def _push(self, message: ReceivedMessage) -> None:
        if not self._ended:
            self._buffer.append(message)
            self._wakeup.set()

    def _end(self, reason: str, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        self.end_reason = reason
        self._error = error
        # Buffered messages are dropped: they are unacknowledged, so the server requeues them,
        # and an ack could not reach it anyway once the subscription is gone.
        self._buffer.clear()
        self._wakeup.set()

    # -- public API ----------------------------------------------------------------------------

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ReceivedMessage:
        while True:
            if self._ended:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            if self._buffer:
                return self._buffer.popleft()
            self._wakeup.clear()
            await self._wakeup.wait()

    async def ack_many(self, messages: Iterable[ReceivedMessage]) -> None:
        """Acknowledge several messages at once (one write for all their Ack frames; the
        protocol has no multiple-ack form). Messages already acked are skipped."""
        todo = [m for m in messages if not m._acked]
        for message in todo:
            message._acked = True
        if todo:
            await self._owner._ack_many(todo)

    async def get(self, timeout: float | None = None) -> ReceivedMessage:
        """The next message; raises ``TimeoutError`` after ``timeout`` seconds and
        ``StopAsyncIteration`` if the subscription has ended."""
        async with asyncio.timeout(timeout):
            return await self.__anext__()

    async def unsubscribe(self) -> None:
        """Send Unsubscribe and wait for UnsubscribeAck; the iterator then ends. Idempotent."""
        if not self._ended:
            await self._owner._unsubscribe(self)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._ended:
            try:
                await self.unsubscribe()
            except Exception:
                # Leaving the block must not hide the caller's own exception; a lost connection
                # drops the subscription server-side anyway.
                if exc is None:
                    raise

    def __repr__(self) -> str:
        state = "active" if not self._ended else f"ended:{self.end_reason}"
        return f"Subscription(queue={self.queue!r}, id={self.id!r}, {state})"
