"""A replica's damaged bytes are sent again by its primary (cluster/damage_repair.py).

Three broker processes and a real etcd. A backup is stopped, bytes in the middle of each of its
segment files are overwritten, and it starts again with ``storage.verify_on_open``: recovery
steps over the damage (alone, those chunks would be lost and answer CORRUPT_MESSAGE). The
oracles do not ask the code under test: the producer's delivery reports say what was
acknowledged, the repaired copy's segment files are compared byte for byte with the primary's,
and, once the two other brokers are stopped, the repaired broker alone serves every
acknowledged record to a consumer.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from stratalog.cluster.damage_repair import DamageRepair
from stratalog.cluster.etcd_server import EtcdServer
from stratalog.cluster.node import ClusterNode
from stratalog.cluster.placement import VirtualLogState
from stratalog.records import build_batch
from stratalog.storage.journal import FsyncPolicy
from stratalog.storage.log_store import LogStore, StorageConfig

from .test_replication import (
    _Acks,
    _check,
    _create,
    _metadata,
    _read_all,
    _segments_identical,
    _wait_in_sync,
)

TOPIC = "damaged"


def _damage(logs: Path) -> list[tuple[str, int]]:
    """Overwrite 64 bytes at 40% of every segment file under ``logs`` (valid frames follow
    them); returns (segment, position) of each."""
    hit = []
    for seg in sorted(logs.glob("g*/*.log")):
        size = seg.stat().st_size
        if size < 64 * 1024:
            continue
        at = size * 2 // 5
        with open(seg, "r+b") as f:
            f.seek(at)
            old = f.read(64)
            f.seek(at)
            f.write(bytes(b ^ 0x5A for b in old))
        hit.append((f"{seg.parent.name}/{seg.name}", at))
    return hit


@pytest.mark.parametrize("stop", ["clean", "kill-9"])
def test_a_damaged_copy_is_sent_again_and_then_serves_every_record(short_lag_cluster, stop):
    """Clean: a backup (its logs handed over at the stop). kill -9: the primary of partition
    0, back before its lease ends, so it still leads that log at its old epoch: it hands the
    log over, then is repaired as a backup."""
    cluster = short_lag_cluster
    first = cluster.brokers[0].bootstrap
    _create(first, TOPIC)
    _wait_in_sync(first, TOPIC, 3)
    acks = _Acks()
    # Batches of 16 KB: damage at 40% of a segment costs a few chunks, not all before it.
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                  "enable.idempotence": True, "linger.ms": 2, "batch.size": 16384})  # fmt: skip
    for i in range(6000):
        p.produce(TOPIC, b"d%06d" % i + b"." * 200, key=b"%d" % (i % 89), on_delivery=acks)
        if i % 200 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert acks.failed == [] and len(acks.acked) == 6000
    _wait_in_sync(first, TOPIC, 3)

    leader = _metadata(first, TOPIC)["partitions"][0]["leader_id"]
    victim = next(b for b in cluster.brokers if (b.node_id == leader) == (stop == "kill-9"))
    others = [b for b in cluster.brokers if b is not victim]
    cluster.stop_broker(victim, signal.SIGKILL if stop == "kill-9" else signal.SIGTERM)
    hit = _damage(victim.data_dir / "logs")
    assert len(hit) == 3, hit  # every log of the topic has a copy here (replication factor 3)
    victim.settings = {**victim.settings, "storage.verify_on_open": "true"}
    logged = victim.log_path.stat().st_size
    cluster.start_broker(victim)

    _wait_in_sync(others[0].bootstrap, TOPIC, 3, timeout=60)
    text = victim.log_path.read_bytes()[logged:].decode(errors="replace")
    assert text.count("damaged bytes at") >= 3, text[-3000:]
    assert text.count("cutting this copy") >= 3, text[-3000:]
    assert not list((victim.data_dir / "logs").glob("g*/damaged.json"))
    assert _segments_identical(cluster) >= 6  # three logs, two copies of each compared

    # The repaired broker alone: it leads every partition and serves every record.
    for b in others:
        cluster.stop_broker(b)  # each hands its logs to an in-sync replica still running
    deadline = time.monotonic() + 60
    while True:
        parts = _metadata(victim.bootstrap, TOPIC)["partitions"]
        if all(x["leader_id"] == victim.node_id for x in parts):
            break
        assert time.monotonic() < deadline, parts
        time.sleep(0.2)
    _check(acks.acked, _read_all(victim.bootstrap, TOPIC, len(acks.acked)))


def _damaged_store(path: Path) -> LogStore:
    """Log g7 of three partitions, 16 KB batches, overwritten at 40% of its segment, opened
    again with every frame checked (recovery steps over the damage)."""
    config = dict(fsync=FsyncPolicy.parse("always"), replicated=True, io_threads=2)
    parts = [("t", i, uid, "g7") for i, uid in enumerate((11, 12, 13))]

    async def write() -> None:
        store = LogStore(StorageConfig(path, **config))
        store.open(parts)
        store.logs["g7"].begin_epoch(1)
        store.logs["g7"].leading = True  # as the replicator makes a primary
        for k in range(60):
            values = [(None, b"v%d-%d" % (k, j) + b"." * 200, 1_700_000_000_000 + k)
                      for j in range(70)]  # fmt: skip
            store.partitions[11 + k % 3].append(build_batch(values))
        await store.close()

    asyncio.run(write())
    (seg,) = (path / "logs").glob("g7/*.log")
    shutil.copy(seg, path.parent / "primary.log")  # the bytes as the primary has them
    assert len(_damage(path / "logs")) == 1
    store = LogStore(StorageConfig(path, verify_on_open=True, **config))
    store.open(parts)
    return store


def test_a_cut_through_damage_that_a_crash_interrupted_is_finished_at_the_next_one(tmp_path):
    """kill -9 after the segment was cut back to its first damaged range but before the damage
    record was rewritten: the record then names a range at the log's very end. The next cut
    (at the next Fence) finds nothing to truncate, yet must drop the range and set the
    partition back to the first offset it lost, or the primary's frames are refused forever."""
    store = _damaged_store(tmp_path / "b")
    vlog = store.logs["g7"]
    (r,) = vlog.damaged
    ((uid, (lost_first, _)),) = r.lost.items()
    forget = type(vlog)._forget_damage_from
    type(vlog)._forget_damage_from = lambda *a: None  # the crash: the record is not rewritten
    try:
        store.truncate_log("g7", r.seq, r.start)
    finally:
        type(vlog)._forget_damage_from = forget
    store.abandon()
    config = dict(fsync=FsyncPolicy.parse("always"), replicated=True, io_threads=2)
    store = LogStore(StorageConfig(tmp_path / "b", verify_on_open=True, **config))
    store.open([("t", i, u, "g7") for i, u in enumerate((11, 12, 13))])
    vlog = store.logs["g7"]
    assert vlog.end == (r.seq, r.start) and [(d.seq, d.start) for d in vlog.damaged] == [
        (r.seq, r.start)
    ]

    async def repair() -> None:
        cut = vlog.first_damage()
        assert cut == vlog.end
        store.truncate_log("g7", *cut)
        assert vlog.damaged == [] and store.partitions[uid].next_offset == lost_first
        primary = (tmp_path / "primary.log").read_bytes()
        lsn = vlog.append_replica(r.seq, r.start, primary[r.start :], epoch=1)
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        vlog.when_durable(lsn, done.set_result)
        assert await done
        assert store.partitions[uid].lost == []
        await store.close()

    asyncio.run(repair())
    (seg,) = (tmp_path / "b" / "logs" / "g7").glob("*.log")
    assert seg.read_bytes() == (tmp_path / "primary.log").read_bytes()  # repaired, byte for byte


@pytest.mark.parametrize("in_sync", [True, False], ids=["named-in-sync", "out-of-sync"])
def test_a_damaged_copy_makes_a_new_epoch_without_itself_in_sync_before_it_is_cut(
    etcd: EtcdServer, tmp_path, in_sync
):
    """A copy etcd still names in sync (its restart was quicker than the controller) must not
    be cut while so named: it could be elected without records it had acknowledged. Out of the
    set already, it makes a new epoch all the same: a join of it by the primary, prepared
    before its restart and still on its way to etcd, then fails its epoch guard."""
    store = _damaged_store(tmp_path / "b")
    vlog = store.logs["g7"]
    assert len(vlog.damaged) == 1
    damaged = vlog.damaged[0]
    ((uid, (lost_first, _)),) = damaged.lost.items()
    end = vlog.end
    name = f"repair-{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        primary = ClusterNode([etcd.endpoint], name, 1, "127.0.0.1", 1)
        me = ClusterNode([etcd.endpoint], name, 2, "127.0.0.1", 2)
        try:
            for n in (primary, me):
                await n.connect(None)
                await n.register()
            assert me.store is not None
            st = VirtualLogState(7, [1, 2], 1, 3, [1, 2] if in_sync else [1])
            await me.store.put(me.keys.vlog(7), json.dumps(st.to_json()).encode())
            while 7 not in me.vlogs or 1 not in me.brokers:
                await asyncio.sleep(0.05)
            repair = DamageRepair(me, store)
            assert repair.damaged("g7") == (damaged.seq, damaged.start)

            # Before its new epoch: a Fence is refused and nothing is cut.
            assert not repair.cut_at_fence("g7", 3)
            assert vlog.end == end
            left = asyncio.Event()
            repair.check(me.vlogs[7], left.set)
            await asyncio.wait_for(left.wait(), 10)
            got = await me.store.get(me.keys.vlog(7))
            assert got is not None
            now = VirtualLogState.from_json(7, json.loads(got[0]))
            assert (now.primary, now.epoch, now.isr) == (1, 4, [1])

            # Out of the set: the next Fence, at the new epoch, cuts at the first damage.
            assert not repair.cut_at_fence("g7", 3)  # (one of the old epoch does not)
            assert repair.cut_at_fence("g7", 4)
            assert vlog.end == (damaged.seq, damaged.start)
            assert vlog.damaged == [] and repair.damaged("g7") is None
            p = store.partitions[uid]
            assert p.next_offset == lost_first and p.lost == []
        finally:
            await me.leave()
            await primary.leave()
            await store.close()

    asyncio.run(run())


def test_a_damaged_copy_stays_in_sync_with_no_other_replica_registered(etcd: EtcdServer, tmp_path):
    """With its primary gone, the damaged copy is the best there is: it stays as recovery left
    it (the damaged range fenced), as a single broker's would."""
    store = _damaged_store(tmp_path / "b")
    end = store.logs["g7"].end
    name = f"alone-{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        me = ClusterNode([etcd.endpoint], name, 2, "127.0.0.1", 2)
        try:
            await me.connect(None)
            await me.register()
            assert me.store is not None
            st = VirtualLogState(7, [1, 2], 1, 3, [1, 2])  # broker 1 is not registered
            await me.store.put(me.keys.vlog(7), json.dumps(st.to_json()).encode())
            while 7 not in me.vlogs:
                await asyncio.sleep(0.05)
            repair = DamageRepair(me, store)
            called = []
            repair.check(me.vlogs[7], lambda: called.append(1))
            await asyncio.wait_for(asyncio.gather(*repair._tasks), 10)
            assert called == []  # (nothing changed: no reconcile, which would only ask again)
            got = await me.store.get(me.keys.vlog(7))
            assert got is not None and json.loads(got[0]) == st.to_json()
            assert not repair.cut_at_fence("g7", 3)
            assert store.logs["g7"].end == end
        finally:
            await me.leave()
            await store.close()

    asyncio.run(run())
