package io.stratalog.spark;

import java.io.ByteArrayOutputStream;
import java.io.Closeable;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A blocking Kafka-protocol connection to one broker, for the requests the connector makes:
 * Metadata, ApiVersions, ListOffsets, Fetch, Produce, DescribeLogDirs and DescribeConfigs
 * ({@link LeaderMap} picks the broker).
 * Fetch answers are read into one reusable array and their record bytes are handed out as
 * positions in it, so the decoder copies each value once, into its column. Versions are fixed
 * at ones every Kafka 2.x-4.x broker and Stratalog accept (non-flexible), but for the Fetch of
 * a split family ({@link #fetchFamily}): only v12+ (flexible) answers carry the order marks,
 * and only Stratalog has split topics.
 */
final class KafkaWire implements Closeable {
  static final long EARLIEST = -2L;
  static final long LATEST = -1L;

  private static final short METADATA = 3;
  private static final short METADATA_V = 4; // v4: the request can refuse auto-creation
  private static final short LIST_OFFSETS = 2;
  private static final short LIST_OFFSETS_V = 2; // v2: an isolation level (LSO for latest)
  private static final short FETCH = 1;
  private static final short FETCH_V = 5; // v5: answers carry the log start offset
  private static final short FETCH_FLEX_V = 12; // the first with tagged fields (order marks)
  private static final short PRODUCE = 0;
  private static final short PRODUCE_V = 7; // v3+: record batches of magic 2
  private static final short API_VERSIONS = 18;
  private static final short DESCRIBE_LOG_DIRS = 35;
  private static final short DESCRIBE_LOG_DIRS_V = 1; // v1: as v0, the last non-flexible one
  private static final short DESCRIBE_CONFIGS = 32;
  private static final short DESCRIBE_CONFIGS_V = 1; // Kafka 4 dropped v0; v1-v3 non-flexible
  private static final byte TOPIC_RESOURCE = 2;
  static final short END_TXN = 26;

  private final String host;
  private final int port;
  private final Socket socket;
  private final DataInputStream in;
  private final DataOutputStream out;
  private int correlation = 0;
  private byte[] frame = new byte[1 << 20];

  KafkaWire(String host, int port, int timeoutMs, WireSecurity security) throws IOException {
    this.host = host;
    this.port = port;
    socket = security.connect(host, port, timeoutMs);
    in = new DataInputStream(new java.io.BufferedInputStream(socket.getInputStream(), 1 << 16));
    out = new DataOutputStream(socket.getOutputStream());
    if (security.sasl()) {
      try {
        security.authenticate((api, version, body) -> {
          Body req = header(api, version);
          req.w.write(body);
          return call(req);
        }, address());
      } catch (IOException e) {
        socket.close();
        throw e;
      }
    }
  }

  /** The addresses of a comma-separated list, each "host:port" or "[v6]:port", once each. */
  static List<String> addresses(String bootstrap) {
    List<String> out = new ArrayList<>();
    for (String a : bootstrap.split(",")) {
      a = a.trim();
      if (!a.isEmpty() && !out.contains(a)) {
        out.add(a);
      }
    }
    if (out.isEmpty()) {
      throw new IllegalArgumentException(
          "bootstrap address '" + bootstrap + "' is not of the form HOST:PORT");
    }
    return out;
  }

  /** A connection to one "host:port" or "[v6]:port". */
  static KafkaWire open(String address, int timeoutMs, WireSecurity security)
      throws IOException {
    int colon = address.lastIndexOf(':');
    if (colon <= 0) {
      throw new IllegalArgumentException(
          "bootstrap address '" + address + "' is not of the form HOST:PORT");
    }
    String h = address.substring(0, colon);
    if (h.startsWith("[") && h.endsWith("]")) {
      h = h.substring(1, h.length() - 1);
    }
    int p;
    try {
      p = Integer.parseInt(address.substring(colon + 1));
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException(
          "bootstrap address '" + address + "' is not of the form HOST:PORT");
    }
    return new KafkaWire(h, p, timeoutMs, security);
  }

  String address() {
    return host + ":" + port;
  }

  @Override
  public void close() throws IOException {
    socket.close();
  }

  // -- framing ---------------------------------------------------------------------------------

  private static final class Body {
    final ByteArrayOutputStream bytes = new ByteArrayOutputStream(256);
    final DataOutputStream w = new DataOutputStream(bytes);

    Body string(String s) throws IOException {
      byte[] b = s.getBytes(StandardCharsets.UTF_8);
      w.writeShort(b.length);
      w.write(b);
      return this;
    }
  }

  private Body header(short api, short version) throws IOException {
    Body b = new Body();
    b.w.writeShort(api);
    b.w.writeShort(version);
    b.w.writeInt(++correlation);
    b.string("stratalog-spark-jvm");
    return b;
  }

  /** A request header v2 (flexible versions): v1's, then its tagged fields (none). */
  private Body flexibleHeader(short api, short version) throws IOException {
    Body b = header(api, version);
    b.w.writeByte(0);
    return b;
  }

  /** Sends the request and returns a buffer over the answer's body (after the correlation id). */
  private ByteBuffer call(Body req) throws IOException {
    byte[] body = req.bytes.toByteArray();
    out.writeInt(body.length);
    out.write(body);
    out.flush();
    int size = in.readInt();
    if (size < 4) {
      throw new IOException("broker " + address() + " sent a frame of " + size + " bytes");
    }
    if (frame.length < size) {
      frame = new byte[Math.max(size, frame.length * 2)];
    }
    in.readFully(frame, 0, size);
    ByteBuffer bb = ByteBuffer.wrap(frame, 0, size);
    int cid = bb.getInt();
    if (cid != correlation) {
      throw new IOException("broker " + address() + " answered request " + correlation
          + " with correlation id " + cid);
    }
    return bb;
  }

  private static String readString(ByteBuffer bb) {
    short n = bb.getShort();
    if (n < 0) {
      return null;
    }
    String s = new String(bb.array(), bb.arrayOffset() + bb.position(), n, StandardCharsets.UTF_8);
    bb.position(bb.position() + n);
    return s;
  }

  // -- compact (flexible) encodings: unsigned varints, lengths stored plus one ----------------

  private static void writeUvarint(DataOutputStream w, int v) throws IOException {
    while ((v & ~0x7f) != 0) {
      w.writeByte((v & 0x7f) | 0x80);
      v >>>= 7;
    }
    w.writeByte(v);
  }

  private static void compactString(DataOutputStream w, String s) throws IOException {
    byte[] b = s.getBytes(StandardCharsets.UTF_8);
    writeUvarint(w, b.length + 1);
    w.write(b);
  }

  private static int readUvarint(ByteBuffer bb) throws IOException {
    int v = 0;
    for (int shift = 0; shift <= 28; shift += 7) {
      int b = bb.get();
      v |= (b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        return v;
      }
    }
    throw new IOException("an overlong varint in an answer");
  }

  /** A compact length: the stored number less one; -1 for null. */
  private static int readCompactLength(ByteBuffer bb) throws IOException {
    return readUvarint(bb) - 1;
  }

  private static void skipTags(ByteBuffer bb) throws IOException {
    for (int n = readUvarint(bb); n > 0; n--) {
      readUvarint(bb); // tag
      int size = readUvarint(bb);
      bb.position(bb.position() + size);
    }
  }

  // -- Metadata --------------------------------------------------------------------------------

  /** A topic's partitions and each one's leader (node id; -1: none now). */
  static final class TopicMeta {
    final String name;
    final short error;
    final boolean internal; // Kafka's internal topics (__consumer_offsets)
    final Map<Integer, Integer> leaders = new LinkedHashMap<>();

    TopicMeta(String name, short error, boolean internal) {
      this.name = name;
      this.error = error;
      this.internal = internal;
    }
  }

  /** A Metadata answer: the cluster id, the brokers (node id -> "host:port") and the topics. */
  static final class Metadata {
    String clusterId; // null when the broker does not say
    final Map<Integer, String> brokers = new LinkedHashMap<>();
    final Map<String, TopicMeta> topics = new LinkedHashMap<>();
  }

  /** The API keys the broker serves (ApiVersions v0). */
  java.util.Set<Short> apiKeys() throws IOException {
    ByteBuffer bb = call(header(API_VERSIONS, (short) 0));
    short err = bb.getShort();
    if (err != 0) {
      throw new KafkaError("ApiVersions to " + address() + " failed", err);
    }
    java.util.Set<Short> keys = new java.util.TreeSet<>();
    for (int i = bb.getInt(); i > 0; i--) {
      keys.add(bb.getShort());
      bb.getShort(); // min version
      bb.getShort(); // max version
    }
    return keys;
  }

  /**
   * Metadata for the named topics, or for every topic when {@code topics} is null; with
   * {@code allowAutoCreate} a broker that creates topics on demand creates the missing ones, as
   * a Kafka producer asks it to.
   */
  Metadata metadata(List<String> topics, boolean allowAutoCreate) throws IOException {
    Body req = header(METADATA, METADATA_V);
    if (topics == null) {
      req.w.writeInt(-1);
    } else {
      req.w.writeInt(topics.size());
      for (String t : topics) {
        req.string(t);
      }
    }
    req.w.writeBoolean(allowAutoCreate);
    ByteBuffer bb = call(req);
    bb.getInt(); // throttle
    Metadata md = new Metadata();
    for (int i = bb.getInt(); i > 0; i--) {
      int node = bb.getInt();
      String h = readString(bb);
      int p = bb.getInt();
      readString(bb); // rack
      md.brokers.put(node, (h.contains(":") ? "[" + h + "]" : h) + ":" + p);
    }
    md.clusterId = readString(bb);
    bb.getInt(); // controller
    for (int i = bb.getInt(); i > 0; i--) {
      short err = bb.getShort();
      String name = readString(bb);
      boolean internal = bb.get() != 0;
      TopicMeta tm = new TopicMeta(name, err, internal);
      for (int j = bb.getInt(); j > 0; j--) {
        bb.getShort();
        int partition = bb.getInt();
        int leader = bb.getInt();
        skipInts(bb); // replicas
        skipInts(bb); // isr
        tm.leaders.put(partition, leader);
      }
      md.topics.put(name, tm);
    }
    return md;
  }

  private static void skipInts(ByteBuffer bb) {
    int n = bb.getInt();
    bb.position(bb.position() + 4 * Math.max(n, 0));
  }

  // -- DescribeLogDirs -------------------------------------------------------------------------

  /**
   * The log directory of this broker that holds the partition's current log (not a future one
   * being moved), or null when the broker lists none for it (an error, another leader).
   */
  String logDirOf(String topic, int partition) throws IOException {
    Body req = header(DESCRIBE_LOG_DIRS, DESCRIBE_LOG_DIRS_V);
    req.w.writeInt(1); // topics (a nullable array: null would be every topic)
    req.string(topic);
    req.w.writeInt(1); // partitions
    req.w.writeInt(partition);
    ByteBuffer bb = call(req);
    bb.getInt(); // throttle
    String found = null;
    for (int i = bb.getInt(); i > 0; i--) {
      short err = bb.getShort();
      String dir = readString(bb);
      for (int t = bb.getInt(); t > 0; t--) {
        String name = readString(bb);
        for (int p = bb.getInt(); p > 0; p--) {
          int index = bb.getInt();
          bb.getLong(); // partition size
          bb.getLong(); // offset lag
          boolean future = bb.get() != 0;
          if (err == 0 && found == null && !future && index == partition
              && topic.equals(name)) {
            found = dir;
          }
        }
      }
    }
    return found;
  }

  // -- DescribeConfigs -------------------------------------------------------------------------

  /** A topic config's value; null when the broker has no such config (or hides it). */
  String topicConfig(String topic, String name) throws IOException {
    Body req = header(DESCRIBE_CONFIGS, DESCRIBE_CONFIGS_V);
    req.w.writeInt(1); // resources
    req.w.writeByte(TOPIC_RESOURCE);
    req.string(topic);
    req.w.writeInt(1); // the config names asked for
    req.string(name);
    req.w.writeBoolean(false); // include synonyms
    ByteBuffer bb = call(req);
    bb.getInt(); // throttle
    String value = null;
    for (int i = bb.getInt(); i > 0; i--) {
      short err = bb.getShort();
      String message = readString(bb);
      bb.get(); // resource type
      readString(bb); // resource name
      if (err != 0) {
        throw new KafkaError("DescribeConfigs of topic " + topic + " on " + address()
            + " failed" + (message == null ? "" : ": " + message), err);
      }
      for (int c = bb.getInt(); c > 0; c--) {
        String n = readString(bb);
        String v = readString(bb);
        bb.get(); // read only
        bb.get(); // source
        bb.get(); // sensitive
        for (int y = bb.getInt(); y > 0; y--) { // synonyms (none asked for)
          readString(bb);
          readString(bb);
          bb.get();
        }
        if (name.equals(n)) {
          value = v;
        }
      }
    }
    return value;
  }

  // -- ListOffsets -----------------------------------------------------------------------------

  /**
   * For each partition {error code, offset}: the first offset whose timestamp is at or after
   * {@code timestamp} (-1 when there is none), or the earliest/latest offset for
   * {@link #EARLIEST}/{@link #LATEST}; with {@code readCommitted}, latest is the last stable
   * offset.
   */
  Map<Integer, long[]> listOffsets(String topic, List<Integer> partitions, long timestamp,
      boolean readCommitted) throws IOException {
    Body req = header(LIST_OFFSETS, LIST_OFFSETS_V);
    req.w.writeInt(-1); // replica id: a consumer
    req.w.writeByte(readCommitted ? 1 : 0);
    req.w.writeInt(1);
    req.string(topic);
    req.w.writeInt(partitions.size());
    for (int p : partitions) {
      req.w.writeInt(p);
      req.w.writeLong(timestamp);
    }
    ByteBuffer bb = call(req);
    bb.getInt(); // throttle
    Map<Integer, long[]> result = new LinkedHashMap<>();
    for (int i = bb.getInt(); i > 0; i--) {
      readString(bb);
      for (int j = bb.getInt(); j > 0; j--) {
        int p = bb.getInt();
        short err = bb.getShort();
        bb.getLong(); // timestamp
        result.put(p, new long[] {err, bb.getLong()});
      }
    }
    return result;
  }

  // -- Fetch -----------------------------------------------------------------------------------

  /** One partition's part of a Fetch answer; the records are {@code [start, end)} of array. */
  static final class FetchedPartition {
    short error;
    long highWatermark;
    long lastStableOffset;
    long logStartOffset;
    long[] aborted = new long[0]; // (producer id, first offset) pairs: read_committed answers
    // A split child's order marks (SplitTree), v12+ answers only: (batch base offset, parent's
    // next offset when that batch was appended) pairs, by base offset; null when none came.
    long[] marks;
    byte[] array;
    // The connection and request that read the array: a later request on it overwrites it.
    KafkaWire wire;
    int call;
    int start;
    int end;
  }

  /**
   * Fetches one partition from {@code offset}; the answer is valid until the next call. With
   * {@code readCommitted} it ends at the last stable offset and lists aborted transactions.
   */
  FetchedPartition fetch(String topic, int partition, long offset, int maxBytes, int maxWaitMs,
      boolean readCommitted) throws IOException {
    Body req = header(FETCH, FETCH_V);
    req.w.writeInt(-1); // replica id
    req.w.writeInt(maxWaitMs);
    req.w.writeInt(1); // min bytes
    req.w.writeInt(maxBytes);
    req.w.writeByte(readCommitted ? 1 : 0);
    req.w.writeInt(1);
    req.string(topic);
    req.w.writeInt(1);
    req.w.writeInt(partition);
    req.w.writeLong(offset);
    req.w.writeLong(-1L); // log start offset: a consumer's is unknown
    req.w.writeInt(maxBytes);
    ByteBuffer bb = call(req);
    bb.getInt(); // throttle
    FetchedPartition fp = new FetchedPartition();
    fp.array = frame;
    for (int i = bb.getInt(); i > 0; i--) {
      readString(bb);
      for (int j = bb.getInt(); j > 0; j--) {
        bb.getInt(); // partition
        fp.error = bb.getShort();
        fp.highWatermark = bb.getLong();
        fp.lastStableOffset = bb.getLong();
        fp.logStartOffset = bb.getLong();
        int aborted = bb.getInt();
        fp.aborted = new long[2 * Math.max(aborted, 0)];
        for (int k = 0; k < fp.aborted.length; k++) {
          fp.aborted[k] = bb.getLong();
        }
        int size = bb.getInt();
        fp.start = bb.position();
        fp.end = fp.start + Math.max(size, 0);
        bb.position(fp.end);
      }
    }
    return fp;
  }

  /**
   * One Fetch (v12, flexible) of several partitions of a topic, each from its offset, up to
   * {@code partitionMaxBytes} each and {@code maxBytes} in all (the broker fills the partitions
   * in the order asked); partition -> answer, valid until the next call. Unlike {@link #fetch}
   * the answers carry a split child's order marks ({@link SplitTree#ORDER_TAG}).
   */
  Map<Integer, FetchedPartition> fetchFamily(String topic, Map<Integer, Long> offsets,
      int partitionMaxBytes, int maxBytes, int maxWaitMs, boolean readCommitted)
      throws IOException {
    Body req = flexibleHeader(FETCH, FETCH_FLEX_V);
    req.w.writeInt(-1); // replica id
    req.w.writeInt(maxWaitMs);
    req.w.writeInt(1); // min bytes
    req.w.writeInt(maxBytes);
    req.w.writeByte(readCommitted ? 1 : 0);
    req.w.writeInt(0); // session id
    req.w.writeInt(-1); // session epoch: a full fetch, no session
    writeUvarint(req.w, 2); // topics: one
    compactString(req.w, topic);
    writeUvarint(req.w, offsets.size() + 1);
    for (Map.Entry<Integer, Long> p : offsets.entrySet()) {
      req.w.writeInt(p.getKey());
      req.w.writeInt(-1); // current leader epoch: not known
      req.w.writeLong(p.getValue());
      req.w.writeInt(-1); // last fetched epoch
      req.w.writeLong(-1L); // log start offset: a consumer's is unknown
      req.w.writeInt(partitionMaxBytes);
      req.w.writeByte(0); // tags
    }
    req.w.writeByte(0); // topic tags
    writeUvarint(req.w, 1); // forgotten topics: none
    writeUvarint(req.w, 1); // rack id: ""
    req.w.writeByte(0); // tags
    ByteBuffer bb = call(req);
    skipTags(bb); // response header v1
    bb.getInt(); // throttle
    short err = bb.getShort();
    if (err != 0) {
      throw new KafkaError("Fetch of " + topic + " from " + address() + " failed", err);
    }
    bb.getInt(); // session id
    Map<Integer, FetchedPartition> out = new LinkedHashMap<>();
    for (int i = readCompactLength(bb); i > 0; i--) {
      int name = Math.max(readCompactLength(bb), 0); // the topic's name, skipped
      bb.position(bb.position() + name);
      for (int j = readCompactLength(bb); j > 0; j--) {
        FetchedPartition fp = new FetchedPartition();
        fp.array = frame;
        fp.wire = this;
        fp.call = correlation;
        int partition = bb.getInt();
        fp.error = bb.getShort();
        fp.highWatermark = bb.getLong();
        fp.lastStableOffset = bb.getLong();
        fp.logStartOffset = bb.getLong();
        int aborted = readCompactLength(bb);
        fp.aborted = new long[2 * Math.max(aborted, 0)];
        for (int k = 0; k < fp.aborted.length; k += 2) {
          fp.aborted[k] = bb.getLong();
          fp.aborted[k + 1] = bb.getLong();
          skipTags(bb);
        }
        bb.getInt(); // preferred read replica
        int size = readCompactLength(bb);
        fp.start = bb.position();
        fp.end = fp.start + Math.max(size, 0);
        bb.position(fp.end);
        for (int t = readUvarint(bb); t > 0; t--) {
          int tag = readUvarint(bb);
          int length = readUvarint(bb);
          int at = bb.position();
          if (tag == SplitTree.ORDER_TAG) {
            fp.marks = marks(bb, length, topic + "-" + partition);
          }
          bb.position(at + length);
        }
        out.put(partition, fp);
      }
      skipTags(bb); // topic's
    }
    skipTags(bb);
    return out;
  }

  /** Whether {@code fp}'s records are still there: no request on its connection since. */
  static boolean current(FetchedPartition fp) {
    return fp.wire == null || fp.wire.correlation == fp.call;
  }

  /** Order marks: an int32 count, then (int64 base offset, int64 parent offset) pairs. */
  private static long[] marks(ByteBuffer bb, int length, String where) throws IOException {
    int n = length >= 4 ? bb.getInt() : -1;
    if (n < 0 || 4 + 16L * n != length) {
      throw new IOException("the order marks of " + where + " (" + length
          + " bytes) are malformed");
    }
    long[] out = new long[2 * n];
    for (int k = 0; k < out.length; k++) {
      out[k] = bb.getLong();
    }
    return out;
  }

  /**
   * Produces one record batch to one partition with acks=all; returns the error code and the
   * base offset (-1 for a batch the broker already had: a duplicate).
   */
  long[] produce(String topic, int partition, byte[] batch, int timeoutMs) throws IOException {
    Body req = header(PRODUCE, PRODUCE_V);
    req.w.writeShort(-1); // no transactional id
    req.w.writeShort(-1); // acks=all
    req.w.writeInt(timeoutMs);
    req.w.writeInt(1);
    req.string(topic);
    req.w.writeInt(1);
    req.w.writeInt(partition);
    req.w.writeInt(batch.length);
    req.w.write(batch);
    ByteBuffer bb = call(req);
    long[] result = {-1, -1};
    for (int i = bb.getInt(); i > 0; i--) {
      readString(bb);
      for (int j = bb.getInt(); j > 0; j--) {
        bb.getInt(); // partition
        result[0] = bb.getShort();
        result[1] = bb.getLong();
        bb.getLong(); // log append time
        bb.getLong(); // log start offset
      }
    }
    return result;
  }

  /** An error code in a broker's answer. */
  static final class KafkaError extends IOException {
    private static final long serialVersionUID = 1L;
    final short code;

    KafkaError(String message, short code) {
      super(message + " (Kafka error " + code + ")");
      this.code = code;
    }
  }

  static List<Integer> range(int n) {
    List<Integer> out = new ArrayList<>(n);
    for (int i = 0; i < n; i++) {
      out.add(i);
    }
    return out;
  }
}
