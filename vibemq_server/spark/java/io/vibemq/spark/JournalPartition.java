/* A range of a segment file: [start, end), end -1 = to its end with the tail rules. */
package io.vibemq.spark;

import org.apache.spark.sql.connector.read.InputPartition;

record JournalPartition(long segment, String path, long start, long end)
    implements InputPartition {}
