"""A frame's small pieces joined in one call (``protocol/_glue.c``): the compiled ``glue``
is what the codec uses, and it equals ``b"".join`` of its arguments on any pieces (bytes, and
the other buffers the join takes)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vibemq_server.protocol import codec


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
