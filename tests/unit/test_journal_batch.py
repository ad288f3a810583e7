"""The journal's write-batch encoder (vibemq_server/journal/batch.py, issue 15): the C one
(``_recbuf.c``) writes byte for byte what the pure one writes, and both what the record
encoders of records.py (the on-disk format) write, for any run of records."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vibemq_server.core.persistence import SettleReason
from vibemq_server.journal import batch
from vibemq_server.journal.batch import PyRecordBuffer, RecordSink, record_end
from vibemq_server.journal.records import _s16 as s16
from vibemq_server.journal.records import (
    decode_record,
    encode_deliver,
    encode_publish,
    encode_settle,
    iter_records,
)

u64 = st.integers(0, 2**64 - 1)
text = st.text(max_size=30)

publish_op = st.tuples(
    st.just("publish"),
    u64,
    text,
    u64,
    u64,
    st.integers(0, 255),
    st.integers(0, 65535),
    st.binary(max_size=300),
)
stamp_op = st.tuples(st.just("stamp"), u64)
deliver_op = st.tuples(st.just("deliver"), u64, st.integers(0, 65535))
settle_op = st.tuples(st.just("settle"), u64, st.sampled_from(list(SettleReason)), text)
settle_all_op = st.tuples(
    st.just("settle_all"), st.lists(u64, max_size=5), st.sampled_from(list(SettleReason))
)
ops = st.lists(st.one_of(publish_op, stamp_op, deliver_op, settle_op, settle_all_op), max_size=25)

Op = tuple[object, ...]


def _compiled() -> RecordSink:
    from vibemq_server.journal._recbuf import RecordBuffer

    return RecordBuffer()


def _apply(sink: RecordSink, queue: str, run: list[Op]) -> list[object]:
    """The records of ``run`` appended to ``sink``; the offsets publish gave."""
    name16 = s16(queue)
    offsets = []
    for op in run:
        if op[0] == "publish":
            _, seq, mid, pub, exp, prio, attempts, payload = op
            offsets.append(sink.publish(name16, seq, mid, pub, exp, prio, attempts, payload))  # type: ignore[arg-type]
        elif op[0] == "stamp":
            sink.stamp(op[1])  # type: ignore[arg-type]
        elif op[0] == "deliver":
            _, seq, attempts = op
            sink.deliver(name16, seq, attempts)  # type: ignore[arg-type]
        elif op[0] == "settle":
            _, seq, reason, detail = op
            sink.settle(name16, seq, reason, detail)  # type: ignore[arg-type]
        else:
            _, seqs, reason = op
            sink.settle_all(name16, seqs, reason)  # type: ignore[arg-type]
    return offsets


def _reference(queue: str, run: list[Op], ts: int = 0) -> bytes:
    """The same records from records.py's encoders (the format's reference): a PUBLISH at
    its publish time, the others at the last stamp (``ts`` before any: a stamp outlives
    the batch's take)."""
    out = []
    for op in run:
        if op[0] == "publish":
            _, seq, mid, pub, exp, prio, attempts, payload = op
            out.append(encode_publish(pub, seq, queue, mid, pub, exp, prio, attempts, {}, payload))  # type: ignore[arg-type]
        elif op[0] == "stamp":
            ts = op[1]  # type: ignore[assignment]
        elif op[0] == "deliver":
            _, seq, attempts = op
            out.append(encode_deliver(ts, seq, queue, attempts))  # type: ignore[arg-type]
        elif op[0] == "settle":
            _, seq, reason, detail = op
            out.append(encode_settle(ts, seq, queue, reason, detail))  # type: ignore[arg-type]
        else:
            _, seqs, reason = op
            out += [encode_settle(ts, seq, queue, reason, "") for seq in seqs]  # type: ignore[attr-defined, arg-type]
    return b"".join(out)


def test_the_compiled_encoder_is_built() -> None:
    assert batch.COMPILED, "build it: pip install -e . or scripts/build_ext.sh"


@given(st.text(min_size=1, max_size=40), ops, ops)
def test_compiled_and_pure_write_the_records_of_the_format(
    queue: str, first: list[Op], second: list[Op]
) -> None:
    expected = _reference(queue, first)
    pure, compiled = PyRecordBuffer(), _compiled()
    offsets = _apply(pure, queue, first)
    assert _apply(compiled, queue, first) == offsets
    assert len(pure) == len(compiled) == len(expected)
    data = compiled.take()
    assert data == pure.take() == expected
    assert len(pure) == len(compiled) == 0
    # every record decodes, and a publish's offset finds its record and its end
    entries = list(iter_records(data, 0))
    kinds = [
        kind
        for op in first
        if op[0] != "stamp"
        for kind in ([op[0]] if op[0] != "settle_all" else ["settle"] * len(op[1]))  # type: ignore[arg-type]
    ]
    assert len(entries) == len(kinds)
    publishes = [e for e, kind in zip(entries, kinds, strict=True) if kind == "publish"]
    assert [e.offset for e in publishes] == offsets
    for entry, offset in zip(publishes, offsets, strict=True):
        assert isinstance(offset, int)
        at = offset
        assert record_end(data, at) == at + entry.size
        assert decode_record(data, at).record == entry.record
    # the next batch starts over, with the buffer's memory and its stamp kept
    assert _apply(compiled, queue, second) == _apply(pure, queue, second)
    stamped = [op[1] for op in first if op[0] == "stamp"]
    ts = stamped[-1] if stamped else 0
    assert compiled.take() == pure.take() == _reference(queue, second, ts)  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [PyRecordBuffer, _compiled], ids=["pure", "compiled"])
def test_out_of_range_fields_are_refused_and_leave_the_batch_as_it_was(
    make: type[RecordSink],
) -> None:
    sink = make()
    name16 = s16("q")
    sink.stamp(1)
    sink.deliver(name16, 2, 3)
    before = len(sink)
    bad_calls: list[Callable[[], object]] = [
        lambda: sink.publish(name16, 1, "m", -1, 0, 0, 0, b"{}"),
        lambda: sink.publish(name16, 1, "m", 2**64, 0, 0, 0, b"{}"),
        lambda: sink.publish(name16, 1, "m", 0, 0, 256, 0, b"{}"),
        lambda: sink.publish(name16, 1, "m", 0, 0, 0, 65536, b"{}"),
        lambda: sink.publish(name16, 1, "m" * 65536, 0, 0, 0, 0, b"{}"),
        lambda: sink.deliver(name16, 1, 65536),
        lambda: sink.settle(name16, 1, 256, ""),
        lambda: sink.settle(name16, -5, 0, ""),
        lambda: sink.settle_all(name16, [1, 2, -5], 0),
        lambda: sink.settle_all(name16, [1, 2**64], 0),
        lambda: sink.settle_all(name16, [1], 256),
        lambda: sink.stamp(-1),
        lambda: sink.stamp(2**64),
    ]
    for call in bad_calls:
        with pytest.raises((OverflowError, struct.error)):
            call()
    assert len(sink) == before
    sink.deliver(name16, 4, 5)  # (a refused stamp left the last one)
    assert sink.take() == encode_deliver(1, 2, "q", 3) + encode_deliver(1, 4, "q", 5)


def test_the_compiled_encoder_takes_any_bytes_like_payload_and_checks_its_name() -> None:
    sink = _compiled()
    name16 = s16("q")
    sink.publish(name16, 2, "m", 3, 4, 5, 6, bytearray(b"ab"))  # type: ignore[arg-type]
    sink.publish(name16, 2, "m", 3, 4, 5, 6, memoryview(b"xxab")[2:])  # type: ignore[arg-type]
    one = encode_publish(3, 2, "q", "m", 3, 4, 5, 6, {}, b"ab")
    assert sink.take() == one + one
    with pytest.raises(ValueError):
        sink.deliver(b"\x00\x05q", 1, 1)  # a length that is not the name's
    with pytest.raises(TypeError):
        sink.deliver("q", 1, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sink.publish(name16, 2, b"m", 3, 4, 5, 6, b"")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sink.settle_all(name16, (1, 2), 0)  # type: ignore[arg-type]
    assert len(sink) == 0


def test_a_batch_larger_than_the_kept_memory_is_taken_whole_and_the_next_starts_afresh() -> None:
    """(_recbuf.c keeps up to 4 MiB between batches: a larger one is freed after its take.)"""
    compiled, pure = _compiled(), PyRecordBuffer()
    name16 = s16("q")
    payload = bytes(range(256)) * 60  # 15,360 bytes: under the journal's pass-through size
    for sink in (compiled, pure):
        for seq in range(400):  # ~6 MiB
            sink.publish(name16, seq, f"m{seq}", 1, 0, 1, 0, payload)
    big = compiled.take()
    assert big == pure.take()
    assert len(list(iter_records(big, 0))) == 400
    compiled.stamp(1)
    compiled.deliver(name16, 2, 3)
    assert compiled.take() == encode_deliver(1, 2, "q", 3)


_BOTH_CRCS = """
import sys
from vibemq_server.journal._recbuf import RecordBuffer
buf = RecordBuffer()
for n in range(300):
    buf.publish(b"\\x00\\x01q", n, "m" * (n % 7), 1, 0, 0, 1, bytes(range(256))[: n % 256] * 2)
sys.stdout.buffer.write(buf.take())
"""


@pytest.mark.parametrize("tables", ["", "1"], ids=["folded-if-the-cpu-can", "tables"])
def test_the_compiled_crc_is_zlibs_by_folding_and_by_tables(tables: str) -> None:
    """The C encoder's CRC-32 both ways (``VIBEMQ_CRC_TABLES`` forces the table walk where
    the CPU could fold with PCLMULQDQ): every record, 8 to 600 bytes, checks with zlib."""
    env = {k: v for k, v in os.environ.items() if k != "VIBEMQ_CRC_TABLES"}
    if tables:
        env["VIBEMQ_CRC_TABLES"] = tables
    out = subprocess.run(
        [sys.executable, "-c", _BOTH_CRCS], env=env, capture_output=True, check=True
    ).stdout
    entries = list(iter_records(out, 0))  # (each record's CRC checked against zlib's)
    assert [e.record.seq for e in entries] == list(range(300))  # type: ignore[union-attr]
