/*
 * The scan of a journal: filters on queue and timestamp pushed down (exactly: Spark does not
 * evaluate them again), columns pruned to those the query reads, one partition per segment
 * or per range of about 16 MiB of a bigger one (datasource.py's planning). With a queue or
 * time filter, a sealed segment with a valid queue index (QueueIndex) is read only where its
 * index puts the wanted queues' records, about 16 MiB of them per partition.
 */
package io.vibemq.spark;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

final class JournalScan
    implements ScanBuilder, SupportsPushDownFilters, SupportsPushDownRequiredColumns, Scan, Batch {
  static final long RANGE_BYTES = 16L * 1024 * 1024;

  private final String dataDir;
  private final CaseInsensitiveStringMap options;
  private RowFilter filter;
  private Filter[] pushed = new Filter[0];
  private StructType schema = Columns.SCHEMA;

  JournalScan(CaseInsensitiveStringMap options) {
    String path = options.get("path");
    if (path == null || path.isEmpty()) {
      throw new IllegalArgumentException(
          "give the data directory: spark.read.format(\"vibemq\").load(data_dir)");
    }
    this.dataDir = path;
    this.options = options;
    this.filter = RowFilter.fromOptions(options);
  }

  @Override
  public Filter[] pushFilters(Filter[] filters) {
    Object[] out = RowFilter.push(filter, filters);
    filter = (RowFilter) out[0];
    Filter[] rest = (Filter[]) out[1];
    List<Filter> taken = new ArrayList<>();
    for (Filter f : filters) {
      boolean left = false;
      for (Filter r : rest) left |= r == f;
      if (!left) taken.add(f);
    }
    pushed = taken.toArray(new Filter[0]);
    return rest;
  }

  @Override
  public Filter[] pushedFilters() {
    return pushed;
  }

  @Override
  public void pruneColumns(StructType required) {
    schema = required;
  }

  @Override
  public Scan build() {
    return this;
  }

  @Override
  public StructType readSchema() {
    return schema;
  }

  @Override
  public String description() {
    return "vibemq journal " + dataDir + " [" + filter + "]";
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  @Override
  public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
    // A stream reads every record time (startTime/endTime are batch options) of the queues.
    RowFilter queues = new RowFilter(RowFilter.fromOptions(options).queues, null, null);
    return new JournalStream(dataDir, schema, queues, options);
  }

  @Override
  public InputPartition[] planInputPartitions() {
    List<InputPartition> out = new ArrayList<>();
    try {
      boolean narrowed = !filter.queues.isEmpty() || filter.hasTime();
      for (Segments.Segment seg : Segments.forFilter(dataDir, filter)) {
        long[] ranges = narrowed ? QueueIndex.ranges(seg.path(), seg.number(), filter) : null;
        if (ranges != null) {
          // a sealed segment with a valid queue index: only its listed ranges (none: skipped)
          for (long[] group : QueueIndex.groups(ranges, RANGE_BYTES)) {
            out.add(JournalPartition.ofRanges(seg.number(), seg.path(), group));
          }
          continue;
        }
        addRanges(out, seg.number(), seg.path(), Segments.HEADER, -1, false);
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return out.toArray(new InputPartition[0]);
  }

  /**
   * Partitions of [begin, stop) of a segment (stop -1: to its end, with the tail rules), about
   * RANGE_BYTES each, cut at record boundaries.
   */
  static void addRanges(
      List<InputPartition> out, long number, String path, long begin, long stop, boolean lossFails)
      throws IOException {
    List<Long> bounds = new ArrayList<>();
    bounds.add(begin);
    try {
      bounds.addAll(
          stop < 0
              ? Segments.recordCuts(path, RANGE_BYTES)
              : Segments.recordCuts(path, RANGE_BYTES, begin, stop));
    } catch (FileNotFoundException e) {
      // reclaimed while planning: its one partition reads nothing (a stream's: data loss)
    }
    bounds.add(stop);
    for (int i = 0; i + 1 < bounds.size(); i++) {
      out.add(new JournalPartition(number, path, bounds.get(i), bounds.get(i + 1), lossFails));
    }
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new JournalReaderFactory(schema, filter);
  }
}
