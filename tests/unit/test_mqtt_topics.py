"""MQTT topic names and filters: validation, matching (spec examples + a reference model) and the
``a/b/c`` <-> ``a.b.c`` address mapping."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vibemq_server.adapters.mqtt import (
    InvalidTopicError,
    address_to_topic,
    filter_to_pattern,
    is_valid_topic_filter,
    is_valid_topic_name,
    matches,
    queue_address,
    topic_to_address,
    validate_topic_filter,
    validate_topic_name,
)
from vibemq_server.core.topics import MANY, ONE, TopicRouter
from vibemq_server.protocol.names import valid_queue_name

# --------------------------------------------------------------------------------------------
# Validation

VALID_NAMES = ["a", "/", "a/b/c", "/a", "a/", "a//b", "$SYS/broker", "é/€", " ", "x" * 65_535]
INVALID_NAMES = ["", "a/+", "+", "#", "a/#", "a+b", "a#", "a\x00b", "x" * 65_536, "é" * 32_768]

VALID_FILTERS = [
    "#",
    "+",
    "a/#",
    "a/+",
    "+/+",
    "/+",
    "+/",
    "a/+/c/#",
    "sport/tennis/player1/#",
    "$SYS/#",
    "a//b",
    "/",
    "a/b",
]
INVALID_FILTERS = ["", "a#", "a/#/b", "#/a", "##", "a/b#", "a+", "+a", "a/++/b", "a\x00", "x/\x00"]


@pytest.mark.parametrize("name", VALID_NAMES)
def test_valid_topic_names(name: str) -> None:
    assert is_valid_topic_name(name)
    validate_topic_name(name)


@pytest.mark.parametrize("name", INVALID_NAMES)
def test_invalid_topic_names(name: str) -> None:
    assert not is_valid_topic_name(name)
    with pytest.raises(InvalidTopicError):
        validate_topic_name(name)


@pytest.mark.parametrize("topic_filter", VALID_FILTERS)
def test_valid_topic_filters(topic_filter: str) -> None:
    assert is_valid_topic_filter(topic_filter)
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize("topic_filter", INVALID_FILTERS)
def test_invalid_topic_filters(topic_filter: str) -> None:
    assert not is_valid_topic_filter(topic_filter)
    with pytest.raises(InvalidTopicError):
        validate_topic_filter(topic_filter)


def test_lone_surrogate_is_invalid_not_a_crash() -> None:
    assert not is_valid_topic_name("a\ud800")
    assert not is_valid_topic_filter("a\ud800")


def test_invalid_topic_error_is_a_value_error_with_a_reason() -> None:
    with pytest.raises(ValueError, match="wildcard"):
        validate_topic_name("a/+")


# --------------------------------------------------------------------------------------------
# Matching

MATCHES = [
    # 3.1.1 section 4.7.1.2: "sport/tennis/player1/#"
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("sport/#", "sport/", True),
    ("sport/#", "sports", False),
    ("#", "a", True),
    ("#", "/", True),
    ("#", "a/b/c", True),
    # 4.7.1.3: "sport/tennis/+"
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+", "a", True),
    ("+/tennis/#", "sport/tennis/player1", True),
    ("+/tennis/#", "sport/tennis", True),
    ("+/tennis/#", "sport/golf", False),
    # Literal levels are exact and case sensitive.
    ("a/b", "a/b", True),
    ("a/b", "A/b", False),
    ("a/b", "a/b/", False),
    ("a//b", "a//b", True),
    ("a/+/b", "a//b", True),
    ("a/b", "a/b/c", False),
    ("a/b/c", "a/b", False),
    # 4.7.2: $-topics and wildcards at the first level.
    ("#", "$SYS/broker/uptime", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$SYS/#", "$SYS", True),
    ("#", "a/$SYS", True),
    ("a/+", "a/$x", True),
    ("+", "$", False),
]


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), MATCHES)
def test_matches(topic_filter: str, topic: str, expected: bool) -> None:
    assert matches(topic_filter, topic) is expected


def _reference(topic_filter: str, topic: str) -> bool:
    """An independent model: the filter compiled to a regular expression."""
    if topic.startswith("$") and topic_filter[:1] in "+#":
        return False
    parts: list[str] = []
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        sep = "/" if index else ""
        if level == "#":
            # "a/#" also matches "a": the separator before '#' is optional with what follows.
            return (
                re.fullmatch("".join(parts) + ("(/.*)?" if index else ".*"), topic, re.S)
                is not None
            )
        parts.append(re.escape(sep) + ("[^/]*" if level == "+" else re.escape(level)))
    return re.fullmatch("".join(parts), topic, re.S) is not None


_small_level = st.text(st.sampled_from("ab$"), max_size=2)
_names = st.lists(_small_level, min_size=1, max_size=4).map("/".join).filter(bool)
_filters = st.builds(
    lambda levels, tail: "/".join([*levels, "#"] if tail else levels),
    st.lists(_small_level | st.just("+"), min_size=0, max_size=4),
    st.booleans(),
).filter(bool)


@given(_filters, _names)
@settings(max_examples=1000)
def test_matches_agrees_with_a_regex_model(topic_filter: str, topic: str) -> None:
    assert is_valid_topic_filter(topic_filter)
    assert is_valid_topic_name(topic)
    assert matches(topic_filter, topic) is _reference(topic_filter, topic)


@given(_names)
def test_every_topic_matches_itself_and_hash_matches_all_but_dollar(topic: str) -> None:
    assert matches(topic, topic)
    assert matches("#", topic) is not topic.startswith("$")
    # Replacing any one level by '+' still matches, except the first level of a $-topic.
    levels = topic.split("/")
    for index in range(len(levels)):
        wild = "/".join([*levels[:index], "+", *levels[index + 1 :]])
        assert matches(wild, topic) is not (index == 0 and topic.startswith("$"))


# --------------------------------------------------------------------------------------------
# Address mapping

MAPPINGS = [
    ("a/b/c", "a.b.c"),
    ("a", "a"),
    ("/a", ".a"),
    ("a/", "a."),
    ("a//b", "a..b"),
    ("/", "."),
    ("sensors/room-1/temp_c", "sensors.room-1.temp_c"),
    ("x" * 256, "x" * 256),
]


@pytest.mark.parametrize(("topic", "address"), MAPPINGS)
def test_topic_address_mapping(topic: str, address: str) -> None:
    assert topic_to_address(topic) == address
    assert address_to_topic(address) == topic


@pytest.mark.parametrize(
    ("topic", "address"),
    [
        ("a.b/c", "a/b.c"),  # '/' and '.' swap, as in RabbitMQ
        ("v1.0", "v1/0"),
        ("$SYS/broker", "$SYS.broker"),
        ("a b", "a b"),
        ("é/x", "é.x"),
    ],
)
def test_every_topic_has_an_address(topic: str, address: str) -> None:
    assert topic_to_address(topic) == address
    assert address_to_topic(address) == topic


@pytest.mark.parametrize(
    ("topic", "queue"),
    [("a/b", "a.b"), ("a.b/c", None), ("$SYS/x", None), ("a b", None), ("x" * 257, None)],
)
def test_only_topics_whose_address_is_a_queue_name_reach_queues(
    topic: str, queue: str | None
) -> None:
    assert queue_address(topic) == queue


@given(st.from_regex(r"[A-Za-z0-9_.\-]{1,256}", fullmatch=True))
def test_every_address_round_trips_through_a_valid_topic(address: str) -> None:
    topic = address_to_topic(address)
    assert is_valid_topic_name(topic)
    assert topic_to_address(topic) == address


@given(st.text(st.sampled_from("ab./-$+#"), min_size=1, max_size=10))
def test_topic_address_mapping_is_a_bijection(topic: str) -> None:
    if not is_valid_topic_name(topic):
        return
    address = topic_to_address(topic)
    assert address_to_topic(address) == topic
    if queue_address(topic) is not None:
        assert valid_queue_name(address)


@pytest.mark.parametrize(
    ("topic_filter", "pattern"),
    [
        ("a/+/#", ("a", ONE, MANY)),
        ("#", (MANY,)),
        ("+", (ONE,)),
        ("a/b", ("a", "b")),
        ("+/+", (ONE, ONE)),
        ("/+", ("", ONE)),
        ("a//#", ("a", "", MANY)),
        ("v1.0/+", ("v1/0", ONE)),
    ],
)
def test_filter_to_pattern(topic_filter: str, pattern: tuple[str, ...]) -> None:
    assert filter_to_pattern(topic_filter) == pattern


@given(st.text(st.sampled_from("ab./$"), min_size=1, max_size=8), st.data())
def test_router_patterns_agree_with_mqtt_matching(topic: str, data: st.DataObject) -> None:
    levels = topic.split("/")
    # A filter derived from the topic: some levels replaced by '+', maybe a '#' tail.
    chosen = [data.draw(st.sampled_from([lvl, "+"])) for lvl in levels]
    cut = data.draw(st.integers(0, len(chosen)))
    topic_filter = "/".join([*chosen[:cut], "#"] if data.draw(st.booleans()) else chosen)
    router: TopicRouter[str] = TopicRouter()
    router.add("s", filter_to_pattern(topic_filter), 1)
    assert ("s" in router.match(topic_to_address(topic))) == matches(topic_filter, topic)
