package io.stratalog.spark;

import java.io.IOException;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads a split partition family ({@link FamilyRange}) in one task so that each key keeps its
 * order across the splits (the Java side of the Python {@code client/family_reader.py}).
 *
 * <p>After a split a producer sends a key to the parent until it learns of the split, then to
 * the child; read side by side, the child's first records of the key could come out before the
 * parent's last ones. The broker answers each child batch with an order mark: the parent's next
 * offset when the batch was appended. So each round fetches every unfinished member in one
 * Fetch (parents first, each up to kafka.max.partition.fetch.bytes), takes all of a parent's
 * batches (nothing of theirs depends on a child), and a child's batches only while their mark
 * is at most what was read of the parent; a child batch without a mark (the cold tier keeps
 * partitions apart) waits until the parent's whole range was read, and once it was the child is
 * free. A round's rows come out parents first. Co-located reads are not used: only Fetch
 * answers carry the marks.
 */
final class FamilyReader implements PartitionReader<ColumnarBatch> {
  private final FamilyRange family;
  private final ReadOptions opts;
  private final int n;
  private final WritableColumnVector[] vectors;
  private final ColumnarBatch batch;
  private final RecordDecoder decoder;
  private final AbortedTransactions aborted = new AbortedTransactions();
  private final long[] at; // each member's read position
  private final long[] end; // each member's end, lowered when its partition holds less
  // The parent offset each child waits for before it is fetched again (MIN_VALUE: none;
  // MAX_VALUE: the parent's end, for a batch without a mark).
  private final long[] waitFor;
  private LeaderMap wire;
  private int fetchBytes;

  // The round being decoded: each member's answer and the offsets of it this round takes.
  private final KafkaWire.FetchedPartition[] taken;
  private final long[] takeFrom;
  private final long[] takeUntil;
  private int member; // the member being decoded; n when the round is done
  private int pos = -1; // the next batch's position in taken[member]; -1: not begun

  FamilyReader(FamilyRange family, ReadOptions opts, StructType readSchema) {
    this.family = family;
    this.opts = opts;
    n = family.partitions.length;
    at = family.from.clone();
    end = family.until.clone();
    waitFor = new long[n];
    Arrays.fill(waitFor, Long.MIN_VALUE);
    taken = new KafkaWire.FetchedPartition[n];
    takeFrom = new long[n];
    takeUntil = new long[n];
    member = n;
    fetchBytes = opts.fetchMaxBytes;
    vectors = OnHeapColumnVector.allocateColumns(RangeReader.ROWS, readSchema);
    batch = new ColumnarBatch((ColumnVector[]) vectors);
    decoder = new RecordDecoder(family.topic, family.partitions[0],
        RangeReader.byField(readSchema, vectors), true);
  }

  @Override
  public boolean next() throws IOException {
    for (WritableColumnVector v : vectors) {
      v.reset();
    }
    decoder.newBatch();
    int rows = 0;
    while (rows < RangeReader.ROWS) {
      if (member >= n) {
        if (!round()) {
          break;
        }
        member = 0;
        pos = -1;
        continue;
      }
      KafkaWire.FetchedPartition fp = taken[member];
      if (fp == null) {
        member++;
        continue;
      }
      if (pos < 0) {
        pos = fp.start;
        decoder.partition(family.partitions[member]);
        aborted.reset(fp.aborted);
      }
      byte[] b = fp.array;
      if (!wholeBatchAt(fp, pos) || RecordDecoder.baseOffset(b, pos) >= takeUntil[member]) {
        member++; // this member's part of the round is done: the next one's
        pos = -1;
        continue;
      }
      RecordDecoder.requireMagic2(b, pos, family.topic + "-" + family.partitions[member]);
      long last = RecordDecoder.lastOffset(b, pos);
      if (last >= takeFrom[member] && !(opts.readCommitted && aborted.skip(b, pos, last))) {
        rows += decoder.decode(b, pos, takeFrom[member], takeUntil[member], rows);
      }
      pos += RecordDecoder.batchSize(b, pos);
    }
    batch.setNumRows(rows);
    return rows > 0;
  }

  static boolean wholeBatchAt(KafkaWire.FetchedPartition fp, int q) {
    return fp.end - q >= 12 && q + RecordDecoder.batchSize(fp.array, q) <= fp.end;
  }

  /**
   * Fetches the unfinished members and decides what this round takes of each (in
   * {@code taken}, {@code takeFrom}, {@code takeUntil}), moving their positions past it; false
   * when every member is done.
   */
  private boolean round() throws IOException {
    Map<Integer, Long> want = new LinkedHashMap<>(); // parents first: the broker fills in order
    for (int i = 0; i < n; i++) {
      taken[i] = null;
      if (at[i] < end[i] && !waits(i)) {
        want.put(family.partitions[i], at[i]);
      }
    }
    if (want.isEmpty()) {
      return false;
    }
    if (wire == null) {
      wire = new LeaderMap(family.brokers, opts.pollTimeoutMs, opts.security);
    }
    // Each member its share of the answer, so a parent's bytes never crowd out its child's.
    int maxBytes = (int) Math.min(Integer.MAX_VALUE, (long) fetchBytes * want.size());
    Map<Integer, KafkaWire.FetchedPartition> got =
        wire.fetchFamily(family.topic, want, fetchBytes, maxBytes, 0, opts.readCommitted);
    // Out-of-range offsets first: settling them asks ListOffsets on the connection whose frame
    // holds the answers, so the round is given up and fetched again.
    boolean outOfRange = false;
    for (int i = 0; i < n; i++) {
      KafkaWire.FetchedPartition fp = got.get(family.partitions[i]);
      if (fp != null && want.containsKey(family.partitions[i]) && fp.error == 1) {
        outOfRange = true;
      }
    }
    if (outOfRange) {
      for (int i = 0; i < n; i++) {
        KafkaWire.FetchedPartition fp = got.get(family.partitions[i]);
        if (fp != null && want.containsKey(family.partitions[i]) && fp.error == 1) {
          outOfRange(i);
        }
      }
      return true;
    }
    boolean moved = false;
    boolean tooLarge = false;
    for (int i = 0; i < n; i++) { // parents first: a child's limit sees their new position
      int p = family.partitions[i];
      KafkaWire.FetchedPartition fp = got.get(p);
      if (!want.containsKey(p) || fp == null) {
        continue;
      }
      if (fp.error != 0) {
        throw new KafkaWire.KafkaError("Fetch of " + family.topic + "-" + p + " at offset "
            + at[i] + " from " + wire.address() + " failed", fp.error);
      }
      if (!wholeBatchAt(fp, fp.start)) {
        if (fp.end - fp.start >= 12) {
          tooLarge = true; // a batch larger than the share asked for: ask for more
          continue;
        }
        long readable = opts.readCommitted ? fp.lastStableOffset : fp.highWatermark;
        if (readable <= at[i]) {
          lost(i, "the partition ends at " + readable);
          moved = true;
        }
        continue; // (else the answer's bytes went to the members before it)
      }
      long limit = end[i];
      int parent = family.parents[i];
      waitFor[i] = Long.MIN_VALUE;
      if (parent >= 0 && at[parent] < end[parent]) {
        long first = firstWaiting(fp, at[parent]);
        limit = Math.min(limit, first);
        if (first != Long.MAX_VALUE) {
          // Not fetched again before the parent reached that mark: its bytes would be sent
          // only to be dropped again.
          waitFor[i] = markOf(fp, first);
        }
      }
      if (limit <= at[i]) {
        continue; // its next batch waits for the parent
      }
      long after = afterWhole(fp);
      taken[i] = fp;
      takeFrom[i] = at[i];
      takeUntil[i] = limit;
      // Up to the first batch that waits; past the answer's last batch when none does.
      long next = Math.max(at[i], after);
      if (limit < end[i]) {
        next = Math.min(next, limit);
      }
      if (next > at[i]) {
        at[i] = next;
        moved = true;
      }
    }
    if (!moved) {
      if (!tooLarge) {
        throw new IOException("reading the split family " + family + " made no progress at "
            + Arrays.toString(at));
      }
      growFetch();
    }
    return true;
  }

  /**
   * The base offset of the first batch of a child's answer that must wait for the parent: its
   * mark is past {@code parentAt} (the parent's records before it are not read yet), or it has
   * none; {@code Long.MAX_VALUE} when every batch may be taken.
   */
  static long firstWaiting(KafkaWire.FetchedPartition fp, long parentAt) {
    long[] marks = fp.marks == null ? new long[0] : fp.marks;
    int m = 0;
    for (int q = fp.start; wholeBatchAt(fp, q); q += RecordDecoder.batchSize(fp.array, q)) {
      long base = RecordDecoder.baseOffset(fp.array, q);
      while (m < marks.length && marks[m] < base) {
        m += 2; // both are in offset order: the marks only move forward
      }
      if (m >= marks.length || marks[m] != base || marks[m + 1] > parentAt) {
        return base;
      }
    }
    return Long.MAX_VALUE;
  }

  /** Whether member {@code i} waits for its parent to reach the mark it was cut at. */
  private boolean waits(int i) {
    int parent = family.parents[i];
    return parent >= 0 && at[parent] < end[parent] && at[parent] < waitFor[i];
  }

  /** The order mark of the batch at {@code base}; {@code Long.MAX_VALUE} when it has none. */
  static long markOf(KafkaWire.FetchedPartition fp, long base) {
    long[] marks = fp.marks == null ? new long[0] : fp.marks;
    for (int m = 0; m + 1 < marks.length; m += 2) {
      if (marks[m] == base) {
        return marks[m + 1];
      }
    }
    return Long.MAX_VALUE;
  }

  /** The offset after the answer's last whole batch; -1 when it holds none. */
  static long afterWhole(KafkaWire.FetchedPartition fp) {
    long after = -1;
    for (int q = fp.start; wholeBatchAt(fp, q); q += RecordDecoder.batchSize(fp.array, q)) {
      after = RecordDecoder.lastOffset(fp.array, q) + 1;
    }
    return after;
  }

  private void growFetch() throws IOException {
    if (fetchBytes >= RangeReader.MAX_FETCH_BYTES) {
      throw new IOException("a record batch of " + family + " does not fit in "
          + RangeReader.MAX_FETCH_BYTES + " bytes");
    }
    fetchBytes = (int) Math.min(RangeReader.MAX_FETCH_BYTES, 2L * fetchBytes);
  }

  /** The member's offset is not in its partition's log: retention cut it, or the log ends. */
  private void outOfRange(int i) throws IOException {
    String topic = family.topic;
    int p = family.partitions[i];
    long earliest = wire.listOffsets(topic, List.of(p), KafkaWire.EARLIEST).get(p);
    if (at[i] < earliest) {
      opts.checkLoss(topic, p, at[i], Math.min(earliest, end[i]),
          "the log now starts at " + earliest);
      at[i] = earliest;
      return;
    }
    long latest = wire.listOffsets(topic, List.of(p), KafkaWire.LATEST, opts.readCommitted)
        .get(p);
    lost(i, "the partition ends at " + latest);
  }

  /** The rest of the member's range is gone: fail, or end it when allowed. */
  private void lost(int i, String why) throws IOException {
    opts.checkLoss(family.topic, family.partitions[i], at[i], end[i], why);
    end[i] = at[i];
  }

  @Override
  public ColumnarBatch get() {
    return batch;
  }

  @Override
  public void close() throws IOException {
    batch.close();
    if (wire != null) {
      wire.close();
    }
  }
}
