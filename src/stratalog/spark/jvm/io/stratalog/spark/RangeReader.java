package io.stratalog.spark;

import java.io.IOException;
import java.util.List;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads one offset range into columnar batches of about {@link #ROWS} rows. Fetches ask for the
 * range's next offset; the broker answers with whole record batches, which may begin before it
 * (those records are skipped) and may run past the range's end (cut). Records missing from the
 * range (deleted by retention, or an end past the data) fail the task unless failOnDataLoss is
 * false, as in Spark's Kafka source. With read_committed, fetches end at the last stable
 * offset and the batches of aborted transactions are skipped ({@link AbortedTransactions}):
 * their offsets, like the markers', are gaps. When the partition's leader runs on this host
 * (colocatedReads, the default), the range is read from the leader's segment files instead
 * ({@link ColocatedPartition}), and through Fetch for whatever the files do not answer (the cold
 * tier, a stale slot, a partition led elsewhere); read_committed always fetches.
 */
final class RangeReader implements PartitionReader<ColumnarBatch> {
  static final int ROWS = 4096;
  static final int MAX_FETCH_BYTES = 1 << 30;
  private static final String[] FIELDS = {
    "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"
  };

  private final OffsetRange range;
  private final ReadOptions opts;
  private final WritableColumnVector[] vectors;
  private final ColumnarBatch batch;
  private final RecordDecoder decoder;
  private final AbortedTransactions aborted = new AbortedTransactions();
  private LeaderMap wire;
  private long next;
  private KafkaWire.FetchedPartition fetched;
  private int pos;
  private int fetchBytes;
  private long nextAtFetch = -1; // where the answer being decoded was asked from
  private ColocatedPartition local; // the leader's files, when on this host
  private boolean localLooked;
  private boolean fetchedLocally; // the answer being decoded came from the files
  private long notLocalAt = -1; // an offset the files answered without progress: fetch it

  RangeReader(OffsetRange range, ReadOptions opts, StructType readSchema) {
    this.range = range;
    this.opts = opts;
    this.next = range.from;
    this.fetchBytes = opts.fetchMaxBytes;
    vectors = OnHeapColumnVector.allocateColumns(ROWS, readSchema);
    batch = new ColumnarBatch((ColumnVector[]) vectors);
    decoder = new RecordDecoder(range.topic, range.partition, byField(readSchema, vectors), true);
  }

  /** The vectors of the read schema in the decoder's field order; null for a pruned field. */
  static WritableColumnVector[] byField(StructType readSchema, WritableColumnVector[] vectors) {
    WritableColumnVector[] byField = new WritableColumnVector[FIELDS.length];
    StructField[] fields = readSchema.fields();
    for (int i = 0; i < fields.length; i++) {
      for (int f = 0; f < FIELDS.length; f++) {
        if (FIELDS[f].equals(fields[i].name())) {
          byField[f] = vectors[i];
        }
      }
    }
    return byField;
  }

  @Override
  public boolean next() throws IOException {
    for (WritableColumnVector v : vectors) {
      v.reset();
    }
    decoder.newBatch();
    int rows = 0;
    while (rows < ROWS && next < range.until) {
      if (fetched == null || pos >= fetched.end) {
        if (fetched != null && next == nextAtFetch && fetchedLocally) {
          notLocalAt = next; // the files said nothing of it: Fetch decides
        } else if (fetched != null && next == nextAtFetch) {
          // A whole answer of batches, none reaching the offset asked for: asking again
          // would get the same answer.
          throw new IOException("the broker answered a fetch of " + range.topic + "-"
              + range.partition + " at offset " + next + " with no record at or after it");
        }
        if (!fetch()) {
          break;
        }
        nextAtFetch = next;
        continue;
      }
      byte[] b = fetched.array;
      if (fetched.end - pos < 12
          || pos + RecordDecoder.batchSize(b, pos) > fetched.end) {
        if (next == nextAtFetch && fetchedLocally) {
          notLocalAt = next; // not what the files' index promised: fetch it
        } else if (next == nextAtFetch) {
          // Nothing at or after the offset came whole: the batch holding it is larger than
          // what was asked for (a broker may cut it at the limit). Ask for more.
          growFetch(fetched.end - pos < 12 ? 0 : RecordDecoder.batchSize(b, pos));
        }
        fetched = null; // a partial batch at the end of the answer: fetch again from next
        continue;
      }
      RecordDecoder.requireMagic2(b, pos, range.topic + "-" + range.partition);
      int size = RecordDecoder.batchSize(b, pos);
      long last = RecordDecoder.lastOffset(b, pos);
      if (last >= next) {
        if (!(opts.readCommitted && aborted.skip(b, pos, last))) {
          rows += decoder.decode(b, pos, next, range.until, rows);
        }
        next = last + 1;
      }
      pos += size;
    }
    batch.setNumRows(rows);
    return rows > 0;
  }

  private void growFetch(int batchBytes) throws IOException {
    if (fetchBytes >= MAX_FETCH_BYTES) {
      throw new IOException("the record batch at offset " + next + " of " + range.topic + "-"
          + range.partition + " does not fit in " + MAX_FETCH_BYTES + " bytes");
    }
    fetchBytes = (int) Math.min(MAX_FETCH_BYTES, Math.max(2L * fetchBytes, batchBytes));
  }

  /** Fetches from {@code next}; false when the range has nothing more to give. */
  private boolean fetch() throws IOException {
    if (wire == null) {
      // One connection, to the leader planning saw; another only if the leader moved since.
      wire = new LeaderMap(range.brokers, opts.pollTimeoutMs, opts.security);
    }
    fetchedLocally = false;
    if (opts.colocatedReads && !opts.readCommitted) {
      if (!localLooked) {
        localLooked = true;
        local = ColocatedPartition.find(wire, range.topic, range.partition);
      }
      if (local != null && next != notLocalAt) {
        KafkaWire.FetchedPartition got = local.read(next, fetchBytes);
        if (got != null && got.end - got.start >= 12) {
          fetched = got;
          pos = got.start;
          aborted.reset(got.aborted);
          fetchedLocally = true;
          return true;
        }
        // Not there (cold tier, a stale or withdrawn slot) or past its end: ask Fetch.
      }
    }
    long deadline = System.currentTimeMillis() + opts.pollTimeoutMs;
    while (true) {
      fetched = wire.fetch(range.topic, range.partition, next, fetchBytes, 500,
          opts.readCommitted);
      pos = fetched.start;
      aborted.reset(fetched.aborted);
      if (fetched.error == 1) { // OFFSET_OUT_OF_RANGE
        return outOfRange();
      }
      if (fetched.error != 0) {
        throw new KafkaWire.KafkaError(
            "Fetch of " + range + " from " + wire.address() + " failed", fetched.error);
      }
      if (fetched.end - fetched.start >= 12) {
        return true;
      }
      long readable = opts.readCommitted ? fetched.lastStableOffset : fetched.highWatermark;
      if (readable <= next) {
        return lost(next, range.until, "the partition ends at " + readable);
      }
      if (System.currentTimeMillis() > deadline) {
        throw new IOException("no records of " + range + " at offset " + next + " within "
            + opts.pollTimeoutMs + " ms (kafkaConsumer.pollTimeoutMs)");
      }
    }
  }

  private boolean outOfRange() throws IOException {
    List<Integer> p = List.of(range.partition);
    long earliest = wire.listOffsets(range.topic, p, KafkaWire.EARLIEST).get(range.partition);
    fetched = null;
    if (next < earliest) {
      opts.checkLoss(range.topic, range.partition, next, Math.min(earliest, range.until),
          "the log now starts at " + earliest);
      next = earliest;
      return next < range.until && fetch();
    }
    long latest = wire.listOffsets(range.topic, p, KafkaWire.LATEST, opts.readCommitted)
        .get(range.partition);
    return lost(next, range.until, "the partition ends at " + latest);
  }

  /** The rest of the range is gone: fail, or end the range when allowed. */
  private boolean lost(long from, long to, String why) throws IOException {
    opts.checkLoss(range.topic, range.partition, from, to, why);
    next = range.until;
    fetched = null;
    return false;
  }

  @Override
  public ColumnarBatch get() {
    return batch;
  }

  @Override
  public void close() throws IOException {
    batch.close();
    if (local != null) {
      local.close();
    }
    if (wire != null) {
      wire.close();
    }
  }
}
