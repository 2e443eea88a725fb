package io.stratalog.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.Closeable;
import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.TreeMap;

/**
 * Co-located reads: one partition of a broker on this host, read from the broker's segment
 * files instead of through Fetch (docs/architecture.md, "Co-located reads"; the Java
 * counterpart of {@code client/colocated.py}, whose formats are {@code colocated_format.py}).
 *
 * <p>{@link #find} asks the leader where its files are (Metadata for the cluster id and the
 * leader's node id, DescribeLogDirs to the leader for its hot tier's directory), checks that
 * directory's {@code slots/identity.json} names the same cluster and node, then maps the
 * partition's read slot ({@code slots/<topic>/<partition>.slot}) read-only. The slot, copied
 * between two equal, even readings of its sequence counter (a seqlock), gives the high
 * watermark, the log start, the first offset still in the hot tier, the partition's log and
 * where its last chunk below the high watermark ends in that log ({@code end_seq, end_pos}).
 *
 * <p>The reader indexes the partition's batches from the segments' {@code .idx} entries and,
 * past the last entry, by walking the frames up to that end: every frame before it is whole.
 * It reads batches with positional reads, a run of them back to back in the file at once, and
 * copies them into one array without the 8-byte frame headers between them, so an answer is a
 * run of batches like a Fetch answer's records; each is checked against the index (base offset,
 * length). A segment deleted or cut meanwhile shows as a mismatch or a short read: the index is
 * forgotten and {@link #read} answers null, and the caller fetches. So do the cold tier,
 * offsets past a stale slot, a partition led elsewhere and a damaged one.
 *
 * <p>Segment files are never mapped: the broker's reaper cuts a deleted segment down in steps,
 * and a mapped page past the new end would kill the JVM (SIGBUS, an InternalError). Only the
 * slot is mapped, a file the broker never shortens. Not thread-safe: one per task.
 */
final class ColocatedPartition implements Closeable {
  // colocated_format.py: the slot "<4sHHQIiQqqqqq32s" in 128 bytes, its counter at byte 8.
  static final String SLOTS_DIR = "slots";
  static final String IDENTITY_FILE = "identity.json";
  private static final int SLOT_SIZE = 128;
  private static final int SLOT_FIELDS = 104;
  private static final int COUNTER_AT = 8;
  private static final byte[] SLOT_MAGIC = "SLOT".getBytes(StandardCharsets.US_ASCII);
  private static final int SLOT_VERSION = 1;
  private static final int READABLE = 1; // this broker leads the partition, the slot is current
  private static final int DAMAGED = 2; // the partition lost ranges: read them through Fetch
  // A segment's frame header "<II" (partition uid, CRC) and .idx entry "<Iqiqiqqhi".
  private static final int FRAME_SIZE = 8;
  private static final int ENTRY_SIZE = 50;
  private static final int HEAD = FRAME_SIZE + 27; // a frame header and a batch's first 27 bytes
  private static final int MIN_LENGTH = 49; // a batch's length field is at least this
  private static final int SCAN_BLOCK = 1 << 20;
  private static final int MAX_RUN = 4 << 20; // bytes of one positional read, but whole batches
  private static final VarHandle LONGS =
      MethodHandles.byteBufferViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  private static final ObjectMapper JSON = new ObjectMapper();

  /** A slot's fields. */
  static final class SlotState {
    int flags;
    int uid;
    int partition;
    long incarnation; // the broker's storage open: a new one means cached positions are stale
    long highWatermark;
    long logStart;
    long hotStart; // the first offset in the hot tier's segments
    long endSeq; // -1: no chunk below the high watermark in the hot tier
    long endPos;
    String log; // the partition's log directory, under the hot tier

    boolean readable() {
      return (flags & READABLE) != 0 && (flags & DAMAGED) == 0;
    }
  }

  /** What the reader knows of one segment: its batches of this partition, in offset order. */
  private static final class Segment {
    long[] base = new long[16];
    long[] last = new long[16];
    long[] pos = new long[16]; // of the batch, after its frame header
    int[] size = new int[16];
    int n;
    long idxRead; // bytes of .idx taken
    long scanned; // the position up to which every frame is known
    boolean whole; // a segment before the slot's end: known to its end
    FileChannel channel;

    void add(long b, long l, long p, int s) {
      if (n == base.length) {
        base = Arrays.copyOf(base, 2 * n);
        last = Arrays.copyOf(last, 2 * n);
        pos = Arrays.copyOf(pos, 2 * n);
        size = Arrays.copyOf(size, 2 * n);
      }
      base[n] = b;
      last[n] = l;
      pos[n] = p;
      size[n] = s;
      n++;
    }

    /** The first batch whose last offset is at or past {@code offset} (n if none). */
    int holding(long offset) {
      int lo = 0;
      int hi = n;
      while (lo < hi) {
        int mid = (lo + hi) >>> 1;
        if (last[mid] < offset) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      return lo;
    }

    void close() {
      if (channel != null) {
        try {
          channel.close();
        } catch (IOException ignored) {
          // read-only: nothing to lose
        }
        channel = null;
      }
    }
  }

  private final Path root;
  private final String topic;
  private final int partition;
  private final Path slotPath;
  private MappedByteBuffer slot; // unmapped by the garbage collector once dropped
  private Object slotKey; // the slot file's (device, inode) when mapped
  private final byte[] copy = new byte[SLOT_FIELDS];
  // Whose positions the segments hold: (incarnation, uid, log); none after forget().
  private boolean keyed;
  private long incarnation;
  private int uid;
  private String log;
  private final TreeMap<Long, Segment> segments = new TreeMap<>();
  // (log start, hot start) when gone segments were last looked for.
  private long lookedAtLogStart = -1;
  private long lookedAtHotStart = -1;
  private ByteBuffer scanBuffer;
  private ByteBuffer runBuffer;
  private byte[] out = new byte[0];
  // The read being planned: (segment, first batch, count) per segment.
  private final List<Segment> planSegments = new ArrayList<>();
  private final List<int[]> planBatches = new ArrayList<>();

  ColocatedPartition(Path root, String topic, int partition) throws IOException {
    this.root = root;
    this.topic = topic;
    this.partition = partition;
    this.slotPath = root.resolve(SLOTS_DIR).resolve(topic).resolve(partition + ".slot");
    mapSlot(); // AccessDeniedException: not this user
  }

  /**
   * The partition read from its leader's files, if the leader runs on this host and this user
   * may read them; null otherwise (read it through Fetch).
   */
  static ColocatedPartition find(LeaderMap wire, String topic, int partition) {
    try {
      LeaderMap.LogDir where = wire.leaderLogDir(topic, partition);
      if (where == null || where.clusterId == null) {
        return null;
      }
      Path root = Paths.get(where.path);
      JsonNode identity =
          JSON.readTree(Files.readAllBytes(root.resolve(SLOTS_DIR).resolve(IDENTITY_FILE)));
      JsonNode cluster = identity == null ? null : identity.get("cluster_id");
      JsonNode node = identity == null ? null : identity.get("node_id");
      if (cluster == null || !where.clusterId.equals(cluster.textValue())
          || node == null || !node.isIntegralNumber() || node.asLong() != where.node) {
        return null; // a path of the same name, of another broker
      }
      return new ColocatedPartition(root, topic, partition);
    } catch (IOException | RuntimeException e) {
      return null; // not on this host, not readable by this user, no slot, an old broker
    }
  }

  @Override
  public void close() {
    forget();
    slot = null;
  }

  // -- the slot --------------------------------------------------------------------------------

  private void mapSlot() throws IOException {
    // The key first: should the file be replaced before it is opened, the next look finds a
    // key that differs and maps the new one again.
    Object key = Files.readAttributes(slotPath, BasicFileAttributes.class).fileKey();
    try (FileChannel ch = FileChannel.open(slotPath, StandardOpenOption.READ)) {
      // READ_ONLY past the file's end is refused (IOException), not mapped.
      MappedByteBuffer m = ch.map(FileChannel.MapMode.READ_ONLY, 0, SLOT_SIZE);
      m.order(ByteOrder.LITTLE_ENDIAN);
      slot = m;
      slotKey = key;
    }
  }

  /**
   * The slot's fields, copied between two equal, even counter readings; null if the broker
   * stopped publishing it (or never finishes a write).
   */
  SlotState state() {
    MappedByteBuffer m = slot;
    if (m == null) {
      return null;
    }
    for (int tries = 0; tries < 1000; tries++) {
      long before = (long) LONGS.getAcquire(m, COUNTER_AT);
      if ((before & 1) != 0) {
        Thread.onSpinWait();
        continue;
      }
      m.get(0, copy, 0, SLOT_FIELDS);
      VarHandle.acquireFence(); // the copy's loads before the second reading
      if ((long) LONGS.getAcquire(m, COUNTER_AT) == before) {
        return parse(copy);
      }
    }
    return null; // a writer that never finishes: read through Fetch
  }

  private static SlotState parse(byte[] raw) {
    ByteBuffer b = ByteBuffer.wrap(raw).order(ByteOrder.LITTLE_ENDIAN);
    if (!Arrays.equals(raw, 0, 4, SLOT_MAGIC, 0, 4) || (b.getShort(4) & 0xffff) != SLOT_VERSION) {
      return null; // not a version 1 read slot
    }
    SlotState s = new SlotState();
    s.flags = b.getShort(6) & 0xffff;
    s.uid = b.getInt(16);
    s.partition = b.getInt(20);
    s.incarnation = b.getLong(24);
    s.highWatermark = b.getLong(32);
    s.logStart = b.getLong(40);
    s.hotStart = b.getLong(48);
    s.endSeq = b.getLong(56);
    s.endPos = b.getLong(64);
    int n = 0;
    while (n < 32 && raw[72 + n] != 0) {
      n++;
    }
    s.log = new String(raw, 72, n, StandardCharsets.UTF_8);
    return s;
  }

  /** Whether the slot file is a new one (a restarted broker's), mapped if so. */
  private boolean replaced() {
    try {
      Object key = Files.readAttributes(slotPath, BasicFileAttributes.class).fileKey();
      if (Objects.equals(key, slotKey)) {
        return false;
      }
      mapSlot();
    } catch (IOException e) {
      return false;
    }
    forget();
    return true;
  }

  // -- reading ---------------------------------------------------------------------------------

  /**
   * Whole batches from the one holding {@code offset}, at least one, about {@code maxBytes},
   * all below the high watermark, as a Fetch answer (valid until the next read); an empty one
   * at or past the high watermark. Null: not readable here (fetch it).
   */
  KafkaWire.FetchedPartition read(long offset, int maxBytes) {
    KafkaWire.FetchedPartition got = readSlot(offset, maxBytes);
    if ((got == null || got.end == got.start) && replaced()) {
      got = readSlot(offset, maxBytes); // the broker restarted: its new slot
    }
    return got;
  }

  private KafkaWire.FetchedPartition readSlot(long offset, int maxBytes) {
    SlotState s = state();
    if (s == null || !s.readable() || s.partition != partition) {
      return null;
    }
    if (offset < s.logStart || offset < s.hotStart) {
      return null; // out of range, or in the cold tier: Fetch answers
    }
    if (offset >= s.highWatermark) {
      return answer(s, 0);
    }
    if (!keyed || s.incarnation != incarnation || s.uid != uid || !s.log.equals(log)) {
      forget();
      keyed = true;
      incarnation = s.incarnation;
      uid = s.uid;
      log = s.log;
    }
    KafkaWire.FetchedPartition got;
    try {
      learn(s);
      got = read(offset, maxBytes, s);
    } catch (IOException | RuntimeException e) {
      got = null; // a segment gone or cut, bytes that are not frames: Fetch knows
    }
    if (got == null) {
      forget(); // something moved under the index: learn it again next time
    }
    return got;
  }

  private KafkaWire.FetchedPartition answer(SlotState s, int end) {
    KafkaWire.FetchedPartition fp = new KafkaWire.FetchedPartition();
    fp.highWatermark = s.highWatermark;
    fp.lastStableOffset = -1; // not known here; read_committed always fetches
    fp.logStartOffset = s.logStart;
    fp.array = out;
    fp.start = 0;
    fp.end = end;
    return fp;
  }

  private void forget() {
    for (Segment seg : segments.values()) {
      seg.close();
    }
    segments.clear();
    keyed = false;
  }

  private static String segmentName(long seq) {
    return String.format("%020d", seq);
  }

  private static FileChannel channel(long seq, Segment seg, Path dir) throws IOException {
    if (seg.channel == null) {
      seg.channel = FileChannel.open(dir.resolve(segmentName(seq) + ".log"),
          StandardOpenOption.READ);
    }
    return seg.channel;
  }

  /** Index the partition's batches up to (end_seq, end_pos). */
  private void learn(SlotState s) throws IOException {
    if (s.endSeq < 0) {
      return;
    }
    Path dir = root.resolve(s.log);
    boolean endKnown = segments.containsKey(s.endSeq);
    if (!endKnown) {
      try (DirectoryStream<Path> files = Files.newDirectoryStream(dir, "*.log")) {
        for (Path f : files) {
          String name = f.getFileName().toString();
          String stem = name.substring(0, name.length() - 4);
          if (stem.isEmpty() || stem.length() > 20 || !stem.chars().allMatch(Character::isDigit)) {
            continue;
          }
          long seq;
          try {
            seq = Long.parseLong(stem);
          } catch (NumberFormatException e) {
            continue;
          }
          if (seq <= s.endSeq && !segments.containsKey(seq)) {
            segments.put(seq, new Segment());
          }
        }
      }
    }
    if (!endKnown || s.logStart != lookedAtLogStart || s.hotStart != lookedAtHotStart) {
      // Segments gone (retention, migration) go out of the way of later lookups, and their
      // channels are closed: an open one would keep a deleted file's space.
      lookedAtLogStart = s.logStart;
      lookedAtHotStart = s.hotStart;
      Iterator<Map.Entry<Long, Segment>> it = segments.entrySet().iterator();
      while (it.hasNext()) {
        Map.Entry<Long, Segment> e = it.next();
        if (!Files.exists(dir.resolve(segmentName(e.getKey()) + ".log"))) {
          e.getValue().close();
          it.remove();
        }
      }
    }
    for (Map.Entry<Long, Segment> e : segments.headMap(s.endSeq, true).entrySet()) {
      long seq = e.getKey();
      Segment seg = e.getValue();
      if (seg.whole) {
        continue;
      }
      // Before the end's segment every frame is whole, to its end; in it, to end_pos.
      boolean sealed = seq < s.endSeq;
      long limit = sealed ? channel(seq, seg, dir).size() : s.endPos;
      if (seg.scanned < limit) {
        fromIndex(seg, seq, dir, limit, s.uid);
        scan(seg, seq, dir, limit, s.uid, sealed);
      }
      seg.whole = sealed;
    }
  }

  /** The entries of the segment's .idx not taken yet, while they continue the known frames. */
  private static void fromIndex(Segment seg, long seq, Path dir, long limit, int uid)
      throws IOException {
    ByteBuffer raw;
    try (FileChannel idx = FileChannel.open(dir.resolve(segmentName(seq) + ".idx"),
        StandardOpenOption.READ)) {
      long left = idx.size() - seg.idxRead;
      if (left < ENTRY_SIZE) {
        return;
      }
      raw = ByteBuffer.allocate((int) Math.min(left - left % ENTRY_SIZE, 1L << 30));
      readFully(idx, raw, seg.idxRead);
    } catch (NoSuchFileException e) {
      return;
    }
    raw.order(ByteOrder.LITTLE_ENDIAN);
    int whole = raw.position() - raw.position() % ENTRY_SIZE;
    long taken = 0;
    for (int at = 0; at < whole; at += ENTRY_SIZE) {
      int eUid = raw.getInt(at);
      long base = raw.getLong(at + 4);
      int delta = raw.getInt(at + 12);
      long pos = raw.getLong(at + 16);
      int size = raw.getInt(at + 24);
      long end = pos + size;
      if (end > limit) {
        break; // not below the slot's end yet: taken again next time
      }
      if (pos < seg.scanned) {
        taken += ENTRY_SIZE;
        continue; // known from a walk of the frames
      }
      if (pos - FRAME_SIZE != seg.scanned) {
        break; // not where the known frames end: walk them instead
      }
      taken += ENTRY_SIZE;
      if (eUid == uid) {
        seg.add(base, base + delta, pos, size);
      }
      seg.scanned = end;
    }
    seg.idxRead += taken;
  }

  /** Walk the frames from where the index ended up to {@code limit}. */
  private void scan(Segment seg, long seq, Path dir, long limit, int uid, boolean sealed)
      throws IOException {
    FileChannel ch = channel(seq, seg, dir);
    if (scanBuffer == null) {
      scanBuffer = ByteBuffer.allocateDirect(SCAN_BLOCK); // big-endian: the batches' order
    }
    ByteBuffer block = scanBuffer;
    long at = seg.scanned;
    while (at < limit) {
      if (sealed && limit - at < HEAD) {
        // Too short for a frame: the rest of an O_DIRECT segment's last block, its padding.
        seg.scanned = limit;
        return;
      }
      block.clear().limit((int) Math.min(SCAN_BLOCK, limit - at));
      readFully(ch, block, at);
      int n = block.position();
      if (n < Math.min(HEAD, limit - at)) {
        throw new IOException("segment " + seq + " is shorter than its slot says");
      }
      long i = 0;
      while (i + HEAD <= n) {
        int f = (int) i;
        int frameUid = Integer.reverseBytes(block.getInt(f)); // little-endian
        long base = block.getLong(f + FRAME_SIZE);
        int length = block.getInt(f + FRAME_SIZE + 8);
        if (length < MIN_LENGTH) {
          if (!sealed) {
            throw new IOException("segment " + seq + ": no frame at " + (at + i));
          }
          // An O_DIRECT segment's last block padding, before the broker cut it.
          seg.scanned = limit;
          return;
        }
        int size = length + 12;
        if (frameUid == uid) {
          seg.add(base, base + block.getInt(f + FRAME_SIZE + 23), at + i + FRAME_SIZE, size);
        }
        i += FRAME_SIZE + (long) size;
        if (at + i >= limit) {
          break;
        }
      }
      if (i == 0) {
        throw new IOException("segment " + seq + ": no whole frame at " + at);
      }
      at += i;
      seg.scanned = at;
    }
  }

  private KafkaWire.FetchedPartition read(long offset, int maxBytes, SlotState s)
      throws IOException {
    Path dir = root.resolve(s.log);
    long hwm = s.highWatermark;
    // The chunk holding offset: the first batch whose last offset is at or past it.
    planSegments.clear();
    planBatches.clear();
    List<Long> planSeqs = new ArrayList<>();
    long total = 0;
    long expect = -1; // the next offset the batches planned so far lead to
    for (Map.Entry<Long, Segment> e : segments.entrySet()) {
      Segment seg = e.getValue();
      if (seg.n == 0 || seg.last[seg.n - 1] < offset) {
        continue;
      }
      int i = expect < 0 ? seg.holding(offset) : 0;
      if (expect < 0 && seg.base[i] > offset) {
        return null; // not a batch of the offset: Fetch says what is there
      }
      int j = i;
      while (j < seg.n && seg.last[j] < hwm) {
        int size = seg.size[j];
        // Offsets run on without a gap (a segment this reader cannot see, a spilled one,
        // would leave one): a gap ends the read, and the next starts at Fetch.
        if ((total > 0 && total + size > maxBytes) || (expect >= 0 && seg.base[j] != expect)) {
          break;
        }
        total += size;
        expect = seg.last[j] + 1;
        j++;
      }
      if (j > i) {
        planSegments.add(seg);
        planBatches.add(new int[] {i, j - i});
        planSeqs.add(e.getKey());
      }
      if (j < seg.n || total >= maxBytes) {
        break;
      }
    }
    if (planSegments.isEmpty() || total > Integer.MAX_VALUE - 64) {
      return null; // the index does not reach it (a stale slot): Fetch knows better
    }
    if (out.length < total) {
      out = new byte[(int) Math.max(total, Math.min(2L * out.length, Integer.MAX_VALUE - 64))];
    }
    int at = 0;
    for (int p = 0; p < planSegments.size(); p++) {
      Segment seg = planSegments.get(p);
      FileChannel ch = channel(planSeqs.get(p), seg, dir);
      int k = planBatches.get(p)[0];
      int stop = k + planBatches.get(p)[1];
      while (k < stop) {
        // A run of batches of this partition back to back in the file (one frame header
        // between each), read at once.
        int first = k;
        long start = seg.pos[k];
        long runEnd = start + seg.size[k];
        k++;
        while (k < stop && seg.pos[k] == runEnd + FRAME_SIZE
            && seg.pos[k] + seg.size[k] - start <= MAX_RUN) {
          runEnd = seg.pos[k] + seg.size[k];
          k++;
        }
        int runLength = (int) (runEnd - start);
        if (runBuffer == null || runBuffer.capacity() < runLength) {
          runBuffer = ByteBuffer.allocateDirect(Math.max(runLength, 1 << 16));
        }
        ByteBuffer run = runBuffer;
        run.clear().limit(runLength);
        readFully(ch, run, start);
        if (run.position() != runLength) {
          return null; // cut meanwhile
        }
        for (int q = first; q < k; q++) {
          run.get((int) (seg.pos[q] - start), out, at, seg.size[q]);
          // Every batch read is the one the index promised (base offset and length).
          if (RecordDecoder.baseOffset(out, at) != seg.base[q]
              || RecordDecoder.batchSize(out, at) != seg.size[q]) {
            return null;
          }
          at += seg.size[q];
        }
      }
    }
    return answer(s, at);
  }

  /** Reads into {@code buf} from {@code position} until it is full or the file ends. */
  private static void readFully(FileChannel ch, ByteBuffer buf, long position)
      throws IOException {
    while (buf.hasRemaining()) {
      int n = ch.read(buf, position);
      if (n <= 0) {
        return;
      }
      position += n;
    }
  }

  @Override
  public String toString() {
    return topic + "-" + partition + " from " + root;
  }
}
