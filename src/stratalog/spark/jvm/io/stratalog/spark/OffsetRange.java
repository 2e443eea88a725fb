package io.stratalog.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * One task's work: the offsets {@code [from, until)} of one topic-partition, and the bootstrap
 * list its reader starts from (the partition's leader as planning saw it first, in a cluster).
 */
final class OffsetRange implements InputPartition {
  private static final long serialVersionUID = 1L;

  final String topic;
  final int partition;
  final long from;
  final long until;
  final String brokers;

  OffsetRange(String topic, int partition, long from, long until, String brokers) {
    this.topic = topic;
    this.partition = partition;
    this.from = from;
    this.until = until;
    this.brokers = brokers;
  }

  long size() {
    return until - from;
  }

  @Override
  public String toString() {
    return topic + "-" + partition + "[" + from + ", " + until + ")";
  }
}
