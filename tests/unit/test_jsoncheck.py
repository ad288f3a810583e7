"""The native protocol's payload check (vibemq_server/protocol/jsoncheck.py): the compiled checker
and the pure fallback accept exactly the JSON texts of RFC 8259 in UTF-8, compared with orjson
and the standard parser on generated documents, mutations of them, random bytes and the known
edge cases (where orjson is stricter than the grammar, the difference is stated)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vibemq_server.protocol import jsoncheck
from vibemq_server.protocol.codec import validate_json
from vibemq_server.protocol.errors import ErrorCode, ProtocolError

Check = Callable[[bytes], bool]


def _compiled(payload: bytes) -> bool:
    from vibemq_server.protocol._jsoncheck import valid

    return valid(payload)


CHECKS: dict[str, Check] = {"compiled": _compiled, "pure": jsoncheck.valid_slow}


def _orjson(payload: bytes) -> bool:
    try:
        orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    return True


def test_the_compiled_checker_is_built() -> None:
    assert jsoncheck.COMPILED, "build it: pip install -e . or scripts/build_ext.sh"


#: Both accept; orjson too (the common cases).
VALID = [
    b"1",
    b" 1 \n\t\r",  # trailing and leading JSON whitespace
    b"-0",
    b"-0.5e+10",
    b'"a"',
    b"true",
    b"null",
    b"{}",
    b"[]",
    b'{"a" : [1, 2, {"b": null}] , "c": "\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9"}',
    b"123456789012345678901234567890",  # a big integer: the grammar has no bound
    '"\u00e9t\u00e9 \u20ac \U0001f600"'.encode(),
    b"[" * 1024 + b"]" * 1024,  # orjson's depth bound, reached
]

#: Valid JSON that orjson refuses: both checkers accept it (orjson's bounds are not the spec's).
VALID_ORJSON_REFUSES = [
    b"1e400",  # a number beyond a double: the grammar has no bound
    b'"\\ud800"',  # a lone surrogate escape: the grammar allows any \uXXXX
    b'"\\udc00\\ud800"',
    b"\xef\xbb\xbf{}",  # a UTF-8 byte order mark, which RFC 8259 8.1 lets a parser ignore
]

INVALID = [
    b" ",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"[1,]",
    b'{"a":1,}',
    b"01",
    b"1.",
    b".5",
    b"-",
    b"+1",
    b"1e",
    b"tru",
    b"true false",
    b"[1 2]",
    b"{1:2}",
    b"{'a':1}",
    b'"abc',
    b'"\\x"',
    b'"\\u12g4"',
    b'"\x01"',  # a raw control character in a string
    b"\x00",
    b'"\xed\xa0\x80"',  # a surrogate encoded in UTF-8 (the standard parser's surrogatepass)
    b'"\xc0\x80"',  # an overlong form
    b'"\xf4\x90\x80\x80"',  # above U+10FFFF
    b'"\xe2\x82"',  # a truncated sequence
    b'"\xff"',
    '"a"'.encode("utf-16"),  # UTF-16 (the standard parser's bytes detection takes it)
    b"[" * 1025 + b"]" * 1025,  # deeper than 1,024
    b"\xef\xbb\xbf",
    b"{}\x00",
]


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
@pytest.mark.parametrize("payload", VALID)
def test_valid(check: Check, payload: bytes) -> None:
    assert _orjson(payload)
    assert check(payload)


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
@pytest.mark.parametrize("payload", VALID_ORJSON_REFUSES)
def test_valid_json_orjson_refuses(check: Check, payload: bytes) -> None:
    assert not _orjson(payload)
    assert check(payload)


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
@pytest.mark.parametrize("payload", INVALID)
def test_invalid(check: Check, payload: bytes) -> None:
    assert not check(payload)


def test_validate_json_raises_invalid_payload() -> None:
    validate_json(b"")  # empty: no payload
    validate_json(b'{"a": 1}')
    with pytest.raises(ProtocolError) as caught:
        validate_json(b"{", "m1")
    assert caught.value.code is ErrorCode.INVALID_PAYLOAD
    assert caught.value.message_id == "m1"


def test_a_large_document_and_a_memoryview() -> None:
    doc = b"[" + b",".join([b'{"k": "v\\u00e9", "n": -1.5e3}'] * 200_000) + b"]"
    assert len(doc) > 4 * 1024 * 1024  # the off-loop size, checked without the GIL
    assert _compiled(doc)
    assert _compiled(doc[:-1]) is False
    from vibemq_server.protocol._jsoncheck import valid

    assert valid(memoryview(doc)[1:-1]) is False  # "{...}, {...}": not one value
    assert valid(memoryview(doc)[1:30])  # the first object alone


#: what may stop a string's vector-wide step, valid in a string or not
_STOPPERS = [
    b'\\"',
    b"\\u00e9",
    b"\xc3\xa9",
    b"\xf0\x9f\x98\x80",
    b"\x1f",
    b"\x7f",
    b"\xff",
    b"\xed\xa0\x80",
    b"\\",
]


def test_long_strings_with_a_stopper_at_every_offset() -> None:
    """The string's plain runs are skipped 256, 64, 16 or 8 bytes at a time: a special byte
    at every position of the first 530 (every lane of every step, twice, the scalar tail) and
    strings of every length around the steps' widths are judged as the pure checker judges
    them."""
    for length in (*range(0, 140), *range(250, 262), *range(508, 580), 1000):
        doc = b'"' + b"x" * length + b'"'
        assert _compiled(doc)
        assert _compiled(doc[:-1]) is False
    for stopper in _STOPPERS:
        for at in range(530):
            doc = b'["' + b"a" * at + stopper + b"b" * (560 - at) + b'", 1]'
            assert _compiled(doc) == jsoncheck.valid_slow(doc), (stopper, at)


def test_the_avx2_step_where_avx512_is_used() -> None:
    """``VIBEMQ_JSONCHECK_NO_AVX512``: the AVX2 step, so a CPU with AVX-512 VBMI (whose step
    the other tests run) checks the AVX2 one too, in a process of its own."""
    from vibemq_server.protocol import _jsoncheck

    if _jsoncheck.SIMD != "avx512vbmi":
        assert _jsoncheck.SIMD in ("avx2", "sse2", "swar")
        return  # (the tests above ran the step this CPU has)
    env = {**os.environ, "VIBEMQ_JSONCHECK_NO_AVX512": "1"}
    code = (
        "from vibemq_server.protocol import _jsoncheck as j; assert j.SIMD == 'avx2', j.SIMD; "
        f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
        "import test_jsoncheck as t; "
        "t.test_long_strings_with_a_stopper_at_every_offset(); "
        "t.test_long_strings_with_a_stopper_cut_around_it()"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


@st.composite
def json_texts(draw: st.DrawFn) -> bytes:
    value = draw(json_values)
    indent = draw(st.sampled_from([None, 0, 2]))
    ascii_only = draw(st.booleans())
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    pad = draw(st.sampled_from(["", " ", "\n", " \t\r\n "]))
    return (pad + text + pad).encode()


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_texts())
def test_generated_documents_are_accepted(doc: bytes) -> None:
    assert _orjson(doc)
    assert _compiled(doc)
    assert jsoncheck.valid_slow(doc)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_texts(), st.data())
def test_mutated_documents_agree_with_the_reference(doc: bytes, data: st.DataObject) -> None:
    """A byte deleted, inserted or replaced: the compiled checker says what the pure one
    (orjson, then the standard parser on strict UTF-8) says, and accepts all orjson accepts."""
    where = data.draw(st.integers(min_value=0, max_value=len(doc)))
    byte = bytes([data.draw(st.integers(min_value=0, max_value=255))])
    how = data.draw(st.sampled_from(["delete", "insert", "replace"]))
    if how == "delete":
        doc = doc[:where] + doc[where + 1 :]
    elif how == "insert":
        doc = doc[:where] + byte + doc[where:]
    else:
        doc = doc[:where] + byte + doc[where + 1 :]
    compiled = _compiled(doc)
    assert compiled == jsoncheck.valid_slow(doc)
    if _orjson(doc):
        assert compiled


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_agree_with_the_reference(raw: bytes) -> None:
    compiled = _compiled(raw)
    assert compiled == jsoncheck.valid_slow(raw)
    if _orjson(raw):
        assert compiled


# -- the check fed in parts (jsoncheck.checker: a payload checked read by read) ----------------


def _compiled_checker() -> jsoncheck.Resumable:
    from vibemq_server.protocol._jsoncheck import Checker

    return Checker()


CHECKERS: dict[str, Callable[[], jsoncheck.Resumable]] = {
    "compiled": _compiled_checker,
    "pure": jsoncheck.PureChecker,
}


def _fed(make: Callable[[], jsoncheck.Resumable], doc: bytes, cuts: list[int]) -> bool:
    """``doc`` fed to a new checker in the parts ``cuts`` make (any order, repeats: empty
    parts), then finished."""
    check = make()
    start = 0
    for cut in [*sorted(cuts), len(doc)]:
        check.feed(doc, start, cut)
        start = cut
    return check.finish()


_EDGE_CASES = [*VALID, *VALID_ORJSON_REFUSES, *INVALID[:-2], INVALID[-1]]  # (not 1,025 deep)


@pytest.mark.parametrize("make", CHECKERS.values(), ids=CHECKERS.keys())
def test_every_cut_of_the_edge_cases_gives_the_whole_answer(
    make: Callable[[], jsoncheck.Resumable],
) -> None:
    """Every cut point, every pair of cut points up to 8 bytes apart, and a byte at a time:
    inside a byte order mark, an escape, \\uXXXX, a UTF-8 sequence, a number, a literal."""
    for doc in _EDGE_CASES:
        whole = _compiled(doc)
        if len(doc) > 64:
            doc_cuts = [[at] for at in range(len(doc) + 1)]
        else:
            doc_cuts = [[i, j] for i in range(len(doc) + 1) for j in range(i, len(doc) + 1)]
        for cuts in doc_cuts:
            assert _fed(make, doc, cuts) == whole, (doc, cuts)
        assert _fed(make, doc, list(range(len(doc)))) == whole, doc


def test_the_nesting_bound_cut_anywhere() -> None:
    for depth, whole in ((1024, True), (1025, False)):
        doc = b"[" * depth + b"]" * depth
        for at in (0, 1, depth - 1, depth, depth + 1, 2 * depth - 1):
            assert _fed(_compiled_checker, doc, [at]) is whole


def test_long_strings_with_a_stopper_cut_around_it() -> None:
    """A special byte at every lane of the vector-wide step, the text cut at and around it
    (an escape or a UTF-8 sequence split over two parts, or whole at the part's end)."""
    for stopper in _STOPPERS:
        for at in (*range(0, 130, 7), *range(250, 262), *range(315, 325), 511, 512, 513):
            doc = b'["' + b"a" * at + stopper + b"b" * (560 - at) + b'", 1]'
            whole = _compiled(doc)
            for cut in range(at, at + 2 + len(stopper) + 8):
                assert _fed(_compiled_checker, doc, [cut]) == whole, (stopper, at, cut)


def test_a_part_as_a_buffer_and_what_feed_says() -> None:
    from vibemq_server.protocol._jsoncheck import Checker

    check = Checker()
    assert check.feed(memoryview(b'{"a": [1, ')) is True
    assert check.feed(bytearray(b"2.5e3]}")) is True
    assert check.finish() is True
    check = Checker()
    assert check.feed(b"[1, x", 0, 5) is False  # refused at the x: stays refused
    assert check.feed(b"]", 0, 1) is False
    assert check.finish() is False
    with pytest.raises(ValueError):
        Checker().feed(b"[]", 1, 3)
    with pytest.raises(TypeError):
        Checker().feed(b"[]", 0)


def test_a_large_document_in_parts_without_the_gil() -> None:
    doc = b"[" + b",".join([b'{"k": "v\\u00e9", "n": -1.5e3}'] * 100_000) + b"]"
    cuts = list(range(0, len(doc), 256_000 - 7))
    assert _fed(_compiled_checker, doc, cuts) is True
    assert _fed(_compiled_checker, doc[:-1], cuts) is False


@st.composite
def mutated_texts(draw: st.DrawFn) -> bytes:
    """A generated JSON text with a byte deleted, inserted or replaced (or kept whole)."""
    doc = draw(json_texts())
    where = draw(st.integers(min_value=0, max_value=len(doc)))
    byte = bytes([draw(st.integers(min_value=0, max_value=255))])
    how = draw(st.sampled_from(["keep", "delete", "insert", "replace"]))
    if how == "delete":
        return doc[:where] + doc[where + 1 :]
    if how == "insert":
        return doc[:where] + byte + doc[where:]
    if how == "replace":
        return doc[:where] + byte + doc[where + 1 :]
    return doc


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(mutated_texts() | st.binary(max_size=64), st.data())
def test_any_cuts_give_the_whole_answer(doc: bytes, data: st.DataObject) -> None:
    """Valid or not, a text cut anywhere, in any number of parts: the compiled checker fed
    the parts says what ``valid`` says of the whole, and so does the pure one (C == pure)."""
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(doc)), max_size=6))
    whole = _compiled(doc)
    assert _fed(_compiled_checker, doc, cuts) == whole
    assert _fed(jsoncheck.PureChecker, doc, cuts) == whole
