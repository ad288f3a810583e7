"""The WebSocket listener's Origin check (server/websocket.py) alone: how an ``Origin``
header and the allowed patterns are written for comparison, and what matches."""

from __future__ import annotations

import pytest

from vibemq_server.config import LOOPBACK_ORIGINS, load_config
from vibemq_server.server.websocket import origin_allowed, origin_key, origin_patterns

LOOPBACK = origin_patterns(LOOPBACK_ORIGINS)


@pytest.mark.parametrize(
    ("origin", "key"),
    [
        ("http://127.0.0.1", "http://127.0.0.1:80"),
        ("HTTPS://App.Example.com", "https://app.example.com:443"),
        ("http://[::1]:3000", "http://[::1]:3000"),
        ("https://a.example:8443/", "https://a.example:8443"),
        ("null", "null"),
        ("file://", None),  # no host
        ("ftp://a.example", None),  # not a web origin
        ("http://user@a.example", None),
        ("http://a.example/path", None),
        ("http://a.example?x", None),
        ("http://a.example:99999", None),
        ("", None),
    ],
)
def test_origin_key(origin: str, key: str | None) -> None:
    assert origin_key(origin) == key


def test_patterns_get_the_default_port_and_keep_ipv6_brackets_literal() -> None:
    assert origin_patterns(["https://App.example.com/", "http://[::1]", "*", "null"]) == (
        "https://app.example.com:443",
        "http://[[]::1]:80",
        "*",
        "null",
    )


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://localhost", True),
        ("http://localhost:5173", True),
        ("https://127.0.0.1:8443", True),
        ("http://[::1]:8080", True),
        ("http://[::2]:8080", False),
        ("http://localhost.evil.example", False),
        ("https://evil.example", False),
        ("http://127.0.0.1.evil.example", False),
        ("null", False),
        ("not an origin", False),
    ],
)
def test_the_default_lets_in_loopback_pages_only(origin: str, allowed: bool) -> None:
    assert origin_allowed(origin, LOOPBACK) is allowed


def test_a_configured_list() -> None:
    patterns = origin_patterns(["https://app.example.com", "https://*.example.org", "null"])
    assert origin_allowed("https://app.example.com", patterns)
    assert origin_allowed("https://app.example.com:443", patterns)
    assert not origin_allowed("https://app.example.com:8443", patterns)
    assert not origin_allowed("http://app.example.com", patterns)
    assert origin_allowed("https://x.y.example.org", patterns)
    assert not origin_allowed("https://example.org.evil.example", patterns)
    assert origin_allowed("null", patterns)
    assert origin_allowed("https://anything.example", origin_patterns(["*"]))


def test_the_allow_list_from_the_environment() -> None:
    env = {"VIBEMQ_MQTT__WS_ALLOWED_ORIGINS": "https://app.example.com, http://localhost:*"}
    assert load_config(None, env).mqtt.ws_allowed_origins == [
        "https://app.example.com",
        "http://localhost:*",
    ]
    env = {"VIBEMQ_MQTT__WS_ALLOWED_ORIGINS": '["*"]'}
    assert load_config(None, env).mqtt.ws_allowed_origins == ["*"]
    assert load_config(None, {}).mqtt.ws_allowed_origins == list(LOOPBACK_ORIGINS)


def test_star_is_the_only_wildcard() -> None:
    assert not origin_allowed("https://ab.example", origin_patterns(["https://a?.example"]))
    assert not origin_allowed("https://a.example", origin_patterns(["https://[a].example"]))
    assert origin_allowed("https://ab.example", origin_patterns(["https://a*.example"]))
