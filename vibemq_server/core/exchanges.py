"""AMQP-style exchanges and bindings over the core's queues, protocol-free.

An exchange routes a publish (routing key and headers) to queues through bindings, the way
RabbitMQ does for the four AMQP 0-9-1 types, including exchange-to-exchange bindings. The
AMQP adapter maps the errors onto reply codes; the MQTT adapter shares ``amq.topic``.

Durable exchanges and the bindings between durable ends are kept in two DurableTables
(``$amqp.exchanges`` and ``$amqp.bindings``) and come back when a new :class:`Exchanges` is
built after journal recovery.

Topic matching follows AMQP exactly: ``*`` is one word, ``#`` zero or more words anywhere in
the binding key, and an empty routing key has no words. TopicRouter's MQTT ``$`` rule never
applies, because every address and pattern is given a leading empty word; binding keys the
trie cannot hold (a ``#`` before the last word) are matched by a small automaton instead.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeVar

import structlog

from vibemq_server.core.manager import CoreError, QueueManager, QueueNotFound
from vibemq_server.core.table import DurableTable
from vibemq_server.core.topics import MANY, ONE, TopicRouter

log = structlog.get_logger("vibemq.core")

EXCHANGES_TABLE = "$amqp.exchanges"
BINDINGS_TABLE = "$amqp.bindings"

QUEUE = "queue"
EXCHANGE = "exchange"

Dest = tuple[str, str]
"""A binding's destination: (``QUEUE`` or ``EXCHANGE``, name)."""


class ExchangeType(StrEnum):
    DIRECT = "direct"
    FANOUT = "fanout"
    TOPIC = "topic"
    HEADERS = "headers"


class ExchangeNotFound(CoreError):
    """AMQP 404 NOT_FOUND."""


class ExchangeInUse(CoreError):
    """exchange.delete with if-unused on an exchange that has bindings: AMQP 406."""


class ExchangeMismatch(CoreError):
    """Redeclared with another type or flags: AMQP 406 PRECONDITION_FAILED."""


class ExchangeAccessRefused(CoreError):
    """The default exchange or an ``amq.*`` name used where it is reserved: AMQP 403."""


class InvalidExchangeType(CoreError, ValueError):
    """An exchange type this broker does not have: AMQP 503 COMMAND_INVALID (as RabbitMQ)."""


class InvalidArguments(CoreError, ValueError):
    """A bad ``x-match`` or an argument value that cannot be stored: AMQP 406."""


@dataclass(slots=True)
class Exchange:
    name: str
    type: ExchangeType
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Binding:
    source: str
    dest_kind: str  # QUEUE or EXCHANGE
    destination: str
    routing_key: str
    arguments: str  # canonical JSON (see canonical_arguments): part of the binding's identity

    @property
    def argument_table(self) -> dict[str, Any]:
        decoded: dict[str, Any] = _decode(json.loads(self.arguments))
        return decoded


# -- argument tables as canonical JSON ---------------------------------------------------------
# AMQP field tables hold more than JSON does. Every JSON array is a tagged value, so a decoded
# document is unambiguous: ["L", [...]] a list, ["B", base64] bytes, ["D", text] a Decimal,
# ["T", iso] a datetime.


def _b64(raw: bytes) -> list[str]:
    return ["B", base64.b64encode(raw).decode("ascii")]


def _same_value(value: Any) -> Any:
    return value


def _encode_list(values: Iterable[Any]) -> list[Any]:
    return ["L", [_encode(v) for v in values]]


def _encode_table(table: Mapping[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if not isinstance(key, str):
            raise InvalidArguments(f"argument name {key!r} is not a string")
        out[key] = _encode(value)
    return out


_ENCODERS: dict[type, Callable[[Any], Any]] = {
    bool: _same_value,  # before int: the isinstance fallback goes in this order
    int: _same_value,
    float: _same_value,
    str: _same_value,
    type(None): _same_value,
    bytes: _b64,
    bytearray: lambda v: _b64(bytes(v)),
    memoryview: lambda v: _b64(bytes(v)),
    Decimal: lambda v: ["D", str(v)],
    dt.datetime: lambda v: ["T", v.isoformat()],
    list: _encode_list,
    tuple: _encode_list,
    dict: _encode_table,
}


def _encode(value: Any) -> Any:
    encoder = _ENCODERS.get(type(value))
    if encoder is None:
        # Subclasses (IntEnum, OrderedDict, other mappings) by the first base type that fits.
        kinds = [*_ENCODERS.items(), (Mapping, _encode_table)]
        for kind, candidate in kinds:
            if isinstance(value, kind):
                encoder = candidate
                break
        else:
            raise InvalidArguments(f"unsupported argument value {value!r}")
    return encoder(value)


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "L": lambda items: [_decode(v) for v in items],
    "B": lambda text: base64.b64decode(text),
    "D": Decimal,
    "T": dt.datetime.fromisoformat,
}


def _decode(doc: Any) -> Any:
    if isinstance(doc, list):
        tag, body = doc
        return _DECODERS[tag](body)
    if isinstance(doc, dict):
        return {key: _decode(value) for key, value in doc.items()}
    return doc


def _dumps(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def canonical_arguments(arguments: Mapping[str, Any] | None) -> str:
    """The one JSON text of an argument table (key order does not matter; types do)."""
    if not arguments:
        return "{}"
    return _dumps(_encode_table(arguments))


def decode_arguments(text: str) -> dict[str, Any]:
    decoded: dict[str, Any] = _decode(json.loads(text))
    return decoded


_MAX_PLAIN_KEY = 512  # journal ids are u16-length strings: long binding keys are hashed


def binding_key(binding: Binding) -> str:
    """The binding's stable key in ``$amqp.bindings``."""
    text = _dumps(
        [
            binding.source,
            binding.dest_kind,
            binding.destination,
            binding.routing_key,
            binding.arguments,
        ]
    )
    if len(text) <= _MAX_PLAIN_KEY:
        return text
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


# -- routing tables, one per exchange type --------------------------------------------------

_NO_DESTS: Mapping[Dest, int] = MappingProxyType({})


class _Table:
    """The bindings of one source exchange, arranged for its type's matching."""

    __slots__ = ("exchange_dests",)

    def __init__(self) -> None:
        # How many bindings lead to exchanges: when none, route() skips the graph walk.
        self.exchange_dests = 0

    def add(self, binding: Binding, dest: Dest, args: Mapping[str, Any]) -> None:
        self._add(binding, dest, args)  # first: it may refuse the arguments
        if dest[0] == EXCHANGE:
            self.exchange_dests += 1

    def remove(self, binding: Binding, dest: Dest) -> None:
        self._remove(binding, dest)
        if dest[0] == EXCHANGE:
            self.exchange_dests -= 1

    def _add(self, binding: Binding, dest: Dest, args: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _remove(self, binding: Binding, dest: Dest) -> None:
        raise NotImplementedError

    def match(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Dest]:
        """Each matching destination once, in a stable order."""
        raise NotImplementedError


def _count_up(counts: dict[Dest, int], dest: Dest) -> None:
    counts[dest] = counts.get(dest, 0) + 1


def _count_down(counts: dict[Dest, int], dest: Dest) -> None:
    left = counts[dest] - 1
    if left:
        counts[dest] = left
    else:
        del counts[dest]


class _DirectTable(_Table):
    __slots__ = ("keys",)

    def __init__(self) -> None:
        super().__init__()
        # Bindings differing only in arguments route alike: destinations are counted.
        self.keys: dict[str, dict[Dest, int]] = {}

    def _add(self, binding: Binding, dest: Dest, args: Mapping[str, Any]) -> None:
        _count_up(self.keys.setdefault(binding.routing_key, {}), dest)

    def _remove(self, binding: Binding, dest: Dest) -> None:
        counts = self.keys[binding.routing_key]
        _count_down(counts, dest)
        if not counts:
            del self.keys[binding.routing_key]

    def match(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Dest]:
        return self.keys.get(routing_key, _NO_DESTS)


class _FanoutTable(_Table):
    __slots__ = ("dests",)

    def __init__(self) -> None:
        super().__init__()
        self.dests: dict[Dest, int] = {}

    def _add(self, binding: Binding, dest: Dest, args: Mapping[str, Any]) -> None:
        _count_up(self.dests, dest)

    def _remove(self, binding: Binding, dest: Dest) -> None:
        _count_down(self.dests, dest)

    def match(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Dest]:
        return self.dests


# Topic binding keys as tokens: a word, or one of these two (ints never equal a word).
_STAR = 1
_HASH = 2
_WILDCARDS: dict[str, int] = {"*": _STAR, "#": _HASH}
Tokens = tuple[str | int, ...]


def topic_tokens(binding_key: str) -> Tokens:
    """A topic binding key as tokens; runs of ``#`` collapse (``#.#`` matches what ``#`` does)."""
    tokens: list[str | int] = []
    for word in binding_key.split(".") if binding_key else ():
        token = _WILDCARDS.get(word, word)
        if token == _HASH and tokens and tokens[-1] == _HASH:
            continue
        tokens.append(token)
    return tuple(tokens)


def tokens_match(tokens: Tokens, words: list[str]) -> bool:
    """Whether a topic pattern matches an address's words (a set-of-states automaton)."""
    size = len(tokens)

    def closure(states: set[int]) -> set[int]:
        # A "#" may match nothing: whoever stands before one also stands after it.
        for index in sorted(states):
            while index < size and tokens[index] == _HASH:
                index += 1
                states.add(index)
        return states

    states = closure({0})
    for word in words:
        following: set[int] = set()
        for index in states:
            if index < size:
                token = tokens[index]
                if token == _HASH:
                    following.add(index)
                elif token in (_STAR, word):
                    following.add(index + 1)
        if not following:
            return False
        states = closure(following)
    return size in states


_TRIE_WORDS: dict[str | int, str] = {_STAR: ONE, _HASH: MANY}


def _trie_pattern(tokens: Tokens) -> tuple[str, ...] | None:
    """The TopicRouter pattern for tokens, None when the trie cannot hold them."""
    if _HASH in tokens[:-1]:
        return None
    pattern = [""]  # the leading empty word that keeps TopicRouter's "$" rule out
    for token in tokens:
        if token in (ONE, MANY):  # a literal word equal to a sentinel: leave it to tokens_match
            return None
        pattern.append(_TRIE_WORDS[token] if isinstance(token, int) else token)
    return tuple(pattern)


class _TopicTable(_Table):
    __slots__ = ("odd", "odd_cache", "refs", "router")

    _CACHE_SIZE = 10_000

    def __init__(self) -> None:
        super().__init__()
        self.router: TopicRouter[Dest] = TopicRouter()
        self.refs: dict[tuple[Dest, Tokens], int] = {}
        # Patterns with a "#" before the end, matched one by one (rare in practice).
        self.odd: dict[tuple[Dest, Tokens], None] = {}
        self.odd_cache: dict[str, tuple[Dest, ...]] = {}

    def _add(self, binding: Binding, dest: Dest, args: Mapping[str, Any]) -> None:
        tokens = topic_tokens(binding.routing_key)
        entry = (dest, tokens)
        count = self.refs.get(entry, 0)
        self.refs[entry] = count + 1
        if count:
            return
        pattern = _trie_pattern(tokens)
        if pattern is None:
            self.odd[entry] = None
        else:
            self.router.add(dest, pattern, 0)
        self.odd_cache.clear()

    def _remove(self, binding: Binding, dest: Dest) -> None:
        tokens = topic_tokens(binding.routing_key)
        entry = (dest, tokens)
        count = self.refs[entry] - 1
        if count:
            self.refs[entry] = count
            return
        del self.refs[entry]
        if entry in self.odd:
            del self.odd[entry]
        else:
            pattern = _trie_pattern(tokens)
            assert pattern is not None
            self.router.remove(dest, pattern)
        self.odd_cache.clear()

    def match(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Dest]:
        # "" has no words at all: only the prefix word, which "#" matches and "*" does not.
        found = self.router.match("." + routing_key if routing_key else "")
        if not self.odd:
            return found
        cached = self.odd_cache.get(routing_key)
        if cached is None:
            merged = dict.fromkeys(found)
            words = routing_key.split(".") if routing_key else []
            for dest, tokens in self.odd:
                if dest not in merged and tokens_match(tokens, words):
                    merged[dest] = None
            cached = tuple(merged)
            if len(self.odd_cache) >= self._CACHE_SIZE:
                self.odd_cache.clear()
            self.odd_cache[routing_key] = cached
        return cached


# x-match value -> (any, with_x): "any" needs one pair to match rather than all of them;
# "with-x" also compares the binding's "x-" arguments (RabbitMQ 3.10+).
_X_MATCH: dict[str, tuple[bool, bool]] = {
    "all": (False, False),
    "any": (True, False),
    "all-with-x": (False, True),
    "any-with-x": (True, True),
}

# RabbitMQ compares a header with a binding argument only within one type class.
_TYPE_CLASSES: dict[type, str] = {
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    bytes: "str",
    bytearray: "str",
    memoryview: "str",
}


def _type_class(value: Any) -> str:
    kind = _TYPE_CLASSES.get(type(value))
    if kind is not None:
        return kind
    for base, name in _TYPE_CLASSES.items():
        if isinstance(value, base):
            return name
    return type(value).__name__


def _as_bytes(value: str | bytes | bytearray | memoryview) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _header_equal(wanted: Any, got: Any) -> bool:
    kind = _type_class(wanted)
    if kind != _type_class(got):
        return False
    if kind == "str":  # a longstr and a byte array with the same bytes are the same header
        return _as_bytes(wanted) == _as_bytes(got)
    return bool(wanted == got)


@dataclass(frozen=True, slots=True)
class _HeaderRule:
    any: bool
    pairs: tuple[tuple[str, Any], ...]

    def matches(self, headers: Mapping[str, Any]) -> bool:
        for key, wanted in self.pairs:
            # A void binding value asks only that the header be there.
            ok = key in headers and (wanted is None or _header_equal(wanted, headers[key]))
            if ok == self.any:  # any: the first match decides; all: the first miss
                return ok
        return not self.any


def header_rule(args: Mapping[str, Any]) -> _HeaderRule:
    raw = args.get("x-match", "all")
    if isinstance(raw, bytes | bytearray):
        raw = raw.decode("utf-8", "replace")
    mode = _X_MATCH.get(raw) if isinstance(raw, str) else None
    if mode is None:
        raise InvalidArguments(
            f"invalid x-match field value {raw!r}; expected all, any, all-with-x, or any-with-x"
        )
    match_any, with_x = mode
    pairs = tuple(
        (key, value)
        for key, value in args.items()
        if key != "x-match" and (with_x or not key.startswith("x-"))
    )
    return _HeaderRule(match_any, pairs)


_NO_HEADERS: Mapping[str, Any] = MappingProxyType({})


class _HeadersTable(_Table):
    __slots__ = ("rules",)

    def __init__(self) -> None:
        super().__init__()
        self.rules: dict[Binding, tuple[Dest, _HeaderRule]] = {}

    def _add(self, binding: Binding, dest: Dest, args: Mapping[str, Any]) -> None:
        self.rules[binding] = (dest, header_rule(args))

    def _remove(self, binding: Binding, dest: Dest) -> None:
        del self.rules[binding]

    def match(self, routing_key: str, headers: Mapping[str, Any] | None) -> Iterable[Dest]:
        headers = headers or _NO_HEADERS
        found: dict[Dest, None] = {}
        for dest, rule in self.rules.values():
            if dest not in found and rule.matches(headers):
                found[dest] = None
        return found


_TABLES: dict[ExchangeType, Callable[[], _Table]] = {
    ExchangeType.DIRECT: _DirectTable,
    ExchangeType.FANOUT: _FanoutTable,
    ExchangeType.TOPIC: _TopicTable,
    ExchangeType.HEADERS: _HeadersTable,
}

K = TypeVar("K", bound=Hashable)


def _discard(index: dict[K, dict[Binding, None]], key: K, binding: Binding) -> None:
    members = index[key]
    del members[binding]
    if not members:
        del index[key]  # empty entries would make "has bindings" tests lie


PREDECLARED: tuple[tuple[str, ExchangeType], ...] = (
    ("", ExchangeType.DIRECT),
    ("amq.direct", ExchangeType.DIRECT),
    ("amq.fanout", ExchangeType.FANOUT),
    ("amq.topic", ExchangeType.TOPIC),
    ("amq.headers", ExchangeType.HEADERS),
    ("amq.match", ExchangeType.HEADERS),
)

# What a redeclaration must repeat; RabbitMQ's names for them in its 406 reply text.
_EQUIVALENT: tuple[tuple[str, Callable[[Exchange], object]], ...] = (
    ("type", lambda x: x.type),
    ("durable", lambda x: x.durable),
    ("auto_delete", lambda x: x.auto_delete),
    ("internal", lambda x: x.internal),
    ("alternate-exchange", lambda x: x.arguments.get("alternate-exchange")),
)


def _shown(value: object) -> str:
    """A value as RabbitMQ's reply texts write it (booleans in lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else str(value)


def _exchange_type(kind: ExchangeType | str) -> ExchangeType:
    try:
        return ExchangeType(kind)
    except ValueError:
        raise InvalidExchangeType(f"unknown exchange type '{kind}'") from None


def _reserved(name: str) -> bool:
    return not name or name.startswith("amq.")


def _exchange_json(exchange: Exchange) -> bytes:
    doc = {
        "type": str(exchange.type),
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": _encode_table(exchange.arguments),
    }
    return _dumps(doc).encode()


def _exchange_from_json(name: str, payload: bytes) -> Exchange:
    doc = json.loads(payload)
    return Exchange(
        name,
        ExchangeType(doc["type"]),
        bool(doc["durable"]),
        bool(doc["auto_delete"]),
        bool(doc["internal"]),
        dict(_decode(doc["arguments"])),
    )


def _binding_json(binding: Binding, args: Mapping[str, Any]) -> bytes:
    doc = {
        "source": binding.source,
        "dest_kind": binding.dest_kind,
        "destination": binding.destination,
        "routing_key": binding.routing_key,
        "arguments": _encode_table(args),
    }
    return _dumps(doc).encode()


def _binding_from_json(payload: bytes) -> tuple[Binding, dict[str, Any]]:
    doc = json.loads(payload)
    kind = doc["dest_kind"]
    if kind not in (QUEUE, EXCHANGE):
        raise ValueError(f"unknown destination kind {kind!r}")
    args: dict[str, Any] = dict(_decode(doc["arguments"]))
    binding = Binding(
        str(doc["source"]),
        kind,
        str(doc["destination"]),
        str(doc["routing_key"]),
        canonical_arguments(args),
    )
    return binding, args


class Exchanges:
    """All exchanges and bindings of one broker, over its QueueManager's queues.

    Build it after journal recovery: the constructor restores the durable ones. The owner
    calls :meth:`queue_deleted` whenever a queue goes. :meth:`route` does not check
    ``internal`` (publishing to an internal exchange is the adapter's 403) and never routes
    the default exchange to ``$``-named queues: those are the broker's internal ones.
    """

    def __init__(self, manager: QueueManager, *, durable_tables: bool = True) -> None:
        self.manager = manager
        self._exchanges: dict[str, Exchange] = {}
        self._tables: dict[str, _Table] = {}
        self._bindings: dict[Binding, bool] = {}  # in binding order -> durable
        self._by_source: dict[str, dict[Binding, None]] = {}
        self._by_dest: dict[Dest, dict[Binding, None]] = {}
        for name, kind in PREDECLARED:
            self._add_exchange(Exchange(name, kind, True, False, False, {}))
        self._exchange_table = DurableTable(manager, EXCHANGES_TABLE, durable=durable_tables)
        self._binding_table = DurableTable(manager, BINDINGS_TABLE, durable=durable_tables)
        self._restore()

    # -- exchanges -------------------------------------------------------------------------------

    def get(self, name: str) -> Exchange | None:
        return self._exchanges.get(name)

    def all(self) -> list[Exchange]:
        """Every exchange, the predeclared ones first, then in declaration order."""
        return list(self._exchanges.values())

    def declare(
        self,
        name: str,
        type: ExchangeType | str,  # AMQP's own name for it
        *,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
        passive: bool = False,
    ) -> Exchange:
        """exchange.declare. An ``amq.*`` exchange that exists may be redeclared equivalently
        (as RabbitMQ allows); a new ``amq.*`` name or the default exchange is refused."""
        if passive:
            if not name:
                raise ExchangeAccessRefused("operation not permitted on the default exchange")
            found = self._exchanges.get(name)
            if found is None:
                raise ExchangeNotFound(f"no exchange '{name}' in vhost '/'")
            return found
        # RabbitMQ's order: the type first, then the default exchange, then the name.
        kind = _exchange_type(type)
        if not name:
            raise ExchangeAccessRefused("operation not permitted on the default exchange")
        args = dict(arguments) if arguments else {}
        wanted = Exchange(name, kind, durable, auto_delete, internal, args)
        existing = self._exchanges.get(name)
        if existing is None:
            if _reserved(name):
                raise ExchangeAccessRefused(
                    f"exchange name {name!r} contains reserved prefix 'amq.*'"
                )
            payload = _exchange_json(wanted)  # also refuses arguments that cannot be stored
            self._add_exchange(wanted)
            if durable:
                self._exchange_table.put(name, payload, {})
            return wanted
        for what, field in _EQUIVALENT:
            if field(existing) != field(wanted):
                raise ExchangeMismatch(
                    f"inequivalent arg '{what}' for exchange '{name}' in vhost '/': "
                    f"received '{_shown(field(wanted))}' but current is '{_shown(field(existing))}'"
                )
        return existing

    def delete(self, name: str, *, if_unused: bool = False) -> None:
        """exchange.delete; also removes the bindings it is the source or destination of.
        (RabbitMQ answers delete-ok for an absent exchange: the adapter may catch
        ExchangeNotFound to do the same.)"""
        if not name:
            raise ExchangeAccessRefused("operation not permitted on the default exchange")
        if _reserved(name):
            raise ExchangeAccessRefused(f"deletion of system exchange {name!r} not allowed")
        if name not in self._exchanges:
            raise ExchangeNotFound(f"no exchange '{name}' in vhost '/'")
        if if_unused and name in self._by_source:
            raise ExchangeInUse(f"exchange {name!r} in use")
        self._remove_bindings(self._forget_exchange(name))

    def has_bindings(self, exchange: str) -> bool:
        """Whether ``exchange`` is the source of any binding (if-unused's test)."""
        return exchange in self._by_source

    # -- bindings --------------------------------------------------------------------------------

    def bind_queue(
        self,
        queue: str,
        exchange: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        self._bind(QUEUE, queue, exchange, routing_key, arguments)

    def unbind_queue(
        self,
        queue: str,
        exchange: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """queue.unbind; a binding, queue or exchange that is not there is fine (as in
        RabbitMQ)."""
        self._unbind(QUEUE, queue, exchange, routing_key, arguments)

    def bind_exchange(
        self,
        destination: str,
        source: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        self._bind(EXCHANGE, destination, source, routing_key, arguments)

    def unbind_exchange(
        self,
        destination: str,
        source: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        self._unbind(EXCHANGE, destination, source, routing_key, arguments)

    def queue_deleted(self, queue: str) -> None:
        """Drop the queue's bindings (auto-delete exchanges left without any go too)."""
        bindings = self._by_dest.get((QUEUE, queue))
        if bindings:
            self._remove_bindings(bindings)

    def bindings(self) -> list[Binding]:
        """Every explicit binding, oldest first (the default exchange's are implicit)."""
        return list(self._bindings)

    # -- routing ---------------------------------------------------------------------------------

    def route(
        self, exchange: str, routing_key: str, headers: Mapping[str, Any] | None = None
    ) -> list[str]:
        """The queues a publish reaches, each once, through any exchange-to-exchange
        bindings (depth first; each exchange is matched once, so cycles end). The order is
        stable for a given set of bindings: binding order, except that a topic exchange
        gives its trie's order."""
        if not exchange:
            if routing_key in self.manager.queues and not routing_key.startswith("$"):
                return [routing_key]
            return []
        table = self._tables.get(exchange)
        if table is None:
            raise ExchangeNotFound(f"no exchange '{exchange}' in vhost '/'")
        found = table.match(routing_key, headers)
        if table.exchange_dests:
            return self._route_through(exchange, found, routing_key, headers)
        # A queue deleted without queue_deleted() must not be recreated by the publish.
        queues = self.manager.queues
        out: list[str] = []
        for _kind, name in found:  # a loop, not a comprehension: no frame on 3.11
            if name in queues:
                out.append(name)
        return out

    def _route_through(
        self,
        exchange: str,
        found: Iterable[Dest],
        routing_key: str,
        headers: Mapping[str, Any] | None,
    ) -> list[str]:
        # Depth-first with an explicit stack: a long chain of exchanges cannot exhaust
        # Python's; each exchange is matched at most once, so cycles end.
        queues = self.manager.queues
        tables = self._tables
        out: dict[str, None] = {}
        seen = {exchange}
        stack: list[Iterator[Dest]] = [iter(found)]
        while stack:
            for kind, name in stack[-1]:
                if kind == QUEUE:
                    if name in queues:
                        out[name] = None
                elif name not in seen:
                    seen.add(name)
                    table = tables.get(name)
                    if table is not None:
                        stack.append(iter(table.match(routing_key, headers)))
                        break
            else:
                stack.pop()
        return list(out)

    # -- internals -------------------------------------------------------------------------------

    def _add_exchange(self, exchange: Exchange) -> None:
        self._exchanges[exchange.name] = exchange
        if exchange.name:  # the default exchange routes by queue name, without a table
            self._tables[exchange.name] = _TABLES[exchange.type]()

    def _forget_exchange(self, name: str) -> list[Binding]:
        """Remove an exchange; returns the bindings still naming it, for the caller to drop."""
        exchange = self._exchanges.pop(name)
        del self._tables[name]
        if exchange.durable:
            self._exchange_table.delete(name)
        return [*self._by_source.get(name, ()), *self._by_dest.get((EXCHANGE, name), ())]

    def _require(self, name: str) -> Exchange:
        exchange = self._exchanges.get(name)
        if exchange is None:
            raise ExchangeNotFound(f"no exchange '{name}' in vhost '/'")
        return exchange

    def _destination_durable(self, kind: str, name: str) -> bool:
        if kind == QUEUE:
            queue = self.manager.queues.get(name)
            if queue is None:
                raise QueueNotFound(f"no queue '{name}' in vhost '/'")
            return queue.options.durable
        return self._require(name).durable

    def _binding(
        self,
        kind: str,
        destination: str,
        source: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None,
    ) -> tuple[Binding, bool]:
        """The binding named by a (un)bind request and whether it is durable, once its
        ends are checked (in RabbitMQ's order: default exchange, source, destination)."""
        if not source or (kind == EXCHANGE and not destination):
            raise ExchangeAccessRefused("operation not permitted on the default exchange")
        durable = self._require(source).durable
        durable &= self._destination_durable(kind, destination)
        args = canonical_arguments(arguments)
        return Binding(source, kind, destination, routing_key, args), durable

    def _bind(
        self,
        kind: str,
        destination: str,
        source: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None,
    ) -> None:
        binding, durable = self._binding(kind, destination, source, routing_key, arguments)
        if binding not in self._bindings:
            self._link(binding, dict(arguments) if arguments else {}, durable, persist=True)

    def _unbind(
        self,
        kind: str,
        destination: str,
        source: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None,
    ) -> None:
        try:
            binding, _durable = self._binding(kind, destination, source, routing_key, arguments)
        except (ExchangeNotFound, QueueNotFound):
            # Idempotent, as in RabbitMQ: aio-pika's RPC.close() unbinds its auto-delete
            # result queue after cancelling the consumer that queue went with.
            return
        if binding in self._bindings:
            self._remove_bindings([binding])

    def _link(
        self, binding: Binding, args: Mapping[str, Any], durable: bool, *, persist: bool
    ) -> None:
        dest = (binding.dest_kind, binding.destination)
        self._tables[binding.source].add(binding, dest, args)  # first: it may refuse args
        self._bindings[binding] = durable
        self._by_source.setdefault(binding.source, {})[binding] = None
        self._by_dest.setdefault(dest, {})[binding] = None
        if durable and persist:
            self._binding_table.put(binding_key(binding), _binding_json(binding, args), {})

    def _unlink(self, binding: Binding) -> None:
        durable = self._bindings.pop(binding)
        dest = (binding.dest_kind, binding.destination)
        _discard(self._by_source, binding.source, binding)
        _discard(self._by_dest, dest, binding)
        table = self._tables.get(binding.source)
        if table is not None:  # None: the source itself is being deleted
            table.remove(binding, dest)
        if durable:
            self._binding_table.delete(binding_key(binding))

    def _remove_bindings(self, bindings: Iterable[Binding]) -> None:
        """Remove bindings; an auto-delete exchange losing its last binding as source goes
        too, with its own bindings (a worklist, so cascades of any length are fine)."""
        pending = list(bindings)
        while pending:
            binding = pending.pop()
            if binding not in self._bindings:
                continue
            self._unlink(binding)
            source = binding.source
            exchange = self._exchanges.get(source)
            if exchange is not None and exchange.auto_delete and source not in self._by_source:
                pending.extend(self._forget_exchange(source))

    def _restore(self) -> None:
        """Bring back the durable exchanges and bindings the journal recovered."""
        table = self._exchange_table
        for name, entry in table.items():
            try:
                exchange = _exchange_from_json(name, entry.payload)
            except (ValueError, KeyError, TypeError) as err:
                log.warning("unreadable exchange record dropped", exchange=name, error=str(err))
                table.delete(name)
                continue
            if _reserved(name) or not exchange.durable:
                table.delete(name)
                continue
            self._add_exchange(exchange)
        lost_sources: list[str] = []
        bindings = self._binding_table
        for key, entry in bindings.items():
            try:
                binding, args = _binding_from_json(entry.payload)
            except (ValueError, KeyError, TypeError) as err:
                log.warning("unreadable binding record dropped", key=key, error=str(err))
                bindings.delete(key)
                continue
            # The destination queue may have gone before the restart without our hearing.
            alive = binding.source in self._exchanges and (
                binding.destination in self.manager.queues
                if binding.dest_kind == QUEUE
                else binding.destination in self._exchanges
            )
            if binding in self._bindings:  # a copy under an older key
                if key != binding_key(binding):
                    bindings.delete(key)
                continue
            if not alive:
                bindings.delete(key)
                lost_sources.append(binding.source)
                continue
            try:
                self._link(binding, args, True, persist=False)
            except CoreError as err:
                log.warning("invalid binding record dropped", key=key, error=str(err))
                bindings.delete(key)
                continue
            new_key = binding_key(binding)
            if new_key != key:  # written by an older encoding: keep it findable
                bindings.delete(key)
                bindings.put(new_key, entry.payload, {})
        # Only once every binding is back can "lost its last binding" be told.
        for name in lost_sources:
            source = self._exchanges.get(name)
            if source is not None and source.auto_delete and name not in self._by_source:
                self._remove_bindings(self._forget_exchange(name))
        if len(self._exchanges) > len(PREDECLARED) or self._bindings:
            log.info(
                "exchanges restored",
                exchanges=len(self._exchanges) - len(PREDECLARED),
                bindings=len(self._bindings),
            )
