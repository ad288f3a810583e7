/* The journal's DataFrame schema (vibemq_server/spark/journal_reader.py: SCHEMA_DDL). */
package io.vibemq.spark;

import org.apache.spark.sql.types.StructType;

final class Columns {
  static final StructType SCHEMA =
      StructType.fromDDL(
          "segment BIGINT, offset BIGINT, record_type STRING, timestamp TIMESTAMP, queue STRING, "
              + "seq BIGINT, message_id STRING, published_at TIMESTAMP, expires_at TIMESTAMP, "
              + "priority INT, headers MAP<STRING,STRING>, payload STRING, payload_binary BINARY, "
              + "payload_size INT, delivery_attempts INT, settle_reason STRING, "
              + "settled_at TIMESTAMP, dead_letter_reason STRING, detail STRING, "
              + "queue_options STRING");

  static final int SEGMENT = 0, OFFSET = 1, TYPE = 2, TS = 3, QUEUE = 4, SEQ = 5, MSGID = 6,
      PUBAT = 7, EXPAT = 8, PRIO = 9, HEADERS = 10, PAYLOAD = 11, PAYBIN = 12, PAYSIZE = 13,
      ATTEMPTS = 14, REASON = 15, SETTLEDAT = 16, DLR = 17, DETAIL = 18, OPTIONS = 19;
  static final int COUNT = 20;

  private Columns() {}
}
