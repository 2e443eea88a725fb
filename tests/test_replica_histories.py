"""Replicas converge after any sequence of failovers: three real LogStores, one virtual log.

A seeded schedule writes on the primary (and on a deposed primary that has not noticed yet,
whose pushes reach every backup it has not been fenced from), drops links, fails over to any
replica, and reconnects backups through the primary's real handshake: the backup side is the
Replicator's own handler of Fence and Append, the primary side ``parting_point`` and
``catch_up_append`` as BackupLink uses them. Only the network between them is this test's.

After every reconnect the backup must hold exactly the primary's bytes and the primary's epoch
history; nothing may be refused on the way (a cut that is not a frame boundary, a gap, bytes
of an older epoch). This is the soak's divergence (seed 502: rapid failovers under an etcd
pause left backups whose cut points were not frame boundaries) as a deterministic test.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from stratalog.cluster.replication import NO_CUT, Replicator, catch_up_append
from stratalog.protocol.replication import Ack, Append, Fence, FenceAck, Refused
from stratalog.records import build_batch
from stratalog.storage.journal import FsyncPolicy
from stratalog.storage.log_store import LogStore, StorageConfig
from stratalog.storage.replica import parting_point
from stratalog.storage.virtual_log import WriteBatch

LOG = "g3"
UIDS = (21, 22)


class Wire:
    """What the backup's handler answers, kept in order (the network, not the thing tested)."""

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, msg) -> None:
        if not isinstance(msg, Ack):  # acknowledgements come as fsyncs end: not checked here
            self.sent.append(msg)

    def take(self) -> list:
        out, self.sent = self.sent, []
        return out


class Replica:
    def __init__(self, rid: int, path: Path) -> None:
        self.rid = rid
        config = StorageConfig(
            path,
            fsync=FsyncPolicy.parse("always"),
            group_commit_ms=0.5,
            segment_bytes=2500,  # rolls often, so epochs and cuts fall across segments
            io_threads=1,
        )
        self.store = LogStore(config)
        self.store.open([("t", i, uid, LOG) for i, uid in enumerate(UIDS)])
        self.vlog = self.store.logs[LOG]
        self.handler = Replicator(None, self.store, lag_ms=10_000)  # type: ignore[arg-type]
        self.wire = Wire()
        # Whose live pushes reach this replica, at which epoch (a link is one primary's at one
        # epoch: leading again at a newer epoch starts new links).
        self.following: tuple[Replica, int] | None = None
        self.writing_epoch = -1  # >= 0 while it believes it is the primary

    def segments(self) -> dict[int, bytes]:
        return {
            s: seg.data_path.read_bytes()[: seg.size]
            for s, seg in sorted(self.vlog.segments.items())
            if seg.size
        }


class Cluster:
    def __init__(self, tmp: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.replicas = [Replica(i, tmp / f"r{i}") for i in range(3)]
        self.epoch = 1
        self.primary = self.replicas[0]
        self.n = 0
        self.errors: list[AssertionError] = []
        for r in self.replicas:
            r.vlog.on_write = lambda seq, pos, parts, lsn, r=r: self._push(r, seq, pos, parts)
        self.primary.vlog.begin_epoch(1)
        self.primary.writing_epoch = 1
        for r in self.replicas[1:]:
            self.reconnect(r)

    def _push(self, writer: Replica, seq: int, position: int, parts: list) -> None:
        try:
            for b in self.replicas:
                if b.following != (writer, writer.writing_epoch):
                    continue
                data = b"".join(bytes(p) for p in parts)
                epoch = writer.writing_epoch
                b.handler._on_append(b.wire, Append(LOG, epoch, seq, position, 1, data))
                for msg in b.wire.take():
                    if isinstance(msg, Refused):
                        # Only a deposed writer's push may be refused, and only for its epoch.
                        assert msg.error == "STALE_EPOCH", (msg, writer.rid, b.rid)
                        assert epoch < b.vlog.promised_epoch
                        b.following = None
        except AssertionError as e:  # storage logs what on_write raises; the test must fail
            self.errors.append(e)

    def write(self, writer: Replica) -> None:
        wb = WriteBatch()
        results = []
        for uid in UIDS:
            self.n += 1
            value = self.rng.randbytes(self.rng.randrange(1, 400))
            batch = build_batch([(b"k", value, 1_700_000_000_000 + self.n)])
            results.append(writer.store.partitions[uid].append(batch, writes=wb))
        assert wb.commit() is None
        assert all(r.written for r in results)

    def fail_over(self) -> None:
        """Any other replica leads at a new epoch; the old primary keeps writing until it is
        fenced (it has not noticed yet)."""
        new = self.rng.choice([r for r in self.replicas if r is not self.primary])
        self.epoch += 1
        new.following = None
        new.vlog.begin_epoch(self.epoch)
        new.writing_epoch = self.epoch
        self.primary = new

    def reconnect(self, b: Replica) -> None:
        """The primary's handshake with backup ``b`` (BackupLink._session), then live."""
        p = self.primary
        b.writing_epoch = -1  # fenced by the new primary: it stops leading
        b.handler._on_fence(b.wire, Fence(LOG, self.epoch, *NO_CUT))
        (ack,) = b.wire.take()
        assert isinstance(ack, FenceAck), ack
        end = (ack.end_seq, ack.end_position)
        agree = parting_point(p.vlog.epoch_history, p.vlog.end, ack.history, end)
        if agree < end:
            b.handler._on_fence(b.wire, Fence(LOG, self.epoch, *agree))
            (ack,) = b.wire.take()
            assert isinstance(ack, FenceAck), ack
            assert (ack.end_seq, ack.end_position) == agree
        pos = agree
        while msg := catch_up_append(p.vlog, self.epoch, pos, self.rng.choice([1, 700, 4096])):
            b.handler._on_append(b.wire, msg)
            assert b.wire.take() == [], (b.rid, msg.seq, msg.position)
            pos = (msg.seq, msg.position + msg.nbytes)
        end = p.vlog.end
        b.handler._on_append(b.wire, Append(LOG, self.epoch, *end, p.vlog.lsn, b""))
        b.following = (p, self.epoch)
        assert b.vlog.end == p.vlog.end
        assert b.segments() == p.segments()
        # The same history, but for epochs that never wrote a byte (a primary records its own
        # epoch when it starts leading).
        assert _with_bytes(b) == _with_bytes(p)

    def step(self) -> None:
        roll = self.rng.random()
        if roll < 0.45:
            self.write(self.primary)
        elif roll < 0.6:
            deposed = [r for r in self.replicas if 0 <= r.writing_epoch < self.epoch]
            if deposed:
                self.write(self.rng.choice(deposed))
        elif roll < 0.7:
            self.rng.choice(self.replicas).following = None
        elif roll < 0.82:
            self.fail_over()
        else:
            p = self.primary
            lost = [r for r in self.replicas if r is not p and r.following != (p, self.epoch)]
            if lost:
                self.reconnect(self.rng.choice(lost))


def _with_bytes(r: Replica) -> tuple:
    """r's epoch history without epochs that wrote nothing, each start written as where its
    first byte is: a primary records its epoch at its end, say (6, 2658), and its first write
    may roll to (7, 0), where a backup records it (no byte lies between the two)."""
    h = r.vlog.epoch_history
    out = []
    for i, (e, s, p) in enumerate(h):
        following = h[i + 1][1:] if i + 1 < len(h) else r.vlog.end
        seg = r.vlog.segments.get(s)
        if seg is not None and p == seg.size and (s, p) < r.vlog.end:
            s, p = min(x for x in r.vlog.segments if x > s), 0
        if (s, p) < following:
            out.append((e, s, p))
    return tuple(out)


@pytest.mark.parametrize("seed", range(12))
def test_backups_converge_on_the_primary_after_any_failovers(tmp_path, seed):
    async def run() -> None:
        c = Cluster(tmp_path, seed)
        try:
            for _ in range(120):
                c.step()
                assert not c.errors, c.errors[0]
            for r in c.replicas:  # heal: everyone follows the last primary
                if r is not c.primary:
                    c.reconnect(r)
            assert c.epoch > 3
        finally:
            for r in c.replicas:
                await r.store.close()

    asyncio.run(run())


def test_parting_point_finds_the_newest_common_epoch():
    # KIP-279's case: the follower's last epoch (3) never reached the leader, and its epoch 1
    # ran longer than the leader's; the logs part where the leader's epoch 1 ended.
    leader = [(1, 0, 0), (2, 0, 80), (4, 0, 120)]
    follower = [(1, 0, 0), (3, 0, 100)]
    assert parting_point(leader, (0, 200), follower, (0, 150)) == (0, 80)
    # A follower that is simply behind keeps everything.
    assert parting_point(leader, (0, 200), leader[:2], (0, 90)) == (0, 90)
    # A follower ahead in the leader's own last epoch is cut to the leader's end.
    assert parting_point(leader, (0, 200), leader, (1, 10)) == (0, 200)
    # No epoch in common: it agrees before its first epoch's bytes only.
    assert parting_point([(2, 0, 0)], (0, 50), [(1, 0, 0)], (0, 70)) == (0, 0)
    # Bytes from before epochs: the shorter end.
    assert parting_point(leader, (0, 200), [], (0, 30)) == (0, 30)
