"""The RFC 50/MME codec: golden vectors from the spec, czmq cross-checks, Hypothesis properties.

Golden bytes are written by hand from the layouts in ``../shared/specs/004_*.txt``, not by the
encoder. The cross-checks call czmq's own ``zmsg_encode``/``zmsg_decode`` through ctypes
(``czmqref.py``); without libczmq they fail rather than skip.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import pytest
from czmqref import Czmq
from hypothesis import given, settings
from hypothesis import strategies as st

from vibemq_server.protocol import mme
from vibemq_server.protocol.mme import MAX_FRAME_SIZE, MmeError, MmeErrorCode, decode, encode

CZMQ = Czmq()


def long_header(n: int) -> bytes:
    return b"\xff" + struct.pack(">I", n)


# (frames, their encoding), straight from the spec's two diagrams.
GOLDEN: list[tuple[list[bytes], bytes]] = [
    ([], b""),
    ([b""], b"\x00"),
    ([b"A"], b"\x01A"),
    ([b"x" * 254], b"\xfe" + b"x" * 254),
    ([b"y" * 255], b"\xff\x00\x00\x00\xff" + b"y" * 255),
    ([b"z" * 256], b"\xff\x00\x00\x01\x00" + b"z" * 256),
    ([b"w" * 65_536], b"\xff\x00\x01\x00\x00" + b"w" * 65_536),
    ([b"", b"", b""], b"\x00\x00\x00"),
    ([b"ab", b"x" * 300, b"c"], b"\x02ab" + long_header(300) + b"x" * 300 + b"\x01c"),
]


@pytest.mark.parametrize(("frames", "wire"), GOLDEN, ids=lambda v: repr(v)[:30])
def test_golden_encode_decode(frames: list[bytes], wire: bytes) -> None:
    assert encode(frames) == wire
    assert decode(wire) == frames


@pytest.mark.parametrize(("frames", "wire"), GOLDEN, ids=lambda v: repr(v)[:30])
def test_golden_vectors_match_czmq(frames: list[bytes], wire: bytes) -> None:
    assert CZMQ.encode(frames) == wire
    assert CZMQ.decode(wire) == frames


def test_small_frame_in_long_form_is_accepted() -> None:
    wire = b"\xff\x00\x00\x00\x03abc" + b"\xff\x00\x00\x00\x00"
    assert decode(wire) == [b"abc", b""]
    assert CZMQ.decode(wire) == [b"abc", b""]
    assert encode([b"abc", b""], long_form=True) == wire


def test_decode_accepts_bytearray_and_memoryview() -> None:
    wire = b"\x02hi\x00"
    assert decode(bytearray(wire)) == decode(memoryview(wire)) == [b"hi", b""]


def test_encode_accepts_bytes_like_and_counts_octets() -> None:
    wide = memoryview(b"\x00\x01" * 200).cast("H")  # 200 items, 400 octets
    assert encode([bytearray(b"ab"), wide]) == b"\x02ab" + long_header(400) + b"\x00\x01" * 200


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (b"\x01", MmeErrorCode.TRUNCATED_FRAME),
        (b"\x05abcd", MmeErrorCode.TRUNCATED_FRAME),
        (b"\x00\x02a", MmeErrorCode.TRUNCATED_FRAME),
        (b"\xff", MmeErrorCode.TRUNCATED_LENGTH),
        (b"\xff\x00\x00\x01", MmeErrorCode.TRUNCATED_LENGTH),
        (b"\x01a\xff\x00", MmeErrorCode.TRUNCATED_LENGTH),
        (b"\xff\x00\x00\x01\x00" + b"x" * 255, MmeErrorCode.TRUNCATED_FRAME),
        (b"\xff\x7f\xff\xff\xff", MmeErrorCode.TRUNCATED_FRAME),
    ],
)
def test_underflow_is_an_error_in_both_implementations(wire: bytes, code: MmeErrorCode) -> None:
    with pytest.raises(MmeError) as info:
        decode(wire)
    assert info.value.code is code
    assert CZMQ.decode(wire) is None


def czmq_can_read(wire: bytes) -> bool:
    """Whether czmq 4.2 decodes ``wire`` safely: it builds a long length from ``source[0] <<
    24`` as a signed int, so a length of 2^31 or more becomes a huge size_t, passes its bound
    check and reads out of bounds (a segfault). Such inputs are checked against ours only."""
    pos = 0
    while pos < len(wire):
        n = wire[pos]
        pos += 1
        if n == 0xFF:
            if len(wire) - pos >= 4 and wire[pos] >= 0x80:
                return False
            n = int.from_bytes(wire[pos : pos + 4], "big")
            pos += 4
        pos += n
    return True


def test_lengths_over_two_gib_are_unsigned() -> None:
    for wire in (b"\xff\xff\xff\xff\xff", b"\xff\x80\x00\x00\x00" + b"x" * 10):
        assert not czmq_can_read(wire)
        with pytest.raises(MmeError) as info:
            decode(wire)
        assert info.value.code is MmeErrorCode.TRUNCATED_FRAME


def test_error_offsets_name_the_bad_frame() -> None:
    with pytest.raises(MmeError) as info:
        decode(b"\x01a\x02b")
    assert info.value.offset == 2


def test_frame_over_four_gib_is_refused(tmp_path: Path) -> None:
    # A sparse file: 2^32 octets of address space, no memory or disk behind it.
    path = tmp_path / "huge"
    with path.open("wb") as fh:
        fh.truncate(MAX_FRAME_SIZE + 1)
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as huge:
        assert len(huge) == MAX_FRAME_SIZE + 1
        with pytest.raises(MmeError) as info:
            encode([b"ok", huge])  # type: ignore[list-item]
        assert info.value.code is MmeErrorCode.FRAME_TOO_LARGE
        assert info.value.offset == 1


def test_encoded_size() -> None:
    frames = [b"", b"a" * 254, b"b" * 255, b"c" * 70_000]
    assert mme.encoded_size(frames) == len(encode(frames))


# -- properties ----------------------------------------------------------------------------------

frame_lists = st.lists(
    st.one_of(st.binary(max_size=300), st.binary(min_size=250, max_size=600)), max_size=8
)


@given(frame_lists)
def test_round_trip(frames: list[bytes]) -> None:
    wire = encode(frames)
    assert decode(wire) == frames
    assert decode(encode(frames, long_form=True)) == frames
    assert len(wire) == mme.encoded_size(frames)


@settings(max_examples=200)
@given(frame_lists)
def test_matches_czmq_both_ways(frames: list[bytes]) -> None:
    wire = encode(frames)
    assert CZMQ.encode(frames) == wire
    assert CZMQ.decode(wire) == frames
    assert CZMQ.decode(encode(frames, long_form=True)) == frames


@given(frame_lists)
def test_one_shot_decode_equals_frame_by_frame(frames: list[bytes]) -> None:
    """Decoding a whole message gives what decoding each frame's own encoding gives, joined."""
    wire = encode(frames)
    pieces: list[bytes] = []
    for frame in frames:
        pieces.extend(decode(encode([frame])))
    assert decode(wire) == pieces
    assert decode(b"".join(encode([f]) for f in frames)) == frames


@given(frame_lists.filter(bool), st.data())
def test_every_cut_raises_the_codec_error_only(frames: list[bytes], data: st.DataObject) -> None:
    wire = encode(frames)
    boundaries = set()
    pos = 0
    for frame in frames:
        pos += 1 + (0 if len(frame) <= 254 else 4) + len(frame)
        boundaries.add(pos)
    cut = data.draw(st.integers(0, len(wire) - 1))
    if cut in boundaries or cut == 0:
        # A cut between frames is itself a valid, shorter message.
        assert decode(wire[:cut]) == frames[: sorted(boundaries).index(cut) + 1 if cut else 0]
        return
    with pytest.raises(MmeError):
        decode(wire[:cut])
    assert CZMQ.decode(wire[:cut]) is None


def test_every_cut_of_one_message() -> None:
    frames = [b"a", b"", b"x" * 300, b"b" * 254]
    wire = encode(frames)
    valid = {0, 2, 3, 3 + 305, len(wire)}
    for cut in range(len(wire)):
        if cut in valid:
            decode(wire[:cut])
        else:
            with pytest.raises(MmeError):
                decode(wire[:cut])


# Bytes biased towards lengths that matter: 0, small, 254 and the 0xFF marker.
near_valid = st.lists(
    st.one_of(st.sampled_from([0, 1, 2, 3, 0xFE, 0xFF]), st.integers(0, 255)), max_size=64
).map(bytes)


@given(near_valid)
def test_arbitrary_input_decodes_or_raises_like_czmq(wire: bytes) -> None:
    try:
        frames: list[bytes] | None = decode(wire)
    except MmeError:
        frames = None
    if czmq_can_read(wire):
        assert CZMQ.decode(wire) == frames
