"""What the MQTT session (session.py) needs that mypyc cannot compile: the shared empty
containers an idle session starts with, guarded (classes inheriting builtin containers), and
the runtime-checkable ``OperatorClose``. Their own module, left interpreted: session.py is in
the compiled build's ``HOT_MODULES``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol, runtime_checkable


class NoIds(set[int]):
    """The empty packet-id set every session starts with, shared: an idle session allocates
    no set (216 bytes each) until it has ids to keep (``_ids``). Adding to it is a bug."""

    __slots__ = ()

    def add(self, item: int) -> None:
        raise AssertionError("the shared empty set: replace it before adding (_ids)")


class NoItems(deque[Any]):
    """The empty deque every session starts with, shared (a deque is 760 bytes even empty):
    replaced by its own before the first append (``_items``). Appending to it is a bug."""

    __slots__ = ()

    def append(self, item: Any) -> None:
        raise AssertionError("the shared empty deque: replace it before appending (_items)")


class NoEntries(dict[Any, Any]):
    """The empty dict every session's maps start as, shared: replaced by its own before
    the first entry (``own``). Adding to it is a bug."""

    __slots__ = ()

    def __setitem__(self, key: Any, value: Any) -> None:
        raise AssertionError("the shared empty dict: replace it before adding (own)")

    def setdefault(self, key: Any, default: Any = None) -> Any:
        raise AssertionError("the shared empty dict: replace it before adding (own)")


@runtime_checkable
class OperatorClose(Protocol):
    """A connection an operator can close (``StreamTransport``, through the management API)."""

    def close_by_operator(self, reason: str) -> None: ...
