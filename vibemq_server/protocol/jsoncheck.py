"""Is a payload one UTF-8 JSON text? The native protocol's payload check, without building objects.

:mod:`vibemq_server.protocol._jsoncheck` (C, built with the package, optional) checks the
RFC 8259 grammar and strict UTF-8 in one pass at memory speed, and releases the GIL for large
inputs: a session checks a payload of :data:`OFFLOAD_FROM` bytes or more in a worker thread
while the loop serves the other connections (docs/performance.md, issue 16). Without it the
check is orjson's parse, with the standard parser deciding what orjson refuses.

What is accepted (both ways alike, tests/unit/test_jsoncheck.py): any JSON value at the top,
surrounded by JSON whitespace; numbers of any size and exponent; ``\\uXXXX`` escapes of any code
unit, lone surrogates too (the grammar allows them); a leading UTF-8 byte order mark (RFC 8259
8.1 lets a parser ignore it). Refused: NaN/Infinity, invalid UTF-8 (encoded surrogates, overlong
forms), control characters in strings, and nesting deeper than 1,024 (orjson's bound).

:func:`checker` is the same check fed in parts (a payload filled read by read): the compiled
``Checker`` carries its state across a part's edge (inside a string, an escape, a number, a
UTF-8 sequence ...), so each part is checked while it is still in cache and ``finish`` only
says what the state means; :class:`PureChecker` keeps the parts and checks their join.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Final, Protocol

import orjson

from vibemq_server.protocol.held import Buffer


class Resumable(Protocol):
    """A JSON text checked in parts: ``feed`` each (bytes ``start:stop`` of ``data``),
    ``finish`` says whether all of them make one UTF-8 JSON text (what ``valid`` says of
    their join, however the text was cut)."""

    def feed(self, data: Buffer, start: int, stop: int, /) -> bool: ...

    def finish(self) -> bool: ...


_valid: Callable[[bytes], bool] | None
_checker: Callable[[], Resumable] | None
try:
    from vibemq_server.protocol._jsoncheck import Checker as _compiled_checker
    from vibemq_server.protocol._jsoncheck import valid as _compiled

    _valid = _compiled
    _checker = _compiled_checker
except ImportError:  # not built: orjson and the standard parser
    _valid = None
    _checker = None

#: Whether the compiled checker is built (it releases the GIL: worth a worker thread).
COMPILED: Final = _valid is not None
#: From this size a session checks a payload off the loop (when ``COMPILED``): 4 MiB take
#: about 2 ms here, longer than a ping should wait, and the thread hop costs ~50 us.
OFFLOAD_FROM: Final = 4 * 1024 * 1024
#: orjson's nesting bound, which the standard parser does not have.
MAX_DEPTH: Final = 1024


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _depth_within(text: str) -> bool:
    """The standard parser recurses: bound the nesting as orjson and the C checker do.
    (An upper bound: brackets inside strings count as well; only said after it accepted.)"""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest <= MAX_DEPTH


def valid_slow(payload: bytes) -> bool:
    """The check without the C extension: orjson, then the standard parser for what orjson
    refuses but the grammar allows (huge numbers, lone surrogate escapes, a byte order mark)."""
    try:
        orjson.loads(payload)
        return True
    except orjson.JSONDecodeError:
        pass
    try:
        text = payload.decode("utf-8")  # strict: no encoded surrogates, no UTF-16
    except UnicodeDecodeError:
        return False
    text = text.removeprefix("\ufeff")
    try:
        json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return False
    return _depth_within(text)


def valid(payload: bytes) -> bool:
    """Whether ``payload`` is one UTF-8 JSON text (RFC 8259)."""
    if _valid is not None:
        return _valid(payload)
    return valid_slow(payload)


class PureChecker:
    """Without the extension: the parts kept (copied) and their join checked by ``finish``
    with :func:`valid_slow` (the same answers as the compiled ``Checker`` of the whole)."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def feed(self, data: Buffer, start: int, stop: int, /) -> bool:
        with memoryview(data) as view:
            self._parts.append(bytes(view[start:stop]))
        return True

    def finish(self) -> bool:
        return valid_slow(b"".join(self._parts))


def checker() -> Resumable:
    """A new check fed in parts (the compiled one when built)."""
    return _checker() if _checker is not None else PureChecker()
