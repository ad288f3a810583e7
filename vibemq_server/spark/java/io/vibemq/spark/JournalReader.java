/*
 * Reads one range of a segment into column batches, checking every record as
 * vibemq_server/journal/records.py's decode_record and _colscan.c do: the length, the CRC-32,
 * the body layout, strict UTF-8 of every str16, a known type and settle reason, the exact body
 * length. Records of other queues are checked too (damage is found whatever the filter).
 * Tails and damage as columnar.read_batches: with no planned end, an incomplete, zero-filled
 * or bad last record is a tail and is left out; a bad record with records after it fails the
 * task with the file and the offset. Memory: a window of 8 MiB of the file (a record bigger
 * than that is read whole) and one batch of at most 4,096 rows or about 8 MiB.
 */
package io.vibemq.spark;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.charset.StandardCharsets;
import java.util.zip.CRC32;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

final class JournalReader implements PartitionReader<ColumnarBatch> {
  static final int WINDOW = 8 * 1024 * 1024;
  static final int BATCH_ROWS = 4096;
  static final long BATCH_BYTES = 8L * 1024 * 1024;

  private static final int FULL = 0, END = 1, INCOMPLETE = 2, BAD = 3;
  private static final int CREATE = 1, DELETE = 2, PUBLISH = 3, DELIVER = 4, SETTLE = 5;
  private static final int DEAD_LETTERED = 3, N_REASONS = 6;
  private static final byte[][] KINDS = names(
      "", "QUEUE_CREATE", "QUEUE_DELETE", "PUBLISH", "DELIVER", "SETTLE");
  private static final byte[][] REASONS = names(
      "ACKED", "DROPPED", "EXPIRED", "DEAD_LETTERED", "DELIVERED_NO_ACK", "MOVED");
  private static final byte[] DLR_KEY = "deadLetterReason".getBytes(StandardCharsets.UTF_8);

  private final String path;
  private final long segment;
  private long end; // -1: to the file's end, with the tail rules
  private final long[] ranges; // the ranges to read (a queue index's), or null: [start, end)
  private int nextRange = 2;
  private final byte[][] queues;
  private final boolean hasLo, hasHi;
  private final long lo, hi;
  private final CRC32 crc = new CRC32();

  private final WritableColumnVector[] v = new WritableColumnVector[Columns.COUNT];
  private final OnHeapColumnVector[] vectors;
  private final ColumnarBatch batch;
  private int rows;
  private long bytes;

  private RandomAccessFile file;
  private byte[] data = new byte[0];
  private int dataLen, rel, want = WINDOW;
  private long pos; // file position of data[0]
  private boolean atEnd, done;
  private String err;

  // the record being decoded (offsets into data)
  private int kind;
  private long ts, seq, pub, exp;
  private int prio, attempts, reason;
  private int queueOff, queueLen, msgidOff, msgidLen, payOff, payLen, detailOff, detailLen;
  private int optOff, optLen, nh;
  private int[] hkOff = new int[16], hkLen = new int[16], hvOff = new int[16], hvLen = new int[16];

  JournalReader(JournalPartition part, StructType schema, RowFilter filter) {
    this.path = part.path();
    this.segment = part.segment();
    this.end = part.end();
    this.ranges = part.ranges();
    this.queues = filter.queueBytes();
    this.hasLo = filter.startMs != null;
    this.hasHi = filter.endMs != null;
    this.lo = hasLo ? filter.startMs : 0;
    this.hi = hasHi ? filter.endMs : 0;
    this.vectors = OnHeapColumnVector.allocateColumns(BATCH_ROWS, schema);
    for (int i = 0; i < vectors.length; i++) {
      v[Columns.SCHEMA.fieldIndex(schema.fields()[i].name())] = vectors[i];
    }
    this.batch = new ColumnarBatch(vectors);
    try {
      open(part.start(), part.lossFails());
    } catch (IOException e) {
      close();
      throw new RuntimeException(e.getMessage(), e);
    }
  }

  private static byte[][] names(String... names) {
    byte[][] out = new byte[names.length][];
    for (int i = 0; i < names.length; i++) out[i] = names[i].getBytes(StandardCharsets.UTF_8);
    return out;
  }

  private IOException error(String message, long offset) {
    return new IOException(message + " in " + path + " at offset " + offset);
  }

  private void open(long start, boolean lossFails) throws IOException {
    try {
      file = new RandomAccessFile(path, "r");
    } catch (FileNotFoundException e) {
      // A stream's segment reclaimed before it was read: data loss (failOnDataLoss).
      if (lossFails) throw JournalStream.dataLoss(segment, segment + 1);
      // Reclaimed between planning and reading: the read sees the journal as it is when each
      // segment is opened, like a directory listing of files.
      done = true;
      return;
    }
    byte[] head = new byte[Segments.HEADER];
    if (Segments.readAt(file, 0, head, head.length) < head.length) {
      done = true; // a segment being created: no records yet
      return;
    }
    if (head[0] != 'V' || head[1] != 'M' || head[2] != 'Q' || head[3] != 'J') {
      throw error("not a VibeMQ journal segment (bad magic)", 0);
    }
    int version = Segments.be16(head, 4);
    if (version != 1) throw error("unsupported journal format version " + version, 0);
    pos = Math.max(start, Segments.HEADER);
    if (end >= 0) {
      long size = file.length();
      if (size < end) {
        throw error("segment ends before the planned offset " + end, Math.max(size, pos));
      }
    }
    if (!load()) done = true;
  }

  /** Reads the next window at pos; false when the range is read. */
  private boolean load() throws IOException {
    if (end >= 0 && pos >= end) return false;
    if (end >= 0) want = (int) Math.min(want, end - pos);
    if (data.length < want) data = new byte[want];
    dataLen = Segments.readAt(file, pos, data, want);
    atEnd = dataLen < want || (end >= 0 && pos + dataLen >= end);
    rel = 0;
    return true;
  }

  @Override
  public boolean next() throws IOException {
    if (done) return false;
    batch.setNumRows(0);
    for (OnHeapColumnVector c : vectors) c.reset();
    rows = 0;
    bytes = 0;
    while (true) {
      int status = scan();
      if (status == FULL) break;
      if (!advance(status)) {
        done = true;
        break;
      }
    }
    batch.setNumRows(rows);
    return rows > 0;
  }

  /** After a window stopped with status: the next window, or false at the end of the range. */
  private boolean advance(int status) throws IOException {
    if (status == END) {
      if ((atEnd || dataLen == 0) && ranges != null && nextRange < ranges.length) {
        pos = ranges[nextRange];
        end = ranges[nextRange + 1];
        nextRange += 2;
        want = WINDOW;
        return load();
      }
      if (atEnd || dataLen == 0) return false;
      pos += rel;
      want = WINDOW;
      return load();
    }
    if (status == INCOMPLETE && !atEnd) {
      // the next record goes past the window: read on from it (whole if it is big)
      long need = Segments.PREFIX;
      if (dataLen - rel >= Segments.PREFIX) need += Segments.be32(data, rel);
      pos += rel;
      want = (int) Math.max(WINDOW, need);
      return load();
    }
    long bad = pos + rel;
    if (end < 0 && (status == INCOMPLETE || isTail(bad))) return false;
    // ranges of an index: a bad record is a tail by the same rule as for a whole read (it
    // reaches the file's end or zeros follow it), found here since the index was written
    if (ranges != null && isTail(bad)) return false;
    throw error(err == null ? "bad record" : err, bad);
  }

  /** Whether the bad record at offset is a tail (cut off or zero-filled), not damage. */
  private boolean isTail(long offset) throws IOException {
    long size = file.length();
    byte[] prefix = new byte[Segments.PREFIX];
    if (Segments.readAt(file, offset, prefix, prefix.length) < prefix.length) return true;
    long length = Segments.be32(prefix, 0);
    if (length > Segments.MAX_RECORD || offset + Segments.PREFIX + length >= size) return true;
    byte[] chunk = new byte[1 << 20];
    long at = offset;
    while (true) {
      int n = Segments.readAt(file, at, chunk, chunk.length);
      for (int i = 0; i < n; i++) if (chunk[i] != 0) return false;
      if (n < chunk.length) return true;
      at += n;
    }
  }

  /** Records of the window from rel into the batch, until it is full or the window stops. */
  private int scan() {
    final byte[] d = data;
    while (rel < dataLen) {
      if (rows >= BATCH_ROWS || bytes >= BATCH_BYTES) return FULL;
      if (dataLen - rel < Segments.PREFIX) {
        err = "incomplete record prefix";
        return INCOMPLETE;
      }
      long length = Segments.be32(d, rel), sum = Segments.be32(d, rel + 4);
      if (length < 9 || length > Segments.MAX_RECORD) {
        err = "invalid record length";
        return BAD;
      }
      if (dataLen - rel - Segments.PREFIX < length) {
        err = "incomplete record";
        return INCOMPLETE;
      }
      int inner = rel + Segments.PREFIX;
      crc.reset();
      crc.update(d, inner, (int) length);
      if (crc.getValue() != sum) {
        err = "checksum mismatch";
        return BAD;
      }
      String bad = parse(d, inner, inner + (int) length);
      if (bad != null) {
        err = bad;
        return BAD;
      }
      if (keeps(d)) emit(d, pos + rel);
      rel = inner + (int) length;
    }
    return END;
  }

  // -- one record --------------------------------------------------------------------------

  private int cur, limit; // cursor over the body

  private String need(int n) {
    if (limit - cur < n) return "malformed record body (truncated field)";
    return null;
  }

  /** A str16 (text: strict UTF-8) or bytes32 field; its offset in at[0], length in at[1]. */
  private String var(byte[] d, boolean wide, boolean text, int[] at) {
    String e = need(wide ? 4 : 2);
    if (e != null) return e;
    long len = wide ? Segments.be32(d, cur) : Segments.be16(d, cur);
    cur += wide ? 4 : 2;
    if (limit - cur < len) return "malformed record body (truncated field)";
    if (text && !Utf8.valid(d, cur, (int) len)) return "malformed record body (invalid UTF-8)";
    at[0] = cur;
    at[1] = (int) len;
    cur += (int) len;
    return null;
  }

  private final int[] at = new int[2];

  private String parse(byte[] d, int inner, int stop) {
    kind = d[inner] & 0xFF;
    ts = Segments.be64(d, inner + 1);
    cur = inner + 9;
    limit = stop;
    nh = 0;
    String e;
    switch (kind) {
      case PUBLISH -> {
        if ((e = need(27)) != null) return e;
        seq = Segments.be64(d, cur);
        pub = Segments.be64(d, cur + 8);
        exp = Segments.be64(d, cur + 16);
        prio = d[cur + 24] & 0xFF;
        attempts = Segments.be16(d, cur + 25);
        cur += 27;
        if ((e = var(d, false, true, at)) != null) return e;
        queueOff = at[0];
        queueLen = at[1];
        if ((e = var(d, false, true, at)) != null) return e;
        msgidOff = at[0];
        msgidLen = at[1];
        if ((e = need(2)) != null) return e;
        int count = Segments.be16(d, cur);
        cur += 2;
        if (hkOff.length < count) {
          hkOff = new int[count];
          hkLen = new int[count];
          hvOff = new int[count];
          hvLen = new int[count];
        }
        for (int i = 0; i < count; i++) {
          if ((e = var(d, false, true, at)) != null) return e;
          int ko = at[0], kl = at[1];
          if ((e = var(d, false, true, at)) != null) return e;
          // a repeated key keeps its first position and its last value, as a dict does
          int j = 0;
          while (j < nh && !same(d, hkOff[j], hkLen[j], ko, kl)) j++;
          hkOff[j] = ko;
          hkLen[j] = kl;
          hvOff[j] = at[0];
          hvLen[j] = at[1];
          if (j == nh) nh++;
        }
        if ((e = var(d, true, false, at)) != null) return e;
        payOff = at[0];
        payLen = at[1];
      }
      case DELIVER -> {
        if ((e = need(10)) != null) return e;
        seq = Segments.be64(d, cur);
        attempts = Segments.be16(d, cur + 8);
        cur += 10;
        if ((e = var(d, false, true, at)) != null) return e;
        queueOff = at[0];
        queueLen = at[1];
      }
      case SETTLE -> {
        if ((e = need(9)) != null) return e;
        seq = Segments.be64(d, cur);
        reason = d[cur + 8] & 0xFF;
        cur += 9;
        if ((e = var(d, false, true, at)) != null) return e;
        queueOff = at[0];
        queueLen = at[1];
        if (reason >= N_REASONS) return "malformed record body (unknown settle reason)";
        if ((e = var(d, false, true, at)) != null) return e;
        detailOff = at[0];
        detailLen = at[1];
      }
      case CREATE -> {
        if ((e = var(d, false, true, at)) != null) return e;
        queueOff = at[0];
        queueLen = at[1];
        if ((e = need(8)) != null) return e;
        cur += 8;
        if ((e = var(d, true, false, at)) != null) return e;
        optOff = at[0];
        optLen = at[1];
      }
      case DELETE -> {
        if ((e = var(d, false, true, at)) != null) return e;
        queueOff = at[0];
        queueLen = at[1];
      }
      default -> {
        return "malformed record body (unknown record type)";
      }
    }
    if (cur != limit) return "record body length mismatch";
    return null;
  }

  private static boolean same(byte[] d, int a, int alen, int b, int blen) {
    return alen == blen && java.util.Arrays.equals(d, a, a + alen, d, b, b + blen);
  }

  private boolean keeps(byte[] d) {
    if (hasLo && ts < lo) return false;
    if (hasHi && ts >= hi) return false;
    if (queues.length == 0) return true;
    for (byte[] q : queues) {
      if (q.length == queueLen && java.util.Arrays.equals(q, 0, q.length, d, queueOff, queueOff + queueLen)) {
        return true;
      }
    }
    return false;
  }

  /** The text of bytes, invalid UTF-8 replaced as Python's bytes.decode(errors="replace"). */
  private static void appendText(WritableColumnVector c, byte[] d, int off, int len) {
    if (Utf8.valid(d, off, len)) {
      c.appendByteArray(d, off, len);
    } else {
      byte[] fixed = Utf8.replaceInvalid(d, off, len);
      c.appendByteArray(fixed, 0, fixed.length);
    }
  }

  private void emit(byte[] d, long offset) {
    final boolean isPub = kind == PUBLISH, isSettle = kind == SETTLE, isCreate = kind == CREATE;
    final boolean hasSeq = isPub || isSettle || kind == DELIVER;
    final long tsUs = ts * 1000;
    WritableColumnVector c;
    if ((c = v[Columns.SEGMENT]) != null) c.appendLong(segment);
    if ((c = v[Columns.OFFSET]) != null) c.appendLong(offset);
    if ((c = v[Columns.TYPE]) != null) c.appendByteArray(KINDS[kind], 0, KINDS[kind].length);
    if ((c = v[Columns.TS]) != null) c.appendLong(tsUs);
    if ((c = v[Columns.QUEUE]) != null) c.appendByteArray(d, queueOff, queueLen);
    if ((c = v[Columns.SEQ]) != null) {
      if (hasSeq) c.appendLong(seq);
      else c.appendNull();
    }
    if ((c = v[Columns.MSGID]) != null) {
      if (isPub) c.appendByteArray(d, msgidOff, msgidLen);
      else c.appendNull();
    }
    if ((c = v[Columns.PUBAT]) != null) {
      if (isPub) c.appendLong(pub * 1000);
      else c.appendNull();
    }
    if ((c = v[Columns.EXPAT]) != null) {
      if (isPub && exp != 0) c.appendLong(exp * 1000);
      else c.appendNull();
    }
    if ((c = v[Columns.PRIO]) != null) {
      if (isPub) c.appendInt(prio);
      else c.appendNull();
    }
    if ((c = v[Columns.HEADERS]) != null) {
      if (isPub) {
        c.appendArray(nh);
        WritableColumnVector keys = c.getChild(0), values = c.getChild(1);
        for (int i = 0; i < nh; i++) {
          keys.appendByteArray(d, hkOff[i], hkLen[i]);
          values.appendByteArray(d, hvOff[i], hvLen[i]);
        }
      } else {
        c.appendNull();
      }
    }
    if ((c = v[Columns.PAYLOAD]) != null) {
      if (isPub) appendText(c, d, payOff, payLen);
      else c.appendNull();
    }
    if ((c = v[Columns.PAYBIN]) != null) {
      if (isPub) c.appendByteArray(d, payOff, payLen);
      else c.appendNull();
    }
    if ((c = v[Columns.PAYSIZE]) != null) {
      if (isPub) c.appendInt(payLen);
      else c.appendNull();
    }
    if ((c = v[Columns.ATTEMPTS]) != null) {
      if (isPub || kind == DELIVER) c.appendInt(attempts);
      else c.appendNull();
    }
    if ((c = v[Columns.REASON]) != null) {
      if (isSettle) c.appendByteArray(REASONS[reason], 0, REASONS[reason].length);
      else c.appendNull();
    }
    if ((c = v[Columns.SETTLEDAT]) != null) {
      if (isSettle) c.appendLong(tsUs);
      else c.appendNull();
    }
    if ((c = v[Columns.DLR]) != null) {
      int dlr = -1;
      if (isPub) {
        for (int i = 0; i < nh; i++) {
          if (hkLen[i] == DLR_KEY.length
              && java.util.Arrays.equals(d, hkOff[i], hkOff[i] + hkLen[i], DLR_KEY, 0, DLR_KEY.length)) {
            dlr = i;
          }
        }
      }
      if (dlr >= 0) c.appendByteArray(d, hvOff[dlr], hvLen[dlr]);
      else if (isSettle && reason == DEAD_LETTERED) c.appendByteArray(d, detailOff, detailLen);
      else c.appendNull();
    }
    if ((c = v[Columns.DETAIL]) != null) {
      if (isSettle) c.appendByteArray(d, detailOff, detailLen);
      else c.appendNull();
    }
    if ((c = v[Columns.OPTIONS]) != null) {
      if (isCreate) appendText(c, d, optOff, optLen);
      else c.appendNull();
    }
    rows++;
    bytes += (isPub ? payLen : 0) + queueLen + (isPub ? msgidLen : 0) + (isCreate ? optLen : 0) + 64;
  }

  @Override
  public ColumnarBatch get() {
    return batch;
  }

  @Override
  public void close() {
    batch.close();
    if (file != null) {
      try {
        file.close();
      } catch (IOException e) {
        // nothing was written: a failed close loses nothing
      }
      file = null;
    }
  }
}
