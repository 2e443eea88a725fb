"""Virtual-log replication, storage side: a primary's writes shipped to backups byte for byte.

Two or three LogStores in one process play primary and backups of one named virtual log
("g7"). Produce goes to the primary through PartitionLog.append with a WriteBatch, as the
Produce handler does; whatever ``on_write`` hands over is encoded as an Append, fed to a
ReplicationConnection in random pieces, decoded and appended with ``append_replica``; the
backup's Ack goes back through the codec to ``replica_acked``. Real files in tmp_path, fsync
always, nothing of storage mocked.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratalog.protocol.replication import (
    CLOSED,
    NEED_DATA,
    RECEIVE_CHUNK,
    REFUSED_CORRUPT,
    REFUSED_GAP,
    Ack,
    Append,
    Commit,
    Fence,
    FenceAck,
    Migrated,
    ProtocolError,
    Refused,
    ReplicationConnection,
    encode,
)
from stratalog.records import build_batch
from stratalog.storage.batch import set_base_offset
from stratalog.storage.journal import FsyncPolicy, StorageFailure
from stratalog.storage.log_store import (
    STATE_FILE,
    LogStore,
    RetentionPolicy,
    StorageConfig,
    parse_state,
)
from stratalog.storage.partition import PartitionLog
from stratalog.storage.replica import (
    CorruptReplica,
    NotPrimary,
    PositionUnavailable,
    ReplicaGap,
    StaleEpoch,
)
from stratalog.storage.segment import FRAME_SIZE, frame_header
from stratalog.storage.virtual_log import VirtualLog, WriteBatch

LOG = "g7"
UIDS = (11, 12, 13)
EPOCH = 1


def _store(path: Path, *, segment_bytes: int = 1 << 20, group_ms: float = 1.0) -> LogStore:
    config = StorageConfig(
        path,
        fsync=FsyncPolicy.parse("always"),
        group_commit_ms=group_ms,
        segment_bytes=segment_bytes,
        io_threads=2,
    )
    store = LogStore(config)
    store.open([("t", i, uid, LOG) for i, uid in enumerate(UIDS)])
    return store


class Producer:
    """Idempotent producers writing to the partitions of one store through WriteBatches."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.sequences: dict[tuple[int, int], int] = {}
        self.n = 0

    def batch(self, uid: int) -> bytes:
        pid = 1000 + uid * 10 + self.rng.randrange(2)  # two producers per partition
        seq = self.sequences.get((uid, pid), 0)
        count = self.rng.randrange(1, 6)
        self.sequences[(uid, pid)] = seq + count
        self.n += 1
        value = bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 300)))
        records = [
            (b"k%d" % uid, value + b"%d" % i, 1_700_000_000_000 + self.n) for i in range(count)
        ]
        return build_batch(records, producer_id=pid, producer_epoch=0, base_sequence=seq)

    def round(self, store: LogStore, uids=UIDS) -> int:
        """One Produce request over ``uids``; returns its largest LSN."""
        wb = WriteBatch()
        results = [store.partitions[u].append(self.batch(u), writes=wb) for u in uids]
        assert wb.commit() is None
        assert all(r.written for r in results)
        return max(r.lsn for r in results)


class Link:
    """Primary -> one backup through the codec, delivered when the test says so."""

    def __init__(self, primary: VirtualLog, backup: LogStore, replica_id: int, seed: int) -> None:
        self.primary = primary
        self.backup = backup
        self.vlog = backup.logs[LOG]
        self.replica_id = replica_id
        self.rng = random.Random(seed)
        self.to_backup = ReplicationConnection()
        self.to_primary = ReplicationConnection()
        self.wire: list[list[bytes | memoryview]] = []
        self.connected = True
        self.acked = 0
        self.shipped_before_fsync = 0
        self.shipped: list[tuple[int, int]] = []

    def ship(self, seq: int, position: int, parts: list, lsn: int) -> None:
        if lsn > self.primary.journal.durable:
            self.shipped_before_fsync += 1
        self.shipped.append((seq, position))
        if self.connected:
            self.wire.append(encode(Append(LOG, EPOCH, seq, position, lsn, parts)))

    def _pieces(self, data: bytes) -> list[bytes]:
        cuts = sorted(self.rng.sample(range(1, len(data)), min(3, len(data) - 1)))
        return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]

    def deliver(self, count: int | None = None) -> None:
        todo = self.wire if count is None else self.wire[:count]
        self.wire = [] if count is None else self.wire[count:]
        for parts in todo:
            for piece in self._pieces(b"".join(parts)):
                self.to_backup.receive_data(piece)
            while (msg := self.to_backup.next_event()) is not NEED_DATA:
                self.apply(msg)

    def apply(self, msg: Append) -> None:
        lsn = self.vlog.append_replica(msg.seq, msg.position, msg.data, epoch=msg.epoch)
        end = self.vlog.end

        def durable(ok: bool) -> None:
            if ok:
                self.answer(Ack(LOG, msg.epoch, msg.lsn_end, *end))

        self.vlog.when_durable(lsn, durable)

    def answer(self, msg: Ack) -> None:
        self.to_primary.receive_data(b"".join(encode(msg)))
        got = self.to_primary.next_event()
        assert got == msg
        self.acked = max(self.acked, got.lsn)
        self.primary.replica_acked(self.replica_id, got.lsn)

    def catch_up(self, max_bytes: int) -> int:
        """Copy what the backup lacks with read_range; returns how many reads it took."""
        reads = 0
        while self.vlog.end != self.primary.end:
            seq, position, data = self.primary.read_range(*self.vlog.end, max_bytes)
            assert data, (self.vlog.end, self.primary.end)
            self.apply(
                Append(
                    LOG, EPOCH, seq, position, self.primary.lsn_at(seq, position) + len(data), data
                )
            )
            reads += 1
        return reads


def _wire(primary: LogStore, backups: list[LogStore]) -> list[Link]:
    links = [Link(primary.logs[LOG], b, i + 1, seed=i) for i, b in enumerate(backups)]
    primary.logs[LOG].on_write = lambda *a: [link.ship(*a) for link in links]
    return links


async def _until(cond, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.002)


def _partition_state(p: PartitionLog) -> tuple:
    producers = {
        pid: (e.epoch, [(b.first_seq, b.last_seq, b.base_offset, b.last_offset) for b in e.batches])
        for pid, e in sorted(p.producers.producers.items())
    }
    chunks = [p.chunks[i] for i in range(len(p.chunks))]
    return chunks, p.next_offset, producers


def _state(store: LogStore) -> dict[int, tuple]:
    return {uid: _partition_state(store.partitions[uid]) for uid in UIDS}


def _segment_bytes(store: LogStore, name: str = LOG) -> dict[int, bytes]:
    vlog = store.logs[name]
    return {
        seq: seg.data_path.read_bytes()[: seg.size] for seq, seg in sorted(vlog.segments.items())
    }


def _files(directory: Path, suffix: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*" + suffix))}


def _frame(uid: int, base: int, batch: bytes) -> bytes:
    b = bytearray(batch)
    set_base_offset(b, 0, base)
    return frame_header(uid, b) + bytes(b)


# -- byte identity, partitions, reopening ------------------------------------------------------
def test_backups_are_byte_identical_and_know_every_partition(tmp_path):
    async def run() -> None:
        primary = _store(tmp_path / "p", segment_bytes=8192)
        backups = [_store(tmp_path / f"b{i}", segment_bytes=8192) for i in (1, 2)]
        links = _wire(primary, backups)
        pvlog = primary.logs[LOG]
        pvlog.require_replicas([1, 2])
        prod = Producer(1)
        last = 0
        for r in range(60):
            # Requests over all partitions, over one, and rounds left in flight for a while.
            last = prod.round(primary, UIDS if r % 3 else UIDS[r % 3 : r % 3 + 1])
            if r % 4 == 0:
                for link in links:
                    link.deliver()
        for link in links:
            link.deliver()
        await _until(lambda: pvlog.committed >= last)
        assert all(link.acked >= last for link in links)
        # Each write was handed over before its fsync, so shipping overlaps the local sync.
        assert all(link.shipped_before_fsync > 0 for link in links)
        assert len(pvlog.segments) >= 4
        # Each roll reached the backups as the next seq at position 0, then contiguous writes.
        for link in links:
            seen = link.shipped
            assert seen[0] == (0, 0)
            for (s0, _), (s1, p1) in itertools.pairwise(seen):
                assert (s1, p1 == 0) in ((s0, False), (s0 + 1, True)), (s0, s1, p1)
            assert {s for s, _ in seen} == set(pvlog.segments)
        want = _segment_bytes(primary)
        for b in backups:
            assert b.logs[LOG].end == pvlog.end
            assert _segment_bytes(b) == want
            assert _state(b) == _state(primary)
        # A backup shows records only up to its primary's commit point, which it is told.
        await _until(lambda: pvlog.committed >= pvlog.lsn)
        await asyncio.sleep(0.05)  # (the backups' own fsyncs)
        assert all(b.partitions[u].high_watermark == 0 for b in backups for u in UIDS)
        half = links[0].shipped[len(links[0].shipped) // 2]  # where a write run started
        for b in backups:
            b.logs[LOG].commit_to(*half)
        partial = []
        for b in backups:
            for u in UIDS:
                p = b.partitions[u]
                shown = [p.chunks[i] for i in range(len(p.chunks))]
                # Exactly the chunks whose frames end at or before the commit point.
                want_hw = max(
                    (c.last_offset + 1 for c in shown if (c.segment, c.position + c.size) <= half),
                    default=0,
                )
                assert p.high_watermark == want_hw
                partial.append(0 < want_hw < p.next_offset)
        assert any(partial)  # the commit point fell inside the log, not at an end
        for b in backups:
            b.logs[LOG].commit_to(*pvlog.position_at(pvlog.committed))
        await _until(
            lambda: all(
                b.partitions[u].high_watermark == primary.partitions[u].next_offset
                for b in backups
                for u in UIDS
            )
        )
        for u in UIDS:
            assert primary.partitions[u].high_watermark == primary.partitions[u].next_offset
        state = _state(primary)
        await primary.close()
        for b in backups:
            await b.close()
        for suffix in (".log", ".idx"):
            for b in ("b1", "b2"):
                assert _files(tmp_path / b / "logs" / LOG, suffix) == _files(
                    tmp_path / "p" / "logs" / LOG, suffix
                )
        # A backup closed and opened again recovers the same partitions.
        again = _store(tmp_path / "b1", segment_bytes=8192)
        assert _state(again) == state
        for u in UIDS:
            assert again.partitions[u].high_watermark == again.partitions[u].next_offset
        await again.close()

    asyncio.run(run())


def test_a_crashed_backup_recovers_what_it_took(tmp_path):
    async def run() -> None:
        primary = _store(tmp_path / "p", segment_bytes=8192)
        backup = _store(tmp_path / "b", segment_bytes=8192)
        (link,) = _wire(primary, [backup])
        prod = Producer(2)
        for _ in range(30):
            prod.round(primary)
        link.deliver()
        await _until(lambda: link.acked >= primary.logs[LOG].lsn)
        state = _state(primary)
        backup.abandon()  # no flush, no checkpoint, no clean-shutdown marker: a scan
        again = _store(tmp_path / "b", segment_bytes=8192)
        assert _state(again) == state
        assert _segment_bytes(again) == _segment_bytes(primary)
        assert again.recovery[LOG].scanned_frames > 0
        await again.close()
        await primary.close()

    asyncio.run(run())


# -- the commit gate ---------------------------------------------------------------------------
def test_commit_waits_for_every_required_replica_and_a_smaller_set_releases(tmp_path):
    async def run() -> None:
        primary = _store(tmp_path / "p")
        backups = [_store(tmp_path / f"b{i}") for i in (1, 2)]
        l1, l2 = _wire(primary, backups)
        pvlog = primary.logs[LOG]
        p = primary.partitions[UIDS[0]]
        prod = Producer(3)
        assert pvlog.committed == pvlog.journal.durable  # single node: local durability

        pvlog.require_replicas({1, 2})
        fired: list[bool] = []
        lsn = prod.round(primary, UIDS[:1])
        pvlog.when_durable(lsn, fired.append)
        await _until(lambda: pvlog.journal.durable >= lsn)
        await asyncio.sleep(0.02)
        assert fired == [] and p.high_watermark == 0 and pvlog.committed < lsn
        l1.deliver()
        await _until(lambda: l1.acked >= lsn)
        await asyncio.sleep(0.02)
        assert fired == [] and p.high_watermark == 0  # one of two is not enough
        l2.deliver()
        await _until(lambda: fired == [True])
        assert p.high_watermark == p.next_offset and pvlog.committed >= lsn

        # Backup 2 stops answering; dropping it from the in-sync set releases the waiter.
        lsn2 = prod.round(primary, UIDS[:1])
        pvlog.when_durable(lsn2, fired.append)
        l1.deliver()
        l2.connected = False
        await _until(lambda: l1.acked >= lsn2 and pvlog.journal.durable >= lsn2)
        await asyncio.sleep(0.02)
        assert fired == [True] and p.high_watermark < p.next_offset
        pvlog.require_replicas({1})
        assert fired == [True, True] and p.high_watermark == p.next_offset

        # A replica that rejoins must acknowledge again before a commit counts on it.
        pvlog.require_replicas({1, 2})
        lsn3 = prod.round(primary, UIDS[:1])
        pvlog.when_durable(lsn3, fired.append)
        l1.deliver()
        await _until(lambda: l1.acked >= lsn3 and pvlog.journal.durable >= lsn3)
        await asyncio.sleep(0.02)
        assert len(fired) == 2
        pvlog.require_replicas(())  # back to local durability
        assert fired == [True, True, True]

        # A failed journal still fails the waiters.
        pvlog.require_replicas({1})
        lsn4 = prod.round(primary, UIDS[:1])
        pvlog.when_durable(lsn4, fired.append)
        await _until(lambda: pvlog.journal.durable >= lsn4)
        pvlog.journal.fail(StorageFailure("disk gone"))
        assert fired[-1] is False
        late: list[bool] = []
        pvlog.when_durable(lsn4, late.append)
        assert late == [False]
        primary.abandon()
        for b in backups:
            await b.close()

    asyncio.run(run())


# -- refusals ----------------------------------------------------------------------------------
def test_a_gap_or_a_corrupt_frame_is_refused_with_nothing_written(tmp_path):
    async def run() -> None:
        primary = _store(tmp_path / "p")
        backup = _store(tmp_path / "b")
        (link,) = _wire(primary, [backup])
        prod = Producer(4)
        for _ in range(3):
            prod.round(primary)
        first, second, third = (
            Append(LOG, EPOCH, m.seq, m.position, m.lsn_end, bytes(m.data))
            for m in (_decoded(parts) for parts in link.wire)
        )
        link.wire.clear()
        bvlog = backup.logs[LOG]
        link.apply(first)
        before = _backup_snapshot(backup)

        def refused(seq: int, position: int, data: bytes, exc: type) -> Exception:
            with pytest.raises(exc) as info:
                bvlog.append_replica(seq, position, data)
            assert _backup_snapshot(backup) == before  # nothing written, nothing recorded
            return info.value

        gap = refused(third.seq, third.position, third.data, ReplicaGap)
        assert (gap.expected_seq, gap.expected_position) == bvlog.end
        refused(second.seq + 1, 5, second.data, ReplicaGap)  # a new segment starts at 0
        refused(second.seq, 0, second.data, ReplicaGap)  # behind the end
        # The refusal travels back through the codec.
        conn = ReplicationConnection()
        answer = Refused(LOG, EPOCH, REFUSED_GAP, gap.expected_seq, gap.expected_position)
        conn.receive_data(b"".join(encode(answer)))
        assert conn.next_event() == answer

        data = second.data
        frames = _frame_spans(data)
        assert len(frames) == 3  # one frame per partition of the request
        flipped_payload = bytearray(data)
        flipped_payload[frames[1][1] - 3] ^= 0x40  # in a batch's records: its CRC fails
        flipped_header = bytearray(data)
        flipped_header[frames[2][0] + 4] ^= 0x01  # in a frame CRC
        flipped_offset = bytearray(data)
        flipped_offset[frames[0][0] + FRAME_SIZE + 7] ^= 0x01  # base offset: frame CRC fails
        for bad in (flipped_payload, flipped_header, flipped_offset, data[:-1], data + b"\0" * 80):
            e = refused(second.seq, second.position, bytes(bad), CorruptReplica)
            assert str(e)
        # A valid frame whose partition's offsets do not continue.
        uid, base = UIDS[0], backup.partitions[UIDS[0]].next_offset + 7
        jump = _frame(uid, base, prod.batch(uid))
        refused(second.seq, second.position, jump, CorruptReplica)

        link.apply(second)
        link.apply(third)
        assert _segment_bytes(backup) == _segment_bytes(primary)
        assert _state(backup) == _state(primary)
        await primary.close()
        await backup.close()

    asyncio.run(run())


def _decoded(parts: list) -> Append:
    conn = ReplicationConnection()
    conn.receive_data(b"".join(parts))
    return conn.next_event()


def _frame_spans(data: bytes) -> list[tuple[int, int]]:
    out, at = [], 0
    while at < len(data):
        (batch_len,) = struct.unpack_from(">i", data, at + FRAME_SIZE + 8)
        end = at + FRAME_SIZE + 12 + batch_len
        out.append((at, end))
        at = end
    return out


def _backup_snapshot(store: LogStore) -> tuple:
    vlog = store.logs[LOG]
    seg = vlog.active
    return (
        vlog.end,
        vlog.lsn,
        seg.data_path.stat().st_size,
        len(seg.read_index()),
        sorted(vlog.segments),
        _state(store),
    )


# -- truncation --------------------------------------------------------------------------------
def test_truncation_drops_exactly_the_later_frames_of_every_partition(tmp_path):
    async def run() -> None:
        primary = _store(tmp_path / "p", segment_bytes=6000)
        backup = _store(tmp_path / "b", segment_bytes=6000)
        (link,) = _wire(primary, [backup])
        prod = Producer(5)
        for _ in range(40):
            prod.round(primary)
        writes = [_decoded(parts) for parts in link.wire]
        link.deliver()
        await _until(lambda: link.acked >= primary.logs[LOG].lsn)
        bvlog = backup.logs[LOG]
        assert len(bvlog.segments) >= 4
        # Cut at a write that starts inside an early segment: later segments go too.
        cut = next(w for w in writes if w.seq == min(bvlog.segments) + 1 and w.position > 0)
        where = (cut.seq, cut.position)
        later_files = [bvlog.segments[s].data_path for s in bvlog.segments if s > cut.seq]
        full = _state(primary)

        with pytest.raises(ValueError, match="frame boundary"):
            backup.truncate_log(LOG, cut.seq, cut.position + 1)
        backup.truncate_log(LOG, *where)

        assert bvlog.end == where
        assert sorted(bvlog.segments) == [
            s for s in sorted(primary.logs[LOG].segments) if s <= cut.seq
        ]
        assert not any(p.exists() for p in later_files)
        want = _segment_bytes(primary)
        got = _segment_bytes(backup)
        assert got == {
            s: (b if s < cut.seq else b[: cut.position]) for s, b in want.items() if s <= cut.seq
        }
        for uid in UIDS:
            chunks, _next, _producers = full[uid]
            kept = [c for c in chunks if (c.segment, c.position - FRAME_SIZE) < where]
            p = backup.partitions[uid]
            assert [p.chunks[i] for i in range(len(p.chunks))] == kept
            assert len(kept) < len(chunks)  # every partition lost its later chunks
            first_cut = chunks[len(kept)].base_offset
            assert p.next_offset == first_cut and p.high_watermark <= first_cut
            for entry in p.producers.producers.values():
                assert all(b.base_offset < first_cut for b in entry.batches)

        # The backup reopens at the cut, then catches up to byte identity again.
        await backup.close()
        backup = _store(tmp_path / "b", segment_bytes=6000)
        bvlog = backup.logs[LOG]
        assert bvlog.end == where
        (link,) = _wire(primary, [backup])
        link.catch_up(max_bytes=3000)
        assert _segment_bytes(backup) == want
        assert _state(backup) == full
        await primary.close()
        await backup.close()

    asyncio.run(run())


def test_truncation_fails_the_waiters_of_cut_bytes_only(tmp_path):
    async def run() -> None:
        primary = _store(tmp_path / "p")
        backup = _store(tmp_path / "b", group_ms=60_000)  # nothing gets durable by itself
        (link,) = _wire(primary, [backup])
        prod = Producer(6)
        for _ in range(4):
            prod.round(primary)
        writes = [_decoded(parts) for parts in link.wire]
        link.wire.clear()
        bvlog = backup.logs[LOG]
        fired: dict[int, list[bool]] = {}
        for i, w in enumerate(writes):
            lsn = bvlog.append_replica(w.seq, w.position, w.data)
            bvlog.when_durable(lsn, fired.setdefault(i, []).append)
        backup.truncate_log(LOG, writes[2].seq, writes[2].position)
        assert fired[2] == [False] and fired[3] == [False]
        assert fired[0] == [] and fired[1] == []  # before the cut: still to come
        for u in UIDS:
            assert backup.partitions[u].high_watermark == 0
        await backup.close()  # drains the journal: what was not cut becomes durable
        assert fired == {0: [True], 1: [True], 2: [False], 3: [False]}
        again = _store(tmp_path / "b")
        assert again.logs[LOG].end == (writes[2].seq, writes[2].position)
        for u in UIDS:
            chunks = [again.partitions[u].chunks[i] for i in range(len(again.partitions[u].chunks))]
            assert len(chunks) == 2
        await again.close()
        await primary.close()

    asyncio.run(run())


# -- catch-up ----------------------------------------------------------------------------------
@pytest.mark.parametrize("max_bytes", [1, 700, 1 << 20])
def test_read_range_catches_a_lagging_backup_up_across_rolls(tmp_path, max_bytes):
    async def run() -> None:
        primary = _store(tmp_path / "p", segment_bytes=4000)
        backup = _store(tmp_path / "b", segment_bytes=4000)
        (link,) = _wire(primary, [backup])
        prod = Producer(7)
        link.connected = False  # the backup is away
        for _ in range(30):
            prod.round(primary)
        pvlog = primary.logs[LOG]
        assert len(pvlog.segments) >= 4
        reads = link.catch_up(max_bytes)
        assert reads >= len(pvlog.segments)  # a read never spans segments
        if max_bytes == 1:
            assert reads == sum(len(_frame_spans(b)) for b in _segment_bytes(primary).values())
        assert _segment_bytes(backup) == _segment_bytes(primary)
        assert _state(backup) == _state(primary)
        # Caught up: live shipping continues from the same position.
        link.connected = True
        for _ in range(10):
            prod.round(primary)
        link.deliver()
        assert _segment_bytes(backup) == _segment_bytes(primary)
        assert _state(backup) == _state(primary)
        await _until(lambda: link.acked >= pvlog.lsn)
        await primary.close()
        await backup.close()

    asyncio.run(run())


def test_a_backup_behind_the_primarys_retention_starts_over_at_its_oldest_segment(tmp_path):
    async def run() -> None:
        primary = _store(tmp_path / "p", segment_bytes=4000)
        backup = _store(tmp_path / "b", segment_bytes=4000)
        (link,) = _wire(primary, [backup])
        prod = Producer(11)
        for _ in range(6):
            prod.round(primary)
        link.deliver()
        link.connected = False
        for _ in range(40):
            prod.round(primary)
        pvlog, bvlog = primary.logs[LOG], backup.logs[LOG]
        await _until(lambda: pvlog.committed >= pvlog.lsn)
        full = _state(primary)
        dropped = primary.apply_retention(
            {u: RetentionPolicy(retention_ms=-1, retention_bytes=8000) for u in UIDS}
        )
        assert dropped and min(pvlog.segments) > bvlog.end[0]
        with pytest.raises(PositionUnavailable) as info:
            pvlog.read_range(*bvlog.end, 1 << 20)
        first = (info.value.first_seq, info.value.first_position)
        # What the backup holds no longer continues the primary's log: it starts over there.
        backup.truncate_log(LOG, min(bvlog.segments), 0)
        assert all(len(backup.partitions[u].chunks) == 0 for u in UIDS)
        seq, position, data = pvlog.read_range(*first, 1 << 20)
        link.apply(Append(LOG, EPOCH, seq, position, pvlog.lsn_at(seq, position) + len(data), data))
        link.catch_up(1 << 20)
        assert sorted(bvlog.segments) == sorted(pvlog.segments)
        assert _segment_bytes(backup) == _segment_bytes(primary)
        now = _state(primary)
        for u in UIDS:
            b = backup.partitions[u]
            mine = [b.chunks[i] for i in range(len(b.chunks))]
            assert b.next_offset == primary.partitions[u].next_offset
            assert b.log_start_offset == mine[0].base_offset > 0
            # Retention is each broker's: the backup may hold more of a segment it kept.
            assert mine == full[u][0][-len(mine) :]
            assert now[u][0] == mine[-len(now[u][0]) :]
        await primary.close()
        await backup.close()

    asyncio.run(run())


def test_read_range_edges(tmp_path):
    async def run() -> None:
        primary = _store(tmp_path / "p", segment_bytes=3000)
        prod = Producer(8)
        for _ in range(12):
            prod.round(primary)
        vlog = primary.logs[LOG]
        first = min(vlog.segments)
        size = vlog.segments[first].size
        seq, position, data = vlog.read_range(first, size, 100)  # a segment's end: the next
        assert (seq, position) == (first + 1, 0) and data
        assert vlog.read_range(*vlog.end, 100) == (*vlog.end, b"")
        with pytest.raises(ValueError, match="no frame starts"):
            vlog.read_range(first, 3, 100)
        with pytest.raises(ValueError, match="past the end"):
            vlog.read_range(vlog.end[0], vlog.end[1] + 1, 100)
        with pytest.raises(PositionUnavailable) as info:
            vlog.read_range(first - 1, 0, 100)
        assert (info.value.first_seq, info.value.first_position) == (first, 0)
        # lsn_at: positions written by this process map to their LSN, the end to the last.
        assert vlog.lsn_at(*vlog.end) == vlog.lsn
        assert vlog.lsn_at(first, 0) == 0
        await primary.close()

    asyncio.run(run())


# -- named logs, partitions added late, epochs -------------------------------------------------
def test_named_logs_are_remembered_and_checked(tmp_path):
    async def run() -> None:
        store = LogStore(StorageConfig(tmp_path, fsync=FsyncPolicy.parse("never")))
        store.open([("a", 0, 1), ("a", 1, 2, None), ("b", 0, 3, "g9")])
        assert store.partitions[1].vlog.name == "v1" and store.partitions[3].vlog.name == "g9"
        store.add_partition("c", 0, 4, log_name="g9")
        store.add_partition("c", 1, 5)
        assert store.partitions[4].vlog is store.partitions[3].vlog
        state = parse_state((tmp_path / "logs" / STATE_FILE).read_bytes())
        assert state["3"]["log"] == "g9" and state["4"]["log"] == "g9"
        assert state["5"]["log"] == "v1"
        for bad in ("p7", "promoted", "../x", "", ".hidden", "a/b"):
            with pytest.raises(ValueError):
                store.add_partition("d", 0, 99, log_name=bad)
        store.partitions[4].append(build_batch([(b"k", b"v", 1)]))
        await store.close()
        again = LogStore(StorageConfig(tmp_path, fsync=FsyncPolicy.parse("never")))
        with pytest.raises(ValueError, match="lives in log 'g9'"):
            again.open([("c", 0, 4, "g8")])
        again.executor.shutdown()
        again = LogStore(StorageConfig(tmp_path, fsync=FsyncPolicy.parse("never")))
        again.open([("b", 0, 3), ("c", 0, 4, "g9")])  # the remembered log, named or not
        assert again.partitions[4].vlog.name == "g9" and again.partitions[4].next_offset == 1
        await again.close()

    asyncio.run(run())


def test_frames_of_a_partition_not_added_yet_wait_for_it(tmp_path):
    async def run() -> None:
        primary = _store(tmp_path / "p", segment_bytes=5000)
        late = 14
        primary.add_partition("t", 3, late, log_name=LOG)
        backup = _store(tmp_path / "b", segment_bytes=5000)  # knows nothing of partition 14
        (link,) = _wire(primary, [backup])
        prod = Producer(9)
        for _ in range(20):
            prod.round(primary, (*UIDS, late))
        link.deliver()
        want = _partition_state(primary.partitions[late])
        await backup.close()
        backup = _store(tmp_path / "b", segment_bytes=5000)  # a restart: still unknown
        (link,) = _wire(primary, [backup])
        for _ in range(5):
            prod.round(primary, (*UIDS, late))
        link.deliver()
        want = _partition_state(primary.partitions[late])
        p = backup.add_partition("t", 3, late, log_name=LOG)
        assert _partition_state(p) == want
        assert _segment_bytes(backup) == _segment_bytes(primary)
        await primary.close()
        await backup.close()

    asyncio.run(run())


def test_epochs_are_promised_durably_and_fence_older_writers(tmp_path):
    async def run() -> None:
        primary = _store(tmp_path / "p")
        backup = _store(tmp_path / "b")
        (link,) = _wire(primary, [backup])
        pvlog, bvlog = primary.logs[LOG], backup.logs[LOG]
        pvlog.begin_epoch(1)
        prod = Producer(10)
        for _ in range(2):
            prod.round(primary)
        w1 = [_decoded(parts) for parts in link.wire]
        link.wire.clear()
        for w in w1:
            bvlog.append_replica(w.seq, w.position, w.data, epoch=1)
        # A new primary (epoch 2) fences the backup: promise, cut to its end.
        bvlog.promise_epoch(2)
        with pytest.raises(StaleEpoch):
            bvlog.promise_epoch(1)
        prod.round(primary)
        (w,) = [_decoded(parts) for parts in link.wire]
        link.wire.clear()
        size = bvlog.active.size
        with pytest.raises(StaleEpoch):
            bvlog.append_replica(w.seq, w.position, w.data, epoch=1)  # the deposed primary
        assert bvlog.active.size == size
        bvlog.append_replica(w.seq, w.position, w.data, epoch=2)
        assert bvlog.epochs.starts == [(1, 0, 0), (2, w.seq, w.position)]
        assert bvlog.epoch_end(1) == (w.seq, w.position) and bvlog.epoch_end(2) == bvlog.end
        assert pvlog.epoch_end(1) == pvlog.end
        await backup.close()
        backup = _store(tmp_path / "b")
        bvlog = backup.logs[LOG]
        assert bvlog.promised_epoch == 2
        assert bvlog.epochs.starts == [(1, 0, 0), (2, w.seq, w.position)]
        backup.truncate_log(LOG, w.seq, w.position)  # epoch 2's bytes cut: it is forgotten
        assert bvlog.epochs.starts == [(1, 0, 0)] and bvlog.promised_epoch == 2
        await backup.close()
        await primary.close()

    asyncio.run(run())


# -- the codec ---------------------------------------------------------------------------------
_names = st.text(min_size=0, max_size=20)
_u = st.integers(min_value=0, max_value=(1 << 63) - 1)
_opt = st.integers(min_value=-1, max_value=(1 << 63) - 1)


@st.composite
def _appends(draw):
    epoch = draw(_u)
    data_epoch = draw(st.integers(min_value=-1, max_value=epoch))
    fields = [draw(_u) for _ in range(3)]
    return Append(draw(_names), epoch, *fields, draw(st.binary(max_size=300)), data_epoch)


_messages = st.one_of(
    _appends(),
    st.builds(Ack, _names, _u, _u, _u, _u),
    st.builds(Fence, _names, _u, _u, _u),
    st.builds(FenceAck, _names, _u, _u, _u, st.lists(st.tuples(_u, _u, _u), max_size=5).map(tuple)),
    st.builds(Refused, _names, _opt, st.text(max_size=30), _opt, _opt),
    st.builds(Commit, _names, _u, _u, _u),
    st.builds(Migrated, _names, _u, _u),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_messages, max_size=8), st.data())
def test_codec_round_trips_through_any_split(messages, data):
    stream = b"".join(b"".join(encode(m)) for m in messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    conn = ReplicationConnection()
    got = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        if a == b:
            continue  # b"" would say the stream ended
        conn.receive_data(stream[a:b])
        while (m := conn.next_event()) is not NEED_DATA:
            got.append(m)
    conn.receive_data(b"")
    assert conn.next_event() is CLOSED
    assert got == messages


def _recv_into(conn: ReplicationConnection, stream: bytes, sizes: list[int]) -> tuple[list, list]:
    """Deliver ``stream`` as a socket does to a BufferedProtocol: each read fills at most what
    ``get_buffer`` offers (and at most the next of ``sizes``); returns the messages and the
    buffers the bytes went into."""
    got, buffers, at, i = [], [], 0, 0
    while at < len(stream):
        into = conn.get_buffer(-1)
        buffers.append(into.obj)
        n = min(len(into), len(stream) - at, sizes[i % len(sizes)] if sizes else len(stream))
        into[:n] = stream[at : at + n]
        at += n
        i += 1
        conn.buffer_updated(n)
        while (m := conn.next_event()) is not NEED_DATA:
            got.append(m)
    return got, buffers


def test_a_large_appends_bytes_are_received_where_they_stay():
    payload = bytes(range(256)) * 4096  # 1 MiB: a frame of its own
    parts = encode(Append(LOG, 3, 2, 4096, 99, [b"head", memoryview(payload)]))
    assert parts[-1].obj is payload and parts[-2] == b"head"  # sent as it is
    stream = b"".join(encode(Ack(LOG, 1, 2, 3, 4))) + b"".join(parts)
    conn = ReplicationConnection()
    got, buffers = _recv_into(conn, stream, [1000, 70_000, 300_000])
    ack, msg = got
    assert ack == Ack(LOG, 1, 2, 3, 4)
    assert isinstance(msg.data, memoryview) and bytes(msg.data) == b"head" + payload
    # The data is a view of one buffer the socket's reads went into (after the first read's
    # start of the frame was moved there): no copy of it was made after the reads.
    frame = msg.data.obj
    assert any(b is frame for b in buffers)
    assert sum(1 for b in buffers if b is frame) >= 3


_big_appends = st.builds(
    Append,
    _names,
    _u,
    _u,
    _u,
    _u,
    st.integers(0, 3 * RECEIVE_CHUNK).map(lambda n: bytes(i % 251 for i in range(n))),
)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.one_of(_messages, _big_appends), max_size=6),
    st.lists(st.integers(1, 3 * RECEIVE_CHUNK), min_size=1, max_size=8),
)
def test_codec_round_trips_through_any_buffered_reads(messages, sizes):
    stream = b"".join(b"".join(encode(m)) for m in messages)
    conn = ReplicationConnection()
    got, _ = _recv_into(conn, stream, sizes)
    conn.receive_data(b"")
    assert conn.next_event() is CLOSED
    assert [(type(m), bytes(m.data) if isinstance(m, Append) else m) for m in got] == [
        (type(m), bytes(m.data) if isinstance(m, Append) else m) for m in messages
    ]


def test_the_rest_of_a_large_frame_and_what_follows_it_in_one_receive():
    """A large frame set up by next_event, then its rest and the next message in one
    receive_data: both come out (receive_data once spun on the full frame's empty rest)."""
    big = Append(LOG, 1, 0, 0, 1, bytes(range(256)) * 400)  # 102,400 B: a frame of its own
    small = Ack(LOG, 1, 2, 3, 4)
    stream = b"".join(encode(big)) + b"".join(encode(small))
    conn = ReplicationConnection()
    conn.receive_data(stream[:1000])
    assert conn.next_event() is NEED_DATA  # the frame has a buffer of its own now
    conn.receive_data(bytearray(stream[1000:]))
    got = [conn.next_event(), conn.next_event()]
    assert bytes(got[0].data) == bytes(big.data) and got[1] == small
    assert conn.next_event() is NEED_DATA


def test_a_stream_that_ends_inside_a_large_frame_is_a_protocol_error():
    whole = b"".join(encode(Append(LOG, 1, 0, 0, 1, bytes(4 * RECEIVE_CHUNK))))
    conn = ReplicationConnection()
    got, _ = _recv_into(conn, whole[: 2 * RECEIVE_CHUNK], [RECEIVE_CHUNK])
    assert got == []
    conn.receive_data(b"")
    with pytest.raises(ProtocolError, match="stream ended inside a frame"):
        conn.next_event()


_MESSAGE_TYPES = Append | Ack | Fence | FenceAck | Refused | Commit | Migrated


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.lists(_messages, max_size=3), st.data())
def test_garbage_is_a_protocol_error_never_a_crash(garbage, messages, data):
    stream = bytearray(b"".join(b"".join(encode(m)) for m in messages) + garbage)
    for _ in range(data.draw(st.integers(0, 4))):
        if stream:
            i = data.draw(st.integers(0, len(stream) - 1))
            stream[i] ^= data.draw(st.integers(1, 255))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    conn = ReplicationConnection(max_frame_bytes=4096)
    try:
        for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            if a < b:
                conn.receive_data(bytes(stream[a:b]))
                while (m := conn.next_event()) is not NEED_DATA:
                    assert isinstance(m, _MESSAGE_TYPES)
        conn.receive_data(b"")
        while (m := conn.next_event()) is not CLOSED:
            assert isinstance(m, _MESSAGE_TYPES)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            conn.next_event()  # the connection stays failed


def test_bytes_newer_than_the_fencing_epoch_are_refused():
    with pytest.raises(ValueError, match="older epoch"):
        encode(Append(LOG, 3, 0, 0, 0, b"", 4))
    good = b"".join(encode(Append(LOG, 3, 0, 0, 0, b"")))
    at = 4 + 2 + 1 + len(LOG) + 32  # the data epoch, after the four integers
    bad = good[:at] + struct.pack(">q", 4) + good[at + 8 :]
    conn = ReplicationConnection()
    conn.receive_data(bad)
    with pytest.raises(ProtocolError, match="older epoch"):
        conn.next_event()


def test_a_frame_too_large_is_refused_before_it_arrives():
    conn = ReplicationConnection(max_frame_bytes=1 << 20)
    conn.receive_data(struct.pack(">I", (1 << 20) + 1))
    with pytest.raises(ProtocolError, match="outside"):
        conn.next_event()
    stray = b"".join(encode(Ack(LOG, 1, 2, 3, 4)))[4:] + b"!"
    for bad in (
        b"\x00\x00\x00\x02\x09\x01",  # unknown version
        b"\x00\x00\x00\x02\x01\x63",  # unknown type
        b"\x00\x00\x00\x03\x01\x02\x05",  # a name longer than the frame
        struct.pack(">I", len(stray)) + stray,  # a byte after the message
        b"".join(encode(Refused(LOG, 1, REFUSED_CORRUPT, 0, 0)))[:-16]
        + struct.pack(">qq", -2, 0),  # a position below -1
    ):
        conn = ReplicationConnection()
        conn.receive_data(bad)
        with pytest.raises(ProtocolError):
            conn.next_event()
    conn = ReplicationConnection()
    conn.receive_data(b"".join(encode(Ack(LOG, 1, 2, 3, 4)))[:-1])
    conn.receive_data(b"")
    with pytest.raises(ProtocolError, match="inside a frame"):
        conn.next_event()
    with pytest.raises(ValueError):
        encode(Ack(LOG, -1, 0, 0, 0))
    with pytest.raises(ValueError):
        encode(Fence("x" * 300, 1, 0, 0))


def test_a_replicated_log_takes_local_appends_only_while_it_leads(tmp_path):
    """A backup's copy holds only its primary's bytes: an offsets commit or a produce that
    reaches a broker which does not lead the log is refused (NotPrimary, a StorageFailure the
    broker answers as NOT_LEADER_OR_FOLLOWER / NOT_COORDINATOR), with nothing written."""

    async def run() -> None:
        config = StorageConfig(
            tmp_path, fsync=FsyncPolicy.parse("always"), io_threads=1, replicated=True
        )
        store = LogStore(config)
        store.open([("t", 0, 11, LOG)])
        p, vlog = store.partitions[11], store.logs[LOG]
        assert not p.leading
        with pytest.raises(NotPrimary):
            p.append(build_batch([(b"k", b"v", 1)]), writes=WriteBatch())
        assert vlog.end == (vlog.active.seq, 0) and p.next_offset == 0
        vlog.leading = True  # the replicator made this broker its primary
        wb = WriteBatch()
        res = p.append(build_batch([(b"k", b"v", 1)]), writes=wb)
        assert wb.commit() is None and res.written and p.next_offset == 1
        await store.close()

    asyncio.run(run())


def test_a_promoted_backup_commits_what_it_took_only_once_acknowledged(tmp_path):
    """A backup took bytes its primary had not committed; promoted, it must not count them
    committed (nor show them) until its in-sync backups acknowledge them."""

    async def run() -> None:
        primary, backup = _store(tmp_path / "p"), _store(tmp_path / "b")
        (link,) = _wire(primary, [backup])
        prod = Producer(5)
        pvlog, bvlog = primary.logs[LOG], backup.logs[LOG]
        prod.round(primary)
        link.deliver()
        await _until(lambda: pvlog.committed >= pvlog.lsn)
        bvlog.commit_to(*pvlog.position_at(pvlog.committed))  # the first round: committed
        committed_end = bvlog.end
        prod.round(primary)
        link.deliver()  # the second: here, never committed by the old primary
        await _until(lambda: bvlog.journal.durable >= bvlog.lsn)
        shown = {u: backup.partitions[u].high_watermark for u in UIDS}
        assert all(0 < shown[u] < backup.partitions[u].next_offset for u in UIDS)
        # Promoted with one in-sync backup (id 9), as PrimaryLog does it.
        bvlog.leading = True
        bvlog.require_replicas([9], committed=bvlog.lsn_at(*bvlog.primary_commit))
        assert bvlog.committed == bvlog.lsn_at(*committed_end) < bvlog.lsn
        fired = []
        bvlog.when_durable(bvlog.lsn, fired.append)
        await asyncio.sleep(0.05)
        assert fired == []
        bvlog.replica_acked(9, bvlog.lsn)
        assert fired == [True]
        await primary.close()
        await backup.close()

    asyncio.run(run())
