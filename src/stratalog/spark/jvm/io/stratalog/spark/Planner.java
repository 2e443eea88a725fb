package io.stratalog.spark;

import io.stratalog.spark.ReadOptions.PartitionMap;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.regex.Pattern;
import org.apache.spark.sql.connector.read.InputPartition;

/**
 * Turns the options into offset ranges on Spark's driver: which topic-partitions, where each
 * starts and ends (startingTimestamp > startingOffsetsByTimestamp > startingOffsets, and the
 * same for the end), and how the ranges are cut for minPartitions, as Spark's
 * KafkaOffsetRangeCalculator cuts them so both sources run the same tasks. A split topic
 * ({@link SplitTree}) is planned one task per partition family instead, never cut: a key's
 * records may sit in a parent and its child, and only one reader of both keeps their order.
 */
final class Planner {
  /** Internal topic of the Python source's streaming queries; never part of a pattern. */
  static final String START_LOG_TOPIC = "__stratalog_spark_starts";

  private final ReadOptions opts;
  private final LeaderMap wire;

  Planner(ReadOptions opts, LeaderMap wire) {
    this.opts = opts;
    this.wire = wire;
  }

  /** A batch query's tasks. */
  List<InputPartition> plan() throws IOException {
    Map<String, List<Integer>> tps = topicPartitions();
    PartitionMap earliest = offsetsAt(tps, KafkaWire.EARLIEST);
    PartitionMap latest = offsetsAt(tps, KafkaWire.LATEST);
    PartitionMap start = resolveStart(tps, earliest, latest, "earliest");
    PartitionMap end = resolveEnd(tps, earliest, latest);
    for (Map.Entry<String, TreeMap<Integer, Long>> t : end.entrySet()) {
      for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
        Long s = start.get(t.getKey()).get(p.getKey());
        if (s != null && s > p.getValue()) {
          throw new IllegalArgumentException("the start offset " + s + " of " + t.getKey() + "-"
              + p.getKey() + " is greater than the resolved end offset " + p.getValue());
        }
      }
    }
    return tasks(start, end);
  }

  /**
   * The tasks of {@code [start, end)}: a split topic's families one task each (see
   * {@link #families}), the other topics' ranges as {@link #split} cuts them.
   */
  List<InputPartition> tasks(PartitionMap start, PartitionMap end) throws IOException {
    PartitionMap plain = new PartitionMap();
    List<InputPartition> families = new ArrayList<>();
    for (Map.Entry<String, TreeMap<Integer, Long>> t : end.entrySet()) {
      int[] counts = t.getValue().isEmpty() ? new int[0] : splitCounts(t.getKey());
      if (counts.length == 0) {
        plain.put(t.getKey(), t.getValue());
      } else {
        families.addAll(families(t.getKey(), counts, start.get(t.getKey()), t.getValue()));
      }
    }
    List<InputPartition> out = new ArrayList<>(split(start, plain));
    out.addAll(families);
    return out;
  }

  /**
   * The topic's split history (its partition counts), or none when it was never split or the
   * broker does not say (a Kafka broker, an error answer): such a topic is read as Kafka's.
   */
  private int[] splitCounts(String topic) throws IOException {
    String history;
    try {
      history = wire.topicConfig(topic, SplitTree.HISTORY);
    } catch (KafkaWire.KafkaError e) {
      return new int[0]; // an error answer (no such topic, not authorized): as Kafka's
    }
    return SplitTree.parse(history);
  }

  /**
   * One task per family of the partitions in {@code end} (a partition split off after the end
   * was taken waits for a later batch), each member from its start (0 when it has none) to
   * its end, with its parent; families with no member in {@code end} are left out.
   */
  private List<FamilyRange> families(String topic, int[] counts, TreeMap<Integer, Long> start,
      TreeMap<Integer, Long> end) {
    List<FamilyRange> out = new ArrayList<>();
    for (List<Integer> family : SplitTree.families(counts, end.lastKey() + 1)) {
      List<Integer> members = new ArrayList<>();
      for (int p : family) {
        if (end.containsKey(p)) {
          members.add(p);
        }
      }
      if (members.isEmpty()) {
        continue;
      }
      int n = members.size();
      int[] partitions = new int[n];
      long[] from = new long[n];
      long[] until = new long[n];
      int[] parents = new int[n];
      for (int i = 0; i < n; i++) {
        int p = members.get(i);
        partitions[i] = p;
        from[i] = start == null ? 0L : start.getOrDefault(p, 0L);
        until[i] = Math.max(from[i], end.get(p));
        // Parents come first, so a parent among the members has a smaller index.
        parents[i] = members.indexOf(SplitTree.parentOf(p, counts));
      }
      String leader = wire.leaderAddress(topic, partitions[0]);
      out.add(new FamilyRange(topic, partitions, from, until, parents,
          leader == null ? opts.bootstrap : leader + "," + opts.bootstrap));
    }
    return out;
  }

  /**
   * Makes a rate-limited {@code end} a consistent cut of each split family's log, in place: a
   * child whose parent ends below {@code latest} ends before its first batch appended after the
   * parent's end (its order mark is past it), else the child's records could come out a
   * micro-batch before parent records written first. Parents before children, so a grandchild
   * follows its parent's cut. As the Python source's planning.cut_families.
   */
  void cutFamilies(PartitionMap start, PartitionMap end, PartitionMap latest)
      throws IOException {
    for (Map.Entry<String, TreeMap<Integer, Long>> t : end.entrySet()) {
      TreeMap<Integer, Long> ends = t.getValue();
      int[] counts = ends.isEmpty() ? new int[0] : splitCounts(t.getKey());
      if (counts.length == 0) {
        continue;
      }
      TreeMap<Integer, Long> full = latest.getOrDefault(t.getKey(), new TreeMap<>());
      for (FamilyRange f : families(t.getKey(), counts, start.get(t.getKey()), ends)) {
        for (int i = 0; i < f.partitions.length; i++) {
          if (f.parents[i] < 0 || f.until[i] <= f.from[i]) {
            continue;
          }
          int parent = f.partitions[f.parents[i]];
          long parentEnd = ends.get(parent);
          if (parentEnd < full.getOrDefault(parent, parentEnd)) {
            ends.put(f.partitions[i],
                childEnd(t.getKey(), f.partitions[i], f.from[i], f.until[i], parentEnd));
          }
        }
      }
    }
  }

  /**
   * Where a read of {@code child} from {@code start} must end, at most {@code end}, when its
   * parent's read ends at {@code parentEnd}: at its first batch whose order mark is past
   * {@code parentEnd}, or that has none (a cold chunk of an old broker).
   */
  private long childEnd(String topic, int child, long start, long end, long parentEnd)
      throws IOException {
    long at = start;
    while (at < end) {
      KafkaWire.FetchedPartition fp =
          wire.fetchFamily(topic, Map.of(child, at), 1 << 20, 1 << 20, 0, false).get(child);
      if (fp == null) {
        throw new IOException("the broker did not answer a fetch of " + topic + "-" + child);
      }
      if (fp.error != 0) {
        throw new KafkaWire.KafkaError(
            "Fetch of " + topic + "-" + child + " at offset " + at + " failed", fp.error);
      }
      if (!FamilyReader.wholeBatchAt(fp, fp.start)) {
        return at; // nothing more there: the end is where it is
      }
      long cut = FamilyReader.firstWaiting(fp, parentEnd);
      if (cut != Long.MAX_VALUE) {
        return Math.max(start, Math.min(end, cut));
      }
      long next = FamilyReader.afterWhole(fp);
      if (next <= at) {
        throw new IOException("a fetch of " + topic + "-" + child + " at offset " + at
            + " made no progress");
      }
      at = next;
    }
    return end;
  }

  /** The topic-partitions the options select, checked against the broker. */
  Map<String, List<Integer>> topicPartitions() throws IOException {
    Map<String, List<Integer>> out = new TreeMap<>();
    if (opts.subscribePattern != null) {
      Pattern rx = Pattern.compile(opts.subscribePattern);
      for (KafkaWire.TopicMeta tm : wire.metadata(null).values()) {
        // As Spark's Kafka source, among the topics its admin client lists: not internal ones.
        if (tm.error == 0 && !tm.internal && rx.matcher(tm.name).find()
            && !tm.name.equals(START_LOG_TOPIC)) {
          out.put(tm.name, new ArrayList<>(new TreeSet<>(tm.leaders.keySet())));
        }
      }
      return out;
    }
    List<String> names =
        opts.subscribe.isEmpty() ? new ArrayList<>(opts.assign.keySet()) : opts.subscribe;
    Map<String, KafkaWire.TopicMeta> meta = wire.metadata(names);
    for (String t : names) {
      KafkaWire.TopicMeta tm = meta.get(t);
      if (tm == null || tm.error != 0) {
        throw new IllegalArgumentException(
            "topic '" + t + "' does not exist on " + opts.bootstrap);
      }
      int n = tm.leaders.size();
      if (opts.assign.isEmpty()) {
        out.put(t, KafkaWire.range(n));
        continue;
      }
      List<Integer> bad = new ArrayList<>();
      for (int p : opts.assign.get(t)) {
        if (p < 0 || p >= n) {
          bad.add(p);
        }
      }
      if (!bad.isEmpty()) {
        throw new IllegalArgumentException("option 'assign': topic '" + t + "' has " + n
            + " partitions, no " + bad);
      }
      out.put(t, new ArrayList<>(new TreeSet<>(opts.assign.get(t))));
    }
    return out;
  }

  /**
   * The reader fetches read_uncommitted. A broker without transactions (no EndTxn) has nothing
   * for read_committed to hide, so it means the same there; on a broker with transactions
   * (Stratalog too) it would hide aborted records, which this reader does not do: refused.
   */
  /**
   * Each partition's offset for a timestamp, or its earliest or latest offset (with
   * read_committed the last stable offset, as Spark's Kafka source takes it).
   */
  PartitionMap offsetsAt(Map<String, List<Integer>> tps, long ts) throws IOException {
    PartitionMap out = new PartitionMap();
    for (Map.Entry<String, List<Integer>> t : tps.entrySet()) {
      if (!t.getValue().isEmpty()) {
        out.put(t.getKey(), new TreeMap<>(wire.listOffsets(t.getKey(), t.getValue(), ts, opts.readCommitted)));
      }
    }
    return out;
  }

  /** A per-partition option must name exactly the assigned partitions, as Spark requires. */
  private static void checkExact(String name, PartitionMap spec, Map<String, List<Integer>> tps) {
    Set<String> named = new TreeSet<>();
    spec.forEach((t, parts) -> parts.keySet().forEach(p -> named.add(t + "-" + p)));
    Set<String> assigned = new TreeSet<>();
    tps.forEach((t, ps) -> ps.forEach(p -> assigned.add(t + "-" + p)));
    if (!named.equals(assigned)) {
      Set<String> extra = new TreeSet<>(named);
      extra.removeAll(assigned);
      Set<String> missing = new TreeSet<>(assigned);
      missing.removeAll(named);
      throw new IllegalArgumentException("partitions in option '" + name
          + "' don't match the assigned ones: named but not assigned: " + show(extra)
          + "; assigned but not named: " + show(missing));
    }
  }

  private static String show(Set<String> tps) {
    return tps.isEmpty() ? "none" : String.join(", ", tps);
  }

  private PartitionMap byTimestamp(Map<String, List<Integer>> tps, Long global,
      PartitionMap perPartition, String name, PartitionMap latest, boolean isStart)
      throws IOException {
    if (global == null) {
      checkExact(name, perPartition, tps);
    }
    PartitionMap out = new PartitionMap();
    for (Map.Entry<String, List<Integer>> t : tps.entrySet()) {
      TreeMap<Integer, Long> parts = new TreeMap<>();
      for (int p : t.getValue()) {
        long ts = global != null ? global : perPartition.get(t.getKey()).get(p);
        long off = wire.listOffsets(t.getKey(), List.of(p), ts).get(p);
        if (off < 0) {
          if (isStart && !opts.timestampStrategy.equals("latest")) {
            throw new IllegalArgumentException("no record at or after timestamp " + ts + " in "
                + t.getKey() + "-" + p + "; set startingOffsetsByTimestampStrategy=latest to "
                + "start at the end");
          }
          off = latest.get(t.getKey()).get(p);
        }
        parts.put(p, off);
      }
      out.put(t.getKey(), parts);
    }
    return out;
  }

  /** Where a query starts: startingTimestamp > startingOffsetsByTimestamp > startingOffsets. */
  PartitionMap resolveStart(Map<String, List<Integer>> tps, PartitionMap earliest,
      PartitionMap latest, String dflt) throws IOException {
    if (opts.startingTimestamp != null || opts.startingByTimestamp != null) {
      return byTimestamp(tps, opts.startingTimestamp, opts.startingByTimestamp,
          "startingOffsetsByTimestamp", latest, true);
    }
    Object spec = opts.starting == null ? dflt : opts.starting;
    return apply(spec, tps, earliest, latest, "startingOffsets");
  }

  private PartitionMap resolveEnd(Map<String, List<Integer>> tps, PartitionMap earliest,
      PartitionMap latest) throws IOException {
    if (opts.endingTimestamp != null || opts.endingByTimestamp != null) {
      return byTimestamp(tps, opts.endingTimestamp, opts.endingByTimestamp,
          "endingOffsetsByTimestamp", latest, false);
    }
    PartitionMap end =
        apply(opts.ending == null ? "latest" : opts.ending, tps, earliest, latest,
            "endingOffsets");
    for (Map.Entry<String, TreeMap<Integer, Long>> t : end.entrySet()) {
      for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
        long last = latest.get(t.getKey()).get(p.getKey());
        if (p.getValue() > last) {
          if (opts.failOnDataLoss) {
            throw new IllegalArgumentException("option 'endingOffsets' asks for offsets up to "
                + p.getValue() + " of " + t.getKey() + "-" + p.getKey() + ", which ends at "
                + last + "; set failOnDataLoss=false to read what there is");
          }
          p.setValue(last);
        }
      }
    }
    return end;
  }

  private static PartitionMap apply(Object spec, Map<String, List<Integer>> tps,
      PartitionMap earliest, PartitionMap latest, String name) {
    PartitionMap out = new PartitionMap();
    if (spec instanceof String) {
      PartitionMap from = spec.equals("earliest") ? earliest : latest;
      for (String t : tps.keySet()) {
        out.put(t, new TreeMap<>(from.getOrDefault(t, new TreeMap<>())));
      }
      return out;
    }
    PartitionMap given = (PartitionMap) spec;
    checkExact(name, given, tps);
    for (Map.Entry<String, List<Integer>> t : tps.entrySet()) {
      TreeMap<Integer, Long> parts = new TreeMap<>();
      for (int p : t.getValue()) {
        long v = given.get(t.getKey()).get(p);
        if (v == KafkaWire.EARLIEST) {
          v = earliest.get(t.getKey()).get(p);
        } else if (v == KafkaWire.LATEST) {
          v = latest.get(t.getKey()).get(p);
        }
        parts.put(p, v);
      }
      out.put(t.getKey(), parts);
    }
    return out;
  }

  private static long partCount(long size, long total, int minParts) {
    if (total == 0) {
      return 1; // Scala's round of NaN is 0, and at least one part
    }
    // Scala's math.round, half away from zero, as Spark computes it.
    return Math.max((long) Math.floor((double) size / total * minParts + 0.5), 1L);
  }

  /**
   * One range per partition, cut for minPartitions; when cut, empty parts are dropped. This is
   * the installed Spark's (4.2) KafkaOffsetRangeCalculator; newer ones drop empty ranges always.
   */
  List<OffsetRange> split(PartitionMap start, PartitionMap end) {
    List<OffsetRange> ranges = new ArrayList<>();
    for (Map.Entry<String, TreeMap<Integer, Long>> t : end.entrySet()) {
      for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
        long s = start.getOrDefault(t.getKey(), new TreeMap<>()).getOrDefault(p.getKey(), 0L);
        long e = Math.max(s, p.getValue());
        // The leader planning saw goes first in the task's bootstrap list (see RangeReader).
        String leader = wire.leaderAddress(t.getKey(), p.getKey());
        ranges.add(new OffsetRange(t.getKey(), p.getKey(), s, e,
            leader == null ? opts.bootstrap : leader + "," + opts.bootstrap));
      }
    }
    Integer min = opts.minPartitions;
    if (min == null || ranges.size() >= min) {
      return ranges; // empty ranges too: one task each, as Spark 4.2's Kafka source plans them
    }
    long total = 0;
    for (OffsetRange r : ranges) {
      total += r.size();
    }
    // Ranges too small to split keep one task each and leave the proportion to the others.
    Set<OffsetRange> unsplit = new HashSet<>();
    long unsplitSize = 0;
    for (OffsetRange r : ranges) {
      if (partCount(r.size(), total, min) == 1) {
        unsplit.add(r);
        unsplitSize += r.size();
      }
    }
    long splitTotal = total - unsplitSize;
    int splitMin = Math.max(min - unsplit.size(), 1);
    List<OffsetRange> out = new ArrayList<>();
    for (OffsetRange r : ranges) {
      long parts = unsplit.contains(r) ? 1 : partCount(r.size(), splitTotal, splitMin);
      long remaining = r.size();
      long s = r.from;
      for (long part = 0; part < parts; part++) {
        long take = remaining / (parts - part);
        remaining -= take;
        long e = Math.min(s + take, r.until);
        if (e > s) {
          out.add(new OffsetRange(r.topic, r.partition, s, e, r.brokers));
        }
        s = e;
      }
    }
    return out;
  }
}
