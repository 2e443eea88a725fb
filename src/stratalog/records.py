"""Decoding the records inside a RecordBatch v2 (off the broker's hot path).

The broker only needs this to answer ListOffsets by timestamp at record precision, as Kafka does;
clients use it to read. Compressed batches (gzip, snappy raw or xerial-framed, lz4 frame, zstd)
are decompressed with cramjam.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import cramjam

from stratalog.storage.batch import (
    COMPRESSION_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    CorruptBatchError,
    pack_header,
    parse_header,
)

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return bytes(cramjam.gzip.decompress(data))
    if codec == SNAPPY:
        raw = bytes(data)
        if raw.startswith(_XERIAL_MAGIC):
            return _xerial_snappy(raw)
        return bytes(cramjam.snappy.decompress_raw(raw))
    if codec == LZ4:
        return bytes(cramjam.lz4.decompress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.decompress(data))
    raise CorruptBatchError(f"unknown compression codec {codec}", "UNSUPPORTED_COMPRESSION_TYPE")


def compress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression codec {codec}")


def _xerial_snappy(raw: bytes) -> bytes:
    # Java's SnappyOutputStream framing: 16-byte header, then (int32 length, raw block) chunks.
    out = bytearray()
    pos = 16
    while pos < len(raw):
        (n,) = struct.unpack_from(">i", raw, pos)
        pos += 4
        out += cramjam.snappy.decompress_raw(raw[pos : pos + n])
        pos += n
    return bytes(out)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Zig-zag varint (Kafka's signed varint/varlong)."""
    shift = 0
    result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptBatchError("varint too long")
    return (result >> 1) ^ -(result & 1), pos


def _bytes_field(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    n, pos = _varint(buf, pos)
    if n < 0:
        return None, pos
    return buf[pos : pos + n], pos + n


def uncompressed_batches(raw: bytes | memoryview) -> bytes:
    """``raw`` with every compressed batch replaced by the same batch uncompressed.

    For readers that decode only uncompressed batches (the native column decoder). The CRC of a
    rewritten batch is left as it was, so the result is for decoding, never for storing. A
    partial batch at the end is dropped.
    """
    mv = memoryview(raw)
    out = bytearray()
    pos = 0
    while len(mv) - pos >= HEADER_SIZE:
        h = parse_header(mv, pos)
        if h.batch_length < HEADER_SIZE - LOG_OVERHEAD:
            raise CorruptBatchError(f"batch length {h.batch_length} is smaller than a header")
        if pos + h.size > len(mv):
            break
        if h.magic != 2 or not h.compression:
            out += mv[pos : pos + h.size]
        else:
            body = decompress(h.compression, mv[pos + HEADER_SIZE : pos + h.size])
            out += pack_header(
                h._replace(
                    batch_length=HEADER_SIZE - LOG_OVERHEAD + len(body),
                    attributes=h.attributes & ~COMPRESSION_MASK,
                )
            )
            out += body
        pos += h.size
    return bytes(out)


def iter_records(batch: bytes | memoryview, header: BatchHeader | None = None) -> Iterator[Record]:
    """Yield the records of one complete batch, with absolute offsets and timestamps."""
    h = header or parse_header(batch)
    body = decompress(h.compression, memoryview(batch)[HEADER_SIZE : h.size])
    pos = 0
    for _ in range(h.record_count):
        length, pos = _varint(body, pos)
        end = pos + length
        pos += 1  # attributes (unused in v2)
        ts_delta, pos = _varint(body, pos)
        off_delta, pos = _varint(body, pos)
        key, pos = _bytes_field(body, pos)
        value, pos = _bytes_field(body, pos)
        n_headers, pos = _varint(body, pos)
        headers = []
        for _ in range(n_headers):
            hk, pos = _bytes_field(body, pos)
            hv, pos = _bytes_field(body, pos)
            headers.append(((hk or b"").decode("utf-8", "replace"), hv))
        if pos != end:
            raise CorruptBatchError("record length disagrees with its fields")
        ts = h.max_timestamp if h.is_log_append_time else h.base_timestamp + ts_delta
        yield Record(h.base_offset + off_delta, ts, key, value, tuple(headers))


def _zigzag(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _bytes_out(b: bytes | None) -> bytes:
    if b is None:
        return _zigzag(-1)
    return _zigzag(len(b)) + b


def build_batch(
    records: list[tuple[bytes | None, bytes | None, int]],
    *,
    base_offset: int = 0,
    headers: list[list[tuple[str, bytes | None]]] | None = None,
    compression: int = NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    log_append_time: bool = False,
    transactional: bool = False,
    control: bool = False,
) -> bytes:
    """Encode (key, value, timestamp_ms) records as one RecordBatch v2 (for clients and tests;
    the broker's own control batches, transaction markers, are ``transactional`` and
    ``control``)."""
    from crc32c import crc32c

    if not records:
        raise ValueError("a batch needs at least one record")
    base_ts = records[0][2]
    max_ts = max(r[2] for r in records)
    body = bytearray()
    for i, (key, value, ts) in enumerate(records):
        hdrs = headers[i] if headers else []
        rec = bytearray(b"\x00")
        rec += _zigzag(ts - base_ts) + _zigzag(i) + _bytes_out(key) + _bytes_out(value)
        rec += _zigzag(len(hdrs))
        for hk, hv in hdrs:
            rec += _bytes_out(hk.encode()) + _bytes_out(hv)
        body += _zigzag(len(rec)) + rec
    payload = compress(compression, bytes(body))
    attributes = (
        compression
        | (0x08 if log_append_time else 0)
        | (0x10 if transactional else 0)
        | (0x20 if control else 0)
    )
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            attributes,
            len(records) - 1,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            len(records),
        )
        + payload
    )
    batch_length = 4 + 1 + 4 + len(after_crc)
    head = struct.pack(">qiib", base_offset, batch_length, 0, 2)
    return head + struct.pack(">I", crc32c(after_crc)) + after_crc
