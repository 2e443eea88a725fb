package io.stratalog.spark;

import java.io.Closeable;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.ToIntFunction;

/**
 * Who leads each partition and where each broker listens, as the last Metadata answer said, and
 * one connection per broker. ListOffsets, Fetch and Produce go to the partition's leader; an
 * answer that says the leadership moved, or a leader's connection that fails while other brokers
 * are known, makes it forget that leader, ask Metadata again and resend: at once, then backing
 * off from 50 ms to 1 s, for up to {@link #LEADER_WAIT_MS} (above a lease, 3 s, plus the
 * controller's reaction). A partition whose leader is not known yet goes to the broker it is
 * connected to: a single node leads everything, so there it stays one connection and never asks
 * Metadata for routing. The Python client's {@code client/leaders.py} and {@code wire.py} do the
 * same. Not thread-safe: one per task or planner.
 */
final class LeaderMap implements Closeable {
  static final int LEADER_WAIT_MS = 30_000;
  // Answers that mean "ask the new leader": nothing was written or read by the one answering.
  private static final Set<Integer> LEADER_MOVED = Set.of(
      5, // LEADER_NOT_AVAILABLE
      6, // NOT_LEADER_OR_FOLLOWER
      74, // FENCED_LEADER_EPOCH
      75); // UNKNOWN_LEADER_EPOCH

  private final List<String> bootstrap;
  private final int timeoutMs;
  private final WireSecurity security;
  private final Map<String, KafkaWire> connections = new HashMap<>(); // by "host:port"
  private Map<Integer, String> brokers = new HashMap<>(); // node id -> "host:port"
  private final Map<String, Integer> leaders = new HashMap<>(); // "topic\0partition" -> node
  // The connection for Metadata and for partitions of unknown leader: the first bootstrap
  // address that answered. With one broker in the cluster, everything goes over it.
  private KafkaWire home;

  /** Connects to the first of the bootstrap addresses that answers. */
  LeaderMap(String bootstrap, int timeoutMs) throws IOException {
    this(bootstrap, timeoutMs, WireSecurity.PLAINTEXT);
  }

  /** The same, over TLS and SASL as {@code security} says. */
  LeaderMap(String bootstrap, int timeoutMs, WireSecurity security) throws IOException {
    this.bootstrap = KafkaWire.addresses(bootstrap);
    this.timeoutMs = timeoutMs;
    this.security = security;
    home();
  }

  /** The broker the map is connected to, for messages. */
  String address() {
    return home != null ? home.address() : String.join(",", bootstrap);
  }

  /**
   * "host:port" of the partition's leader as last learned, or null when not known or when the
   * cluster is one broker (the address the client was given is then the one to use).
   */
  String leaderAddress(String topic, int partition) {
    if (brokers.size() < 2) {
      return null;
    }
    Integer node = leaders.get(key(topic, partition));
    return node == null ? null : brokers.get(node);
  }

  private static String key(String topic, int partition) {
    return topic + "\u0000" + partition;
  }

  @Override
  public void close() throws IOException {
    for (KafkaWire c : connections.values()) {
      c.close();
    }
    connections.clear();
    home = null;
  }

  // -- connections ---------------------------------------------------------------------------

  /** The connection in use, else the bootstrap addresses in order, then the brokers known. */
  private KafkaWire home() throws IOException {
    if (home != null) {
      return home;
    }
    Set<String> candidates = new LinkedHashSet<>(bootstrap);
    candidates.addAll(brokers.values());
    List<String> problems = new ArrayList<>();
    IOException first = null;
    for (String addr : candidates) {
      try {
        home = connection(addr);
        return home;
      } catch (IOException e) {
        first = first == null ? e : first;
        problems.add(addr + ": " + e);
      }
    }
    if (problems.size() == 1) {
      throw first;
    }
    throw new IOException("no broker answered: " + String.join("; ", problems), first);
  }

  private KafkaWire connection(String addr) throws IOException {
    KafkaWire c = connections.get(addr);
    if (c == null) {
      c = KafkaWire.open(addr, timeoutMs, security);
      connections.put(addr, c);
    }
    return c;
  }

  /** The leader's connection; with one broker (or none known) the one in use. */
  private KafkaWire connection(Integer node) throws IOException {
    String addr = node == null ? null : brokers.get(node);
    if (addr == null || brokers.size() < 2) {
      return home();
    }
    return connection(addr);
  }

  /** A connection failed: close it, and forget what its broker led. */
  private void lost(KafkaWire c, Integer node) {
    try {
      c.close();
    } catch (IOException ignored) {
      // already broken
    }
    connections.values().remove(c);
    if (c == home) {
      home = null;
    }
    if (node != null) {
      leaders.values().removeIf(node::equals);
    }
  }

  /**
   * Whether another broker may take over a lost one's partitions: a lost connection to the only
   * broker (given one address, told of one broker) is an error at once, as it always was.
   */
  private boolean severalBrokers() {
    return brokers.size() > 1 || bootstrap.size() > 1;
  }

  private interface Call<T> {
    T run(KafkaWire wire) throws IOException;
  }

  /** One request to any broker; another one if its connection fails in a cluster. */
  private <T> T onAnyBroker(Call<T> call) throws IOException {
    KafkaWire c = home();
    try {
      return call.run(c);
    } catch (KafkaWire.KafkaError e) {
      throw e;
    } catch (IOException e) {
      lost(c, null);
      if (!severalBrokers()) {
        throw e;
      }
    }
    return call.run(home());
  }

  // -- requests --------------------------------------------------------------------------------

  /** Metadata (see {@link KafkaWire#metadata}), learning the brokers and leaders from it. */
  Map<String, KafkaWire.TopicMeta> metadata(List<String> topics, boolean allowAutoCreate)
      throws IOException {
    return refresh(topics, allowAutoCreate).topics;
  }

  private KafkaWire.Metadata refresh(List<String> topics, boolean allowAutoCreate)
      throws IOException {
    KafkaWire.Metadata md = onAnyBroker(w -> w.metadata(topics, allowAutoCreate));
    brokers = md.brokers; // a broker no longer listed is gone
    for (KafkaWire.TopicMeta tm : md.topics.values()) {
      if (tm.error != 0) {
        continue;
      }
      for (Map.Entry<Integer, Integer> p : tm.leaders.entrySet()) {
        String tp = key(tm.name, p.getKey());
        if (p.getValue() >= 0) {
          leaders.put(tp, p.getValue());
        } else {
          leaders.remove(tp);
        }
      }
    }
    return md;
  }

  Map<String, KafkaWire.TopicMeta> metadata(List<String> topics) throws IOException {
    return metadata(topics, false);
  }

  /**
   * Where the partition's leader keeps it: {cluster id, the leader's node id, the leader's log
   * directory holding it} from Metadata and the leader's DescribeLogDirs, or null when the
   * leader is not known or does not say (an old broker, an error, no such partition). A lost
   * connection is forgotten (the next request makes another), not thrown.
   */
  LogDir leaderLogDir(String topic, int partition) throws IOException {
    KafkaWire.Metadata md = refresh(List.of(topic), false);
    Integer node = leaders.get(key(topic, partition));
    if (node == null || node < 0) {
      return null;
    }
    KafkaWire c = connection(node);
    String dir;
    try {
      dir = c.logDirOf(topic, partition);
    } catch (KafkaWire.KafkaError | WireSecurity.Refused e) {
      return null;
    } catch (IOException e) {
      lost(c, node); // a broker that closed the connection on an unknown request, say
      return null;
    }
    return dir == null ? null : new LogDir(md.clusterId, node, dir);
  }

  /** See {@link #leaderLogDir}. */
  static final class LogDir {
    final String clusterId; // null when Metadata does not name the cluster
    final int node;
    final String path;

    LogDir(String clusterId, int node, String path) {
      this.clusterId = clusterId;
      this.node = node;
      this.path = path;
    }
  }

  /** The API keys a broker serves. */
  Set<Short> apiKeys() throws IOException {
    return onAnyBroker(KafkaWire::apiKeys);
  }

  /** See {@link KafkaWire#listOffsets}; each partition asked of its leader. */
  Map<Integer, Long> listOffsets(String topic, List<Integer> partitions, long timestamp)
      throws IOException {
    return listOffsets(topic, partitions, timestamp, false);
  }

  /** The same, latest being the last stable offset with {@code readCommitted}. */
  Map<Integer, Long> listOffsets(String topic, List<Integer> partitions, long timestamp,
      boolean readCommitted) throws IOException {
    Map<Integer, long[]> got = toLeaders(topic, partitions,
        (w, ps) -> w.listOffsets(topic, ps, timestamp, readCommitted), a -> (int) a[0]);
    Map<Integer, Long> out = new LinkedHashMap<>();
    for (Map.Entry<Integer, long[]> p : got.entrySet()) {
      if (p.getValue()[0] != 0) {
        throw new KafkaWire.KafkaError("ListOffsets of " + topic + "-" + p.getKey() + " on "
            + address() + " failed", (short) p.getValue()[0]);
      }
      out.put(p.getKey(), p.getValue()[1]);
    }
    return out;
  }

  /** See {@link KafkaWire#fetch}: from the partition's leader. */
  KafkaWire.FetchedPartition fetch(String topic, int partition, long offset, int maxBytes,
      int maxWaitMs, boolean readCommitted) throws IOException {
    return toLeaders(topic, List.of(partition),
        (w, ps) -> Map.of(partition,
            w.fetch(topic, partition, offset, maxBytes, maxWaitMs, readCommitted)),
        fp -> fp.error).get(partition);
  }

  /**
   * See {@link KafkaWire#fetchFamily}: each partition from its leader, in the order of
   * {@code offsets}. A leader that moved meanwhile makes a second request on a connection whose
   * frame holds earlier answers: then the whole fetch is made again, to the leaders now known.
   */
  Map<Integer, KafkaWire.FetchedPartition> fetchFamily(String topic, Map<Integer, Long> offsets,
      int partitionMaxBytes, int maxBytes, int maxWaitMs, boolean readCommitted)
      throws IOException {
    for (int attempt = 0; ; attempt++) {
      Map<Integer, KafkaWire.FetchedPartition> got = toLeaders(topic,
          new ArrayList<>(offsets.keySet()), (w, ps) -> {
            Map<Integer, Long> mine = new LinkedHashMap<>();
            ps.forEach(p -> mine.put(p, offsets.get(p)));
            return w.fetchFamily(topic, mine, partitionMaxBytes, maxBytes, maxWaitMs,
                readCommitted);
          }, fp -> fp.error);
      if (got.values().stream().allMatch(KafkaWire::current)) {
        return got;
      }
      if (attempt >= 5) {
        throw new IOException("the leaders of " + topic + " kept moving during a fetch");
      }
    }
  }

  /** See {@link KafkaWire#topicConfig}: asked of any broker. */
  String topicConfig(String topic, String name) throws IOException {
    return onAnyBroker(w -> w.topicConfig(topic, name));
  }

  /** See {@link KafkaWire#produce}: to the partition's leader. */
  long[] produce(String topic, int partition, byte[] batch, int timeoutMs) throws IOException {
    return toLeaders(topic, List.of(partition),
        (w, ps) -> Map.of(partition, w.produce(topic, partition, batch, timeoutMs)),
        a -> (int) a[0]).get(partition);
  }

  private interface Send<T> {
    Map<Integer, T> to(KafkaWire leader, List<Integer> partitions) throws IOException;
  }

  /**
   * Partition -> its leader's answer to {@code send}. Partitions whose answer says the leader
   * moved, or whose leader's connection failed, are sent again after a Metadata refresh (at
   * once, then with a backoff) until {@link #LEADER_WAIT_MS} is spent; then their last answer
   * is returned (or the connection's failure thrown).
   */
  private <T> Map<Integer, T> toLeaders(String topic, List<Integer> partitions, Send<T> send,
      ToIntFunction<T> errorOf) throws IOException {
    Map<Integer, T> out = new HashMap<>();
    List<Integer> todo = partitions;
    long deadline = 0;
    long delay = 50;
    for (int round = 0; ; round++) {
      List<Integer> moved = new ArrayList<>();
      Map<Integer, T> last = new HashMap<>();
      IOException lost = null;
      Map<Integer, List<Integer>> routes = new LinkedHashMap<>();
      try {
        // The first round sends partitions of unknown leader to the broker in use: a single
        // node leads them all; in a cluster a wrong guess costs one NOT_LEADER answer.
        if (round > 0 && todo.stream().anyMatch(p -> !leaders.containsKey(key(topic, p)))) {
          metadata(List.of(topic));
        }
        for (int p : todo) {
          routes.computeIfAbsent(leaders.get(key(topic, p)), k -> new ArrayList<>()).add(p);
        }
      } catch (KafkaWire.KafkaError | WireSecurity.Refused e) {
        throw e;
      } catch (IOException e) {
        routes.clear();
        lost = e;
        moved.addAll(todo);
      }
      for (Map.Entry<Integer, List<Integer>> r : routes.entrySet()) {
        KafkaWire c = null;
        Map<Integer, T> got;
        try {
          c = connection(r.getKey());
          got = send.to(c, r.getValue());
        } catch (KafkaWire.KafkaError | WireSecurity.Refused e) {
          throw e; // an answer, or security that cannot work: not a lost broker
        } catch (IOException e) {
          if (c != null) {
            lost(c, r.getKey());
          } else if (r.getKey() != null) {
            leaders.values().removeIf(r.getKey()::equals); // its broker refuses connections
          }
          lost = e;
          moved.addAll(r.getValue());
          continue;
        }
        for (int p : r.getValue()) {
          T a = got.get(p);
          if (a != null && LEADER_MOVED.contains(errorOf.applyAsInt(a))) {
            leaders.remove(key(topic, p));
            moved.add(p);
            last.put(p, a);
          } else if (a != null) {
            out.put(p, a);
          }
        }
      }
      if (moved.isEmpty()) {
        return out;
      }
      if (lost != null && !severalBrokers()) {
        throw lost;
      }
      todo = moved;
      if (round == 0) {
        continue; // at once: the first answer may only say the guess was wrong
      }
      long now = System.currentTimeMillis();
      if (deadline == 0) {
        deadline = now + LEADER_WAIT_MS;
      }
      if (now >= deadline) {
        for (int p : moved) {
          if (!last.containsKey(p)) {
            throw lost;
          }
          out.put(p, last.get(p));
        }
        return out;
      }
      try {
        Thread.sleep(Math.min(delay, deadline - now));
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted while waiting for the leaders of " + topic, e);
      }
      delay = Math.min(delay * 2, 1000);
    }
  }
}
