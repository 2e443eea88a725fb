"""Share groups' durable state (KIP-932's share coordinator): every share-partition's start
offset and in-flight records with their delivery counts, in the internal topic
``__share_group_state``.

The share-partitions themselves live on the broker leading each data partition
(``share_partition.py``, driven by ``api/share_fetch.py``); their state is written here before
the answer that made the change goes out: a ShareFetch's acquisitions before it hands the
records over (so a crash counts the delivery), its and ShareAcknowledge's acknowledgements
before they are confirmed. It is read back when a share-partition is first used after a start
or a change of leader. Records are Kafka's (``share_state_records.py``); writing, replaying and
keeping the topic short are ``state_log.py``'s, shared with the transaction log.

A key's state lives in the topic's partition ``partition_for(key)``, written by that
partition's leader, the share coordinator of the key. On a single node that is this broker. In
a cluster a share-partition leader that does not lead it asks the one that does, with Kafka's
inter-broker ReadShareGroupState and WriteShareGroupState (``cluster/share_state_client.py``),
and answers those for the keys it coordinates (``api/share_state.py``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from stratalog.broker.share_partition import SharePartition
from stratalog.broker.share_state_records import (
    SHARE_STATE_TOPIC,
    ShareKey,
    ShareState,
    StateBatch,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
)
from stratalog.broker.state_log import StateCodec, StateLog
from stratalog.storage.journal import StorageFailure

if TYPE_CHECKING:
    from stratalog.broker.core import BrokerCore

log = logging.getLogger(__name__)

SHARE_CODEC: StateCodec[ShareKey, ShareState] = StateCodec(
    "share-partitions", partition_for, encode_key, encode_value, decode_key, decode_value
)


class FencedLeader(StorageFailure):
    """A state write from a leader of the partition older than the one that last wrote it."""

    def __init__(self, keys: list[ShareKey]) -> None:
        super().__init__(f"share-partition state written by a newer leader: {keys}")
        self.keys = keys


def state_of(sp: SharePartition, leader_epoch: int = 0) -> ShareState:
    batches = tuple(StateBatch(*b) for b in sp.state_batches())
    return ShareState(sp.start, batches, leader_epoch=leader_epoch)


def restore(sp: SharePartition, state: ShareState) -> None:
    sp.restore(
        state.start_offset,
        [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
         for b in state.batches],
    )  # fmt: skip


class ShareStateStore:
    def __init__(self, core: BrokerCore) -> None:
        self.core = core
        self.log = StateLog(SHARE_CODEC, core.share_state_partitions, core.delete_records)
        # Partitions of the topic whose state is in memory -> the epoch of this broker's
        # leadership it was read at (leadership lost and regained means reading it again).
        self._loaded: dict[int, int] = {}
        # Share-partitions whose state is being written -> whether that write made it durable.
        self._writing: dict[ShareKey, asyncio.Future[bool]] = {}

    # -- which partitions are coordinated here ---------------------------------------------------
    def _led_here(self, idx: int, parts) -> bool:
        p = parts[idx]
        return (
            p is not None and p.leading and self.core.leader_error(SHARE_STATE_TOPIC, idx) is None
        )

    def load(self) -> None:
        """Read the state of every partition of the topic this broker leads (at start, and in a
        cluster whenever leadership changes); forget the others'."""
        parts = self.core.share_state_partitions(False)
        leading = set()
        for idx in range(len(parts)):
            if self._led_here(idx, parts):
                leading.add(idx)
                self._ensure_loaded(idx, parts)
        for idx in set(self._loaded) - leading:
            self._loaded.pop(idx, None)
            self.log.forget_partition(idx)

    def _ensure_loaded(self, idx: int, parts) -> None:
        epoch = self.core.leadership_epoch(SHARE_STATE_TOPIC, idx)
        if self._loaded.get(idx) != epoch:
            self.log.forget_partition(idx)
            found = self.log.load_partition(idx, parts[idx])
            self._loaded[idx] = epoch
            if found:
                log.info("%s-%d: loaded the state of %d share-partitions", SHARE_STATE_TOPIC,
                         idx, len(found))  # fmt: skip

    def coordinated_here(self, key: ShareKey) -> bool | None:
        """Whether this broker coordinates ``key`` (None: the topic does not exist yet)."""
        parts = self.core.share_state_partitions(False)
        if not parts:
            return None
        idx = partition_for(key, len(parts))
        if not self._led_here(idx, parts):
            return False
        self._ensure_loaded(idx, parts)
        return True

    def keys_of(self, group_id: str) -> list[ShareKey]:
        """The share-partitions of ``group_id`` with state here: in memory (led here) or
        durable in a partition of the topic this broker coordinates."""
        keys = {(group_id, *tp) for g in [self.core.share_groups.group(group_id)] if g
                for tp in g.partitions}  # fmt: skip
        for idx in self._loaded:
            keys.update(k for k in self.log.live(idx) if k[0] == group_id)
        return sorted(keys, key=lambda k: (str(k[1]), k[2]))

    # -- reading and writing ---------------------------------------------------------------------
    def read_local(self, key: ShareKey) -> ShareState | None:
        """The durable state of ``key``, which this broker coordinates (None: none written)."""
        parts = self.core.share_state_partitions(False)
        if not parts:
            return None
        idx = partition_for(key, len(parts))
        self._ensure_loaded(idx, parts)
        return self.log.live(idx).get(key)

    async def read(self, key: ShareKey, leader_epoch: int = -1) -> ShareState | None:
        """The durable state of ``key``, from wherever it is coordinated, for the data
        partition's leader at ``leader_epoch`` (see ``read_fenced``). Raises FencedLeader for a
        reader older than the last leader known, StorageFailure when its coordinator cannot be
        asked now."""
        here = self.coordinated_here(key)
        if here is None:
            return None  # nothing was ever written
        if here:
            return await self.read_fenced(key, leader_epoch)
        from stratalog.cluster.share_state_client import read_remote

        return await read_remote(self.core, key, leader_epoch)

    async def read_fenced(self, key: ShareKey, leader_epoch: int) -> ShareState | None:
        """Kafka's share coordinator's read: a reader at an older leader epoch than the state's
        is fenced (a former leader must not load it), and one at a newer epoch is recorded
        first (the state is written again with it), so that the leader it replaces can no
        longer write the key. -1: no epoch (nothing checked or recorded)."""
        state = self.read_local(key)
        if state is None or leader_epoch < 0 or leader_epoch == state.leader_epoch:
            return state
        if leader_epoch < state.leader_epoch:
            raise FencedLeader([key])
        newer = ShareState(state.start_offset, state.batches, state.state_epoch, leader_epoch)
        await self.write([(key, newer)], local_only=True)
        return newer

    async def write(
        self, entries: list[tuple[ShareKey, ShareState | None]], local_only: bool = False
    ) -> None:
        """Write the new states (None: delete) and return once durable wherever they are
        coordinated (``local_only``: here, WriteShareGroupState's); raises FencedLeader for
        states older leaders wrote than the ones stored, StorageFailure when any was not made
        durable."""
        if not entries:
            return
        parts = self.core.share_state_partitions(True)  # created at the first write
        local, remote = [], []
        for key, state in entries:
            idx = partition_for(key, len(parts))
            if self._led_here(idx, parts):
                self._ensure_loaded(idx, parts)
                local.append((key, state))
            else:
                remote.append((key, state))
        fenced = [
            key
            for key, state in local
            if state is not None
            and (old := self.log.live(partition_for(key, len(parts))).get(key)) is not None
            and old.leader_epoch > state.leader_epoch
        ]
        if fenced:
            raise FencedLeader(fenced)
        if remote and local_only:
            raise StorageFailure(f"{SHARE_STATE_TOPIC}: not the coordinator of {remote[0][0]}")
        if remote:
            if self.core.cluster is None:
                raise StorageFailure(f"{SHARE_STATE_TOPIC} is not led here")
            from stratalog.cluster.share_state_client import write_remote

            results = await asyncio.gather(
                write_remote(self.core, remote), self.log.write_many(local), return_exceptions=True
            )
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            return
        await self.log.write_many(local)

    async def persist(self, key: ShareKey, sp: SharePartition) -> None:
        """Make the share-partition's state as it is now durable (or a later one). Its writes
        go one at a time, each of its latest state, so the log never ends with an older state
        than an earlier write's; callers that come while one is under way share the next.
        Raises StorageFailure when it could not be made durable."""
        target = sp.version
        while sp.durable_version < target:
            busy = self._writing.get(key)
            if busy is not None:
                if not await asyncio.shield(busy):
                    raise StorageFailure(f"the state of share-partition {key} was not written")
                continue
            fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._writing[key] = fut
            version = sp.version
            try:
                await self.write([(key, state_of(sp, sp.leader_epoch))])
                sp.durable_version = max(sp.durable_version, version)
            finally:
                del self._writing[key]
                fut.set_result(sp.durable_version >= version)

    async def close(self) -> None:
        await self.log.close()

    def abandon(self) -> None:
        self.log.abandon()
