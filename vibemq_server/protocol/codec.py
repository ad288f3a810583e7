"""Sans-IO codec of the VibeMQ v1 wire protocol: bytes in, Message objects out, and back.

Framing is a u32 big-endian body length followed by the body. The body layout is
``version u8 | type u8 | id | queue | payload | headers | [errorCode | errorMessage]``
(see ``../shared/specs`` and ``docs/protocol.md``). Nothing here awaits or touches a socket.

Two layers, because their failures differ: a bad *frame* (zero or oversized length) leaves no
way to find the next frame, so it is fatal for the connection; a bad *body* inside a
well-delimited frame only spoils that one message and the stream can go on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from struct import Struct
from struct import error as StructError
from typing import Final, cast

from vibemq_server.protocol.bigcopy import Fill, payload_fill, read_target
from vibemq_server.protocol.bigcopy import join_range as _bigcopy_join
from vibemq_server.protocol.errors import ErrorCode, ProtocolError
from vibemq_server.protocol.held import Buffer, HeldInput, prefix
from vibemq_server.protocol.jsoncheck import COMPILED as _JSON_COMPILED
from vibemq_server.protocol.jsoncheck import Resumable, checker
from vibemq_server.protocol.jsoncheck import valid as json_valid

# (Final: the compiled build reads these as constants, not from the module's dict per use)
PROTOCOL_VERSION: Final = 1
#: A 64 MiB binary payload travels as base64 (85.3 MiB), plus room for the id, queue name and
#: headers: 86 MiB (docs/operations.md, "Message size limits").
DEFAULT_MAX_MESSAGE_SIZE: Final = 86 * 1024 * 1024
DEFAULT_MAX_HEADERS: Final = 50
DEFAULT_MAX_HEADER_VALUE: Final = 4096

_U16: Final = Struct(">H")
_U32: Final = Struct(">I")
_TYPE_HDR: Final = Struct(">BB")
#: bound once: a ``Struct`` method called by name is looked up on every call
_PACK_U16: Final[Callable[..., bytes]] = _U16.pack
_PACK_U32: Final[Callable[..., bytes]] = _U32.pack
#: bigcopy's join: the C one when built (one call, not a loop of views joined); a Final, not
#: an imported name read from the module's dict on every use
join_range: Final = _bigcopy_join


def _join_pieces(*parts: bytes) -> bytes:
    """``_glue.glue`` where it is not built."""
    return b"".join(parts)


def _no_publish_ack(_msg_id: str, _queue: str) -> bytes | None:
    """``_glue.publish_ack`` where it is not built: always from the pieces."""
    return None


def _no_publish_acks(_echoes: list[str]) -> bytes | None:
    """``_glue.publish_acks`` where it is not built: each PublishAck, then their join."""
    return None


def _no_deliver(_msg_id: str, _piece: bytes, _payload: bytes, _tail: bytes) -> bytes | None:
    """``_glue.deliver`` where it is not built: always from the pieces."""
    return None


_glue_impl: Callable[..., bytes]
_publish_ack_impl: Callable[[str, str], bytes | None]
_publish_acks_impl: Callable[[list[str]], bytes | None]
_deliver_impl: Callable[[str, bytes, bytes, bytes], bytes | None]
try:
    from vibemq_server.protocol._glue import deliver as _deliver_impl
    from vibemq_server.protocol._glue import glue as _glue_impl
    from vibemq_server.protocol._glue import publish_ack as _publish_ack_impl
    from vibemq_server.protocol._glue import publish_acks as _publish_acks_impl
except ImportError:  # not built: the join, the PublishAck and the Deliver from their pieces
    _glue_impl = _join_pieces
    _publish_ack_impl = _no_publish_ack
    _publish_acks_impl = _no_publish_acks
    _deliver_impl = _no_deliver
#: a frame's small pieces joined (the C one when built: its pieces as the call's arguments,
#: no tuple of them, no buffer taken of each as ``b"".join`` does: ~1,000 instructions less
#: a PublishAck compiled)
_glue: Final = _glue_impl
#: the whole PublishAck of an ASCII id and queue in one C call (no encode, no pieces); None
_publish_ack_ascii: Final = _publish_ack_impl
#: the PublishAcks of many ASCII ids and queues in one C call and one bytes object; None
_publish_acks_ascii: Final = _publish_acks_impl
#: the whole Deliver of an ASCII id in one C call (no encode, no head cache, no pieces); None
_deliver_ascii: Final = _deliver_impl


class CommandType(IntEnum):
    """Command type byte, as the original VibeMQ numbers them."""

    CONNECT = 0
    CONNECT_ACK = 1
    DISCONNECT = 2
    PING = 10
    PONG = 11
    PUBLISH = 20
    PUBLISH_ACK = 21
    SUBSCRIBE = 22
    SUBSCRIBE_ACK = 23
    UNSUBSCRIBE = 24
    UNSUBSCRIBE_ACK = 25
    DELIVER = 26
    ACK = 30
    CREATE_QUEUE = 40
    DELETE_QUEUE = 41
    QUEUE_INFO = 42
    LIST_QUEUES = 43
    ERROR = 99


_KNOWN_TYPES: Final = frozenset(int(t) for t in CommandType)
_EMPTY_HEADERS: Final[Mapping[str, str]] = {}


@dataclass(slots=True)
class Message:
    """One protocol message. ``payload`` is the raw UTF-8 JSON bytes (b"" means absent)."""

    type: CommandType
    id: str
    queue: str = ""
    payload: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    error_code: str = ""
    error_message: str = ""
    version: int = PROTOCOL_VERSION

    # Written out, not generated: the compiled build runs dataclasses' generated __init__
    # as interpreted code (3,000 instructions a Message, a tenth of a publish's path).
    def __init__(
        self,
        type: CommandType,
        id: str,
        queue: str = "",
        payload: bytes = b"",
        headers: Mapping[str, str] | None = None,
        error_code: str = "",
        error_message: str = "",
        version: int = PROTOCOL_VERSION,
    ) -> None:
        self.type = type
        self.id = id
        self.queue = queue
        self.payload = payload
        self.headers = {} if headers is None else headers
        self.error_code = error_code
        self.error_message = error_message
        self.version = version

    def json(self) -> object:
        """The payload parsed as JSON, or None when there is no payload."""
        return json.loads(self.payload) if self.payload else None


def _s(value: str) -> bytes:
    """A u16-length-prefixed UTF-8 string; empty means null (length 0)."""
    if not value:
        return b"\x00\x00"
    raw = value.encode()
    return _PACK_U16(len(raw)) + raw


def encode_body(msg: Message) -> bytes:
    """Encode a message body (without the length prefix) the way the original writes it."""
    parts: list[bytes] = [
        _TYPE_HDR.pack(msg.version, msg.type),
        _s(msg.id),
        _s(msg.queue),
        _U32.pack(len(msg.payload)),
        msg.payload,
        _U16.pack(len(msg.headers)),
    ]
    for key, value in msg.headers.items():
        parts.append(_s(key))
        parts.append(_s(value))
    # The original writes the error fields only on Error messages.
    if msg.type == CommandType.ERROR:
        parts.append(_s(msg.error_code))
        parts.append(_s(msg.error_message))
    return b"".join(parts)


def encode_deliver(
    msg_id: str, queue: str, payload: bytes, headers: Mapping[str, str], attempts: int
) -> bytes:
    """A Deliver frame (the queue's name looked up in the cache of encoded names)."""
    return encode_deliver_named(msg_id, queue_piece(queue), payload, headers, attempts)


def encode_deliver_named(
    msg_id: str, piece: bytes, payload: bytes, headers: Mapping[str, str], attempts: int
) -> bytes:
    """A Deliver frame, built directly from pieces encoded once: the hot path of every
    delivery. ``piece`` is the queue's name as :func:`queue_piece` encodes it (a consumer
    keeps it per subscription: with 10,000 queues a name's entry in the cache is another
    cold line a delivery). The ``deliveryAttempts`` header of the usual attempt counts
    comes from a cache; the rest comes from small caches and one join."""
    if headers or attempts >= _CACHED_ATTEMPTS:
        head, i, q, size, tail = _deliver_pieces(msg_id, piece, len(payload), headers, attempts)
        return b"".join((head, i, q, size, payload, tail))
    # The usual delivery (no headers of its own, a small attempt count): written in place
    # by ``_glue.deliver`` when the id is ASCII, else from its pieces here (not as a tuple
    # from _deliver_pieces: an allocation and a call a delivery).
    attempts_tail = _ATTEMPTS_TAIL[attempts]
    frame = _deliver_ascii(msg_id, piece, payload, attempts_tail)
    if frame is not None:
        return frame
    return _deliver_usual(msg_id, piece, payload, attempts_tail)


def _deliver_usual(msg_id: str, piece: bytes, payload: bytes, attempts_tail: bytes) -> bytes:
    """``encode_deliver_named`` of the usual delivery from its pieces (any id)."""
    raw_id = msg_id.encode()
    plen = len(payload)
    return _glue(
        _deliver_head(raw_id, piece, plen, attempts_tail),
        raw_id,
        piece,
        _u32_piece(plen),
        payload,
        attempts_tail,
    )


#: A payload at least this large is written between the bytes :func:`deliver_parts` gives
#: as a buffer of its own, not copied into one frame with them. (Final: compiled, a module
#: that imports it reads the number itself, not this module's dict.)
LARGE_PAYLOAD: Final = 16 * 1024


def deliver_parts(
    msg_id: str, piece: bytes, payload: bytes, headers: Mapping[str, str], attempts: int
) -> list[bytes]:
    """A Deliver frame as the bytes before its payload, the payload itself (written as it
    is, not copied) and the bytes after it: one ``Link.send_parts`` a large delivery.
    ``piece`` as in :func:`encode_deliver_named`."""
    plen = len(payload)
    if headers or attempts >= _CACHED_ATTEMPTS:
        head, i, q, size, tail = _deliver_pieces(msg_id, piece, plen, headers, attempts)
        return [b"".join((head, i, q, size)), payload, tail]
    # The usual delivery: its head from _deliver_head's cache of the last one, no tuple of
    # pieces; the payload length packed as for the last large delivery when it had the same
    # (a stream's payloads mostly do): a cache lookup by a boxed int less.
    raw_id = msg_id.encode()
    tail = _ATTEMPTS_TAIL[attempts]
    last = _LAST_LARGE
    if plen != last.plen:
        last.size = _u32_piece(plen)
        last.plen = plen
    head = _deliver_head(raw_id, piece, plen, tail)
    return [b"".join((head, raw_id, piece, last.size)), payload, tail]


class _LastLarge:
    """The packed payload length of the last large Deliver (:func:`deliver_parts`)."""

    __slots__ = ("plen", "size")

    def __init__(self) -> None:
        self.plen = -1
        self.size = b""


_LAST_LARGE: Final = _LastLarge()


def _deliver_pieces(
    msg_id: str, q: bytes, plen: int, headers: Mapping[str, str], attempts: int
) -> tuple[bytes, bytes, bytes, bytes, bytes]:
    """A Deliver frame's pieces around its payload: the packed head, the id, the queue
    (``q``, encoded by :func:`queue_piece`), the payload's length, and the headers after it."""
    i = msg_id.encode()
    tail = _ATTEMPTS_TAIL[attempts] if attempts < _CACHED_ATTEMPTS else _attempts_tail(attempts)
    if headers:
        extra = [_s(k) + _s(v) for k, v in headers.items() if k != "deliveryAttempts" and k and v]
        if extra:
            extra.append(tail[2:])
            tail = _PACK_U16(len(extra)) + b"".join(extra)
    return _deliver_head(i, q, plen, tail), i, q, _u32_piece(plen), tail


# The packed head and payload length come from small caches: a dict lookup by int costs a
# third of a struct pack, and a stream's sizes repeat.
def _deliver_head(raw_id: bytes, q: bytes, plen: int, tail: bytes) -> bytes:
    """A Deliver frame's first 8 bytes: its length (computed here, for both callers, from
    the id, queue piece, payload length and tail), version, type, the id's length."""
    n = len(raw_id)
    total = 8 + n + len(q) + plen + len(tail)
    key = total << 16 | n
    last = _LAST_HEAD
    if last.key == key:
        return last.head
    head = _DELIVER_HEADS.get(key)
    if head is None:
        head = _cache(_DELIVER_HEADS, key, _PACK_DELIVER_HEAD(total, 1, 26, n))
    last.key = key
    last.head = head
    return head


class _LastHead:
    """The last Deliver head made and its key: a stream of deliveries repeats one frame
    length and id length, and a hit here is two native compares where the dict's lookup
    boxes the key (an int object allocated and freed a delivery) and hashes it."""

    __slots__ = ("head", "key")

    def __init__(self) -> None:
        self.key = -1
        self.head = b""


_LAST_HEAD: Final = _LastHead()


def _u32_piece(value: int) -> bytes:
    """``value`` as a big-endian u32 (a payload's length)."""
    if value < _SMALL_U32:
        # (a list by index: boxing the int and hashing it for the dict cost more than the
        # call this helper costs its two callers)
        small = _U32_SMALL[value]
        if small is None:
            small = _U32_SMALL[value] = _PACK_U32(value)
        return small
    piece = _U32_PIECES.get(value)
    if piece is None:
        piece = _cache(_U32_PIECES, value, _PACK_U32(value))
    return piece


def _cache(cache: dict[int, bytes], key: int, value: bytes) -> bytes:
    """Remember ``value`` under ``key`` in one of the bounded caches of packed ints."""
    if len(cache) >= _MAX_PACKED:
        cache.clear()
    cache[key] = value
    return value


def queue_piece(queue: str) -> bytes:
    """The length-prefixed queue name of a Deliver frame, from the cache of encoded names."""
    piece = _QUEUE_PIECES.get(queue)
    if piece is None:
        piece = _queue_piece(queue)
    return piece


def _queue_piece(queue: str) -> bytes:
    """The length-prefixed queue name, cached (bounded: names are few, but not trusted)."""
    if len(_QUEUE_PIECES) >= _MAX_QUEUE_PIECES:
        _QUEUE_PIECES.clear()
    piece = _QUEUE_PIECES[queue] = _s(queue)
    return piece


def _attempts_tail(attempts: int) -> bytes:
    """Header count 1 and the ``deliveryAttempts`` pair: a Deliver without other headers."""
    return b"\x00\x01" + _s("deliveryAttempts") + _s(str(attempts))


_QUEUE_PIECES: Final[dict[str, bytes]] = {}
#: packed Deliver heads by frame length << 16 | id length, payload lengths (bounded:
#: cleared when full)
_DELIVER_HEADS: Final[dict[int, bytes]] = {}
_U32_PIECES: Final[dict[int, bytes]] = {}
#: the packed lengths under 4 KiB, by length (filled as they are met)
_SMALL_U32: Final = 4096
_U32_SMALL: Final[list[bytes | None]] = [None] * _SMALL_U32
_MAX_PACKED: Final = 4096
#: the u16 length prefix of the usual short id
_SHORT_U16: Final = [bytes((0, k)) for k in range(256)]
_MAX_QUEUE_PIECES: Final = 65_536  # (more than 4,096 thrashed with 10,000 busy queues)
_CACHED_ATTEMPTS: Final = 64
_ATTEMPTS_TAIL: Final = [_attempts_tail(a) for a in range(_CACHED_ATTEMPTS)]


# length prefix, version 1, type Deliver (26), id length
_PACK_DELIVER_HEAD: Final[Callable[..., bytes]] = Struct(">IBBH").pack
_PUBLISH_ACK_HEADERS: Final = b"\x00\x00\x00\x00\x00\x02" + _s("messageId")
_QUEUE_NAME_KEY: Final = _s("queueName")


def encode_publish_ack(msg_id: str, queue: str) -> bytes:
    """The PublishAck frame for a Publish: echoes id and queue, headers messageId and
    queueName. Built directly because every publish pays for it: written in place by
    ``_glue.publish_ack`` when both are ASCII (the usual case), else glued from pieces."""
    frame = _publish_ack_ascii(msg_id, queue)
    if frame is not None:
        return frame
    return _publish_ack_pieces(msg_id, queue)


def encode_publish_acks(echoes: list[str]) -> bytes:
    """The PublishAcks of ``echoes`` = ``[id, queue, id, queue, ...]``, joined: a durable
    group commit's answers written by ``_glue.publish_acks`` in one call and one buffer when
    all are ASCII (no frame object each, no join)."""
    frames = _publish_acks_ascii(echoes)
    if frames is not None:
        return frames
    return b"".join(
        [encode_publish_ack(echoes[i], echoes[i + 1]) for i in range(0, len(echoes), 2)]
    )


def _publish_ack_pieces(msg_id: str, queue: str) -> bytes:
    """``encode_publish_ack`` from pieces: the queue's name is encoded here, from the
    Publish's own (hot) string, and the constant bytes around the two echoes come from
    tables by length. (A cache of pieces by queue name cost a dict entry, its key and the
    pieces: four to six cold lines a publish at 10,000 queues.)"""
    i = msg_id.encode()
    q = queue.encode()
    n = len(i)
    qlen = len(q)
    total = _PUBLISH_ACK_FIXED + 2 * (n + qlen + 2)
    if n > 255 or qlen > 255:
        sid = _PACK_U16(n) + i
        qs = _PACK_U16(qlen) + q
        packed = _PACK_PUBLISH_ACK_HEAD(total, 1, 21)
        return b"".join((packed, sid, qs, _PUBLISH_ACK_HEADERS, sid, _QUEUE_NAME_KEY, qs))
    ql = _SHORT_U16[qlen]
    head = _ACK_HEADS[total]  # (by index: an int key this large would be a new object)
    keys = _ACK_ID_KEYS[n]
    return _glue(head, _SHORT_U16[n], i, ql, q, keys, i, _ACK_QUEUE_KEYS[qlen], q)


# length prefix, version 1, type PublishAck (21); the body's bytes besides id and queue
_PACK_PUBLISH_ACK_HEAD: Final[Callable[..., bytes]] = Struct(">IBB").pack
_PUBLISH_ACK_FIXED: Final = 2 + 2 + len(_PUBLISH_ACK_HEADERS) + 2 + len(_QUEUE_NAME_KEY)
#: by the length (< 256) of the id, the headers up to its echo and that echo's length; by the
#: queue's, the ``queueName`` key and the length of its echo
_ACK_ID_KEYS: Final = [_PUBLISH_ACK_HEADERS + _SHORT_U16[k] for k in range(256)]
_ACK_QUEUE_KEYS: Final = [_QUEUE_NAME_KEY + _SHORT_U16[k] for k in range(256)]
#: the packed heads of the PublishAcks of ids and names shorter than 256 bytes, by length
_ACK_HEADS: Final = [_PACK_PUBLISH_ACK_HEAD(t, 1, 21) for t in range(_PUBLISH_ACK_FIXED + 1025)]


def encode(msg: Message) -> bytes:
    """Encode a message as one complete frame: length prefix plus body."""
    return frame(encode_body(msg))


def frame(body: bytes) -> bytes:
    """Prefix an already encoded body with its length."""
    return _PACK_U32(len(body)) + body


class _Reader:
    """Cursor over one frame body; every read checks bounds so truncation is caught."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    def _need(self, n: int, what: str) -> None:
        if self.pos + n > self.end:
            raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"truncated {what}")

    def u16(self, what: str) -> int:
        self._need(2, what)
        (value,) = _U16.unpack_from(self.buf, self.pos)
        self.pos += 2
        return int(value)

    def raw(self, n: int, what: str) -> bytes:
        self._need(n, what)
        start = self.pos
        self.pos += n
        return self.buf[start : self.pos]

    def text(self, what: str) -> str:
        n = self.u16(what)
        if n == 0:
            return ""
        raw = self.raw(n, what)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"invalid UTF-8 in {what}") from None


@dataclass(frozen=True, slots=True)
class Limits:
    """Validation limits applied while decoding (the original's defaults)."""

    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_headers: int = DEFAULT_MAX_HEADERS
    max_header_value: int = DEFAULT_MAX_HEADER_VALUE


DEFAULT_LIMITS = Limits()


def _peek_id(body: bytes) -> str:
    """Best-effort id of a malformed body, so the Error reply can carry it."""
    if len(body) < 4:
        return ""
    (n,) = _U16.unpack_from(body, 2)
    try:
        return body[4 : 4 + n].decode() if 4 + n <= len(body) else ""
    except UnicodeDecodeError:
        return ""


_TYPES: Final[dict[int, CommandType]] = {int(t): t for t in CommandType}


def _fast_decode(body: bytes, limits: Limits) -> Message | None:
    """Decode a well-formed body in few Python steps; None lets the careful decoder find
    and name the defect. Slices never raise, so every length is checked by the final
    position landing exactly on the end of the body. (u16 lengths are read by byte index:
    cheaper than struct calls; an index past the end raises IndexError.)"""
    try:
        # (every length read by byte index: ints the compiled build keeps unboxed)
        version = body[0]
        type_byte = body[1]
        n = body[2] << 8 | body[3]
        pos = 4 + n
        msg_id = body[4:pos].decode()
        n = body[pos] << 8 | body[pos + 1]
        pos += 2
        queue = body[pos : pos + n].decode() if n else ""
        pos += n
        plen = body[pos] << 24 | body[pos + 1] << 16 | body[pos + 2] << 8 | body[pos + 3]
        pos += 4
        payload = body[pos : pos + plen] if plen else b""
        pos += plen
        count = body[pos] << 8 | body[pos + 1]
        pos += 2
        headers: Mapping[str, str] = _EMPTY_HEADERS  # (shared: a Message's are read-only)
        if count:
            found: dict[str, str] = {}
            headers = found
            max_value = limits.max_header_value
            for _ in range(count):
                n = body[pos] << 8 | body[pos + 1]
                key = body[pos + 2 : pos + 2 + n].decode()
                pos += 2 + n
                n = body[pos] << 8 | body[pos + 1]
                value = body[pos + 2 : pos + 2 + n].decode()
                pos += 2 + n
                if n > max_value and len(value) > max_value:
                    return None
                if key and value:
                    found[key] = value
        error_code = error_message = ""
        if pos < len(body):
            n = body[pos] << 8 | body[pos + 1]
            error_code = body[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            n = body[pos] << 8 | body[pos + 1]
            error_message = body[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
    except (IndexError, StructError, UnicodeDecodeError):
        return None
    kind = _TYPES.get(type_byte)
    if (
        pos != len(body)
        or version != PROTOCOL_VERSION
        or kind is None
        or not msg_id
        or count > limits.max_headers
    ):
        return None
    return Message(kind, msg_id, queue, payload, headers, error_code, error_message, version)


_ACK: Final = 30  # CommandType.ACK (a plain int: comparing with the enum member costs more)
_MESSAGE_ID_KEY: Final = b"\x00\x09messageId"
#: ``bytes.isascii`` itself: called, compiled, without looking the method up by name each time
_IS_ASCII: Final[Callable[[bytes], bool]] = bytes.isascii


def _no_ack_target(_body: bytes) -> str | None:
    """``_ackpeek.ack_target`` where it is not built: always the codec's own peek."""
    return None


_ack_target_impl: Callable[[bytes], str | None]
try:
    from vibemq_server.protocol._ackpeek import ack_target as _ack_target_impl
except ImportError:  # not built: every Ack through _peek_ack_target
    _ack_target_impl = _no_ack_target
#: the usual Ack's target (one ASCII ``messageId``) in one C call; None for any other body
_ack_target_ascii: Final = _ack_target_impl


def peek_ack_target(body: bytes, limits: Limits = DEFAULT_LIMITS) -> str | None:
    """For a well-formed Ack body, the id of the message it acknowledges (header
    ``messageId``, else the Ack's own id) without building a Message: half of all traffic
    is Acks. None for anything else; ``decode_body`` then decides. The usual Ack (one
    ASCII ``messageId``) is read by ``_ackpeek.ack_target`` when built (the limits are
    checked here), any other by ``_peek_ack_target``."""
    target = _ack_target_ascii(body)
    if target is not None and len(target) <= limits.max_header_value and limits.max_headers >= 1:
        return target
    return _peek_ack_target(body, limits)


def _peek_ack_target(body: bytes, limits: Limits) -> str | None:
    """``peek_ack_target`` of any Ack body. (Lengths are read byte by byte: cheaper than
    struct calls; an index past the end raises IndexError.)"""
    try:
        if body[1] != _ACK or body[0] != PROTOCOL_VERSION:
            return None
        n = body[2] << 8 | body[3]
        if not n:
            return None
        own_end = pos = 4 + n
        # An all-ASCII body (the usual Ack: short lengths, ASCII ids) has only UTF-8 text:
        # one C pass over it instead of a slice and a check of each text field.
        all_ascii = _IS_ASCII(body)
        n = body[pos] << 8 | body[pos + 1]
        pos += 2
        if n:
            if not all_ascii:
                body[pos : pos + n].decode()  # the queue must be UTF-8 too
            pos += n
        plen = body[pos] << 24 | body[pos + 1] << 16 | body[pos + 2] << 8 | body[pos + 3]
        pos += 4 + plen
        count = body[pos] << 8 | body[pos + 1]
        pos += 2
        if count > limits.max_headers:
            return None
        if count == 1 and body[pos : pos + 11] == _MESSAGE_ID_KEY:
            # The usual Ack: one header, messageId (what the client library sends).
            n = body[pos + 11] << 8 | body[pos + 12]
            if pos + 13 + n != len(body) or n > limits.max_header_value:
                return None
            target = body[pos + 13 :].decode()
            if not target:
                return body[4:own_end].decode()
            if not all_ascii:
                body[4:own_end].decode()  # the Ack's own id must be UTF-8 too (raises if not)
            return target
        target = ""
        for _ in range(count):
            n = body[pos] << 8 | body[pos + 1]
            key = body[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            n = body[pos] << 8 | body[pos + 1]
            if n > limits.max_header_value:
                return None
            value = body[pos + 2 : pos + 2 + n].decode()
            if key == "messageId" and value:
                target = value
            pos += 2 + n
        if pos != len(body):
            return None
        own = body[4:own_end].decode()
        return target or own
    except (IndexError, StructError, UnicodeDecodeError):
        return None


def decode_body(body: bytes, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decode one frame body. Raises ProtocolError (not fatal) on any defect."""
    msg = _fast_decode(body, limits)
    if msg is not None:
        return msg
    try:
        return _decode_body(body, limits)
    except ProtocolError as exc:
        if not exc.message_id:
            exc.message_id = _peek_id(body)
        raise


def _decode_body(body: bytes, limits: Limits) -> Message:
    if len(body) < 2:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "truncated header")
    version, type_byte = _TYPE_HDR.unpack_from(body, 0)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"unsupported protocol version {version}")
    if type_byte not in _KNOWN_TYPES:
        raise ProtocolError(ErrorCode.UNKNOWN_COMMAND, f"unknown command type {type_byte}")
    r = _Reader(body)
    r.pos = 2
    msg_id = r.text("id")
    queue = r.text("queue")
    r._need(4, "payload length")
    (plen,) = _U32.unpack_from(body, r.pos)
    r.pos += 4
    payload = r.raw(plen, "payload") if plen else b""
    count = r.u16("header count")
    if count > limits.max_headers:
        raise ProtocolError(
            ErrorCode.INVALID_MESSAGE, f"{count} headers, at most {limits.max_headers} allowed"
        )
    headers: dict[str, str] = {}
    for _ in range(count):
        key = r.text("header key")
        value = r.text("header value")
        if len(value) > limits.max_header_value:
            raise ProtocolError(
                ErrorCode.INVALID_MESSAGE,
                f"header {key!r} value is {len(value)} characters, "
                f"at most {limits.max_header_value} allowed",
            )
        if key and value:  # a null key or value drops the pair, as the original does
            headers[key] = value
    error_code = error_message = ""
    # Error fields are optional trailers on every type; accept both forms.
    if r.pos < r.end:
        error_code = r.text("errorCode")
        error_message = r.text("errorMessage")
    if r.pos != r.end:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, f"{r.end - r.pos} trailing bytes")
    if not msg_id:
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "message id is required")
    return Message(
        CommandType(type_byte), msg_id, queue, payload, headers, error_code, error_message, version
    )


def validate_json(payload: bytes, message_id: str = "") -> None:
    """Raise INVALID_PAYLOAD unless the payload is UTF-8 JSON (empty means no payload).
    What counts as JSON: :mod:`vibemq_server.protocol.jsoncheck`."""
    if payload and not json_valid(payload):
        raise ProtocolError(
            ErrorCode.INVALID_PAYLOAD, "payload is not valid UTF-8 JSON", message_id=message_id
        )


#: the most bytes before a payload: the frame's length, version, type, two u16-long strings
#: (id and queue) and the payload's length
_MAX_BEFORE_PAYLOAD: Final = 4 + 2 + 2 + 0xFFFF + 2 + 0xFFFF + 4


class BigFrame:
    """A large frame still as the reads it came in (the 4-byte length first): its payload is
    copied out of them off the loop (``bigcopy``), the rest of the frame decoded on it."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: list[Buffer]) -> None:
        self.parts = parts
        #: bytes in ``parts``, the frame's length field included
        self.size = sum(map(len, parts))

    def split(self) -> tuple[bytes, int, int] | None:
        """The frame body with its payload left out (the payload's length zeroed: it decodes
        as a payload-less message), and where the payload lies in ``parts``; None when the
        lengths do not add up (then the whole body is decoded, to name the defect)."""
        head = prefix(self.parts, _MAX_BEFORE_PAYLOAD)
        try:
            pos = 8 + (head[6] << 8 | head[7])
            pos += 2 + (head[pos] << 8 | head[pos + 1])
            plen = head[pos] << 24 | head[pos + 1] << 16 | head[pos + 2] << 8 | head[pos + 3]
        except IndexError:
            return None
        start = pos + 4
        stop = start + plen
        if stop > self.size:
            return None
        return head[4:pos] + b"\0\0\0\0" + join_range(self.parts, stop, self.size), start, stop

    def body(self) -> bytes:
        """The whole frame body, joined."""
        return join_range(self.parts, 4, self.size)


class Split:
    """A frame body with a large payload, taken apart as it is cut out of the reads: the
    payload copied once straight out of them, and the rest of the body (the payload's length
    zeroed: it decodes as a payload-less message, whose ``payload`` is then this one). Slicing
    the body out first and the payload out of the body copied the payload twice.
    ``json_ok``: whether the payload is JSON, when it was checked as its parts landed (a
    payload filled in place, with the compiled checker); None: not checked yet."""

    __slots__ = ("json_ok", "payload", "skeleton")

    def __init__(self, skeleton: bytes, payload: bytes, json_ok: bool | None = None) -> None:
        self.skeleton = skeleton
        self.payload = payload
        self.json_ok = json_ok


#: a frame body, a large one still in its reads, or one with its payload apart
Body = bytes | BigFrame | Split

#: the bytes of a frame looked at for its payload's place when it came in several reads: the
#: head, ids and queue names of every usual size (a longer one: the body is joined whole)
_HEAD_PEEK: Final = 512


def _payload_at(head: bytes, start: int, end: int) -> int:
    """Where the payload's length lies in a body starting at ``start`` (its version byte) of
    ``head``, which holds it up to ``end``; -1 when that is not within ``end``."""
    if end - start < 4:
        return -1
    pos = start + 4 + (head[start + 2] << 8 | head[start + 3])
    if pos + 2 > end:
        return -1
    pos += 2 + (head[pos] << 8 | head[pos + 1])
    return pos if pos + 4 <= end else -1


def _payload_stop(head: bytes, pos: int, end: int, split_from: int) -> int:
    """Where the payload whose length lies at ``pos`` of ``head`` (-1: nowhere) ends; -1
    for a payload under ``split_from`` bytes or one that runs past ``end``."""
    if pos < 0:
        return -1
    plen = head[pos] << 24 | head[pos + 1] << 16 | head[pos + 2] << 8 | head[pos + 3]
    stop = pos + 4 + plen
    return -1 if plen < split_from or stop > end else stop


def _split_read(src: bytes, start: int, end: int, split_from: int) -> Split | None:
    """The body ``src[start:end]`` apart from its payload of ``split_from`` bytes or more;
    None for a smaller payload or lengths that do not add up (the body is decoded whole)."""
    pos = _payload_at(src, start, end)
    stop = _payload_stop(src, pos, end, split_from)
    if stop < 0:
        return None
    return Split(src[start:pos] + b"\0\0\0\0" + src[stop:end], src[pos + 4 : stop])


def _split_parts(parts: list[Buffer], size: int, split_from: int) -> Split | None:
    """As :func:`_split_read`, for a frame (its length field first) cut over the reads
    ``parts`` of ``size`` bytes in all: the payload joined straight out of them."""
    head = prefix(parts, _HEAD_PEEK)
    pos = _payload_at(head, 4, len(head))
    stop = _payload_stop(head, pos, size, split_from)
    if stop < 0:
        return None
    tail = join_range(parts, stop, size)
    return Split(head[4:pos] + b"\0\0\0\0" + tail, join_range(parts, pos + 4, stop))


class _Filling:
    """A frame whose payload is being filled in place (``bigcopy.payload_fill``: the
    transport reads the rest straight into it, ``Link.read_into``, or ``add`` copies it in),
    then the fields after the payload (``tail``: header count, headers, error fields)
    gathered; it comes out as a :class:`Split`, as a frame cut out of its reads does.

    With the compiled JSON checker the payload is checked part by part as it lands, while it
    is in cache (``check``): a part copied in (``write``) where it is copied from, a part the
    kernel read into the fill through ``rest`` (a view of the fill's unfilled rest as it was
    at ``base``, held while reads land in it) up to ``checked``; once it is full only the
    checker's state is looked at (``Split.json_ok``). The verdict is used at the frame's
    end, so an invalid payload is refused where it was before."""

    __slots__ = (
        "base",
        "before",
        "check",
        "checked",
        "fill",
        "json_ok",
        "parts",
        "payload",
        "rest",
        "skeleton",
        "tail",
        "tail_size",
    )

    def __init__(
        self, fill: Fill, skeleton: bytes, before: int, tail: int, check: Resumable | None
    ) -> None:
        self.fill: Fill | None = fill
        self.check = check
        self.checked = self.base = fill.filled
        # (held from here: the transport's first read into the fill comes before any add)
        self.rest: memoryview | None = None if check is None else memoryview(read_target(fill))
        self.json_ok: bool | None = None
        #: the body up to the payload, the payload's length zeroed
        self.skeleton = skeleton
        #: the frame's bytes before the payload (its length field included)
        self.before = before
        #: the bytes after the payload, how many of them are in, and those
        self.tail = tail
        self.tail_size = 0
        self.parts: list[bytes] = []
        self.payload = b""

    @property
    def buffered(self) -> int:
        fill = self.fill
        got = len(self.payload) if fill is None else fill.filled
        return self.before + got + self.tail_size

    def add(self, data: bytes) -> int:
        """``data`` (maybe empty: the transport read into the fill) into the frame; how much
        of it the frame took once it is complete, else -1."""
        used = 0
        fill = self.fill
        if fill is not None:
            check = self.check
            if check is not None:
                self._check_read(fill, check)
                if data:
                    self._release()  # (a write would move the rest under the view)
                    used = fill.write(data)
                    check.feed(data, 0, used)
                    self.checked += used
            elif data:
                used = fill.write(data)
            if not fill.full:
                if check is not None and self.rest is None:
                    self.base = fill.filled
                    self.rest = memoryview(read_target(fill))
                return -1
            if check is not None:
                self._release()
                # (every byte fed, or no verdict: then the payload is checked whole, as before)
                self.json_ok = check.finish() if self.checked == fill.filled else None
            self.payload = fill.take()
            self.fill = None
        take = min(self.tail - self.tail_size, len(data) - used)
        if take > 0:
            self.parts.append(bytes(data[used : used + take]))
            self.tail_size += take
        return used + take if self.tail_size == self.tail else -1

    def _check_read(self, fill: Fill, check: Resumable) -> None:
        """Check what the transport read into the fill since the last look (still hot)."""
        filled = fill.filled
        rest = self.rest
        if filled > self.checked and rest is not None:
            base = self.base
            check.feed(rest, self.checked - base, filled - base)
            self.checked = filled

    def _release(self) -> None:
        rest = self.rest
        if rest is not None:
            rest.release()
            self.rest = None

    def split(self) -> Split:
        tail = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        return Split(self.skeleton + tail, self.payload, self.json_ok)


def _start_fill(
    parts: list[Buffer], head: bytes, have: int, need: int, split_from: int, fill_from: int
) -> _Filling | None:
    """A frame of ``need`` bytes (its length field first) of which ``parts`` hold the first
    ``have`` (``head``: at least their first ``_HEAD_PEEK``) with a payload of ``split_from``
    bytes or more and ``fill_from`` of it still to come: its payload's fill, what is held of
    the payload copied in; None otherwise (the frame is held and cut as before: a short
    payload, or lengths that do not add up, whose defect the decoder names)."""
    pos = _payload_at(head, 4, len(head))
    stop = _payload_stop(head, pos, need, split_from)
    if stop < 0 or stop - have < fill_from:
        return None
    start = pos + 4
    fill = payload_fill(stop - start)
    # (the payload's first bytes checked as they are copied in: _Filling checks the rest)
    check = checker() if _JSON_COMPILED else None
    at = 0
    for part in parts:
        end = at + len(part)
        if end > start:
            skip = 0 if at >= start else start - at
            used = fill.write(part if not skip else memoryview(part)[skip:])
            if check is not None:
                check.feed(part, skip, skip + used)
        at = end
    return _Filling(fill, head[4:pos] + b"\0\0\0\0", start, need - stop, check)


def _head_in(head: bytes) -> bool:
    """Whether ``head`` (a held frame's first ``_HEAD_PEEK`` bytes, or all there are) has the
    frame's head (up to its payload's length) or all it is looked for in: then whether the
    payload can be filled is known for good (:func:`_start_fill`'s answer does not change)."""
    return len(head) >= _HEAD_PEEK or _payload_at(head, 4, len(head)) >= 0


class FrameDecoder:
    """Incremental splitter of a byte stream into frame bodies.

    ``feed`` returns every complete frame body seen so far. A length of zero or over the limit
    cannot be resynchronised: the bodies before it are still returned, ``error`` is set to a
    *fatal* ProtocolError, and every later ``feed`` raises it. With ``big_from``, a frame body of
    that many bytes or more is not joined: ``feed`` leaves it in ``big`` (before the bodies it
    returns) as a :class:`BigFrame`, and the caller takes it from there. With ``split_from``,
    :meth:`feed_frames` gives a body whose payload has that many bytes or more as a
    :class:`Split` (the payload copied once, not the body and then the payload out of it).
    With ``fill_from`` too, such a frame with ``fill_from`` bytes or more of its payload
    still to come once its head is in has its payload filled in place (``filling``: the
    transport reads the rest straight into it, ``Link.read_into``): no copy at all.
    """

    __slots__ = (
        "_big_from",
        "_filling",
        "_held",
        "_max",
        "_split_from",
        "_unfillable",
        "big",
        "error",
        "fill_from",
    )

    def __init__(
        self,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        big_from: int = 0,
        split_from: int = 0,
        fill_from: int = 0,
    ) -> None:
        self._held = HeldInput()
        self._max = max_message_size
        self._big_from = big_from
        self._split_from = split_from
        #: from how much payload still to come a payload is filled in place (0: never; only
        #: with ``split_from``, so a frame comes out as a Split however it is cut)
        self.fill_from = fill_from if split_from else 0
        self._filling: _Filling | None = None
        #: the held frame's head is in and its payload is not to be filled (_fill_held's
        #: answer is known: it is not asked again on every read)
        self._unfillable = False
        self.error: ProtocolError | None = None
        #: the large frame that came before the bodies ``feed`` returned (with ``big_from``)
        self.big: BigFrame | None = None

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a complete frame."""
        filling = self._filling
        return self._held.size if filling is None else filling.buffered

    @property
    def filling(self) -> Fill | None:
        """The payload being filled in place, while it is (for ``Link.read_into``)."""
        filling = self._filling
        return filling.fill if filling is not None else None

    def feed(self, data: bytes) -> list[bytes]:
        """Every complete frame body so far (a decoder made without ``split_from``)."""
        return cast(list[bytes], self.feed_frames(data))

    def feed_frames(self, data: bytes) -> list[bytes | Split]:
        """Every complete frame so far: a body, or (``split_from``) a :class:`Split` one."""
        if self.error is not None:
            raise self.error
        held = self._held
        bodies: list[bytes | Split] = []
        split_from = self._split_from
        filling = self._filling
        if filling is not None:
            # A payload filled in place, then the rest of its frame: parsing goes on after it.
            pos = filling.add(data)
            if pos < 0:
                return []
            self._filling = None
            bodies.append(filling.split())
            src = data if type(data) is bytes else bytes(data)
        elif held.size:
            # A frame cut over reads: held as the reads, copied once when all of it is in.
            if not held.add_part(data):
                if (
                    self.fill_from
                    and not self._unfillable
                    and held.need - held.size >= self.fill_from
                ):
                    self._fill_held()
                return []
            need = held.need
            if need >= 4096:  # (a length known: the body joined straight from the reads)
                parts, src, pos = held.cut()  # (the rest parsed in the last read itself)
                if self._big_from and need - 4 >= self._big_from:
                    self.big = BigFrame(parts)
                else:
                    split = _split_parts(parts, need, split_from) if split_from else None
                    bodies.append(split or join_range(parts, 4, need))
            else:
                src = held.take()
                pos = 0
        else:
            # Nothing held over (the usual case): slice the frames out of ``data`` itself, one
            # copy each, and keep only an incomplete tail.
            src = data if type(data) is bytes else bytes(data)
            pos = 0
        end = len(src)
        limit = self._max
        need = 4
        while end - pos >= 4:
            # (read by byte index, not ``unpack_from``: the compiled build keeps the length
            # and every position after it as C integers, not boxed ones added generically)
            n = src[pos] << 24 | src[pos + 1] << 16 | src[pos + 2] << 8 | src[pos + 3]
            if n == 0 or n > limit:
                what = "zero frame length" if n == 0 else f"frame of {n} bytes exceeds {limit}"
                self.error = ProtocolError(ErrorCode.INVALID_MESSAGE, what, fatal=True)
                held.clear()
                if not bodies:
                    raise self.error
                return bodies
            if end - pos - 4 < n:
                need = 4 + n
                break
            if split_from and n > split_from:
                split = _split_read(src, pos + 4, pos + 4 + n, split_from)
                bodies.append(split or src[pos + 4 : pos + 4 + n])
            else:
                bodies.append(src[pos + 4 : pos + 4 + n])
            pos += 4 + n
        if pos < end:
            fill_from = self.fill_from
            unfillable = False
            if fill_from and need - (end - pos) >= fill_from:
                head = src[pos : pos + _HEAD_PEEK]
                start = _start_fill(
                    [memoryview(src)[pos:]], head, end - pos, need, split_from, fill_from
                )
                if start is not None:
                    self._filling = start
                    return bodies
                unfillable = _head_in(head)
            self._unfillable = unfillable
            held.hold(src, pos, need)
        return bodies

    def _fill_held(self) -> None:
        """The frame held over reads has its payload filled in place from here on, once its
        head is in (and its payload large: :func:`_start_fill`)."""
        held = self._held
        parts = held.parts
        head = prefix(parts, _HEAD_PEEK)
        start = _start_fill(parts, head, held.size, held.need, self._split_from, self.fill_from)
        if start is not None:
            held.clear()
            self._filling = start
        elif _head_in(head):
            self._unfillable = True
