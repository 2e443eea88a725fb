package io.stratalog.spark;

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
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code format("stratalog")}: batch and streaming reads of Stratalog (or any Kafka broker)
 * decoded on the JVM straight into Spark's column vectors, with no Python worker in between,
 * and writes that put each record in the log once. The options and the schema are those of
 * Spark's Kafka source and sink.
 */
public final class StratalogJvmSource implements TableProvider, DataSourceRegister {
  @Override
  public String shortName() {
    return "stratalog";
  }

  static StructType schema(boolean includeHeaders) {
    StructType s = new StructType()
        .add("key", DataTypes.BinaryType)
        .add("value", DataTypes.BinaryType)
        .add("topic", DataTypes.StringType)
        .add("partition", DataTypes.IntegerType)
        .add("offset", DataTypes.LongType)
        .add("timestamp", DataTypes.TimestampType)
        .add("timestampType", DataTypes.IntegerType);
    if (includeHeaders) {
      StructType header = new StructType()
          .add("key", DataTypes.StringType)
          .add("value", DataTypes.BinaryType);
      s = s.add("headers", new ArrayType(header, true));
    }
    return s;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    // Only what the schema needs: Spark also asks here before a write, which must fail with
    // its own message, not with the read options' ones.
    String headers = options.getOrDefault("includeHeaders", "false");
    if (!headers.equalsIgnoreCase("true") && !headers.equalsIgnoreCase("false")) {
      throw new IllegalArgumentException(
          "option 'includeHeaders' must be 'true' or 'false', not '" + headers + "'");
    }
    return schema(headers.equalsIgnoreCase("true"));
  }

  @Override
  public Table getTable(
      StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new ReadTable(schema);
  }

  /**
   * The topic(s) the options name: read in batch or micro-batches, written in batch or
   * streaming (rows of any schema; the sink picks its columns by name).
   */
  static final class ReadTable implements SupportsRead, SupportsWrite {
    private final StructType schema;

    ReadTable(StructType schema) {
      this.schema = schema;
    }

    @Override
    public String name() {
      return "stratalog";
    }

    @Override
    @SuppressWarnings("deprecation") // columns() is the newer form; Spark still calls schema()
    public StructType schema() {
      return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ,
          TableCapability.BATCH_WRITE, TableCapability.STREAMING_WRITE,
          TableCapability.TRUNCATE, TableCapability.ACCEPT_ANY_SCHEMA);
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
      return new SinkWrite(info);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return new BatchScan(new ReadOptions(options), schema);
    }
  }
}
