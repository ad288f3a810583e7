/*
 * df.write / writeStream .format("vibemq"): rows published into a running broker, with the
 * Python writer's options (host, port, queue, token, maxInFlight, timeout) and columns
 * (payload or payload_binary, queue unless the option names one, headers, priority); see
 * vibemq_server/spark/publisher.py. One connection per task, every PublishAck awaited before
 * the task commits; an Error reply or a lost connection fails the task: at least once.
 * Published messages cannot be withdrawn, so abort has nothing to undo.
 */
package io.vibemq.spark;

import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.Arrays;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

final class BrokerWrite implements WriteBuilder, Write, BatchWrite, StreamingWrite {
  private final Config config;

  BrokerWrite(LogicalWriteInfo info) {
    this.config = Config.of(info.options(), info.schema());
  }

  /** Where to publish, and which column holds what (-1: none). Plain values: shipped. */
  record Config(String host, int port, String queue, String token, int maxInFlight,
      long timeoutMs, int queueCol, int payloadCol, boolean payloadIsText, int binaryCol,
      int headersCol, int priorityCol, DataType priorityType) implements Serializable {
    static Config of(CaseInsensitiveStringMap o, StructType schema) {
      List<String> names = Arrays.asList(schema.fieldNames());
      String queue = blank(o.get("queue"));
      if (!names.contains("payload") && !names.contains("payload_binary")) {
        throw new IllegalArgumentException(
            "the vibemq writer needs a 'payload' (or 'payload_binary') column");
      }
      if (queue == null && !names.contains("queue")) {
        throw new IllegalArgumentException(
            "the vibemq writer needs the 'queue' option or a 'queue' column");
      }
      int payload = names.indexOf("payload"), headers = names.indexOf("headers");
      int priority = names.indexOf("priority");
      if (headers >= 0 && !(schema.fields()[headers].dataType() instanceof MapType)) {
        throw new IllegalArgumentException("the vibemq writer's 'headers' column must be a map");
      }
      DataType prio = priority < 0 ? null : schema.fields()[priority].dataType();
      String timeout = blank(o.get("timeout"));
      String inFlight = blank(o.get("maxInFlight"));
      String port = blank(o.get("port"));
      String host = blank(o.get("host"));
      return new Config(
          host == null ? "127.0.0.1" : host,
          port == null ? 2925 : Integer.parseInt(port),
          queue,
          blank(o.get("token")),
          Math.max(1, inFlight == null ? 1000 : Integer.parseInt(inFlight)),
          (long) (1000 * (timeout == null ? 30.0 : Double.parseDouble(timeout))),
          names.indexOf("queue"),
          payload,
          payload >= 0 && schema.fields()[payload].dataType() == DataTypes.StringType,
          names.indexOf("payload_binary"),
          headers,
          priority,
          prio);
    }

    private static String blank(String value) {
      return value == null || value.isEmpty() ? null : value;
    }
  }

  // -- the write's plan ---------------------------------------------------------------------

  @Override
  public Write build() {
    return this;
  }

  @Override
  public BatchWrite toBatch() {
    return this;
  }

  @Override
  public StreamingWrite toStreaming() {
    return this;
  }

  @Override
  public String description() {
    return "vibemq broker " + config.host() + ":" + config.port();
  }

  @Override
  public Factory createBatchWriterFactory(PhysicalWriteInfo info) {
    return new Factory(config);
  }

  @Override
  public Factory createStreamingWriterFactory(PhysicalWriteInfo info) {
    return new Factory(config);
  }

  @Override
  public void commit(WriterCommitMessage[] messages) {
    // Every PublishAck was awaited in the tasks: nothing left to do.
  }

  @Override
  public void abort(WriterCommitMessage[] messages) {
    // Published messages cannot be withdrawn: Spark's retry may publish some twice.
  }

  @Override
  public boolean useCommitCoordinator() {
    return true; // one task attempt of a partition commits (Spark's default for both)
  }

  @Override
  public void commit(long epochId, WriterCommitMessage[] messages) {}

  @Override
  public void abort(long epochId, WriterCommitMessage[] messages) {}

  record Published(long count) implements WriterCommitMessage {}

  static final class Factory implements DataWriterFactory, StreamingDataWriterFactory {
    private static final long serialVersionUID = 1L;
    private final Config config;

    Factory(Config config) {
      this.config = config;
    }

    @Override
    public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
      return new RowWriter(config);
    }

    @Override
    public DataWriter<InternalRow> createWriter(int partitionId, long taskId, long epochId) {
      return new RowWriter(config);
    }
  }

  /** One task's rows, published over one connection. */
  static final class RowWriter implements DataWriter<InternalRow> {
    private static final String[] PRIORITIES = {"Low", "Normal", "High", "Critical"};
    private static final byte[] EMPTY = new byte[0];
    private final Config c;
    private Publisher publisher;
    private long count;

    RowWriter(Config config) {
      this.c = config;
    }

    @Override
    public void write(InternalRow row) throws IOException {
      if (publisher == null) {
        publisher = new Publisher(c.host(), c.port(), c.token(), c.maxInFlight(), c.timeoutMs());
      }
      String queue = c.queue();
      if (queue == null) {
        queue = row.isNullAt(c.queueCol()) ? null : row.getUTF8String(c.queueCol()).toString();
        if (queue == null || queue.isEmpty()) {
          throw new IllegalArgumentException("row without a queue (and no 'queue' option)");
        }
      }
      byte[] payload = null;
      if (c.payloadCol() >= 0 && !row.isNullAt(c.payloadCol())) {
        payload = c.payloadIsText()
            ? row.getUTF8String(c.payloadCol()).getBytes()
            : row.getBinary(c.payloadCol());
      }
      if (payload == null && c.binaryCol() >= 0 && !row.isNullAt(c.binaryCol())) {
        payload = row.getBinary(c.binaryCol());
      }
      if (payload == null) payload = EMPTY;
      String[] headers = Publisher.NO_HEADERS;
      if (c.headersCol() >= 0 && !row.isNullAt(c.headersCol())) {
        var map = row.getMap(c.headersCol());
        var keys = map.keyArray();
        var values = map.valueArray();
        headers = new String[2 * map.numElements()];
        for (int i = 0; i < map.numElements(); i++) {
          headers[2 * i] = keys.getUTF8String(i).toString();
          headers[2 * i + 1] = values.isNullAt(i) ? null : values.getUTF8String(i).toString();
        }
      }
      String priority = null;
      if (c.priorityCol() >= 0 && !row.isNullAt(c.priorityCol())) {
        if (c.priorityType() != DataTypes.StringType) {
          long p = ((Number) row.get(c.priorityCol(), c.priorityType())).longValue();
          priority = p >= 0 && p < PRIORITIES.length ? PRIORITIES[(int) p] : null;
        } else {
          priority = row.getUTF8String(c.priorityCol()).toString();
          if (priority.isEmpty()) priority = null;
        }
      }
      publisher.publish(queue, payload, headers, priority);
      count++;
    }

    @Override
    public WriterCommitMessage commit() throws IOException {
      if (publisher != null) publisher.finish();
      return new Published(count);
    }

    @Override
    public void abort() {
      close();
    }

    @Override
    public void close() {
      if (publisher != null) {
        try {
          publisher.close();
        } catch (IOException e) {
          throw new UncheckedIOException(e);
        }
        publisher = null;
      }
    }
  }
}
