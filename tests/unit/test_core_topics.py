"""The core topic router: MQTT-style wildcard rules, bookkeeping, the match cache, and property
tests against a brute-force reference matcher."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vibemq_server.core.topics import MANY, ONE, TopicRouter, pattern_overlaps

Pattern = tuple[str, ...]


def reference_matches(pattern: Pattern, address: str) -> bool:
    words = address.split(".")
    if words[0].startswith("$") and pattern[0] in (ONE, MANY):
        return False

    def walk(p: Pattern, w: list[str]) -> bool:
        if not p:
            return not w
        if p[0] == MANY:
            return True
        if not w:
            return False
        return (p[0] == ONE or p[0] == w[0]) and walk(p[1:], w[1:])

    return walk(pattern, words)


def reference_route(entries: dict[tuple[str, Pattern], int], address: str) -> dict[str, int]:
    result: dict[str, int] = {}
    for (key, pattern), level in entries.items():
        if reference_matches(pattern, address):
            result[key] = max(level, result.get(key, level))
    return result


def router_with(*entries: tuple[str, Pattern, int]) -> TopicRouter[str]:
    router: TopicRouter[str] = TopicRouter()
    for key, pattern, level in entries:
        router.add(key, pattern, level)
    return router


def matched(router: TopicRouter[str], address: str) -> dict[str, int]:
    return dict(router.match(address))


# --------------------------------------------------------------------------------------------
# Matching rules


@pytest.mark.parametrize(
    ("pattern", "address", "expected"),
    [
        (("a", "b"), "a.b", True),
        (("a", "b"), "a.c", False),
        (("a", "b"), "a", False),
        (("a", "b"), "a.b.c", False),
        (("a", MANY), "a", True),
        (("a", MANY), "a.", True),
        (("a", MANY), "a.b", True),
        (("a", MANY), "a.b.c", True),
        (("a", MANY), "b", False),
        (("a", MANY), "ab", False),
        ((MANY,), "a", True),
        ((MANY,), "", True),
        ((MANY,), ".", True),
        ((MANY,), "a.b.c", True),
        (("a", ONE), "a.x", True),
        (("a", ONE), "a.", True),
        (("a", ONE), "a", False),
        (("a", ONE), "a.x.y", False),
        ((ONE,), "a", True),
        ((ONE,), "", True),
        ((ONE,), "a.b", False),
        ((ONE, "b"), ".b", True),
        ((ONE, ONE), ".", True),
        ((ONE, MANY), "a", True),
        ((ONE, MANY), "a.b.c", True),
        (("a", ONE, "c"), "a..c", True),
        (("a", ONE, "c"), "a.c", False),
        (("", "a"), ".a", True),
        (("", "a"), "a", False),
        (("a", ""), "a.", True),
        (("a", ""), "a", False),
        (("a", "", "b"), "a..b", True),
        (("",), "", True),
        (("",), "a", False),
        (("a/b", "$c", "é€"), "a/b.$c.é€", True),
        # The sentinels never collide with literal wildcard characters.
        (("+",), "+", True),
        (("+",), "a", False),
        (("#",), "a", False),
        (("a", "#"), "a.#", True),
        (("a", "#"), "a", False),
        (("*",), "a", False),
    ],
)
def test_matching_rules(pattern: Pattern, address: str, expected: bool) -> None:
    assert reference_matches(pattern, address) is expected
    router = router_with(("k", pattern, 1))
    assert matched(router, address) == ({"k": 1} if expected else {})


@pytest.mark.parametrize(
    ("pattern", "address", "expected"),
    [
        ((MANY,), "$SYS", False),
        ((MANY,), "$SYS.x", False),
        ((ONE,), "$SYS", False),
        ((ONE, "x"), "$SYS.x", False),
        ((ONE, MANY), "$SYS.x", False),
        (("$SYS", MANY), "$SYS", True),
        (("$SYS", MANY), "$SYS.x", True),
        (("$SYS", ONE), "$SYS.x", True),
        (("$SYS", "x"), "$SYS.x", True),
        (("$", MANY), "$.x", True),
        ((MANY,), "a.$SYS", True),
        (("a", ONE), "a.$SYS", True),
        (("a", MANY), "a.$SYS.x", True),
        ((MANY,), "x$.a", True),
    ],
)
def test_dollar_rule_applies_to_the_first_word_only(
    pattern: Pattern, address: str, expected: bool
) -> None:
    assert reference_matches(pattern, address) is expected
    router = router_with(("k", pattern, 0))
    assert matched(router, address) == ({"k": 0} if expected else {})


def test_overlapping_patterns_of_one_key_give_the_highest_level() -> None:
    router = router_with(
        ("k", ("a", "b"), 0),
        ("k", ("a", ONE), 2),
        ("k", ("a", MANY), 1),
        ("k", (MANY,), 0),
        ("j", ("a", "b"), 1),
        ("j", ("x",), 2),
    )
    assert matched(router, "a.b") == {"k": 2, "j": 1}
    assert matched(router, "a") == {"k": 1}
    assert matched(router, "a.b.c") == {"k": 1}
    assert matched(router, "x") == {"k": 0, "j": 2}
    assert matched(router, "$x") == {}


def test_levels_need_not_be_small_or_positive() -> None:
    router = router_with(("k", ("a",), -5), ("k", (ONE,), -7), ("j", (MANY,), 10**9))
    assert matched(router, "a") == {"k": -5, "j": 10**9}


def test_empty_router_and_no_match_give_the_shared_empty_mapping() -> None:
    router: TopicRouter[str] = TopicRouter()
    empty = router.match("a")
    assert empty == {}
    router.add("k", ("b",), 1)
    assert router.match("a") is empty
    assert router.match("b.c") is empty
    assert router.match("$b") is empty


def test_many_topic_levels_do_not_recurse() -> None:
    router = router_with(("k", ("a", MANY), 1), ("j", (ONE,) * 3 + (MANY,), 2))
    address = ".".join(["a"] * 50_000)
    assert matched(router, address) == {"k": 1, "j": 2}


# --------------------------------------------------------------------------------------------
# Bookkeeping


@pytest.mark.parametrize(
    "pattern",
    [(), (MANY, "a"), ("a", MANY, MANY), (MANY, MANY), ("a", MANY, ONE), ("a.b",), (".",)],
)
def test_invalid_patterns_are_rejected(pattern: Pattern) -> None:
    router: TopicRouter[str] = TopicRouter()
    with pytest.raises(ValueError):
        router.add("k", pattern, 0)
    assert len(router) == 0
    assert not router
    assert router.patterns_of("k") == {}
    with pytest.raises(ValueError):
        pattern_overlaps(pattern, ("a",))
    with pytest.raises(ValueError):
        pattern_overlaps((MANY,), pattern)


def test_negative_cache_size_is_rejected() -> None:
    with pytest.raises(ValueError):
        TopicRouter(cache_size=-1)


def test_add_replaces_the_level_of_an_existing_entry() -> None:
    router = router_with(("k", ("a",), 0))
    router.add("k", ("a",), 2)
    assert len(router) == 1
    assert router.patterns_of("k") == {("a",): 2}
    assert matched(router, "a") == {"k": 2}
    router.add("k", ("a",), 1)
    assert matched(router, "a") == {"k": 1}


def test_len_bool_and_patterns_of() -> None:
    router: TopicRouter[str] = TopicRouter()
    assert len(router) == 0
    assert not router
    router.add("k", ("a",), 0)
    router.add("k", ("a", MANY), 1)
    router.add("j", ("a",), 2)
    assert len(router) == 3
    assert router
    patterns = router.patterns_of("k")
    assert patterns == {("a",): 0, ("a", MANY): 1}
    patterns[("zzz",)] = 9  # a copy: changing it changes nothing
    assert router.patterns_of("k") == {("a",): 0, ("a", MANY): 1}
    assert router.patterns_of("nobody") == {}


def test_remove() -> None:
    router = router_with(("k", ("a",), 0), ("k", ("a", MANY), 1), ("j", ("a",), 2))
    assert router.remove("k", ("a",)) is True
    assert router.remove("k", ("a",)) is False
    assert router.remove("k", ("b",)) is False
    assert router.remove("nobody", ("a",)) is False
    assert len(router) == 2
    assert router.patterns_of("k") == {("a", MANY): 1}
    assert matched(router, "a") == {"k": 1, "j": 2}
    assert router.remove("k", ("a", MANY)) is True
    assert router.patterns_of("k") == {}
    assert matched(router, "a") == {"j": 2}


def test_remove_key() -> None:
    router = router_with(
        ("k", ("a",), 0), ("k", ("a", MANY), 1), ("k", (ONE, "b"), 1), ("j", ("a",), 2)
    )
    assert router.remove_key("k") == 3
    assert router.remove_key("k") == 0
    assert router.remove_key("nobody") == 0
    assert len(router) == 1
    assert router.patterns_of("k") == {}
    assert matched(router, "a") == {"j": 2}
    assert matched(router, "x.b") == {}


def test_removal_prunes_empty_nodes() -> None:
    router = router_with(
        ("k", ("a", "b", "c"), 0),
        ("k", ("a", ONE, MANY), 0),
        ("j", ("a", "b"), 1),
        ("j", (MANY,), 1),
    )
    assert router.remove("k", ("a", "b", "c"))
    # ("a", "b") still holds j, so only the "c" leaf goes.
    assert set(router._root.children["a"].children["b"].children) == set()
    assert router.remove_key("j") == 2
    assert set(router._root.children) == {"a"}
    assert set(router._root.children["a"].children) == {ONE}
    assert router.remove_key("k") == 1
    assert router._root.children == {}
    assert not router


def test_remove_everything_leaves_an_empty_trie() -> None:
    router: TopicRouter[int] = TopicRouter()
    patterns = [("a",), ("a", "b"), ("a", ONE), ("a", MANY), (ONE, ONE, MANY), ("", "")]
    for key in range(5):
        for pattern in patterns:
            router.add(key, pattern, key)
    assert len(router) == 30
    for key in range(5):
        assert router.remove_key(key) == len(patterns)
    assert router._root.children == {}
    assert len(router) == 0


def test_keys_may_be_any_hashable() -> None:
    router: TopicRouter[tuple[str, int]] = TopicRouter()
    router.add(("conn", 1), ("a", ONE), 1)
    router.add(("conn", 2), ("a", MANY), 0)
    assert dict(router.match("a.b")) == {("conn", 1): 1, ("conn", 2): 0}


# --------------------------------------------------------------------------------------------
# Cache


def test_repeated_match_is_served_from_the_cache() -> None:
    router = router_with(("k", ("a", ONE), 1))
    first = router.match("a.b")
    assert router.match("a.b") is first


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.add("j", ("a", "b"), 2),
        lambda r: r.add("k", ("a", ONE), 0),
        lambda r: r.remove("k", ("a", ONE)),
        lambda r: r.remove_key("k"),
    ],
)
def test_every_change_invalidates_the_cache(change: object) -> None:
    router = router_with(("k", ("a", ONE), 1))
    before = dict(router.match("a.b"))
    assert router.match("a.b") == before
    change(router)  # type: ignore[operator]
    expected = reference_route(
        {(key, p): level for key in ("k", "j") for p, level in router.patterns_of(key).items()},
        "a.b",
    )
    assert dict(router.match("a.b")) == expected
    assert expected != before


def test_a_cached_miss_is_invalidated_by_add() -> None:
    router = router_with(("k", ("x",), 1))
    assert matched(router, "a") == {}
    router.add("k", ("a",), 2)
    assert matched(router, "a") == {"k": 2}


def test_failed_changes_keep_results_correct() -> None:
    router = router_with(("k", ("a",), 1))
    assert matched(router, "a") == {"k": 1}
    assert not router.remove("k", ("b",))
    assert router.remove_key("nobody") == 0
    router.add("k", ("a",), 1)
    with pytest.raises(ValueError):
        router.add("k", (MANY, "a"), 2)
    assert matched(router, "a") == {"k": 1}


def test_cache_is_bounded() -> None:
    router: TopicRouter[str] = TopicRouter(cache_size=3)
    router.add("k", (ONE,), 1)
    for index in range(100):
        assert matched(router, f"w{index}") == {"k": 1}
        assert len(router._cache) <= 3
    assert matched(router, "w0") == {"k": 1}


def test_cache_size_zero_disables_caching() -> None:
    router: TopicRouter[str] = TopicRouter(cache_size=0)
    router.add("k", (ONE,), 1)
    assert matched(router, "a") == {"k": 1}
    assert matched(router, "a") == {"k": 1}
    assert router._cache == {}


# --------------------------------------------------------------------------------------------
# pattern_overlaps


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (("a",), ("a",), True),
        (("a",), ("b",), False),
        (("a",), (ONE,), True),
        (("a",), (MANY,), True),
        (("a",), ("a", MANY), True),
        (("a",), ("a", ONE), False),
        (("a", "b"), ("a",), False),
        (("a", ONE), (ONE, "b"), True),
        (("a", ONE, "c"), (ONE, "b", "d"), False),
        (("a", MANY), ("b", MANY), False),
        (("a", MANY), (ONE, "x", "y"), True),
        ((ONE, ONE), (ONE,), False),
        ((ONE, ONE), (ONE, MANY), True),
        (("",), ("", ""), False),
        (("", MANY), ("",), True),
        # Conservative: the $ rule would keep these apart, but the overlap is still reported.
        ((MANY,), ("$SYS", "x"), True),
        ((ONE,), ("$SYS",), True),
    ],
)
def test_pattern_overlaps(a: Pattern, b: Pattern, expected: bool) -> None:
    assert pattern_overlaps(a, b) is expected
    assert pattern_overlaps(b, a) is expected


# --------------------------------------------------------------------------------------------
# Properties against the reference

ALPHABET = ["", "$x", "a", "b"]
FRESH = "c"  # never used in patterns

literal_words = st.sampled_from(ALPHABET)
pattern_words = st.sampled_from([*ALPHABET, ONE])
patterns = st.builds(
    lambda head, many: tuple(head) + ((MANY,) if many else ()),
    st.lists(pattern_words, max_size=3),
    st.booleans(),
).filter(bool)
addresses = st.lists(st.sampled_from([*ALPHABET, FRESH]), min_size=1, max_size=5).map(".".join)
keys = st.sampled_from(["k0", "k1", "k2"])
levels = st.integers(0, 2)

operations = st.one_of(
    st.tuples(st.just("add"), keys, patterns, levels),
    st.tuples(st.just("remove"), keys, patterns),
    st.tuples(st.just("remove_key"), keys),
    st.tuples(st.just("match"), addresses),
)


@settings(max_examples=300)
@given(entries=st.lists(st.tuples(keys, patterns, levels), max_size=12), probes=st.lists(addresses))
def test_match_agrees_with_the_reference(
    entries: list[tuple[str, Pattern, int]], probes: list[str]
) -> None:
    router: TopicRouter[str] = TopicRouter()
    reference: dict[tuple[str, Pattern], int] = {}
    for key, pattern, level in entries:
        router.add(key, pattern, level)
        reference[(key, pattern)] = level
    assert len(router) == len(reference)
    for address in probes:
        assert dict(router.match(address)) == reference_route(reference, address)


@settings(max_examples=300)
@given(
    ops=st.lists(operations, max_size=30),
    cache_size=st.sampled_from([0, 1, 3, 10_000]),
    probes=st.lists(addresses, min_size=1, max_size=4),
)
def test_changes_and_cache_agree_with_the_reference(
    ops: list[tuple[object, ...]], cache_size: int, probes: list[str]
) -> None:
    router: TopicRouter[str] = TopicRouter(cache_size=cache_size)
    reference: dict[tuple[str, Pattern], int] = {}
    for op in ops:
        match op:
            case ("add", str(key), tuple(pattern), int(level)):
                router.add(key, pattern, level)
                reference[(key, pattern)] = level
            case ("remove", str(key), tuple(pattern)):
                assert router.remove(key, pattern) is ((key, pattern) in reference)
                reference.pop((key, pattern), None)
            case ("remove_key", str(key)):
                mine = [entry for entry in reference if entry[0] == key]
                assert router.remove_key(key) == len(mine)
                for entry in mine:
                    del reference[entry]
            case ("match", str(address)):
                assert dict(router.match(address)) == reference_route(reference, address)
        # Probing after every step fills the cache, so a stale entry would show up here.
        for address in probes:
            assert dict(router.match(address)) == reference_route(reference, address)
        assert len(router) == len(reference)
        assert bool(router) is bool(reference)
        for key in ("k0", "k1", "k2"):
            assert router.patterns_of(key) == {
                p: level for (k, p), level in reference.items() if k == key
            }
        if cache_size:
            assert len(router._cache) <= cache_size
    for key in ("k0", "k1", "k2"):
        router.remove_key(key)
    assert router._root.children == {}


# Every address of 1..4 words over the alphabet plus a word no pattern uses. Patterns have at
# most 3 words before MANY, so any overlap has a witness of at most 4 words.
ALL_ADDRESSES = [
    ".".join(words)
    for size in range(1, 5)
    for words in itertools.product([*ALPHABET, FRESH], repeat=size)
]


def reference_matches_ignoring_dollar(pattern: Pattern, address: str) -> bool:
    # Prefixing a plain word, also to the pattern, switches the $ rule off without changing
    # anything else.
    return reference_matches(("z", *pattern), "z." + address)


@settings(max_examples=300)
@given(a=patterns, b=patterns)
def test_pattern_overlaps_agrees_with_brute_force(a: Pattern, b: Pattern) -> None:
    expected = any(
        reference_matches_ignoring_dollar(a, address)
        and reference_matches_ignoring_dollar(b, address)
        for address in ALL_ADDRESSES
    )
    assert pattern_overlaps(a, b) is expected
