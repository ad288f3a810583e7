"""core.permissions: RabbitMQ's regex semantics, %u/%c substitution, the cache."""

from __future__ import annotations

import re

import pytest

from vibemq_server.core.permissions import FULL_ACCESS, Access, Operation, check_patterns

W, R, C = Operation.WRITE, Operation.READ, Operation.CONFIGURE


def test_patterns_search_anywhere_unless_anchored() -> None:
    access = Access({"configure": "", "write": "^a\\.", "read": "b"}, "u")
    assert access.allowed(W, "a.x") and not access.allowed(W, "x.a.x")
    assert access.allowed(R, "x.b.y")  # unanchored: anywhere, as re:run in RabbitMQ
    assert not access.allowed(C, "anything")  # "" grants nothing
    assert access.allowed(W, "a.x")  # cached answers are the same


def test_substitution_is_literal() -> None:
    access = Access({"configure": "", "write": "^%u\\.", "read": "^inbox\\.%c$"}, "a.b", "c+1")
    assert access.allowed(W, "a.b.x")
    assert not access.allowed(W, "aXb.x")  # the "." of the user name is not a wildcard
    assert access.allowed(R, "inbox.c+1") and not access.allowed(R, "inbox.cc1")


def test_full_access_and_bad_patterns() -> None:
    assert Access(FULL_ACCESS, "x").everything
    with pytest.raises(re.error):
        check_patterns({"configure": "(", "write": ".*", "read": ".*"})
