package io.stratalog.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** Sent to the executors: makes a columnar reader per offset range or split family. */
final class RangeReaderFactory implements PartitionReaderFactory {
  private static final long serialVersionUID = 1L;

  private final ReadOptions opts;
  private final StructType readSchema;

  RangeReaderFactory(ReadOptions opts, StructType readSchema) {
    this.opts = opts;
    this.readSchema = readSchema;
  }

  @Override
  public boolean supportColumnarReads(InputPartition partition) {
    return true;
  }

  @Override
  public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
    if (partition instanceof FamilyRange) {
      return new FamilyReader((FamilyRange) partition, opts, readSchema);
    }
    return new RangeReader((OffsetRange) partition, opts, readSchema);
  }

  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    throw new UnsupportedOperationException("format(\"stratalog\") reads only in columnar batches");
  }
}
