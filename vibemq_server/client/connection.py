"""The asyncio VibeMQ client: one TCP connection, one reader task, futures keyed by message id.

Design, in short:

* Every request gets a unique id (random per-client prefix + counter). Its reply (PublishAck,
  SubscribeAck, Pong, ... or Error) carries the same id, so a dict of futures matches replies to
  requests and any number of requests can be in flight at once.
* A single background task owns the socket's read side. It decodes frames with the sans-IO codec,
  resolves futures, feeds subscriptions, answers server Pings and notices connection loss.
* Frames are queued and written once per event-loop turn (one ``write`` for all the publishes
  and acks issued in that turn), with ``drain`` awaited only when the transport's buffer is
  over its limit. Publishes are encoded straight to bytes; a PublishAck is matched by the id
  sliced out of the frame, without decoding it. Publish deadlines sit in one FIFO checked by
  one timer instead of a timeout object per call.
* On loss, pending requests fail with :class:`ConnectionLost` (never resent: a publish may have
  been stored already, and resending would duplicate it). With ``reconnect=True`` the same task
  then reconnects with exponential backoff, repeats the Connect handshake and re-subscribes every
  active subscription, so ``async for`` loops carry on. New requests issued meanwhile wait for
  the connection to come back (bounded by ``request_timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import random
import secrets
import ssl
import struct
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from vibemq_server.client.errors import (
    ConnectionFailed,
    ConnectionLost,
    PublishBatchError,
    RequestTimeout,
    VibeMQError,
)
from vibemq_server.client.subscription import ReceivedMessage, Subscription
from vibemq_server.protocol.codec import (
    CommandType,
    Message,
    decode_body,
    encode,
)
from vibemq_server.protocol.errors import ErrorCode, ProtocolError
from vibemq_server.protocol.payload import MULTIPART_HEADERS, multipart_to_core

__all__ = ["DEFAULT_PORT", "Client"]

log = logging.getLogger("vibemq.client")

DEFAULT_PORT = 2925
CLIENT_VERSION = "0.1.0"
#: The largest frame the client accepts from the server: a 64 MiB binary message published over
#: MQTT or AMQP reaches a VibeMQ consumer as base64 (4/3 of it), so twice the broker's limit.
CLIENT_MAX_MESSAGE_SIZE = 128 * 1024 * 1024
_READ_CHUNK = 256 * 1024
#: A frame longer than this is gathered read by read and joined once (Link.take/keep).
_BIG_FRAME = 1024 * 1024
# Auth refusals will not fix themselves by retrying; anything else (limits, restarts) might.
_PERMANENT_CODES = frozenset({"AUTH_FAILED", "AUTH_REQUIRED", "NOT_AUTHORIZED"})
# Acks held back (while more deliveries wait) are written at least this often, so the broker
# refills the prefetch window while the consumer works instead of after the whole buffer.
_ACK_FLUSH = 50
# Above this many bytes in the transport's send buffer, senders wait for it to drain.
_WRITE_HIGH_WATER = 1024 * 1024
_PUBLISH_ACK = int(CommandType.PUBLISH_ACK)
_ERROR = int(CommandType.ERROR)
_DELIVER = int(CommandType.DELIVER)
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
# Publish frame: body length | version 1, type 20 | id length (then id, queue, payload, headers).
_PUBLISH_PREFIX = struct.Struct(">IBBH")
# Ack body: version 1, type 30 | id | queue | no payload | one header ``messageId``.
_ACK_HEAD = b"\x01\x1e"
_ACK_MID = b"\x00\x00\x00\x00\x00\x01\x00\x09messageId"


def encode_payload(payload: Any) -> bytes:
    """JSON-encode a payload compactly. ``bytes`` are taken as already-encoded UTF-8 JSON."""
    if type(payload) is bytes:  # the common pre-encoded case, without the isinstance chain
        return payload
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


class _Link:
    """One live TCP connection (the client replaces it on reconnect)."""

    __slots__ = (
        "backlog",
        "congested",
        "generation",
        "have",
        "inbuf",
        "loop",
        "max_size",
        "need",
        "out",
        "parts",
        "reader",
        "transport",
        "writer",
    )

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_size: int,
        generation: int,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.max_size = max_size
        self.generation = generation
        # Bytes of a frame not yet complete (the stream is split by ``split`` or the pump).
        self.inbuf = b""
        # A big frame still arriving: its reads so far (joined once when complete, instead
        # of copying everything held on every read), how many bytes they hold and it needs.
        self.parts: list[bytes] = []
        self.have = 0
        self.need = 0
        # Frames already split off the stream but not yet dispatched (the handshake may read
        # past the ConnectAck).
        self.backlog: deque[bytes] = deque()
        self.transport = writer.transport
        self.loop = asyncio.get_running_loop()
        # Frames queued this loop turn; one write flushes them all (see ``write``).
        self.out: list[bytes] = []
        #: True when the kernel is not keeping up: senders should ``drain``.
        self.congested = False

    def take(self, data: bytes) -> bytes | None:
        """What to parse after reading ``data``: the bytes held plus ``data``, or None while
        a big frame is still arriving."""
        if self.need:
            self.parts.append(data)
            self.have += len(data)
            if self.have < self.need:
                return None
            buf = b"".join(self.parts)
            self.parts = []
            self.need = self.have = 0
            return buf
        return self.inbuf + data if self.inbuf else data

    def keep(self, buf: bytes, pos: int) -> None:
        """Hold ``buf[pos:]``, the start of a frame not yet complete (its length valid)."""
        rest = len(buf) - pos
        if rest >= 4:
            (n,) = _U32.unpack_from(buf, pos)
            if n > _BIG_FRAME and n + 4 > rest:
                self.parts = [buf[pos:]]
                self.have = rest
                self.need = n + 4
                self.inbuf = b""
                return
        self.inbuf = buf[pos:]

    def split(self, data: bytes) -> list[bytes]:
        """The bodies of the frames completed by ``data``; the rest is held (``keep``)."""
        bodies: list[bytes] = []
        got = self.take(data)
        if got is None:
            return bodies
        buf = got
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (n,) = _U32.unpack_from(buf, pos)
            self.check_length(n)
            if end - pos - 4 < n:
                break
            bodies.append(buf[pos + 4 : pos + 4 + n])
            pos += 4 + n
        self.keep(buf, pos)
        return bodies

    def check_length(self, n: int) -> None:
        # A bad length cannot be resynchronised: the connection is done.
        if n == 0 or n > self.max_size:
            what = "zero frame length" if n == 0 else f"frame of {n} bytes over {self.max_size}"
            raise ProtocolError(ErrorCode.INVALID_MESSAGE, what, fatal=True)

    def write(self, data: bytes) -> None:
        """Queue one encoded frame. Synchronous on purpose: frames go out in call order,
        whole, and all frames queued in one loop turn leave in a single write."""
        if self.transport.is_closing():
            raise ConnectionLost("connection is closed")
        out = self.out
        if not out:
            self.loop.call_soon(self.flush)
        out.append(data)

    def send(self, msg: Message) -> None:
        self.write(encode(msg))

    def flush(self) -> None:
        out = self.out
        if out:
            self.out = []
            transport = self.transport
            if not transport.is_closing():
                transport.write(b"".join(out) if len(out) > 1 else out[0])
                # Checked once per write rather than per frame: senders drain while it holds.
                self.congested = transport.get_write_buffer_size() > _WRITE_HIGH_WATER

    async def drain(self) -> None:
        self.flush()
        await self.writer.drain()
        self.congested = False

    def abort(self) -> None:
        self.out = []
        self.writer.close()


def _str16(value: str) -> bytes:
    """A u16-length-prefixed UTF-8 string (empty = null), as the codec writes it."""
    raw = value.encode()
    return _U16.pack(len(raw)) + raw


def _headers_bytes(headers: Mapping[str, str]) -> bytes:
    """The header block of a body: u16 count, then (key, value) string pairs."""
    parts = [_U16.pack(len(headers))]
    for key, value in headers.items():
        parts.append(_str16(key))
        parts.append(_str16(value))
    return b"".join(parts)


_NO_HEADERS = b"\x00\x00"


def _ack_frame(message: ReceivedMessage) -> bytes:
    """An Ack frame whose own id is the acked message's id and whose ``messageId`` header
    names it too (the broker reads the header first, the id second: docs/protocol.md)."""
    ref = message._wire
    if ref:  # the Deliver's own id and queue fields
        i = ref[: 2 + ((ref[0] << 8) | ref[1])]
        body = b"".join((_ACK_HEAD, ref, _ACK_MID, i))
    else:
        i = _str16(message.id)
        body = b"".join((_ACK_HEAD, i, _str16(message.queue), _ACK_MID, i))
    return _U32.pack(len(body)) + body


def _deliver(owner: Any, generation: int, body: bytes) -> ReceivedMessage | None:
    """A well-formed Deliver body straight into a ReceivedMessage (no Message in between);
    None lets the codec's careful decoder handle (and name) anything unusual."""
    try:
        n = (body[2] << 8) | body[3]
        pos = 4 + n
        msg_id = body[4:pos].decode()
        n = (body[pos] << 8) | body[pos + 1]
        pos += 2
        queue = body[pos : pos + n].decode()
        pos += n
        ref_end = pos
        (plen,) = _U32.unpack_from(body, pos)
        pos += 4
        payload = body[pos : pos + plen]
        pos += plen
        count = (body[pos] << 8) | body[pos + 1]
        pos += 2
        headers: dict[str, str] = {}
        for _ in range(count):
            n = (body[pos] << 8) | body[pos + 1]
            key = body[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            n = (body[pos] << 8) | body[pos + 1]
            value = body[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            if key and value:
                headers[key] = value
    except (IndexError, UnicodeDecodeError, struct.error):
        return None
    if pos != len(body) or not msg_id or not queue:
        return None
    # body[2:ref_end] is the id and queue exactly as an Ack carries them: kept for ack().
    return ReceivedMessage(owner, generation, msg_id, queue, payload, headers, body[2:ref_end])


class _Batch:
    """The PublishAcks one ``publish_many`` call waits for: one future for all of them."""

    __slots__ = ("errors", "future", "remaining")

    def __init__(self, count: int, future: asyncio.Future[None]) -> None:
        self.remaining = count
        self.errors: dict[str, VibeMQError] = {}
        self.future = future

    def settle(self, msg_id: str, error: VibeMQError | None) -> None:
        if error is not None:
            self.errors[msg_id] = error
        self.remaining -= 1
        if self.remaining <= 0 and not self.future.done():
            self.future.set_result(None)

    def fail(self, error: VibeMQError) -> None:
        if not self.future.done():
            self.future.set_exception(error)


_Waiter = asyncio.Future[None] | _Batch


class Client:
    """An asyncio client of a VibeMQ broker.

    Use :meth:`connect` (or ``async with Client(...) as client``)::

        async with await Client.connect("127.0.0.1", 2925, token="secret") as client:
            await client.publish("jobs", {"task": "resize", "id": 7})
            async with await client.subscribe("jobs", prefetch=10) as sub:
                async for msg in sub:
                    print(msg.payload)
                    await msg.ack()

    Server errors raise :class:`VibeMQError` with the wire error code.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        token: str | None = None,
        client_version: str = CLIENT_VERSION,
        reconnect: bool = True,
        reconnect_initial_delay: float = 0.1,
        reconnect_max_delay: float = 5.0,
        reconnect_max_attempts: int | None = None,
        connect_timeout: float = 10.0,
        request_timeout: float | None = 30.0,
        keepalive_interval: float | None = 20.0,
        max_message_size: int = CLIENT_MAX_MESSAGE_SIZE,
        tls: bool = False,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.client_version = client_version
        self.reconnect = reconnect
        self.reconnect_initial_delay = reconnect_initial_delay
        self.reconnect_max_delay = reconnect_max_delay
        self.reconnect_max_attempts = reconnect_max_attempts
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.keepalive_interval = keepalive_interval
        self._token = token  # not a public attribute: keeps it out of reprs and logs
        self._max_message_size = max_message_size
        # TLS: the given context, or the system's trust store with hostname checking.
        if ssl_context is None and tls:
            ssl_context = ssl.create_default_context()
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname

        #: ``serverVersion`` and ``connectionId`` from the latest ConnectAck.
        self.server_version: str | None = None
        self.connection_id: str | None = None
        #: ``reason`` header of the last Disconnect the server sent (e.g. "server_shutdown").
        self.disconnect_reason: str | None = None
        #: How many times the client has reconnected after a lost connection.
        self.reconnect_count = 0

        self._id_prefix = secrets.token_hex(4)
        self._counter = itertools.count(1)
        self._link: _Link | None = None
        self._generation = 0
        self._pending: dict[str, asyncio.Future[Message]] = {}
        # Publishes awaiting their PublishAck (or Error), by message id; a publish_many
        # batch appears once per message.
        self._publishes: dict[str, _Waiter] = {}
        # (deadline, id, future) of single publishes in send order: with one timeout for all
        # they expire in that order, so one timer at the head serves them all.
        self._deadlines: deque[tuple[float, str, asyncio.Future[None]]] = deque()
        self._deadline_timer: asyncio.TimerHandle | None = None
        # The link while it is usable (what ``connected`` computes, kept for the hot path).
        self._live: _Link | None = None
        # Encoded queue names (u16 length + UTF-8), so a publish does not re-encode its queue.
        self._queue_bytes: dict[str, bytes] = {}
        self._subs: dict[str, Subscription] = {}
        # Set while a handshaken link is usable; also set once the client is finished so that
        # waiters wake up and see ``_final_error``.
        self._ready = asyncio.Event()
        self._final_error: VibeMQError | None = None
        self._closing = False
        self._runner: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        token: str | None = None,
        client_version: str = CLIENT_VERSION,
        reconnect: bool = True,
        reconnect_initial_delay: float = 0.1,
        reconnect_max_delay: float = 5.0,
        reconnect_max_attempts: int | None = None,
        connect_timeout: float = 10.0,
        request_timeout: float | None = 30.0,
        keepalive_interval: float | None = 20.0,
        max_message_size: int = CLIENT_MAX_MESSAGE_SIZE,
        tls: bool = False,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> Client:
        """Open a connection, perform the Connect handshake and return the ready client.

        Raises :class:`ConnectionFailed` if the server cannot be reached and
        :class:`VibeMQError` (e.g. ``AUTH_FAILED``) if it refuses the Connect. The first connect
        is not retried: a wrong address should fail fast, not spin in backoff.
        """
        client = cls(
            host,
            port,
            token=token,
            client_version=client_version,
            reconnect=reconnect,
            reconnect_initial_delay=reconnect_initial_delay,
            reconnect_max_delay=reconnect_max_delay,
            reconnect_max_attempts=reconnect_max_attempts,
            connect_timeout=connect_timeout,
            request_timeout=request_timeout,
            keepalive_interval=keepalive_interval,
            tls=tls,
            ssl_context=ssl_context,
            server_hostname=server_hostname,
            max_message_size=max_message_size,
        )
        await client.start()
        return client

    async def start(self) -> None:
        """Connect (idempotent once connected). ``async with Client(...)`` calls this."""
        if self._runner is not None:
            return
        if self._final_error is not None:
            raise VibeMQError("CLOSED", "client is closed")
        link = await self._open_link()
        self._install(link)
        self._runner = asyncio.create_task(self._run(link), name=f"vibemq-client-{self.port}")

    async def close(self) -> None:
        """Send Disconnect, close the socket and end all subscriptions. Idempotent."""
        if self._closing:
            return
        self._closing = True
        link = self._link
        self._ready.clear()
        self._live = None
        if link is not None:
            with contextlib.suppress(Exception):
                link.send(Message(CommandType.DISCONNECT, self._next_id("disc")))
                async with asyncio.timeout(1.0):
                    await link.drain()
            link.abort()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        self._finish(ConnectionLost("client closed"), reason="closed")
        if link is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await link.writer.wait_closed()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        """True while a handshaken connection is up (False while reconnecting)."""
        return self._ready.is_set() and self._final_error is None and self._link is not None

    @property
    def closed(self) -> bool:
        return self._final_error is not None

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until the client is connected (e.g. after a reconnect)."""
        async with asyncio.timeout(timeout):
            await self._wait_ready()

    # -- public API ----------------------------------------------------------------------------

    async def publish(
        self,
        queue: str,
        payload: Any,
        *,
        headers: Mapping[str, str] | None = None,
        priority: str | None = None,
        message_id: str | None = None,
        timeout: float | None = None,
    ) -> str:
        """Publish ``payload`` (any JSON-serialisable value, or pre-encoded JSON ``bytes``) and
        wait for the PublishAck. Returns the message id.

        ``priority`` is one of ``Low``, ``Normal``, ``High``, ``Critical`` (sent as the
        ``priority`` header). Safe to call concurrently: each call awaits its own ack.
        """
        if message_id:
            msg_id = message_id
            if msg_id in self._publishes or msg_id in self._pending:
                raise ValueError(f"a request with id {msg_id!r} is already in flight")
        else:  # unique by construction
            msg_id = f"msg_{self._id_prefix}-{next(self._counter)}"
        q = self._queue_bytes.get(queue)
        if q is None:
            if len(self._queue_bytes) >= 1024:
                self._queue_bytes.clear()
            q = self._queue_bytes[queue] = _str16(queue)
        hdrs = _NO_HEADERS if headers is None and priority is None else None
        data = self._publish_frame(
            msg_id, q, encode_payload(payload), hdrs or _publish_headers(headers, priority)
        )
        # The PublishAck's messageId is the Publish's id (docs/protocol.md).
        link = self._live if timeout is None else None
        limit = self.request_timeout if timeout is None else timeout
        if link is None:
            await self._publish_slow(msg_id, data, limit)
            return msg_id
        # Fast path: no timeout object per call (the deadline FIFO expires it), the frame
        # queued inline. A transport closed meanwhile drops it in flush(); the reader then
        # notices the loss and fails this future with ConnectionLost.
        loop = link.loop
        fut: asyncio.Future[None] = loop.create_future()
        out = link.out
        if not out:
            loop.call_soon(link.flush)
        out.append(data)
        self._publishes[msg_id] = fut
        if limit is not None:
            deadlines = self._deadlines
            while deadlines and deadlines[0][2].done():
                deadlines.popleft()
            deadline = loop.time() + limit
            deadlines.append((deadline, msg_id, fut))
            if self._deadline_timer is None:
                self._deadline_timer = loop.call_at(deadline, self._expire_publishes)
        try:
            if link.congested:
                await link.drain()
            await fut
        except OSError as exc:
            raise ConnectionLost(f"connection lost: {exc}") from exc
        finally:
            if self._publishes.get(msg_id) is fut:
                del self._publishes[msg_id]
        return msg_id

    async def publish_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        headers: Mapping[str, str] | None = None,
        priority: str | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        """Publish every payload to ``queue`` in one write and wait for all their PublishAcks.
        Returns the message ids, in order.

        ``headers`` and ``priority`` apply to every message; ``timeout`` bounds the whole
        batch. The broker handles the messages in order, each on its own: when some are
        refused (``QUEUE_FULL``, ``NOT_AUTHORIZED``, ...) the others are still stored, and
        once every reply is in :class:`PublishBatchError` is raised -- its ``code`` is the
        first refusal's, ``results`` holds each message's id or error. A lost connection
        raises :class:`ConnectionLost` (messages acked before it are stored; the rest may or
        may not be, as for :meth:`publish`).
        """
        prefix = self._id_prefix
        counter = self._counter
        q = _str16(queue)
        hdrs = _publish_headers(headers, priority)
        build = self._publish_frame
        ids: list[str] = []
        frames: list[bytes] = []
        for payload in payloads:
            msg_id = f"msg_{prefix}-{next(counter)}"
            ids.append(msg_id)
            frames.append(build(msg_id, q, encode_payload(payload), hdrs))
        if not ids:
            return []
        limit = self.request_timeout if timeout is None else timeout
        batch: _Batch | None = None
        publishes = self._publishes
        try:
            async with asyncio.timeout(limit):
                link = self._link if self.connected else None
                if link is None:
                    link = await self._wait_ready()
                batch = _Batch(len(ids), link.loop.create_future())
                for msg_id in ids:
                    publishes[msg_id] = batch
                try:
                    link.write(b"".join(frames))
                    del frames
                    if link.congested:
                        await link.drain()
                    await batch.future
                finally:
                    if batch.remaining > 0:
                        for msg_id in ids:
                            if publishes.get(msg_id) is batch:
                                del publishes[msg_id]
        except TimeoutError:
            raise RequestTimeout(
                f"no reply to {batch.remaining if batch else len(ids)} of {len(ids)} "
                f"publishes within {limit} s"
            ) from None
        except OSError as exc:
            raise ConnectionLost(f"connection lost: {exc}") from exc
        if batch.errors:
            errors = batch.errors
            raise PublishBatchError([errors.get(msg_id, msg_id) for msg_id in ids])
        return ids

    @staticmethod
    def _publish_frame(msg_id: str, queue: bytes, payload: bytes, headers: bytes) -> bytes:
        """A whole Publish frame, built directly (``queue`` and ``headers`` pre-encoded)."""
        i = msg_id.encode()
        size = 8 + len(i) + len(queue) + len(payload) + len(headers)
        return b"".join(
            (
                _PUBLISH_PREFIX.pack(size, 1, 20, len(i)),
                i,
                queue,
                _U32.pack(len(payload)),
                payload,
                headers,
            )
        )

    def _send_publish(self, link: _Link, msg_id: str, data: bytes) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = link.loop.create_future()
        link.write(data)  # raises ConnectionLost before anything is registered
        self._publishes[msg_id] = fut
        return fut

    async def _publish_slow(self, msg_id: str, data: bytes, limit: float | None) -> None:
        """A publish that waits for the connection first or has its own timeout."""
        fut: asyncio.Future[None] | None = None
        try:
            async with asyncio.timeout(limit):
                link = self._link if self.connected else None
                if link is None:
                    link = await self._wait_ready()
                fut = self._send_publish(link, msg_id, data)
                if link.congested:
                    await link.drain()
                await fut
        except TimeoutError:
            raise RequestTimeout(f"no reply to PUBLISH {msg_id!r} within {limit} s") from None
        except OSError as exc:
            raise ConnectionLost(f"connection lost: {exc}") from exc
        finally:
            if fut is not None and self._publishes.get(msg_id) is fut:
                del self._publishes[msg_id]

    def _expire_publishes(self) -> None:
        """The deadline timer: fail the publishes whose time is up, re-arm for the next."""
        self._deadline_timer = None
        deadlines = self._deadlines
        loop = asyncio.get_running_loop()
        now = loop.time()
        while deadlines:
            deadline, msg_id, fut = deadlines[0]
            if fut.done():
                deadlines.popleft()
                continue
            if deadline > now:
                self._deadline_timer = loop.call_at(deadline, self._expire_publishes)
                return
            deadlines.popleft()
            if self._publishes.get(msg_id) is fut:
                del self._publishes[msg_id]
            fut.set_exception(
                RequestTimeout(f"no reply to PUBLISH {msg_id!r} within {self.request_timeout} s")
            )

    async def publish_multipart(
        self,
        queue: str,
        parts: Iterable[bytes | bytearray | memoryview],
        *,
        headers: Mapping[str, str] | None = None,
        priority: str | None = None,
        message_id: str | None = None,
        timeout: float | None = None,
    ) -> str:
        """Publish a multipart message (a ZeroMQ SUB peer receives ``[queue, *parts]``) and
        wait for the PublishAck. The payload is the base64 of the parts' RFC 50/MME encoding,
        with headers ``contentType: application/x-zmq-mme`` and ``payloadEncoding: base64``
        (docs/zmq.md); :func:`decode_multipart` gives the parts back. Returns the message id.
        ``MmeError`` when a part is over 4 GiB."""
        payload = multipart_to_core(parts)
        merged = {**(headers or {}), **MULTIPART_HEADERS}
        return await self.publish(
            queue,
            payload,
            headers=merged,
            priority=priority,
            message_id=message_id,
            timeout=timeout,
        )

    async def subscribe(
        self, queue: str, *, prefetch: int | None = None, timeout: float | None = None
    ) -> Subscription:
        """Subscribe to ``queue`` and return a :class:`Subscription` to iterate.

        ``prefetch`` bounds how many unacknowledged messages the server pushes at once. One
        subscription per queue per client: deliveries carry only the queue name.
        """
        existing = self._subs.get(queue)
        if existing is not None and existing.active:
            raise ValueError(f"already subscribed to {queue!r} on this client")
        sub = Subscription(self, queue, prefetch)
        # Registered before sending: deliveries may be read in the same chunk as the
        # SubscribeAck, before this coroutine resumes.
        self._subs[queue] = sub
        try:
            reply = await self._request(self._subscribe_message(sub), timeout)
        except BaseException:
            if self._subs.get(queue) is sub:
                del self._subs[queue]
            sub._end("error")
            raise
        sub.id = reply.headers.get("subscriptionId") or reply.id
        sub._confirmed = True
        return sub

    async def create_queue(
        self,
        name: str,
        delivery_mode: str | int = "RoundRobin",
        *,
        max_queue_size: int | None = None,
        message_ttl_ms: int | None = None,
        enable_dead_letter_queue: bool | None = None,
        dead_letter_queue_name: str | None = None,
        overflow_strategy: str | int | None = None,
        max_retry_attempts: int | None = None,
        ack_timeout_ms: int | None = None,
        timeout: float | None = None,
    ) -> None:
        """Create a queue with explicit options (``None`` = server default).

        Raises ``VibeMQError("QUEUE_EXISTS")`` if it exists already.
        """
        options: dict[str, Any] = {
            "mode": delivery_mode,
            "maxQueueSize": max_queue_size,
            "messageTtl": message_ttl_ms,
            "enableDeadLetterQueue": enable_dead_letter_queue,
            "deadLetterQueueName": dead_letter_queue_name,
            "overflowStrategy": overflow_strategy,
            "maxRetryAttempts": max_retry_attempts,
            "ackTimeout": ack_timeout_ms,
        }
        payload = encode_payload({k: v for k, v in options.items() if v is not None})
        msg = Message(
            CommandType.CREATE_QUEUE, self._next_id("create"), queue=name, payload=payload
        )
        await self._request(msg, timeout)

    async def delete_queue(self, name: str, *, timeout: float | None = None) -> None:
        """Delete a queue. Its subscribers (this client's too) see their iterators end."""
        msg = Message(CommandType.DELETE_QUEUE, self._next_id("delete"), queue=name)
        await self._request(msg, timeout)

    async def queue_info(self, name: str, *, timeout: float | None = None) -> dict[str, Any]:
        """Queue statistics: ``name``, ``messageCount``, ``subscriberCount``, ``deliveryMode``,
        ``maxSize``, ``createdAt``, ... Raises ``VibeMQError("QUEUE_NOT_FOUND")``."""
        msg = Message(CommandType.QUEUE_INFO, self._next_id("info"), queue=name)
        reply = await self._request(msg, timeout)
        info = reply.json()
        # The original answers an unknown queue with an empty payload instead of an Error.
        if not isinstance(info, dict):
            raise VibeMQError("QUEUE_NOT_FOUND", f"queue {name!r} not found")
        return info

    async def list_queues(self, *, timeout: float | None = None) -> list[str]:
        """Names of all queues."""
        reply = await self._request(
            Message(CommandType.LIST_QUEUES, self._next_id("list")), timeout
        )
        names = reply.json()
        if names is None:
            return []
        if not isinstance(names, list):
            raise VibeMQError("INVALID_MESSAGE", "ListQueues reply is not a JSON array")
        return [str(n) for n in names]

    async def ping(self, *, timeout: float | None = None) -> float:
        """Round-trip a Ping; returns the round-trip time in seconds."""
        started = time.perf_counter()
        await self._request(Message(CommandType.PING, self._next_id("ping")), timeout)
        return time.perf_counter() - started

    def __repr__(self) -> str:
        state = "connected" if self.connected else "closed" if self.closed else "connecting"
        return f"<Client {self.host}:{self.port} {state} connection_id={self.connection_id!r}>"

    # -- requests ------------------------------------------------------------------------------

    def _next_id(self, kind: str) -> str:
        return f"{kind}_{self._id_prefix}-{next(self._counter)}"

    async def _wait_ready(self) -> _Link:
        while True:
            if self._final_error is not None:
                raise type(self._final_error)(*self._error_args(self._final_error))
            if self._ready.is_set() and self._link is not None:
                return self._link
            if self._closing:
                raise ConnectionLost("client closed")
            await self._ready.wait()

    @staticmethod
    def _error_args(err: VibeMQError) -> tuple[str, ...]:
        # A fresh exception per raise, so tracebacks do not pile up on one shared instance.
        if isinstance(err, ConnectionLost | ConnectionFailed | RequestTimeout):
            return (err.message,)
        return (err.code, err.message)

    async def _request(self, msg: Message, timeout: float | None) -> Message:
        """Send ``msg`` and return its reply; an Error reply raises :class:`VibeMQError`."""
        limit = self.request_timeout if timeout is None else timeout
        if msg.id in self._pending:
            raise ValueError(f"a request with id {msg.id!r} is already in flight")
        try:
            async with asyncio.timeout(limit):
                # Fast path without awaiting, so concurrent calls hit the wire in call order.
                link = self._link if self.connected else None
                if link is None:
                    link = await self._wait_ready()
                fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
                self._pending[msg.id] = fut
                try:
                    link.send(msg)
                    if link.congested:
                        await link.drain()
                    reply = await fut
                finally:
                    if self._pending.get(msg.id) is fut:
                        del self._pending[msg.id]
        except TimeoutError:
            raise RequestTimeout(
                f"no reply to {msg.type.name} {msg.id!r} within {limit} s"
            ) from None
        except OSError as exc:
            raise ConnectionLost(f"connection lost: {exc}") from exc
        if reply.type == CommandType.ERROR:
            raise VibeMQError(reply.error_code or "SERVER_ERROR", reply.error_message)
        return reply

    def _subscribe_message(self, sub: Subscription) -> Message:
        headers = {"prefetch": str(sub.prefetch)} if sub.prefetch is not None else {}
        return Message(
            CommandType.SUBSCRIBE, self._next_id("sub"), queue=sub.queue, headers=headers
        )

    async def _ack(self, message: ReceivedMessage) -> None:
        link = self._link
        if link is None or link.generation != message._generation or not self.connected:
            # The delivering connection is gone; the server requeued the message on loss.
            log.debug("not acking %s: its connection was lost", message.id)
            return
        try:
            link.write(_ack_frame(message))
            # Written now unless more deliveries already wait in the subscription: their
            # acks follow before the consumer waits again, and then all leave in one write
            # (as a raw client acks one read's worth at once). A consumer that acks and then
            # blocks the loop must not leave its acks unsent meanwhile.
            sub = self._subs.get(message.queue)
            if sub is None or not sub._buffer or len(link.out) >= _ACK_FLUSH:
                link.flush()
            if link.congested:
                await link.drain()
        except (OSError, ConnectionLost):
            log.debug("ack of %s not sent: connection lost", message.id)

    async def _ack_many(self, messages: Sequence[ReceivedMessage]) -> None:
        """One Ack frame per message, all in one write (the protocol has no multiple-ack
        form), handed to the transport before this returns."""
        link = self._link
        if link is None or not self.connected:
            log.debug("not acking %d message(s): the connection was lost", len(messages))
            return
        generation = link.generation
        try:
            for message in messages:
                if message._generation != generation:
                    # The delivering connection is gone; the server requeued it on loss.
                    log.debug("not acking %s: its connection was lost", message.id)
                    continue
                link.write(_ack_frame(message))
            link.flush()
            if link.congested:
                await link.drain()
        except (OSError, ConnectionLost):
            log.debug("acks not sent: connection lost")

    async def _unsubscribe(self, sub: Subscription) -> None:
        if self.closed:
            sub._end("closed")
            return
        if self._subs.get(sub.queue) is sub:
            # Dropped first so that a reconnect happening meanwhile does not re-subscribe it.
            del self._subs[sub.queue]
        # While disconnected the server holds no subscription for us: nothing to send.
        if self.connected:
            msg = Message(CommandType.UNSUBSCRIBE, self._next_id("unsub"), queue=sub.queue)
            try:
                await self._request(msg, None)
            except ConnectionLost:
                pass  # the server drops a lost connection's subscriptions by itself
            except VibeMQError as exc:
                # The queue vanished meanwhile: the subscription is gone either way.
                if exc.code != "QUEUE_NOT_FOUND":
                    raise
        sub._end("unsubscribed")

    # -- connection management -----------------------------------------------------------------

    async def _open_link(self) -> _Link:
        """TCP connect plus the Connect/ConnectAck handshake, both bounded by connect_timeout."""
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    self.host,
                    self.port,
                    limit=_READ_CHUNK,
                    ssl=self.ssl_context,
                    server_hostname=self.server_hostname if self.ssl_context else None,
                )
        except (OSError, TimeoutError) as exc:
            raise ConnectionFailed(
                f"cannot connect to {self.host}:{self.port}: {exc or 'timed out'}"
            ) from exc
        link = _Link(reader, writer, self._max_message_size, self._generation + 1)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self._handshake(link)
        except TimeoutError:
            link.abort()
            raise ConnectionFailed(f"no ConnectAck from {self.host}:{self.port}") from None
        except OSError as exc:
            link.abort()
            raise ConnectionFailed(f"handshake with {self.host}:{self.port} failed: {exc}") from exc
        except BaseException:
            link.abort()
            raise
        return link

    async def _handshake(self, link: _Link) -> None:
        headers = {"clientVersion": self.client_version}
        if self._token:
            headers["authToken"] = self._token
        req = Message(CommandType.CONNECT, self._next_id("conn"), headers=headers)
        link.send(req)
        await link.drain()
        while True:
            while not link.backlog:
                data = await link.reader.read(_READ_CHUNK)
                if not data:
                    raise ConnectionFailed("server closed the connection during the handshake")
                link.backlog.extend(link.split(data))
            msg = decode_body(link.backlog.popleft())
            if msg.type == CommandType.CONNECT_ACK:
                self.server_version = msg.headers.get("serverVersion")
                self.connection_id = msg.headers.get("connectionId")
                return
            if msg.type == CommandType.ERROR:
                raise VibeMQError(msg.error_code or "SERVER_ERROR", msg.error_message)
            if msg.type == CommandType.DISCONNECT:
                self.disconnect_reason = msg.headers.get("reason")
            log.debug("ignoring %s before ConnectAck", msg.type.name)

    def _install(self, link: _Link) -> None:
        """Make ``link`` current, re-subscribe confirmed subscriptions, release waiters."""
        self._link = link
        self._generation = link.generation
        for sub in list(self._subs.values()):
            if sub._confirmed and sub.active:
                self._resubscribe(link, sub)
        self._ready.set()
        self._live = link

    def _resubscribe(self, link: _Link, sub: Subscription) -> None:
        # Done with a callback rather than an awaited request: this runs inside the reader
        # task, which must go on reading to receive the SubscribeAck.
        msg = self._subscribe_message(sub)
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[msg.id] = fut
        fut.add_done_callback(functools.partial(self._resubscribed, sub, msg.id))
        # On failure the reader notices the loss and the next reconnect tries again.
        with contextlib.suppress(ConnectionLost):
            link.send(msg)

    def _resubscribed(self, sub: Subscription, msg_id: str, fut: asyncio.Future[Message]) -> None:
        self._pending.pop(msg_id, None)
        if fut.cancelled() or fut.exception() is not None:
            return  # connection lost again: retried on the next reconnect
        reply = fut.result()
        if reply.type == CommandType.ERROR:
            log.warning(
                "re-subscribing to %r failed: %s %s",
                sub.queue,
                reply.error_code,
                reply.error_message,
            )
            if self._subs.get(sub.queue) is sub:
                del self._subs[sub.queue]
            sub._end("error", VibeMQError(reply.error_code or "SERVER_ERROR", reply.error_message))
            return
        sub.id = reply.headers.get("subscriptionId") or reply.id
        log.info("re-subscribed to %r", sub.queue)

    async def _run(self, link: _Link) -> None:
        """The reader task: pump frames; on loss, reconnect or finish."""
        try:
            while True:
                cause = await self._pump(link)
                self._lost(link, cause)
                if self._closing:
                    return
                if not self.reconnect:
                    self._finish(ConnectionLost(self._loss_text(cause)), reason="error")
                    return
                link = await self._reconnect()
                self.reconnect_count += 1
                self._install(link)
                log.info("reconnected to %s:%s", self.host, self.port)
        except asyncio.CancelledError:
            raise
        except VibeMQError as exc:
            self._finish(exc, reason="error")
        except Exception as exc:  # a bug here must not leave callers waiting forever
            log.exception("VibeMQ client reader failed")
            self._finish(ConnectionLost(f"client reader failed: {exc!r}"), reason="error")

    def _loss_text(self, cause: BaseException | None) -> str:
        if self.disconnect_reason:
            return f"server disconnected: {self.disconnect_reason}"
        return f"connection lost: {cause}" if cause else "connection closed by the server"

    async def _pump(self, link: _Link) -> BaseException | None:
        """Dispatch frames until the connection ends; returns the cause (None = clean EOF)."""
        ping_outstanding = False
        try:
            while True:
                while link.backlog:
                    self._dispatch(link, link.backlog.popleft())
                try:
                    async with asyncio.timeout(self.keepalive_interval):
                        data = await link.reader.read(_READ_CHUNK)
                except TimeoutError:
                    # Idle: probe the server. A second silent interval means it is gone
                    # (a half-open TCP connection would otherwise hang us forever).
                    if ping_outstanding:
                        return ConnectionLost("keepalive timeout")
                    ping_outstanding = True
                    link.send(Message(CommandType.PING, self._next_id("keepalive")))
                    continue
                if not data:
                    return None
                ping_outstanding = False
                self._scan(link, data)
        except (OSError, ProtocolError, ConnectionLost) as exc:
            return exc

    def _scan(self, link: _Link, data: bytes) -> None:
        """Handle every frame ``data`` completes. PublishAcks are settled straight from the
        buffer (no body copy, no decode): they are half of a publisher's traffic."""
        got = link.take(data)
        if got is None:
            return  # a big frame still arriving
        buf = got
        pos = 0
        end = len(buf)
        unpack = _U32.unpack_from
        publishes = self._publishes
        try:
            while end - pos >= 4:
                (n,) = unpack(buf, pos)
                stop = pos + 4 + n
                if stop > end or n < 4 or n > link.max_size:
                    if stop > end and 0 < n <= link.max_size:
                        break
                    link.check_length(n)  # raises for 0 and oversize
                elif buf[pos + 5] == _PUBLISH_ACK:
                    idn = (buf[pos + 6] << 8) | buf[pos + 7]
                    try:
                        waiter = publishes.pop(buf[pos + 8 : pos + 8 + idn].decode(), None)
                    except UnicodeDecodeError:
                        waiter = None
                    if waiter is not None:
                        if isinstance(waiter, _Batch):
                            waiter.settle("", None)
                        elif not waiter.done():
                            waiter.set_result(None)
                        pos = stop
                        continue
                self._dispatch(link, buf[pos + 4 : stop])
                pos = stop
        finally:
            link.keep(buf, pos)

    def _dispatch(self, link: _Link, body: bytes) -> None:
        kind = body[1] if len(body) > 3 else -1
        if kind == _DELIVER:
            received = _deliver(self, link.generation, body)
            if received is not None:
                sub = self._subs.get(received.queue)
                if sub is not None:
                    sub._push(received)
                else:
                    log.debug("delivery %r for unsubscribed queue %r", received.id, received.queue)
                return
        if kind in (_PUBLISH_ACK, _ERROR):
            # A publish's reply: matched by the id sliced out, no full decode for an ack.
            n = (body[2] << 8) | body[3]
            try:
                msg_id = body[4 : 4 + n].decode()
            except UnicodeDecodeError:
                msg_id = ""
            waiter = self._publishes.pop(msg_id, None)
            if waiter is not None:
                self._settle_publish(waiter, msg_id, body, kind)
                return
        try:
            msg = decode_body(
                body,
            )
        except ProtocolError as exc:
            log.warning("dropping malformed frame from server: %s", exc)
            return
        try:
            self._handle(link, msg)
        except Exception:
            log.exception("error handling %s %r", msg.type.name, msg.id)

    @staticmethod
    def _settle_publish(waiter: _Waiter, msg_id: str, body: bytes, kind: int) -> None:
        error: VibeMQError | None = None
        if kind == _ERROR:
            try:
                reply = decode_body(body)
                error = VibeMQError(reply.error_code or "SERVER_ERROR", reply.error_message)
            except ProtocolError as exc:
                error = VibeMQError("INVALID_MESSAGE", f"malformed Error reply: {exc}")
        if isinstance(waiter, _Batch):
            waiter.settle(msg_id, error)
        elif not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    def _handle(self, link: _Link, msg: Message) -> None:
        kind = msg.type
        if kind == CommandType.DELIVER:
            sub = self._subs.get(msg.queue)
            if sub is None:
                log.debug("delivery %r for unsubscribed queue %r", msg.id, msg.queue)
                return
            sub._push(
                ReceivedMessage(self, link.generation, msg.id, msg.queue, msg.payload, msg.headers)
            )
            return
        if kind == CommandType.DISCONNECT:
            self.disconnect_reason = msg.headers.get("reason") or "unspecified"
            log.warning("server sent Disconnect (reason: %s)", self.disconnect_reason)
            # The server closes next; closing our side too makes the pump see EOF at once.
            link.abort()
            return
        if kind == CommandType.PING:
            with contextlib.suppress(ConnectionLost):
                link.send(Message(CommandType.PONG, msg.id))
            return
        fut = self._pending.get(msg.id)
        if fut is not None:
            del self._pending[msg.id]
            if not fut.done():
                fut.set_result(msg)
            return
        if kind == CommandType.UNSUBSCRIBE_ACK:
            self._server_unsubscribed(msg)
            return
        if kind == CommandType.ERROR:
            log.warning("server error for %r: %s %s", msg.id, msg.error_code, msg.error_message)
            return
        if kind != CommandType.PONG:  # Pongs answer our keepalive pings
            log.debug("unsolicited %s %r", kind.name, msg.id)

    def _server_unsubscribed(self, msg: Message) -> None:
        """An UnsubscribeAck we did not ask for: the server dropped our subscription."""
        queue = msg.queue or msg.headers.get("queueName", "")
        sub = self._subs.get(queue)
        if sub is None:
            return
        reason = msg.headers.get("reason") or "unsubscribed"
        log.info("subscription to %r ended by the server (%s)", queue, reason)
        del self._subs[queue]
        sub._end(reason)

    def _lost(self, link: _Link, cause: BaseException | None) -> None:
        """Tear down after a loss: no more sends on ``link``; fail what awaited a reply."""
        self._ready.clear()
        self._live = None
        link.abort()
        if self._closing:
            return
        text = self._loss_text(cause)
        log.warning("%s:%s %s", self.host, self.port, text)
        self._fail_pending(text)

    def _fail_pending(self, text: str) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ConnectionLost(text))
        publishes, self._publishes = self._publishes, {}
        for waiter in publishes.values():
            if isinstance(waiter, _Batch):
                waiter.fail(ConnectionLost(text))
            elif not waiter.done():
                waiter.set_exception(ConnectionLost(text))

    async def _reconnect(self) -> _Link:
        """Reconnect with exponential backoff (plus jitter, so clients of a restarted broker
        do not all knock at the same instant)."""
        delay = self.reconnect_initial_delay
        attempt = 0
        while True:
            attempt += 1
            if self.reconnect_max_attempts is not None and attempt > self.reconnect_max_attempts:
                raise ConnectionLost(
                    f"gave up reconnecting to {self.host}:{self.port} "
                    f"after {self.reconnect_max_attempts} attempts"
                )
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            try:
                link = await self._open_link()
            except VibeMQError as exc:
                if exc.code in _PERMANENT_CODES:
                    raise
                log.info("reconnect attempt %d failed: %s", attempt, exc)
            except ProtocolError as exc:
                log.info("reconnect attempt %d failed: %s", attempt, exc)
            else:
                self.disconnect_reason = None
                return link
            delay = min(delay * 2, self.reconnect_max_delay)

    def _finish(self, error: VibeMQError, *, reason: str) -> None:
        """The client is done for good: fail waiters, end subscriptions."""
        if self._final_error is None:
            self._final_error = error
        self._live = None
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._deadlines.clear()
        self._ready.set()  # wakes _wait_ready callers, which then raise the final error
        self._fail_pending(error.message or str(error))
        subs, self._subs = self._subs, {}
        for sub in subs.values():
            sub._end(reason, None if reason == "closed" else error)


def _publish_headers(headers: Mapping[str, str] | None, priority: str | None) -> bytes:
    if priority is not None:
        headers = {**(headers or {}), "priority": priority}
    if not headers:
        return _NO_HEADERS
    return _headers_bytes({k: v for k, v in headers.items() if k and v})


def tls_context(
    cafile: str | None = None, certfile: str | None = None, keyfile: str | None = None
) -> ssl.SSLContext:
    """A client TLS context: the server verified against ``cafile`` (default: the system's
    CAs), and a client certificate when ``certfile`` is given (for mutual TLS)."""
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if certfile is not None:
        ctx.load_cert_chain(certfile, keyfile)
    return ctx
