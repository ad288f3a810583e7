/*
 * Segment files of a journal and record boundaries in them, for planning: the listing of
 * vibemq_server/journal/recovery.py, and journal_reader.py's segments_for, scan and
 * record_cuts (record prefixes walked, no decoding: the executors check every record).
 */
package io.vibemq.spark;

import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.util.ArrayList;
import java.util.List;

final class Segments {
  static final int HEADER = 16; // magic, version, reserved, segment number
  static final int PREFIX = 8; // length u32, crc32 u32
  static final long MAX_RECORD = 64L * 1024 * 1024;
  static final String SUFFIX = ".seg";

  record Segment(long number, String path) {}

  private Segments() {}

  /** The directory holding the segments: data_dir/journal, or data_dir itself. */
  static File journalDir(String dataDir) {
    File sub = new File(dataDir, "journal");
    return sub.isDirectory() ? sub : new File(dataDir);
  }

  /** Segment files in number order (a name of digits before ".seg"). */
  static List<Segment> list(String dataDir) {
    List<Segment> out = new ArrayList<>();
    File[] files = journalDir(dataDir).listFiles();
    if (files == null) return out;
    for (File f : files) {
      String name = f.getName();
      if (!name.endsWith(SUFFIX)) continue;
      String stem = name.substring(0, name.length() - SUFFIX.length());
      if (stem.isEmpty() || !stem.chars().allMatch(c -> c >= '0' && c <= '9')) continue;
      out.add(new Segment(Long.parseLong(stem), f.getPath()));
    }
    out.sort((a, b) -> Long.compare(a.number(), b.number()));
    return out;
  }

  /** The segments a read must open: all, less those the time range excludes. */
  static List<Segment> forFilter(String dataDir, RowFilter filter) throws IOException {
    List<Segment> out = new ArrayList<>();
    for (Segment seg : list(dataDir)) {
      if (filter.hasTime()) {
        File f = new File(seg.path());
        Long first;
        try {
          first = firstRecordMs(seg.path());
        } catch (FileNotFoundException e) {
          continue; // reclaimed by a running broker while listing
        }
        long last = f.lastModified() + 1;
        if (!filter.mayHold(first, last)) continue;
      }
      out.add(seg);
    }
    return out;
  }

  static Long firstRecordMs(String path) throws IOException {
    try (RandomAccessFile f = new RandomAccessFile(path, "r")) {
      byte[] b = new byte[HEADER + PREFIX + 9];
      int n = readAt(f, 0, b, b.length);
      if (n < b.length) return null;
      return be64(b, HEADER + PREFIX + 1);
    }
  }

  /** Reads up to len bytes at pos into buf (fewer only at the end of the file). */
  static int readAt(RandomAccessFile f, long pos, byte[] buf, int len) throws IOException {
    f.seek(pos);
    int done = 0;
    while (done < len) {
      int n = f.read(buf, done, len - done);
      if (n < 0) break;
      done += n;
    }
    return done;
  }

  /**
   * Record boundaries about every bytes apart from HEADER to the file's end; the last range
   * is at least every long (journal_reader.record_cuts with the compiled walk).
   */
  static List<Long> recordCuts(String path, long every) throws IOException {
    File file = new File(path);
    if (!file.exists()) return new ArrayList<>();
    return recordCuts(path, every, HEADER, file.length());
  }

  /** Record boundaries about every bytes apart in [start, stop) (stop: a record boundary). */
  static List<Long> recordCuts(String path, long every, long start, long stop)
      throws IOException {
    List<Long> cuts = new ArrayList<>();
    File file = new File(path);
    if (!file.exists()) return cuts;
    long pos = Math.max(start, HEADER);
    try (RandomAccessFile f = new RandomAccessFile(file, "r")) {
      byte[] buf = null;
      while (stop - pos > every + every / 2) {
        int want = (int) every;
        if (buf == null) buf = new byte[want];
        int n = readAt(f, pos, buf, want);
        int at = 0;
        while (n - at >= PREFIX) {
          long length = be32(buf, at);
          if (length < 9 || length > MAX_RECORD || n - at - PREFIX < length) break;
          at += PREFIX + (int) length;
        }
        if (at == 0) break; // a record bigger than a range, or a bad length: one range
        pos += at;
        cuts.add(pos);
      }
    }
    return cuts;
  }

  /** Bytes of a segment read at a time by {@link #walk}. */
  static final int WALK_WINDOW = 1 << 20;

  /**
   * Walks record prefixes (no decoding) from start: {end, count}, end just after the last
   * whole record reached, stopping after maxRecords (-1: no limit) and at stop (-1: the
   * file's end; else a record boundary). Bytes up to a file's size are written (appends grow
   * the size after copying), so a record whose length fits in the file is whole; the
   * executors check every CRC. journal_reader.scan.
   */
  static long[] walk(String path, long start, long maxRecords, long stop) throws IOException {
    try (RandomAccessFile f = new RandomAccessFile(path, "r")) {
      byte[] head = new byte[HEADER];
      if (readAt(f, 0, head, HEADER) < HEADER) return new long[] {HEADER, 0};
      checkHeader(head, path);
      long limit = f.length();
      if (stop >= 0) limit = Math.min(limit, stop);
      long pos = Math.max(start, HEADER), count = 0;
      byte[] buf = new byte[(int) Math.min(WALK_WINDOW, Math.max(PREFIX, limit - pos))];
      long bufPos = pos;
      int bufLen = 0;
      while ((maxRecords < 0 || count < maxRecords) && pos + PREFIX <= limit) {
        if (pos < bufPos || pos + PREFIX > bufPos + bufLen) {
          bufPos = pos;
          bufLen = readAt(f, pos, buf, (int) Math.min(buf.length, limit - pos));
          if (bufLen < PREFIX) break;
        }
        long length = be32(buf, (int) (pos - bufPos));
        long next = pos + PREFIX + length;
        if (length < 9 || length > MAX_RECORD || next > limit) break;
        pos = next;
        count++;
      }
      return new long[] {pos, count};
    }
  }

  static void checkHeader(byte[] head, String path) throws IOException {
    if (head[0] != 'V' || head[1] != 'M' || head[2] != 'Q' || head[3] != 'J') {
      throw new IOException("not a VibeMQ journal segment (bad magic) in " + path + " at offset 0");
    }
    int version = be16(head, 4);
    if (version != 1) {
      throw new IOException(
          "unsupported journal format version " + version + " in " + path + " at offset 0");
    }
  }

  /** The file of segment number in a data directory (recovery.segment_path). */
  static String file(String dataDir, long number) {
    return new File(journalDir(dataDir), String.format("%020d", number) + SUFFIX).getPath();
  }

  static long be32(byte[] b, int i) {
    return ((b[i] & 0xFFL) << 24) | ((b[i + 1] & 0xFFL) << 16) | ((b[i + 2] & 0xFFL) << 8)
        | (b[i + 3] & 0xFFL);
  }

  static int be16(byte[] b, int i) {
    return ((b[i] & 0xFF) << 8) | (b[i + 1] & 0xFF);
  }

  static long be64(byte[] b, int i) {
    return (be32(b, i) << 32) | be32(b, i + 4);
  }
}
