"""A frame's small pieces joined in one call (``protocol/_glue.c``): the compiled ``glue``
is what the codec uses, and it equals ``b"".join`` of its arguments on any pieces (bytes, and
the other buffers the join takes); ``publish_ack`` writes the PublishAck of an ASCII id and
queue exactly as the codec glues it from pieces, and leaves any other to them (None);
``publish_acks`` writes a list of them one after the other (None when any is not ASCII),
``codec.encode_publish_acks`` equals their join on any text; ``deliver`` writes the Deliver
of an ASCII id as the generic encoder does (any queue, payload and attempt count), and leaves
any other id to the pieces (None)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vibemq_server.protocol import codec
from vibemq_server.protocol.codec import CommandType, Message


def test_the_compiled_glue_is_built_and_used() -> None:
    from vibemq_server.protocol._glue import glue

    assert codec._glue is glue, "build it: pip install -e . or scripts/build_ext.sh"


_PIECE = st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=40).map(bytearray),
    st.binary(max_size=40).map(memoryview),
)


@given(st.lists(st.binary(max_size=300), max_size=12))
def test_glue_of_bytes_is_their_join(parts: list[bytes]) -> None:
    from vibemq_server.protocol._glue import glue

    assert glue(*parts) == b"".join(parts)
    assert codec._join_pieces(*parts) == b"".join(parts)


@given(st.lists(_PIECE, max_size=12))
def test_glue_of_any_buffers_is_their_join(parts: list[bytes | bytearray | memoryview]) -> None:
    from vibemq_server.protocol._glue import glue

    joined = glue(*parts)
    assert joined == b"".join(parts)
    assert type(joined) is bytes


def test_glue_refuses_what_the_join_refuses() -> None:
    from vibemq_server.protocol._glue import glue

    with pytest.raises(TypeError):
        glue(b"a", "b")  # type: ignore[arg-type]


def test_the_compiled_publish_ack_is_built_and_used() -> None:
    from vibemq_server.protocol._glue import publish_ack

    assert codec._publish_ack_ascii is publish_ack


_ASCII = st.text(st.characters(max_codepoint=127), max_size=300)


@given(_ASCII, _ASCII)
def test_publish_ack_of_ascii_is_the_frame_from_pieces(msg_id: str, queue: str) -> None:
    from vibemq_server.protocol._glue import publish_ack

    assert publish_ack(msg_id, queue) == codec._publish_ack_pieces(msg_id, queue)


@given(st.text(min_size=1, max_size=20), st.text(max_size=20))
def test_publish_ack_leaves_other_text_to_the_pieces(msg_id: str, queue: str) -> None:
    from vibemq_server.protocol._glue import publish_ack

    frame = publish_ack(msg_id, queue)
    if msg_id.isascii() and queue.isascii():
        assert frame == codec._publish_ack_pieces(msg_id, queue)
    else:
        assert frame is None
    assert publish_ack("i" * 65_536, "q") is None  # (longer than a u16 length says)


def test_the_compiled_publish_acks_is_built_and_used() -> None:
    from vibemq_server.protocol._glue import publish_acks

    assert codec._publish_acks_ascii is publish_acks


_ECHOES = st.lists(st.tuples(st.text(max_size=40), st.text(max_size=40)), max_size=20)


@given(_ECHOES)
def test_publish_acks_are_the_frames_joined(pairs: list[tuple[str, str]]) -> None:
    from vibemq_server.protocol._glue import publish_acks

    echoes = [text for pair in pairs for text in pair]
    joined = b"".join(codec._publish_ack_pieces(i, q) for i, q in pairs)
    assert codec.encode_publish_acks(echoes) == joined
    if all(text.isascii() for text in echoes):
        assert publish_acks(echoes) == joined
    else:
        assert publish_acks(echoes) is None


def test_publish_acks_refuses_what_it_does_not_write() -> None:
    from vibemq_server.protocol._glue import publish_acks

    assert publish_acks(["i" * 65_536, "q"]) is None  # (longer than a u16 length says)
    assert publish_acks(["i", b"q"]) is None  # type: ignore[list-item]
    with pytest.raises(TypeError):
        publish_acks(["i", "q", "j"])  # (not pairs)
    with pytest.raises(TypeError):
        publish_acks(("i", "q"))  # type: ignore[arg-type]


def test_the_compiled_deliver_is_built_and_used() -> None:
    from vibemq_server.protocol._glue import deliver

    assert codec._deliver_ascii is deliver


def _generic_deliver(msg_id: str, queue: str, payload: bytes, attempts: int) -> bytes:
    headers = {"deliveryAttempts": str(attempts)}
    return codec.encode(Message(CommandType.DELIVER, msg_id, queue, payload, headers))


@given(
    st.text(max_size=300),
    st.text(max_size=100),
    st.binary(max_size=2000),
    st.integers(0, codec._CACHED_ATTEMPTS - 1),
)
def test_deliver_is_the_generic_frame_or_none(
    msg_id: str, queue: str, payload: bytes, attempts: int
) -> None:
    from vibemq_server.protocol._glue import deliver

    piece = codec.queue_piece(queue)
    tail = codec._ATTEMPTS_TAIL[attempts]
    frame = deliver(msg_id, piece, payload, tail)
    expected = _generic_deliver(msg_id, queue, payload, attempts)
    # (the pieces' path, the fallback without the extension, for any text)
    assert codec._deliver_usual(msg_id, piece, payload, tail) == expected
    if msg_id.isascii():
        assert frame == expected
        assert codec.encode_deliver_named(msg_id, piece, payload, {}, attempts) == expected
    else:
        assert frame is None


@given(
    st.text(max_size=40),
    st.text(max_size=40),
    st.binary(max_size=200),
    st.dictionaries(st.text(max_size=20), st.text(max_size=20), max_size=4),
    st.integers(0, 200),
)
def test_encode_deliver_named_is_the_generic_frame(
    msg_id: str, queue: str, payload: bytes, headers: dict[str, str], attempts: int
) -> None:
    """Headers of its own, or attempts past the cached ones: the pieces' path; the usual
    ones: the C frame for an ASCII id, the pieces' for any other."""
    piece = codec.queue_piece(queue)
    # (the codec drops empty keys and values and a header of the attempts' own name)
    kept = {k: v for k, v in headers.items() if k and v and k != "deliveryAttempts"}
    kept["deliveryAttempts"] = str(attempts)
    expected = codec.encode(Message(CommandType.DELIVER, msg_id, queue, payload, kept))
    assert codec.encode_deliver_named(msg_id, piece, payload, headers, attempts) == expected


def test_deliver_refuses_what_it_does_not_write() -> None:
    from vibemq_server.protocol._glue import deliver

    piece = codec.queue_piece("q")
    tail = codec._ATTEMPTS_TAIL[1]
    assert deliver("i" * 65_536, piece, b"", tail) is None  # (longer than a u16 length says)
    assert deliver("i", bytearray(piece), b"", tail) is None
    assert deliver("i", piece, memoryview(b"x"), tail) is None
    assert deliver(b"i", piece, b"", tail) is None  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        deliver("i", piece, b"")  # type: ignore[call-arg]
