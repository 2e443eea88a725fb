"""Moving a partition to other replicas (Kafka's KIP-455: AlterPartitionReassignments) with
replication by virtual log (KerA).

A partition's replicas are those of the virtual log that carries it, so a reassignment moves the
partition into the virtual log of the new replica list (an existing one with exactly that list,
or a new one, as placement does at creation). The partition gets a new storage uid there: its
records are copied, byte for byte as stored (offsets, timestamps, leader epochs, producer ids
and sequences unchanged), into the new log by that log's primary, which appends them like any
write, so they replicate to its backups as any produce does (they hold them as chunks of a
partition they do not know yet, and adopt them at the switch).

The steps, each visible in etcd under ``reassignments/<topic>/<index>``:

1. *Copying*: AlterPartitionReassignments (any broker) records the target replicas, the
   virtual log chosen (created in the same transaction if new) and the new uid. The new log's
   primary fetches the partition from its leader with an ordinary Fetch (committed records
   only) and appends what it gets (``PartitionLog.append_copy``).
2. *Sealing*: once a Fetch finds nothing new, the mover sets ``sealing``. The old log's primary
   then refuses writes to the partition (``PartitionLog.sealed``: NOT_LEADER_OR_FOLLOWER, which
   producers retry) and writes the ``seal``: the offset the partition ends at and the old log's
   epoch (a primary elected later writes it again at its own epoch).
3. *Switch*: when the copy holds everything up to the seal and it is committed in the new log,
   one transaction guarded by the revisions read (the reassignment, the topic, both logs) points
   the partition at the new log and uid and marks the reassignment done. When the new log's
   epoch is not above the old one, it is raised above it in the same transaction, so the
   partition's leader epoch never goes back (clients ignore a Metadata whose epoch decreased).
   The done entry is deleted afterwards.

Every broker drops the old uid's partition when the topic switches, and the new one's backups
adopt the chunks replicated to them. Cancelling (replicas = null) deletes the entry unless it is
done: the transactions exclude each other. A changed or cancelled entry makes the mover stop and
every broker drop the copy's chunks; the old primary takes writes again.

The mover runs on the new log's primary, whichever broker that is now: a failover or a restart
resumes from what the copy holds (its chunks replicated like any others). Nothing depends on
the controller.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from stratalog.cluster.placement import VirtualLogState

if TYPE_CHECKING:
    from stratalog.cluster.node import ClusterNode
    from stratalog.cluster.replication import Replicator
    from stratalog.storage.log_store import LogStore
    from stratalog.storage.partition import PartitionLog

log = logging.getLogger(__name__)

FETCH_BYTES = 4 * 1024 * 1024  # one Fetch of the copy


@dataclass(frozen=True)
class Seal:
    vid: int  # the old virtual log ...
    epoch: int  # ... at this epoch refuses writes to the partition from ...
    end: int  # ... this offset on


@dataclass(frozen=True)
class Reassignment:
    topic: str
    index: int
    uid: int  # the partition's storage uid now (in the old log)
    origin: list[int]  # its replicas when the reassignment started
    target: list[int]
    vid: int  # the virtual log of ``target``
    new_uid: int  # the partition's uid in that log
    sealing: bool = False
    seal: Seal | None = None
    done: bool = False
    revision: int = field(default=0, compare=False)  # etcd's mod revision of the entry

    def to_json(self) -> dict:
        return {
            "uid": self.uid,
            "origin": self.origin,
            "target": self.target,
            "vid": self.vid,
            "new_uid": self.new_uid,
            "sealing": self.sealing,
            "seal": None if self.seal is None else [self.seal.vid, self.seal.epoch, self.seal.end],
            "done": self.done,
        }

    @classmethod
    def from_json(cls, topic: str, index: int, raw: dict, revision: int = 0) -> Reassignment:
        seal = raw.get("seal")
        return cls(
            topic,
            index,
            raw["uid"],
            list(raw["origin"]),
            list(raw["target"]),
            raw["vid"],
            raw["new_uid"],
            raw.get("sealing", False),
            None if seal is None else Seal(*seal),
            raw.get("done", False),
            revision,
        )

    @property
    def replicas(self) -> list[int]:
        """Kafka's view while it runs: the target, then the replicas being removed."""
        return [*self.target, *(r for r in self.origin if r not in self.target)]

    @property
    def adding(self) -> list[int]:
        return [r for r in self.target if r not in self.origin]

    @property
    def removing(self) -> list[int]:
        return [r for r in self.origin if r not in self.target]


@dataclass(frozen=True)
class Outcome:
    error: str  # a Kafka error name; NONE when accepted
    message: str | None = None


ACCEPTED = Outcome("NONE")


def check_replicas(
    replicas: list[int], brokers: set[int], current: int, allow_factor_change: bool
) -> Outcome | None:
    """Why a target replica list is refused (Kafka's checks and messages), or None."""
    if not replicas:
        return Outcome(
            "INVALID_REPLICA_ASSIGNMENT", "The manual partition assignment includes an empty "
            "replica list."
        )  # fmt: skip
    if len(set(replicas)) != len(replicas):
        return Outcome(
            "INVALID_REPLICA_ASSIGNMENT",
            "The manual partition assignment includes duplicate replicas.",
        )
    unknown = next((r for r in replicas if r not in brokers), None)
    if unknown is not None:
        return Outcome(
            "INVALID_REPLICA_ASSIGNMENT",
            f"The manual partition assignment includes broker {unknown}, but no such broker "
            "is registered.",
        )
    if not allow_factor_change and len(replicas) != current:
        return Outcome(
            "INVALID_REPLICATION_FACTOR",
            "The replication factor is changed from "
            f"{current} to {len(replicas)} but allowReplicationFactorChange is false",
        )
    return None


NO_REASSIGNMENT = Outcome("NO_REASSIGNMENT_IN_PROGRESS", "No reassignment is in progress.")


def _dump(obj) -> bytes:
    return json.dumps(obj, sort_keys=True).encode()


async def alter(
    node: ClusterNode, topic: str, index: int, replicas: list[int] | None, allow_factor: bool
) -> Outcome:
    """Start, replace or (``replicas`` None) cancel the reassignment of ``topic``-``index``."""
    assert node.store is not None
    k = node.keys
    rkey = k.reassignment(topic, index)
    while True:
        got_topic = await node.store.get(k.topic(topic))
        if got_topic is None:
            return Outcome("UNKNOWN_TOPIC_OR_PARTITION", f"Unable to find topic {topic}")
        raw_topic = json.loads(got_topic[0])
        if not 0 <= index < len(raw_topic["partitions"]):
            return Outcome(
                "UNKNOWN_TOPIC_OR_PARTITION", f"Unable to find partition {topic}-{index}"
            )
        got = await node.store.get(rkey)
        now = None if got is None else Reassignment.from_json(topic, index, json.loads(got[0]))
        if now is not None and now.done:
            now = None  # switched already: its entry is only waiting to be deleted
        rrev = 0 if got is None else got[1]
        uid, vid = raw_topic["partitions"][index], raw_topic["vlogs"][index]
        got_vlog = await node.store.get(k.vlog(vid))
        if got_vlog is None:
            return Outcome("UNKNOWN_TOPIC_OR_PARTITION", f"virtual log g{vid} is gone")
        current = VirtualLogState.from_json(vid, json.loads(got_vlog[0]))
        if replicas is None:
            if now is None:
                return NO_REASSIGNMENT
            if await node.store.txn({rkey: rrev}, {}, [rkey]):
                log.info("%s-%d: reassignment to %s cancelled", topic, index, now.target)
                return ACCEPTED
            continue
        refused = check_replicas(replicas, set(node.brokers), len(current.replicas), allow_factor)
        if refused is not None:
            return refused
        if replicas == current.replicas:
            # Already there (Kafka completes it at once); one in flight elsewhere is reverted.
            if now is None or await node.store.txn({rkey: rrev}, {}, [rkey]):
                return ACCEPTED
            continue
        if now is not None and now.target == replicas:
            return ACCEPTED  # the same one again
        # The virtual log of the target list: one that has exactly it, else a new one.
        existing = {
            int(key[len(k.vlogs) :]): VirtualLogState.from_json(
                int(key[len(k.vlogs) :]), json.loads(v)
            )
            for key, v, _r in await node.store.get_prefix(k.vlogs)
        }
        target_vid = next((v for v, st in existing.items() if st.replicas == replicas), None)
        expect = {rkey: rrev, k.topic(topic): got_topic[1]}
        puts: dict[str, bytes] = {}
        if target_vid is None:
            got_next = await node.store.get(k.next_vid)
            target_vid, vid_rev = (int(got_next[0]), got_next[1]) if got_next else (0, 0)
            # In sync: every replica, as a new log at topic creation (placement.py).
            new = VirtualLogState(target_vid, list(replicas), replicas[0], 0, list(replicas))
            expect[k.next_vid] = vid_rev
            expect[k.vlog(target_vid)] = 0
            puts[k.next_vid] = str(target_vid + 1).encode()
            puts[k.vlog(target_vid)] = _dump(new.to_json())
        new_uid = await node._next_ids(k.next_uid, 1)
        r = Reassignment(topic, index, uid, list(current.replicas), list(replicas), target_vid,
                         new_uid)  # fmt: skip
        puts[rkey] = _dump(r.to_json())
        if await node.store.txn(expect, puts):
            log.info(
                "%s-%d: reassignment from %s to %s (g%d -> g%d, uid %d -> %d)",
                topic, index, current.replicas, replicas, vid, target_vid, uid, new_uid,
            )  # fmt: skip
            return ACCEPTED
        # Something changed meanwhile: decide again on what etcd holds now.


class Mover:
    """This broker's part in reassignments: the copies into logs it leads, the seals of
    partitions it leads that are moving away, and dropping what a cancelled copy left here."""

    def __init__(self, node: ClusterNode, store: LogStore, replicator: Replicator) -> None:
        self.node = node
        self.store = store
        self.replicator = replicator
        self._copies: dict[tuple[str, int], tuple[Reassignment, asyncio.Task]] = {}
        self._sealing: set[tuple[str, int, int]] = set()  # (topic, index, epoch) being written
        self._copy_uids: set[int] = set()  # new uids of reassignments seen (to drop if dropped)
        self._tasks: set[asyncio.Future] = set()
        # Called with (topic, index, new uid) after a switch this broker made.
        self.on_switch = None

    def reconcile(self) -> None:
        node = self.node
        me = node.node_id
        live = {key: r for key, r in node.reassignments.items()}
        # Copies this broker runs: for the reassignments whose new log it leads now.
        for key, (r, task) in list(self._copies.items()):
            now = live.get(key)
            if task.done() or now is None or now.new_uid != r.new_uid or not self._leads(r.vid):
                task.cancel()
                del self._copies[key]
        for key, r in live.items():
            self._copy_uids.add(r.new_uid)
            if r.done:
                if self._leads(r.vid):
                    self._spawn(self._forget(r))
                continue
            if key not in self._copies and self._leads(r.vid):
                task = asyncio.ensure_future(self._copy(r))
                self._copies[key] = (r, task)
        # Seals: partitions of logs this broker leads that are moving away.
        sealed: set[int] = set()
        for r in live.values():
            if not r.sealing or r.done:
                continue
            sealed.add(r.uid)
            t = node.topics.get(r.topic)
            if t is None or r.index >= len(t.partitions) or t.partitions[r.index] != r.uid:
                continue
            old = node.vlogs.get(t.vlogs[r.index])
            p = self.store.partitions.get(r.uid)
            if old is None or p is None:
                continue
            p.sealed = True
            sealed_here = r.seal is not None and (r.seal.vid, r.seal.epoch) == (old.vid, old.epoch)
            if old.primary == me and self.replicator.leads(old.vid, old.epoch) and not sealed_here:
                self._write_seal(r, old, p)
        for p in self.store.partitions.values():
            if p.sealed and p.uid not in sealed:
                p.sealed = False  # cancelled: writes are taken again
        # Copies whose reassignment went without switching: their chunks here go.
        wanted = {r.new_uid for r in live.values()}
        in_topics = {u for t in node.topics.values() for u in t.partitions}
        for uid in list(self._copy_uids):
            if uid in wanted:
                continue
            self._copy_uids.discard(uid)
            if uid not in in_topics:
                self.store.remove_partition(uid)
                self.store.drop_orphans(uid)

    def _leads(self, vid: int) -> bool:
        st = self.node.vlogs.get(vid)
        return (
            st is not None
            and st.primary == self.node.node_id
            and self.replicator.leads(vid, st.epoch)
        )

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _write_seal(self, r: Reassignment, old: VirtualLogState, p: PartitionLog) -> None:
        mark = (r.topic, r.index, old.epoch)
        if mark in self._sealing:
            return
        self._sealing.add(mark)
        # p.sealed was set before this, in the same loop turn: nothing appends past this end.
        seal = Seal(old.vid, old.epoch, p.next_offset)

        async def run() -> None:
            try:
                ok = await self._update(r, lambda now: replace(now, seal=seal))
                if ok:
                    log.info("%s-%d sealed at offset %d (g%d, epoch %d)",
                             r.topic, r.index, seal.end, seal.vid, seal.epoch)  # fmt: skip
            except Exception as e:
                log.warning("%s-%d: cannot write the seal: %s", r.topic, r.index, e)
            finally:
                self._sealing.discard(mark)

        self._spawn(run())

    async def _update(self, r: Reassignment, change) -> bool:
        """Rewrite the reassignment entry if it is still ``r``'s (same copy, not done)."""
        node = self.node
        assert node.store is not None
        key = node.keys.reassignment(r.topic, r.index)
        got = await node.store.get(key)
        if got is None:
            return False
        now = Reassignment.from_json(r.topic, r.index, json.loads(got[0]))
        if now.new_uid != r.new_uid or now.done:
            return False
        new = change(now)
        if new == now:
            return True
        return await node.store.replace(key, _dump(new.to_json()), got[1])

    async def _forget(self, r: Reassignment) -> None:
        """Delete a done entry (its switch is in the topic)."""
        node = self.node
        assert node.store is not None
        key = node.keys.reassignment(r.topic, r.index)
        try:
            got = await node.store.get(key)
            if got is not None and json.loads(got[0]).get("done"):
                await node.store.txn({key: got[1]}, {}, [key])
        except Exception as e:
            log.warning("%s-%d: cannot delete the done reassignment: %s", r.topic, r.index, e)

    # -- the copy ------------------------------------------------------------------------------
    def _partition(self, r: Reassignment) -> PartitionLog:
        p = self.store.partitions.get(r.new_uid)
        if p is None:
            log_name = self.node.vlogs[r.vid].log_name
            p = self.store.add_partition(r.topic, r.index, r.new_uid, log_name=log_name)
        return p

    def _bootstrap(self) -> str:
        from stratalog.client.wire import join_host_port

        return ",".join(join_host_port(b.host, b.port) for b in self.node.brokers.values())

    async def _copy(self, r: Reassignment) -> None:
        from stratalog.client.wire import EARLIEST, WireClient, WireError

        key = (r.topic, r.index)
        p = self._partition(r)
        client = WireClient(self._bootstrap(), timeout=10, leader_wait=10, client_id="reassign")
        try:
            log.info("%s-%d: copying into g%d from offset %d", r.topic, r.index, r.vid,
                     p.next_offset)  # fmt: skip
            if not len(p.chunks):
                first = await asyncio.to_thread(client.list_offsets, r.topic, [r.index], EARLIEST)
                start = first[r.index][0]
                if start > p.next_offset:
                    p.next_offset = p.log_start_offset = p.high_watermark = start
            while True:
                now = self.node.reassignments.get(key)
                if now is None or now.new_uid != r.new_uid or now.done:
                    return
                try:
                    got = await asyncio.to_thread(
                        client.fetch, r.topic, {r.index: p.next_offset},
                        max_bytes=FETCH_BYTES, partition_max_bytes=FETCH_BYTES, max_wait_ms=50,
                    )  # fmt: skip
                except (WireError, OSError) as e:
                    log.info("%s-%d: copy fetch failed (%s); again", r.topic, r.index, e)
                    await asyncio.sleep(0.2)
                    continue
                data = got.get(r.index)
                if data is None or data.error_code:
                    await asyncio.sleep(0.1)
                    continue
                copied = len(data.records) and p.append_copy(bytes(data.records)) is not None
                if p.next_offset < data.high_watermark:
                    if not copied:
                        await asyncio.sleep(0.05)  # (a batch it already had, or a gap)
                    continue
                # Caught up with what was committed there when it answered. (Waiting for an
                # answer with nothing new never ends while producers keep writing: the seal
                # is what stops them.)
                if not now.sealing:
                    await self._update(now, lambda x: replace(x, sealing=True))
                    await asyncio.sleep(0.02)  # for the watch to bring it
                    continue
                seal = now.seal
                t = self.node.topics.get(r.topic)
                old = self.node.vlogs.get(t.vlogs[r.index]) if t is not None else None
                if seal is None or old is None or (seal.vid, seal.epoch) != (old.vid, old.epoch):
                    await asyncio.sleep(0.02)  # the old primary has not sealed (at its epoch)
                    continue
                if p.next_offset < seal.end:
                    continue
                # Everything up to the seal is here: once the new log committed it, switch.
                while p.high_watermark < p.next_offset:
                    await p.waiter()
                if await self._switch(now, old, p):
                    return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s-%d: the copy failed; it starts again", r.topic, r.index)
            await asyncio.sleep(0.5)
            self._copies.pop(key, None)
            asyncio.get_running_loop().call_soon(self.reconcile)
        finally:
            client.close()

    async def _switch(self, r: Reassignment, old: VirtualLogState, p: PartitionLog) -> bool:
        node = self.node
        assert node.store is not None
        k = node.keys
        rkey = k.reassignment(r.topic, r.index)
        got_r = await node.store.get(rkey)
        got_t = await node.store.get(k.topic(r.topic))
        got_new = await node.store.get(k.vlog(r.vid))
        got_old = await node.store.get(k.vlog(old.vid))
        if None in (got_r, got_t, got_new, got_old):
            return False
        assert got_r and got_t and got_new and got_old
        now = Reassignment.from_json(r.topic, r.index, json.loads(got_r[0]))
        if now != r:
            return False  # changed meanwhile: the loop looks again
        topic = json.loads(got_t[0])
        if topic["partitions"][r.index] != r.uid:
            return False
        new = VirtualLogState.from_json(r.vid, json.loads(got_new[0]))
        was = VirtualLogState.from_json(old.vid, json.loads(got_old[0]))
        if was.epoch != old.epoch:
            return False  # the old log failed over: its new primary seals again
        topic["partitions"][r.index] = r.new_uid
        topic["vlogs"][r.index] = r.vid
        # The copied records keep the epochs they were written in, which the new log's epoch
        # history does not know: recorded for OffsetForLeaderEpoch (KIP-320) on every replica.
        topic.setdefault("inherited", {})[str(r.index)] = {
            "end": p.next_offset,
            "epochs": [list(e) for e in p.stored_epochs()],
        }
        puts = {
            k.topic(r.topic): _dump(topic),
            rkey: _dump(replace(now, done=True).to_json()),
        }
        if new.epoch <= was.epoch:
            # The partition's leader epoch must not go back: clients ignore such a Metadata.
            bumped = VirtualLogState(new.vid, new.replicas, new.primary, was.epoch + 1, new.isr)
            puts[k.vlog(r.vid)] = _dump(bumped.to_json())
        expect = {rkey: got_r[1], k.topic(r.topic): got_t[1], k.vlog(r.vid): got_new[1],
                  k.vlog(old.vid): got_old[1]}  # fmt: skip
        if not await node.store.txn(expect, puts):
            return False
        log.warning(
            "%s-%d moved to %s (g%d, uid %d), offsets %d-%d",
            r.topic, r.index, r.target, r.vid, r.new_uid, p.log_start_offset, p.next_offset,
        )  # fmt: skip
        if self.on_switch is not None:
            self.on_switch(r.topic, r.index, r.new_uid)
        return True

    async def close(self) -> None:
        for _r, task in self._copies.values():
            task.cancel()
        for task in list(self._tasks):
            task.cancel()
        self._copies.clear()
