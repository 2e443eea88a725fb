package io.stratalog.spark;

import java.util.Comparator;
import java.util.HashSet;
import java.util.PriorityQueue;
import java.util.Set;

/**
 * read_committed on the reading side: which batches of a Fetch answer belong to aborted
 * transactions, as Kafka's consumer decides it (the Python reader's client/committed.py does the
 * same). A read_committed answer lists the aborted transactions its records overlap as
 * (producer id, first offset); walking its batches in offset order, a producer's transaction
 * counts as aborted from that first offset until its ABORT marker, and its transactional batches
 * in between are skipped. Markers are left to the decoder, which skips control batches.
 */
final class AbortedTransactions {
  private static final int TRANSACTIONAL = 0x10;
  private static final int CONTROL = 0x20;

  // (producer id, first offset), by first offset
  private final PriorityQueue<long[]> ahead = new PriorityQueue<>(
      Comparator.comparingLong((long[] a) -> a[1]));
  private final Set<Long> open = new HashSet<>();

  /** Starts on a new answer, with its list of (producer id, first offset) pairs, flattened. */
  void reset(long[] pairs) {
    ahead.clear();
    open.clear();
    for (int i = 0; i + 1 < pairs.length; i += 2) {
      ahead.add(new long[] {pairs[i], pairs[i + 1]});
    }
  }

  /** Whether the batch at {@code at} (last offset {@code last}) is of an aborted transaction. */
  boolean skip(byte[] b, int at, long last) {
    long pid = RecordDecoder.readLong(b, at + 43);
    if (pid < 0 || (ahead.isEmpty() && open.isEmpty())) {
      return false;
    }
    while (!ahead.isEmpty() && ahead.peek()[1] <= last) {
      open.add(ahead.poll()[0]);
    }
    int attributes = ((b[at + 21] & 0xff) << 8) | (b[at + 22] & 0xff);
    if ((attributes & CONTROL) != 0) {
      if (open.contains(pid) && isAbortMarker(b, at)) {
        open.remove(pid);
      }
      return false;
    }
    return (attributes & TRANSACTIONAL) != 0 && open.contains(pid);
  }

  /** A control batch's first record key is (version int16, type int16); type 0 is ABORT. */
  private static boolean isAbortMarker(byte[] b, int at) {
    int[] p = {at + RecordDecoder.HEADER};
    varint(b, p); // record length
    p[0]++; // attributes
    varint(b, p); // timestamp delta
    varint(b, p); // offset delta
    int keyLength = varint(b, p);
    return keyLength >= 4 && b[p[0] + 2] == 0 && b[p[0] + 3] == 0;
  }

  private static int varint(byte[] b, int[] p) {
    int raw = 0;
    int shift = 0;
    while (true) {
      int x = b[p[0]++];
      raw |= (x & 0x7f) << shift;
      if (x >= 0) {
        break;
      }
      shift += 7;
    }
    return (raw >>> 1) ^ -(raw & 1);
  }
}
