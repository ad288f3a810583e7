"""A read's run of WebSocket client frames unmasked in one call (``unmask_run``, issue 18):
the compiled routine (vibemq_server/server/_wsunmask.c) equals the pure one on any bytes, and
both take exactly the whole, masked, unfragmented binary frames within the size bound, as
the ``websockets`` library frames them, and stop at anything else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode

from vibemq_server.server import websocket
from vibemq_server.server.websocket import unmask_run_pure


def _compiled(buf: bytes, pos: int, max_message: int) -> tuple[bytes, int]:
    from vibemq_server.server._wsunmask import unmask_run

    return unmask_run(buf, pos, max_message)


def test_the_compiled_routine_is_built_and_used() -> None:
    from vibemq_server.server._wsunmask import unmask_run

    assert websocket.unmask_run is unmask_run, "build it: pip install -e . or scripts/build_ext.sh"


def frame(opcode: Opcode, data: bytes, *, fin: bool = True, mask: bool = True) -> bytes:
    return Frame(opcode, data, fin).serialize(mask=mask, extensions=[])


#: a whole masked binary frame: what unmask_run takes
_FAST = st.binary(max_size=300).map(lambda d: ("fast", d))
#: what it must stop at (the library's to handle)
_OTHER = st.one_of(
    st.binary(max_size=40).map(lambda d: ("other", frame(Opcode.BINARY, d, fin=False))),
    st.binary(max_size=40).map(lambda d: ("other", frame(Opcode.CONT, d))),
    st.binary(max_size=40).map(lambda d: ("other", frame(Opcode.TEXT, d))),
    st.binary(max_size=40).map(lambda d: ("other", frame(Opcode.PING, d))),
    st.binary(max_size=40).map(lambda d: ("other", frame(Opcode.BINARY, d, mask=False))),
    # junk (not starting like a binary frame: that could be a whole one)
    st.binary(min_size=1, max_size=12).filter(lambda d: d[0] != 0x82).map(lambda d: ("other", d)),
)
_SIZES = st.sampled_from([0, 1, 125, 126, 127, 65_535, 65_536, 70_000])


def _wire(pieces: list[tuple[str, bytes]]) -> tuple[bytes, list[bytes]]:
    """The pieces' bytes, and the data of the fast frames before the first other piece."""
    out, expected, leading = [], [], True
    for kind, data in pieces:
        if kind == "fast":
            out.append(frame(Opcode.BINARY, data))
            if leading:
                expected.append(data)
        else:
            out.append(data)
            leading = False
    return b"".join(out), expected


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(st.one_of(_FAST, _FAST, _OTHER), max_size=12),
    cut=st.integers(0, 5_000),
    pos=st.integers(0, 40),
    max_message=st.sampled_from([0, 1, 50, 124, 125, 126, 300, 1 << 20]),
)
def test_the_compiled_routine_equals_the_pure_one(
    pieces: list[tuple[str, bytes]], cut: int, pos: int, max_message: int
) -> None:
    wire, _ = _wire(pieces)
    buf = wire[: cut % (len(wire) + 1)]
    pos = min(pos, len(buf))
    assert _compiled(buf, pos, max_message) == unmask_run_pure(buf, pos, max_message)


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(st.one_of(_FAST, _FAST, _OTHER), max_size=12))
def test_the_run_is_the_leading_whole_frames(pieces: list[tuple[str, bytes]]) -> None:
    wire, expected = _wire(pieces)
    for run in (_compiled, unmask_run_pure):
        data, stop = run(wire, 0, 1 << 20)
        assert data == b"".join(expected)
        assert stop == sum(len(frame(Opcode.BINARY, d)) for d in expected)
        # a frame cut short is left whole for the next read
        if expected:
            short = wire[: stop - 1]
            data, stop2 = run(short, 0, 1 << 20)
            assert data == b"".join(expected[:-1]) and stop2 < stop


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(_SIZES, min_size=1, max_size=4), max_message=_SIZES)
def test_every_length_encoding_and_the_bound(sizes: list[int], max_message: int) -> None:
    """7-bit, 16-bit and 64-bit lengths; a frame over the bound stops the run (the library
    refuses it with 1009)."""
    datas = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    wire = b"".join(frame(Opcode.BINARY, d) for d in datas)
    taken = []
    for d in datas:
        if len(d) > max_message:
            break
        taken.append(d)
    for run in (_compiled, unmask_run_pure):
        data, stop = run(wire, 0, max_message)
        assert data == b"".join(taken)
        assert stop == sum(len(frame(Opcode.BINARY, d)) for d in taken)


def test_golden_bytes() -> None:
    """RFC 6455 section 5.7's masked "Hello" (its first byte made binary), twice; then a
    ping."""
    hello = bytes([0x82, 0x85, 0x37, 0xFA, 0x21, 0x3D, 0x7F, 0x9F, 0x4D, 0x51, 0x58])
    ping = bytes([0x89, 0x80, 1, 2, 3, 4])
    buf = hello + hello + ping
    for run in (_compiled, unmask_run_pure):
        assert run(buf, 0, 125) == (b"HelloHello", 22)
        assert run(buf, 11, 125) == (b"Hello", 22)
        assert run(buf, 22, 125) == (b"", 22)
        assert run(buf, 0, 4) == (b"", 0)


def test_bad_arguments() -> None:
    with pytest.raises(TypeError):
        _compiled(bytearray(b"\x82\x80abcd"), 0, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _compiled(b"\x82\x80abcd", 7, 10)
    with pytest.raises(ValueError):
        _compiled(b"\x82\x80abcd", -1, 10)
    with pytest.raises(TypeError):
        _compiled(b"", 0)  # type: ignore[call-arg]
