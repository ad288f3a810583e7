"""The usual native Ack's target read in C (``protocol/_ackpeek.c``): built and used by the
codec; whatever it answers is what the codec's own peek (``_peek_ack_target``, the code
without the extension) and the decoder answer, and any other body, truncated or mangled,
is left to them (None) without reading past its end."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vibemq_server.protocol import ProtocolError, decode_body
from vibemq_server.protocol.codec import (
    DEFAULT_LIMITS,
    CommandType,
    Limits,
    Message,
    _peek_ack_target,
    encode_body,
    peek_ack_target,
)


def test_the_compiled_ack_peek_is_built_and_used() -> None:
    from vibemq_server.protocol import codec
    from vibemq_server.protocol._ackpeek import ack_target

    assert codec._ack_target_ascii is ack_target, "build it: scripts/build_ext.sh"


_TEXT = st.one_of(st.text(st.characters(max_codepoint=127), max_size=40), st.text(max_size=20))
_HEADERS = st.one_of(
    _TEXT.map(lambda v: {"messageId": v}),
    st.dictionaries(_TEXT, _TEXT, max_size=3),
)


def _ack(msg_id: str, queue: str, payload: bytes, headers: dict[str, str]) -> bytes:
    return encode_body(Message(CommandType.ACK, msg_id, queue, payload, headers))


_BODIES = st.one_of(
    st.builds(_ack, _TEXT, _TEXT, st.binary(max_size=30), _HEADERS),
    st.binary(max_size=80),
)


def _decoded_target(body: bytes) -> str | None:
    try:
        msg = decode_body(body)
    except ProtocolError:
        return None
    if msg.type != CommandType.ACK:
        return None
    return msg.headers.get("messageId") or msg.id


@settings(max_examples=500)
@given(_BODIES, st.data())
def test_ack_target_is_the_peek_or_steps_aside(body: bytes, data: st.DataObject) -> None:
    from vibemq_server.protocol._ackpeek import ack_target

    if body and data.draw(st.booleans()):  # one byte changed, or the body cut short
        i = data.draw(st.integers(0, len(body) - 1))
        if data.draw(st.booleans()):
            body = body[:i] + bytes([data.draw(st.integers(0, 255))]) + body[i + 1 :]
        else:
            body = body[:i]
    target = ack_target(body)
    fallback = _peek_ack_target(body, DEFAULT_LIMITS)
    decoded = _decoded_target(body)
    if target is not None:
        assert target == fallback == decoded
        assert target.isascii()
    if fallback is not None:  # (the code without the extension)
        assert fallback == decoded
    assert peek_ack_target(body) == (target if target is not None else fallback)


@given(st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=200))
def test_the_usual_ack_is_read_in_c(target: str) -> None:
    from vibemq_server.protocol._ackpeek import ack_target

    body = _ack("a1", "orders", b"", {"messageId": target})
    assert ack_target(body) == target
    assert ack_target(bytearray(body)) is None  # (only exact bytes)
    for cut in range(len(body)):
        assert ack_target(body[:cut]) is None
    assert ack_target(body + b"x") is None


def test_the_limits_still_apply() -> None:
    body = _ack("a1", "orders", b"", {"messageId": "m" * 10})
    assert peek_ack_target(body) == "m" * 10
    assert peek_ack_target(body, Limits(max_header_value=9)) is None
    assert peek_ack_target(body, Limits(max_headers=0)) is None
