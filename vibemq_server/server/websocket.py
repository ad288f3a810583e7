"""A WebSocket layer between the shared transport and a stream protocol's session (MQTT).

``WebSocketSession`` is the ``Session`` the ``StreamTransport`` drives; inside it, the
protocol's own session (an ``MqttConnection``) runs unchanged over ``WebSocketLink``, a
``Link`` whose ``send`` puts the bytes into a binary WebSocket message. Both are sans-IO:
bytes in, the protocol's bytes out to the inner session; the inner session's bytes in,
WebSocket frames out to the transport. The protocol sees one byte stream, so one packet may
span several frames and one frame may hold several packets (MQTT 3.1.1 section 6, MQTT 5.0
section 6); both MQTT versions pass through untouched.

The WebSocket protocol is the ``websockets`` library's sans-IO ``ServerProtocol`` (well
kept, tested against the Autobahn suite, with a C routine for unmasking): the opening
handshake (request parsing, key, version and subprotocol negotiation, the refusals with their
HTTP status), ping/pong, the closing handshake and close codes, fragmented messages and their
size bound, text and malformed frames. We chose it over ``wsproto`` because it parsed and
framed small messages four to five times faster here. Even so, one library call per frame
(its generator-based parser, about 11 µs a frame here, and ``send_binary``, 3 µs) cost more
than the whole MQTT path of a small message, so the two hot cases take a short path of their
own: a read's run of whole, unfragmented, masked binary frames in is unmasked and joined in
one C call (``_wsunmask.unmask_run``, ours: the library's ``apply_mask`` is one call per
frame, and with the slicing around it cost 0.5 µs a frame, about a sixth of the broker's
time per QoS 0 delivery; ``unmask_run_pure`` is its fallback and reference); every other
frame still goes through the library, one whole frame at a time, so its parser is always at
a frame boundary; and a binary frame out is the opcode byte and the length in front of the
bytes (``send``: a server does not mask). The tests feed the same streams through both paths
(tests/unit/test_websocket_layer.py, tests/unit/test_wsunmask.py).

What this module adds: the path and subprotocols an endpoint accepts, the browser origins
it lets in (403 for others), a bound on the handshake's size and time, binary frames only, a
bound on a message's size (for MQTT, its maximum packet size), and a log line for each
refusal.
"""

from __future__ import annotations

import dataclasses
import http
import struct
from collections.abc import Callable, Sequence
from enum import Enum
from fnmatch import fnmatchcase
from typing import TypeVar
from urllib.parse import urlsplit

from websockets.exceptions import InvalidMessage
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import Event, State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from vibemq_server.protocol.bigcopy import Fill
from vibemq_server.server.stall import StallClock
from vibemq_server.server.transport import Link, ReadBatch, Session, SessionInfo

try:  # the library's C routine (a wheel has it built); its Python one else
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover
    from websockets.utils import apply_mask

_T = TypeVar("_T")

#: the request line and headers of an opening handshake; browsers send well under 2 KiB
#: (more with cookies). Beyond this the client gets 431 and the connection closes.
MAX_HANDSHAKE_BYTES = 16 * 1024


#: the first byte of a whole (FIN) binary frame without extension bits
_BINARY_WHOLE = 0x80 | Opcode.BINARY
#: the headers of the binary frames a server sends with a 7-bit length, by length
_HEAD7 = [bytes((0x80 | Opcode.BINARY, size)) for size in range(126)]
_HEAD16 = struct.Struct(">BBH")
_HEAD64 = struct.Struct(">BBQ")
#: what one read may gather into one frame before it goes to the transport (beyond it, a
#: frame now, so that the transport's own output bound still sees the bytes)
_GATHER_MAX = 65_536

#: the first byte of an HTTP request (its method: GET, or another the library refuses)
_METHOD_START = frozenset(bytes([c]) for c in range(ord("A"), ord("Z") + 1))


def _payload_length(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The payload length of the frame at ``pos`` and its header's size without the mask key
    (RFC 6455 5.2); a size of 0 when the extended length is not all read yet."""
    length = buf[pos + 1] & 0x7F
    if length == 126:
        if end - pos < 4:
            return 0, 0
        return (buf[pos + 2] << 8) | buf[pos + 3], 4
    if length == 127:
        if end - pos < 10:
            return 0, 0
        return int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
    return length, 2


def unmask_run_pure(buf: bytes, pos: int, max_message: int) -> tuple[bytes, int]:
    """From ``pos``, the frames that are whole, FIN + binary without extension bits, masked
    and at most ``max_message`` bytes: their data unmasked and joined, and where the first
    other frame (or the end of ``buf``) is. What ``_wsunmask.unmask_run`` (C) does, in one
    call per read instead of a handful per frame; this is its fallback and its reference."""
    end = len(buf)
    max_message = max(max_message, 0)
    parts: list[bytes] = []
    while end - pos >= 2 and buf[pos] == _BINARY_WHOLE:
        second = buf[pos + 1]
        if not second & 0x80:
            break  # unmasked: the library refuses it
        length, head = _payload_length(buf, pos, end)
        if not head:
            break
        head += 4
        stop = pos + head + length
        if length > max_message or stop > end:
            break
        parts.append(apply_mask(buf[pos + head : stop], buf[pos + head - 4 : pos + head]))
        pos = stop
    return (parts[0] if len(parts) == 1 else b"".join(parts)), pos


unmask_run: Callable[[bytes, int, int], tuple[bytes, int]]
try:  # built by the package's install or scripts/build_ext.sh; the pure loop else
    from vibemq_server.server._wsunmask import unmask_run
except ImportError:  # pragma: no cover
    unmask_run = unmask_run_pure


class Phase(Enum):
    """Where a WebSocket connection is (the library's own ``State``, named for us)."""

    HANDSHAKE = "websocket handshake"
    OPEN = "open"
    CLOSING = "closing"


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoint:
    """What one WebSocket listener accepts."""

    #: the request path (query strings are ignored)
    path: str
    #: subprotocols it speaks, preferred first; a client must offer one of them
    subprotocols: Sequence[str]
    #: the largest message (of any number of frames) a client may send, bytes
    max_message: int
    #: the opening handshake must be done within this, seconds
    handshake_timeout: float
    #: the protocol's name in the management API before its session exists
    protocol: str
    max_handshake_bytes: int = MAX_HANDSHAKE_BYTES
    #: the browser origins let in (``origin_patterns``); None: not checked
    origins: tuple[str, ...] | None = None


_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def origin_patterns(entries: Sequence[str]) -> tuple[str, ...]:
    """Allowed origins as ``origin_allowed`` compares them: lower case, the scheme's port
    written out when an entry leaves it implicit (``https://a.example`` is
    ``https://a.example:443``, as the browser's ``https://a.example`` is); ``*`` is the
    only wildcard."""
    patterns = []
    for entry in entries:
        pattern = entry.strip().lower().rstrip("/")
        scheme, sep, netloc = pattern.partition("://")
        port = _DEFAULT_PORTS.get(scheme)
        if sep and port is not None and ":" not in netloc.rpartition("]")[2]:
            pattern = f"{pattern}:{port}"
        # an IPv6 host's bracket is no set, and "?" no wildcard: "*" is the only one
        patterns.append(pattern.replace("[", "[[]").replace("?", "[?]"))
    return tuple(patterns)


def origin_key(origin: str) -> str | None:
    """An ``Origin`` header as ``scheme://host:port`` (port always written), ``null`` as
    itself; None for something that is not an origin."""
    value = origin.strip().lower()
    if value == "null":
        return value
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname
    default = _DEFAULT_PORTS.get(parts.scheme)
    if not host or default is None or parts.username is not None or parts.query:
        return None
    if parts.path not in ("", "/") or parts.fragment:
        return None
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}:{port or default}"


def origin_allowed(origin: str, patterns: Sequence[str]) -> bool:
    """Whether a browser's ``Origin`` matches one of ``origin_patterns``' patterns
    (``*`` matches any run of characters; ``*`` alone every origin)."""
    if "*" in patterns:
        return True
    key = origin_key(origin)
    return key is not None and any(fnmatchcase(key, pattern) for pattern in patterns)


class WebSocketSession:
    """One WebSocket connection: the handshake, then the protocol's session over its frames.

    ``make_session(link)`` builds the protocol's session once the handshake is done; the
    link it is given frames what it sends. The protocol's session closing (``link.close``)
    sends a close frame (1000; 1001 on broker shutdown, 1008 when an operator closed it),
    then closes the socket."""

    def __init__(
        self,
        link: Link,
        make_session: Callable[[Link], Session],
        endpoint: Endpoint,
        batch: ReadBatch | None = None,
    ) -> None:
        """``batch``: the broker's read batch; what the protocol sends while a read is
        handled is gathered into one binary frame per connection, framed when the read is
        done (as Mosquitto's websockets listener does: fewer frames for the client to parse,
        one header per read). Without it (or outside a read), each send is its own frame."""
        self.link = link
        self.log = link.log
        self._batch = batch
        self._gather: list[bytes] = []
        self._gathered = 0
        self.endpoint = endpoint
        self._make_session = make_session
        self.session: Session | None = None
        self.ws = ServerProtocol(
            subprotocols=[Subprotocol(s) for s in endpoint.subprotocols],
            max_size=endpoint.max_message,
        )
        self._started = link.time()
        self._handshake_bytes = 0
        self._tail = b""  # the end of the handshake read so far (see _split_head)
        self._rest = b""  # the start of a frame still arriving (see _frames)
        self._stall = StallClock()  # ... without progress since when (stall.py)
        self._in_message = False  # a fragmented message is open: its frames go to the library
        #: the connection is open for data frames (the library's state, kept at hand for the
        #: hot paths; updated after every call that may close it)
        self._open = False
        #: the close code sent when the protocol's session closes the connection
        self._close_code = CloseCode.NORMAL_CLOSURE
        self._reported = False  # the library's failure was logged
        self._inner = WebSocketLink(self)

    @property
    def phase(self) -> Phase:
        state = self.ws.state
        if state is State.OPEN:
            return Phase.OPEN
        return Phase.HANDSHAKE if state is State.CONNECTING else Phase.CLOSING

    # -- Session (what the transport drives) -------------------------------------------------

    def data_received(self, data: bytes) -> None:
        ws = self.ws
        if ws.state is State.CONNECTING and not self._reported:
            # The request alone first: what follows it (a client may send frames at once)
            # is read once the handshake is answered, so that nothing (a pong) goes out
            # before the 101.
            if data and not self._handshake_bytes and data[:1] not in _METHOD_START:
                # Not an HTTP request (an MQTT CONNECT, a TLS ClientHello...): say so now
                # rather than wait for a line end that may never come.
                self._handshake_bytes = len(data)
                self._not_http()
                self._write()
                return
            self._handshake_bytes += len(data)
            head, data = self._split_head(data)
            self._receive(head)
            if self.session is None:  # not accepted (yet): nothing more to read
                data = b""
        if data:
            if self.session is not None and ws.state is State.OPEN:
                self._frames(data)
            else:
                self._receive(data)  # (closing: the library discards it)
        if not self._reported:
            if ws.state is State.CONNECTING:
                self._handshake_failed()
            elif ws.parser_exc is not None:
                self._failed()
        self._write()

    def _frames(self, data: bytes) -> None:
        """Frames after the handshake. The common one, a whole unfragmented masked binary
        frame, is unmasked here, a read's run of them in one call (``unmask_run``) and their
        data handed on in one piece; any other frame (ping, pong, close, text, a fragment, a
        continuation, an unmasked or malformed one) goes to the library whole, one frame at a
        time, so that its parser is always at a frame boundary. A frame still arriving waits
        here, at most ``max_message`` plus its header (the library refuses a longer one from
        its header)."""
        had = bool(self._rest)
        buf = self._rest + data if had else data
        self._rest = b""
        end = len(buf)
        pos = 0
        chunks: list[bytes | bytearray | memoryview] = []
        max_message = self.endpoint.max_message
        while True:
            if not self._in_message:
                run, pos = unmask_run(buf, pos, max_message)
                if run:
                    chunks.append(run)
            if end - pos < 2:
                break
            # not the common frame (or not whole yet): its header, then the library
            first, second = buf[pos], buf[pos + 1]
            length, head = _payload_length(buf, pos, end)
            if not head:
                break
            if length > max_message:
                if chunks:
                    self._deliver(chunks)
                    chunks = []
                    if not self._open or self._reported:
                        return
                self._library_frame(buf[pos:], first)  # refused: 1009
                return
            masked = second & 0x80
            if masked:
                head += 4
            stop = pos + head + length
            if stop > end:
                break
            if chunks:
                self._deliver(chunks)
                chunks = []
                if not self._open or self._reported:
                    return
            self._library_frame(buf[pos:stop], first)
            if not self._open or self._reported:
                return  # closed: the rest is not read
            pos = stop
        if chunks:
            self._deliver(chunks)
        if pos < end:
            self._rest = buf[pos:]
        # A frame that completed, or 64 KiB more of the one arriving, restarts the clock.
        self._stall.after_read(len(self._rest), pos > 0, self.link.time())

    def _library_frame(self, frame: bytes, first: int) -> None:
        """One whole frame (or the start of one over the size limit) through the library,
        which keeps the state of a fragmented message; whether one is open, we note too."""
        opcode = first & 0x0F
        if opcode in (1, 2):
            self._in_message = not first & 0x80
        elif opcode == 0 and first & 0x80:
            self._in_message = False
        self._receive(frame)
        self._write()  # a pong, or the close frame
        self._open = self.ws.state is State.OPEN

    def _receive(self, data: bytes) -> None:
        ws = self.ws
        ws.receive_data(data)
        events = ws.events_received()
        if events:
            self._handle(events)

    def _split_head(self, data: bytes) -> tuple[bytes, bytes]:
        """``data`` cut after the blank line that ends the request's headers (if it is in
        there: the last bytes of the previous read may hold its start)."""
        window = self._tail + data
        end = window.find(b"\r\n\r\n")
        if end < 0:
            self._tail = window[-3:]
            return data, b""
        cut = end + 4 - len(self._tail)
        return data[:cut], data[cut:]

    def writable_again(self) -> None:
        if self.session is not None:
            self.session.writable_again()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.session is not None:
            self.session.connection_lost(exc)

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        stalled = self._rest and self._stall.stalled(now, frame_timeout)
        if stalled and self._open and not self.link.reading_paused:
            # as the protocol's own stalled packet (MQTT: frame_timeout_s)
            self.link.log.warning("incomplete websocket frame timed out", buffered=len(self._rest))
            self._reported = True
            self._open = False
            self.ws.fail(CloseCode.POLICY_VIOLATION, "incomplete frame timed out")
            self._write()
            return
        if self.session is not None:
            self.session.check_timers(now, keepalive, frame_timeout)
        elif now - self._started >= self.endpoint.handshake_timeout:
            self.link.log.warning(
                "websocket handshake timed out", after_s=self.endpoint.handshake_timeout
            )
            self.link.abort()

    def shutdown(self, reason: str) -> None:
        if self.session is None:
            self.link.close()
            return
        self._close_code = CloseCode.GOING_AWAY
        self.session.shutdown(reason)

    def describe(self) -> SessionInfo:
        if self.session is None:
            return SessionInfo(self.endpoint.protocol, None, None, self.phase.value)
        info = self.session.describe()
        return dataclasses.replace(info, details={**info.details, "websocket": True})

    def close_by_operator(self, reason: str) -> None:
        if self.session is None:
            self.link.log.info("connection closed by operator", reason=reason)
            self.link.abort()
            return
        self._close_code = CloseCode.POLICY_VIOLATION
        self.session.close_by_operator(reason)

    # -- frames in -----------------------------------------------------------------------------

    def _handle(self, events: list[Event]) -> None:
        """Hand the events of one read on: the data of consecutive data frames to the
        session in one piece (one parse, one batch of replies). Data that came before a
        close frame is handled (an MQTT DISCONNECT, say); nothing after a refused frame."""
        data: list[bytes | bytearray | memoryview] = []
        for event in events:
            if not isinstance(event, Frame):
                if isinstance(event, Request):  # (a server gets no Response)
                    self._opening(event)
                continue
            handler = _FRAMES[event.opcode]
            if handler is None:
                data.append(event.data)
                continue
            if data:
                self._deliver(data)
                data = []
            handler(self, event)
            if self._reported:
                return
        if data:
            self._deliver(data)

    def _deliver(self, chunks: list[bytes | bytearray | memoryview]) -> None:
        session = self.session
        if session is not None:
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            session.data_received(data if isinstance(data, bytes) else bytes(data))

    def _opening(self, request: Request) -> None:
        ws = self.ws
        path = urlsplit(request.path).path
        size = len(request.path) + sum(len(k) + len(v) + 4 for k, v in request.headers.raw_items())
        if size > self.endpoint.max_handshake_bytes:
            self._refuse(
                http.HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                "handshake over the size limit",
                limit=self.endpoint.max_handshake_bytes,
            )
            return
        if path != self.endpoint.path:
            self._refuse(http.HTTPStatus.NOT_FOUND, "unknown path", path=path[:200])
            return
        allowed = self.endpoint.origins
        if allowed is not None:
            # Browsers always send Origin on a WebSocket upgrade; other clients need not
            # (and could send any), so only a page's origin is checked: a site open in a
            # browser here must not reach the broker with the browser's network position.
            origins = request.headers.get_all("Origin")
            if origins and (len(origins) > 1 or not origin_allowed(origins[0], allowed)):
                self._refuse(
                    http.HTTPStatus.FORBIDDEN, "origin not allowed", origin=origins[0][:200]
                )
                return
        response = ws.accept(request)
        ws.send_response(response)
        if response.status_code != 101:
            self._reported = True
            self.link.log.warning(
                "websocket handshake refused",
                status=response.status_code,
                reason=str(ws.handshake_exc),
            )
            return
        self.link.log.debug("websocket open", subprotocol=ws.subprotocol)
        self._write()  # the 101 before anything the session sends
        self._open = True
        self.session = self._make_session(self._inner)

    def _binary_only(self, frame: Frame) -> None:
        self._reported = True
        self.link.log.warning("websocket text frame refused: binary frames only", code=1003)
        self.ws.fail(CloseCode.UNSUPPORTED_DATA, "binary frames only")
        self._open = False

    def _closing(self, frame: Frame) -> None:
        # The library answered with its own close frame; the socket closes once written.
        self.link.log.debug("websocket closed by peer", code=self.ws.close_code)

    def _ignore(self, frame: Frame) -> None:
        pass  # a ping was answered by the library; a pong needs nothing

    def _refuse(self, status: http.HTTPStatus, what: str, **fields: object) -> None:
        """Answer the handshake with ``status`` (and close)."""
        self._reported = True
        self.link.log.warning(f"websocket handshake refused: {what}", status=int(status), **fields)
        self.ws.send_response(self.ws.reject(status, f"{what}\n"))

    def _handshake_failed(self) -> None:
        """No handshake yet: a request the library refused by itself (not HTTP: 400; a line
        too long or too many headers: its 414 or 431), or one growing over our bound."""
        ws = self.ws
        exc = ws.handshake_exc
        if exc is None:
            if self._handshake_bytes > self.endpoint.max_handshake_bytes:
                self._refuse(
                    http.HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "handshake over the size limit",
                    limit=self.endpoint.max_handshake_bytes,
                )
            return
        self._reported = True
        if isinstance(exc, InvalidMessage):
            # The library only closes; a client is better told why.
            self.link.send(self._not_http_response())
            self.link.log.warning("websocket handshake refused: not HTTP", status=400)
            return
        self.link.log.warning("websocket handshake refused", reason=str(exc))

    def _not_http_response(self) -> bytes:
        response = self.ws.reject(http.HTTPStatus.BAD_REQUEST, "not a WebSocket handshake\n")
        return response.serialize()

    def _not_http(self) -> None:
        self._reported = True
        self.link.log.warning("websocket handshake refused: not HTTP", status=400)
        self.link.send(self._not_http_response())
        self.link.close()

    def _failed(self) -> None:
        """The library closed the connection on bad input (a protocol error, a message over
        the size limit): say why."""
        self._reported = True
        ws = self.ws
        sent = ws.close_sent
        self.link.log.warning(
            "websocket protocol error",
            code=None if sent is None else int(sent.code),
            reason=str(ws.parser_exc),
        )

    # -- bytes out -------------------------------------------------------------------------------

    def _write(self) -> None:
        """What the library has to send; its end of stream closes the socket after it."""
        if self._gather:
            self._flush()  # the protocol's bytes gathered so far go first
        link = self.link
        for chunk in self.ws.data_to_send():
            if chunk:
                link.send(chunk)
            else:
                link.close()

    def send(self, data: bytes) -> None:
        """The protocol's bytes: gathered while a read is handled (``_flush`` frames them
        when it is done), else one binary frame now."""
        if not self._open:
            return
        batch = self._batch
        if batch is not None and batch.reading:
            gather = self._gather
            if not gather:
                batch.dirty.append(self)
            gather.append(data)
            self._gathered += len(data)
            if self._gathered >= _GATHER_MAX:
                self._flush()
            return
        if self._gather:
            self._flush()
        self._frame(data)

    def _flush(self) -> None:
        """What was gathered, as one binary frame (the read batch calls this once the read is
        done; and before anything else this layer writes, to keep the order)."""
        gather = self._gather
        if not gather:
            return
        data = gather[0] if len(gather) == 1 else b"".join(gather)
        self._gather = []
        self._gathered = 0
        if self._open:
            self._frame(data)

    def abort(self) -> None:
        self.link.abort()

    def _frame(self, data: bytes) -> None:
        """``data`` as one binary frame (a server's frames are not masked: its header is the
        opcode byte and the length)."""
        size = len(data)
        head = _binary_head(size)
        self.link.send(head + data if size < 8192 else head)
        if size >= 8192:
            self.link.send(data)  # (no copy of a large one)

    def send_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        """The protocol's bytes in parts, as one binary frame (the parts are not joined;
        what was gathered before them goes first)."""
        if self._open:
            if self._gather:
                self._flush()
            self.link.send_parts([_binary_head(sum(map(len, parts))), *parts])

    def close(self) -> None:
        """The protocol's session closes the connection: a close frame, then the socket."""
        ws = self.ws
        if ws.state is State.OPEN:
            self._flush()
            self._open = False
            ws.send_close(self._close_code)
            self._write()
        self.link.close()


#: what each frame type does; None: its data is the protocol's stream (a binary message's
#: first frame or a continuation: only binary messages get this far)
_FRAMES: dict[Opcode, Callable[[WebSocketSession, Frame], None] | None] = {
    Opcode.BINARY: None,
    Opcode.CONT: None,
    Opcode.TEXT: WebSocketSession._binary_only,
    Opcode.PING: WebSocketSession._ignore,
    Opcode.PONG: WebSocketSession._ignore,
    Opcode.CLOSE: WebSocketSession._closing,
}


def _binary_head(size: int) -> bytes:
    """The header of a server's (unmasked) binary frame of ``size`` bytes."""
    if size < 126:
        return _HEAD7[size]
    if size < 65_536:
        return _HEAD16.pack(_BINARY_WHOLE, 126, size)
    return _HEAD64.pack(_BINARY_WHOLE, 127, size)


class WebSocketLink:
    """The ``Link`` the protocol's session gets: the transport's, except that what it sends
    is framed and that closing it closes the WebSocket first."""

    def __init__(self, ws: WebSocketSession) -> None:
        outer = ws.link
        self._ws = ws
        self._outer = outer
        self.conn_id = outer.conn_id
        self.log = outer.log
        self.peer_host = outer.peer_host
        self.peer_identity = outer.peer_identity
        self.over_tls = outer.over_tls
        self.send = ws.send
        self.send_parts = ws.send_parts
        self.close = ws.close
        self.abort = outer.abort
        self.pause_reading = outer.pause_reading
        self.resume_reading = outer.resume_reading
        self.call_soon = outer.call_soon
        self.call_later = outer.call_later
        self.time = outer.time

    @property
    def writable(self) -> bool:
        return self._ws._open and self._outer.writable

    @property
    def reading_paused(self) -> bool:
        return self._outer.reading_paused

    def offload(self, work: Callable[[], _T], then: Callable[[_T], None]) -> None:
        self._outer.offload(work, then)

    def read_into(self, fill: Fill) -> None:
        """Nothing: the socket's bytes are frames to unmask first (the session copies the
        payload's rest into ``fill`` itself)."""

    def replace_session(self, session: Session) -> None:
        self._ws.session = session
