"""The journal's direct encoders write exactly what the generic record encoder writes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vibemq_server.core.persistence import SettleReason
from vibemq_server.journal.records import (
    Deliver,
    Publish,
    QueueRecords,
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


@given(
    u64,
    u64,
    name,
    name,
    u64,
    u64,
    st.integers(0, 3),
    st.integers(0, 65535),
    st.dictionaries(name, name, max_size=3),
    st.binary(max_size=200),
    st.sampled_from(list(SettleReason)),
    st.text(max_size=20),
)
def test_queue_records(
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
    reason: SettleReason,
    detail: str,
) -> None:
    """The journal's per-queue encoders (pieces made once per queue) write the very bytes
    of the generic encoder, for every record type, with and without headers and detail."""
    records = QueueRecords(q)
    publish = Publish(seq, q, mid, pub, exp, prio, attempts, headers, payload)
    fast = records.publish(ts, seq, mid, pub, exp, prio, attempts, headers, payload)
    assert fast == encode_record(publish, ts)
    assert decode_record(fast).record == publish
    # the same encoder again (its cached layout for this id length)
    assert records.publish(ts, seq, mid, pub, exp, prio, attempts, headers, payload) == fast
    deliver = records.deliver(ts, seq, attempts)
    assert deliver == encode_record(Deliver(seq, q, attempts), ts)
    settle = records.settle(ts, seq, reason, detail)
    assert settle == encode_record(Settle(seq, q, reason, detail), ts)
    assert decode_record(settle).record == Settle(seq, q, reason, detail)
