/*
 * readStream.format("vibemq"): micro-batches over the journal with the Python stream
 * reader's offsets, options and rules (vibemq_server/spark/datasource.py VibeMQStreamReader,
 * journal_reader.latest_offset and plan_chunks): startingOffsets (earliest, latest or an
 * offset's JSON), maxRecordsPerTrigger, failOnDataLoss, queue; availableNow. An offset only
 * ever moves past whole records (prefix walked, length within the file), so a journal a
 * broker is writing is never read half a record; the executors check every record.
 */
package io.vibemq.spark;

import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

final class JournalStream implements MicroBatchStream, SupportsTriggerAvailableNow {
  private final String dataDir;
  private final StructType schema;
  private final RowFilter filter;
  private final String starting;
  private final long maxRecords; // -1: no limit
  private final boolean failOnDataLoss;
  private JournalOffset cap; // availableNow: nothing past this

  JournalStream(String dataDir, StructType schema, RowFilter filter, CaseInsensitiveStringMap o) {
    this.dataDir = dataDir;
    this.schema = schema;
    this.filter = filter;
    String s = o.get("startingOffsets");
    this.starting = s == null || s.trim().isEmpty() ? "earliest" : s.trim();
    String m = o.get("maxRecordsPerTrigger");
    this.maxRecords = m == null || m.trim().isEmpty() ? -1 : Long.parseLong(m.trim());
    if (m != null && !m.trim().isEmpty() && maxRecords < 1) {
      throw new IllegalArgumentException("maxRecordsPerTrigger must be at least 1");
    }
    String f = o.get("failOnDataLoss");
    if (f == null) {
      this.failOnDataLoss = true;
    } else if (f.trim().equalsIgnoreCase("true") || f.trim().equalsIgnoreCase("false")) {
      this.failOnDataLoss = f.trim().equalsIgnoreCase("true");
    } else {
      throw new IllegalArgumentException("expected true or false, got '" + f + "'");
    }
  }

  // -- offsets (journal_reader.py) --------------------------------------------------------

  static RuntimeException dataLoss(long missing, long nextExisting) {
    return new IllegalStateException(
        "journal segment " + missing + " is gone (reclaimed) before the stream read all of it; "
            + "the next segment is " + nextExisting + ". Some records may have been lost. Set "
            + "the option failOnDataLoss to \"false\" to continue from the next segment.");
  }

  private static void loss(long missing, long next, boolean fail) {
    if (fail) throw dataLoss(missing, next);
  }

  /** Segments that exist (a file gone while listing is left out), number order. */
  private List<Segments.Segment> segments(long upTo) {
    List<Segments.Segment> out = new ArrayList<>();
    for (Segments.Segment s : Segments.list(dataDir)) {
      if ((upTo < 0 || s.number() <= upTo) && new File(s.path()).exists()) out.add(s);
    }
    return out;
  }

  /** {index into segs, segment, position} where start is, past reclaimed segments. */
  private static long[] resolve(List<Segments.Segment> segs, JournalOffset start, boolean fail) {
    for (int i = 0; i < segs.size(); i++) {
      long n = segs.get(i).number();
      if (n == start.segment) return new long[] {i, start.segment, start.position};
      if (n > start.segment) {
        if (start.segment != 0) loss(start.segment, n, fail);
        return new long[] {i, n, Segments.HEADER};
      }
    }
    return new long[] {segs.size(), start.segment, start.position};
  }

  /** The offset after at most maxRows (-1: all) whole records from start, not past cap. */
  JournalOffset latest(JournalOffset start, long maxRows, boolean fail, JournalOffset cap)
      throws IOException {
    List<Segments.Segment> segs = segments(cap == null ? -1 : cap.segment);
    long[] r = resolve(segs, start, fail);
    int i = (int) r[0];
    if (i == segs.size()) return start;
    long curPos = r[2], total = 0;
    while (true) {
      Segments.Segment seg = segs.get(i);
      long remaining = maxRows < 0 ? -1 : maxRows - total;
      long stop = cap != null && seg.number() == cap.segment ? cap.position : -1;
      long[] walked = Segments.walk(seg.path(), curPos, remaining, stop);
      total += walked[1];
      long pos = Math.max(walked[0], curPos);
      if (i + 1 == segs.size()) return new JournalOffset(seg.number(), pos);
      // A closed segment: go on to the next one once this one is read to its end.
      if (remaining >= 0 && walked[1] >= remaining
          && Segments.walk(seg.path(), pos, 1, -1)[1] > 0) {
        return new JournalOffset(seg.number(), pos);
      }
      Segments.Segment next = segs.get(i + 1);
      if (next.number() != seg.number() + 1) loss(seg.number() + 1, next.number(), fail);
      i++;
      curPos = Segments.HEADER;
      if (maxRows >= 0 && total >= maxRows) return new JournalOffset(next.number(), curPos);
    }
  }

  @Override
  public Offset initialOffset() {
    if (starting.equals("earliest")) return JournalOffset.BEFORE_START;
    try {
      if (starting.equals("latest")) return latest(JournalOffset.BEFORE_START, -1, false, null);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return JournalOffset.parse(starting);
  }

  @Override
  public Offset deserializeOffset(String json) {
    return JournalOffset.parse(json);
  }

  @Override
  public ReadLimit getDefaultReadLimit() {
    return maxRecords < 0 ? ReadLimit.allAvailable() : ReadLimit.maxRows(maxRecords);
  }

  @Override
  public void prepareForTriggerAvailableNow() {
    // Everything whole now, and nothing written later: the target of the query.
    try {
      cap = latest(JournalOffset.BEFORE_START, -1, false, null);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  @Override
  public Offset latestOffset() {
    throw new UnsupportedOperationException("latestOffset(Offset, ReadLimit) is called instead");
  }

  @Override
  public Offset latestOffset(Offset startOffset, ReadLimit limit) {
    JournalOffset begin =
        startOffset == null ? (JournalOffset) initialOffset() : (JournalOffset) startOffset;
    long maxRows = limit instanceof ReadMaxRows m ? m.maxRows() : -1;
    if (cap != null && begin.compareTo(cap) >= 0) return begin;
    try {
      return latest(begin, maxRows, failOnDataLoss, cap);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  @Override
  public InputPartition[] planInputPartitions(Offset startOffset, Offset endOffset) {
    JournalOffset start = (JournalOffset) startOffset, end = (JournalOffset) endOffset;
    List<InputPartition> out = new ArrayList<>();
    if (end.compareTo(start) <= 0) return new InputPartition[0];
    try {
      List<Segments.Segment> segs = segments(end.segment);
      long[] r = resolve(segs, start, failOnDataLoss);
      long prev = -1;
      for (int i = (int) r[0]; i < segs.size(); i++) {
        Segments.Segment seg = segs.get(i);
        if (prev >= 0 && seg.number() != prev + 1) loss(prev + 1, seg.number(), failOnDataLoss);
        prev = seg.number();
        long begin = seg.number() == r[1] ? r[2] : Segments.HEADER;
        long stop =
            seg.number() == end.segment
                ? end.position
                : Segments.walk(seg.path(), begin, -1, -1)[0];
        if (stop <= begin) continue;
        // Like the batch read: a long chunk is read as several ranges.
        String path = Segments.file(dataDir, seg.number());
        JournalScan.addRanges(out, seg.number(), path, begin, stop, failOnDataLoss);
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return out.toArray(new InputPartition[0]);
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new JournalReaderFactory(schema, filter);
  }

  @Override
  public void commit(Offset end) {
    // Nothing to release: the journal is the broker's, and reclamation is its business.
  }

  @Override
  public void stop() {}
}
