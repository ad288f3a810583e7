"""Sans-IO codec of ZeroMQ RFC 50/MME: several message frames encoded as one message.

This is the encoding czmq's ``zmsg_encode`` / ``zmsg_decode`` use, byte for byte:

* a frame of 0..254 octets is one length octet followed by the content;
* a frame of 255 octets or more is the octet 0xFF, the length as an unsigned 32-bit integer in
  network byte order, then the content;
* zero frames encode to the empty message.

The encoder writes the short form whenever it can (as czmq does), or every frame in the long
form when asked (``long_form=True``; the spec allows it). The decoder accepts the long form for
any size. Every problem raises :class:`MmeError` with an :class:`MmeErrorCode`; the decoder
never returns a partial result. Nothing here imports pyzmq or does I/O: the client library
(``publish_multipart`` / ``decode_multipart``) uses it without pyzmq installed.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

#: The content type of a body that is an MME encoding (header ``contentType``).
MME_CONTENT_TYPE = "application/x-zmq-mme"
#: The header naming a payload's content type (also AMQP's ``content-type``).
CONTENT_TYPE = "contentType"

#: Largest frame the encoding can carry: the largest unsigned 32-bit integer.
MAX_FRAME_SIZE = 0xFFFF_FFFF
_LONG = 0xFF
_SHORT_MAX = 254

#: Length octets of the short form, built once: encoding a small frame costs no allocation.
_SHORT_PREFIX = tuple(bytes((n,)) for n in range(_SHORT_MAX + 1))

Frame = bytes | bytearray | memoryview


class MmeErrorCode(StrEnum):
    """Why an encoding or a decoding failed."""

    #: encoder: a frame longer than 2^32 - 1 octets (the spec's "size overflow")
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
    #: decoder: an 0xFF marker with fewer than four length octets after it (underflow)
    TRUNCATED_LENGTH = "TRUNCATED_LENGTH"
    #: decoder: a frame length running past the end of the message (underflow)
    TRUNCATED_FRAME = "TRUNCATED_FRAME"


class MmeError(ValueError):
    """The one error of this codec. ``offset``: where in the input (or which frame, when
    encoding) the problem is."""

    def __init__(self, code: MmeErrorCode, message: str, offset: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.offset = offset


def _size(frame: Frame) -> int:
    # A memoryview's len() counts items, not octets; bytes and bytearray (and mmap) count octets.
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)


def encode(frames: Iterable[Frame], *, long_form: bool = False) -> bytes:
    """One MME message holding ``frames`` (bytes-like), short form where it fits unless
    ``long_form``. A frame over :data:`MAX_FRAME_SIZE` octets raises ``FRAME_TOO_LARGE``."""
    out: list[Frame] = []
    append = out.append
    short = _SHORT_PREFIX
    for index, frame in enumerate(frames):
        # A memoryview's len() counts items, not octets (inlined _size: the hot path).
        n = frame.nbytes if type(frame) is memoryview else len(frame)
        if n <= _SHORT_MAX and not long_form:
            append(short[n])
        elif n <= MAX_FRAME_SIZE:
            append(b"\xff" + n.to_bytes(4, "big"))
        else:
            raise MmeError(
                MmeErrorCode.FRAME_TOO_LARGE,
                f"frame {index} has {n} octets, more than {MAX_FRAME_SIZE}",
                index,
            )
        append(frame)
    return b"".join(out)


def decode(data: Frame) -> list[bytes]:
    """The frames of one MME message; ``MmeError`` for any invalid encoding."""
    buf = data if isinstance(data, bytes) else bytes(data)
    end = len(buf)
    frames: list[bytes] = []
    append = frames.append
    pos = 0
    while pos < end:
        start = pos
        n = buf[pos]
        pos += 1
        if n == _LONG:
            if end - pos < 4:
                raise MmeError(
                    MmeErrorCode.TRUNCATED_LENGTH,
                    f"0xFF at {start} needs 4 length octets, {end - pos} follow",
                    start,
                )
            n = int.from_bytes(buf[pos : pos + 4], "big")
            pos += 4
        stop = pos + n
        if stop > end:
            raise MmeError(
                MmeErrorCode.TRUNCATED_FRAME,
                f"frame at {start} claims {n} octets, {end - pos} follow",
                start,
            )
        append(buf[pos:stop])
        pos = stop
    return frames


def encoded_size(frames: Iterable[Frame]) -> int:
    """The length :func:`encode` (short form) gives ``frames``, without building it."""
    return sum(n + (1 if n <= _SHORT_MAX else 5) for n in map(_size, frames))
