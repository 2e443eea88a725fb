package io.stratalog.spark;

import io.stratalog.spark.ReadOptions.PartitionMap;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.SparkContext;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.types.StructType;

/**
 * A streaming read in micro-batches. Each trigger asks the broker for the latest offsets (a
 * pattern subscription picks up new topics, a topic its new partitions, which start at their
 * earliest offset), capped by maxOffsetsPerTrigger in proportion to what each partition has
 * waiting, as Spark's Kafka source caps it (on a split topic the capped ends are then made a
 * consistent cut of each family's log, {@link Planner#cutFamilies}). The resolved starting
 * offsets are kept in the query's checkpoint before the first batch is planned, so a restart
 * before the first batch committed starts where the first start did (startingOffsets=latest
 * would otherwise move).
 */
final class MicroBatch implements MicroBatchStream, SupportsTriggerAvailableNow {
  private static final String INITIAL = "stratalog-initial-offsets.json";

  private final ReadOptions opts;
  private final StructType readSchema;
  private final String metadataPath;
  private LeaderMap wire;
  // Trigger.AvailableNow: the end fixed when the query started; batches stop there.
  private PartitionMap availableNow;

  MicroBatch(ReadOptions opts, StructType readSchema, String metadataPath) {
    this.opts = opts;
    this.readSchema = readSchema;
    this.metadataPath = metadataPath;
  }

  private interface WireCall<T> {
    T run(Planner planner) throws IOException;
  }

  /** Runs a call on the held connection; a broken connection is reopened once. */
  private <T> T withPlanner(WireCall<T> call) {
    for (int attempt = 0; ; attempt++) {
      try {
        if (wire == null) {
          wire = new LeaderMap(opts.bootstrap, opts.pollTimeoutMs, opts.security);
        }
        return call.run(new Planner(opts, wire));
      } catch (KafkaWire.KafkaError e) {
        throw new UncheckedIOException(e);
      } catch (IOException e) {
        closeWire();
        if (attempt > 0) {
          throw new UncheckedIOException("cannot reach " + opts.bootstrap, e);
        }
      }
    }
  }

  private void closeWire() {
    if (wire != null) {
      try {
        wire.close();
      } catch (IOException ignored) {
        // already broken
      }
      wire = null;
    }
  }

  @Override
  public Offset initialOffset() {
    Path file = new Path(metadataPath, INITIAL);
    try {
      FileSystem fs = file.getFileSystem(hadoopConf());
      if (fs.exists(file)) {
        try (InputStream in = fs.open(file)) {
          return JsonOffset.parse(new String(in.readAllBytes(), StandardCharsets.UTF_8));
        }
      }
      JsonOffset start = withPlanner(p -> {
        Map<String, List<Integer>> tps = p.topicPartitions();
        return new JsonOffset(p.resolveStart(tps, p.offsetsAt(tps, KafkaWire.EARLIEST),
            p.offsetsAt(tps, KafkaWire.LATEST), "latest"));
      });
      Path tmp = new Path(metadataPath, "." + INITIAL + ".tmp");
      try (OutputStream out = fs.create(tmp, true)) {
        out.write(start.json().getBytes(StandardCharsets.UTF_8));
      }
      if (!fs.rename(tmp, file)) {
        throw new IOException("cannot rename " + tmp + " to " + file);
      }
      return start;
    } catch (IOException e) {
      throw new UncheckedIOException(
          "cannot keep the query's starting offsets in " + metadataPath, e);
    }
  }

  private static Configuration hadoopConf() {
    return SparkContext.getOrCreate().hadoopConfiguration();
  }

  @Override
  public Offset deserializeOffset(String json) {
    return JsonOffset.parse(json);
  }

  @Override
  public ReadLimit getDefaultReadLimit() {
    return opts.maxOffsetsPerTrigger == null
        ? ReadLimit.allAvailable()
        : ReadLimit.maxRows(opts.maxOffsetsPerTrigger);
  }

  @Override
  public Offset latestOffset() {
    throw new UnsupportedOperationException(
        "latestOffset(Offset, ReadLimit) is the one to call for this source");
  }

  @Override
  public void prepareForTriggerAvailableNow() {
    // Spark calls this before initialOffset: resolve (and keep) the start first, so the end
    // fixed here is never before it (as Spark's Kafka source does).
    initialOffset();
    availableNow = withPlanner(p -> p.offsetsAt(p.topicPartitions(), KafkaWire.LATEST));
  }

  @Override
  public Offset latestOffset(Offset startOffset, ReadLimit limit) {
    PartitionMap start = ((JsonOffset) startOffset).offsets;
    return withPlanner(p -> {
      Map<String, List<Integer>> tps = p.topicPartitions();
      PartitionMap latest =
          availableNow != null ? availableNow : p.offsetsAt(tps, KafkaWire.LATEST);
      PartitionMap from = withNewPartitions(start, tps, p);
      if (limit instanceof ReadMaxRows) {
        PartitionMap capped = rateLimit(from, latest, ((ReadMaxRows) limit).maxRows());
        if (capped != latest) { // (uncut, every partition ends at its latest: nothing to do)
          p.cutFamilies(from, capped, latest);
        }
        return new JsonOffset(capped);
      }
      return new JsonOffset(latest);
    });
  }

  /** The start, with partitions that are new since it at their earliest offset. */
  private static PartitionMap withNewPartitions(
      PartitionMap start, Map<String, List<Integer>> tps, Planner p) throws IOException {
    Map<String, List<Integer>> fresh = new TreeMap<>();
    for (Map.Entry<String, List<Integer>> t : tps.entrySet()) {
      for (int part : t.getValue()) {
        if (!start.containsKey(t.getKey()) || !start.get(t.getKey()).containsKey(part)) {
          fresh.computeIfAbsent(t.getKey(), k -> new ArrayList<>()).add(part);
        }
      }
    }
    PartitionMap out = new PartitionMap();
    start.forEach((t, parts) -> out.put(t, new TreeMap<>(parts)));
    if (!fresh.isEmpty()) {
      p.offsetsAt(fresh, KafkaWire.EARLIEST)
          .forEach((t, parts) -> out.computeIfAbsent(t, k -> new TreeMap<>()).putAll(parts));
    }
    return out;
  }

  /** Caps a batch at maxRows offsets, shared in proportion to what each partition has. */
  static PartitionMap rateLimit(PartitionMap start, PartitionMap latest, long maxRows) {
    long total = 0;
    for (Map.Entry<String, TreeMap<Integer, Long>> t : latest.entrySet()) {
      for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
        total += Math.max(0, p.getValue() - from(start, t.getKey(), p.getKey()));
      }
    }
    if (total <= maxRows) {
      return latest;
    }
    PartitionMap out = new PartitionMap();
    for (Map.Entry<String, TreeMap<Integer, Long>> t : latest.entrySet()) {
      TreeMap<Integer, Long> parts = new TreeMap<>();
      for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
        long s = from(start, t.getKey(), p.getKey());
        long n = Math.max(0, p.getValue() - s);
        double share = (double) maxRows * n / total;
        // As Spark's Kafka source: a share below one offset rounds up, so a small limit
        // spread over many partitions still makes progress.
        long take = share < 1 ? (long) Math.ceil(share) : (long) Math.floor(share);
        parts.put(p.getKey(), s + Math.min(n, take));
      }
      out.put(t.getKey(), parts);
    }
    return out;
  }

  private static long from(PartitionMap m, String topic, int partition) {
    TreeMap<Integer, Long> parts = m.get(topic);
    Long v = parts == null ? null : parts.get(partition);
    return v == null ? 0L : v;
  }

  @Override
  public InputPartition[] planInputPartitions(Offset startOffset, Offset endOffset) {
    PartitionMap end = ((JsonOffset) endOffset).offsets;
    return withPlanner(p -> {
      Map<String, List<Integer>> tps = p.topicPartitions(); // the leaders, after a restart too
      PartitionMap start = withNewPartitions(((JsonOffset) startOffset).offsets, tps, p);
      PartitionMap checked = new PartitionMap();
      for (Map.Entry<String, TreeMap<Integer, Long>> t : start.entrySet()) {
        for (Map.Entry<Integer, Long> part : t.getValue().entrySet()) {
          TreeMap<Integer, Long> endParts = end.get(t.getKey());
          Long e = endParts == null ? null : endParts.get(part.getKey());
          if (e == null) {
            // Not in this batch: a partition that appeared after its end was fixed, or one
            // that no longer exists.
            if (!tps.getOrDefault(t.getKey(), List.of()).contains(part.getKey())) {
              dataLoss(t.getKey() + "-" + part.getKey() + " is gone");
            }
            continue;
          }
          long s = part.getValue();
          if (s > e) {
            dataLoss(t.getKey() + "-" + part.getKey() + " ends at " + e + ", before the "
                + "query's position " + s);
            s = e;
          }
          checked.computeIfAbsent(t.getKey(), k -> new TreeMap<>()).put(part.getKey(), s);
        }
      }
      return p.tasks(checked, end).toArray(new InputPartition[0]);
    });
  }

  private void dataLoss(String what) {
    if (opts.failOnDataLoss) {
      throw new IllegalStateException(what + "; some data may have been lost. Set "
          + "failOnDataLoss=false to go on from where the partition is now");
    }
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new RangeReaderFactory(opts, readSchema);
  }

  @Override
  public void commit(Offset end) {
    // Nothing to do: Spark's checkpoint keeps the positions; the broker is not told.
  }

  @Override
  public void stop() {
    closeWire();
  }
}
