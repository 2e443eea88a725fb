package io.stratalog.spark;

import io.stratalog.spark.ReadOptions.PartitionMap;
import java.util.Map;
import java.util.TreeMap;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * A streaming position: the next offset of every topic-partition, written as Spark's Kafka
 * source writes its offsets ({"topic":{"0":23}}), topics and partitions in one order so that
 * Spark can compare two positions by their text.
 */
final class JsonOffset extends Offset {
  final PartitionMap offsets;

  JsonOffset(PartitionMap offsets) {
    this.offsets = offsets;
  }

  static JsonOffset parse(String json) {
    return new JsonOffset(ReadOptions.partitionJson("offset", json));
  }

  @Override
  public String json() {
    StringBuilder b = new StringBuilder("{");
    boolean firstTopic = true;
    for (Map.Entry<String, TreeMap<Integer, Long>> t : offsets.entrySet()) {
      if (!firstTopic) {
        b.append(',');
      }
      firstTopic = false;
      b.append('"').append(t.getKey().replace("\\", "\\\\").replace("\"", "\\\"")).append("\":{");
      boolean firstPartition = true;
      for (Map.Entry<Integer, Long> p : t.getValue().entrySet()) {
        if (!firstPartition) {
          b.append(',');
        }
        firstPartition = false;
        b.append('"').append(p.getKey()).append("\":").append(p.getValue());
      }
      b.append('}');
    }
    return b.append('}').toString();
  }
}
