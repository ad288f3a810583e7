"""The ``vibemq`` PySpark data source (``pyspark.sql.datasource``, PySpark 4.x).

* ``spark.read.format("vibemq").load(data_dir)``: the journal as a DataFrame, one row per
  record, one partition per segment (options ``queue``, ``startTime``, ``endTime``).
* ``spark.readStream.format("vibemq").load(data_dir)``: a replayable stream with JSON offsets
  ``{"segment": n, "position": p}`` (options ``startingOffsets``, ``maxRecordsPerTrigger``,
  ``failOnDataLoss``, ``queue``), supporting ``trigger(availableNow=True)``.
* ``df.write.format("vibemq")`` / ``writeStream.format("vibemq")``: publish rows into a
  running broker (options ``host``, ``port``, ``queue``, ``token``, ``maxInFlight``,
  ``timeout``).

Register it with ``vibemq_server.spark.register(spark)``: it is ``format("vibemq.python")``
always, and ``format("vibemq")`` only when the JVM source's jar cannot be loaded (:mod:`.jvm`).
Readers and writers are pickled to Python workers: they hold only plain values. The reading
itself is :mod:`vibemq_server.spark.journal_reader`.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    Filter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType, _parse_datatype_string

from vibemq_server.spark import columnar, pushdown
from vibemq_server.spark import journal_reader as jr
from vibemq_server.spark.publisher import PublishConfig, check_columns, option, publish_rows

log = logging.getLogger("vibemq.spark")

RANGE_BYTES = 16 * 1024 * 1024  # a batch partition reads at most about this much of a segment


def journal_schema() -> StructType:
    schema = _parse_datatype_string(jr.SCHEMA_DDL)
    assert isinstance(schema, StructType)
    return schema


def _bool(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"expected true or false, got {value!r}")
    return text == "true"


def _data_dir(options: Mapping[str, str]) -> str:
    path = option(options, "path")
    if not path:
        raise ValueError('give the data directory: spark.read.format("vibemq").load(data_dir)')
    return path


def _row_filter(options: Mapping[str, str], *, times: bool) -> jr.RowFilter:
    start = option(options, "startTime") if times else None
    end = option(options, "endTime") if times else None
    return jr.RowFilter(
        queues=jr.parse_queues(option(options, "queue")),
        start_ms=jr.parse_time_ms(start) if start else None,
        end_ms=jr.parse_time_ms(end) if end else None,
    )


def segment_batches(
    path: str,
    segment: int,
    schema: pa.Schema,
    start: int = jr.HEADER,
    end: int | None = None,
    row_filter: jr.RowFilter = jr.NO_FILTER,
) -> Iterator[pa.RecordBatch]:
    """The records of one segment in ``[start, end)`` as record batches: decoded in bulk by
    the compiled scanner, or record by record when it is not built (same rows)."""
    if columnar.available():
        return columnar.read_batches(path, segment, schema, start, end, row_filter)
    log.warning("vibemq_server.spark._colscan is not built: reading the journal record by record")
    return columnar.rows_to_batches(jr.read_rows(path, segment, start, end, row_filter), schema)


@dataclass(frozen=True)
class SegmentPartition(InputPartition):
    """A batch partition: a segment file from ``start`` to ``end`` (None: to its end, with the
    tail rules; a bound is a record boundary found when planning)."""

    segment: int
    path: str
    start: int = jr.HEADER
    end: int | None = None
    #: only these ``[start, end)`` of the segment (its queue index's), when given
    ranges: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", self.segment)


def range_batches(
    path: str,
    segment: int,
    schema: pa.Schema,
    ranges: tuple[tuple[int, int], ...],
    row_filter: jr.RowFilter,
) -> Iterator[pa.RecordBatch]:
    """The rows of the ranges of a segment that its queue index lists (bulk, or record by
    record when the scanner is not built: same rows)."""
    if columnar.available():
        return columnar.read_ranges(path, segment, schema, ranges, row_filter)
    return columnar.rows_to_batches(jr.read_range_rows(path, segment, ranges, row_filter), schema)


@dataclass(frozen=True)
class ChunkPartition(InputPartition):
    """A streaming partition: records of one segment between two positions."""

    segment: int
    start: int
    end: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", self.segment)


class VibeMQReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.data_dir = _data_dir(options)
        self.row_filter = _row_filter(options, times=True)
        self.schema = schema

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Filters on ``queue`` and ``timestamp`` narrow the scan (:mod:`.pushdown`)."""
        self.row_filter, rest = pushdown.push(self.row_filter, filters)
        return rest

    def partitions(self) -> Sequence[InputPartition]:
        out: list[InputPartition] = []
        for seg in jr.segments_for(self.data_dir, self.row_filter):
            ranges = jr.index_ranges(seg, self.row_filter)
            if ranges is not None:
                # a sealed segment with a valid queue index: only the ranges it lists
                for group in jr.range_groups(ranges, RANGE_BYTES):
                    out.append(SegmentPartition(seg.number, seg.path, group[0][0], None, group))
                continue
            # A big segment is read as several ranges at record boundaries (found by the
            # compiled walk): more tasks than segments when a journal has few of them.
            cuts = jr.record_cuts(seg.path, RANGE_BYTES) if columnar.available() else []
            bounds = [jr.HEADER, *cuts, None]
            for start, end in itertools.pairwise(bounds):
                assert start is not None
                out.append(SegmentPartition(seg.number, seg.path, start, end))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SegmentPartition):
            return  # no segment to read: Spark plans one partition of its own then
        schema = to_arrow_schema(self.schema, timezone="UTC")
        try:
            if partition.ranges is not None:
                yield from range_batches(
                    partition.path, partition.segment, schema, partition.ranges, self.row_filter
                )
                return
            yield from segment_batches(
                partition.path,
                partition.segment,
                schema,
                partition.start,
                partition.end,
                self.row_filter,
            )
        except FileNotFoundError:
            # Reclaimed between planning and reading: the batch read sees the journal as it
            # is when each segment is opened, like a directory listing of files.
            log.warning("journal segment %s was reclaimed during the read", partition.path)


class VibeMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.data_dir = _data_dir(options)
        self.row_filter = _row_filter(options, times=False)
        self.schema = schema
        self.starting = (option(options, "startingOffsets") or "earliest").strip()
        max_records = option(options, "maxRecordsPerTrigger")
        self.max_records = int(max_records) if max_records else None
        if self.max_records is not None and self.max_records < 1:
            raise ValueError("maxRecordsPerTrigger must be at least 1")
        self.fail_on_data_loss = _bool(option(options, "failOnDataLoss"), True)
        self.cap: jr.Offset | None = None

    def initialOffset(self) -> dict[str, int]:
        if self.starting == "earliest":
            return dict(jr.BEFORE_START)
        if self.starting == "latest":
            offset, _ = jr.latest_offset(self.data_dir, jr.Offset(**jr.BEFORE_START), None, False)
            return offset.to_json()
        return jr.Offset.from_json(self.starting).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_records is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        # Everything whole now, and nothing written later: the target of the query.
        start = jr.Offset(**jr.BEFORE_START)
        self.cap, _ = jr.latest_offset(self.data_dir, start, None, False)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        begin = jr.Offset.from_json(start)
        if self.cap is not None and begin >= self.cap:
            return begin.to_json()
        end, _ = jr.latest_offset(
            self.data_dir, begin, max_rows, self.fail_on_data_loss, cap=self.cap
        )
        return end.to_json()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        chunks = jr.plan_chunks(
            self.data_dir,
            jr.Offset.from_json(start),
            jr.Offset.from_json(end),
            self.fail_on_data_loss,
        )
        out: list[InputPartition] = []
        for c in chunks:
            # Like the batch read: a long chunk is read as several ranges.
            path = jr.segment_file(self.data_dir, c.segment)
            cuts = jr.record_cuts(path, RANGE_BYTES, c.start, c.end) if columnar.available() else []
            for begin, stop in itertools.pairwise([c.start, *cuts, c.end]):
                out.append(ChunkPartition(c.segment, begin, stop))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ChunkPartition):
            return
        schema = to_arrow_schema(self.schema, timezone="UTC")
        path = jr.segment_file(self.data_dir, partition.segment)
        if not os.path.exists(path):
            jr.data_loss(partition.segment, partition.segment + 1, self.fail_on_data_loss)
            return
        yield from segment_batches(
            path, partition.segment, schema, partition.start, partition.end, self.row_filter
        )

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the journal is the broker's, and reclamation is its business."""


@dataclass(frozen=True)
class PublishedCommit(WriterCommitMessage):
    published: int


class VibeMQWriter(DataSourceWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.config = PublishConfig.from_options(options)
        check_columns(schema.fieldNames(), self.config)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return PublishedCommit(publish_rows(self.config, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.published for m in messages if isinstance(m, PublishedCommit))
        log.info("published %d rows into %s:%d", total, self.config.host, self.config.port)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Published messages cannot be withdrawn: Spark's retry may publish some twice."""


class VibeMQStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.config = PublishConfig.from_options(options)
        check_columns(schema.fieldNames(), self.config)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return PublishedCommit(publish_rows(self.config, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every PublishAck was awaited in the tasks: nothing left to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Published messages cannot be withdrawn (at-least-once into the broker)."""


class VibeMQDataSource(DataSource):
    """``format("vibemq")``: the journal as a (streaming) DataFrame, and a broker as a sink."""

    @classmethod
    def name(cls) -> str:
        return "vibemq"

    def schema(self) -> str:
        return jr.SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return VibeMQReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return VibeMQStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError('a broker queue cannot be overwritten: use mode("append")')
        return VibeMQWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return VibeMQStreamWriter(self.options, schema)


class PythonDataSource(VibeMQDataSource):
    """The same source as ``format("vibemq.python")``: registered always, beside the JVM
    source that answers to ``vibemq`` when its jar loads (docs/spark.md)."""

    @classmethod
    def name(cls) -> str:
        return "vibemq.python"
