"""Exchanges and bindings (vibemq_server/core/exchanges.py): every routing rule and error,
property tests of topic routing and of bind/unbind bookkeeping against brute-force models, and
recovery of durable exchanges and bindings through a real Journal."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from waits import durable

from vibemq_server.config import QueueDefaults
from vibemq_server.core import CoreError, ManualClock, QueueManager, QueueNotFound
from vibemq_server.core.exchanges import (
    BINDINGS_TABLE,
    EXCHANGE,
    EXCHANGES_TABLE,
    PREDECLARED,
    QUEUE,
    Binding,
    ExchangeAccessRefused,
    ExchangeInUse,
    ExchangeMismatch,
    ExchangeNotFound,
    Exchanges,
    ExchangeType,
    InvalidArguments,
    InvalidExchangeType,
    binding_key,
    canonical_arguments,
    decode_arguments,
    tokens_match,
    topic_tokens,
)
from vibemq_server.core.table import DurableTable
from vibemq_server.journal.journal import Journal

pytestmark = pytest.mark.timeout(60)


def setup(*queues: str, durable: bool = False) -> tuple[QueueManager, Exchanges]:
    mgr = QueueManager(QueueDefaults(), ManualClock())
    for name in queues:
        mgr.create_queue(name, mgr.options_from({"durable": durable}))
    return mgr, Exchanges(mgr)


@pytest.fixture
def ex() -> Exchanges:
    return setup("q1", "q2", "q3")[1]


# -- declare ---------------------------------------------------------------------------------


def test_predeclared_exchanges() -> None:
    _, ex = setup()
    for name, kind in PREDECLARED:
        exchange = ex.get(name)
        assert exchange is not None
        assert (exchange.type, exchange.durable, exchange.auto_delete, exchange.internal) == (
            kind,
            True,
            False,
            False,
        )
    assert {name for name, _ in PREDECLARED} == {
        "",
        "amq.direct",
        "amq.fanout",
        "amq.topic",
        "amq.headers",
        "amq.match",
    }
    assert ex.get("nope") is None
    assert ex.bindings() == []


def test_declare_and_redeclare(ex: Exchanges) -> None:
    made = ex.declare("logs", "topic", durable=True, arguments={"k": "v"})
    assert made.type is ExchangeType.TOPIC and made.durable and made.arguments == {"k": "v"}
    assert ex.get("logs") is made
    # Equivalent again (other arguments than alternate-exchange do not count, as in RabbitMQ).
    assert ex.declare("logs", ExchangeType.TOPIC, durable=True, arguments={"k": "w"}) is made
    assert ex.declare("logs", "", passive=True) is made  # passive ignores the type


@pytest.mark.parametrize(
    ("changes", "what"),
    [
        ({"type": "direct"}, "type"),
        ({"durable": False}, "durable"),
        ({"auto_delete": True}, "auto_delete"),
        ({"internal": True}, "internal"),
        ({"arguments": {"alternate-exchange": "other"}}, "alternate-exchange"),
    ],
)
def test_redeclare_mismatch(ex: Exchanges, changes: dict[str, Any], what: str) -> None:
    ex.declare("x", "fanout", durable=True, arguments={"alternate-exchange": "ae"})
    kw: dict[str, Any] = {
        "type": "fanout",
        "durable": True,
        "arguments": {"alternate-exchange": "ae"},
    }
    kw.update(changes)
    with pytest.raises(ExchangeMismatch, match=what):
        ex.declare("x", **kw)
    kept = ex.get("x")
    assert kept is not None and kept.type is ExchangeType.FANOUT


def test_declare_errors(ex: Exchanges) -> None:
    with pytest.raises(ExchangeNotFound):
        ex.declare("absent", "direct", passive=True)
    with pytest.raises(InvalidExchangeType) as info:
        ex.declare("x", "x-consistent-hash")
    assert isinstance(info.value, CoreError) and isinstance(info.value, ValueError)
    assert ex.get("x") is None
    # The type is checked before anything else, even for an existing exchange.
    with pytest.raises(InvalidExchangeType):
        ex.declare("amq.direct", "bogus")
    for passive in (False, True):
        with pytest.raises(ExchangeAccessRefused):
            ex.declare("", "direct", passive=passive)
    with pytest.raises(ExchangeAccessRefused):
        ex.declare("amq.custom", "direct")
    with pytest.raises(ExchangeNotFound):
        ex.declare("amq.custom", "direct", passive=True)
    with pytest.raises(InvalidArguments):
        ex.declare("y", "direct", arguments={"bad": object()})
    assert ex.get("y") is None


def test_system_exchanges_may_be_redeclared_equivalently(ex: Exchanges) -> None:
    topic = ex.get("amq.topic")
    assert ex.declare("amq.topic", "topic", durable=True) is topic
    assert ex.declare("amq.topic", "fanout", passive=True) is topic
    with pytest.raises(ExchangeMismatch) as info:
        ex.declare("amq.topic", "topic", durable=False)
    assert str(info.value) == (
        "inequivalent arg 'durable' for exchange 'amq.topic' in vhost '/': "
        "received 'false' but current is 'true'"
    )
    with pytest.raises(ExchangeMismatch, match="received 'fanout' but current is 'topic'"):
        ex.declare("amq.topic", "fanout", durable=True)


# -- delete ----------------------------------------------------------------------------------


def test_delete(ex: Exchanges) -> None:
    with pytest.raises(ExchangeNotFound):
        ex.delete("absent")
    for name in ("", "amq.direct", "amq.anything"):
        with pytest.raises(ExchangeAccessRefused):
            ex.delete(name)
    ex.declare("x", "direct")
    ex.bind_queue("q1", "x", "k")
    assert ex.has_bindings("x")
    with pytest.raises(ExchangeInUse):
        ex.delete("x", if_unused=True)
    ex.delete("x")
    assert ex.get("x") is None and not ex.has_bindings("x") and ex.bindings() == []
    with pytest.raises(ExchangeNotFound):
        ex.route("x", "k")
    ex.declare("y", "direct")
    ex.delete("y", if_unused=True)
    assert ex.get("y") is None


def test_delete_drops_bindings_as_source_and_destination(ex: Exchanges) -> None:
    ex.declare("mid", "fanout")
    ex.bind_exchange("mid", "amq.direct", "k")
    ex.bind_queue("q1", "mid", "")
    ex.bind_queue("q2", "amq.direct", "k")
    assert ex.route("amq.direct", "k") == ["q1", "q2"]
    # if-unused looks at bindings as source only: being a destination does not count.
    ex.unbind_queue("q1", "mid", "")
    ex.delete("mid", if_unused=True)
    assert ex.bindings() == [Binding("amq.direct", QUEUE, "q2", "k", "{}")]
    assert ex.route("amq.direct", "k") == ["q2"]


# -- bind / unbind ---------------------------------------------------------------------------


def test_bind_errors(ex: Exchanges) -> None:
    with pytest.raises(ExchangeNotFound):
        ex.bind_queue("q1", "absent", "k")
    with pytest.raises(QueueNotFound):
        ex.bind_queue("absent", "amq.direct", "k")
    with pytest.raises(ExchangeAccessRefused):
        ex.bind_queue("q1", "", "q1")
    with pytest.raises(ExchangeAccessRefused):
        ex.unbind_queue("q1", "", "q1")
    with pytest.raises(ExchangeAccessRefused):
        ex.bind_exchange("", "amq.direct", "k")
    with pytest.raises(ExchangeAccessRefused):
        ex.bind_exchange("amq.direct", "", "k")
    with pytest.raises(ExchangeNotFound):
        ex.bind_exchange("absent", "amq.direct", "k")
    with pytest.raises(ExchangeNotFound):
        ex.bind_exchange("amq.direct", "absent", "k")
    # Unbinding is idempotent, missing ends included (RabbitMQ 3.10 answers unbind-ok).
    ex.unbind_queue("q1", "absent", "k")
    ex.unbind_queue("absent", "amq.direct", "k")
    ex.unbind_exchange("absent", "amq.direct", "k")
    ex.unbind_exchange("amq.direct", "absent", "k")
    with pytest.raises(InvalidArguments):
        ex.bind_queue("q1", "amq.direct", "k", {"v": object()})
    assert ex.bindings() == []


def test_bind_is_idempotent_and_unbind_lenient(ex: Exchanges) -> None:
    ex.bind_queue("q1", "amq.direct", "k", {"a": 1, "b": "x"})
    ex.bind_queue("q1", "amq.direct", "k", {"b": "x", "a": 1})  # same table, other order
    assert len(ex.bindings()) == 1
    ex.bind_queue("q1", "amq.direct", "k", {"a": 2})  # other arguments: another binding
    assert len(ex.bindings()) == 2
    ex.unbind_queue("q1", "amq.direct", "other")  # not bound: fine
    ex.unbind_queue("q1", "amq.direct", "k")  # no arguments: not bound either
    assert len(ex.bindings()) == 2
    assert ex.route("amq.direct", "k") == ["q1"]
    ex.unbind_queue("q1", "amq.direct", "k", {"a": 1, "b": "x"})
    assert ex.route("amq.direct", "k") == ["q1"]  # still bound by the other one
    ex.unbind_queue("q1", "amq.direct", "k", {"a": 2})
    assert ex.route("amq.direct", "k") == [] and not ex.has_bindings("amq.direct")


def test_bindings_listing(ex: Exchanges) -> None:
    ex.declare("x", "topic")
    ex.bind_queue("q2", "x", "a.*", {"z": b"\x00", "a": [1, "two"]})
    ex.bind_exchange("x", "amq.fanout", "ignored")
    first, second = ex.bindings()
    assert (first.source, first.dest_kind, first.destination, first.routing_key) == (
        "x",
        QUEUE,
        "q2",
        "a.*",
    )
    assert first.argument_table == {"z": b"\x00", "a": [1, "two"]}
    assert second == Binding("amq.fanout", EXCHANGE, "x", "ignored", "{}")
    assert ex.has_bindings("x") and ex.has_bindings("amq.fanout")
    assert not ex.has_bindings("amq.topic") and not ex.has_bindings("") and not ex.has_bindings("?")


# -- routing: default, direct, fanout --------------------------------------------------------


def test_route_to_missing_exchange(ex: Exchanges) -> None:
    with pytest.raises(ExchangeNotFound):
        ex.route("absent", "k")


def test_default_exchange(ex: Exchanges) -> None:
    mgr = ex.manager
    assert ex.route("", "q1") == ["q1"]
    assert ex.route("", "absent") == []
    # The broker's internal queues (its durable tables among them) are never reachable.
    assert EXCHANGES_TABLE in mgr.queues and ex.route("", EXCHANGES_TABLE) == []
    mgr.create_queue("$internal")
    assert ex.route("", "$internal") == []


def test_direct(ex: Exchanges) -> None:
    ex.bind_queue("q1", "amq.direct", "k")
    ex.bind_queue("q2", "amq.direct", "k")
    ex.bind_queue("q1", "amq.direct", "other")
    ex.bind_queue("q3", "amq.direct", "")
    assert ex.route("amq.direct", "k") == ["q1", "q2"]
    assert ex.route("amq.direct", "other") == ["q1"]
    assert ex.route("amq.direct", "") == ["q3"]
    assert ex.route("amq.direct", "K") == []
    assert ex.route("amq.direct", "k.x") == []
    assert ex.route("amq.direct", "*") == []


def test_fanout(ex: Exchanges) -> None:
    assert ex.route("amq.fanout", "k") == []
    ex.bind_queue("q2", "amq.fanout", "x")
    ex.bind_queue("q1", "amq.fanout", "y")
    ex.bind_queue("q1", "amq.fanout", "z")
    for key in ("", "x", "anything.at.all"):
        assert ex.route("amq.fanout", key) == ["q2", "q1"]
    ex.unbind_queue("q1", "amq.fanout", "y")
    assert ex.route("amq.fanout", "k") == ["q2", "q1"]
    ex.unbind_queue("q1", "amq.fanout", "z")
    assert ex.route("amq.fanout", "k") == ["q2"]


def test_route_skips_a_queue_deleted_behind_its_back(ex: Exchanges) -> None:
    ex.bind_queue("q1", "amq.fanout", "")
    ex.bind_queue("q2", "amq.fanout", "")
    ex.manager.delete_queue("q1")
    assert ex.route("amq.fanout", "") == ["q2"]
    ex.queue_deleted("q1")
    assert [b.destination for b in ex.bindings()] == ["q2"]


# -- routing: topic --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("binding", "key", "expected"),
    [
        ("a.b.c", "a.b.c", True),
        ("a.b.c", "a.b", False),
        ("a.b", "a.b.c", False),
        ("*.orange.*", "quick.orange.rabbit", True),
        ("*.orange.*", "quick.orange.male.rabbit", False),
        ("*.*.rabbit", "lazy.orange.rabbit", True),
        ("lazy.#", "lazy.orange.male.rabbit", True),
        ("lazy.#", "lazy", True),
        ("lazy.#", "lazyx", False),
        ("#", "", True),
        ("#", "a.b.c", True),
        ("#", ".", True),
        ("*", "", False),
        ("*", "a", True),
        ("*", "a.b", False),
        ("*", ".", False),
        ("", "", True),
        ("", "a", False),
        ("a", "", False),
        ("#.#", "a", True),
        ("#.#", "", True),
        ("a.#.#.b", "a.b", True),
        # "#" before the last word (beyond TopicRouter's patterns)
        ("#.error", "error", True),
        ("#.error", "app.db.error", True),
        ("#.error", "app.error.x", False),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a.x.y.c", False),
        ("#.*", "", False),
        ("#.*", "a.b", True),
        ("*.#.*", "a", False),
        ("*.#.*", "a.b", True),
        # empty words
        ("a.*.b", "a..b", True),
        ("a..b", "a..b", True),
        ("*", ".", False),
        ("*.*", ".", True),
        (".#", ".x", True),
        # no MQTT "$" rule: AMQP wildcards match "$" words like any other
        ("#", "$SYS.x", True),
        ("*.x", "$SYS.x", True),
        ("$SYS.#", "$SYS.x", True),
        # literal words that look like TopicRouter's sentinels
        ("a.\x00+", "a.b", False),
        ("a.\x00+", "a.\x00+", True),
        ("a.\x00#", "a.b.c", False),
        ("a.*", "a.\x00#", True),
        ("a.x*", "a.xy", False),
        ("a.x*", "a.x*", True),
    ],
)
def test_topic_rules(binding: str, key: str, expected: bool) -> None:
    _, ex = setup("q")
    ex.bind_queue("q", "amq.topic", binding)
    assert ex.route("amq.topic", key) == (["q"] if expected else [])
    assert reference_matches(binding, key) is expected
    assert tokens_match(topic_tokens(binding), key.split(".") if key else []) is expected


def test_topic_bookkeeping(ex: Exchanges) -> None:
    ex.bind_queue("q1", "amq.topic", "a.*")
    ex.bind_queue("q1", "amq.topic", "a.*", {"x": 1})  # same pattern, counted
    ex.bind_queue("q1", "amq.topic", "#.b")
    ex.bind_queue("q2", "amq.topic", "a.#")
    assert ex.route("amq.topic", "a.b") == ["q2", "q1"]
    assert ex.route("amq.topic", "a.b") == ["q2", "q1"]  # cached, same answer
    ex.unbind_queue("q1", "amq.topic", "a.*")
    assert sorted(ex.route("amq.topic", "a.b")) == ["q1", "q2"]
    ex.unbind_queue("q1", "amq.topic", "a.*", {"x": 1})
    assert sorted(ex.route("amq.topic", "a.b")) == ["q1", "q2"]  # "#.b" still
    ex.unbind_queue("q1", "amq.topic", "#.b")
    assert ex.route("amq.topic", "a.b") == ["q2"]
    assert ex.route("amq.topic", "x.b") == []


def reference_matches(binding: str, key: str) -> bool:
    """AMQP topic matching by plain recursion on the words."""

    def walk(pattern: list[str], words: list[str]) -> bool:
        if not pattern:
            return not words
        head, rest = pattern[0], pattern[1:]
        if head == "#":
            return walk(rest, words) or (bool(words) and walk(pattern, words[1:]))
        if not words:
            return False
        return (head == "*" or head == words[0]) and walk(rest, words[1:])

    return walk(binding.split(".") if binding else [], key.split(".") if key else [])


topic_words = st.sampled_from(["a", "b", "", "$x"])
binding_keys = st.lists(st.sampled_from(["a", "b", "", "*", "#", "$x"]), max_size=5).map(".".join)
routing_keys = st.lists(topic_words, max_size=5).map(".".join)


@settings(max_examples=300, deadline=None)
@given(
    bound=st.lists(st.tuples(st.integers(0, 3), binding_keys), max_size=10),
    dropped=st.sets(st.integers(0, 9)),
    probes=st.lists(routing_keys, min_size=1, max_size=10),
)
def test_topic_routing_matches_reference(
    bound: list[tuple[int, str]], dropped: set[int], probes: list[str]
) -> None:
    queues = [f"q{i}" for i in range(4)]
    _, ex = setup(*queues)
    ex.declare("t", "topic")
    for index, key in bound:
        ex.bind_queue(queues[index], "t", key)
    for probe in probes:  # warm the caches, which unbinding must clear
        ex.route("t", probe)
    live = list(bound)
    for position in sorted(dropped, reverse=True):
        if position < len(live):
            index, key = live.pop(position)
            if (index, key) not in live:
                ex.unbind_queue(queues[index], "t", key)
    live = list(dict.fromkeys(live))
    for probe in probes:
        expected = {queues[i] for i, key in live if reference_matches(key, probe)}
        got = ex.route("t", probe)
        assert len(got) == len(set(got)) and set(got) == expected, (live, probe)


# -- routing: headers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "headers", "expected"),
    [
        ({"a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
        ({"a": 1, "b": "x"}, {"a": 1}, False),
        ({"x-match": "all", "a": 1}, {"a": 2}, False),
        ({"x-match": "any", "a": 1, "b": "x"}, {"b": "x"}, True),
        ({"x-match": "any", "a": 1, "b": "x"}, {"a": 2, "b": "y"}, False),
        ({"x-match": b"any", "a": 1, "b": "x"}, {"b": "x"}, True),
        # no keys: "all" takes everything, "any" nothing
        ({}, {}, True),
        ({}, None, True),
        ({"x-match": "any"}, {"a": 1}, False),
        ({"a": 1}, None, False),
        # "x-" arguments are not compared, unless with "-with-x"
        ({"a": 1, "x-other": "v"}, {"a": 1}, True),
        ({"x-match": "any", "x-other": "v"}, {"x-other": "v"}, False),
        ({"x-match": "all-with-x", "a": 1, "x-other": "v"}, {"a": 1}, False),
        ({"x-match": "all-with-x", "a": 1, "x-other": "v"}, {"a": 1, "x-other": "v"}, True),
        ({"x-match": "any-with-x", "a": 1, "x-other": "v"}, {"x-other": "v"}, True),
        ({"x-match": "any-with-x", "a": 1, "x-other": "v"}, {"x-other": "w"}, False),
        # a void binding value asks only for presence
        ({"a": None}, {"a": "anything"}, True),
        ({"a": None}, {"a": None}, True),
        ({"a": None}, {"b": 1}, False),
        ({"a": 1}, {"a": None}, False),
        # equality within a type class: longstr and byte array alike, bool/int/float apart
        ({"a": "x"}, {"a": b"x"}, True),
        ({"a": b"x"}, {"a": bytearray(b"x")}, True),
        ({"a": "\u00e9"}, {"a": "\u00e9".encode()}, True),
        ({"a": 1}, {"a": True}, False),
        ({"a": True}, {"a": 1}, False),
        ({"a": 1}, {"a": 1.0}, False),
        ({"a": 1.5}, {"a": 1.5}, True),
        ({"a": "1"}, {"a": 1}, False),
        ({"a": Decimal("1.5")}, {"a": Decimal("1.50")}, True),
        ({"a": {"n": [1]}}, {"a": {"n": [1]}}, True),
    ],
)
def test_headers_rules(
    args: dict[str, Any], headers: dict[str, Any] | None, expected: bool
) -> None:
    _, ex = setup("q")
    ex.bind_queue("q", "amq.headers", "ignored", args)
    assert ex.route("amq.headers", "whatever", headers) == (["q"] if expected else [])


def test_headers_exchanges(ex: Exchanges) -> None:
    ex.bind_queue("q1", "amq.match", "", {"kind": "a"})
    ex.bind_queue("q1", "amq.match", "", {"x-match": "any", "kind": "a", "size": 2})
    ex.bind_queue("q2", "amq.match", "", {"x-match": "any", "kind": "a", "size": 2})
    assert ex.route("amq.match", "", {"kind": "a"}) == ["q1", "q2"]  # q1 once
    assert ex.route("amq.match", "", {"size": 2}) == ["q1", "q2"]
    assert ex.route("amq.match", "", {"size": 3}) == []
    ex.unbind_queue("q1", "amq.match", "", {"x-match": "any", "kind": "a", "size": 2})
    assert ex.route("amq.match", "", {"size": 2}) == ["q2"]
    assert ex.route("amq.match", "", {"kind": "a"}) == ["q1", "q2"]


def test_headers_invalid_x_match(ex: Exchanges) -> None:
    for bad in ("some", 1, None):
        with pytest.raises(InvalidArguments, match="x-match"):
            ex.bind_queue("q1", "amq.headers", "", {"x-match": bad})
    assert ex.bindings() == [] and not ex.has_bindings("amq.headers")
    # Other exchange types do not read x-match.
    ex.bind_queue("q1", "amq.direct", "k", {"x-match": "some"})
    assert ex.route("amq.direct", "k") == ["q1"]


# -- exchange-to-exchange --------------------------------------------------------------------


def test_exchange_to_exchange(ex: Exchanges) -> None:
    ex.declare("logs", "topic")
    ex.declare("errors", "fanout", internal=True)
    ex.bind_exchange("logs", "amq.direct", "app.error")
    ex.bind_exchange("errors", "logs", "*.error")
    ex.bind_queue("q1", "errors", "")
    ex.bind_queue("q2", "logs", "app.#")
    ex.bind_queue("q3", "amq.direct", "app.error")
    # The routing key travels unchanged; internal exchanges route like any other.
    routed = ex.route("amq.direct", "app.error")
    assert sorted(routed) == ["q1", "q2", "q3"] and ex.route("amq.direct", "app.error") == routed
    assert ex.route("amq.direct", "app.info") == []
    assert ex.route("logs", "app.info") == ["q2"]
    assert ex.route("logs", "db.error") == ["q1"]
    ex.unbind_exchange("errors", "logs", "*.error")
    assert sorted(ex.route("amq.direct", "app.error")) == ["q2", "q3"]


def test_exchange_cycles_and_duplicates(ex: Exchanges) -> None:
    for name in ("a", "b", "c"):
        ex.declare(name, "fanout")
    ex.bind_exchange("b", "a", "")
    ex.bind_exchange("c", "b", "")
    ex.bind_exchange("a", "c", "")  # a -> b -> c -> a
    ex.bind_exchange("a", "a", "")  # and a to itself
    ex.bind_queue("q1", "a", "")
    ex.bind_queue("q2", "b", "")
    ex.bind_queue("q1", "c", "")
    ex.bind_queue("q3", "c", "")
    # Depth first, each exchange's bindings in binding order, each queue once.
    for _ in range(2):
        assert ex.route("a", "") == ["q1", "q3", "q2"]
    assert ex.route("b", "") == ["q1", "q3", "q2"]
    assert ex.route("c", "") == ["q2", "q1", "q3"]


def test_long_exchange_chain() -> None:
    _, ex = setup("end")
    depth = 3000  # deeper than Python's recursion limit
    for i in range(depth):
        ex.declare(f"x{i}", "direct")
    for i in range(depth - 1):
        ex.bind_exchange(f"x{i + 1}", f"x{i}", "k")
    ex.bind_queue("end", f"x{depth - 1}", "k")
    assert ex.route("x0", "k") == ["end"]
    assert ex.route("x0", "j") == []


# -- auto-delete -----------------------------------------------------------------------------


def test_auto_delete_on_queue_deletion(ex: Exchanges) -> None:
    ex.declare("ad", "direct", auto_delete=True)
    assert ex.get("ad") is not None  # no bindings yet: stays
    ex.bind_queue("q1", "ad", "k")
    ex.bind_queue("q2", "ad", "k")
    ex.queue_deleted("q1")
    assert ex.get("ad") is not None and ex.route("ad", "k") == ["q2"]
    ex.queue_deleted("q2")
    assert ex.get("ad") is None and ex.bindings() == []
    ex.queue_deleted("never-bound")  # nothing to do


def test_auto_delete_on_last_unbind(ex: Exchanges) -> None:
    ex.declare("ad", "fanout", auto_delete=True)
    ex.bind_queue("q1", "ad", "")
    ex.unbind_queue("q1", "ad", "")
    assert ex.get("ad") is None


def test_auto_delete_cascades(ex: Exchanges) -> None:
    ex.declare("top", "fanout", auto_delete=True)
    ex.declare("mid", "fanout", auto_delete=True)
    ex.declare("keep", "fanout")
    ex.bind_exchange("mid", "top", "")
    ex.bind_exchange("keep", "top", "")
    ex.bind_queue("q1", "mid", "")
    ex.bind_queue("q2", "keep", "")
    ex.queue_deleted("q1")  # mid loses its last binding; top still has keep
    assert ex.get("mid") is None and ex.get("top") is not None
    assert ex.route("top", "") == ["q2"]
    ex.delete("keep")  # top's last binding went with it
    assert ex.get("top") is None and ex.bindings() == []


def test_auto_delete_exchanges_bound_to_each_other_stay(ex: Exchanges) -> None:
    """aio-pika's pattern: two auto-delete exchanges, one bound to the other. Only losing
    its last binding *as source* deletes one (RabbitMQ 3.10, observed)."""
    ex.declare("a", "direct", auto_delete=True)
    ex.declare("b", "direct", auto_delete=True)
    ex.bind_exchange("b", "a", "k")  # destination b, source a
    ex.bind_queue("q1", "b", "k")
    assert ex.get("a") is not None and ex.get("b") is not None
    assert ex.route("a", "k") == ["q1"]
    ex.unbind_exchange("b", "a", "k")
    assert ex.get("a") is None  # its last binding as source went
    assert ex.get("b") is not None  # a destination-only loss deletes nothing


def test_auto_delete_is_about_bindings_as_source(ex: Exchanges) -> None:
    """Each case as rabbitmq-server 3.10 answered it."""
    ex.declare("dest-only", "direct", auto_delete=True)
    ex.bind_exchange("dest-only", "amq.direct", "x")
    ex.unbind_exchange("dest-only", "amq.direct", "x")
    assert ex.get("dest-only") is not None
    ex.declare("never-bound", "direct", auto_delete=True)
    ex.unbind_queue("q1", "never-bound", "zz")  # a binding that is not there
    assert ex.get("never-bound") is not None
    ex.declare("two", "direct", auto_delete=True)
    ex.bind_queue("q1", "two", "a")
    ex.bind_queue("q1", "two", "b")
    ex.unbind_queue("q1", "two", "a")
    assert ex.get("two") is not None and ex.route("two", "b") == ["q1"]
    ex.declare("self", "direct", auto_delete=True)
    ex.bind_exchange("self", "self", "")
    ex.unbind_exchange("self", "self", "")
    assert ex.get("self") is None


def test_auto_delete_when_the_destination_exchange_goes(ex: Exchanges) -> None:
    ex.declare("src", "fanout", auto_delete=True)
    ex.declare("dst", "fanout", auto_delete=True)
    ex.bind_exchange("dst", "src", "")
    ex.delete("dst")  # src's only binding went with it
    assert ex.get("src") is None
    ex.declare("src2", "fanout", auto_delete=True)
    ex.declare("dst2", "fanout", auto_delete=True)
    ex.bind_exchange("dst2", "src2", "")
    ex.delete("src2")  # the destination only lost a binding to it
    assert ex.get("dst2") is not None


def test_unknown_exchange_type_wording(ex: Exchanges) -> None:
    for kind in ("fanout2", "x-consistent-hash", ""):
        with pytest.raises(InvalidExchangeType) as info:
            ex.declare("e", kind)
        assert str(info.value) == f"unknown exchange type '{kind}'"
    with pytest.raises(ExchangeNotFound) as not_found:
        ex.declare("e", "fanout2", passive=True)  # passive: the type is not looked at
    assert str(not_found.value) == "no exchange 'e' in vhost '/'"


def test_queue_deleted_keeps_other_bindings(ex: Exchanges) -> None:
    ex.bind_queue("q1", "amq.direct", "a")
    ex.bind_queue("q1", "amq.topic", "#")
    ex.bind_queue("q2", "amq.direct", "a")
    ex.queue_deleted("q1")
    assert ex.bindings() == [Binding("amq.direct", QUEUE, "q2", "a", "{}")]
    assert ex.get("amq.direct") is not None  # system exchanges are never auto-deleted


# -- bind/unbind against a model -------------------------------------------------------------

operations = st.lists(
    st.tuples(
        st.sampled_from(["bind", "unbind", "bind_x", "unbind_x", "drop_queue"]),
        st.integers(0, 2),  # queue or destination exchange
        st.integers(0, 2),  # source exchange
        st.sampled_from(["k", "j", "*", "#"]),
        st.sampled_from([{}, {"a": 1}]),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(ops=operations, probes=st.lists(st.sampled_from(["k", "j", "x.y", ""]), max_size=4))
def test_bookkeeping_matches_model(
    ops: list[tuple[str, int, int, str, dict[str, Any]]], probes: list[str]
) -> None:
    queues = ["q0", "q1", "q2"]
    names = ["ed", "ef", "et"]
    kinds = {"ed": "direct", "ef": "fanout", "et": "topic"}
    _, ex = setup(*queues)
    for name in names:
        ex.declare(name, kinds[name])
    model: set[tuple[str, str, str, str, str]] = set()

    def matches(source: str, key: str, probe: str) -> bool:
        kind = kinds[source]
        return kind == "fanout" or (
            key == probe if kind == "direct" else reference_matches(key, probe)
        )

    def model_route(source: str, probe: str) -> set[str]:
        out: set[str] = set()
        seen = {source}
        todo = [source]
        while todo:
            here = todo.pop()
            for src, dkind, dest, key, _args in model:
                if src != here or not matches(here, key, probe):
                    continue
                if dkind == QUEUE:
                    out.add(dest)
                elif dest not in seen:
                    seen.add(dest)
                    todo.append(dest)
        return out

    for op, dest_index, source_index, key, args in ops:
        source = names[source_index]
        args_json = canonical_arguments(args)
        if op in ("bind", "unbind"):
            entry = (source, QUEUE, queues[dest_index], key, args_json)
            if op == "bind":
                ex.bind_queue(queues[dest_index], source, key, args)
                model.add(entry)
            else:
                ex.unbind_queue(queues[dest_index], source, key, args)
                model.discard(entry)
        elif op in ("bind_x", "unbind_x"):
            entry = (source, EXCHANGE, names[dest_index], key, args_json)
            if op == "bind_x":
                ex.bind_exchange(names[dest_index], source, key, args)
                model.add(entry)
            else:
                ex.unbind_exchange(names[dest_index], source, key, args)
                model.discard(entry)
        else:
            ex.queue_deleted(queues[dest_index])
            model = {b for b in model if (b[1], b[2]) != (QUEUE, queues[dest_index])}
        got = {
            (b.source, b.dest_kind, b.destination, b.routing_key, b.arguments)
            for b in ex.bindings()
        }
        assert got == model
        for name in names:
            assert ex.has_bindings(name) == any(b[0] == name for b in model)
            for probe in probes:
                routed = ex.route(name, probe)
                assert len(routed) == len(set(routed))
                assert set(routed) == model_route(name, probe)


# -- argument tables -------------------------------------------------------------------------


def test_canonical_arguments() -> None:
    assert canonical_arguments(None) == canonical_arguments({}) == "{}"
    assert canonical_arguments({"b": 1, "a": 2}) == canonical_arguments({"a": 2, "b": 1})
    distinct: list[dict[str, Any]] = [
        {"a": 1},
        {"a": True},
        {"a": 1.0},
        {"a": "1"},
        {"a": b"1"},
        {"a": [1]},
        {"a": None},
    ]
    assert len({canonical_arguments(d) for d in distinct}) == len(distinct)
    table: dict[str, Any] = {
        "s": "text \u00e9",
        "i": -(2**70),
        "f": 0.25,
        "t": True,
        "n": None,
        "b": b"\x00\xff",
        "d": Decimal("12.345"),
        "ts": dt.datetime(2024, 5, 1, 12, 30, 5),
        "l": [1, "x", [b"y"], {"k": Decimal("1")}],
        "m": {"nested": {"deep": [None]}},
    }
    text = canonical_arguments(table)
    assert text.isascii()
    assert decode_arguments(text) == table
    assert canonical_arguments(decode_arguments(text)) == text
    assert canonical_arguments({"tuple": (1, 2)}) == canonical_arguments({"tuple": [1, 2]})
    non_string_key: dict[str, Any] = {"a": {1: "v"}}
    with pytest.raises(InvalidArguments):
        canonical_arguments(non_string_key)


def test_binding_key_is_stable_and_bounded() -> None:
    short = Binding("x", QUEUE, "q", "k", "{}")
    assert binding_key(short) == binding_key(Binding("x", QUEUE, "q", "k", "{}"))
    assert binding_key(short) != binding_key(Binding("x", EXCHANGE, "q", "k", "{}"))
    long_key = "w." * 500
    big = Binding("x", QUEUE, "q", long_key, "{}")
    assert binding_key(big).startswith("sha256:") and len(binding_key(big)) < 100
    assert binding_key(big) != binding_key(Binding("x", QUEUE, "q", long_key + "z", "{}"))


# -- recovery through a real journal ---------------------------------------------------------


class Env:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.clock = ManualClock()
        self.journals: list[Journal] = []

    def open(self) -> tuple[QueueManager, Journal]:
        mgr = QueueManager(QueueDefaults(), self.clock)
        journal = Journal(self.directory, clock=self.clock)
        self.journals.append(journal)
        journal.recover(mgr)
        journal.start(mgr)
        mgr.persistence = journal
        return mgr, journal

    async def restart(self, journal: Journal) -> tuple[QueueManager, Journal]:
        assert await durable(journal) is None
        await journal.close()
        self.journals.remove(journal)
        return self.open()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(tmp_path / "journal")
    yield e
    for journal in list(e.journals):
        await journal.close()


def create(mgr: QueueManager, name: str, durable_queue: bool) -> None:
    mgr.create_queue(name, mgr.options_from({"durable": durable_queue}))


def described(ex: Exchanges) -> Iterator[tuple[str, str, str, str, dict[str, Any]]]:
    for b in ex.bindings():
        yield b.source, b.dest_kind, b.destination, b.routing_key, b.argument_table


async def test_durable_exchanges_and_bindings_survive_recovery(env: Env) -> None:
    mgr, journal = env.open()
    create(mgr, "dq", True)
    create(mgr, "tq", False)
    create(mgr, "dq2", True)
    ex = Exchanges(mgr)
    ex.declare("dx", "topic", durable=True, arguments={"alternate-exchange": "ae", "n": 5})
    ex.declare("hx", "headers", durable=True, internal=True)
    ex.declare("tx", "fanout")  # transient
    ex.declare("gone", "direct", durable=True)
    ex.bind_queue("dq", "dx", "a.#")  # durable
    ex.bind_queue("tq", "dx", "a.*")  # transient queue: not kept
    ex.bind_queue("dq", "tx", "")  # transient exchange: not kept
    ex.bind_queue("dq", "amq.direct", "k")  # system exchange, durable queue: kept
    ex.bind_queue("dq2", "hx", "", {"x-match": "any", "b": b"\x01", "d": Decimal("2.5")})
    ex.bind_exchange("hx", "dx", "#.h")  # durable both ends: kept
    ex.bind_exchange("tx", "dx", "t")  # transient destination: not kept
    ex.bind_queue("dq", "gone", "k")
    ex.delete("gone")
    ex.bind_queue("dq2", "amq.fanout", "")
    ex.unbind_queue("dq2", "amq.fanout", "")
    before = list(described(ex))

    mgr2, journal2 = await env.restart(journal)
    ex2 = Exchanges(mgr2)
    assert ex2.get("tx") is None and ex2.get("gone") is None
    dx = ex2.get("dx")
    assert dx is not None
    assert (dx.type, dx.durable, dx.auto_delete, dx.internal, dx.arguments) == (
        ExchangeType.TOPIC,
        True,
        False,
        False,
        {"alternate-exchange": "ae", "n": 5},
    )
    hx = ex2.get("hx")
    assert hx is not None and hx.type is ExchangeType.HEADERS and hx.internal
    kept = [b for b in before if b[0] != "tx" and b[2] not in ("tq", "tx")]
    assert sorted(map(repr, described(ex2))) == sorted(map(repr, kept))
    assert len(kept) == 4
    assert ex2.route("dx", "a.b") == ["dq"]
    assert ex2.route("amq.direct", "k") == ["dq"]
    assert ex2.route("dx", "x.h", {"b": b"\x01"}) == ["dq2"]
    assert ex2.route("dx", "x.h", {"d": Decimal("2.5")}) == ["dq2"]
    assert ex2.route("dx", "x.h", {"b": b"\x02"}) == []
    # Equivalence is checked against what was restored.
    assert ex2.declare("dx", "topic", durable=True, arguments={"alternate-exchange": "ae"}) is dx
    with pytest.raises(ExchangeMismatch):
        ex2.declare("dx", "topic", durable=True)

    # Changes after recovery are recorded too.
    ex2.unbind_queue("dq", "dx", "a.#")
    ex2.delete("hx")
    mgr3, _ = await env.restart(journal2)
    ex3 = Exchanges(mgr3)
    assert ex3.get("hx") is None and ex3.get("dx") is not None
    assert list(described(ex3)) == [("amq.direct", QUEUE, "dq", "k", {})]


async def test_restore_drops_bindings_of_vanished_queues(env: Env) -> None:
    mgr, journal = env.open()
    create(mgr, "dq", True)
    create(mgr, "doomed", True)
    ex = Exchanges(mgr)
    ex.declare("ad", "direct", durable=True, auto_delete=True)
    ex.declare("ad_kept", "direct", durable=True, auto_delete=True)
    ex.bind_queue("doomed", "ad", "k")
    ex.bind_queue("doomed", "ad_kept", "k")
    ex.bind_queue("dq", "ad_kept", "k")
    ex.bind_queue("doomed", "amq.topic", "#")
    # The queue goes without anyone telling the exchanges (as after a crash in between).
    mgr.delete_queue("doomed")

    mgr2, journal2 = await env.restart(journal)
    ex2 = Exchanges(mgr2)
    assert list(described(ex2)) == [("ad_kept", QUEUE, "dq", "k", {})]
    assert ex2.get("ad") is None  # auto-delete: lost its only binding
    assert ex2.get("ad_kept") is not None
    mgr3, _ = await env.restart(journal2)
    ex3 = Exchanges(mgr3)
    assert ex3.get("ad") is None and list(described(ex3)) == [("ad_kept", QUEUE, "dq", "k", {})]
    assert len(DurableTable(mgr3, BINDINGS_TABLE)) == 1


async def test_unreadable_records_are_dropped(env: Env) -> None:
    mgr, journal = env.open()
    create(mgr, "dq", True)
    ex = Exchanges(mgr)
    ex.declare("ok", "fanout", durable=True)
    ex.bind_queue("dq", "ok", "")
    exchanges = DurableTable(mgr, EXCHANGES_TABLE)
    exchanges.put("broken", b"not json", {})
    exchanges.put("weird", b'{"type":"x-unknown","durable":true}', {})
    exchanges.put(
        "amq.sneaky",
        b'{"type":"direct","durable":true,"auto_delete":false,"internal":false,"arguments":{}}',
        {},
    )
    bindings = DurableTable(mgr, BINDINGS_TABLE)
    bindings.put("junk", b"[]", {})
    bindings.put(
        "bad-x-match",
        b'{"source":"amq.headers","dest_kind":"queue","destination":"dq",'
        b'"routing_key":"","arguments":{"x-match":"neither"}}',
        {},
    )
    bindings.put(
        "bad-kind",
        b'{"source":"ok","dest_kind":"topic","destination":"dq","routing_key":"","arguments":{}}',
        {},
    )

    mgr2, _ = await env.restart(journal)
    ex2 = Exchanges(mgr2)
    assert ex2.get("broken") is None and ex2.get("weird") is None and ex2.get("amq.sneaky") is None
    assert list(described(ex2)) == [("ok", QUEUE, "dq", "", {})]
    assert ex2.route("ok", "") == ["dq"]
    assert [k for k, _ in DurableTable(mgr2, EXCHANGES_TABLE).items()] == ["ok"]
    assert len(DurableTable(mgr2, BINDINGS_TABLE)) == 1


async def test_without_persistence_or_durable_tables() -> None:
    mgr = QueueManager(QueueDefaults(), ManualClock())
    create(mgr, "q", True)
    ex = Exchanges(mgr, durable_tables=False)
    ex.declare("x", "direct", durable=True)
    ex.bind_queue("q", "x", "k")
    assert ex.route("x", "k") == ["q"]
    assert not mgr.queues[EXCHANGES_TABLE].options.durable
    assert len(DurableTable(mgr, EXCHANGES_TABLE, durable=False)) == 1
