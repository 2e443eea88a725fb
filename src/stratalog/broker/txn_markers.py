"""Writing transaction markers: the COMMIT or ABORT control batch that ends a transaction in each
partition it wrote to (Kafka's WriteTxnMarkers, KIP-98).

A marker goes through the same append path as a Produce (``PartitionLog.append`` in a
``WriteBatch``, then ``when_durable``), so it is framed, indexed, replicated and made durable like
any batch; the partition's transaction index (storage/txn_index.py) sees it when written, and the
last stable offset passes the transaction once the high watermark passes the marker. Markers in
``__consumer_offsets`` also settle the transaction's offset commits (offset_store.py).

The transaction coordinator calls :func:`write_markers` for the partitions this broker leads;
in a cluster the others' leaders get a WriteTxnMarkers request (broker/api/transactions.py
answers it with the same function).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from stratalog.broker.offset_records import OFFSETS_TOPIC
from stratalog.storage.batch import CorruptBatchError
from stratalog.storage.journal import StorageFailure
from stratalog.storage.partition import AppendError, AppendResult, PartitionLog
from stratalog.storage.replica import NotPrimary
from stratalog.storage.txn_index import marker_batch
from stratalog.storage.virtual_log import WriteBatch

if TYPE_CHECKING:
    from stratalog.broker.core import BrokerCore

TopicPartition = tuple[str, int]


async def write_markers(
    core: BrokerCore,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    partitions: list[TopicPartition],
) -> dict[TopicPartition, str]:
    """Append the marker to every partition (this broker must lead them) and wait until each is
    durable; returns the error name per partition ("NONE" once durable)."""
    errors: dict[TopicPartition, str] = {}
    batch = marker_batch(
        producer_id, producer_epoch, commit, coordinator_epoch, int(time.time() * 1000)
    )
    writes = WriteBatch()
    staged: list[tuple[TopicPartition, PartitionLog, AppendResult]] = []
    try:
        for tp in partitions:
            lead = core.leader_error(*tp)
            p = core.partition(*tp) if lead is None else None
            if p is None:
                errors[tp] = lead or "UNKNOWN_TOPIC_OR_PARTITION"
                continue
            try:
                res = p.append(batch, markers=True, writes=writes)
            except (AppendError, CorruptBatchError) as e:
                errors[tp] = e.error
                continue
            except NotPrimary:
                errors[tp] = "NOT_LEADER_OR_FOLLOWER"
                continue
            except StorageFailure:
                errors[tp] = "KAFKA_STORAGE_ERROR"
                continue
            staged.append((tp, p, res))
    finally:
        writes.commit()
    waits: list[tuple[TopicPartition, PartitionLog, asyncio.Future[bool]]] = []
    loop = asyncio.get_running_loop()
    for tp, p, res in staged:
        if res.failure is not None or not res.written:
            errors[tp] = "KAFKA_STORAGE_ERROR"
            continue
        fut: asyncio.Future[bool] = loop.create_future()
        p.when_durable(res.lsn, lambda ok, f=fut: f.done() or f.set_result(ok))
        waits.append((tp, p, fut))
    for tp, _p, fut in waits:
        ok = await fut
        if not ok:
            errors[tp] = (
                "NOT_LEADER_OR_FOLLOWER" if core.leader_error(*tp) else "KAFKA_STORAGE_ERROR"
            )
            continue
        errors[tp] = "NONE"
        if tp[0] == OFFSETS_TOPIC:
            core.offsets.complete_txn(tp[1], producer_id, commit)
    return errors
