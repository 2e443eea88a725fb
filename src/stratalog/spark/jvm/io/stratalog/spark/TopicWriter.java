package io.stratalog.spark;

import io.stratalog.spark.RecordBatchBuilder.Rec;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.UUID;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.types.DataTypes;

/**
 * One write task: an idempotent producer whose id is derived from what the task writes (see
 * {@link #producerId}), numbering its batches per partition from sequence 0. A retried task or
 * a re-run micro-batch repeats the same records under the same id and sequences, and the broker
 * answers the ones it has as duplicates. A re-run whose rows changed order so that other rows
 * fall under those sequences is refused (INVALID_RECORD), and the rest of that partition is
 * written under a fresh producer id: at least once, nothing lost. The ids are the Python sink's, so a query may switch
 * between the two sinks across a restart and still write each record once.
 */
final class TopicWriter implements DataWriter<InternalRow> {
  static final int BATCH_RECORDS = 5000;
  static final int BATCH_BYTES = 512 * 1024;
  private static final short OUT_OF_ORDER_SEQUENCE = 45;
  private static final short INVALID_RECORD = 87;
  private static final short LEADER_NOT_AVAILABLE = 5;
  private static final int TIMEOUT_MS = 30_000;

  private final SinkWrite.Columns cols;
  private final String topicOption;
  private final long producerId;
  private final long failAfter;
  private final LeaderMap wire;
  private final Map<String, Integer> partitionCounts = new HashMap<>();
  private final Map<String, Integer> roundRobin = new HashMap<>();
  private final TreeMap<String, List<Rec>> buffers = new TreeMap<>();
  private final Map<String, Integer> bufferBytes = new HashMap<>();
  private final Map<String, Integer> sequences = new HashMap<>();
  // Target partitions where a re-run found other rows under sequences it repeats: their rows go
  // on under a producer id of their own, {id, first sequence}.
  private final Map<String, long[]> fallback = new HashMap<>();
  private long written;
  private long duplicates;

  TopicWriter(String bootstrap, String topicOption, SinkWrite.Columns cols, long producerId,
      long failAfter, WireSecurity security) throws IOException {
    this.cols = cols;
    this.topicOption = topicOption;
    this.producerId = producerId;
    this.failAfter = failAfter;
    this.wire = new LeaderMap(bootstrap, TIMEOUT_MS, security);
  }

  /** 2^62 | the first 8 bytes of SHA-256 of the parts joined by 0x1f, below 2^62. */
  static long producerId(Object... parts) {
    StringBuilder b = new StringBuilder();
    for (int i = 0; i < parts.length; i++) {
      if (i > 0) {
        b.append('\u001f');
      }
      b.append(parts[i]);
    }
    try {
      byte[] d = MessageDigest.getInstance("SHA-256")
          .digest(b.toString().getBytes(StandardCharsets.UTF_8));
      long high = ByteBuffer.wrap(d, 0, 8).getLong();
      return (1L << 62) | (high & ((1L << 62) - 1));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  @Override
  public void write(InternalRow row) throws IOException {
    String topic = topicOption;
    if (topic == null) {
      if (row.isNullAt(cols.topic)) {
        throw new IllegalArgumentException(
            "null topic present in the data; set the 'topic' option");
      }
      topic = row.getUTF8String(cols.topic).toString();
    }
    int count = partitionCount(topic);
    byte[] key = cols.key < 0 || row.isNullAt(cols.key) ? null : bytes(row, cols.key, cols.keyIsString);
    byte[] value = row.isNullAt(cols.value) ? null : bytes(row, cols.value, cols.valueIsString);
    int partition;
    if (cols.partition >= 0 && !row.isNullAt(cols.partition)) {
      partition = row.getInt(cols.partition);
      if (partition < 0 || partition >= count) {
        throw new IllegalArgumentException("partition " + partition + " does not exist in "
            + topic + " (" + count + " partitions)");
      }
    } else if (key == null) {
      int rr = roundRobin.getOrDefault(topic, 0);
      roundRobin.put(topic, rr + 1);
      partition = rr % count;
    } else {
      partition = (murmur2(key) & 0x7fffffff) % count;
    }
    List<byte[][]> headers = new ArrayList<>();
    if (cols.headers >= 0 && !row.isNullAt(cols.headers)) {
      ArrayData arr = row.getArray(cols.headers);
      for (int i = 0; i < arr.numElements(); i++) {
        InternalRow h = arr.getStruct(i, 2);
        byte[] hk = h.isNullAt(0) ? new byte[0] : h.getUTF8String(0).getBytes();
        byte[] hv = h.isNullAt(1) ? null : h.getBinary(1);
        headers.add(new byte[][] {hk, hv});
      }
    }
    long ts = cols.timestamp >= 0 && !row.isNullAt(cols.timestamp)
        ? Math.floorDiv(row.getLong(cols.timestamp), 1000L)
        : System.currentTimeMillis();
    String tp = topic + "\u0000" + partition;
    Rec rec = new Rec(key, value, ts, headers);
    List<Rec> buf = buffers.computeIfAbsent(tp, k -> new ArrayList<>());
    buf.add(rec);
    int size = bufferBytes.merge(tp, rec.size(), Integer::sum);
    if (buf.size() >= BATCH_RECORDS || size >= BATCH_BYTES) {
      send(tp);
    }
  }

  private static byte[] bytes(InternalRow row, int col, boolean isString) {
    return isString ? row.getUTF8String(col).getBytes() : row.getBinary(col);
  }

  private int partitionCount(String topic) throws IOException {
    Integer n = partitionCounts.get(topic);
    if (n != null) {
      return n;
    }
    KafkaWire.TopicMeta tm = wire.metadata(List.of(topic), true).get(topic);
    for (int i = 0; i < 50 && tm != null && tm.error == LEADER_NOT_AVAILABLE; i++) {
      try {
        Thread.sleep(100); // just created: its partitions are being set up
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted while waiting for topic " + topic, e);
      }
      tm = wire.metadata(List.of(topic)).get(topic);
    }
    if (tm == null || tm.error != 0 || tm.leaders.isEmpty()) {
      throw new IOException("topic '" + topic + "' does not exist on " + wire.address());
    }
    partitionCounts.put(topic, tm.leaders.size());
    return tm.leaders.size();
  }

  private void send(String tp) throws IOException {
    List<Rec> recs = buffers.remove(tp);
    bufferBytes.remove(tp);
    if (recs == null || recs.isEmpty()) {
      return;
    }
    int seq = sequences.getOrDefault(tp, 0);
    produce(tp, recs, seq);
    sequences.put(tp, seq + recs.size());
  }

  private void produce(String tp, List<Rec> recs, int seq) throws IOException {
    int cut = tp.indexOf('\u0000');
    String topic = tp.substring(0, cut);
    int partition = Integer.parseInt(tp.substring(cut + 1));
    long[] own = fallback.getOrDefault(tp, new long[] {producerId, 0});
    long[] answer = wire.produce(topic, partition,
        RecordBatchBuilder.build(recs, own[0], seq - (int) own[1]), TIMEOUT_MS);
    if (answer[0] == INVALID_RECORD && !fallback.containsKey(tp)) {
      // An earlier attempt wrote other rows under these sequences: this re-run sees its rows in
      // another order (a shuffle). Which of its rows are in the log cannot be told from the
      // sequences any more, so the rest of this partition's rows go out under a fresh producer
      // id: some may be written twice, none is lost (exactlyOnce=sorted avoids this).
      System.err.println("stratalog sink: " + topic + "-" + partition + ": a re-run of this "
          + "write task sees its rows in another order; writing the rest at least once from "
          + "sequence " + seq + " (exactlyOnce=sorted keeps it exact)");
      fallback.put(tp, new long[] {producerId("fallback", UUID.randomUUID()), seq});
      produce(tp, recs, seq);
      return;
    }
    if (answer[0] == OUT_OF_ORDER_SEQUENCE && recs.size() > 1) {
      // An earlier attempt of this task stopped part-way through this batch: the broker has
      // its head but not its tail. Halve until each piece is wholly a duplicate or wholly new.
      int mid = recs.size() / 2;
      produce(tp, recs.subList(0, mid), seq);
      produce(tp, recs.subList(mid, recs.size()), seq + mid);
      return;
    }
    if (answer[0] != 0) {
      throw new KafkaWire.KafkaError(
          "produce to " + topic + "-" + partition + " failed", (short) answer[0]);
    }
    if (answer[1] < 0) {
      duplicates += recs.size(); // written by an earlier attempt
    } else {
      written += recs.size();
    }
    if (failAfter > 0 && written + duplicates >= failAfter) {
      throw new IOException("injected failure (" + SinkWrite.FAIL_OPTION + ") after "
          + (written + duplicates) + " acked records");
    }
  }

  @Override
  public WriterCommitMessage commit() throws IOException {
    for (String tp : new ArrayList<>(buffers.keySet())) {
      send(tp);
    }
    return new Done(written, duplicates);
  }

  @Override
  public void abort() {
    buffers.clear();
  }

  @Override
  public void close() throws IOException {
    wire.close();
  }

  /** What one task wrote, and how much of it the broker already had. */
  static final class Done implements WriterCommitMessage {
    private static final long serialVersionUID = 1L;
    final long written;
    final long duplicates;

    Done(long written, long duplicates) {
      this.written = written;
      this.duplicates = duplicates;
    }
  }

  /** Kafka's murmur2 (seed 0x9747b28c), which its default partitioner applies to keys. */
  @SuppressWarnings("fallthrough")
  static int murmur2(byte[] data) {
    final int m = 0x5bd1e995;
    int length = data.length;
    int h = 0x9747b28c ^ length;
    int n4 = length / 4;
    for (int i = 0; i < n4; i++) {
      int at = 4 * i;
      int k = (data[at] & 0xff) | ((data[at + 1] & 0xff) << 8) | ((data[at + 2] & 0xff) << 16)
          | ((data[at + 3] & 0xff) << 24);
      k *= m;
      k ^= k >>> 24;
      k *= m;
      h *= m;
      h ^= k;
    }
    int tail = 4 * n4;
    switch (length & 3) {
      case 3:
        h ^= (data[tail + 2] & 0xff) << 16;
        // fall through
      case 2:
        h ^= (data[tail + 1] & 0xff) << 8;
        // fall through
      case 1:
        h ^= data[tail] & 0xff;
        h *= m;
        break;
      default:
        break;
    }
    h ^= h >>> 13;
    h *= m;
    h ^= h >>> 15;
    return h;
  }

  static boolean isString(org.apache.spark.sql.types.DataType t) {
    return t.equals(DataTypes.StringType);
  }
}
