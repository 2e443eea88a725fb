package io.stratalog.spark;

import java.util.ArrayList;
import java.util.List;

/**
 * The split tree of a topic with dynamic partitioning (the Java side of {@code splits.py}). A
 * split doubles the partitions, N to 2N: partition p gains the child p + N, kept in its
 * parent's log. The broker keeps the partition counts in the read-only topic config
 * {@link #HISTORY}, e.g. "2,4,8" for a topic created with 2 and split twice, and answers a
 * child's Fetch (v12+) with order marks under the tagged field {@link #ORDER_TAG}.
 */
final class SplitTree {
  static final String HISTORY = "partition.split.history";
  // A Stratalog-only tag of Fetch's partition answers: Kafka clients skip tags they don't know.
  static final int ORDER_TAG = 0x5354;

  private SplitTree() {}

  /** The partition counts of a history; an empty array for none. */
  static int[] parse(String history) {
    if (history == null || history.isEmpty()) {
      return new int[0];
    }
    String[] parts = history.split(",");
    int[] counts = new int[parts.length];
    try {
      for (int i = 0; i < parts.length; i++) {
        counts[i] = Integer.parseInt(parts[i].trim());
      }
    } catch (NumberFormatException e) {
      throw new IllegalStateException(HISTORY + " '" + history + "' is not a list of counts");
    }
    for (int i = 1; i < counts.length; i++) {
      if (counts[i] != 2 * counts[i - 1]) {
        throw new IllegalStateException(
            HISTORY + " '" + history + "': each count must double the one before");
      }
    }
    if (counts[0] < 1) {
      throw new IllegalStateException(HISTORY + " '" + history + "' starts below 1");
    }
    return counts;
  }

  /** The partition {@code partition} was split from; -1 for one the topic was created with. */
  static int parentOf(int partition, int[] counts) {
    for (int i = counts.length - 2; i >= 0; i--) {
      int n = counts[i];
      if (n <= partition && partition < 2 * n) {
        return partition - n;
      }
    }
    return -1;
  }

  /** Each original partition with its descendants below {@code total}, parents first. */
  static List<List<Integer>> families(int[] counts, int total) {
    int first = counts.length > 0 ? counts[0] : total;
    List<List<Integer>> out = new ArrayList<>();
    for (int r = 0; r < first; r++) {
      List<Integer> f = new ArrayList<>();
      f.add(r);
      out.add(f);
    }
    // Children are numbered after their parents, so ascending order puts parents first.
    for (int c = first; c < total; c++) {
      int root = c;
      for (int q = parentOf(root, counts); q >= 0; q = parentOf(root, counts)) {
        root = q;
      }
      if (root < first) {
        out.get(root).add(c);
      } else {
        out.add(new ArrayList<>(List.of(c))); // past the history (not a split's): on its own
      }
    }
    return out;
  }
}
