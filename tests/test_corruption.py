"""Corruption stays where it is: a model of what must survive damage to every kind of file.

Seeded trials write records to four partitions sharing one virtual log through the real storage
API (LogStore), stop cleanly, then damage one file: a flipped bit or a cut at a random place in a
segment, a segment index, a sealed index, a producer snapshot, the checkpoint or the partition
state. The model says what the damage costs: a damaged chunk followed by valid frames is lost and
fenced (its offsets answer CORRUPT_MESSAGE), damage at the log's very end is a torn tail and cut,
a segment cut short loses the chunks past the cut, and damage to an index, a sealed index, a
snapshot, the checkpoint or the state costs nothing. Scrub
must name exactly the damaged file; after a restart every other record must be readable at its
offset, and the fence must survive a second restart. One broker process then shows the same over
the wire with confluent-kafka, and the CLI's scrub against a held and a stopped data directory.

CORRUPT_SEEDS=400 runs more trials (about 50 s) than the suite's 48.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from stratalog.records import build_batch, iter_records
from stratalog.storage import producer_snapshot, scrub
from stratalog.storage.cold_tier import ColdStore, ColdTierError
from stratalog.storage.journal import FsyncPolicy
from stratalog.storage.log_store import LogStore, StorageConfig
from stratalog.storage.partition import FileSlice
from stratalog.storage.segment import FRAME_SIZE

from .conftest import REPO, BrokerProcess, create_topic
from .test_recovery import (
    CORRUPT_MESSAGE,
    TOPIC,
    frames_of,
    produce_batches,
    read_until_error,
    served,
)

PARTS = [("t", i, 11 + i) for i in range(4)]
UIDS = [uid for _t, _i, uid in PARTS]
KINDS = ["segment", "index", "checkpoint", "partition-state", "sealed-index", "producer-snapshot"]


@dataclass(frozen=True)
class Chunk:
    uid: int
    base: int
    last: int
    values: tuple[bytes, ...]
    seq: int
    start: int  # of its frame in the segment
    end: int


def _open(root: Path, verify: bool) -> LogStore:
    store = LogStore(
        StorageConfig(
            root,
            fsync=FsyncPolicy.parse("never"),
            virtual_logs=1,
            segment_bytes=900,
            verify_on_open=verify,
        )
    )
    store.open(PARTS)
    return store


def _write(root: Path, rng: random.Random) -> list[Chunk]:
    store = _open(root, verify=False)
    written = []
    for k in range(36):
        uid = rng.choice(UIDS)
        values = tuple(b"u%d-k%d-%d" % (uid, k, j) for j in range(rng.randint(1, 3)))
        p = store.partitions[uid]
        r = p.append(build_batch([(None, v, 1_700_000_000_000 + k) for v in values]))
        loc = p.chunks[len(p.chunks) - 1]
        assert loc.base_offset == r.base_offset
        start = loc.position - FRAME_SIZE
        written.append(
            Chunk(
                uid,
                r.base_offset,
                r.last_offset,
                values,
                loc.segment,
                start,
                start + loc.size + FRAME_SIZE,
            )
        )
    asyncio.run(store.close())
    return written


def _damage(
    root: Path, rng: random.Random, kind: str, chunks: list[Chunk]
) -> tuple[Path, set[Chunk], set[Chunk]]:
    """Damage one file of ``kind``; (the file, chunks fenced as lost, chunks cut as a tear)."""
    log = root / "logs" / "v0"
    segs = sorted(log.glob("*.log"))
    op = rng.choice(["flip", "cut"])
    if kind == "segment":
        path = rng.choice(segs)
    elif kind == "index":
        path = rng.choice(segs).with_suffix(".idx")
    elif kind == "checkpoint":
        path = log / "checkpoint"
    elif kind == "sealed-index":
        path = rng.choice(sorted(log.glob("*.pix")))
    elif kind == "producer-snapshot":
        path = rng.choice(producer_snapshot.listed(log))
    else:
        path = root / "logs" / "partition-state.json"
    size = path.stat().st_size
    at = rng.randrange(size)
    with open(path, "r+b") as f:
        if op == "flip":
            f.seek(at)
            b = f.read(1)[0]
            f.seek(at)
            f.write(bytes([b ^ (1 << rng.randrange(8))]))
        else:
            f.truncate(at)
    if kind != "segment":
        return path, set(), set()
    seq = int(path.stem)
    last_seq = max(c.seq for c in chunks)
    if op == "flip":
        hit = {c for c in chunks if c.seq == seq and c.start <= at < c.end}
    else:
        hit = {c for c in chunks if c.seq == seq and c.end > at}
    log_end = max(chunks, key=lambda c: (c.seq, c.start))
    if seq == last_seq and (op == "cut" or log_end in hit):
        return path, set(), hit  # the log's end: a torn tail, cut as after a crash
    return path, hit, set()


def _records(store: LogStore, uid: int, offset: int) -> list[tuple[int, bytes]]:
    """The records of the first batch a read at ``offset`` returns."""
    rr = store.partitions[uid].read(offset, 1)
    try:
        data = b"".join(p.read() if isinstance(p, FileSlice) else bytes(p) for p in rr.parts)
    finally:
        rr.release()
    return [(r.offset, r.value) for r in iter_records(data)] if data else []


def _expect(store: LogStore, chunks: list[Chunk], lost: set[Chunk], torn: set[Chunk]) -> None:
    for uid in UIDS:
        p = store.partitions[uid]
        mine = [c for c in chunks if c.uid == uid]
        cut = [c for c in mine if c in torn]
        want_next = min(c.base for c in cut) if cut else (mine[-1].last + 1 if mine else 0)
        assert p.next_offset == want_next, (uid, p.next_offset, want_next)
        fenced = [c for c in mine if c in lost]
        spans: list[tuple[int, int]] = []
        for c in sorted(fenced, key=lambda c: c.base):
            if spans and spans[-1][1] + 1 == c.base:
                spans[-1] = (spans[-1][0], c.last)
            else:
                spans.append((c.base, c.last))
        assert p.lost == spans, (uid, p.lost, spans)
        for c in mine:
            if c in lost:
                assert all(p.lost_at(o) for o in range(c.base, c.last + 1))
            elif c not in torn:
                got = _records(store, uid, c.base)
                assert got == list(zip(range(c.base, c.last + 1), c.values, strict=True)), c


def _scrub(root: Path) -> list[scrub.Finding]:
    return scrub.run(scrub.plan(root))


@pytest.mark.parametrize("seed", range(int(os.environ.get("CORRUPT_SEEDS", "48"))))
def test_damage_to_any_file_costs_only_what_the_model_says(tmp_path, seed):
    rng = random.Random(seed)
    kind = KINDS[seed % len(KINDS)]
    chunks = _write(tmp_path, rng)
    assert len({c.seq for c in chunks}) >= 3  # several segments, so some damage is mid-log
    path, lost, torn = _damage(tmp_path, rng, kind, chunks)

    found = {f.path for f in _scrub(tmp_path) if f.status != scrub.OK}
    assert found == {str(path)}, (kind, found)

    store = _open(tmp_path, verify=True)  # a clean marker is no excuse to skip a frame
    try:
        _expect(store, chunks, lost, torn)
    finally:
        asyncio.run(store.close())
    store = _open(tmp_path, verify=False)  # the fence is durable: no rescan needed
    try:
        assert store.recovery["v0"].clean
        _expect(store, chunks, lost, torn)
        appended = store.partitions[UIDS[0]].append(build_batch([(None, b"after", 1)]))
        assert not store.partitions[UIDS[0]].lost_at(appended.base_offset)
    finally:
        asyncio.run(store.close())
    after = [f for f in _scrub(tmp_path) if f.status != scrub.OK]
    # Recovery rebuilt what was rebuildable; what was lost stays reported, as fenced.
    assert all(f.kind == "segment" and f.recorded for f in after), after
    # The fence outlives even the segment, deleted once none of its chunks lived on.
    assert (tmp_path / "logs" / "v0" / "damaged.json").exists() == bool(lost)


# -- over the wire: one broker process ------------------------------------------------------------
def _cli_scrub(data: Path) -> tuple[int, dict | None, str]:
    r = subprocess.run(
        [sys.executable, "-m", "stratalog.cli", "scrub", "--data-dir", str(data), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    doc = json.loads(r.stdout) if r.stdout.strip() else None
    return r.returncode, doc, r.stderr


def test_a_damaged_chunk_answers_corrupt_message_and_scrub_names_the_files(tmp_path):
    data = tmp_path / "data"
    bp = BrokerProcess(data, settings={"storage.virtual_logs": "1"})
    try:
        bp.start()
        create_topic(bp.bootstrap, TOPIC, 3)
        for i in range(3):
            for part in range(3):
                produce_batches(
                    bp.bootstrap, [[b"p%d-%d-%d" % (part, i, j) for j in range(2)]], part
                )

        code, _doc, err = _cli_scrub(data)
        assert code == 1 and "held by a running broker" in err, err
        bp.stop()

        log = data / "logs" / "v0"
        seg = sorted(log.glob("*.log"))[-1]
        raw = seg.read_bytes()
        frames = frames_of(seg)
        (mid,) = [f for f in frames if b"p1-1-0" in raw[f.position : f.end]]
        with open(seg, "r+b") as f:  # a bit of p1's second batch's records
            f.seek(mid.end - 3)
            b = f.read(1)[0]
            f.seek(mid.end - 3)
            f.write(bytes([b ^ 4]))
        (log / "checkpoint").write_bytes((log / "checkpoint").read_bytes()[:-2])

        code, doc, _ = _cli_scrub(data)
        assert code == 1
        bad = {f["path"]: f for f in doc["files"] if f["status"] != "ok"}
        assert set(bad) == {str(seg), str(log / "checkpoint")}
        assert bad[str(seg)]["ranges"] == [[mid.position, mid.end]]

        bp.settings["storage.verify_on_open"] = "true"
        bp.start()
        for part in (0, 2):
            lo, hi, rows = served(bp.bootstrap, 6, part)
            assert (lo, hi, len(rows)) == (0, 6, 6)
        rows, err = read_until_error(bp.bootstrap, 1, 0, 6)
        assert ([v for _, v in rows], err) == ([b"p1-0-0", b"p1-0-1"], CORRUPT_MESSAGE)
        rows, err = read_until_error(bp.bootstrap, 1, 4, 2)
        assert (rows, err) == ([(4, b"p1-2-0"), (5, b"p1-2-1")], None)
        assert produce_batches(bp.bootstrap, [[b"new"]], 1) == [6]
        bp.stop()

        code, doc, _ = _cli_scrub(data)
        bad = [f for f in doc["files"] if f["status"] != "ok"]
        assert code == 1 and [(f["path"], f["recorded"]) for f in bad] == [(str(seg), True)]
    finally:
        bp.kill()


def test_scrub_checks_the_cold_tier_and_a_damaged_manifest_deletes_nothing(tmp_path):
    cold = ColdStore(str(tmp_path / "cold"))
    cold.create()
    batches = []
    for k in range(4):
        b = bytearray(build_batch([(None, b"c%d" % k, 1_700_000_000_000)]))
        b[0:8] = k.to_bytes(8, "big")  # the base offset, outside the batch CRC
        batches.append(bytes(b))
    meta, _entries = cold.write_segment(7, batches)
    cold.commit(7, [meta])
    part = tmp_path / "cold" / "p7"
    (tmp_path / "data" / "logs").mkdir(parents=True)

    def damaged() -> set[str]:
        p = scrub.plan(tmp_path / "data", cold=tmp_path / "cold")
        return {Path(f.path).name for f in scrub.run(p) if f.status != scrub.OK}

    assert damaged() == set()
    log = part / f"{meta.name}.log"
    raw = bytearray(log.read_bytes())
    raw[len(batches[0]) + 65] ^= 1  # a record of the second batch
    log.write_bytes(bytes(raw))
    assert damaged() == {log.name}
    raw[len(batches[0]) + 65] ^= 1
    raw[2 * len(batches[0]) + 7] ^= 1  # the third batch's base offset: outside its CRC
    log.write_bytes(bytes(raw))
    assert damaged() == {log.name}

    manifest = next(part.glob("manifest-*.json"))
    manifest.write_bytes(manifest.read_bytes()[:-3])
    assert damaged() == {log.name, manifest.name}
    with pytest.raises(ColdTierError, match="no readable manifest"):
        ColdStore(str(tmp_path / "cold")).load(7)
    assert log.exists() and log.with_suffix(".idx").exists()
