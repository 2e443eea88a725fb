"""Kafka RecordBatch v2 headers: the chunk the broker stores byte for byte.

The broker reads only the 61-byte header, checks the CRC-32C and rewrites ``baseOffset``; records
are never decoded on the produce or fetch path. Layout (big-endian)::

    0  baseOffset int64        21 attributes int16       43 producerId int64
    8  batchLength int32       23 lastOffsetDelta int32  51 producerEpoch int16
    12 partitionLeaderEpoch    27 baseTimestamp int64    53 baseSequence int32
    16 magic int8              35 maxTimestamp int64     57 recordCount int32
    17 crc uint32 (covers attributes .. end)
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from crc32c import crc32c

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: bytes not counted by batchLength
CRC_START = 21

_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
_CRC = struct.Struct(">I")

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20

NO_PRODUCER_ID = -1
NO_SEQUENCE = -1


class CorruptBatchError(ValueError):
    """A batch that fails validation; ``error`` is the Kafka error name to answer with."""

    def __init__(self, message: str, error: str = "CORRUPT_MESSAGE") -> None:
        super().__init__(message)
        self.error = error


class BatchHeader(NamedTuple):
    """The fields of one RecordBatch v2 header, as parsed from its first 61 bytes.

    A named tuple rather than a frozen dataclass: one is built per batch on the produce path,
    and a tuple is made in one C call where a frozen dataclass sets 13 attributes one by one.
    """

    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch on the wire and on disk."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


_tuple_new = tuple.__new__  # BatchHeader._make without its Python-level length check


def parse_header(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header at ``pos``; raises CorruptBatchError when fewer than 61 bytes remain."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptBatchError(
            f"batch header needs {HEADER_SIZE} bytes, {len(buf) - pos} left", "INVALID_RECORD"
        )
    return _tuple_new(BatchHeader, _HEADER.unpack_from(buf, pos))


def pack_header(h: BatchHeader) -> bytes:
    """The 61 header bytes of ``h`` (the inverse of parse_header)."""
    return _HEADER.pack(*h)


def validate_batch(
    buf: bytes | memoryview, pos: int = 0, *, check_crc: bool = True, compacted: bool = False
) -> BatchHeader:
    """Validate one complete batch starting at ``pos`` and return its header.

    Checks the magic byte, that ``batchLength`` fits the buffer, that the record count agrees
    with ``lastOffsetDelta`` (offsets are assigned from it, so a client may not lie), and the
    CRC-32C over attributes..end. ``compacted``: a stored batch log compaction may have
    rewritten (storage/compaction.py), with fewer records than offsets, or none.
    """
    h = parse_header(buf, pos)
    if h.magic != 2:
        raise CorruptBatchError(f"unsupported record batch magic {h.magic}", "UNSUPPORTED_VERSION")
    if h.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptBatchError(
            f"batchLength {h.batch_length} is smaller than a header", "INVALID_RECORD"
        )
    end = pos + h.batch_length + LOG_OVERHEAD
    if end > len(buf):
        raise CorruptBatchError(
            f"batchLength {h.batch_length} runs past the end of the data", "INVALID_RECORD"
        )
    if compacted:
        if not 0 <= h.record_count <= h.last_offset_delta + 1:
            raise CorruptBatchError(
                f"recordCount {h.record_count} past lastOffsetDelta {h.last_offset_delta} + 1",
                "INVALID_RECORD",
            )
    elif h.record_count < 1 and not h.attributes & CONTROL_MASK:
        raise CorruptBatchError(f"record count {h.record_count} must be positive", "INVALID_RECORD")
    elif h.record_count != h.last_offset_delta + 1:
        raise CorruptBatchError(
            f"recordCount {h.record_count} != lastOffsetDelta {h.last_offset_delta} + 1",
            "INVALID_RECORD",
        )
    if check_crc:
        actual = crc32c(memoryview(buf)[pos + CRC_START : end])
        if actual != h.crc:
            raise CorruptBatchError(f"CRC-32C mismatch: header {h.crc:#010x}, data {actual:#010x}")
    return h


def split_batches(
    records: bytes | memoryview, *, compacted: bool = False
) -> list[tuple[int, BatchHeader]]:
    """Validate every batch in a Produce ``records`` field; return (position, header) pairs.

    The whole field must be made of complete batches: a trailing partial batch is an error (a
    producer never sends one), so nothing of a bad request is appended.
    """
    out: list[tuple[int, BatchHeader]] = []
    pos = 0
    n = len(records)
    if n == 0:
        raise CorruptBatchError("empty records field", "INVALID_RECORD")
    while pos < n:
        h = validate_batch(records, pos, compacted=compacted)
        out.append((pos, h))
        pos += h.batch_length + LOG_OVERHEAD
    return out


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Assign offsets: rewrite baseOffset in place (outside the CRC, so the CRC stays valid)."""
    _BASE_OFFSET.pack_into(buf, pos, base_offset)


def stamp_log_append_time(buf: bytearray | memoryview, pos: int, timestamp_ms: int) -> None:
    """Turn a batch into LogAppendTime at ``timestamp_ms`` and recompute its CRC (this batch only).

    Kafka's convention: the timestamp-type attribute bit is set and maxTimestamp carries the
    broker time; record timestamp deltas are left alone and ignored by readers.
    """
    h = parse_header(buf, pos)
    struct.pack_into(">h", buf, pos + 21, h.attributes | TIMESTAMP_TYPE_MASK)
    struct.pack_into(">q", buf, pos + 35, timestamp_ms)
    end = pos + h.size
    _CRC.pack_into(buf, pos + 17, crc32c(memoryview(buf)[pos + CRC_START : end]))
