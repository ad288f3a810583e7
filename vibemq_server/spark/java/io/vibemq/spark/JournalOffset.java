/*
 * A streaming offset: the next record to read is at byte position of segment (segment 0,
 * position 0: before the first segment). Its JSON is the Python stream reader's,
 * {"segment": n, "position": p} as json.dumps writes it, so either reader continues a
 * checkpoint the other wrote.
 */
package io.vibemq.spark;

import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.sql.connector.read.streaming.Offset;

final class JournalOffset extends Offset implements Comparable<JournalOffset> {
  static final JournalOffset BEFORE_START = new JournalOffset(0, 0);
  private static final Pattern FIELD =
      Pattern.compile("\"(segment|position)\"\\s*:\\s*(-?\\d+)(?:\\.0*)?\\s*[,}]");

  final long segment;
  final long position;

  JournalOffset(long segment, long position) {
    this.segment = segment;
    this.position = position;
  }

  static JournalOffset parse(String json) {
    Long segment = null, position = null;
    Matcher m = FIELD.matcher(json);
    while (m.find()) {
      long value = Long.parseLong(m.group(2));
      if (m.group(1).equals("segment")) segment = value;
      else position = value;
    }
    if (segment == null || position == null || !json.trim().startsWith("{")) {
      throw new IllegalArgumentException(
          "offset must be {\"segment\": n, \"position\": p}: " + json);
    }
    return new JournalOffset(segment, position);
  }

  @Override
  public String json() {
    return "{\"segment\": " + segment + ", \"position\": " + position + "}";
  }

  @Override
  public int compareTo(JournalOffset o) {
    int c = Long.compare(segment, o.segment);
    return c != 0 ? c : Long.compare(position, o.position);
  }
}
