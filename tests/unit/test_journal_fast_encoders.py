"""The journal's direct encoders write exactly what the generic record encoder writes."""

from __future__ import annotations

from collections.abc import Mapping

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


def _publishes(max_headers: int) -> st.SearchStrategy[Publish]:
    return st.builds(
        Publish,
        u64,
        name,
        name,
        u64,
        u64,
        st.integers(0, 3),
        st.integers(0, 65535),
        st.dictionaries(name, name, max_size=max_headers),
        st.binary(max_size=200),
    )


def _after_queue(p: Publish) -> tuple[str, int, int, int, int, Mapping[str, str], bytes]:
    """A PUBLISH record's fields after its queue, as the direct encoders take them."""
    return p.message_id, p.published_at, p.expires_at, p.priority, p.attempts, p.headers, p.payload


@given(u64, _publishes(5))
def test_publish(ts: int, record: Publish) -> None:
    fast = encode_publish(ts, record.seq, record.queue, *_after_queue(record))
    assert fast == encode_record(record, ts)
    assert decode_record(fast).record == record


@given(u64, u64, name, st.integers(0, 65535))
def test_deliver(ts: int, seq: int, q: str, attempts: int) -> None:
    assert encode_deliver(ts, seq, q, attempts) == encode_record(Deliver(seq, q, attempts), ts)


@given(u64, u64, name, st.sampled_from(list(SettleReason)), st.text(max_size=20))
def test_settle(ts: int, seq: int, q: str, reason: SettleReason, detail: str) -> None:
    fast = encode_settle(ts, seq, q, reason, detail)
    assert fast == encode_record(Settle(seq, q, reason, detail), ts)


@given(u64, _publishes(3), st.sampled_from(list(SettleReason)), st.text(max_size=20))
def test_queue_records(ts: int, publish: Publish, reason: SettleReason, detail: str) -> None:
    """The journal's per-queue encoders (pieces made once per queue) write the very bytes
    of the generic encoder, for every record type, with and without headers and detail."""
    seq, q, attempts = publish.seq, publish.queue, publish.attempts
    records = QueueRecords(q)
    fast = records.publish(ts, seq, *_after_queue(publish))
    assert fast == encode_record(publish, ts)
    assert decode_record(fast).record == publish
    # the same encoder again (its cached layout for this id length)
    assert records.publish(ts, seq, *_after_queue(publish)) == fast
    deliver = records.deliver(ts, seq, attempts)
    assert deliver == encode_record(Deliver(seq, q, attempts), ts)
    settle = records.settle(ts, seq, reason, detail)
    assert settle == encode_record(Settle(seq, q, reason, detail), ts)
    assert decode_record(settle).record == Settle(seq, q, reason, detail)
