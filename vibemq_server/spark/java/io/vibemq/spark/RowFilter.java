/*
 * Queues (empty: all) and a record-time range [startMs, endMs) applied while reading: the
 * options queue, startTime and endTime and the pushed-down filters, as
 * vibemq_server/spark/journal_reader.py's RowFilter and pushdown.py narrow it.
 */
package io.vibemq.spark;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.sql.Timestamp;
import java.time.Instant;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

final class RowFilter implements Serializable {
  private static final long serialVersionUID = 1L;

  final Set<String> queues; // empty: every queue
  final Long startMs; // inclusive, or null
  final Long endMs; // exclusive, or null

  RowFilter(Set<String> queues, Long startMs, Long endMs) {
    this.queues = queues;
    this.startMs = startMs;
    this.endMs = endMs;
  }

  static RowFilter fromOptions(CaseInsensitiveStringMap options) {
    Set<String> queues = new TreeSet<>();
    String q = options.get("queue");
    if (q != null) {
      for (String part : q.split(",")) {
        if (!part.trim().isEmpty()) queues.add(part.trim());
      }
    }
    String start = options.get("startTime"), end = options.get("endTime");
    return new RowFilter(
        queues,
        start == null || start.isEmpty() ? null : parseTimeMs(start),
        end == null || end.isEmpty() ? null : parseTimeMs(end));
  }

  /** ms since the epoch from an integer (ms) or ISO-8601 text (UTC unless a zone is given). */
  static long parseTimeMs(String value) {
    String text = value.trim();
    if (text.matches("-?\\d+")) return Long.parseLong(text);
    String iso = text.replace(' ', 'T');
    if (iso.endsWith("Z")) iso = iso.substring(0, iso.length() - 1) + "+00:00";
    Instant at;
    if (!iso.contains("T")) {
      at = LocalDate.parse(iso).atStartOfDay(ZoneOffset.UTC).toInstant();
    } else if (iso.matches(".*T.*[+-]\\d\\d:?\\d\\d$")) {
      at = OffsetDateTime.parse(iso).toInstant();
    } else {
      at = LocalDateTime.parse(iso).toInstant(ZoneOffset.UTC);
    }
    return at.toEpochMilli();
  }

  /** The queue names as UTF-8 bytes, for comparing with the records' bytes. */
  byte[][] queueBytes() {
    byte[][] out = new byte[queues.size()][];
    int i = 0;
    for (String q : queues) out[i++] = q.getBytes(StandardCharsets.UTF_8);
    return out;
  }

  /** Whether a segment whose records were written from firstMs to lastMs may hold rows. */
  boolean mayHold(Long firstMs, Long lastMs) {
    if (endMs != null && firstMs != null && firstMs >= endMs) return false;
    return !(startMs != null && lastMs != null && lastMs < startMs);
  }

  boolean hasTime() {
    return startMs != null || endMs != null;
  }

  // -- pushdown (pushdown.py) -------------------------------------------------------------

  /** This filter narrowed by f, or null when f is not one it applies exactly. */
  RowFilter narrow(Filter f) {
    if (f instanceof EqualTo e && e.attribute().equals("queue")) {
      return withQueues(new Object[] {e.value()});
    }
    if (f instanceof In in && in.attribute().equals("queue")) return withQueues(in.values());
    if (f instanceof GreaterThanOrEqual g && g.attribute().equals("timestamp")) {
      Long us = micros(g.value());
      return us == null ? null : atLeast(ceilMs(us));
    }
    if (f instanceof GreaterThan g && g.attribute().equals("timestamp")) {
      Long us = micros(g.value());
      return us == null ? null : atLeast(Math.floorDiv(us, 1000L) + 1);
    }
    if (f instanceof LessThan l && l.attribute().equals("timestamp")) {
      Long us = micros(l.value());
      return us == null ? null : below(ceilMs(us));
    }
    if (f instanceof LessThanOrEqual l && l.attribute().equals("timestamp")) {
      Long us = micros(l.value());
      return us == null ? null : below(Math.floorDiv(us, 1000L) + 1);
    }
    return null;
  }

  private RowFilter withQueues(Object[] values) {
    Set<String> wanted = new TreeSet<>();
    for (Object v : values) {
      if (!(v instanceof String s)) return null;
      wanted.add(s);
    }
    Set<String> out = new TreeSet<>(wanted);
    if (!queues.isEmpty()) out.retainAll(queues);
    if (out.isEmpty()) return new RowFilter(wanted, 1L, 0L); // nothing can match
    return new RowFilter(out, startMs, endMs);
  }

  private RowFilter atLeast(long ms) {
    return new RowFilter(queues, startMs == null ? ms : Math.max(ms, startMs), endMs);
  }

  private RowFilter below(long ms) {
    return new RowFilter(queues, startMs, endMs == null ? ms : Math.min(ms, endMs));
  }

  private static long ceilMs(long us) {
    return -Math.floorDiv(-us, 1000L);
  }

  private static Long micros(Object value) {
    if (value instanceof Instant i) return i.getEpochSecond() * 1_000_000L + i.getNano() / 1000;
    if (value instanceof Timestamp t) return micros(t.toInstant());
    return null;
  }

  /** (narrowed filter, filters left to Spark) */
  static Object[] push(RowFilter current, Filter[] filters) {
    List<Filter> rest = new ArrayList<>();
    for (Filter f : filters) {
      RowFilter narrowed = current.narrow(f);
      if (narrowed == null) rest.add(f);
      else current = narrowed;
    }
    return new Object[] {current, rest.toArray(new Filter[0])};
  }

  @Override
  public String toString() {
    return "queues=" + queues + " startMs=" + startMs + " endMs=" + endMs;
  }
}
