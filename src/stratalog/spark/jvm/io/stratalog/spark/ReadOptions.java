package io.stratalog.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Pattern;
import java.util.regex.PatternSyntaxException;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The batch-read options, with the names, defaults and checks of Spark's Kafka source (and of
 * the Python {@code format("stratalog-python")}, whose messages these repeat). A bad option fails the
 * query when it is planned, with a message that names it.
 */
final class ReadOptions implements Serializable {
  private static final long serialVersionUID = 1L;
  private static final ObjectMapper JSON = new ObjectMapper();

  /** topic -> partition -> offset (or timestamp), both in a stable order. */
  static final class PartitionMap extends TreeMap<String, TreeMap<Integer, Long>> {
    private static final long serialVersionUID = 1L;
  }

  final String bootstrap;
  final List<String> subscribe = new ArrayList<>();
  final String subscribePattern;
  final Map<String, List<Integer>> assign = new TreeMap<>();
  final Object starting; // "earliest" | "latest" | PartitionMap | null
  final Object ending;
  final Long startingTimestamp;
  final Long endingTimestamp;
  final PartitionMap startingByTimestamp;
  final PartitionMap endingByTimestamp;
  final String timestampStrategy;
  final Integer minPartitions;
  final Integer maxOffsetsPerTrigger;
  final boolean failOnDataLoss;
  final boolean includeHeaders;
  final int pollTimeoutMs;
  final int fetchMaxBytes;
  final boolean readCommitted;
  // Read the leader's files when it runs on the executor's host (ColocatedPartition).
  final boolean colocatedReads;
  final WireSecurity security; // TLS and SASL, from the kafka.* options

  private static final String[][] UNSUPPORTED = {
    {"kafka.auto.offset.reset", "set the source option 'startingOffsets' instead"},
    {"kafka.key.deserializer", "keys are always read as bytes; cast or decode them in the query"},
    {"kafka.value.deserializer",
      "values are always read as bytes; cast or decode them in the query"},
    {"kafka.enable.auto.commit",
      "the source does not commit offsets; Spark's checkpoint keeps them"},
    {"kafka.interceptor.classes", "the source does not run consumer interceptors"},
  };

  /** The broker's address, from 'kafka.bootstrap.servers' or 'bootstrap.servers'. */
  static String bootstrap(CaseInsensitiveStringMap o) {
    String b = o.get("kafka.bootstrap.servers");
    if (b == null || b.isEmpty()) {
      b = o.get("bootstrap.servers");
    }
    if (b == null || b.isEmpty()) {
      throw new IllegalArgumentException("option 'bootstrap.servers' (or "
          + "'kafka.bootstrap.servers') must name the broker, e.g. 127.0.0.1:9092");
    }
    return b;
  }

  ReadOptions(CaseInsensitiveStringMap o) {
    bootstrap = bootstrap(o);
    security = WireSecurity.of(o);
    for (String name : new String[] {"minOffsetsPerTrigger", "maxTriggerDelay"}) {
      if (o.containsKey(name)) {
        throw new IllegalArgumentException(
            "option '" + name + "' is not supported by format(\"stratalog\")");
      }
    }
    for (String[] u : UNSUPPORTED) {
      if (o.containsKey(u[0])) {
        throw new IllegalArgumentException("Kafka option '" + u[0].substring(6)
            + "' is not supported: " + u[1]);
      }
    }
    // Fetches are read_uncommitted; read_committed is checked against the broker (Planner).
    String level = o.get("kafka.isolation.level");
    if (level != null && !level.equals("read_uncommitted") && !level.equals("read_committed")) {
      throw new IllegalArgumentException("Kafka option 'isolation.level' must be "
          + "'read_uncommitted' or 'read_committed', not '" + level + "'");
    }
    readCommitted = "read_committed".equals(level);
    List<String> given = new ArrayList<>();
    for (String n : new String[] {"subscribe", "subscribePattern", "assign"}) {
      String v = o.get(n);
      if (v != null && !v.isEmpty()) {
        given.add(n);
      }
    }
    if (given.size() != 1) {
      StringBuilder m = new StringBuilder(
          "exactly one of 'subscribe', 'subscribePattern' or 'assign' must be given");
      if (!given.isEmpty()) {
        m.append(", not '").append(String.join("' and '", given)).append("'");
      }
      throw new IllegalArgumentException(m.toString());
    }
    String pattern = null;
    if (given.get(0).equals("subscribe")) {
      for (String t : o.get("subscribe").split(",")) {
        if (!t.trim().isEmpty()) {
          subscribe.add(t.trim());
        }
      }
      if (subscribe.isEmpty()) {
        throw new IllegalArgumentException("option 'subscribe' names no topic");
      }
    } else if (given.get(0).equals("subscribePattern")) {
      pattern = o.get("subscribePattern").trim();
      try {
        Pattern.compile(pattern);
      } catch (PatternSyntaxException e) {
        throw new IllegalArgumentException(
            "option 'subscribePattern' is not a valid regex: " + e.getDescription());
      }
    } else {
      parseAssign(o.get("assign"));
    }
    subscribePattern = pattern;
    starting = offsets(o, "startingOffsets");
    ending = offsets(o, "endingOffsets");
    startingTimestamp = timestamp(o, "startingTimestamp");
    endingTimestamp = timestamp(o, "endingTimestamp");
    startingByTimestamp = o.containsKey("startingOffsetsByTimestamp")
        ? partitionJson("startingOffsetsByTimestamp", o.get("startingOffsetsByTimestamp"))
        : null;
    endingByTimestamp = o.containsKey("endingOffsetsByTimestamp")
        ? partitionJson("endingOffsetsByTimestamp", o.get("endingOffsetsByTimestamp"))
        : null;
    String strategy = o.getOrDefault("startingOffsetsByTimestampStrategy", "error")
        .toLowerCase(Locale.ROOT);
    if (!strategy.equals("error") && !strategy.equals("latest")) {
      throw new IllegalArgumentException("option 'startingOffsetsByTimestampStrategy' must be "
          + "'error' or 'latest', not '" + strategy + "'");
    }
    timestampStrategy = strategy;
    minPartitions = positiveInt(o, "minPartitions");
    // In batch, accepted and ignored, as Spark's Kafka source does.
    maxOffsetsPerTrigger = positiveInt(o, "maxOffsetsPerTrigger");
    failOnDataLoss = bool(o, "failOnDataLoss", true);
    includeHeaders = bool(o, "includeHeaders", false);
    colocatedReads = bool(o, "colocatedReads", true);
    Integer poll = positiveInt(o, "kafkaConsumer.pollTimeoutMs");
    pollTimeoutMs = poll == null ? 120_000 : poll;
    Integer maxBytes = positiveInt(o, "kafka.max.partition.fetch.bytes");
    fetchMaxBytes = maxBytes == null ? 8 << 20 : maxBytes;
  }

  /** The rules of a batch query: where it starts and ends must make sense together. */
  void checkBatch() {
    // Only the option that wins is checked: a timestamp beats startingOffsets/endingOffsets.
    if (startingTimestamp == null && startingByTimestamp == null) {
      if ("latest".equals(starting)) {
        throw new IllegalArgumentException(
            "option 'startingOffsets' can't be 'latest' for batch queries");
      }
      if (starting instanceof PartitionMap && contains((PartitionMap) starting, KafkaWire.LATEST)) {
        throw new IllegalArgumentException(
            "option 'startingOffsets' can't use -1 (latest) for batch queries");
      }
    }
    if (endingTimestamp == null && endingByTimestamp == null) {
      if ("earliest".equals(ending)) {
        throw new IllegalArgumentException(
            "option 'endingOffsets' can't be 'earliest' for batch queries");
      }
      if (ending instanceof PartitionMap && contains((PartitionMap) ending, KafkaWire.EARLIEST)) {
        throw new IllegalArgumentException("option 'endingOffsets' can't use -2 (earliest)");
      }
    }
    checkLimits();
  }

  /** The rules of a streaming query: it has no end. */
  void checkStreaming() {
    String name = ending != null ? "endingOffsets"
        : endingTimestamp != null ? "endingTimestamp"
        : endingByTimestamp != null ? "endingOffsetsByTimestamp" : null;
    if (name != null) {
      throw new IllegalArgumentException("option '" + name + "' is for batch queries only");
    }
  }

  private static boolean contains(PartitionMap m, long v) {
    for (TreeMap<Integer, Long> parts : m.values()) {
      if (parts.containsValue(v)) {
        return true;
      }
    }
    return false;
  }

  private void checkLimits() {
    if (startingTimestamp != null && endingTimestamp != null
        && startingTimestamp > endingTimestamp) {
      throw new IllegalArgumentException("the specified start timestamp (" + startingTimestamp
          + ") is greater than the end timestamp (" + endingTimestamp + ")");
    }
    boolean noGlobal = startingTimestamp == null && endingTimestamp == null;
    boolean noByTs = startingByTimestamp == null && endingByTimestamp == null;
    PartitionMap s = null;
    PartitionMap e = null;
    String what = null;
    if (noGlobal && startingByTimestamp != null && endingByTimestamp != null) {
      s = startingByTimestamp;
      e = endingByTimestamp;
      what = "timestamp";
    } else if (noGlobal && noByTs && starting instanceof PartitionMap
        && ending instanceof PartitionMap) {
      s = (PartitionMap) starting;
      e = (PartitionMap) ending;
      what = "offset";
    }
    if (s == null) {
      return;
    }
    for (Map.Entry<String, TreeMap<Integer, Long>> t : s.entrySet()) {
      for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
        TreeMap<Integer, Long> endParts = e.get(t.getKey());
        Long end = endParts == null ? null : endParts.get(p.getKey());
        if (end != null && p.getValue() >= 0 && end >= 0 && p.getValue() > end) {
          throw new IllegalArgumentException("the specified start " + what + " " + p.getValue()
              + " is greater than the end " + what + " " + end + " for " + t.getKey() + "-"
              + p.getKey());
        }
      }
    }
  }

  private void parseAssign(String text) {
    JsonNode root;
    try {
      root = JSON.readTree(text);
    } catch (Exception ex) {
      throw new IllegalArgumentException("option 'assign' is not valid JSON; expected e.g. "
          + "{\"topicA\": [0, 1], \"topicB\": [2, 4]}");
    }
    if (root == null || !root.isObject()) {
      throw new IllegalArgumentException(
          "option 'assign' must look like {\"topicA\": [0, 1]}, got " + text);
    }
    Iterator<Map.Entry<String, JsonNode>> it = root.properties().iterator();
    while (it.hasNext()) {
      Map.Entry<String, JsonNode> t = it.next();
      if (!t.getValue().isArray()) {
        throw new IllegalArgumentException(
            "option 'assign' must look like {\"topicA\": [0, 1]}, got " + text);
      }
      List<Integer> ps = new ArrayList<>();
      for (JsonNode p : t.getValue()) {
        if (!p.isInt()) {
          throw new IllegalArgumentException(
              "option 'assign' must look like {\"topicA\": [0, 1]}, got " + text);
        }
        ps.add(p.asInt());
      }
      assign.put(t.getKey(), ps);
    }
  }

  static PartitionMap partitionJson(String name, String text) {
    JsonNode root;
    try {
      root = JSON.readTree(text);
    } catch (Exception ex) {
      throw new IllegalArgumentException("option '" + name + "' is not valid JSON; expected "
          + "e.g. {\"topicA\": {\"0\": 23, \"1\": -2}}");
    }
    if (root == null || !root.isObject()) {
      throw new IllegalArgumentException(
          "option '" + name + "' must be a JSON object of topics, got " + text);
    }
    PartitionMap out = new PartitionMap();
    Iterator<Map.Entry<String, JsonNode>> it = root.properties().iterator();
    while (it.hasNext()) {
      Map.Entry<String, JsonNode> t = it.next();
      if (!t.getValue().isObject()) {
        throw new IllegalArgumentException("option '" + name + "': topic '" + t.getKey()
            + "' must map partitions to numbers, got " + t.getValue());
      }
      TreeMap<Integer, Long> parts = new TreeMap<>();
      Iterator<Map.Entry<String, JsonNode>> pit = t.getValue().properties().iterator();
      while (pit.hasNext()) {
        Map.Entry<String, JsonNode> p = pit.next();
        try {
          if (!p.getValue().canConvertToLong() || !p.getValue().isIntegralNumber()) {
            throw new NumberFormatException();
          }
          parts.put(Integer.parseInt(p.getKey().trim()), p.getValue().asLong());
        } catch (NumberFormatException ex) {
          throw new IllegalArgumentException("option '" + name + "': '" + t.getKey()
              + "' partition '" + p.getKey() + "' -> " + p.getValue() + " is not a number");
        }
      }
      out.put(t.getKey(), parts);
    }
    return out;
  }

  private static Object offsets(CaseInsensitiveStringMap o, String name) {
    String v = o.get(name);
    if (v == null) {
      return null;
    }
    String word = v.trim().toLowerCase(Locale.ROOT);
    if (word.equals("earliest") || word.equals("latest")) {
      return word;
    }
    return partitionJson(name, v);
  }

  private static Long timestamp(CaseInsensitiveStringMap o, String name) {
    String v = o.get(name);
    if (v == null) {
      return null;
    }
    try {
      return Long.parseLong(v.trim());
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException("option '" + name
          + "' must be a timestamp in milliseconds since the epoch, not '" + v + "'");
    }
  }

  private static Integer positiveInt(CaseInsensitiveStringMap o, String name) {
    String v = o.get(name);
    if (v == null) {
      return null;
    }
    int n;
    try {
      n = Integer.parseInt(v); // as Scala's toInt: no spaces around
    } catch (NumberFormatException e) {
      n = 0;
    }
    if (n <= 0) {
      throw new IllegalArgumentException(
          "option '" + name + "' must be a positive integer, not '" + v + "'");
    }
    return n;
  }

  static boolean bool(CaseInsensitiveStringMap o, String name, boolean dflt) {
    String v = o.get(name);
    if (v == null) {
      return dflt;
    }
    String w = v.toLowerCase(Locale.ROOT); // as Scala's toBoolean: no spaces around
    if (!w.equals("true") && !w.equals("false")) {
      throw new IllegalArgumentException(
          "option '" + name + "' must be 'true' or 'false', not '" + v + "'");
    }
    return w.equals("true");
  }

  /** Records {@code [from, to)} of a partition are gone: fail unless failOnDataLoss=false. */
  void checkLoss(String topic, int partition, long from, long to, String why)
      throws java.io.IOException {
    if (failOnDataLoss) {
      throw new java.io.IOException("records " + from + " to " + (to - 1) + " of " + topic + "-"
          + partition + " are gone (" + why + "); some data may have been lost. Set "
          + "failOnDataLoss=false to skip them");
    }
  }
}
