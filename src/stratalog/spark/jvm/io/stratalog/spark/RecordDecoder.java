package io.stratalog.spark;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.zip.CRC32C;
import java.util.zip.GZIPInputStream;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;

/**
 * Decodes Kafka record batches (magic 2) straight into Spark column vectors: each key and value
 * is copied once, from the fetched frame into its column. Only the columns the query asked for
 * are written (a null vector is a pruned column).
 */
final class RecordDecoder {
  static final int HEADER = 61;

  private final byte[] topicBytes;
  private final WritableColumnVector key;
  private final WritableColumnVector value;
  private final WritableColumnVector topic;
  private final WritableColumnVector partitionCol;
  private final WritableColumnVector offset;
  private final WritableColumnVector timestamp;
  private final WritableColumnVector timestampType;
  private final WritableColumnVector headers;
  private int partition;
  private final boolean checkCrc;
  private final CRC32C crc = new CRC32C();
  private int headerRows;

  // The cursor over the bytes being decoded.
  private byte[] a;
  private int p;

  RecordDecoder(String topicName, int partition, WritableColumnVector[] byField, boolean checkCrc) {
    this.topicBytes = topicName.getBytes(StandardCharsets.UTF_8);
    this.partition = partition;
    this.checkCrc = checkCrc;
    key = byField[0];
    value = byField[1];
    topic = byField[2];
    partitionCol = byField[3];
    offset = byField[4];
    timestamp = byField[5];
    timestampType = byField[6];
    headers = byField[7];
  }

  /**
   * Decodes the next batches as of another partition of the topic (a split family's member):
   * one decoder per set of vectors, as it counts the header entries written to them.
   */
  void partition(int p) {
    partition = p;
  }

  /** Called when the vectors are reset for a new columnar batch. */
  void newBatch() {
    headerRows = 0;
  }

  static long baseOffset(byte[] b, int at) {
    return readLong(b, at);
  }

  static int batchSize(byte[] b, int at) {
    return 12 + readInt(b, at + 8);
  }

  /** Fails on a batch of an old message format (magic 0 or 1), naming where it is. */
  static void requireMagic2(byte[] b, int at, String topicPartition) throws IOException {
    if (b[at + 16] != 2) {
      throw new IOException("record batch at offset " + baseOffset(b, at) + " of "
          + topicPartition + " has magic " + b[at + 16]
          + "; only magic 2 (Kafka 0.11 and later) is read");
    }
  }

  static long lastOffset(byte[] b, int at) {
    return readLong(b, at) + readInt(b, at + 23);
  }

  /**
   * Appends the records of the batch at {@code at} whose offsets are in {@code [from, until)}
   * to the vectors from row {@code row}; returns the number of rows appended.
   */
  int decode(byte[] b, int at, long from, long until, int row) throws IOException {
    int size = batchSize(b, at);
    if (checkCrc) {
      crc.reset();
      crc.update(b, at + 21, size - 21);
      int want = readInt(b, at + 17);
      if ((int) crc.getValue() != want) {
        throw new IOException("record batch at offset " + baseOffset(b, at) + " of "
            + new String(topicBytes, StandardCharsets.UTF_8) + "-" + partition
            + " is corrupt (CRC mismatch)");
      }
    }
    short attributes = (short) (((b[at + 21] & 0xff) << 8) | (b[at + 22] & 0xff));
    if ((attributes & 0x20) != 0) {
      return 0; // a control batch (transaction marker) holds no records for the reader
    }
    long base = baseOffset(b, at);
    long baseTs = readLong(b, at + 27);
    long maxTs = readLong(b, at + 35);
    boolean logAppendTime = (attributes & 0x08) != 0;
    int count = readInt(b, at + 57);
    int codec = attributes & 0x07;
    if (codec == 0) {
      a = b;
      p = at + HEADER;
    } else {
      a = decompress(codec, b, at + HEADER, size - HEADER);
      p = 0;
    }
    reserve(row + count);
    int n = 0;
    for (int i = 0; i < count; i++) {
      varint(); // record length
      p++; // record attributes
      long tsDelta = varlong();
      long off = base + varint();
      int keyLen = varint();
      int keyAt = p;
      p += Math.max(keyLen, 0);
      int valueLen = varint();
      int valueAt = p;
      p += Math.max(valueLen, 0);
      int headerCount = varint();
      if (off < from || off >= until) {
        skipHeaders(headerCount);
        continue;
      }
      int r = row + n;
      bytes(key, r, keyAt, keyLen);
      bytes(value, r, valueAt, valueLen);
      if (topic != null) {
        topic.putByteArray(r, topicBytes, 0, topicBytes.length);
      }
      if (partitionCol != null) {
        partitionCol.putInt(r, partition);
      }
      if (offset != null) {
        offset.putLong(r, off);
      }
      if (timestamp != null) {
        timestamp.putLong(r, (logAppendTime ? maxTs : baseTs + tsDelta) * 1000L);
      }
      if (timestampType != null) {
        timestampType.putInt(r, logAppendTime ? 1 : 0);
      }
      if (headers != null) {
        readHeaders(r, headerCount);
      } else {
        skipHeaders(headerCount);
      }
      n++;
    }
    return n;
  }

  private void reserve(int rows) {
    for (WritableColumnVector v :
        new WritableColumnVector[] {key, value, topic, partitionCol, offset, timestamp,
            timestampType, headers}) {
      if (v != null) {
        v.reserve(rows);
      }
    }
  }

  private void bytes(WritableColumnVector v, int row, int at, int len) {
    if (v == null) {
      return;
    }
    if (len < 0) {
      v.putNull(row);
    } else {
      v.putByteArray(row, a, at, len);
    }
  }

  private void skipHeaders(int count) {
    for (int h = 0; h < count; h++) {
      int kl = varint();
      p += Math.max(kl, 0);
      int vl = varint();
      p += Math.max(vl, 0);
    }
  }

  private void readHeaders(int row, int count) {
    WritableColumnVector entries = headers.arrayData();
    WritableColumnVector keys = entries.getChild(0);
    WritableColumnVector values = entries.getChild(1);
    entries.reserve(headerRows + count);
    keys.reserve(headerRows + count);
    values.reserve(headerRows + count);
    if (count == 0) {
      headers.putNull(row); // as Spark's Kafka source: no headers is null, not an empty array
      return;
    }
    headers.putArray(row, headerRows, count);
    for (int h = 0; h < count; h++) {
      int e = headerRows + h;
      int kl = varint();
      keys.putByteArray(e, a, p, Math.max(kl, 0));
      p += Math.max(kl, 0);
      int vl = varint();
      if (vl < 0) {
        values.putNull(e);
      } else {
        values.putByteArray(e, a, p, vl);
        p += vl;
      }
      entries.putNotNull(e);
    }
    headerRows += count;
  }

  private static byte[] decompress(int codec, byte[] b, int at, int len) throws IOException {
    InputStream raw = new ByteArrayInputStream(b, at, len);
    InputStream in;
    switch (codec) {
      case 1:
        in = new GZIPInputStream(raw, 64 << 10);
        break;
      case 2:
        in = new org.xerial.snappy.SnappyInputStream(raw);
        break;
      case 3:
        in = new net.jpountz.lz4.LZ4FrameInputStream(raw);
        break;
      case 4:
        in = new com.github.luben.zstd.ZstdInputStream(raw);
        break;
      default:
        throw new IOException("record batch uses unknown compression codec " + codec);
    }
    try (InputStream s = in) {
      return s.readAllBytes();
    }
  }

  // -- zig-zag varints, as Kafka's record format writes them ---------------------------------

  private int varint() {
    int raw = 0;
    int shift = 0;
    while (true) {
      int x = a[p++];
      raw |= (x & 0x7f) << shift;
      if (x >= 0) {
        break;
      }
      shift += 7;
    }
    return (raw >>> 1) ^ -(raw & 1);
  }

  private long varlong() {
    long raw = 0;
    int shift = 0;
    while (true) {
      long x = a[p++];
      raw |= (x & 0x7f) << shift;
      if (x >= 0) {
        break;
      }
      shift += 7;
    }
    return (raw >>> 1) ^ -(raw & 1);
  }

  static int readInt(byte[] b, int at) {
    return ((b[at] & 0xff) << 24) | ((b[at + 1] & 0xff) << 16) | ((b[at + 2] & 0xff) << 8)
        | (b[at + 3] & 0xff);
  }

  static long readLong(byte[] b, int at) {
    return ((long) readInt(b, at) << 32) | (readInt(b, at + 4) & 0xffffffffL);
  }
}
