package io.stratalog.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * One task's work on a split topic: a partition family (an original partition and its
 * descendants, {@link SplitTree}), parents before children, each member with its own offsets
 * {@code [from, until)} and the index of its parent among the members (-1: none here). Read by
 * {@link FamilyReader} in one task so that each key keeps its order across the splits.
 */
final class FamilyRange implements InputPartition {
  private static final long serialVersionUID = 1L;

  final String topic;
  final int[] partitions;
  final long[] from;
  final long[] until;
  final int[] parents;
  final String brokers;

  FamilyRange(String topic, int[] partitions, long[] from, long[] until, int[] parents,
      String brokers) {
    this.topic = topic;
    this.partitions = partitions;
    this.from = from;
    this.until = until;
    this.parents = parents;
    this.brokers = brokers;
  }

  boolean isEmpty() {
    for (int i = 0; i < partitions.length; i++) {
      if (until[i] > from[i]) {
        return false;
      }
    }
    return true;
  }

  @Override
  public String toString() {
    StringBuilder b = new StringBuilder(topic).append(" family");
    for (int i = 0; i < partitions.length; i++) {
      b.append(' ').append(partitions[i]).append('[').append(from[i]).append(", ")
          .append(until[i]).append(')');
    }
    return b.toString();
  }
}
