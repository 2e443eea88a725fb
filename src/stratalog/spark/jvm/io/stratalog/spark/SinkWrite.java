package io.stratalog.spark;

import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.UUID;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.SupportsTruncate;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.internal.connector.SupportsStreamingUpdateAsAppend;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A write, batch or streaming, with the options and column rules of Spark's Kafka sink: a
 * {@code value} column, the topic from the {@code topic} option or a {@code topic} column, and
 * optional {@code key}, {@code partition}, {@code headers} and {@code timestamp} columns.
 * Streaming output modes append, update and complete all append (as Kafka's sink does); a batch
 * overwrite is refused.
 */
final class SinkWrite
    implements WriteBuilder, SupportsTruncate, SupportsStreamingUpdateAsAppend, Write,
        BatchWrite, StreamingWrite {
  private final String bootstrap;
  private final String topicOption;
  private final Columns cols;
  private final String job = UUID.randomUUID().toString(); // made on the driver, once
  private boolean truncate;

  /** Positions of the columns in the rows to write (-1: absent) and the types of two. */
  static final class Columns implements Serializable {
    private static final long serialVersionUID = 1L;
    int topic = -1;
    int key = -1;
    int value = -1;
    int partition = -1;
    int headers = -1;
    int timestamp = -1;
    boolean keyIsString;
    boolean valueIsString;
  }

  private static final String HEADERS = "array<struct<key:string,value:binary>>";

  SinkWrite(LogicalWriteInfo info) {
    CaseInsensitiveStringMap o = info.options();
    for (String s : new String[] {"key", "value"}) {
      if (o.containsKey("kafka." + s + ".serializer")) {
        throw new IllegalArgumentException("Kafka option '" + s + ".serializer' is not "
            + "supported: " + s + "s are serialized as bytes (a string " + s + " as UTF-8)");
      }
    }
    bootstrap = ReadOptions.bootstrap(o);
    String t = o.get("topic");
    topicOption = t == null ? null : t.trim();
    cols = columns(info.schema(), topicOption);
  }

  private static Columns columns(StructType schema, String topicOption) {
    Columns c = new Columns();
    StructField[] fields = schema.fields();
    for (int i = 0; i < fields.length; i++) {
      String name = fields[i].name();
      DataType type = fields[i].dataType();
      switch (name) {
        case "topic":
          check(name, type, "string");
          c.topic = i;
          break;
        case "key":
          check(name, type, "string", "binary");
          c.key = i;
          c.keyIsString = type.equals(DataTypes.StringType);
          break;
        case "value":
          check(name, type, "string", "binary");
          c.value = i;
          c.valueIsString = type.equals(DataTypes.StringType);
          break;
        case "partition":
          check(name, type, "int");
          c.partition = i;
          break;
        case "headers":
          check(name, type, HEADERS);
          c.headers = i;
          break;
        case "timestamp":
          // The record's CreateTime: event time survives a copy between topics.
          if (type.equals(DataTypes.TimestampType)) {
            c.timestamp = i;
          }
          break;
        default:
          break; // other columns are not written, as in Spark's Kafka sink
      }
    }
    if (c.value < 0) {
      throw new IllegalArgumentException(
          "required attribute 'value' not found in the data to write");
    }
    if (topicOption == null && c.topic < 0) {
      throw new IllegalArgumentException("topic option required when no 'topic' attribute is "
          + "present; use the 'topic' option or a 'topic' column");
    }
    return c;
  }

  private static void check(String col, DataType type, String... allowed) {
    String got = type.simpleString();
    for (String a : allowed) {
      if (a.equals(got)) {
        return;
      }
    }
    throw new IllegalArgumentException(col + " attribute unsupported type " + got + ". " + col
        + " must be a(n) " + String.join(" or ", allowed));
  }

  // -- builder -------------------------------------------------------------------------------

  @Override
  public WriteBuilder truncate() {
    truncate = true; // complete mode in streaming; an overwrite in batch, refused below
    return this;
  }

  @Override
  public Write build() {
    return this;
  }

  @Override
  public String description() {
    return "stratalog sink" + (topicOption == null ? "" : " to " + topicOption);
  }

  @Override
  public BatchWrite toBatch() {
    if (truncate) {
      throw new UnsupportedOperationException(
          "save mode Overwrite is not allowed for format(\"stratalog\"): a topic is "
              + "appended to, never replaced; use mode(\"append\")");
    }
    return this;
  }

  @Override
  public StreamingWrite toStreaming() {
    return this;
  }

  // -- batch ---------------------------------------------------------------------------------

  @Override
  public boolean useCommitCoordinator() {
    return true; // one committed attempt per task, as both interfaces' default says
  }

  @Override
  public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
    return new Factory(bootstrap, topicOption, cols, job);
  }

  @Override
  public void commit(WriterCommitMessage[] messages) {
    // Every record was acknowledged by the broker before its task committed.
  }

  @Override
  public void abort(WriterCommitMessage[] messages) {
    // What was written stays: a retried job repeats it under the same producer ids.
  }

  // -- streaming -----------------------------------------------------------------------------

  @Override
  public StreamingDataWriterFactory createStreamingWriterFactory(PhysicalWriteInfo info) {
    return new Factory(bootstrap, topicOption, cols, null);
  }

  @Override
  public void commit(long epochId, WriterCommitMessage[] messages) {}

  @Override
  public void abort(long epochId, WriterCommitMessage[] messages) {}

  /** Sent to the executors: one producer per task, its id derived from what it writes. */
  static final class Factory implements DataWriterFactory, StreamingDataWriterFactory {
    private static final long serialVersionUID = 1L;
    private final String bootstrap;
    private final String topicOption;
    private final Columns cols;
    private final String job;

    Factory(String bootstrap, String topicOption, Columns cols, String job) {
      this.bootstrap = bootstrap;
      this.topicOption = topicOption;
      this.cols = cols;
      this.job = job;
    }

    @Override
    public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
      return open(TopicWriter.producerId("batch", job, partitionId));
    }

    @Override
    public DataWriter<InternalRow> createWriter(int partitionId, long taskId, long epochId) {
      // The query's id (kept in its checkpoint) and the micro-batch: the same after a restart.
      TaskContext ctx = TaskContext.get();
      String query = ctx == null ? null : ctx.getLocalProperty("sql.streaming.queryId");
      if (query == null) {
        throw new IllegalStateException("the stratalog stream sink needs Spark's query id");
      }
      return open(TopicWriter.producerId("stream", query, epochId, partitionId));
    }

    private DataWriter<InternalRow> open(long producerId) {
      try {
        return new TopicWriter(bootstrap, topicOption, cols, producerId);
      } catch (IOException e) {
        throw new UncheckedIOException("cannot reach " + bootstrap, e);
      }
    }
  }
}
