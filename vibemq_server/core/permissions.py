"""One permission model for every protocol: RabbitMQ's three regular expressions per user.

``configure`` (create, delete, declare, bind, purge), ``write`` (publish) and ``read``
(subscribe, consume, get, browse) are matched against an address of the shared address space:
a queue or exchange name, an MQTT topic or filter in its dot form (``a/+/c`` is ``a.+.c``).
As in RabbitMQ a pattern matches anywhere unless anchored (``re.search``), ``.*`` allows
everything and the empty pattern nothing. ``%u`` and ``%c`` stand for the user name and the
client id (Mosquitto's ACL substitution), inserted literally (escaped). Each connection has
its own ``Access``, which caches every decision per (operation, address); when the user's
permissions change (the users file reloaded) ``update`` gives every live ``Access`` of that
user the new patterns, so the next operation of an open connection is judged by them. (The
authenticator finds the live ones through their ``handle``s, held weakly.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from enum import IntEnum

from vibemq_server.core.native import mypyc_attr


class Operation(IntEnum):
    """An int (C-level hash, a list index): checked once per publish on the hot path."""

    CONFIGURE = 0
    WRITE = 1
    READ = 2

    @property
    def label(self) -> str:
        return self.name.lower()


#: a user everything is allowed to (anonymous clients, plain-config users, tokens' default)
FULL_ACCESS: Mapping[str, str] = {"configure": ".*", "write": ".*", "read": ".*"}
#: a user nothing is allowed to (one deleted from the users file while connected)
NO_ACCESS: Mapping[str, str] = {"configure": "", "write": "", "read": ""}
_CACHE_LIMIT = 4096


def _compile(pattern: str, user: str, client_id: str) -> re.Pattern[str] | None:
    if not pattern:
        return None  # RabbitMQ: "" grants nothing
    text = pattern.replace("%u", re.escape(user)).replace("%c", re.escape(client_id))
    return re.compile(text)


@mypyc_attr(native_class=False)
class Handle:
    """What the authenticator keeps of a live ``Access``, weakly: the compiled build's
    ``Access`` cannot be weakly referenced itself. It lives as long as its Access (the two
    refer to each other: once a connection drops its Access, both are garbage together)."""

    __slots__ = ("__weakref__", "access")

    def __init__(self, access: Access) -> None:
        self.access = access


class Access:
    """What one connection's user may do; ``allowed`` is cached per (operation, address).

    Compiled (core/permissions is a hot module): every publish reads ``everything`` from
    the compiled sessions, natively, not by name (~160 instructions a publish)."""

    __slots__ = ("_cache", "_patterns", "client_id", "everything", "handle", "user")

    def __init__(self, permissions: Mapping[str, str], user: str, client_id: str = "") -> None:
        self.user = user
        self.client_id = client_id
        self.handle = Handle(self)
        self.update(permissions)

    def update(self, permissions: Mapping[str, str]) -> None:
        """Judge from now on by ``permissions`` (the cached decisions are forgotten)."""
        self.everything = all(permissions.get(op.label) == ".*" for op in Operation)
        if self.everything:
            # (most connections: nothing to match or cache, so no lists per connection)
            self._patterns: Sequence[re.Pattern[str] | None] = ()
            self._cache: Sequence[dict[str, bool]] = ()
            return
        self._patterns = [
            _compile(permissions.get(op.label, ""), self.user, self.client_id) for op in Operation
        ]
        #: per operation: address -> decision
        self._cache = [{} for _ in Operation]

    def allowed(self, operation: Operation, address: str) -> bool:
        if self.everything:
            return True
        cache = self._cache[operation]
        decision = cache.get(address)
        if decision is None:
            pattern = self._patterns[operation]
            decision = pattern is not None and pattern.search(address) is not None
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            cache[address] = decision
        return decision


#: what a connection may do before it has logged in (the sessions' placeholder until their
#: login decides: one shared object, never updated, instead of one per connection)
BEFORE_LOGIN = Access(FULL_ACCESS, "")


def check_patterns(permissions: Mapping[str, str]) -> None:
    """Raise re.error when a pattern (with %u/%c substituted) does not compile."""
    for op in Operation:
        _compile(permissions.get(op.label, ""), "user", "client")
