"""The journal's direct encoders write exactly what the generic record encoder writes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vibemq_server.core.persistence import SettleReason
from vibemq_server.journal.records import (
    Deliver,
    Publish,
    Settle,
    decode_record,
    encode_deliver,
    encode_publish,
    encode_record,
    encode_settle,
)

u64 = st.integers(0, 2**64 - 1)
name = st.text(min_size=1, max_size=30)


@given(
    u64,
    u64,
    name,
    name,
    u64,
    u64,
    st.integers(0, 3),
    st.integers(0, 65535),
    st.dictionaries(name, name, max_size=5),
    st.binary(max_size=200),
)
def test_publish(
    ts: int,
    seq: int,
    q: str,
    mid: str,
    pub: int,
    exp: int,
    prio: int,
    attempts: int,
    headers: dict[str, str],
    payload: bytes,
) -> None:
    fast = encode_publish(ts, seq, q, mid, pub, exp, prio, attempts, headers, payload)
    record = Publish(seq, q, mid, pub, exp, prio, attempts, headers, payload)
    assert fast == encode_record(record, ts)
    assert decode_record(fast).record == record


@given(u64, u64, name, st.integers(0, 65535))
def test_deliver(ts: int, seq: int, q: str, attempts: int) -> None:
    assert encode_deliver(ts, seq, q, attempts) == encode_record(Deliver(seq, q, attempts), ts)


@given(u64, u64, name, st.sampled_from(list(SettleReason)), st.text(max_size=20))
def test_settle(ts: int, seq: int, q: str, reason: SettleReason, detail: str) -> None:
    fast = encode_settle(ts, seq, q, reason, detail)
    assert fast == encode_record(Settle(seq, q, reason, detail), ts)
