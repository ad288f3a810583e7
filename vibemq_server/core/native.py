"""mypyc's class attributes, without needing mypy at run time.

``mypyc_attr`` is mypy_extensions' (mypyc reads it while compiling); a pure-Python install
has no mypy_extensions (only a compiled build needs mypy), so there it is a decorator that
changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr as mypyc_attr
except ImportError:  # pragma: no cover (the test environment has mypy)

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_T], _T]:
        return lambda cls: cls
