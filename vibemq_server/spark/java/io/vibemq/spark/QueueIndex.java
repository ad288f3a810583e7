/*
 * The queue index sidecar of a sealed segment (vibemq_server/journal/qindex.py): the byte
 * ranges of each queue's records and their time span. A scan filtered on queues or time reads
 * only the ranges it lists. Trusted only when whole (the CRC-32 of its head and directory and
 * of each block read) and matching the segment as it is (number, file size, the CRC-32 fields
 * of its first and last records); else the segment is read in full, as without one.
 */
package io.vibemq.spark;

import java.io.File;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.zip.CRC32;

final class QueueIndex {
  static final String SUFFIX = ".qidx";
  // magic, version, reserved, segment, size, end, first crc, last offset, last crc, queues,
  // directory length
  static final int HEAD = 4 + 2 + 2 + 8 + 8 + 8 + 4 + 8 + 4 + 4 + 4;
  private static final int ENTRY = 8 + 8 + 4 + 8 + 4; // min, max, ranges, block offset, crc

  private QueueIndex() {}

  static String sidecar(String segmentPath) {
    String stem = segmentPath.substring(0, segmentPath.length() - Segments.SUFFIX.length());
    return stem + SUFFIX;
  }

  /**
   * The ranges {start, end, start, end, ...} (in file order, adjacent ones merged) holding the
   * records of the filter's queues whose time span meets its time range; null when the segment
   * has no valid sidecar (read it in full).
   */
  static long[] ranges(String segmentPath, long number, RowFilter filter) {
    File file = new File(sidecar(segmentPath));
    if (!file.isFile()) return null;
    try (RandomAccessFile idx = new RandomAccessFile(file, "r");
        RandomAccessFile seg = new RandomAccessFile(segmentPath, "r")) {
      byte[] head = new byte[HEAD];
      if (Segments.readAt(idx, 0, head, HEAD) < HEAD) return null;
      if (head[0] != 'V' || head[1] != 'M' || head[2] != 'Q' || head[3] != 'I') return null;
      if (Segments.be16(head, 4) != 1) return null;
      long dirLen = Segments.be32(head, HEAD - 4);
      if (dirLen > idx.length()) return null;
      byte[] top = new byte[HEAD + (int) dirLen + 4];
      if (Segments.readAt(idx, 0, top, top.length) < top.length) return null;
      if (crc(top, 0, HEAD + (int) dirLen) != Segments.be32(top, HEAD + (int) dirLen)) return null;
      if (Segments.be64(head, 8) != number || Segments.be64(head, 16) != seg.length()) return null;
      long lastOff = Segments.be64(head, 36);
      if (lastOff != 0
          && (crcField(seg, Segments.HEADER) != Segments.be32(head, 32)
              || crcField(seg, lastOff) != Segments.be32(head, 44))) {
        return null;
      }
      long queues = Segments.be32(head, 48);
      List<long[]> found = new ArrayList<>();
      int at = HEAD;
      for (long q = 0; q < queues; q++) {
        int n = Segments.be16(top, at);
        String name = new String(top, at + 2, n, StandardCharsets.UTF_8);
        at += 2 + n;
        long min = Segments.be64(top, at), max = Segments.be64(top, at + 8);
        long count = Segments.be32(top, at + 16);
        long block = Segments.be64(top, at + 20), sum = Segments.be32(top, at + 28);
        at += ENTRY;
        if (!filter.queues.isEmpty() && !filter.queues.contains(name)) continue;
        if (!filter.mayHold(min, max)) continue;
        byte[] b = new byte[(int) (count * 16)];
        if (Segments.readAt(idx, block, b, b.length) < b.length || crc(b, 0, b.length) != sum) {
          return null;
        }
        for (int i = 0; i < count; i++) {
          found.add(new long[] {Segments.be64(b, 16 * i), Segments.be64(b, 16 * i + 8)});
        }
      }
      if (at != HEAD + dirLen) return null;
      return merged(found);
    } catch (IOException | RuntimeException e) {
      return null; // unreadable or malformed: not trusted
    }
  }

  private static long[] merged(List<long[]> ranges) {
    ranges.sort((a, b) -> Long.compare(a[0], b[0]));
    long[] out = new long[2 * ranges.size()];
    int n = 0;
    for (long[] r : ranges) {
      if (n > 0 && out[n - 1] == r[0]) {
        out[n - 1] = r[1];
      } else {
        out[n++] = r[0];
        out[n++] = r[1];
      }
    }
    return java.util.Arrays.copyOf(out, n);
  }

  private static long crc(byte[] b, int off, int len) {
    CRC32 c = new CRC32();
    c.update(b, off, len);
    return c.getValue();
  }

  /** The CRC-32 field of the record at offset, or -1. */
  private static long crcField(RandomAccessFile seg, long offset) throws IOException {
    byte[] b = new byte[4];
    if (Segments.readAt(seg, offset + 4, b, 4) < 4) return -1;
    return Segments.be32(b, 0);
  }

  /** Ranges {start, end, ...} split into groups of about every bytes each. */
  static List<long[]> groups(long[] ranges, long every) {
    List<long[]> out = new ArrayList<>();
    int first = 0;
    long bytes = 0;
    for (int i = 0; i < ranges.length; i += 2) {
      bytes += ranges[i + 1] - ranges[i];
      if (bytes >= every || i + 2 == ranges.length) {
        out.add(java.util.Arrays.copyOfRange(ranges, first, i + 2));
        first = i + 2;
        bytes = 0;
      }
    }
    return out;
  }
}
