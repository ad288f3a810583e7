"""The definitions document's validation (vibemq_server/management/definitions.py): a bad
document is refused before anything is imported, and the error names the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from vibemq_server.auth.passwords import hash_password
from vibemq_server.management.definitions import Definitions, parse_definitions


def _error_at(doc: Any) -> tuple[tuple[int | str, ...], str]:
    with pytest.raises(ValidationError) as raised:
        parse_definitions(doc)
    [error] = raised.value.errors()
    return tuple(error["loc"]), error["msg"]


def test_an_empty_document_is_valid() -> None:
    assert parse_definitions("{}") == Definitions()
    assert parse_definitions(b'{"queues": [{"name": "q"}]}').queues[0].durable is True


@pytest.mark.parametrize(
    ("doc", "loc"),
    [
        (
            {"queues": [{"name": "q", "options": {"max_queue_size": 0}}]},
            ("queues", 0, "options", "max_queue_size"),
        ),
        (
            {"queues": [{"name": "q", "options": {"delivery_mode": "Sideways"}}]},
            ("queues", 0, "options", "delivery_mode"),
        ),
        ({"queues": [{"name": "q", "colour": "red"}]}, ("queues", 0, "colour")),
        ({"queues": [{"name": ""}]}, ("queues", 0, "name")),
        ({"queues": [{"name": "$mqtt.s.x"}]}, ("queues", 0, "name")),
        ({"exchanges": [{"name": "x", "type": "fanin"}]}, ("exchanges", 0, "type")),
        (
            {"bindings": [{"source": "x", "destination": "q", "destination_type": "topic"}]},
            ("bindings", 0, "destination_type"),
        ),
        ({"users": [{"name": "alice", "password_hash": "hunter2"}]}, ("users", 0, "password_hash")),
        ({"permissions": [{"user": "alice", "read": "(unclosed"}]}, ("permissions", 0)),
        ({"format": 2}, ("format",)),
        ({"users": "alice"}, ("users",)),
    ],
)
def test_errors_name_the_field(doc: dict[str, Any], loc: tuple[int | str, ...]) -> None:
    assert _error_at(doc)[0] == loc


def test_duplicates_are_refused() -> None:
    _loc, msg = _error_at({"queues": [{"name": "q"}, {"name": "q"}]})
    assert "queues: 'q' is given twice" in msg


def test_malformed_json_is_a_validation_error() -> None:
    with pytest.raises(ValidationError):
        parse_definitions('{"queues": [')


def test_a_real_hash_is_accepted() -> None:
    doc = parse_definitions({"users": [{"name": "alice", "password_hash": hash_password("pw", 4)}]})
    assert doc.users[0].tags == []
