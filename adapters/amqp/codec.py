"""Sans-IO codec of AMQP 0-9-1 framing: bytes in, typed frames out; frames in, bytes out.

:class:`FrameParser` is an incremental decoder: ``feed(data)`` appends bytes and returns every
frame completed by them, in order -- first a :class:`ProtocolHeader` (the 8-byte
``AMQP\\x00\\x00\\x09\\x01`` greeting), then :class:`MethodFrame`, :class:`HeaderFrame`,
:class:`BodyFrame` and :class:`Heartbeat`. The ``encode_*`` functions build outgoing frames.
Nothing here awaits, reads a clock or touches a socket.

Frame layout: type (u8), channel (u16), payload size (u32), payload, frame-end 0xCE.

Hot and cold paths. Methods are pamqp command objects (pamqp: the spec-generated codec
aiormq uses), so the adapter dispatches on one set of types. pamqp encodes the cold methods;
they are decoded here from the argument layouts of pamqp's classes, because pamqp's own
unmarshal is quadratic in table size (a 128 KiB ``arguments`` table costs it up to a second),
recurses without bound and silently truncates overlong strings. The frames a busy
connection is made of are hand-written: basic.publish / ack / nack / reject decoding,
content header and body framing, basic.deliver / get-ok / return encoding and the broker's
publisher-confirm acks. Content-header properties stay raw bytes end to end:
consumers receive exactly what the publisher sent; :func:`decode_properties` is there for
the few places that must look inside (persistence, TTL, headers exchanges).

Errors: everything wrong with the input raises :class:`AmqpError` carrying a
:class:`ReplyCode`; after one the stream cannot be resynchronised and the parser is spent.
The codes (RabbitMQ's ``rabbit_reader`` / ``rabbit_command_assembler`` as the reference):
bad frame-end, payload over frame-max, unknown frame type, a method frame under 4 bytes or a
content header under 12, a heartbeat with a payload or on a channel other than 0 -> 501
FRAME_ERROR (RabbitMQ: 505 for the last); a content header for a class other than basic or
with a non-zero weight -> 505 UNEXPECTED_FRAME (as RabbitMQ); an unknown class/method id ->
540 NOT_IMPLEMENTED; method arguments that do not decode (including trailing bytes after a
fast-path method), garbage properties or tables -> 502 SYNTAX_ERROR (RabbitMQ: 501). All of
them close the connection. What the parser does *not* know is channel state: "a header must
follow a content-bearing method", "channel 0 carries only connection methods", body sizes --
those are the adapter's.

Field tables follow RabbitMQ's reading of the errata (``rabbit_binary_parser``): ``s`` (and
the spec's ``U``) is a signed 16-bit short, both ``l`` and ``L`` are signed 64-bit, ``x`` is a
byte array. Decoded values use pamqp's Python types, so tables decoded here and by pamqp (cold
methods' ``arguments``) look alike: ``S`` -> ``str`` (``bytes`` when not UTF-8), ``x`` ->
``bytearray``, ``T`` -> aware UTC ``datetime``, ``D`` -> ``Decimal``, ``V`` -> ``None``.

``encode_*`` validate what they are given with ``ValueError`` / ``TypeError`` (a programming
error, not a peer's).
"""

from __future__ import annotations

import datetime as _dt
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import IntEnum
from typing import Any, Final, TypeAlias

from pamqp import base, commands
from pamqp import frame as _pamqp_frame

from vibemq_server.protocol.held import Buffer, HeldInput, prefix

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
HEARTBEAT: Final = b"\x08\x00\x00\x00\x00\x00\x00\xce"
#: The smallest frame-max a peer may negotiate (spec: FRAME-MIN-SIZE).
FRAME_MIN_SIZE: Final = 4096
#: Raw properties of a message without any: one flags word, all clear.
EMPTY_PROPERTIES: Final = b"\x00\x00"

FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE

_FRAME_END_BYTE = b"\xce"
_BASIC_CLASS = 60
_HEADER_PAYLOAD_MIN = 12  # class-id, weight, body-size; RabbitMQ accepts an empty flags field
_MAX_NESTING = 64  # tables/arrays within tables; deeper is an attack, not a message

_HEADER = struct.Struct(">BHI")  # frame type, channel, payload size
_U32 = struct.Struct(">I")
_CONTENT_HEADER = struct.Struct(">HHQ")  # class-id, weight, body-size
_ACK_ARGS = struct.Struct(">QB")  # delivery-tag, bits
# Frame-end of the previous frame + the next frame's header (+ content-header fields): packing
# them together saves one struct call and one join element per frame.
_END_HEADER_FRAME = struct.Struct(">BBHIHHQ")
_END_BODY_FRAME = struct.Struct(">BBHI")
_DELIVER_HEAD = struct.Struct(">BHIIB")  # type, channel, size, class+method, consumer-tag len
_DELIVER_MID = struct.Struct(">QBB")  # delivery-tag, redelivered, exchange len
_GET_OK_HEAD = struct.Struct(">BHIIQBB")  # ..., class+method, tag, redelivered, exchange len
_RETURN_HEAD = struct.Struct(">BHIIHB")  # ..., class+method, reply-code, reply-text len
_ACK_FRAME = struct.Struct(">BHIIQBB")  # whole basic.ack / basic.nack frame
_SHORT_LEN = tuple(bytes((n,)) for n in range(256))  # length prefix of a shortstr

_IDX_PUBLISH = 0x003C0028
_PUBLISH_ID = _U32.pack(_IDX_PUBLISH)
_IDX_DELIVER = 0x003C003C
_IDX_GET = 0x003C0046
_IDX_GET_OK = 0x003C0047
_IDX_RETURN = 0x003C0032
_IDX_ACK = 0x003C0050
_IDX_REJECT = 0x003C005A
_IDX_NACK = 0x003C0078


class ReplyCode(IntEnum):
    """AMQP 0-9-1 reply codes (connection.close / channel.close / basic.return)."""

    SUCCESS = 200
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541


# The spec's "hard errors": they close the connection; every other code closes a channel.
_CONNECTION_CODES: Final = frozenset(
    (
        ReplyCode.CONNECTION_FORCED,
        ReplyCode.INVALID_PATH,
        ReplyCode.FRAME_ERROR,
        ReplyCode.SYNTAX_ERROR,
        ReplyCode.COMMAND_INVALID,
        ReplyCode.CHANNEL_ERROR,
        ReplyCode.UNEXPECTED_FRAME,
        ReplyCode.RESOURCE_ERROR,
        ReplyCode.NOT_ALLOWED,
        ReplyCode.NOT_IMPLEMENTED,
        ReplyCode.INTERNAL_ERROR,
    )
)


# --------------------------------------------------------------------------------------------
# Events


@dataclass(slots=True)
class ProtocolHeader:
    """The first 8 bytes of the stream. ``ok`` is False for anything but :data:`PROTOCOL_HEADER`
    (the adapter then answers with our header and closes, as the spec asks)."""

    ok: bool
    raw: bytes


@dataclass(slots=True)
class MethodFrame:
    """A method: a pamqp command object (``commands.Basic.Publish`` ...)."""

    channel: int
    method: base.Frame


@dataclass(slots=True)
class HeaderFrame:
    """A content header of class basic. ``properties`` is the raw property flags + list,
    passed through to consumers unparsed (:func:`decode_properties` reads it)."""

    channel: int
    body_size: int
    properties: bytes


@dataclass(slots=True)
class BodyFrame:
    """A slice of a message body: a view of the read when large (the body's chunks are
    copied once, when they are joined into the message). A large body frame cut over reads
    comes as several, one per read (views of each: ``FrameParser._cut_body``); only the
    concatenation of a channel's body frames means anything."""

    channel: int
    data: bytes | memoryview


@dataclass(slots=True)
class Heartbeat:
    """A heartbeat frame (always on channel 0: anything else is refused)."""

    channel: int


@dataclass(slots=True, frozen=True)
class PublishHead:
    """What a basic.publish and its content header say, but the body: shared by every
    :class:`PublishTriple` read with the same bytes for them."""

    channel: int
    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool
    ticket: int
    properties: bytes


@dataclass(slots=True)
class PublishTriple:
    """basic.publish, its content header and its one body frame, read together on one
    channel: what almost every published message is. Only a parser made with
    ``fuse_publish=True`` yields it (else, and whenever the three are not whole and well
    formed in one read, they come as the three frames), so that the session handles a
    message in one step. :meth:`frames` gives the three frames it stands for."""

    channel: int
    head: PublishHead
    body: bytes

    def frames(self) -> tuple[MethodFrame, HeaderFrame, BodyFrame]:
        head = self.head
        method = _new(_Publish)
        method.ticket = head.ticket
        method.exchange = head.exchange
        method.routing_key = head.routing_key
        method.mandatory = head.mandatory
        method.immediate = head.immediate
        channel = self.channel
        return (
            MethodFrame(channel, method),
            HeaderFrame(channel, len(self.body), head.properties),
            BodyFrame(channel, self.body),
        )


Frame: TypeAlias = (
    ProtocolHeader | MethodFrame | HeaderFrame | BodyFrame | Heartbeat | PublishTriple
)


class AmqpError(Exception):
    """The one protocol error.

    ``text`` is the reply text to send, RabbitMQ style (``"FRAME_ERROR - <detail>"`` for the
    errors raised here). ``code`` says what to put in the close method; ``fatal`` says which
    one: True for the connection-level codes (320, 402, 501..506, 530, 540, 541) ->
    connection.close, else channel.close on ``channel``. ``channel`` is the channel the
    offending frame arrived on (0 for connection-level frames); ``class_id`` / ``method_id``
    identify the offending method (0 if none), for the close method's fields. ``frames``
    holds the frames the same :meth:`FrameParser.feed` call decoded before the bad one, so
    the adapter can still act on them.
    """

    def __init__(
        self,
        code: ReplyCode,
        text: str,
        channel: int = 0,
        class_id: int = 0,
        method_id: int = 0,
        frames: tuple[Frame, ...] = (),
    ) -> None:
        super().__init__(f"{int(code)} {text}")
        self.code = code
        self.text = text
        self.channel = channel
        self.class_id = class_id
        self.method_id = method_id
        self.frames = frames

    @property
    def fatal(self) -> bool:
        """True when the error closes the whole connection rather than one channel."""
        return self.code in _CONNECTION_CODES


def _error(
    code: ReplyCode, detail: str, channel: int = 0, class_id: int = 0, method_id: int = 0
) -> AmqpError:
    """An error whose text is RabbitMQ-style reply text: ``"FRAME_ERROR - <detail>"``."""
    return AmqpError(code, f"{code.name} - {detail}", channel, class_id, method_id)


def _frame_error(detail: str, channel: int = 0) -> AmqpError:
    return _error(ReplyCode.FRAME_ERROR, detail, channel)


def _too_large(size: int, max_size: int, channel: int) -> AmqpError:
    return _frame_error(f"frame payload of {size} bytes exceeds frame-max {max_size}", channel)


def _bad_end(byte: int, channel: int) -> AmqpError:
    return _frame_error(f"invalid frame end marker 0x{byte:02x}", channel)


def _syntax_error(detail: str) -> AmqpError:
    return _error(ReplyCode.SYNTAX_ERROR, detail)


# --------------------------------------------------------------------------------------------
# Method decoding: hand-written hot methods, pamqp for the rest

_new = object.__new__
_Publish = commands.Basic.Publish
_Ack = commands.Basic.Ack
_Nack = commands.Basic.Nack
_Reject = commands.Basic.Reject
_Get = commands.Basic.Get


class _Malformed(Exception):
    """Internal: the arguments of a fast-path method do not decode."""


def _decode_publish(view: bytes, pos: int, stop: int) -> base.Frame:
    # ticket (short), exchange (shortstr), routing-key (shortstr), mandatory|immediate bits;
    # every offset is checked against ``stop``: ``view`` may hold further frames after it.
    ex = pos + 2
    if ex >= stop:
        raise _Malformed
    rk = ex + 1 + view[ex]
    if rk >= stop:
        raise _Malformed
    bits = rk + 1 + view[rk]
    if bits + 1 != stop:  # exactly one bits octet and nothing after it, as RabbitMQ demands
        raise _Malformed
    method = _new(_Publish)
    method.ticket = (view[pos] << 8) | view[pos + 1]
    method.exchange = view[ex + 1 : rk].decode()  # UnicodeDecodeError: caught by the caller
    method.routing_key = view[rk + 1 : bits].decode()
    flags = view[bits]
    method.mandatory = flags & 1 != 0  # bits pack from the least significant one
    method.immediate = flags & 2 != 0
    return method


def _decode_ack(view: bytes, pos: int, stop: int) -> base.Frame:
    if stop - pos != _ACK_ARGS.size:
        raise _Malformed
    tag, flags = _ACK_ARGS.unpack_from(view, pos)
    method = _new(_Ack)
    method.delivery_tag = tag
    method.multiple = flags & 1 != 0
    return method


def _decode_nack(view: bytes, pos: int, stop: int) -> base.Frame:
    if stop - pos != _ACK_ARGS.size:
        raise _Malformed
    tag, flags = _ACK_ARGS.unpack_from(view, pos)
    method = _new(_Nack)
    method.delivery_tag = tag
    method.multiple = flags & 1 != 0
    method.requeue = flags & 2 != 0
    return method


def _decode_reject(view: bytes, pos: int, stop: int) -> base.Frame:
    if stop - pos != _ACK_ARGS.size:
        raise _Malformed
    tag, flags = _ACK_ARGS.unpack_from(view, pos)
    method = _new(_Reject)
    method.delivery_tag = tag
    method.requeue = flags & 1 != 0
    return method


def _decode_get(view: bytes, pos: int, stop: int) -> base.Frame:
    # ticket (short), queue (shortstr), no-ack bit: a polling consumer's every request
    queue = pos + 2
    if queue >= stop:
        raise _Malformed
    bits = queue + 1 + view[queue]
    if bits + 1 != stop:
        raise _Malformed
    method = _new(_Get)
    method.ticket = (view[pos] << 8) | view[pos + 1]
    method.queue = view[queue + 1 : bits].decode()
    method.no_ack = view[bits] & 1 != 0
    return method


_FAST_METHODS: Final[dict[int, Callable[[bytes, int, int], base.Frame]]] = {
    _IDX_PUBLISH: _decode_publish,
    _IDX_GET: _decode_get,
    _IDX_ACK: _decode_ack,
    _IDX_NACK: _decode_nack,
    _IDX_REJECT: _decode_reject,
}


def _decode_method(channel: int, view: bytes, start: int, stop: int) -> MethodFrame:
    if stop - start < 4:
        raise _frame_error("method frame too short for class and method ids", channel)
    index = _U32.unpack_from(view, start)[0]
    fast = _FAST_METHODS.get(index)
    try:
        if fast is not None:
            return MethodFrame(channel, fast(view, start + 4, stop))
        layout = _METHOD_LAYOUTS.get(index)
        if layout is None:
            raise _error(
                ReplyCode.NOT_IMPLEMENTED,
                f"unknown method {index >> 16}.{index & 0xFFFF}",
                channel,
                index >> 16,
                index & 0xFFFF,
            )
        return MethodFrame(channel, _decode_cold(layout, view, start + 4, stop))
    except AmqpError as exc:
        if exc.code is ReplyCode.NOT_IMPLEMENTED:
            raise
        cause: Exception = exc
    except (_Malformed, UnicodeDecodeError) as bad:  # (its own name: mypyc types ``exc`` once)
        cause = bad
    raise _error(
        ReplyCode.SYNTAX_ERROR,
        f"cannot decode arguments of method {index >> 16}.{index & 0xFFFF}",
        channel,
        index >> 16,
        index & 0xFFFF,
    ) from cause


def _decode_cold(layout: _Layout, view: bytes, pos: int, stop: int) -> base.Frame:
    """Any other method, by the argument layout of its pamqp class.

    Not pamqp's own unmarshal: that slices the rest of the payload for every table entry
    (quadratic: a 128 KiB table argument costs a quarter to a whole second of CPU), recurses
    without bound, and silently truncates strings that run past the frame.
    """
    method_class, fields = layout
    method = _new(method_class)  # __init__ would validate and, for recover-async, warn
    bit_octet = 0
    bit = 8  # next bit of bit_octet to read; 8: the next bit field starts a new octet
    for name, kind in fields:
        if kind == "bit":
            if bit == 8:
                if pos >= stop:
                    raise _Malformed
                bit_octet = view[pos]
                pos += 1
                bit = 0
            setattr(method, name, bit_octet >> bit & 1 != 0)
            bit += 1
            continue
        bit = 8  # consecutive bits share octets (least significant first); others end them
        value, pos = _ARGUMENT_DECODERS[kind](view, pos, stop, 0)
        setattr(method, name, value)
    if pos != stop:  # RabbitMQ's decoders match the payload exactly, too
        raise _Malformed
    return method


def _decode_header(channel: int, view: bytes, start: int, stop: int) -> HeaderFrame:
    size = stop - start
    if size < _HEADER_PAYLOAD_MIN:
        raise _frame_error("content header frame too short", channel)
    class_id, weight, body_size = _CONTENT_HEADER.unpack_from(view, start)
    if class_id != _BASIC_CLASS or weight:
        raise _error(
            ReplyCode.UNEXPECTED_FRAME,
            f"expected content header for class 60, weight 0; got {class_id}, {weight}",
            channel,
        )
    if size == _HEADER_PAYLOAD_MIN:  # no flags word at all: same as "no properties"
        return HeaderFrame(channel, body_size, EMPTY_PROPERTIES)
    if size == _HEADER_PAYLOAD_MIN + 1:
        raise _frame_error("content header property flags truncated", channel)
    return HeaderFrame(channel, body_size, view[start + _HEADER_PAYLOAD_MIN : stop])


def _fuse_publish(
    view: bytes, start: int, stop: int, channel: int, end: int, max_size: int
) -> tuple[PublishHead, int, int] | None:
    """The basic.publish whose arguments are ``view[start:stop]`` (``stop``: its frame-end,
    checked here) with the content header and body frame after it: (its head, where its body
    starts, where the body frame ends); None unless all three follow whole and well formed on
    the same channel with the body in one frame (the frames then take the general path,
    which finds any error in them)."""
    if end - stop < 30:  # frame-end, header frame of at least 22 bytes, body frame of 9
        return None
    mend, kind, on, size, class_id, weight, body_size = _END_HEADER_FRAME.unpack_from(view, stop)
    hstop = stop + 8 + size  # the header's frame-end
    bstop = hstop + 8 + body_size  # the body's
    if (
        mend != FRAME_END  # (the method frame's own: the general path names the fault)
        or kind != FRAME_HEADER
        or on != channel
        or size < _HEADER_PAYLOAD_MIN + 2
        or size > max_size
        or class_id != _BASIC_CLASS
        or weight
        or not body_size
        or body_size > max_size
        or bstop >= end
    ):
        return None
    hend, kind, on, size = _END_BODY_FRAME.unpack_from(view, hstop)
    if (
        hend != FRAME_END
        or kind != FRAME_BODY
        or on != channel
        or size != body_size
        or view[bstop] != FRAME_END
    ):
        return None
    # The arguments, as _decode_publish reads them.
    ex = start + 2
    if ex >= stop:
        return None
    rk = ex + 1 + view[ex]
    if rk >= stop:
        return None
    bits = rk + 1 + view[rk]
    if bits + 1 != stop:
        return None
    try:
        exchange = view[ex + 1 : rk].decode() if rk > ex + 1 else ""
        routing_key = view[rk + 1 : bits].decode()
    except UnicodeDecodeError:
        return None
    flags = view[bits]
    head = PublishHead(
        channel,
        exchange,
        routing_key,
        flags & 1 != 0,
        flags & 2 != 0,
        (view[start] << 8) | view[start + 1],
        view[stop + 20 : hstop],
    )
    return head, hstop + 8, bstop


def _decode_body(channel: int, view: bytes, start: int, stop: int) -> BodyFrame:
    if stop - start >= _VIEW_BODY:
        return BodyFrame(channel, memoryview(view)[start:stop])
    return BodyFrame(channel, view[start:stop])


#: A body frame at least this long is a view of the read, not a copy (smaller ones are
#: cheaper to copy than to view).
_VIEW_BODY = 4096
#: A body frame at least this long that is cut over reads comes as one BodyFrame per read,
#: views of them (smaller ones are joined: cheaper than the views, and one event each).
_CUT_BODY = 16384


def _ranges(parts: list[Buffer], start: int, stop: int) -> list[memoryview]:
    """Views of bytes ``start:stop`` of ``parts``, one per part they touch (none empty)."""
    views: list[memoryview] = []
    at = 0
    for part in parts:
        end = at + len(part)
        if end > start and at < stop:
            views.append(memoryview(part)[max(start - at, 0) : min(stop, end) - at])
        at = end
    return views


def _decode_heartbeat(channel: int, view: bytes, start: int, stop: int) -> Heartbeat:
    if stop != start:
        raise _frame_error("heartbeat frame with a payload", channel)
    if channel:
        raise _frame_error(f"heartbeat frame on channel {channel}", channel)
    return Heartbeat(0)


_FRAME_DECODERS: Final[dict[int, Callable[[int, bytes, int, int], Frame]]] = {
    FRAME_METHOD: _decode_method,
    FRAME_HEADER: _decode_header,
    FRAME_BODY: _decode_body,
    FRAME_HEARTBEAT: _decode_heartbeat,
}


def _whole_frame(
    decode: Callable[[int, bytes, int, int], Frame], channel: int, view: bytes, pos: int, stop: int
) -> Frame:
    """The frame at ``view[pos:stop + 1]``, all of it in (its size already checked against
    frame-max by the caller), ``decode`` its type's decoder: its frame-end checked, then
    decoded (the read loop's frames and a frame cut over reads,
    :meth:`FrameParser._decode_cut`, alike)."""
    if view[stop] != FRAME_END:
        raise _bad_end(view[stop], channel)
    if view[pos] == FRAME_BODY:
        # (the frame a publish cut over reads ends with: called directly, a native call in
        # the compiled build, where the table's is a generic call with boxed arguments)
        return _decode_body(channel, view, pos + 7, stop)
    return decode(channel, view, pos + 7, stop)


_NO_HEAD = PublishHead(0, "", "", False, False, 0, b"")

# Parser states. Only _FRAMES is on the fast path of feed().
_FRAMES = 0
_AWAIT_HEADER = 1
_REFUSED = 2  # bad protocol header: everything after it is ignored
_FAILED = 3  # an AmqpError was raised: every later feed raises it again


class FrameParser:
    """Incremental AMQP 0-9-1 decoder: ``feed(data)`` returns the frames completed by ``data``.

    ``max_frame_size`` bounds a frame's *payload* (the negotiated frame-max; like RabbitMQ's
    FRAME_SIZE_FUDGE this leaves room for the clients that forget the 8 framing bytes); the
    adapter lowers it after connection.tune-ok. A frame over it is refused as soon as its
    7-byte header is in, before any payload is buffered.

    After an :class:`AmqpError` the parser is spent: every later ``feed`` raises the same
    error again (with empty ``frames``). After a bad protocol header (``ok`` False) every later
    byte is ignored and ``feed`` returns ``[]``.
    """

    __slots__ = (
        "_failure",
        "_header",
        "_held",
        "_last",
        "_need",
        "_state",
        "fuse_publish",
        "max_frame_size",
    )

    def __init__(self, max_frame_size: int = 131072, *, fuse_publish: bool = False) -> None:
        self.max_frame_size = max_frame_size
        #: yield a :class:`PublishTriple` for a basic.publish read whole with its content
        self.fuse_publish = fuse_publish
        # The last fused publish: the bytes from its method frame to its body (its method
        # and header frames and the body frame's header), its head and the frame-max they
        # were checked against. A publish that starts with the same bytes is the same but
        # for the body: its head is reused without parsing (a stream of publishes to one
        # queue with one set of properties and one body size is the common case).
        self._last: tuple[bytes, PublishHead, int, int] = (b"", _NO_HEAD, 0, 0)
        self._header = bytearray()  # the protocol header, while it is cut
        self._held = HeldInput()  # the frames' bytes held over between reads
        self._need = 7  # bytes needed (in _FRAMES) before parsing can make progress
        self._state = _AWAIT_HEADER
        self._failure: AmqpError | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Append ``data``; return every frame it completes, in order.

        Raises :class:`AmqpError` (with ``frames`` set to those decoded before the bad one).
        """
        if self._state != _FRAMES:
            return self._feed_other(data)
        held = self._held
        frames: list[Frame] = []
        pos = 0
        if held.size:
            # A frame cut over reads: its chunks are joined once, when all of it is in; a
            # large body frame's are not joined at all (_cut_body).
            if not held.add_part(data):
                return []
            need = held.need
            try:
                if need >= _CUT_BODY and held.first_byte() == FRAME_BODY:
                    view, pos = self._cut_body(frames)
                elif need > 7:
                    # The frame's header was in: the frame joined alone, the rest of the read
                    # parsed in place (joining the whole read copied all of it once more).
                    frame, view, pos = held.take_frame()
                    if (
                        self.fuse_publish
                        and frame[0] == FRAME_METHOD
                        and frame[7:11] == _PUBLISH_ID
                    ):
                        # a basic.publish is fused with its content: its frames in one piece
                        view = b"".join((frame, memoryview(view)[pos:]))
                        pos = 0
                    else:
                        self._decode_cut(frame, frames)
                else:
                    view = held.take()  # the header itself was cut
            except AmqpError as exc:
                self._failure = exc
                self._state = _FAILED
                raise
        else:
            # The common case: nothing pending, parse straight out of the caller's bytes.
            view = data if type(data) is bytes else bytes(data)
        end = len(view)
        # The frame loop is inlined here (not a helper) because it runs for every read.
        max_size = self.max_frame_size
        unpack_header = _HEADER.unpack_from
        decoders = _FRAME_DECODERS
        append = frames.append
        fuse = self.fuse_publish
        last_prefix, last_head, checked_max, body_size = self._last
        skip = len(last_prefix) if checked_max == max_size else 0  # 0: nothing to reuse
        try:
            while True:
                if skip and view.startswith(last_prefix, pos):
                    # The same method and content header as the last fused publish, and a
                    # body of the same size: only the body's frame-end is left to check.
                    stop = pos + skip + body_size
                    if stop < end and view[stop] == FRAME_END:
                        append(PublishTriple(last_head.channel, last_head, view[pos + skip : stop]))
                        pos = stop + 1
                        continue
                if end - pos < 7:
                    self._need = 7
                    break
                frame_type, channel, size = unpack_header(view, pos)
                if size > max_size:
                    raise _too_large(size, max_size, channel)
                decode = decoders.get(frame_type)
                if decode is None:
                    raise _frame_error(f"unknown frame type {frame_type}", channel)
                stop = pos + 7 + size
                if stop >= end:  # payload or frame-end still missing
                    self._need = size + 8
                    break
                if fuse and frame_type == FRAME_METHOD and view[pos + 7 : pos + 11] == _PUBLISH_ID:
                    fused = _fuse_publish(view, pos + 11, stop, channel, end, max_size)
                    if fused is not None:
                        last_head, body_at, stop = fused
                        append(PublishTriple(channel, last_head, view[body_at:stop]))
                        last_prefix = view[pos:body_at]
                        skip = body_at - pos
                        body_size = stop - body_at
                        self._last = (last_prefix, last_head, max_size, body_size)
                        pos = stop + 1
                        continue
                append(_whole_frame(decode, channel, view, pos, stop))
                pos = stop + 1
        except AmqpError as exc:
            exc.frames = tuple(frames)
            self._failure = exc
            self._state = _FAILED
            raise
        if pos < end:
            held.hold(view, pos, self._need)
        return frames

    def _cut_body(self, frames: list[Frame]) -> tuple[bytes, int]:
        """The held body frame, now whole, as one :class:`BodyFrame` per read it came in
        (views: the body's one copy is its join in the session, which would otherwise be its
        second after the join of the frame); the last read and where the bytes after the
        frame start in it. Its size is checked again (frame-max may have been lowered since
        it was held), then its frame-end."""
        parts, last, keep = self._held.cut()
        _kind, channel, size = _HEADER.unpack(prefix(parts, 7))
        if size > self.max_frame_size:  # (lowered by tune-ok since the frame was held)
            raise _too_large(size, self.max_frame_size, channel)
        tail = parts[-1]  # (the frame's last read gave it one byte at least)
        if tail[len(tail) - 1] != FRAME_END:
            raise _bad_end(tail[len(tail) - 1], channel)
        for piece in _ranges(parts, 7, 7 + size):
            frames.append(BodyFrame(channel, piece))
        return last, keep

    def _decode_cut(self, frame: bytes, frames: list[Frame]) -> None:
        """Decode a frame that was cut over reads, now whole (``frame``: all of it). Its size
        is checked again, as in :meth:`_cut_body` (its type was, before it was held)."""
        size = len(frame) - 8
        channel = frame[1] << 8 | frame[2]
        if size > self.max_frame_size:
            raise _too_large(size, self.max_frame_size, channel)
        frames.append(_whole_frame(_FRAME_DECODERS[frame[0]], channel, frame, 0, size + 7))

    def _feed_other(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """feed() outside the frame phase: the protocol header, or a spent parser."""
        if self._failure is not None:
            failure = self._failure
            raise AmqpError(
                failure.code, failure.text, failure.channel, failure.class_id, failure.method_id
            )
        if self._state == _REFUSED:
            return []
        buf = self._header
        buf += data
        if len(buf) < len(PROTOCOL_HEADER):
            return []
        raw = bytes(buf[:8])
        rest = bytes(buf[8:])
        buf.clear()
        header = ProtocolHeader(raw == PROTOCOL_HEADER, raw)
        if not header.ok:
            self._state = _REFUSED
            return [header]
        self._state = _FRAMES
        try:
            frames = self.feed(rest)
        except AmqpError as exc:
            exc.frames = (header, *exc.frames)
            raise
        frames.insert(0, header)
        return frames


# --------------------------------------------------------------------------------------------
# Encoding


def encode_method(channel: int, method: base.Frame) -> bytes:
    """A method frame, by pamqp (validates the arguments: ``ValueError``)."""
    return _pamqp_frame.marshal(method, channel)


def _append_content(
    parts: list[bytes | memoryview], channel: int, properties: bytes, body: bytes, frame_max: int
) -> None:
    """Append the content header and body frames; ``parts`` ends with the method's payload
    (whose frame-end this supplies)."""
    size = len(body)
    parts.append(
        _END_HEADER_FRAME.pack(
            FRAME_END, FRAME_HEADER, channel, 12 + len(properties), _BASIC_CLASS, 0, size
        )
    )
    parts.append(properties)
    if not size:  # no body frame for an empty body
        parts.append(_FRAME_END_BYTE)
        return
    chunk = frame_max - 8
    if size <= chunk:
        parts.append(_END_BODY_FRAME.pack(FRAME_END, FRAME_BODY, channel, size))
        parts.append(body)
        parts.append(_FRAME_END_BYTE)
        return
    if frame_max < FRAME_MIN_SIZE:
        raise ValueError(f"frame_max {frame_max} is below the minimum {FRAME_MIN_SIZE}")
    view = memoryview(body)
    for offset in range(0, size, chunk):
        piece = view[offset : offset + chunk]
        parts.append(_END_BODY_FRAME.pack(FRAME_END, FRAME_BODY, channel, len(piece)))
        parts.append(piece)
    parts.append(_FRAME_END_BYTE)


def encode_content(
    channel: int, method_frame: bytes, properties: bytes, body: bytes, frame_max: int
) -> bytes:
    """``method_frame`` (already encoded) + content header (class 60, weight 0, raw
    ``properties``) + body frames of at most ``frame_max - 8`` bytes each (none if empty)."""
    if method_frame[-1:] != _FRAME_END_BYTE:
        raise ValueError("method_frame is not an encoded frame (no frame-end)")
    # Its frame-end is re-added by _append_content, packed with the header frame's start.
    parts: list[bytes | memoryview] = [memoryview(method_frame)[:-1]]
    _append_content(parts, channel, properties, body, frame_max)
    return b"".join(parts)


def encode_deliver(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange: bytes,
    routing_key: bytes,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.deliver + content header + body frames, in one buffer."""
    try:
        parts: list[bytes | memoryview] = [
            _DELIVER_HEAD.pack(
                FRAME_METHOD,
                channel,
                16 + len(consumer_tag) + len(exchange) + len(routing_key),
                _IDX_DELIVER,
                len(consumer_tag),
            ),
            consumer_tag,
            _DELIVER_MID.pack(delivery_tag, redelivered, len(exchange)),
            exchange,
            _SHORT_LEN[len(routing_key)],
            routing_key,
        ]
    except (struct.error, IndexError) as exc:
        raise ValueError(f"basic.deliver argument out of range: {exc}") from exc
    _append_content(parts, channel, properties, body, frame_max)
    return b"".join(parts)


_DELIVER_TAG = struct.Struct(">QB")  # delivery-tag, redelivered
_CACHE_MAX = 256


class _ContentEncoder:
    """What :class:`DeliverEncoder` and :class:`GetOkEncoder` share: a method frame with a
    message's content, from cached pieces. The method's bytes before its delivery tag and
    after it per (exchange, routing key) (``_method_pieces``, per method), and the content
    header with the body frame's header per (properties, body size); the last of each is
    checked by identity first (a consumer's messages mostly come with the very same
    exchange, key and properties objects: the mapper's caches). A message costs one pack of
    its tag and one join. A body over one frame is not joined at all: :meth:`_parts` gives
    the frame headers and views of the body for ``Link.send_parts``."""

    __slots__ = (
        "_content",
        "_contents",
        "_method",
        "_methods",
        "_origin",
        "_shape",
        "channel",
        "frame_max",
    )

    #: the method, for the errors (basic.deliver, basic.get-ok)
    what = ""

    def __init__(self, channel: int, frame_max: int) -> None:
        self.channel = channel
        self.frame_max = frame_max
        #: (exchange, routing key) -> (method frame up to the tag, after the tag)
        self._methods: dict[tuple[str, str], tuple[bytes, bytes]] = {}
        #: (properties, body size) -> method frame-end, header frame, body frame header
        self._contents: dict[tuple[bytes, int], bytes] = {}
        self._origin: tuple[str, str] = ("", "")
        self._method = self._new_method("", "")
        self._shape: tuple[bytes, int] = (b"", -1)
        self._content = b""

    def _method_pieces(self, ex: bytes, rk: bytes) -> tuple[bytes, bytes]:
        """The method frame's bytes before the delivery tag and after it (up to the
        method-specific fields the caller appends)."""
        raise NotImplementedError

    def _pieces(
        self, exchange: str, routing_key: str, properties: bytes, size: int
    ) -> tuple[tuple[bytes, bytes], bytes]:
        origin = self._origin
        if exchange is origin[0] and routing_key is origin[1]:
            method = self._method
        else:
            method = self._methods.get((exchange, routing_key)) or self._new_method(
                exchange, routing_key
            )
            self._origin, self._method = (exchange, routing_key), method
        shape = self._shape
        if properties is shape[0] and size == shape[1]:
            return method, self._content
        content = self._contents.get((properties, size))
        if content is None:
            content = self._content_pieces(properties, size)
        self._shape, self._content = (properties, size), content
        return method, content

    def _new_method(self, exchange: str, routing_key: str) -> tuple[bytes, bytes]:
        try:
            pieces = self._method_pieces(exchange.encode(), routing_key.encode())
        except (struct.error, IndexError) as exc:
            raise ValueError(f"{self.what} argument out of range: {exc}") from exc
        if len(self._methods) >= _CACHE_MAX:
            self._methods.clear()
        self._methods[(exchange, routing_key)] = pieces
        return pieces

    def _content_pieces(self, properties: bytes, size: int) -> bytes:
        chunk = self.frame_max - 8
        parts: list[bytes | memoryview] = []
        # (a body over one frame: only its first frame's header is kept, see _parts)
        _append_content(parts, self.channel, properties, b"\x00" * min(size, chunk), chunk + 8)
        # Without the body and its frame-end (or, for an empty body, the header's): the
        # encoder adds them.
        content = b"".join(parts[:-2] if size else parts[:-1])
        if size > chunk:  # the header frame announces the whole body
            content = _with_body_size(content, size)
        if len(self._contents) >= _CACHE_MAX:
            self._contents.clear()
        self._contents[(properties, size)] = content
        return content

    def _frames(self, method_bytes: bytes, content: bytes, body: bytes) -> bytes:
        return b"".join((method_bytes, content, body, _FRAME_END_BYTE))

    def _parts(self, method_bytes: bytes, content: bytes, body: bytes) -> list[bytes | memoryview]:
        """The frames of a large body: the method and header frames and the first body
        frame's header, then the body (in one frame) or views of it between the other
        frames' headers."""
        chunk = self.frame_max - 8
        if len(body) <= chunk:
            return [method_bytes + content, body, _FRAME_END_BYTE]
        view = memoryview(body)
        parts: list[bytes | memoryview] = [method_bytes + content, view[:chunk]]
        pack = _END_BODY_FRAME.pack
        channel = self.channel
        for offset in range(chunk, len(body), chunk):
            piece = view[offset : offset + chunk]
            parts.append(pack(FRAME_END, FRAME_BODY, channel, len(piece)))
            parts.append(piece)
        parts.append(_FRAME_END_BYTE)
        return parts


def _with_body_size(content: bytes, size: int) -> bytes:
    """``content`` (method frame-end, header frame, first body frame's header) with the
    body size of the header frame set to ``size``: the header frame's body-size field sits
    after the frame-end (1), frame header (7), class and weight (4)."""
    return content[:12] + size.to_bytes(8, "big") + content[20:]


class DeliverEncoder(_ContentEncoder):
    """basic.deliver + content header + body for one consumer (channel and consumer tag
    fixed), from cached pieces (:class:`_ContentEncoder`). The bytes are those of
    :func:`encode_deliver`."""

    __slots__ = ("consumer_tag",)

    what = "basic.deliver"

    def __init__(self, channel: int, consumer_tag: bytes, frame_max: int) -> None:
        self.consumer_tag = consumer_tag  # (before the base's __init__ builds a method)
        super().__init__(channel, frame_max)

    def _method_pieces(self, ex: bytes, rk: bytes) -> tuple[bytes, bytes]:
        tag = self.consumer_tag
        size = 16 + len(tag) + len(ex) + len(rk)
        head = _DELIVER_HEAD.pack(FRAME_METHOD, self.channel, size, _IDX_DELIVER, len(tag))
        return head + tag, _SHORT_LEN[len(ex)] + ex + _SHORT_LEN[len(rk)] + rk

    def encode(
        self,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        properties: bytes,
        body: bytes,
    ) -> bytes:
        """The frames in one buffer (a body over one frame is joined too: see parts)."""
        size = len(body)
        # (the usual case inline: the same origin and shape objects as the last delivery)
        origin, shape = self._origin, self._shape
        if (
            exchange is origin[0]
            and routing_key is origin[1]
            and properties is shape[0]
            and size == shape[1]
        ):
            method, content = self._method, self._content
        else:
            method, content = self._pieces(exchange, routing_key, properties, size)
        try:
            tag = _DELIVER_TAG.pack(delivery_tag, redelivered)
        except struct.error as exc:
            raise ValueError(f"basic.deliver argument out of range: {exc}") from exc
        if size > self.frame_max - 8:
            return b"".join(self._parts(method[0] + tag + method[1], content, body))
        return b"".join((method[0], tag, method[1], content, body, _FRAME_END_BYTE))

    def parts(
        self,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        properties: bytes,
        body: bytes,
    ) -> list[bytes | memoryview]:
        """The frames around the body by reference, for ``Link.send_parts`` (the body is
        not copied: for a large one, one frame or more)."""
        method, content = self._pieces(exchange, routing_key, properties, len(body))
        tag = self._tag(delivery_tag, redelivered)
        return self._parts(method[0] + tag + method[1], content, body)

    @staticmethod
    def _tag(delivery_tag: int, redelivered: bool) -> bytes:
        try:
            return _DELIVER_TAG.pack(delivery_tag, redelivered)
        except struct.error as exc:
            raise ValueError(f"basic.deliver argument out of range: {exc}") from exc


class GetOkEncoder(_ContentEncoder):
    """basic.get-ok + content header + body for one channel, from cached pieces as
    :class:`DeliverEncoder` builds deliveries. The bytes are those of :func:`encode_get_ok`."""

    __slots__ = ()

    what = "basic.get-ok"

    def _method_pieces(self, ex: bytes, rk: bytes) -> tuple[bytes, bytes]:
        size = 19 + len(ex) + len(rk)
        head = _GET_OK_HEAD.pack(FRAME_METHOD, self.channel, size, _IDX_GET_OK, 0, 0, 0)
        # (the tag and redelivered are packed per message: the head ends before them)
        return head[:11], _SHORT_LEN[len(ex)] + ex + _SHORT_LEN[len(rk)] + rk

    def _method_bytes(
        self, delivery_tag: int, redelivered: bool, message_count: int, method: tuple[bytes, bytes]
    ) -> bytes:
        try:
            tag = _DELIVER_TAG.pack(delivery_tag, redelivered)
            count = _U32.pack(message_count)
        except struct.error as exc:
            raise ValueError(f"basic.get-ok argument out of range: {exc}") from exc
        return b"".join((method[0], tag, method[1], count))

    def encode(
        self,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        message_count: int,
        properties: bytes,
        body: bytes,
    ) -> bytes:
        """The frames in one buffer (a body over one frame is joined too: see parts)."""
        return b"".join(
            self.parts(
                delivery_tag, redelivered, exchange, routing_key, message_count, properties, body
            )
        )

    def parts(
        self,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        message_count: int,
        properties: bytes,
        body: bytes,
    ) -> list[bytes | memoryview]:
        """The frames, for ``Link.send_parts`` (a body over one frame is not copied)."""
        method, content = self._pieces(exchange, routing_key, properties, len(body))
        head = self._method_bytes(delivery_tag, redelivered, message_count, method)
        if len(body) > self.frame_max - 8:
            return self._parts(head, content, body)
        return [head, content, body, _FRAME_END_BYTE]


def encode_get_ok(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: bytes,
    routing_key: bytes,
    message_count: int,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.get-ok + content header + body frames."""
    try:
        parts: list[bytes | memoryview] = [
            _GET_OK_HEAD.pack(
                FRAME_METHOD,
                channel,
                19 + len(exchange) + len(routing_key),
                _IDX_GET_OK,
                delivery_tag,
                redelivered,
                len(exchange),
            ),
            exchange,
            _SHORT_LEN[len(routing_key)],
            routing_key,
            _U32.pack(message_count),
        ]
    except (struct.error, IndexError) as exc:
        raise ValueError(f"basic.get-ok argument out of range: {exc}") from exc
    _append_content(parts, channel, properties, body, frame_max)
    return b"".join(parts)


def encode_return(
    channel: int,
    reply_code: int,
    reply_text: bytes,
    exchange: bytes,
    routing_key: bytes,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.return + content header + body frames (``reply_text`` as bytes, like the
    other shortstrs)."""
    text = reply_text
    try:
        parts: list[bytes | memoryview] = [
            _RETURN_HEAD.pack(
                FRAME_METHOD,
                channel,
                9 + len(text) + len(exchange) + len(routing_key),
                _IDX_RETURN,
                reply_code,
                len(text),
            ),
            text,
            _SHORT_LEN[len(exchange)],
            exchange,
            _SHORT_LEN[len(routing_key)],
            routing_key,
        ]
    except (struct.error, IndexError) as exc:
        raise ValueError(f"basic.return argument out of range: {exc}") from exc
    _append_content(parts, channel, properties, body, frame_max)
    return b"".join(parts)


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """The broker's basic.ack (publisher confirms)."""
    try:
        return _ACK_FRAME.pack(
            FRAME_METHOD, channel, 13, _IDX_ACK, delivery_tag, multiple, FRAME_END
        )
    except struct.error as exc:
        raise ValueError(f"basic.ack argument out of range: {exc}") from exc


def encode_nack(channel: int, delivery_tag: int, multiple: bool, requeue: bool = False) -> bytes:
    """The broker's basic.nack (publisher confirms)."""
    try:
        return _ACK_FRAME.pack(
            FRAME_METHOD,
            channel,
            13,
            _IDX_NACK,
            delivery_tag,
            multiple | (requeue << 1),
            FRAME_END,
        )
    except struct.error as exc:
        raise ValueError(f"basic.nack argument out of range: {exc}") from exc


# --------------------------------------------------------------------------------------------
# Field values: tables, arrays and the typed scalars in them

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_ONE_SECOND = _dt.timedelta(seconds=1)
_MAX_TIMESTAMP = (_dt.datetime.max.replace(tzinfo=_dt.UTC) - _EPOCH) // _ONE_SECOND

_ValueDecoder: TypeAlias = Callable[[bytes, int, int, int], tuple[Any, int]]


def _truncated() -> AmqpError:
    return _syntax_error("field value runs past the end of its table")


def _fixed(fmt: str) -> _ValueDecoder:
    """A decoder of one fixed-width big-endian number."""
    packer = struct.Struct(fmt)
    size = packer.size
    unpack = packer.unpack_from

    def decode(raw: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
        stop = pos + size
        if stop > end:
            raise _truncated()
        return unpack(raw, pos)[0], stop

    return decode


def _decode_bool(raw: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    if pos >= end:
        raise _truncated()
    return raw[pos] != 0, pos + 1


_DECIMAL = struct.Struct(">Bi")


def _decode_decimal(raw: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    if pos + 5 > end:
        raise _truncated()
    scale, mantissa = _DECIMAL.unpack_from(raw, pos)
    # pamqp's (and the spec text's) reading: a signed mantissa. Exact: at most 10 digits.
    return Decimal(mantissa).scaleb(-scale), pos + 5


def _long_bytes(raw: bytes, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 4 > end:
        raise _truncated()
    start = pos + 4
    stop = start + _U32.unpack_from(raw, pos)[0]
    if stop > end:
        raise _truncated()
    return raw[start:stop], stop


def _decode_longstr(raw: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    value, stop = _long_bytes(raw, pos, end)
    try:
        return value.decode(), stop
    except UnicodeDecodeError:
        return value, stop  # a longstr is binary; pamqp keeps the non-UTF-8 ones as bytes


def _decode_byte_array(raw: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    value, stop = _long_bytes(raw, pos, end)
    return bytearray(value), stop


def _timestamp(seconds: int) -> _dt.datetime:
    if seconds <= _MAX_TIMESTAMP:
        return _EPOCH + _dt.timedelta(seconds=seconds)
    # Past year 9999: some clients send milliseconds (pamqp guesses the same way).
    if seconds // 1000 <= _MAX_TIMESTAMP:
        return _EPOCH + _dt.timedelta(milliseconds=seconds)
    raise _syntax_error(f"timestamp {seconds} out of range")


_U64 = struct.Struct(">Q")


def _decode_timestamp(raw: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    if pos + 8 > end:
        raise _truncated()
    return _timestamp(_U64.unpack_from(raw, pos)[0]), pos + 8


def _decode_void(raw: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    return None, pos


def _decode_field_table(raw: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    if depth > _MAX_NESTING:
        raise _syntax_error("field tables nested too deeply")
    if pos + 4 > end:
        raise _truncated()
    stop = pos + 4 + _U32.unpack_from(raw, pos)[0]
    if stop > end:
        raise _truncated()
    pos += 4
    table: dict[str, Any] = {}
    decoders = _FIELD_DECODERS
    while pos < stop:
        key_end = pos + 1 + raw[pos]
        if key_end >= stop:  # the key, and at least the value's type octet
            raise _truncated()
        # Keys are shortstrs: any bytes. surrogateescape keeps non-UTF-8 ones lossless.
        key = raw[pos + 1 : key_end].decode("utf-8", "surrogateescape")
        decode = decoders.get(raw[key_end])
        if decode is None:
            raise _syntax_error(f"unknown field type {raw[key_end]:#04x} in table")
        table[key], pos = decode(raw, key_end + 1, stop, depth + 1)
    return table, stop


def _decode_field_array(raw: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    if depth > _MAX_NESTING:
        raise _syntax_error("field arrays nested too deeply")
    if pos + 4 > end:
        raise _truncated()
    stop = pos + 4 + _U32.unpack_from(raw, pos)[0]
    if stop > end:
        raise _truncated()
    pos += 4
    items: list[Any] = []
    decoders = _FIELD_DECODERS
    while pos < stop:
        decode = decoders.get(raw[pos])
        if decode is None:
            raise _syntax_error(f"unknown field type {raw[pos]:#04x} in array")
        value, pos = decode(raw, pos + 1, stop, depth + 1)
        items.append(value)
    return items, stop


_FIELD_DECODERS: Final[dict[int, _ValueDecoder]] = {
    ord("t"): _decode_bool,
    ord("b"): _fixed(">b"),
    ord("B"): _fixed(">B"),
    ord("s"): _fixed(">h"),  # RabbitMQ / errata: signed short
    ord("U"): _fixed(">h"),  # the 0-9-1 grammar's letter for the same
    ord("u"): _fixed(">H"),
    ord("I"): _fixed(">i"),
    ord("i"): _fixed(">I"),
    ord("l"): _fixed(">q"),  # RabbitMQ decodes both l and L as signed 64-bit
    ord("L"): _fixed(">q"),
    ord("f"): _fixed(">f"),
    ord("d"): _fixed(">d"),
    ord("D"): _decode_decimal,
    ord("S"): _decode_longstr,
    ord("A"): _decode_field_array,
    ord("T"): _decode_timestamp,
    ord("F"): _decode_field_table,
    ord("V"): _decode_void,
    ord("x"): _decode_byte_array,
}


#: RabbitMQ's names for the field types (``rabbit_binary_parser``), as its reply texts show them.
FIELD_TYPE_NAMES: Final[dict[int, str]] = {
    ord("t"): "bool",
    ord("b"): "byte",
    ord("B"): "unsignedbyte",
    ord("s"): "short",
    ord("U"): "short",
    ord("u"): "unsignedshort",
    ord("I"): "signedint",
    ord("i"): "unsignedint",
    ord("l"): "long",
    ord("L"): "long",
    ord("f"): "float",
    ord("d"): "double",
    ord("D"): "decimal",
    ord("S"): "longstr",
    ord("A"): "array",
    ord("T"): "timestamp",
    ord("F"): "table",
    ord("V"): "void",
    ord("x"): "binary",
}


class FieldTable(dict[str, Any]):
    """A method's field-table argument (``arguments``, ``client_properties``) with the wire type
    of each top-level value in ``types`` (RabbitMQ's names): a redeclare's 406 text names the
    type, and the Python value alone cannot tell a ``byte`` 10 from a ``signedint`` 10."""

    __slots__ = ("types",)

    def __init__(self) -> None:
        super().__init__()
        self.types: dict[str, str] = {}


def _decode_argument_table(raw: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    """A method argument's field table (cold methods only), keeping each value's type."""
    if pos + 4 > end:
        raise _truncated()
    stop = pos + 4 + _U32.unpack_from(raw, pos)[0]
    if stop > end:
        raise _truncated()
    pos += 4
    table = FieldTable()
    types = table.types
    decoders = _FIELD_DECODERS
    while pos < stop:
        key_end = pos + 1 + raw[pos]
        if key_end >= stop:
            raise _truncated()
        key = raw[pos + 1 : key_end].decode("utf-8", "surrogateescape")
        tag = raw[key_end]
        decode = decoders.get(tag)
        if decode is None:
            raise _syntax_error(f"unknown field type {tag:#04x} in table")
        table[key], pos = decode(raw, key_end + 1, stop, depth + 1)
        types[key] = FIELD_TYPE_NAMES[tag]
    return table, stop


def _decode_shortstr_arg(raw: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    if pos >= end:
        raise _truncated()
    stop = pos + 1 + raw[pos]
    if stop > end:
        raise _truncated()
    return raw[pos + 1 : stop].decode(), stop  # strict UTF-8, as pamqp decodes names


_ARGUMENT_DECODERS: Final[dict[str, _ValueDecoder]] = {
    "octet": _fixed(">B"),
    "short": _fixed(">H"),
    "long": _fixed(">I"),
    "longlong": _fixed(">Q"),  # unsigned, as the spec says (pamqp reads it signed)
    "shortstr": _decode_shortstr_arg,
    "longstr": _decode_longstr,
    "table": _decode_argument_table,
    "timestamp": _decode_timestamp,
}

_Layout: TypeAlias = tuple[type[base.Frame], tuple[tuple[str, str], ...]]
#: For every method pamqp knows: its class and (attribute, AMQP type) in wire order.
_METHOD_LAYOUTS: Final[dict[int, _Layout]] = {
    index: (cls, tuple((name, cls.amqp_type(name)) for name in cls.attributes()))
    for index, cls in commands.INDEX_MAPPING.items()
    if issubclass(cls, base.Frame)
}


def decode_table(raw: bytes) -> dict[str, Any]:
    """A field table (4-byte length + pairs, exactly ``raw``). Garbage -> AmqpError(502)."""
    table, stop = _decode_field_table(raw, 0, len(raw), 0)
    if stop != len(raw):
        raise _syntax_error("trailing bytes after field table")
    result: dict[str, Any] = table
    return result


# Encoding. Integers use the two types every client reads, I (int32) and l (int64); floats
# are d: pamqp's f would silently lose precision.
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")


def _shortstr(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) > 255:
        raise ValueError(f"shortstr of {len(raw)} bytes (max 255)")
    return _SHORT_LEN[len(raw)] + raw


def _longstr(raw: bytes | bytearray) -> bytes:
    if len(raw) > 0xFFFFFFFF:
        raise ValueError("longstr over 4 GiB")
    return _U32.pack(len(raw)) + raw


def _encode_int(value: int, depth: int) -> bytes:
    if -0x80000000 <= value <= 0x7FFFFFFF:
        return b"I" + _I32.pack(value)
    if -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
        return b"l" + _I64.pack(value)
    raise ValueError(f"integer {value} does not fit a signed 64-bit field")


def _encode_bool(value: bool, depth: int) -> bytes:
    return b"t\x01" if value else b"t\x00"


def _encode_float(value: float, depth: int) -> bytes:
    return b"d" + _F64.pack(value)


def _encode_decimal(value: Decimal, depth: int) -> bytes:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise ValueError(f"cannot encode {value} as a decimal field")
    mantissa = int("".join(map(str, digits)) or "0")
    if exponent > 0:
        if mantissa and exponent > 10:  # would not fit 32 bits; avoid building 10**huge
            raise ValueError(f"decimal {value} out of range")
        mantissa *= 10**exponent
        exponent = 0
    if sign:
        mantissa = -mantissa
    if -exponent > 255 or not -0x80000000 <= mantissa <= 0x7FFFFFFF:
        raise ValueError(f"decimal {value} out of range (scale 0..255, 32-bit mantissa)")
    return b"D" + _DECIMAL.pack(-exponent, mantissa)


def _encode_str(value: str, depth: int) -> bytes:
    return b"S" + _longstr(value.encode("utf-8", "surrogateescape"))


def _encode_bytes(value: bytes, depth: int) -> bytes:
    return b"S" + _longstr(value)


def _encode_byte_array(value: bytearray, depth: int) -> bytes:
    return b"x" + _longstr(value)


def _timestamp_seconds(value: _dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.UTC)  # naive means UTC, as in pamqp
    seconds = (value - _EPOCH) // _ONE_SECOND
    if seconds < 0:
        raise ValueError(f"timestamp {value} is before 1970")
    return seconds


def _encode_datetime(value: _dt.datetime, depth: int) -> bytes:
    return b"T" + _U64.pack(_timestamp_seconds(value))


def _encode_none(value: None, depth: int) -> bytes:
    return b"V"


def _encode_mapping(value: Mapping[str, Any], depth: int) -> bytes:
    return b"F" + _encode_table(value, depth + 1)


def _encode_sequence(value: list[Any] | tuple[Any, ...], depth: int) -> bytes:
    if depth > _MAX_NESTING:
        raise ValueError("field arrays nested too deeply")
    payload = b"".join([_encode_value(item, depth + 1) for item in value])
    return b"A" + _longstr(payload)


_FIELD_ENCODERS: Final[dict[type, Callable[[Any, int], bytes]]] = {
    str: _encode_str,
    int: _encode_int,
    bool: _encode_bool,
    float: _encode_float,
    bytes: _encode_bytes,
    bytearray: _encode_byte_array,
    Decimal: _encode_decimal,
    _dt.datetime: _encode_datetime,
    type(None): _encode_none,
    dict: _encode_mapping,
    list: _encode_sequence,
    tuple: _encode_sequence,
}
# Subclasses (IntEnum, OrderedDict, ...): first match wins, so bool precedes int.
_FIELD_ENCODER_FALLBACK: Final[tuple[tuple[type, Callable[[Any, int], bytes]], ...]] = (
    (bool, _encode_bool),
    (int, _encode_int),
    (float, _encode_float),
    (str, _encode_str),
    (bytes, _encode_bytes),
    (bytearray, _encode_byte_array),
    (Decimal, _encode_decimal),
    (_dt.datetime, _encode_datetime),
    (Mapping, _encode_mapping),
    (list, _encode_sequence),
    (tuple, _encode_sequence),
)


def _encode_value(value: Any, depth: int) -> bytes:
    encode = _FIELD_ENCODERS.get(type(value))
    if encode is None:
        for kind, candidate in _FIELD_ENCODER_FALLBACK:
            if isinstance(value, kind):
                encode = candidate
                break
        else:
            raise TypeError(f"cannot encode {type(value).__name__} in a field table")
    return encode(value, depth)


def _encode_table(table: Mapping[str, Any], depth: int) -> bytes:
    if depth > _MAX_NESTING:
        raise ValueError("field tables nested too deeply")
    parts: list[bytes] = []
    for key, value in table.items():
        if not isinstance(key, str):
            raise TypeError(f"field table key {key!r} is not a str")
        parts.append(_shortstr(key))
        parts.append(_encode_value(value, depth))
    return _longstr(b"".join(parts))


def encode_table(table: Mapping[str, Any]) -> bytes:
    """A field table: 4-byte length + (shortstr key, typed value) pairs, in ``table``'s order.

    ``bool`` -> t, ``int`` -> I or l, ``float`` -> d, ``Decimal`` -> D, ``str`` / ``bytes`` ->
    S, ``bytearray`` -> x, ``datetime`` -> T (naive means UTC; whole seconds), ``None`` -> V,
    mappings -> F, lists / tuples -> A.
    """
    return _encode_table(table, 0)


# --------------------------------------------------------------------------------------------
# Basic properties (content header property flags + list)

_Properties = commands.Basic.Properties


def _decode_shortstr_prop(raw: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    if pos >= end:
        raise _truncated()
    stop = pos + 1 + raw[pos]
    if stop > end:
        raise _truncated()
    # Properties are pass-through data RabbitMQ never validates; surrogateescape decodes
    # any bytes and encode_properties restores them exactly.
    return raw[pos + 1 : stop].decode("utf-8", "surrogateescape"), stop


def _decode_octet_prop(raw: bytes, pos: int, end: int, depth: int) -> tuple[Any, int]:
    if pos >= end:
        raise _truncated()
    return raw[pos], pos + 1


def _encode_shortstr_prop(value: Any) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"str required, got {type(value).__name__}")
    return _shortstr(value)


def _encode_octet_prop(value: Any) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= 255:
        raise ValueError(f"octet property must be an int 0..255, got {value!r}")
    return _SHORT_LEN[value]


def _encode_table_prop(value: Any) -> bytes:
    if not isinstance(value, Mapping):
        raise TypeError(f"headers must be a mapping, got {type(value).__name__}")
    return _encode_table(value, 0)


def _encode_timestamp_prop(value: Any) -> bytes:
    if not isinstance(value, _dt.datetime):
        raise TypeError(f"timestamp must be a datetime, got {type(value).__name__}")
    return _U64.pack(_timestamp_seconds(value))


# The 14 properties in wire order: (attribute, flag bit, decoder, encoder).
_PROPERTIES: Final[tuple[tuple[str, int, _ValueDecoder, Callable[[Any], bytes]], ...]] = (
    ("content_type", 0x8000, _decode_shortstr_prop, _encode_shortstr_prop),
    ("content_encoding", 0x4000, _decode_shortstr_prop, _encode_shortstr_prop),
    ("headers", 0x2000, _decode_field_table, _encode_table_prop),
    ("delivery_mode", 0x1000, _decode_octet_prop, _encode_octet_prop),
    ("priority", 0x0800, _decode_octet_prop, _encode_octet_prop),
    ("correlation_id", 0x0400, _decode_shortstr_prop, _encode_shortstr_prop),
    ("reply_to", 0x0200, _decode_shortstr_prop, _encode_shortstr_prop),
    ("expiration", 0x0100, _decode_shortstr_prop, _encode_shortstr_prop),
    ("message_id", 0x0080, _decode_shortstr_prop, _encode_shortstr_prop),
    ("timestamp", 0x0040, _decode_timestamp, _encode_timestamp_prop),
    ("message_type", 0x0020, _decode_shortstr_prop, _encode_shortstr_prop),
    ("user_id", 0x0010, _decode_shortstr_prop, _encode_shortstr_prop),
    ("app_id", 0x0008, _decode_shortstr_prop, _encode_shortstr_prop),
    ("cluster_id", 0x0004, _decode_shortstr_prop, _encode_shortstr_prop),
)
_KNOWN_FLAGS: Final = 0xFFFC  # bits 15..2; bit 1 is unassigned, bit 0 is "another word follows"


def encode_properties(props: commands.Basic.Properties) -> bytes:
    """Property flags + list. Every property that is not ``None`` is sent (an empty string
    too, unlike pamqp's marshal); ``cluster_id`` only when non-empty (its default is '')."""
    flags = 0
    parts: list[bytes] = [b""]
    for name, flag, _, encode in _PROPERTIES:
        value = getattr(props, name, None)
        if value is None or (flag == 0x0004 and not value):
            continue
        flags |= flag
        parts.append(encode(value))
    parts[0] = flags.to_bytes(2, "big")
    return b"".join(parts)


def decode_properties(raw: bytes) -> commands.Basic.Properties:
    """A pamqp ``Basic.Properties`` from raw flags + list; absent ones are ``None`` (and
    ``cluster_id`` ''). Garbage -> AmqpError(502)."""
    end = len(raw)
    if end < 2:
        raise _syntax_error("property flags truncated")
    flags = (raw[0] << 8) | raw[1]
    pos = 2
    word = flags
    while word & 1:  # continuation words: legal, but 0-9-1 defines no property in them
        if pos + 2 > end:
            raise _syntax_error("property flags truncated")
        word = (raw[pos] << 8) | raw[pos + 1]
        pos += 2
        if word & 0xFFFE:
            raise _syntax_error("unknown property flag in a continuation word")
    if flags & 0x0002:
        raise _syntax_error("unknown property flag 0x0002")
    values: list[Any] = [None] * 13 + [""]
    for index, (_, flag, decode, _) in enumerate(_PROPERTIES):
        if flags & flag:
            values[index], pos = decode(raw, pos, end, 0)
    if pos != end:
        raise _syntax_error("trailing bytes after the property list")
    props = _new(_Properties)
    (
        props.content_type,
        props.content_encoding,
        props.headers,
        props.delivery_mode,
        props.priority,
        props.correlation_id,
        props.reply_to,
        props.expiration,
        props.message_id,
        props.timestamp,
        props.message_type,
        props.user_id,
        props.app_id,
        props.cluster_id,
    ) = values
    return props


def text(value: object) -> str:
    """A string field as text, whether pamqp handed it over as str or bytes (None: "")."""
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    return str(value)
