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
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Final

import orjson

_valid: Callable[[bytes], bool] | None
try:
    from vibemq_server.protocol._jsoncheck import valid as _compiled

    _valid = _compiled
except ImportError:  # not built: orjson and the standard parser
    _valid = None

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
