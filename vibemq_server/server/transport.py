"""Write batching and flow control shared by the connections of every protocol.

Output is gathered and written once: at the end of the read being handled (``ReadBatch``),
or else at the end of the loop turn. While the socket is paused, or our own pending output
is over its bound, ``writable`` is False so deliveries wait in their queues instead of in
memory here; when it drains, ``_writable_again`` lets the protocol resume them.

Reads land straight in the ``bytes`` the session parses (``get_buffer``/``buffer_updated``,
``protocol/bigcopy.py: read_buffer``): no copy of every read out of uvloop's buffer.

A session may have the socket's next bytes read straight into a buffer of its own
(``Link.read_into``, a ``protocol/bigcopy.py: Fill``): the rest of a large payload whose
header is parsed goes into the payload's own ``bytes``, no join (MQTT PUBLISH). The session
is called with ``data_received(b"")`` after each such read (its stall clock, and the packet
once the fill is full); the generic hook for any protocol whose frames announce their length.
Not over TLS (the bytes must be decrypted first: the session copies them in itself). After a
payload of ``READ_SIZE`` or more the next read is a short one (``HEAD_SIZE``): the next
payload, probably as large, then comes almost whole into its fill, not a quarter of it through
the transport's buffer and a copy.

Input is read fairly: after a read that filled the transport's buffer (``READ_SIZE``) a
connection is not read again until the loop has turned, so one flooding peer cannot keep the
others (a consumer's acks among them) waiting. After a shorter read libuv stops reading that
socket this turn by itself; after a read that completed a fill, the next read decides,
unless the fill was a large payload's (``READ_SIZE`` or more): that read pauses, so a flood of
large messages is read one message a loop turn (the short read of the next one's header does
not pause: its fill's read decides).

A TLS listener hands the transport its ``ssl.SSLContext``: the transport runs the handshake
itself over memory BIOs (so a failed or stalled handshake is logged with its peer, and the
session sees the client certificate's identity), then encrypts and decrypts whole batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol, TypeVar, cast

import structlog

from vibemq_server.core.buffers import JOIN_ALL, PASS_THROUGH, coalesce
from vibemq_server.protocol.bigcopy import Fill, ReadInto, read_buffer, read_target
from vibemq_server.server import allocator
from vibemq_server.server.connlog import ConnLog, as_logger
from vibemq_server.server.stats import ProtocolStats
from vibemq_server.server.tls import describe, peer_identity

if TYPE_CHECKING:
    from vibemq_server.protocol.bigcopy import ReadTarget

#: The most one socket read takes (uvloop's own read buffer's size, 256,000 bytes). After a
#: read that filled it, more input is probably waiting: the connection is not read again
#: until the loop has turned. libuv reads a readable socket again and again while each read
#: fills the buffer it was offered, up to 32 times (8 MB, some 60,000 publishes) in one loop
#: turn; a consumer's acks that arrived meanwhile waited behind all of it, seconds on a busy
#: machine, with its window full and ready messages in the queue (issue 12). After a shorter
#: read libuv stops by itself (``uv__read``: the socket is drained), so no pause is needed
#: (two ``epoll_ctl`` calls saved). Nor after a read that filled a payload's fill (it
#: completes that payload, so the next read goes into this buffer and decides): a flooding
#: connection gets at most a fill's rest and one such read a turn.
READ_SIZE: Final = 256_000
#: The read after a payload of READ_SIZE bytes or more: enough for the next packet's header
#: (MQTT's 1 MiB PUBLISH has 19 bytes of it) so that its session starts the payload's fill
#: (``Link.read_into``) and the kernel reads the rest straight into it. With a full read
#: instead, 256,000 bytes of a 1 MiB payload were copied from the transport's buffer into
#: its fill (132,000 instructions a message, some 40 % of the broker's user space). A header
#: longer than this (a long topic) just takes the next read, a full one, as before.
HEAD_SIZE: Final = 1024
#: A read shorter than this is copied out of the read buffer (cheaper than cutting the
#: buffer to its length, and the buffer serves the next read); longer ones are handed on as
#: the buffer itself. Without the broker's allocator thresholds a cut costs a page-faulted
#: heap top per read (protocol/_bigcopy.c), so then only full reads are handed on.
COPY_BELOW: Final = 4096

_T = TypeVar("_T")

log = structlog.get_logger("vibemq.transport")

#: The first bytes of a TLS ClientHello: a handshake record of TLS 1.x (SSL 3 = 3.0).
_TLS_RECORD: Final = b"\x16\x03"
#: A read returns at most one TLS record (16 KiB of plaintext); a larger buffer would only
#: cost an allocation (and a large one an mmap) per record.
_RECORD_MAX: Final = 32_768

#: the output of a connection with nothing to write (never appended to: the first send makes
#: the connection its own list), so that an idle one holds no empty list
_NO_OUTPUT: Final[list[bytes | memoryview]] = []


class Flushable(Protocol):
    """What a read batch holds: a connection whose output waits for the end of the read
    (``StreamTransport``; a test's link that stands in for one). A protocol, not the class:
    the compiled build checks the types of what goes in."""

    @property
    def log(self) -> structlog.typing.FilteringBoundLogger: ...

    def _flush(self) -> None: ...

    def abort(self) -> None: ...


class ReadBatch:
    """While one connection handles a read, the output it gives any connection (acks to the
    publisher, deliveries to subscribers, of any protocol) is written when the read is done:
    one write per connection per read, and without waiting for the next loop turn.

    ``hold`` and ``release`` (the core's ``QueueManager.hold``/``release``) bracket the
    outermost read: what the core holds back meanwhile is handed over before the writes."""

    __slots__ = ("_depth", "_hold", "_release", "dirty", "reading")

    def __init__(
        self,
        hold: Callable[[], None] | None = None,
        release: Callable[[], None] | None = None,
    ) -> None:
        self.reading = False
        self._depth = 0
        self.dirty: list[Flushable] = []
        self._hold = hold
        self._release = release

    def begin(self) -> None:
        self._depth += 1
        self.reading = True
        if self._depth == 1 and self._hold is not None:
            self._hold()

    def end(self) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        if self._release is not None:
            try:
                self._release()  # (still reading: what it sends is written just below)
            except Exception:
                log.exception("release after a read failed")
        self.reading = False
        # A connection whose flush fails must not leave the others' output unwritten (their
        # flush flag would stay set and nothing they send would ever be written again).
        while self.dirty:
            dirty, self.dirty = self.dirty, []
            for conn in dirty:
                try:
                    conn._flush()
                except Exception:
                    conn.log.exception("write failed")
                    conn.abort()


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """One consumer of a connection, as an operator sees it."""

    queue: str
    #: the subscription id (native), consumer tag (AMQP), client id (MQTT)
    tag: str
    prefetch: int
    unacked: int
    #: the AMQP channel it was started on (None for the other protocols)
    channel: int | None = None


#: a protocol-specific detail of a session (AMQP client properties, MQTT keep-alive, ...)
Detail = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """What an operator sees of one connection's protocol session (the management API)."""

    protocol: str
    #: who the client logged in as (None: not logged in yet)
    user: str | None
    #: MQTT client id, native clientVersion, AMQP product and connection_name
    client_id: str | None
    state: str
    channels: int = 0
    consumers: tuple[ConsumerInfo, ...] = ()
    #: address subscriptions (MQTT topic filter -> granted QoS)
    subscriptions: Mapping[str, int] = field(default_factory=dict)
    details: Mapping[str, Detail] = field(default_factory=dict)


class Session(Protocol):
    """What the transport drives: one protocol's sans-IO session of one connection."""

    def data_received(self, data: bytes) -> None:
        """Parse every complete frame in ``data`` (and what was buffered) and handle them."""

    def writable_again(self) -> None:
        """The connection can take output again: resume deliveries."""

    def connection_lost(self, exc: Exception | None) -> None:
        """The socket is gone: release subscriptions, return unacknowledged deliveries."""

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        """Keep-alive and stalled-frame checks, about once a second (``now``: loop time)."""

    def shutdown(self, reason: str) -> None:
        """Broker shutdown: say goodbye in the protocol's own words, then close."""

    def describe(self) -> SessionInfo:
        """Protocol, user, client id, consumers: what the management API shows."""
        ...

    def close_by_operator(self, reason: str) -> None:
        """An operator closes the connection: tell the client ``reason`` in the protocol's
        own words (where it has any), log it, close."""


class Link(Protocol):
    """What a session may do with its connection (``StreamTransport`` implements it). A
    ``StreamTransport`` also has its ``link_state`` (``LinkState``), which a session may read
    instead of ``writable`` (the same answer, natively) when its link has one."""

    conn_id: str

    @property
    def log(self) -> structlog.typing.FilteringBoundLogger: ...

    #: the client's address (for authentication: loopback or not, failed logins per address)
    peer_host: str

    @property
    def peer_identity(self) -> str | None:
        """Over TLS with a verified client certificate: its CN (or first SAN); else None."""

    @property
    def over_tls(self) -> bool:
        """The connection came in on a TLS listener."""

    @property
    def writable(self) -> bool: ...

    @property
    def reading_paused(self) -> bool: ...

    def send(self, data: bytes) -> None: ...

    def send_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        """Send ``parts`` in order, the large ones written as they are (no join: a large
        message's body between its frame headers)."""

    def read_into(self, fill: Fill) -> None:
        """Read the socket's next bytes straight into ``fill`` until it is full, calling
        ``data_received(b"")`` after each read; or nothing (TLS, WebSocket): the bytes then
        come to ``data_received`` as usual."""

    def close(self) -> None: ...

    def abort(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def call_soon(self, callback: Callable[[], None]) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> None: ...

    def offload(self, work: Callable[[], _T], then: Callable[[_T], None]) -> None:
        """Run ``work`` (CPU-heavy, e.g. a password hash) in a worker thread, then
        ``then(result)`` on the loop, unless the connection has closed meanwhile."""

    def time(self) -> float: ...

    def replace_session(self, session: Session) -> None:
        """From now on the connection drives ``session`` instead of the one it made (MQTT:
        the version picker hands over to the 3.1.1 or 5.0 connection once CONNECT has
        said which, and is dropped)."""


class ListenerContexts:
    """What the connections of one protocol's listeners share, given once: logger, output
    limit, read batch, broker hooks, TLS handshake deadline, counters. ``get(tls)`` makes
    the ``TransportContext`` of the listeners on one TLS context (None: plain) on the first
    connection (on the loop) and hands the same one to the next.

    ``stats``: the protocol's counters (bytes in and out, connections); None: counted
    nowhere shared. ``refusal``: what to write before closing a connection over the limit,
    or a function of the connection id that makes it (only then: nothing is built per
    accepted connection)."""

    __slots__ = (
        "_by_tls",
        "batch",
        "handshake_timeout",
        "log",
        "out_limit",
        "refusal",
        "register",
        "stats",
        "unregister",
    )

    def __init__(
        self,
        *,
        log: structlog.typing.FilteringBoundLogger,
        out_limit: int,
        batch: ReadBatch,
        register: Callable[[StreamTransport], bool],
        unregister: Callable[[StreamTransport], None],
        handshake_timeout: float = 10.0,
        stats: ProtocolStats | None = None,
        refusal: bytes | Callable[[str], bytes] = b"",
    ) -> None:
        self.log = log
        self.out_limit = out_limit
        self.batch = batch
        self.register = register
        self.unregister = unregister
        self.handshake_timeout = handshake_timeout
        self.stats = stats
        self.refusal = refusal
        self._by_tls: dict[ssl.SSLContext | None, TransportContext] = {}

    def get(self, tls: ssl.SSLContext | None) -> TransportContext:
        context = self._by_tls.get(tls)
        if context is None:
            context = self._by_tls[tls] = TransportContext(self, tls)
        return context


class TransportContext:
    """What the connections of one listener share (its ``ListenerContexts``' settings and
    its TLS context) -- one object the listener's transports point to, instead of ten
    attributes copied into every connection (docs/performance.md, "Idle connections"). Made
    on the loop (it keeps the running one)."""

    __slots__ = (
        "batch",
        "handshake_timeout",
        "head_reader",
        "log",
        "loop",
        "out_limit",
        "reader",
        "refusal",
        "register",
        "stats",
        "tls",
        "unregister",
    )

    def __init__(self, listener: ListenerContexts, tls: ssl.SSLContext | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        #: where the listener's connections' reads land (one at a time: the one loop)
        self.reader: ReadInto = read_buffer(COPY_BELOW if allocator.tuned() else READ_SIZE)
        #: where a read of HEAD_SIZE goes (always copied out: the buffer serves again)
        self.head_reader: ReadInto = read_buffer(HEAD_SIZE + 1)
        # (copied: the transports' hot paths read one object)
        self.log = listener.log
        self.out_limit = listener.out_limit
        self.batch = listener.batch
        self.register = listener.register
        self.unregister = listener.unregister
        self.refusal = listener.refusal
        self.handshake_timeout = listener.handshake_timeout
        self.stats = listener.stats if listener.stats is not None else ProtocolStats("")
        self.tls = tls


class TlsChannel:
    """The TLS side of one connection (over memory BIOs), made when its socket is accepted
    on a TLS listener: a plain connection keeps one empty slot instead of four."""

    __slots__ = ("bio_in", "bio_out", "identity", "obj")

    def __init__(self, context: ssl.SSLContext) -> None:
        self.bio_in = ssl.MemoryBIO()
        self.bio_out = ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.bio_in, self.bio_out, server_side=True)
        #: the verified client certificate's CN (or first SAN), once the handshake is done
        self.identity: str | None = None


class LinkState:
    """A connection's output as its transport keeps it: the pieces waiting to be written, their
    size against its bound, and ``blocked`` while the socket's buffer is full or the connection
    is closing. A compiled class: a session reads ``writable`` and calls ``send`` here natively
    each message, where ``StreamTransport``'s (a class that cannot be a native one: it
    subclasses asyncio's ``BufferedProtocol``) are looked up and read by name from the compiled
    session (~240 instructions a ``writable``, ~150 a ``send``).

    The first piece after a flush calls ``schedule`` (the transport's, given once), which has
    the transport flush the pieces (``take``) at the end of the read or the loop's turn."""

    __slots__ = (
        "blocked",
        "closing",
        "flush_scheduled",
        "large",
        "limit",
        "out",
        "schedule",
        "size",
    )

    def __init__(self, limit: int, schedule: Callable[[], None]) -> None:
        self.size = 0
        self.limit = limit
        self.blocked = False
        #: nothing more is taken (the connection is closing or closed)
        self.closing = False
        self.out: list[bytes | memoryview] = _NO_OUTPUT
        #: the output holds a piece of at least PASS_THROUGH bytes (only then ``coalesce``)
        self.large = False
        self.flush_scheduled = False
        self.schedule = schedule

    @property
    def writable(self) -> bool:
        return not self.blocked and self.size < self.limit

    def send(self, data: bytes) -> None:
        if self.closing:
            return
        out = self.out
        if out is _NO_OUTPUT:
            self.out = [data]
        else:
            out.append(data)
        size = len(data)
        self.size += size
        if size >= PASS_THROUGH:
            self.large = True
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.schedule()

    def send_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        if self.closing:
            return
        out = self.out
        if out is _NO_OUTPUT:
            out = self.out = []
        # (a loop, not extend and sum(map(len, ...)): native in the compiled build)
        size = 0
        for part in parts:
            out.append(part)
            n = len(part)
            size += n
            if n >= PASS_THROUGH:
                self.large = True
        self.size += size
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.schedule()

    def take(self) -> list[bytes | memoryview]:
        """The pending pieces, handed over: the output is empty again (its next piece
        schedules the next flush)."""
        out = self.out
        self.out = _NO_OUTPUT
        self.size = 0
        self.large = False
        self.flush_scheduled = False
        return out


class StreamTransport(asyncio.BufferedProtocol):
    """The one asyncio protocol of every stream listener, whatever it speaks: it owns the
    socket, the output buffer, flow control and the per-read batch, and hands bytes to the
    protocol's sans-IO ``Session`` (made by ``make_session`` once the socket is accepted).

    Slotted and lean: an idle connection costs what its attributes hold, nothing more
    (docs/performance.md, "Idle connections"). No timer or task per connection: the TLS
    handshake deadline is checked by the broker's once-a-second sweep (``check_timers``),
    the logger is bound only when the connection logs something (``ConnLog``), and what
    the listener's connections share is one ``TransportContext``."""

    __slots__ = (
        "_closing",
        "_counted",
        "_ctx",
        "_head_next",
        "_into",
        "_make_session",
        "_offered",
        "_reading_paused",
        "_sniff",
        "_tls",
        "_yielding",
        "bytes_received",
        "bytes_sent",
        "conn_id",
        "connected_at",
        "link_state",
        "peer_host",
        "peer_port",
        "session",
        "transport",
    )

    def __init__(
        self,
        make_session: Callable[[StreamTransport], Session],
        *,
        conn_id: str,
        context: TransportContext,
    ) -> None:
        self._ctx = context
        self._counted = False  # counted as an open connection in stats
        self._make_session: Callable[[StreamTransport], Session] | None = make_session
        self.conn_id = conn_id
        self.session: Session | None = None
        self.transport: asyncio.Transport | None = None
        #: the pending output, its size, and whether more may be sent (the sessions read it
        #: and send through it natively)
        self.link_state = LinkState(context.out_limit, self._schedule_flush)
        self._reading_paused = False
        self._yielding = False  # not read until the loop turns (after a full read)
        self._into: Fill | None = None  # the session's buffer the next reads go into
        # The last read completed a payload of READ_SIZE or more: the next is a short one
        # (HEAD_SIZE) that reads the next one's header only.
        self._head_next = False
        # How long a socket read must be to pause reading (see READ_SIZE): the length of the
        # buffer it was offered (get_buffer); for a large payload's fill what it had left (the
        # read that completes it); 0 for a smaller fill or a header's read (never). Before
        # any, uvloop's own buffer's (a plain asyncio.Protocol read, as a test's wrapper makes).
        self._offered = READ_SIZE
        self._closing = False
        self.peer_host = ""
        self.peer_port = 0
        #: when the socket was accepted (Unix time, seconds)
        self.connected_at = 0.0
        #: the protocol's bytes (after TLS decryption, before encryption)
        self.bytes_received = 0
        self.bytes_sent = 0
        self._tls: TlsChannel | None = None
        # A plain listener looks once at the first bytes for a TLS ClientHello.
        self._sniff = context.tls is None

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Take the socket: a logger bound to the peer, a bounded write buffer, and a place
        under the broker's connection limit (over it: the refusal is written, the socket
        closed)."""
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        # (interned: the many connections from one address -- a NAT, a gateway, a load
        # balancer -- share one string)
        self.peer_host = sys.intern(str(peer[0])) if peer else ""
        self.peer_port = int(peer[1]) if peer else 0
        self.connected_at = time.time()
        ctx = self._ctx
        self.transport.set_write_buffer_limits(high=ctx.out_limit)
        if not ctx.register(self):
            self.log.warning("connection refused: limit reached")
            refusal = ctx.refusal
            if refusal and ctx.tls is None:
                self.transport.write(
                    refusal if isinstance(refusal, bytes) else refusal(self.conn_id)
                )
            self._close_state()
            self.transport.close()
            return
        self.log.debug("connection opened")
        stats = self._ctx.stats
        stats.connections += 1
        stats.connections_total += 1
        self._counted = True
        if ctx.tls is not None:
            # The session starts once the handshake is done (and the peer known).
            self._tls = TlsChannel(ctx.tls)
            return  # (its deadline: check_timers)
        self._start_session()

    def get_buffer(self, sizehint: int) -> ReadTarget:
        """Where the next read goes (``sizehint``, libuv's 64 KiB, is not used: a read of up
        to READ_SIZE takes what a publisher sent at once); the session's fill while it has
        one (``read_into``); after a large payload, HEAD_SIZE bytes for the next header."""
        into = self._into
        if into is not None:
            rest = len(into)
            # (a large payload's: the read that completes it pauses, see READ_SIZE)
            self._offered = rest if into.filled + rest >= READ_SIZE else 0
            return read_target(into)
        if self._head_next:
            self._offered = 0
            return self._ctx.head_reader.get(HEAD_SIZE)
        self._offered = READ_SIZE
        return self._ctx.reader.get(READ_SIZE)

    def buffer_updated(self, nbytes: int) -> None:
        into = self._into
        if into is None:
            if self._head_next:
                self._head_next = False
                self.data_received(self._ctx.head_reader.take(nbytes))
            else:
                self.data_received(self._ctx.reader.take(nbytes))
            return
        if into.advance(nbytes):
            self._into = None
            self._head_next = self._offered != 0  # (a large payload's fill: see HEAD_SIZE)
        session = self.session
        if session is None or self._closing:
            return
        self._hand_over(session, b"", nbytes, nbytes)  # (the bytes are in the fill)

    def read_into(self, fill: Fill) -> None:
        if self._tls is None and not self._closing and len(fill):
            self._into = fill

    def data_received(self, data: bytes) -> None:
        session = self.session
        if session is None or self._closing:
            if self._tls is not None and not self._closing:
                self._handshake(data)
            return
        read = len(data)  # (from the socket: before decryption)
        if self._tls is not None:
            data = self._decrypt(data)
            if not data:
                return
        elif self._sniff:
            self._sniff = False
            if data[:2] == _TLS_RECORD:
                self.log.warning("TLS handshake on a plain port: closed")
                self.abort()
                return
        self._hand_over(session, data, len(data), read)

    def _hand_over(self, session: Session, data: bytes, nbytes: int, read: int) -> None:
        """``data`` to the session, ``nbytes`` of the protocol's for it (counted) from a
        socket read of ``read`` bytes (not read again this turn if that filled READ_SIZE)."""
        self.bytes_received += nbytes
        self._ctx.stats.bytes_received += nbytes
        batch = self._ctx.batch
        batch.begin()
        try:
            session.data_received(data)
        except Exception:  # a bug must cost this connection only, never the broker
            self.log.exception("internal error handling input")
            self.abort()
        finally:
            batch.end()
        if read == self._offered:
            self._yield_reading()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._close_state()
        self._make_session = None
        self._ctx.unregister(self)
        if self._counted:
            self._counted = False
            self._ctx.stats.connections -= 1
        if self.session is not None:
            self.session.connection_lost(exc)
        self.log.debug("connection closed", error=str(exc) if exc else None)

    def pause_writing(self) -> None:
        self.link_state.blocked = True

    def resume_writing(self) -> None:
        self.link_state.blocked = self._closing
        self._writable_again()

    def _close_state(self) -> None:
        """Closing: nothing more is sent (``writable`` is False from now on)."""
        self._closing = True
        state = self.link_state
        state.blocked = True
        state.closing = True

    # -- what the broker drives (its Link) ---------------------------------------------------------

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        """The broker's sweep, about once a second: the session's own timers, or, during a
        TLS handshake, its deadline."""
        if self._closing:
            return
        if self.session is not None:
            self.session.check_timers(now, keepalive, frame_timeout)
        elif (
            self._tls is not None and time.time() - self.connected_at > self._ctx.handshake_timeout
        ):
            self._handshake_timed_out()

    def replace_session(self, session: Session) -> None:
        self.session = session

    @property
    def peer_identity(self) -> str | None:
        tls = self._tls
        return tls.identity if tls is not None else None

    @property
    def over_tls(self) -> bool:
        return self._ctx.tls is not None

    def log_context(self) -> dict[str, object]:
        """What this connection's log lines carry (``ConnLog`` binds it on first use)."""
        context: dict[str, object] = {
            "conn_id": self.conn_id,
            "peer": f"{self.peer_host}:{self.peer_port}" if self.peer_host else "",
        }
        if self.peer_identity is not None:
            context["identity"] = self.peer_identity
        return context

    def _start_session(self) -> None:
        make_session, self._make_session = self._make_session, None
        assert make_session is not None
        self.session = make_session(self)

    def shutdown(self, reason: str) -> None:
        if self.session is not None and not self._closing:
            self.session.shutdown(reason)
        else:
            self.close()

    # -- what the management API uses ----------------------------------------------------------

    def describe(self) -> SessionInfo | None:
        """The session's description; None while there is none (a TLS handshake)."""
        return self.session.describe() if self.session is not None else None

    def close_by_operator(self, reason: str) -> None:
        if self.session is not None and not self._closing:
            self.session.close_by_operator(reason)
        else:
            self.log.info("connection closed by operator", reason=reason)
            self.abort()  # no session yet: nobody to tell

    # -- what the session uses (Link) --------------------------------------------------------------

    @property
    def log(self) -> structlog.typing.FilteringBoundLogger:
        """This connection's logger: made on each use, bound only when a line is logged
        (``ConnLog``), so that an idle connection keeps none."""
        return as_logger(ConnLog(self._ctx.log, self))

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._ctx.loop

    @property
    def stats(self) -> ProtocolStats:
        """The listener's protocol counters (shared by its connections)."""
        return self._ctx.stats

    @property
    def writable(self) -> bool:
        return self.link_state.writable

    @property
    def reading_paused(self) -> bool:
        return self._reading_paused

    def time(self) -> float:
        return self._ctx.loop.time()

    def call_soon(self, callback: Callable[[], None]) -> None:
        self._ctx.loop.call_soon(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self._ctx.loop.call_later(delay, callback)

    def offload(self, work: Callable[[], _T], then: Callable[[_T], None]) -> None:
        future = self._ctx.loop.run_in_executor(None, work)

        def done(finished: asyncio.Future[_T]) -> None:
            if self._closing or self.session is None:
                if not finished.cancelled():
                    finished.exception()  # retrieved: it dies with the connection
                return
            batch = self._ctx.batch
            batch.begin()
            try:
                then(finished.result())
            except Exception:  # as in data_received: this connection only
                self.log.exception("internal error after offloaded work")
                self.abort()
            finally:
                batch.end()

        future.add_done_callback(done)

    def send(self, data: bytes) -> None:
        self.link_state.send(data)

    def send_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        self.link_state.send_parts(parts)

    def _schedule_flush(self) -> None:
        """The output's first piece since the last flush: flush at the end of the read, or
        at the loop's next turn outside one."""
        batch = self._ctx.batch
        if batch.reading:
            batch.dirty.append(self)
        else:
            self._ctx.loop.call_soon(self._flush)

    def _flush(self) -> None:
        state = self.link_state
        if not state.out or self.transport is None or self._closing:
            state.flush_scheduled = False
            return  # (closing: close() flushed already; a lost connection's output is void)
        size = state.size
        self.bytes_sent += size
        self._ctx.stats.bytes_sent += size
        was_full = size >= state.limit
        large = state.large
        out = state.take()
        if len(out) == 1:
            pieces = out
        elif size <= JOIN_ALL or not large:
            # (small pieces only: coalesce would join them all too, after a loop over them)
            pieces = [b"".join(out)]
        else:
            pieces = coalesce(out)
        if self._tls is not None:
            for piece in pieces:  # (SSLObject copies into its records anyway)
                self._encrypt(piece)
        elif len(pieces) == 1:
            self.transport.write(pieces[0])
        else:
            # One writev of the small pieces joined and the large ones as they are: a
            # 1 MB payload is not copied to be glued to its 10-byte header.
            self.transport.writelines(pieces)
        if was_full and self.writable:
            self._writable_again()

    def _writable_again(self) -> None:
        if self.session is not None and not self._closing:
            self.session.writable_again()

    def _yield_reading(self) -> None:
        """Stop reading until the loop has turned: the other connections' input goes first."""
        if self._yielding or self.transport is None or self._closing:
            return
        self._yielding = True
        self.transport.pause_reading()
        self._ctx.loop.call_soon(self._end_yield)

    def _end_yield(self) -> None:
        self._yielding = False
        if not self._reading_paused and self.transport is not None and not self._closing:
            self.transport.resume_reading()

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self._closing:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self._closing:
            self._reading_paused = False
            if not self._yielding:  # else _end_yield resumes
                self.transport.resume_reading()

    def close(self) -> None:
        """Close after what is queued has been written."""
        if self._closing or self.transport is None:
            return
        self._flush()
        self._close_state()
        if self._tls is not None and self.session is not None:
            # close_notify, so the peer knows the stream was not cut short
            with contextlib.suppress(ssl.SSLError):
                self._tls.obj.unwrap()
            self._send_records()
        self.transport.close()

    def abort(self) -> None:
        self._close_state()
        if self.transport is not None:
            self.transport.abort()

    # -- TLS ---------------------------------------------------------------------------------

    def _handshake(self, data: bytes) -> None:
        tls = self._tls
        assert tls is not None
        tls.bio_in.write(data)
        try:
            tls.obj.do_handshake()
        except ssl.SSLWantReadError:
            self._send_records()
            return
        except (ssl.SSLError, ValueError) as exc:
            self._send_records()  # the alert, so the client knows why
            self._tls_failed("TLS handshake failed", exc)
            return
        self._send_records()  # the server's last flight (and TLS 1.3 session tickets)
        tls.identity = peer_identity(tls.obj.getpeercert())
        self.log.debug(
            "TLS established",
            version=tls.obj.version(),
            cipher=(tls.obj.cipher() or ("",))[0],
            identity=tls.identity,
        )
        self._start_session()
        if tls.bio_in.pending:
            self.data_received(b"")  # application data that came with the handshake

    def _decrypt(self, data: bytes) -> bytes:
        """What ``data`` (and what was buffered) decrypts to; a close or an error ends the
        connection after what was decrypted before it is handled."""
        tls = self._tls
        assert tls is not None
        ssl_obj, bio_in = tls.obj, tls.bio_in
        if data:
            bio_in.write(data)
        chunks: list[bytes] = []
        try:
            while True:
                chunk = ssl_obj.read(_RECORD_MAX)
                if not chunk:
                    self.close()
                    break
                chunks.append(chunk)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            self.close()  # the peer's close_notify
        except ssl.SSLError as exc:
            self._tls_failed("TLS error", exc)
        if tls.bio_out.pending:
            self._send_records()
        if len(chunks) == 1:
            return chunks[0]
        return b"".join(chunks)

    def _encrypt(self, data: bytes | memoryview) -> None:
        assert self._tls is not None
        try:
            self._tls.obj.write(data)
        except ssl.SSLError as exc:
            self._tls_failed("TLS error", exc)
            return
        self._send_records()

    def _send_records(self) -> None:
        tls = self._tls
        if tls is not None and tls.bio_out.pending and self.transport is not None:
            self.transport.write(tls.bio_out.read())

    def _tls_failed(self, what: str, exc: BaseException) -> None:
        self.log.warning(what, reason=describe(exc))
        self._close_state()
        if self.transport is not None:
            self.transport.close()  # after the alert is written

    def _handshake_timed_out(self) -> None:
        if self.session is None and not self._closing:
            self.log.warning("TLS handshake timed out", after_s=self._ctx.handshake_timeout)
            self.abort()
