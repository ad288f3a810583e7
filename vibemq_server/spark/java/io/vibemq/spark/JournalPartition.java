/*
 * A range of a segment file: [start, end), end -1 = to its end with the tail rules. A
 * stream's partition with lossFails set fails when its segment is gone (failOnDataLoss).
 * ranges (not null): read only these {start, end, ...} of it, from its queue index sidecar.
 */
package io.vibemq.spark;

import org.apache.spark.sql.connector.read.InputPartition;

record JournalPartition(
    long segment, String path, long start, long end, boolean lossFails, long[] ranges)
    implements InputPartition {
  JournalPartition(long segment, String path, long start, long end) {
    this(segment, path, start, end, false, null);
  }

  JournalPartition(long segment, String path, long start, long end, boolean lossFails) {
    this(segment, path, start, end, lossFails, null);
  }

  /** Only the ranges of a segment that its queue index lists. */
  static JournalPartition ofRanges(long segment, String path, long[] ranges) {
    return new JournalPartition(segment, path, ranges[0], ranges[1], false, ranges);
  }
}
