"""The transaction coordinator (KIP-98): transactional ids, producer epochs, and the two-phase end
of every transaction.

Each transactional id belongs to one partition of ``__transaction_state``
(``abs(hash(id)) % partitions``, as in Kafka) and is coordinated by the broker that leads that
partition: on a single node, this broker. Its state machine is Kafka's:

    Empty --AddPartitions--> Ongoing --EndTxn--> PrepareCommit | PrepareAbort
    --markers written--> CompleteCommit | CompleteAbort --AddPartitions--> Ongoing ...

Every transition is written to the transaction log (txn_log.py) and takes effect, and is
answered, only once durable. EndTxn is answered once the Prepare state is durable; the markers
(txn_markers.py) are then written to every partition of the transaction, retried until each is
durable, and the Complete state is written. A broker that starts (or starts leading a partition
of the log) reads the state back and finishes every transaction it finds prepared.

Fencing: InitProducerId for a transactional id bumps its producer epoch; requests of an older
epoch are answered PRODUCER_FENCED (INVALID_PRODUCER_EPOCH for the versions before KIP-588).
An InitProducerId that finds a transaction ongoing aborts it first, at a bumped epoch (the
marker fences the old producer in every partition), and answers CONCURRENT_TRANSACTIONS until
the abort is complete, as Kafka does. A transaction open longer than its timeout is aborted the
same way by a periodic check.

Producer ids come from the broker's allocator (in a cluster: blocks from etcd) offset into the
transactional range (storage/txn_index.py), so every partition can tell a transactional
producer's batches from the chunk index.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stratalog.broker.offset_store import cancel_all
from stratalog.broker.txn_log import TxnLog
from stratalog.broker.txn_markers import write_markers
from stratalog.broker.txn_records import TRANSACTION_STATE_TOPIC, TxnState, TxnValue
from stratalog.storage.journal import StorageFailure
from stratalog.storage.txn_index import TRANSACTIONAL_PRODUCER_IDS

if TYPE_CHECKING:
    from stratalog.broker.core import BrokerCore

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_EPOCH = -1
_MAX_EPOCH = 32767  # Short.MaxValue: an epoch at MAX - 1 is exhausted (Kafka)
_MARKER_RETRY_S = 0.2
_MARKER_RETRY_MAX_S = 5.0

TopicPartition = tuple[str, int]


class CoordinatorError(Exception):
    """A request the coordinator answers with a Kafka error (``error`` is its name)."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


@dataclass(slots=True)
class TxnMeta:
    """One transactional id's state, as the log holds it plus what only memory needs."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: set[TopicPartition] = field(default_factory=set)
    last_update_ms: int = -1
    start_ms: int = -1
    last_producer_epoch: int = NO_EPOCH  # the epoch before the last bump (a retried bump)
    busy: bool = False  # a transition is being written (Kafka's pending transition)

    def value(self, **changes) -> TxnValue:
        v = TxnValue(
            self.producer_id,
            self.producer_epoch,
            self.timeout_ms,
            self.state,
            set(self.partitions),
            self.last_update_ms,
            self.start_ms,
        )
        for k, x in changes.items():
            setattr(v, k, x)
        return v

    def apply(self, v: TxnValue) -> None:
        self.producer_id = v.producer_id
        self.producer_epoch = v.producer_epoch
        self.timeout_ms = v.timeout_ms
        self.state = v.state
        self.partitions = set(v.partitions)
        self.last_update_ms = v.last_update_ms
        self.start_ms = v.start_ms

    @property
    def epoch_exhausted(self) -> bool:
        return self.producer_epoch >= _MAX_EPOCH - 1


def _now_ms() -> int:
    return int(time.time() * 1000)


class TransactionCoordinator:
    def __init__(self, core: BrokerCore) -> None:
        self.core = core
        config = core.config
        self.max_timeout_ms: int = config["transaction.max.timeout.ms"]
        self.abort_check_ms: int = config[
            "transaction.abort.timed.out.transaction.cleanup.interval.ms"
        ]
        self.id_expiration_ms: int = config["transactional.id.expiration.ms"]
        self.log = TxnLog(core)
        self.txns: dict[str, TxnMeta] = {}
        # Partitions of the log whose state is in memory -> the coordinator epoch it was read
        # at (leadership lost and regained in between means reading it again).
        self._loaded: dict[int, int] = {}
        self._completing: dict[str, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._timer: asyncio.Task | None = None
        self._started = False

    # -- ownership -----------------------------------------------------------------------------
    def partition_of(self, transactional_id: str) -> int | None:
        return self.log.partition_of(transactional_id)

    def coordinator_epoch(self, idx: int) -> int:
        """The epoch of this broker's leadership of the log's partition (0 on a single node)."""
        return self.core.leadership_epoch(TRANSACTION_STATE_TOPIC, idx)

    def _check_owner(self, transactional_id: str) -> int:
        """The log partition of ``transactional_id``, if this broker coordinates it now."""
        parts = self.core.txn_state_partitions(False)
        if not parts:
            raise CoordinatorError("COORDINATOR_NOT_AVAILABLE")
        from stratalog.broker.txn_records import partition_for

        idx = partition_for(transactional_id, len(parts))
        p = parts[idx]
        if p is None or not p.leading or self.core.leader_error(TRANSACTION_STATE_TOPIC, idx):
            raise CoordinatorError("NOT_COORDINATOR")
        if self._loaded.get(idx) != self.coordinator_epoch(idx):
            self._forget_partition(idx, len(parts))
            self._load_partition(idx, p)
        return idx

    def owns(self, transactional_id: str) -> bool:
        try:
            self._check_owner(transactional_id)
        except CoordinatorError:
            return False
        return True

    # -- life cycle ----------------------------------------------------------------------------
    def load(self) -> None:
        """Read the state of every log partition this broker leads (at start, and in a cluster
        whenever leadership changes); forget the others'."""
        parts = self.core.txn_state_partitions(False)
        leading = set()
        for idx, p in enumerate(parts):
            if (
                p is not None
                and p.leading
                and not self.core.leader_error(TRANSACTION_STATE_TOPIC, idx)
            ):
                leading.add(idx)
                if self._loaded.get(idx) != self.coordinator_epoch(idx):
                    self._forget_partition(idx, len(parts))
                    self._load_partition(idx, p)
        for idx in set(self._loaded) - leading:
            self._forget_partition(idx, len(parts))

    def _forget_partition(self, idx: int, partitions: int) -> None:
        """Leadership of the log's partition ``idx`` went (or changed epoch): its ids' state is
        the next leader's (their completions too, which it finishes)."""
        from stratalog.broker.txn_records import partition_for

        self._loaded.pop(idx, None)
        self.log.forget_partition(idx)
        for tid in [t for t in self.txns if partition_for(t, partitions) == idx]:
            del self.txns[tid]
            task = self._completing.pop(tid, None)
            if task is not None:
                task.cancel()

    def _load_partition(self, idx: int, p) -> None:
        found = self.log.load_partition(idx, p)
        self._loaded[idx] = self.coordinator_epoch(idx)
        for tid, v in found.items():
            m = TxnMeta(tid, v.producer_id, v.producer_epoch, v.timeout_ms, v.state)
            m.apply(v)
            self.txns[tid] = m
            if v.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT) and self._started:
                self._start_completion(m)
        if found:
            log.info("%s-%d: loaded %d transactional ids", TRANSACTION_STATE_TOPIC, idx,
                     len(found))  # fmt: skip

    def start(self) -> None:
        """Finish the transactions found prepared and start the timeout check (on the loop)."""
        self._started = True
        for m in list(self.txns.values()):
            if m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                self._start_completion(m)
        self._timer = asyncio.ensure_future(self._timeout_loop())

    async def close(self) -> None:
        tasks = {*self._completing.values(), *self._tasks}
        if self._timer is not None:
            tasks.add(self._timer)
        await cancel_all(tasks)
        await self.log.close()

    def abandon(self) -> None:
        for t in [*self._completing.values(), *self._tasks]:
            t.cancel()
        if self._timer is not None:
            self._timer.cancel()
        self.log.abandon()

    # -- InitProducerId ------------------------------------------------------------------------
    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int, epoch: int
    ) -> tuple[int, int]:
        """(producer id, epoch) for ``transactional_id``; raises CoordinatorError."""
        if not transactional_id:
            raise CoordinatorError("INVALID_REQUEST")
        if not 0 < timeout_ms <= self.max_timeout_ms:
            raise CoordinatorError("INVALID_TRANSACTION_TIMEOUT")
        self._check_owner(transactional_id)
        m = self.txns.get(transactional_id)
        if m is None:
            pid = await self._new_producer_id()
            m = self.txns.get(transactional_id)  # (another request may have made it meanwhile)
            if m is None:
                m = TxnMeta(transactional_id, pid, NO_EPOCH, timeout_ms, TxnState.EMPTY)
                m.last_update_ms = _now_ms()
                self.txns[transactional_id] = m
        if m.busy:
            raise CoordinatorError("CONCURRENT_TRANSACTIONS")
        expected = producer_id != NO_PRODUCER_ID
        if expected and not (m.producer_epoch == NO_EPOCH or producer_id == m.producer_id):
            raise CoordinatorError("PRODUCER_FENCED")
        state = m.state
        if state in (TxnState.PREPARE_ABORT, TxnState.PREPARE_COMMIT):
            raise CoordinatorError("CONCURRENT_TRANSACTIONS")
        now = _now_ms()
        if state == TxnState.ONGOING:
            # Abort it at a bumped epoch (fencing the producer that opened it); the client
            # retries and gets the epoch after that, once the abort is complete.
            await self._begin_end(m, commit=False, fence=True)
            raise CoordinatorError("CONCURRENT_TRANSACTIONS")
        last = m.producer_epoch
        if m.epoch_exhausted and (not expected or epoch == m.producer_epoch):
            new = m.value(producer_id=await self._new_producer_id(), producer_epoch=0)
            last = NO_EPOCH
        elif not expected or m.producer_epoch == NO_EPOCH or epoch == m.producer_epoch:
            new = m.value(
                producer_epoch=0 if m.producer_epoch == NO_EPOCH else m.producer_epoch + 1
            )
        elif epoch == m.last_producer_epoch:
            return m.producer_id, m.producer_epoch  # a retry of the bump that answered this
        else:
            raise CoordinatorError("PRODUCER_FENCED")
        new.timeout_ms = timeout_ms
        new.state = TxnState.EMPTY
        new.partitions = set()
        new.last_update_ms = now
        new.start_ms = -1
        await self._persist(m, new)
        m.last_producer_epoch = last
        log.info("transactional id %s: producer %d epoch %d", transactional_id, m.producer_id,
                 m.producer_epoch)  # fmt: skip
        return m.producer_id, m.producer_epoch

    async def _new_producer_id(self) -> int:
        core = self.core
        if core.cluster is not None:
            pid = await core.cluster.allocate_producer_id()
        else:
            pid = core.metadata.allocate_producer_id()
        return TRANSACTIONAL_PRODUCER_IDS + pid

    # -- AddPartitionsToTxn, AddOffsetsToTxn ---------------------------------------------------
    def _valid(self, transactional_id: str, producer_id: int, epoch: int) -> TxnMeta:
        if not transactional_id:
            raise CoordinatorError("INVALID_REQUEST")
        self._check_owner(transactional_id)
        m = self.txns.get(transactional_id)
        if m is None or m.producer_id != producer_id:
            raise CoordinatorError("INVALID_PRODUCER_ID_MAPPING")
        if m.producer_epoch != epoch:
            raise CoordinatorError("PRODUCER_FENCED")
        return m

    async def add_partitions(
        self, transactional_id: str, producer_id: int, epoch: int, partitions: set[TopicPartition]
    ) -> None:
        m = self._valid(transactional_id, producer_id, epoch)
        if m.busy or m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            raise CoordinatorError("CONCURRENT_TRANSACTIONS")
        if m.state == TxnState.ONGOING and partitions <= m.partitions:
            return
        now = _now_ms()
        start = m.start_ms if m.state == TxnState.ONGOING else now
        new = m.value(
            state=TxnState.ONGOING,
            partitions=m.partitions | partitions,
            last_update_ms=now,
            start_ms=start,
        )
        await self._persist(m, new)

    def verify(
        self, transactional_id: str, producer_id: int, epoch: int, tp: TopicPartition
    ) -> str | None:
        """KIP-890's check of a transaction's first batch in a partition (Produce): the error
        to answer, None when it may be appended (or another broker coordinates the id)."""
        try:
            self._check_owner(transactional_id)
        except CoordinatorError as e:
            return None if e.error == "NOT_COORDINATOR" else e.error
        m = self.txns.get(transactional_id)
        if m is None or m.producer_id != producer_id:
            return "INVALID_PRODUCER_ID_MAPPING"
        if m.producer_epoch != epoch:
            return "PRODUCER_FENCED"
        if m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return "CONCURRENT_TRANSACTIONS"
        if m.state != TxnState.ONGOING or tp not in m.partitions:
            return "TRANSACTION_ABORTABLE"
        return None

    # -- EndTxn --------------------------------------------------------------------------------
    async def end_txn(
        self, transactional_id: str, producer_id: int, epoch: int, commit: bool
    ) -> None:
        m = self._valid(transactional_id, producer_id, epoch)
        if m.busy:
            raise CoordinatorError("CONCURRENT_TRANSACTIONS")
        state = m.state
        if state == TxnState.ONGOING:
            await self._begin_end(m, commit, fence=False)
            return
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        preparing = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        if state == done:
            return  # a retry of the end that completed
        if state == preparing:
            raise CoordinatorError("CONCURRENT_TRANSACTIONS")
        raise CoordinatorError("INVALID_TXN_STATE")

    async def _begin_end(self, m: TxnMeta, commit: bool, fence: bool) -> None:
        """Write PrepareCommit or PrepareAbort (at a bumped epoch when ``fence``); then write
        the markers and complete, in the background."""
        new = m.value(
            state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT,
            last_update_ms=_now_ms(),
        )
        if fence and not m.epoch_exhausted:
            new.producer_epoch = m.producer_epoch + 1
        await self._persist(m, new)
        if fence:
            m.last_producer_epoch = NO_EPOCH
        self._start_completion(m)

    def _start_completion(self, m: TxnMeta) -> None:
        if m.transactional_id in self._completing:
            return
        task = asyncio.ensure_future(self._complete(m))
        self._completing[m.transactional_id] = task
        task.add_done_callback(lambda _t: self._completing.pop(m.transactional_id, None))

    async def _complete(self, m: TxnMeta) -> None:
        """Write the markers of a prepared transaction until every partition has its marker,
        then write the Complete state."""
        commit = m.state == TxnState.PREPARE_COMMIT
        idx = self.partition_of(m.transactional_id)
        coordinator_epoch = self.coordinator_epoch(idx) if idx is not None else 0
        left = sorted(m.partitions)
        delay = _MARKER_RETRY_S
        while left:
            errors = await self._send_markers(
                m.producer_id, m.producer_epoch, commit, coordinator_epoch, left
            )
            # Done: written, or gone (a deleted topic takes its partitions out).
            left = [
                tp for tp in left if errors.get(tp) not in ("NONE", "UNKNOWN_TOPIC_OR_PARTITION")
            ]
            if left and not self.owns(m.transactional_id):
                return  # no longer ours: the new coordinator finishes it
            if left:
                log.info("transactional id %s: markers for %s not written yet (%s); again",
                         m.transactional_id, left, {tp: errors.get(tp) for tp in left})  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MARKER_RETRY_MAX_S)
        while True:
            new = m.value(
                state=TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT,
                partitions=set(),
                last_update_ms=_now_ms(),
            )
            try:
                await self._persist(m, new)
                return
            except CoordinatorError as e:
                if e.error != "NOT_COORDINATOR" or not self.owns(m.transactional_id):
                    return  # no longer ours: the new coordinator finishes it
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MARKER_RETRY_MAX_S)

    async def _send_markers(
        self,
        producer_id: int,
        epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: list[TopicPartition],
    ) -> dict[TopicPartition, str]:
        """The markers this broker writes itself; in a cluster, the others go to their
        leaders (cluster/txn_markers_remote.py)."""
        core = self.core
        local = [tp for tp in partitions if core.leader_error(*tp) is None]
        errors = await write_markers(core, producer_id, epoch, commit, coordinator_epoch, local)
        remote = [tp for tp in partitions if tp not in errors]
        if remote and core.cluster is not None:
            from stratalog.cluster.txn_markers import send_markers

            errors.update(
                await send_markers(core, producer_id, epoch, commit, coordinator_epoch, remote)
            )
        for tp in remote:
            errors.setdefault(tp, "NOT_LEADER_OR_FOLLOWER")
        return errors

    async def _persist(self, m: TxnMeta, new: TxnValue) -> None:
        """Write ``new`` and apply it once durable; raises CoordinatorError."""
        m.busy = True
        try:
            await self.log.write(m.transactional_id, new)
        except StorageFailure as e:
            log.warning("transactional id %s: state not written: %s", m.transactional_id, e)
            raise CoordinatorError("NOT_COORDINATOR") from None
        finally:
            m.busy = False
        m.apply(new)

    # -- timeouts and expiry -------------------------------------------------------------------
    async def _timeout_loop(self) -> None:
        while True:
            await asyncio.sleep(self.abort_check_ms / 1000)
            try:
                await self.abort_timed_out()
                await self.expire_ids()
            except Exception:
                log.exception("transaction timeout check failed")

    async def abort_timed_out(self, now_ms: int | None = None) -> int:
        """Abort every transaction open longer than its timeout, fencing its producer (Kafka's
        abortTimedOutTransactions); returns how many."""
        now = _now_ms() if now_ms is None else now_ms
        due = [
            m
            for m in self.txns.values()
            if m.state == TxnState.ONGOING and not m.busy and m.start_ms + m.timeout_ms < now
        ]
        for m in due:
            log.info("transactional id %s: transaction open for over %d ms, aborting",
                     m.transactional_id, m.timeout_ms)  # fmt: skip
            try:
                await self._begin_end(m, commit=False, fence=True)
            except CoordinatorError as e:
                log.info("transactional id %s: abort not started: %s", m.transactional_id,
                         e.error)  # fmt: skip
        return len(due)

    async def expire_ids(self, now_ms: int | None = None) -> int:
        """Forget transactional ids idle for transactional.id.expiration.ms (a tombstone)."""
        now = _now_ms() if now_ms is None else now_ms
        idle = [
            m
            for m in self.txns.values()
            if m.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
            and not m.busy
            and now - m.last_update_ms > self.id_expiration_ms
        ]
        for m in idle:
            m.busy = True
            try:
                await self.log.write(m.transactional_id, None)
            except StorageFailure:
                continue
            finally:
                m.busy = False
            if self.txns.get(m.transactional_id) is m:
                del self.txns[m.transactional_id]
        return len(idle)

    # -- describing ----------------------------------------------------------------------------
    def describe(self, transactional_id: str) -> TxnMeta:
        if not transactional_id:
            raise CoordinatorError("INVALID_REQUEST")
        self._check_owner(transactional_id)
        m = self.txns.get(transactional_id)
        if m is None or m.state == TxnState.DEAD or m.producer_epoch == NO_EPOCH:
            raise CoordinatorError("TRANSACTIONAL_ID_NOT_FOUND")
        return m

    def listed(
        self,
        states: set[str],
        producer_ids: set[int],
        min_duration_ms: int = -1,
        pattern: str | None = None,
    ) -> list[TxnMeta]:
        """The transactional ids this broker coordinates that match every filter given."""
        self.load()
        now = _now_ms()
        rx = re.compile(pattern) if pattern else None
        out = []
        for m in self.txns.values():
            if m.producer_epoch == NO_EPOCH:
                continue  # allocated, never answered
            if states and m.state.kafka_name not in states:
                continue
            if producer_ids and m.producer_id not in producer_ids:
                continue
            if min_duration_ms >= 0 and now - m.start_ms <= min_duration_ms:
                continue  # (Kafka's filter: running longer than the duration)
            if rx is not None and not rx.fullmatch(m.transactional_id):
                continue
            out.append(m)
        return sorted(out, key=lambda m: m.transactional_id)
