"""The payload rule (protocol/payload.py): a byte protocol's bytes enter the core raw and are
converted to the VibeMQ form only by ``as_vibemq``; ``from_core`` undoes either form."""

from __future__ import annotations

import base64

import pytest

from vibemq_server.protocol import mme
from vibemq_server.protocol.payload import (
    BASE64,
    JOURNAL_RAW,
    MULTIPART_HEADERS,
    MULTIPART_RAW_HEADERS,
    PAYLOAD_ENCODING,
    RAW,
    as_vibemq,
    from_core,
    from_journal,
    multipart_from_core,
    to_core,
    to_journal,
    to_vibemq,
)

BODIES = [b"", b'{"a": [1, 2]}', b"42", b"not json", b"\x00\xff\x10binary", b'"quoted"', b"[1,"]


@pytest.mark.parametrize("body", BODIES)
def test_to_core_keeps_the_bytes_and_from_core_gives_them_back(body: bytes) -> None:
    payload, encoding = to_core(body)
    assert (payload, encoding) == (body, RAW)
    assert from_core(payload, {PAYLOAD_ENCODING: encoding}) == body


@pytest.mark.parametrize("body", BODIES)
def test_as_vibemq_is_the_old_rule_and_round_trips(body: bytes) -> None:
    headers = {"mqttTopic": "a/b", PAYLOAD_ENCODING: RAW}
    payload, out = as_vibemq(body, headers)
    expected, encoding = to_vibemq(body)
    assert payload == expected
    assert out.get(PAYLOAD_ENCODING) == encoding
    assert out["mqttTopic"] == "a/b"
    assert RAW not in out.values()
    assert from_core(payload, out) == body
    assert headers == {"mqttTopic": "a/b", PAYLOAD_ENCODING: RAW}  # the stored dict untouched


def test_json_stays_json_and_binary_becomes_base64() -> None:
    assert as_vibemq(b"[1]", {PAYLOAD_ENCODING: RAW}) == (b"[1]", {})
    payload, headers = as_vibemq(b"\x01\x02", {PAYLOAD_ENCODING: RAW})
    assert (payload, dict(headers)) == (b'"AQI="', {PAYLOAD_ENCODING: BASE64})


def test_as_vibemq_leaves_other_messages_alone() -> None:
    for headers in ({}, {PAYLOAD_ENCODING: BASE64}, {"k": "v"}):
        payload, out = as_vibemq(b'"AQI="', headers)
        assert payload == b'"AQI="'
        assert out is headers


def test_shared_headers_give_shared_forms() -> None:
    headers = {"amqpProperties": "AAA=", PAYLOAD_ENCODING: RAW}
    first = as_vibemq(b"x", headers)[1]
    assert as_vibemq(b"y", headers)[1] is first
    assert as_vibemq(b"{}", headers)[1] is as_vibemq(b"[]", headers)[1]


def test_a_raw_multipart_message_is_always_base64_for_vibemq() -> None:
    parts = [b"{}", b"\x00binary", b""]
    body = mme.encode(parts)
    assert multipart_from_core(body, MULTIPART_RAW_HEADERS) == parts
    payload, headers = as_vibemq(body, MULTIPART_RAW_HEADERS)
    assert dict(headers) == dict(MULTIPART_HEADERS)
    assert payload == b'"' + base64.b64encode(body) + b'"'
    assert multipart_from_core(payload, headers) == parts


def test_the_same_message_is_converted_once_for_a_fan_out() -> None:
    body = b"\x00" * 100
    headers = {PAYLOAD_ENCODING: RAW}
    first = as_vibemq(body, headers)
    again = as_vibemq(body, headers)
    assert again[0] is first[0]
    assert again[1] is first[1]
    other = as_vibemq(b"\x01" * 100, headers)
    assert other[0] is not first[0]
    assert from_core(*other) == b"\x01" * 100


def test_a_large_payload_is_not_pinned_by_the_memo() -> None:
    big = bytes(range(256)) * (8 << 10)  # 2 MiB, not JSON
    headers = {PAYLOAD_ENCODING: RAW}
    first = as_vibemq(big, headers)
    again = as_vibemq(big, headers)
    assert again == first
    assert again[0] is not first[0]
    assert from_core(*again) == big


@pytest.mark.parametrize("body", BODIES)
def test_the_journal_form_is_the_vibemq_form_and_comes_back_raw(body: bytes) -> None:
    headers = {"mqttTopic": "a/b", PAYLOAD_ENCODING: RAW}
    payload, out = to_journal(body, headers)
    vibemq_payload, vibemq_headers = as_vibemq(body, headers)
    assert payload == vibemq_payload
    assert dict(out) == {**vibemq_headers, JOURNAL_RAW: "1"}
    restored_payload, restored = from_journal(payload, dict(out))
    assert (restored_payload, restored) == (body, headers)


def test_other_journal_records_are_left_alone() -> None:
    for headers in ({}, {PAYLOAD_ENCODING: BASE64}, {"k": "v"}):
        assert to_journal(b'"AQI="', headers)[1] is headers
        assert from_journal(b'"AQI="', headers)[1] is headers


def test_a_multipart_message_comes_back_raw_from_the_journal() -> None:
    body = mme.encode([b"a", b"\x00"])
    payload, headers = to_journal(body, MULTIPART_RAW_HEADERS)
    assert from_journal(payload, headers) == (body, dict(MULTIPART_RAW_HEADERS))
