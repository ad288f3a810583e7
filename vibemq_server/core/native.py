"""mypyc's class attributes and native int type, without needing mypy at run time.

``mypyc_attr`` is mypy_extensions' (mypyc reads it while compiling); a pure-Python install
has no mypy_extensions (only a compiled build needs mypy), so there it is a decorator that
changes nothing. ``i64`` likewise: compiled, a 64-bit int kept unboxed in a field (a plain
``int`` there is a pointer to an object once it needs more than 62 bits, as a hash does);
interpreted, ``int``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr as mypyc_attr
except ImportError:  # pragma: no cover (the test environment has mypy)

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_T], _T]:
        return lambda cls: cls


if TYPE_CHECKING:
    from mypy_extensions import i64 as i64
else:
    try:
        from mypy_extensions import i64
    except ImportError:  # pragma: no cover (the test environment has mypy)
        i64 = int
