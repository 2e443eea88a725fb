"""Compaction's record walk in C (storage/_key_scan.c) against its walk in Python: for random
batches (keys short and long, null keys, tombstones, headers, every codec, keys repeated within
and across batches) both passes give the same offset map, the same survivors (the same bytes,
offsets and timestamps) and the same refusal when the map is full; malformed batches raise
CorruptBatchError on both paths and nothing is read outside the batch."""

from __future__ import annotations

import random

import pytest

from stratalog.records import GZIP, LZ4, NONE, SNAPPY, ZSTD, build_batch
from stratalog.storage import compaction
from stratalog.storage.batch import CorruptBatchError, parse_header

pytestmark = pytest.mark.skipif(
    compaction._native is None, reason="the C record walk was not built (no C compiler)"
)


def _batches(rng: random.Random, n: int, codec: int) -> list[tuple]:
    out, base = [], 0
    for _ in range(n):
        recs = []
        for i in range(rng.randint(1, 40)):
            k = rng.randint(0, 30)
            if rng.random() < 0.1:
                key = None
            elif k % 3 == 0:
                key = b"long-key-%d-" % k + b"x" * rng.choice((7, 8, 40))  # over 16 bytes
            else:
                key = b"k%d" % k
            value = None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 60))
            recs.append((key, value, 1_700_000_000_000 + base + i))
        headers = [[("h", b"v")] if rng.random() < 0.3 else [] for _ in recs]
        raw = build_batch(recs, base_offset=base, compression=codec, headers=headers)
        out.append((parse_header(raw), raw))
        base += len(recs) + rng.randint(0, 3)
    return out


def _both(fn):
    """``fn()`` with the C walk, then with the Python walk."""
    native = compaction._native
    try:
        got = fn()
        compaction._native = None
        want = fn()
    finally:
        compaction._native = native
    return got, want


def _kept(kept) -> list[tuple]:
    return [(bytes(r.body), r.offset_delta, r.timestamp_delta, r.after_timestamp) for r in kept]


@pytest.mark.parametrize("codec", [NONE, GZIP, SNAPPY, LZ4, ZSTD])
@pytest.mark.parametrize("seed", range(4))
def test_both_walks_agree(codec, seed):
    batches = _batches(random.Random(seed * 10 + codec), 25, codec)

    def run():
        latest: dict[bytes, int] = {}
        for h, raw in batches:
            assert compaction.remember(h, raw, latest, 1 << 20)
        kept = [compaction.survivors(h, raw, latest, expired) for h, raw in batches
                for expired in (False, True)]  # fmt: skip
        return latest, [(_kept(k), t) for k, t in kept]

    got, want = _both(run)
    assert got == want
    # The produce path's check of a compacted topic: the records without a key.
    keyless, expected = _both(lambda: [compaction.keyless_records(h, raw) for h, raw in batches])
    assert keyless == expected and any(keyless)
    latest, kept = got
    assert any(len(k) > 16 for k in latest)  # long keys went through the digest
    assert any(t for _k, t in kept) and any(not k for k, _t in kept)


def test_a_full_map_refuses_the_batch_alike():
    batches = _batches(random.Random(7), 10, NONE)

    def run():
        latest: dict[bytes, int] = {}
        answers = [compaction.remember(h, raw, latest, 25) for h, raw in batches]
        return answers, dict(latest)

    got, want = _both(run)
    assert got == want
    answers, latest = got
    assert False in answers and len(latest) <= 25


@pytest.mark.parametrize(
    "damage",
    [
        lambda body: body[:-1],  # the last record runs past the batch
        lambda body: body + b"\x00",  # bytes after the last record
        lambda body: b"\x7f" + body[1:],  # a negative record length
        lambda body: b"\xfe\x7f" + body[1:],  # a record longer than the batch
        lambda body: body[:1] + b"\xff" * 12 + body[13:],  # a varint over 10 bytes
    ],
)
def test_malformed_records_raise_on_both_paths(damage):
    (h, raw), *_ = _batches(random.Random(3), 1, NONE)
    body = bytes(raw[61 : h.size])
    bad = raw[:61] + damage(body)
    h2 = h._replace(batch_length=len(bad) - 12)

    def run():
        outcomes = []
        for call in (
            lambda: compaction.remember(h2, bad, {}, 1 << 20),
            lambda: compaction.survivors(h2, bad, {}, False),
            lambda: compaction.keyless_records(h2, bad),
        ):
            with pytest.raises(CorruptBatchError):
                call()
            outcomes.append("refused")
        return outcomes

    got, want = _both(run)
    assert got == want == ["refused"] * 3
