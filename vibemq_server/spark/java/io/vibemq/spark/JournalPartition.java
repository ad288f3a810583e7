/*
 * A range of a segment file: [start, end), end -1 = to its end with the tail rules. A
 * stream's partition with lossFails set fails when its segment is gone (failOnDataLoss).
 */
package io.vibemq.spark;

import org.apache.spark.sql.connector.read.InputPartition;

record JournalPartition(long segment, String path, long start, long end, boolean lossFails)
    implements InputPartition {
  JournalPartition(long segment, String path, long start, long end) {
    this(segment, path, start, end, false);
  }
}
