"""MQTT topic names and topic filters: validation, matching and the VibeMQ address mapping.

Rules (MQTT 3.1.1 section 4.7, which 3.1 brokers follow in practice):

* Topic names and filters are 1..65,535 bytes of UTF-8 without U+0000; levels are separated
  by ``/`` and may be empty (``/a``, ``a//b`` and ``a/`` are all distinct, valid topics).
* A topic *name* (PUBLISH, will topic) contains no wildcard at all.
* In a topic *filter*, ``+`` must occupy a whole level and matches exactly one level (possibly
  empty); ``#`` must be the whole last level and matches the parent level and any number of
  levels below it (``a/#`` matches ``a``, ``a/`` and ``a/b/c``).
* Topics starting with ``$`` (such as ``$SYS/...``) are not matched by a filter whose first
  level is a wildcard: ``#`` and ``+/x`` do not match ``$SYS/x``, ``$SYS/#`` does.

Address mapping (as RabbitMQ's MQTT plugin does): the MQTT topic ``a/b/c`` is the broker address
``a.b.c``, and a ``.`` inside an MQTT level becomes ``/`` in the address (the two separators
swap), so every topic has exactly one address and back. Routing works on any address; a
VibeMQ queue can only be named by an address that is a valid queue name (1..256 of
``[A-Za-z0-9_.-]``), so only such topics reach VibeMQ queues. Filters map level by level to
the core router's patterns, ``+`` to :data:`ONE` and ``#`` to :data:`MANY`.
"""

from __future__ import annotations

from vibemq_server.core.topics import MANY, ONE
from vibemq_server.protocol.names import valid_queue_name

MAX_TOPIC_BYTES = 65_535
LEVEL_SEPARATOR = "/"
SINGLE_LEVEL_WILDCARD = "+"
MULTI_LEVEL_WILDCARD = "#"
ADDRESS_SEPARATOR = "."


class InvalidTopicError(ValueError):
    """A topic name or filter breaks the MQTT rules; the message says which."""


def _common_error(text: str, kind: str) -> str | None:
    if not text:
        return f"{kind} must not be empty"
    if "\x00" in text:
        return f"{kind} must not contain U+0000"
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return f"{kind} is not valid UTF-8 (lone surrogate)"
    if size > MAX_TOPIC_BYTES:
        return f"{kind} is {size} bytes, more than {MAX_TOPIC_BYTES}"
    return None


def topic_name_error(name: str) -> str | None:
    """Why ``name`` is not a valid topic name, or None if it is."""
    error = _common_error(name, "topic name")
    if error is not None:
        return error
    if SINGLE_LEVEL_WILDCARD in name or MULTI_LEVEL_WILDCARD in name:
        return "topic name must not contain the wildcards '+' or '#'"
    return None


def topic_filter_error(topic_filter: str) -> str | None:
    """Why ``topic_filter`` is not a valid topic filter, or None if it is."""
    error = _common_error(topic_filter, "topic filter")
    if error is not None:
        return error
    levels = topic_filter.split(LEVEL_SEPARATOR)
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if MULTI_LEVEL_WILDCARD in level and (level != MULTI_LEVEL_WILDCARD or index != last):
            return "'#' must be a whole level and the last one"
        if SINGLE_LEVEL_WILDCARD in level and level != SINGLE_LEVEL_WILDCARD:
            return "'+' must be a whole level"
    return None


def is_valid_topic_name(name: str) -> bool:
    return topic_name_error(name) is None


def is_valid_topic_filter(topic_filter: str) -> bool:
    return topic_filter_error(topic_filter) is None


def validate_topic_name(name: str) -> None:
    """Raise :class:`InvalidTopicError` unless ``name`` is a valid topic name."""
    error = topic_name_error(name)
    if error is not None:
        raise InvalidTopicError(error)


def validate_topic_filter(topic_filter: str) -> None:
    """Raise :class:`InvalidTopicError` unless ``topic_filter`` is a valid topic filter."""
    error = topic_filter_error(topic_filter)
    if error is not None:
        raise InvalidTopicError(error)


def matches(topic_filter: str, topic: str) -> bool:
    """Whether the topic name ``topic`` matches ``topic_filter``.

    Both arguments must be valid (see :func:`validate_topic_filter` and
    :func:`validate_topic_name`); this function is the hot path of delivery and does not
    re-check them. With invalid input the result is unspecified but no exception is raised.
    """
    if topic.startswith("$") and topic_filter[:1] in (SINGLE_LEVEL_WILDCARD, MULTI_LEVEL_WILDCARD):
        return False
    filter_levels = topic_filter.split(LEVEL_SEPARATOR)
    topic_levels = topic.split(LEVEL_SEPARATOR)
    for index, level in enumerate(filter_levels):
        if level == MULTI_LEVEL_WILDCARD:
            # "a/#" covers "a" itself as well as everything below it.
            return True
        if index >= len(topic_levels):
            return False
        if level != SINGLE_LEVEL_WILDCARD and level != topic_levels[index]:
            return False
    return len(filter_levels) == len(topic_levels)


_SWAP = str.maketrans({"/": ".", ".": "/"})


def _swap(text: str) -> str:
    """``/`` <-> ``.``. str.translate with a table costs some 1.2 us even for a short ASCII
    string (a dict lookup per character); a topic without dots, the usual case, needs only
    one ``replace`` (60 ns), and every publish converts its topic once or twice."""
    if "." in text:
        return text.translate(_SWAP)
    return text.replace("/", ".")


def topic_to_address(topic: str) -> str:
    """The broker address of a topic name: ``a/b/c`` -> ``a.b.c``, ``v1.0/x`` -> ``v1/0.x``."""
    return _swap(topic)


def address_to_topic(address: str) -> str:
    """The MQTT topic name of a broker address (the inverse of :func:`topic_to_address`)."""
    return address.translate(_SWAP) if "/" in address else address.replace(".", "/")


def queue_address(topic: str) -> str | None:
    """The VibeMQ queue a topic's publishes also reach, None when its address cannot name one."""
    address = _swap(topic)
    return address if valid_queue_name(address) else None


_PATTERN_WORDS = {SINGLE_LEVEL_WILDCARD: ONE, MULTI_LEVEL_WILDCARD: MANY}


def filter_to_pattern(topic_filter: str) -> tuple[str, ...]:
    """The router pattern of a valid topic filter: ``a/+/#`` -> ``("a", ONE, MANY)``."""
    return tuple(
        _PATTERN_WORDS.get(level) or level.replace(ADDRESS_SEPARATOR, LEVEL_SEPARATOR)
        for level in topic_filter.split(LEVEL_SEPARATOR)
    )
