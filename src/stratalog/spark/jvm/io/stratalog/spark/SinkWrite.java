package io.stratalog.spark;

import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.distributions.Distribution;
import org.apache.spark.sql.connector.distributions.Distributions;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.SortDirection;
import org.apache.spark.sql.connector.expressions.SortOrder;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.RequiresDistributionAndOrdering;
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
 *
 * <p>Option {@code exactlyOnce}. {@code true} (the default): each task's producer id is derived
 * from the job or micro-batch and the task, and a re-run repeats its records under the same
 * sequences, which the broker drops as duplicates; rows are written in the order they come, so
 * this holds when a re-run sees its rows in the same order (a pipeline without a shuffle, or
 * sorted data). {@code sorted}: the write asks Spark to sort each task's rows by what is written
 * (topic, partition, key, timestamp, value, headers; {@link #requiredOrdering}), so any order of
 * the same rows makes the same records: exactly once also after a shuffle whose order varies,
 * at the cost of a sort and of the input's order. {@code false}: no sort and a producer id per
 * attempt, so at least once, as Spark's Kafka sink.
 */
final class SinkWrite
    implements WriteBuilder, SupportsTruncate, SupportsStreamingUpdateAsAppend, Write,
        BatchWrite, StreamingWrite, RequiresDistributionAndOrdering {
  private final String bootstrap;
  private final WireSecurity security;
  private final String topicOption;
  private final Columns cols;
  private final List<String> written = new ArrayList<>();
  private final boolean exactlyOnce;
  private final boolean sorted;
  private final long failAfterRecords;
  private final long failAttempts;
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
    security = WireSecurity.of(o);
    String t = o.get("topic");
    topicOption = t == null ? null : t.trim();
    cols = columns(info.schema(), topicOption);
    String eo = o.getOrDefault("exactlyOnce", "true").toLowerCase(java.util.Locale.ROOT);
    if (!eo.equals("true") && !eo.equals("false") && !eo.equals("sorted")) {
      throw new IllegalArgumentException("option 'exactlyOnce' must be 'true', 'sorted' or "
          + "'false', not '" + o.get("exactlyOnce") + "'");
    }
    exactlyOnce = !eo.equals("false");
    sorted = eo.equals("sorted");
    failAfterRecords = failureInjection(o, FAIL_OPTION);
    long attempts = failureInjection(o, FAIL_ATTEMPTS_OPTION);
    failAttempts = attempts == 0 ? 1 : attempts;
    StructField[] fields = info.schema().fields();
    // The Python sink sorts by the same columns in the same order (writer.ORDER_COLUMNS).
    for (int i : new int[] {cols.topic, cols.partition, cols.key, cols.timestamp, cols.value,
        cols.headers}) {
      if (i >= 0) {
        written.add(fields[i].name());
      }
    }
    if (sorted) {
      // Spark resolves the sort's column names case-insensitively; the sink matches exactly.
      for (StructField f : fields) {
        for (String w : written) {
          if (!f.name().equals(w) && f.name().equalsIgnoreCase(w)) {
            throw new IllegalArgumentException("exactlyOnce=sorted sorts by the column '" + w
                + "' and cannot tell it from the column '" + f.name() + "': rename or drop '"
                + f.name() + "'");
          }
        }
      }
    }
  }

  /**
   * For tests of re-runs: a task attempt numbered below {@code testing.failAttempts} (default
   * 1: the first) fails once this many of its records are acknowledged (0: never).
   */
  static long failureInjection(CaseInsensitiveStringMap o, String name) {
    String v = o.get(name);
    if (v == null) {
      return 0;
    }
    try {
      long n = Long.parseLong(v);
      if (n > 0) {
        return n;
      }
    } catch (NumberFormatException e) {
      // reported below
    }
    throw new IllegalArgumentException(
        "option '" + name + "' must be a positive integer, not '" + v + "'");
  }

  static final String FAIL_OPTION = "testing.failAfterRecords";
  static final String FAIL_ATTEMPTS_OPTION = "testing.failAttempts";

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
  public Distribution requiredDistribution() {
    return Distributions.unspecified(); // rows stay in their tasks; only their order is asked
  }

  @Override
  public SortOrder[] requiredOrdering() {
    if (!sorted) {
      return new SortOrder[0];
    }
    SortOrder[] order = new SortOrder[written.size()];
    for (int i = 0; i < order.length; i++) {
      order[i] = Expressions.sort(Expressions.column(written.get(i)), SortDirection.ASCENDING);
    }
    return order;
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
    return new Factory(this, job);
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
    return new Factory(this, null);
  }

  @Override
  public void commit(long epochId, WriterCommitMessage[] messages) {}

  @Override
  public void abort(long epochId, WriterCommitMessage[] messages) {}

  /** Sent to the executors: one producer per task, its id derived from what it writes. */
  static final class Factory implements DataWriterFactory, StreamingDataWriterFactory {
    private static final long serialVersionUID = 1L;
    private final String bootstrap;
    private final WireSecurity security;
    private final String topicOption;
    private final Columns cols;
    private final String job;
    private final boolean exactlyOnce;
    private final long failAfterRecords;
    private final long failAttempts;

    Factory(SinkWrite w, String job) {
      this.bootstrap = w.bootstrap;
      this.security = w.security;
      this.topicOption = w.topicOption;
      this.cols = w.cols;
      this.exactlyOnce = w.exactlyOnce;
      this.failAfterRecords = w.failAfterRecords;
      this.failAttempts = w.failAttempts;
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
      TaskContext ctx = TaskContext.get();
      long failAfter = ctx != null && ctx.attemptNumber() < failAttempts ? failAfterRecords : 0;
      if (!exactlyOnce) {
        producerId = TopicWriter.producerId("attempt", UUID.randomUUID());
      }
      try {
        return new TopicWriter(bootstrap, topicOption, cols, producerId, failAfter, security);
      } catch (IOException e) {
        throw new UncheckedIOException("cannot reach " + bootstrap, e);
      }
    }
  }
}
