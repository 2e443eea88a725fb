"""The native column decoder (``stratalog.client._columns``) against the general decoding path.

Both turn a Fetch response's record batches into Arrow columns; the native one is what Spark's
``format("stratalog")`` and ``stratalog replay`` use when no headers are asked for. Every batch
shape a broker can return is generated here (null and empty keys and values, every compression
codec, LogAppendTime, control batches, ranges that cut batches, a partial batch at the end) and
both paths must give the same table and the same next offset. Corrupt input must give a Python
error, never a crash or a read outside the buffer.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratalog.client import arrow_reader
from stratalog.client.arrow_reader import ArrowDecoder
from stratalog.records import GZIP, LZ4, NONE, SNAPPY, ZSTD, build_batch

CONTROL = 0x20
blobs = st.one_of(st.none(), st.binary(max_size=40))
record = st.tuples(blobs, blobs, st.integers(0, 2**41))
batch = st.fixed_dictionaries(
    {
        "records": st.lists(record, min_size=1, max_size=8),
        "compression": st.sampled_from([NONE, NONE, GZIP, SNAPPY, LZ4, ZSTD]),
        "log_append_time": st.booleans(),
        "control": st.integers(0, 9).map(lambda i: i == 0),
        "gap": st.integers(0, 3),  # offsets compacted away between batches
        "producer": st.one_of(st.none(), st.tuples(st.integers(0, 2**40), st.integers(0, 2**30))),
    }
)


def _log(batches: list[dict]) -> tuple[bytes, int]:
    out, offset = b"", 5
    for b in batches:
        raw = bytearray(
            build_batch(
                sorted(b["records"], key=lambda r: r[2]),
                base_offset=offset,
                compression=b["compression"],
                log_append_time=b["log_append_time"],
                **(
                    {"producer_id": b["producer"][0], "base_sequence": b["producer"][1]}
                    if b["producer"]
                    else {}
                ),
            )
        )
        if b["control"]:
            (attrs,) = struct.unpack_from(">h", raw, 21)
            struct.pack_into(">h", raw, 21, attrs | CONTROL)
        out += raw
        offset += len(b["records"]) + b["gap"]
    return out, offset


def _decode(
    raw: bytes, start: int, end: int, native: bool, producer: bool = False
) -> tuple[int, pa.Table]:
    dec = ArrowDecoder("events", 3, include_producer=producer)
    dec.native = native
    nxt = dec.add(raw, start, end)
    return nxt, pa.Table.from_batches(dec.drain(), dec.schema)


def test_the_native_decoder_is_built() -> None:
    # The package's set-up compiles it; without it reads silently fall back to the slow path.
    assert arrow_reader._native is not None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(batch, min_size=1, max_size=6),
    start_back=st.integers(0, 60),
    end_back=st.integers(-5, 60),
    cut=st.integers(0, 80),
    producer=st.booleans(),
)
def test_native_and_general_paths_decode_the_same_columns(
    batches, start_back, end_back, cut, producer
):
    raw, after = _log(batches)
    start, end = max(0, after - start_back), after - end_back
    if cut:
        raw = raw[:-cut]  # a partial batch at the end, as a size-limited Fetch returns
    nxt_native, native = _decode(raw, start, end, native=True, producer=producer)
    nxt_general, general = _decode(raw, start, end, native=False, producer=producer)
    assert nxt_native == nxt_general
    assert native.equals(general), (native.to_pylist(), general.to_pylist())
    assert all(start <= o < end for o in native.column("offset").to_pylist())


def test_values_keys_nulls_and_times_come_through() -> None:
    raw = build_batch(
        [(None, b"a", 1_000), (b"", None, 1_001), (b"k", b"", 1_003)], base_offset=10
    ) + build_batch([(b"x", b"y" * 3000, 2_000)], base_offset=13, log_append_time=True)
    _, t = _decode(raw, 0, 100, native=True)
    assert t.column("key").to_pylist() == [None, b"", b"k", b"x"]
    assert t.column("value").to_pylist() == [b"a", None, b"", b"y" * 3000]
    assert t.column("offset").to_pylist() == [10, 11, 12, 13]
    assert [ts.timestamp() for ts in t.column("timestamp").to_pylist()] == [1.0, 1.001, 1.003, 2.0]
    assert t.column("timestampType").to_pylist() == [0, 0, 0, 1]
    assert t.column("topic").to_pylist() == ["events"] * 4
    assert t.column("partition").to_pylist() == [3] * 4


def test_many_fetches_make_many_chunks_in_offset_order() -> None:
    dec = ArrowDecoder("t", 0)
    nxt = 0
    for i in range(5):
        raw = build_batch([(None, b"%d" % (i * 2 + j), 0) for j in range(2)], base_offset=i * 2)
        nxt = dec.add(raw, nxt, 100)
    assert nxt == 10 and len(dec) == 10
    chunks = dec.drain()
    assert len(chunks) == 5 and len(dec) == 0
    values = pa.Table.from_batches(chunks).column("value").to_pylist()
    assert values == [b"%d" % i for i in range(10)]


def _native_decode(raw: bytes):
    return arrow_reader._native.decode(raw, 0, 2**62)


def test_corrupt_batches_raise_value_error() -> None:
    good = bytearray(build_batch([(b"k", b"v" * 100, 0), (None, b"w", 1)]))
    # batch length smaller than a header
    short = bytearray(good)
    struct.pack_into(">i", short, 8, 10)
    with pytest.raises(ValueError, match="smaller than a batch header"):
        _native_decode(bytes(short))
    # the first record says it is longer than the whole batch
    long_record = bytearray(good)
    long_record[61] = 0x7E  # zigzag 63 bytes, more than is left... then the rest is garbage
    long_record[61 + 1 :] = b"\xff" * (len(long_record) - 62)
    with pytest.raises(ValueError, match="malformed record"):
        _native_decode(bytes(long_record))
    # a header claiming more records than the batch holds
    more = bytearray(good)
    struct.pack_into(">i", more, 57, 3)
    with pytest.raises(ValueError):
        _native_decode(bytes(more))
    # a header claiming fewer records than the batch holds
    fewer = bytearray(good)
    struct.pack_into(">i", fewer, 57, 1)
    with pytest.raises(ValueError, match="fewer bytes or records"):
        _native_decode(bytes(fewer))
    # an older magic is not this path's to read: the general path takes it
    old = bytearray(good)
    old[16] = 1
    with pytest.raises(NotImplementedError):
        _native_decode(bytes(old))
    with pytest.raises(TypeError):
        arrow_reader._native.decode("not bytes", 0, 1)


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_random_corruption_never_crashes_or_invents_records(data) -> None:
    raw = bytearray(
        build_batch([(b"key", b"value" * 7, 5), (None, None, 6), (b"", b"x", 9)], base_offset=2) * 2
    )
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    try:
        out = _native_decode(bytes(raw))
    except (ValueError, NotImplementedError):
        return
    n, key_data, value_data = out[1], out[4], out[7]
    assert n <= 6
    assert len(key_data) + len(value_data) <= len(raw)
