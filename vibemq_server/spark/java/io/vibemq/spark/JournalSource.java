/*
 * format("vibemq"): the VibeMQ journal read by the JVM (DataSource V2), and a broker as a
 * sink; see docs/spark.md.
 *
 * Batch reads: the same rows as the Python source (vibemq_server/spark/datasource.py),
 * decoded into Spark's column vectors inside the executor JVM: no Python worker, no Arrow
 * transfer, only the columns a query uses filled, queue and time filters pushed down.
 * Streams: JournalStream (the Python stream reader's offsets: checkpoints carry over).
 * Writes: BrokerWrite (the native protocol from the executor JVM).
 */
package io.vibemq.spark;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

public class JournalSource implements TableProvider, DataSourceRegister {
  /** The short name; the Python source answers to "vibemq.python" beside it. */
  public static final String NAME = "vibemq";

  @Override
  public String shortName() {
    return NAME;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return Columns.SCHEMA;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> props) {
    return new JournalTable();
  }

  /** format("vibemq.jvm"), the name of the first JVM reader: an alias kept for old code. */
  public static final class Alias extends JournalSource {
    @Override
    public String shortName() {
      return "vibemq.jvm";
    }
  }

  static final class JournalTable implements Table, SupportsRead, SupportsWrite {
    @Override
    public String name() {
      return "vibemq journal";
    }

    @Override
    @SuppressWarnings("deprecation") // Spark's file sources still implement schema() too
    public StructType schema() {
      return Columns.SCHEMA;
    }

    @Override
    public Set<TableCapability> capabilities() {
      // Any schema is accepted for writes: the writer takes the columns it knows by name.
      return EnumSet.of(
          TableCapability.BATCH_READ,
          TableCapability.MICRO_BATCH_READ,
          TableCapability.BATCH_WRITE,
          TableCapability.STREAMING_WRITE,
          TableCapability.ACCEPT_ANY_SCHEMA);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return new JournalScan(options);
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
      return new BrokerWrite(info);
    }
  }
}
