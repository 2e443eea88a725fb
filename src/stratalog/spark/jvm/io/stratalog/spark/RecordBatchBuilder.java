package io.stratalog.spark;

import java.io.ByteArrayOutputStream;
import java.util.List;
import java.util.zip.CRC32C;

/**
 * Builds one uncompressed Kafka record batch (magic 2) of an idempotent producer: its id, epoch
 * 0, and the sequence of its first record, as the broker checks them for duplicates.
 */
final class RecordBatchBuilder {
  /** One record to write; a header is a key and a value that may be null. */
  static final class Rec {
    final byte[] key;
    final byte[] value;
    final long timestampMs;
    final List<byte[][]> headers;

    Rec(byte[] key, byte[] value, long timestampMs, List<byte[][]> headers) {
      this.key = key;
      this.value = value;
      this.timestampMs = timestampMs;
      this.headers = headers;
    }

    int size() {
      return (key == null ? 0 : key.length) + (value == null ? 0 : value.length);
    }
  }

  private RecordBatchBuilder() {}

  static byte[] build(List<Rec> records, long producerId, int baseSequence) {
    long base = records.get(0).timestampMs;
    long max = base;
    Out body = new Out();
    Out rec = new Out();
    for (int i = 0; i < records.size(); i++) {
      Rec r = records.get(i);
      max = Math.max(max, r.timestampMs);
      rec.reset();
      rec.write(0); // attributes
      rec.varlong(r.timestampMs - base);
      rec.varint(i);
      rec.bytes(r.key);
      rec.bytes(r.value);
      rec.varint(r.headers.size());
      for (byte[][] h : r.headers) {
        rec.bytes(h[0]);
        rec.bytes(h[1]);
      }
      body.varint(rec.size());
      body.write(rec.buf(), 0, rec.size());
    }
    Out b = new Out();
    b.int64(0); // base offset: the broker assigns it
    b.int32(49 + body.size()); // length after this field
    b.int32(-1); // partition leader epoch
    b.write(2); // magic
    b.int32(0); // CRC, filled below
    b.int16(0); // attributes: no compression, CreateTime
    b.int32(records.size() - 1);
    b.int64(base);
    b.int64(max);
    b.int64(producerId);
    b.int16(0); // producer epoch
    b.int32(baseSequence);
    b.int32(records.size());
    b.write(body.buf(), 0, body.size());
    byte[] out = b.toByteArray();
    CRC32C crc = new CRC32C();
    crc.update(out, 21, out.length - 21);
    int c = (int) crc.getValue();
    out[17] = (byte) (c >>> 24);
    out[18] = (byte) (c >>> 16);
    out[19] = (byte) (c >>> 8);
    out[20] = (byte) c;
    return out;
  }

  /** A growable buffer with Kafka's fixed-width and zig-zag variable-width integers. */
  private static final class Out extends ByteArrayOutputStream {
    byte[] buf() {
      return buf;
    }

    void int16(int v) {
      write(v >>> 8);
      write(v);
    }

    void int32(int v) {
      int16(v >>> 16);
      int16(v);
    }

    void int64(long v) {
      int32((int) (v >>> 32));
      int32((int) v);
    }

    void varint(int v) {
      varlong(v);
    }

    void varlong(long v) {
      long z = (v << 1) ^ (v >> 63);
      while ((z & ~0x7FL) != 0) {
        write((int) ((z & 0x7F) | 0x80));
        z >>>= 7;
      }
      write((int) z);
    }

    void bytes(byte[] b) {
      if (b == null) {
        varint(-1);
      } else {
        varint(b.length);
        write(b, 0, b.length);
      }
    }
  }
}
