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
from vibemq_server.journal.batch import PyRecordBuffer, RecordSink, without_publishes
from vibemq_server.journal.records import _s16 as s16
from vibemq_server.journal.records import (
    encode_deliver,
    encode_publish,
    encode_settle,
    iter_records,
)

u64 = st.integers(0, 2**64 - 1)
text = st.text(max_size=30)

fields_op = st.tuples(st.just("fields"), u64, u64, st.integers(0, 255), st.integers(0, 65535))
seq_op = st.tuples(st.just("seq"), st.one_of(u64, st.just(2**64 - 1)))  # (it wraps)
publish_op = st.tuples(st.just("publish"), text, st.binary(max_size=300))
stamp_op = st.tuples(st.just("stamp"), u64)
# (a run's first seq: its last is within a u64)
first = st.integers(0, 2**64 - 4)
deliver_op = st.tuples(st.just("deliver_run"), first, st.integers(0, 3), st.integers(0, 65535))
settle_op = st.tuples(st.just("settle"), u64, st.sampled_from(list(SettleReason)), text)
settle_all_op = st.tuples(
    st.just("settle_all"), st.lists(u64, max_size=5), st.sampled_from(list(SettleReason))
)
settle_run_op = st.tuples(
    st.just("settle_run"), first, st.integers(0, 3), st.sampled_from(list(SettleReason))
)
ops = st.lists(
    st.one_of(
        fields_op, seq_op, publish_op, stamp_op, deliver_op, settle_op, settle_all_op, settle_run_op
    ),
    max_size=25,
)

Op = tuple[object, ...]


def _compiled() -> RecordSink:
    from vibemq_server.journal._recbuf import RecordBuffer

    return RecordBuffer()


def _apply(sink: RecordSink, queue: str, run: list[Op]) -> None:
    """The records of ``run`` appended to ``sink``."""
    name16 = s16(queue)
    for op in run:
        if op[0] == "fields":
            _, pub, exp, prio, attempts = op
            sink.fields(pub, exp, prio, attempts)  # type: ignore[arg-type]
        elif op[0] == "seq":
            sink.seq(op[1])  # type: ignore[arg-type]
        elif op[0] == "publish":
            _, mid, payload = op
            sink.publish(name16, mid, payload)  # type: ignore[arg-type]
        elif op[0] == "stamp":
            sink.stamp(op[1])  # type: ignore[arg-type]
        elif op[0] == "deliver_run":
            _, seq, count, attempts = op
            sink.deliver_run(name16, seq, count, attempts)  # type: ignore[arg-type]
        elif op[0] == "settle":
            _, seq, reason, detail = op
            sink.settle(name16, seq, reason, detail)  # type: ignore[arg-type]
        elif op[0] == "settle_run":
            _, seq, count, reason = op
            sink.settle_run(name16, seq, count, reason)  # type: ignore[arg-type]
        else:
            _, seqs, reason = op
            sink.settle_all(name16, seqs, reason)  # type: ignore[arg-type]


class _State:
    """What an encoder keeps across its batches: the stamp, the fields and the next seq."""

    def __init__(self) -> None:
        self.ts = 0
        self.fields: Op = (0, 0, 0, 0)
        self.seq = 0


def _reference(queue: str, run: list[Op], state: _State) -> bytes:
    """The same records from records.py's encoders (the format's reference): a PUBLISH with
    the next seq and the last fields, at its publish time, the others at the last stamp
    (``state``'s before any: all three outlive the batch's take; ``state`` left as after)."""
    out = []
    ts = state.ts
    for op in run:
        if op[0] == "fields":
            state.fields = op[1:]
        elif op[0] == "seq":
            state.seq = op[1]  # type: ignore[assignment]
        elif op[0] == "publish":
            _, mid, payload = op
            pub, exp, prio, attempts = state.fields
            out.append(
                encode_publish(pub, state.seq, queue, mid, pub, exp, prio, attempts, {}, payload)
            )  # type: ignore[arg-type]
            state.seq = (state.seq + 1) % 2**64
        elif op[0] == "stamp":
            ts = state.ts = op[1]  # type: ignore[assignment]
        elif op[0] == "deliver_run":
            _, seq, count, attempts = op
            assert isinstance(seq, int) and isinstance(count, int)
            out += [encode_deliver(ts, seq + i, queue, attempts) for i in range(count)]  # type: ignore[arg-type]
        elif op[0] == "settle":
            _, seq, reason, detail = op
            out.append(encode_settle(ts, seq, queue, reason, detail))  # type: ignore[arg-type]
        elif op[0] == "settle_run":
            _, seq, count, reason = op
            assert isinstance(seq, int) and isinstance(count, int)
            out += [encode_settle(ts, seq + i, queue, reason, "") for i in range(count)]  # type: ignore[arg-type]
        else:
            _, seqs, reason = op
            out += [encode_settle(ts, seq, queue, reason, "") for seq in seqs]  # type: ignore[attr-defined, arg-type]
    return b"".join(out)


def _records_of(op: Op) -> int:
    """How many records ``op`` appends."""
    if op[0] in ("stamp", "fields", "seq"):
        return 0
    if op[0] == "settle_all":
        return len(op[1])  # type: ignore[arg-type]
    if op[0] in ("deliver_run", "settle_run"):
        return op[2]  # type: ignore[return-value]
    return 1


def test_the_compiled_encoder_is_built() -> None:
    assert batch.COMPILED, "build it: pip install -e . or scripts/build_ext.sh"


@given(st.text(min_size=1, max_size=40), ops, ops)
def test_compiled_and_pure_write_the_records_of_the_format(
    queue: str, first: list[Op], second: list[Op]
) -> None:
    state = _State()
    expected = _reference(queue, first, state)
    pure, compiled = PyRecordBuffer(), _compiled()
    _apply(pure, queue, first)
    _apply(compiled, queue, first)
    assert len(pure) == len(compiled) == len(expected)
    data = compiled.take()
    assert data == pure.take() == expected
    assert len(pure) == len(compiled) == 0
    # every record decodes
    entries = list(iter_records(data, 0))
    assert len(entries) == sum(_records_of(op) for op in first)
    # the next batch starts over, with the buffer's memory, its stamp and its fields kept
    _apply(compiled, queue, second)
    _apply(pure, queue, second)
    assert compiled.take() == pure.take() == _reference(queue, second, state)


@given(
    st.lists(st.tuples(st.sampled_from(["a", "bé"]), st.booleans()), max_size=12),
    st.sets(st.integers(0, 11)),
)
def test_withdrawn_publishes_are_cut_out_of_a_batch_and_the_other_records_stay(
    publishes: list[tuple[str, bool]], drop: set[int]
) -> None:
    """(journal/batch.py's without_publishes, the journal's failed write): a batch of
    publishes of two queues, each followed by a DELIVER of the same seq (to be kept), without
    the publishes of ``drop`` is the batch those were never written to."""
    full, kept = PyRecordBuffer(), PyRecordBuffer()
    for sink in (full, kept):
        sink.stamp(7)
        sink.fields(5, 0, 1, 0)
    gone: set[tuple[int, str]] = set()
    for seq, (queue, long) in enumerate(publishes):
        payload = b"x" * (300 if long else 3)
        full.publish(s16(queue), f"m{seq}", payload)  # (seqs 0, 1, ...: one on each)
        full.deliver_run(s16(queue), seq, 1, 1)
        if seq in drop:
            gone.add((seq, queue))
        else:
            kept.seq(seq)
            kept.publish(s16(queue), f"m{seq}", payload)
        kept.deliver_run(s16(queue), seq, 1, 1)
    data = full.take()
    gone.add((99, "a"))  # (none of the batch's: nothing to cut)
    assert without_publishes(data, gone) == kept.take()
    assert without_publishes(data, set()) is data


@pytest.mark.parametrize("make", [PyRecordBuffer, _compiled], ids=["pure", "compiled"])
def test_out_of_range_fields_are_refused_and_leave_the_batch_as_it_was(
    make: type[RecordSink],
) -> None:
    sink = make()
    name16 = s16("q")
    sink.stamp(1)
    sink.seq(6)
    sink.deliver_run(name16, 2, 1, 3)
    before = len(sink)
    bad_calls: list[Callable[[], object]] = [
        lambda: sink.fields(-1, 0, 0, 0),
        lambda: sink.fields(2**64, 0, 0, 0),
        lambda: sink.fields(0, 0, 256, 0),
        lambda: sink.fields(0, 0, 0, 65536),
        lambda: sink.seq(-1),
        lambda: sink.seq(2**64),
        lambda: sink.publish(name16, "m" * 65536, b"{}"),
        lambda: sink.deliver_run(name16, 1, 2, 65536),
        lambda: sink.deliver_run(name16, -1, 2, 1),
        lambda: sink.deliver_run(name16, 1, -1, 1),
        lambda: sink.deliver_run(name16, 1, 2**32, 1),
        lambda: sink.deliver_run(name16, 2**64 - 2, 3, 1),
        lambda: sink.settle_run(name16, 2**64 - 1, 2, 0),
        lambda: sink.settle_run(name16, -1, 0, 0),
        lambda: sink.settle_run(name16, 1, 2, 256),
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
    sink.deliver_run(name16, 4, 1, 5)  # (a refused stamp left the last one)
    # (and refused fields the last ones, none: zeros; a refused seq or publish the next seq)
    sink.publish(name16, "m", b"{}")
    assert sink.take() == (
        encode_deliver(1, 2, "q", 3)
        + encode_deliver(1, 4, "q", 5)
        + encode_publish(0, 6, "q", "m", 0, 0, 0, 0, {}, b"{}")
    )


def test_the_compiled_encoder_takes_any_bytes_like_payload_and_checks_its_name() -> None:
    sink = _compiled()
    name16 = s16("q")
    sink.fields(3, 4, 5, 6)
    sink.seq(2)
    sink.publish(name16, "m", bytearray(b"ab"))  # type: ignore[arg-type]
    sink.publish(name16, "m", memoryview(b"xxab")[2:])  # type: ignore[arg-type]
    one, two = (encode_publish(3, seq, "q", "m", 3, 4, 5, 6, {}, b"ab") for seq in (2, 3))
    assert sink.take() == one + two
    with pytest.raises(ValueError):
        sink.deliver_run(b"\x00\x05q", 1, 1, 1)  # a length that is not the name's
    with pytest.raises(TypeError):
        sink.deliver_run("q", 1, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sink.publish(name16, b"m", b"")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sink.settle_all(name16, (1, 2), 0)  # type: ignore[arg-type]
    assert len(sink) == 0


def test_a_batch_larger_than_the_kept_memory_is_taken_whole_and_the_next_starts_afresh() -> None:
    """(_recbuf.c keeps up to 4 MiB between batches: a larger one is freed after its take.)"""
    compiled, pure = _compiled(), PyRecordBuffer()
    name16 = s16("q")
    payload = bytes(range(256)) * 60  # 15,360 bytes: under the journal's pass-through size
    for sink in (compiled, pure):
        sink.fields(1, 0, 1, 0)
        for seq in range(400):  # ~6 MiB
            sink.publish(name16, f"m{seq}", payload)
    big = compiled.take()
    assert big == pure.take()
    assert len(list(iter_records(big, 0))) == 400
    compiled.stamp(1)
    compiled.deliver_run(name16, 2, 1, 3)
    assert compiled.take() == encode_deliver(1, 2, "q", 3)


_BOTH_CRCS = """
import sys
from vibemq_server.journal._recbuf import RecordBuffer
buf = RecordBuffer()
buf.fields(1, 0, 0, 1)
for n in range(300):
    buf.publish(b"\\x00\\x01q", "m" * (n % 7), bytes(range(256))[: n % 256] * 2)
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
