/*
 * format("vibemq.jvm"): the VibeMQ journal read by the JVM (DataSource V2), see docs/spark.md.
 *
 * The same rows as the Python source's batch read (vibemq_server/spark/datasource.py), decoded
 * into Spark's column vectors inside the executor JVM: no Python worker, no Arrow transfer,
 * only the columns a query uses filled (column pruning), queue and time filters pushed down.
 */
package io.vibemq.spark;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

public final class JournalSource implements TableProvider, DataSourceRegister {
  /** The short name; the Python source keeps "vibemq" (streaming, writing, no jar needed). */
  public static final String NAME = "vibemq.jvm";

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

  static final class JournalTable implements Table, SupportsRead {
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
      return EnumSet.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return new JournalScan(options);
    }
  }
}
