"""Protocol-free routing of dot-separated addresses to keys subscribed by wildcard patterns.

An address such as ``sensors.room1.temp`` is a list of words split on ``.`` (words may be
empty: ``.a`` is ``["", "a"]``). A pattern is a tuple of words in which :data:`ONE` matches
exactly one word and :data:`MANY`, only allowed last, matches zero or more words; this is MQTT
3.1.1 filter matching transposed, including its rule that a pattern starting with a wildcard
does not match an address whose first word starts with ``$``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

# NUL never occurs in a real word, so a literal "+", "*" or "#" can never be taken for these.
ONE = "\x00+"
"""Pattern word matching exactly one address word (possibly empty)."""
MANY = "\x00#"
"""Pattern word matching zero or more address words; only valid as the last word."""

SEPARATOR = "."

K = TypeVar("K", bound=Hashable)

_EMPTY: Mapping[Any, int] = MappingProxyType({})


def _validate(pattern: tuple[str, ...]) -> None:
    if not pattern:
        raise ValueError("a pattern must have at least one word")
    for index, word in enumerate(pattern):
        if word == MANY and index != len(pattern) - 1:
            raise ValueError("MANY is only valid as the last word of a pattern")
        # A word holding the separator could never equal an address word: reject the silent no-op.
        if SEPARATOR in word:
            raise ValueError(f"pattern word {word!r} contains {SEPARATOR!r}")


def pattern_overlaps(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether at least one address matches both patterns.

    The ``$`` rule is ignored on purpose: callers use this for deny rules, where reporting an
    overlap that the ``$`` rule would prevent is the safe mistake.
    """
    _validate(a)
    _validate(b)
    for index in range(max(len(a), len(b))):
        x = a[index] if index < len(a) else None
        y = b[index] if index < len(b) else None
        # MANY absorbs whatever the other pattern still requires, including nothing at all.
        if x == MANY or y == MANY:
            return True
        if x is None or y is None:
            return False
        if x != y and x != ONE and y != ONE:
            return False
    return True


class _Node(Generic[K]):
    __slots__ = ("children", "keys")

    def __init__(self) -> None:
        self.children: dict[str, _Node[K]] = {}
        self.keys: dict[K, int] = {}


def _merge(result: dict[K, int], keys: dict[K, int]) -> None:
    # Most addresses match a single trie node, whose keys then need no max() at all.
    if not result:
        result.update(keys)
        return
    for key, level in keys.items():
        old = result.get(key)
        if old is None or level > old:
            result[key] = level


class TopicRouter(Generic[K]):
    """Keys subscribed to patterns, each with a level (such as a QoS), matched against addresses.

    Each ``(key, pattern)`` pair is one entry; :meth:`match` gives every key with a matching
    entry once, at the highest level among its matching entries.
    """

    def __init__(self, cache_size: int = 10_000) -> None:
        if cache_size < 0:
            raise ValueError("cache_size must not be negative")
        self._root: _Node[K] = _Node()
        self._by_key: dict[K, dict[tuple[str, ...], int]] = {}
        self._count = 0
        self._cache: dict[str, Mapping[K, int]] = {}
        self._cache_size = cache_size

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def add(self, key: K, pattern: tuple[str, ...], level: int) -> None:
        """Subscribe ``key`` to ``pattern`` at ``level``, replacing the level if already there."""
        _validate(pattern)
        patterns = self._by_key.setdefault(key, {})
        if patterns.get(pattern) == level:
            return
        node = self._root
        for word in pattern:
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node()
            node = child
        if key not in node.keys:
            self._count += 1
        node.keys[key] = level
        patterns[pattern] = level
        self._cache.clear()

    def remove(self, key: K, pattern: tuple[str, ...]) -> bool:
        """Unsubscribe ``key`` from ``pattern``; False if it was not subscribed."""
        patterns = self._by_key.get(key)
        if patterns is None or pattern not in patterns:
            return False
        del patterns[pattern]
        if not patterns:
            del self._by_key[key]
        self._remove_from_trie(key, pattern)
        self._cache.clear()
        return True

    def remove_key(self, key: K) -> int:
        """Unsubscribe ``key`` from all its patterns; returns how many there were."""
        patterns = self._by_key.pop(key, None)
        if not patterns:
            return 0
        for pattern in patterns:
            self._remove_from_trie(key, pattern)
        self._cache.clear()
        return len(patterns)

    def patterns_of(self, key: K) -> dict[tuple[str, ...], int]:
        """A copy of ``key``'s patterns and their levels."""
        return dict(self._by_key.get(key, {}))

    def match(self, address: str) -> Mapping[K, int]:
        """Every key with a pattern matching ``address``, at its highest matching level.

        The result is shared with the cache (and an empty result with every other empty one):
        callers must not mutate it.
        """
        cached = self._cache.get(address)
        if cached is not None:
            return cached
        if not self._count:
            return _EMPTY
        result = self._match(address)
        if self._cache_size:
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            self._cache[address] = result
        return result

    def _match(self, address: str) -> Mapping[K, int]:
        # Breadth-first over the words rather than recursive, so a topic with thousands of
        # levels cannot exhaust the stack. Each trie node is reached by one pattern prefix only,
        # so the frontier never holds duplicates.
        words = address.split(SEPARATOR)
        result: dict[K, int] = {}
        first = words[0]
        children = self._root.children
        nodes: list[_Node[K]] = []
        child = children.get(first)
        if child is not None:
            nodes.append(child)
        if not first.startswith("$"):
            many = children.get(MANY)
            if many is not None:
                _merge(result, many.keys)
            one = children.get(ONE)
            if one is not None:
                nodes.append(one)
        for index in range(1, len(words)):
            if not nodes:
                return result or _EMPTY
            word = words[index]
            following: list[_Node[K]] = []
            for node in nodes:
                children = node.children
                if not children:
                    continue
                many = children.get(MANY)
                if many is not None:
                    _merge(result, many.keys)
                child = children.get(word)
                if child is not None:
                    following.append(child)
                one = children.get(ONE)
                if one is not None:
                    following.append(one)
            nodes = following
        for node in nodes:
            if node.keys:
                _merge(result, node.keys)
            # MANY also matches zero words: "a.#" matches "a" itself.
            many = node.children.get(MANY)
            if many is not None:
                _merge(result, many.keys)
        return result or _EMPTY

    def _remove_from_trie(self, key: K, pattern: tuple[str, ...]) -> None:
        path: list[tuple[_Node[K], str]] = []
        node = self._root
        for word in pattern:
            path.append((node, word))
            node = node.children[word]
        del node.keys[key]
        self._count -= 1
        # Prune bottom-up so that dead branches cost nothing to future matches.
        for parent, word in reversed(path):
            child = parent.children[word]
            if child.keys or child.children:
                break
            del parent.children[word]
