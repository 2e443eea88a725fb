package io.stratalog.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * Builder, scan and batch in one: it keeps only the columns the query reads (so a count or a
 * sum over values never materialises keys, topics or headers) and plans one task per offset
 * range (or split partition family) on the driver; a streaming query gets a
 * {@link MicroBatch} instead.
 */
final class BatchScan implements ScanBuilder, SupportsPushDownRequiredColumns, Scan, Batch {
  private final ReadOptions opts;
  private final StructType fullSchema;
  private StructType readSchema;

  BatchScan(ReadOptions opts, StructType fullSchema) {
    this.opts = opts;
    this.fullSchema = fullSchema;
    this.readSchema = fullSchema;
  }

  @Override
  public void pruneColumns(StructType requiredSchema) {
    // Whole columns only: a query that reads one field of the headers still gets both (the
    // decoder writes key and value), and Spark projects the field out.
    StructType kept = new StructType();
    for (StructField f : requiredSchema.fields()) {
      kept = kept.add(fullSchema.apply(f.name()));
    }
    readSchema = kept;
  }

  @Override
  public Scan build() {
    return this;
  }

  @Override
  public StructType readSchema() {
    return readSchema;
  }

  @Override
  public String description() {
    return "stratalog " + (opts.subscribePattern != null ? "pattern " + opts.subscribePattern
        : opts.subscribe.isEmpty() ? "assign " + opts.assign : "subscribe " + opts.subscribe);
  }

  @Override
  public Batch toBatch() {
    opts.checkBatch();
    return this;
  }

  @Override
  public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
    opts.checkStreaming();
    return new MicroBatch(opts, readSchema, checkpointLocation);
  }

  @Override
  public InputPartition[] planInputPartitions() {
    try (LeaderMap wire = new LeaderMap(opts.bootstrap, opts.pollTimeoutMs, opts.security)) {
      return new Planner(opts, wire).plan().toArray(new InputPartition[0]);
    } catch (IOException e) {
      throw new UncheckedIOException("cannot plan the read on " + opts.bootstrap, e);
    }
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new RangeReaderFactory(opts, readSchema);
  }
}
