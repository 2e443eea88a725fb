"""Share-group state another broker coordinates (cluster mode): ReadShareGroupState and
WriteShareGroupState (or DeleteShareGroupState for tombstones) v0 to the leader of the key's
``__share_group_state`` partition, as Kafka's share-partition leaders ask its share coordinator
(Kafka's ``DefaultStatePersister``).

A share-partition's writes come one at a time (``ShareStateStore.persist``), so they need no
order between connections; one blocking connection per coordinator is kept and used on a
thread, under a lock, over the inter-broker listener with its security (as transaction markers
go, ``cluster/txn_markers.py``). A coordinator that cannot be reached or answers an error makes
the read or write fail with StorageFailure, which the ShareFetch or ShareAcknowledge it served
answers as a retriable error; a FENCED_LEADER_EPOCH answer is FencedLeader.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
from typing import TYPE_CHECKING, Any

from stratalog.broker.share_state import FencedLeader
from stratalog.broker.share_state_records import (
    SHARE_STATE_TOPIC,
    ShareKey,
    ShareState,
    StateBatch,
    partition_for,
)
from stratalog.client.connection import BrokerConnection
from stratalog.client.errors import WireError
from stratalog.cluster.txn_markers import inter_broker_security
from stratalog.protocol import codec
from stratalog.storage.journal import StorageFailure

if TYPE_CHECKING:
    from stratalog.broker.core import BrokerCore

log = logging.getLogger(__name__)

READ_SHARE_GROUP_STATE = 84
WRITE_SHARE_GROUP_STATE = 85
DELETE_SHARE_GROUP_STATE = 86
_TIMEOUT_S = 10.0

Address = tuple[str, int]


class _Channel:
    """One connection to one coordinator, used by one thread at a time."""

    def __init__(self, address: Address, security) -> None:
        self.lock = threading.Lock()
        self.conn = BrokerConnection(
            address, timeout=_TIMEOUT_S, client_id="share-state", security=security
        )

    def request(self, api_key: int, body: Any) -> Any:
        with self.lock:
            try:
                return self.conn.request(api_key, 0, body)
            except (OSError, WireError):
                self.conn.close()  # the next request connects afresh
                raise


_channels: dict[Address, _Channel] = {}


def _coordinator(core: BrokerCore, key: ShareKey) -> Address:
    cluster = core.cluster
    assert cluster is not None
    t = core.metadata.topics.get(SHARE_STATE_TOPIC)
    if t is None:
        raise StorageFailure(f"{SHARE_STATE_TOPIC} does not exist yet")
    v = cluster.vlog_of(SHARE_STATE_TOPIC, partition_for(key, len(t.partitions)))
    b = cluster.brokers.get(v.primary) if v is not None else None
    if b is None:
        raise StorageFailure(f"no leader for the {SHARE_STATE_TOPIC} partition of {key}")
    return (b.host, b.port)


async def _call(core: BrokerCore, address: Address, api_key: int, body: Any) -> Any:
    ch = _channels.get(address)
    if ch is None:
        ch = _channels[address] = _Channel(address, inter_broker_security(core))
    try:
        return await asyncio.to_thread(ch.request, api_key, body)
    except (OSError, WireError) as e:
        raise StorageFailure(f"share coordinator at {address[0]}:{address[1]}: {e}") from None


def _schema(api_key: int) -> Any:
    """The module of the request's classes (its nested entities by name)."""
    return importlib.import_module(codec.request_class(api_key, 0).__module__)


async def read_remote(core: BrokerCore, key: ShareKey, leader_epoch: int = -1) -> ShareState | None:
    group, topic_id, index = key
    m = _schema(READ_SHARE_GROUP_STATE)
    body = m.ReadShareGroupStateRequest(
        group_id=group,
        topics=(m.ReadStateData(topic_id=topic_id,
                                partitions=(m.PartitionData(partition=index,
                                                            leader_epoch=leader_epoch),)),),
    )  # fmt: skip
    resp = await _call(core, _coordinator(core, key), READ_SHARE_GROUP_STATE, body)
    for t in resp.results:
        for p in t.partitions:
            if p.error_code.name.upper() == "FENCED_LEADER_EPOCH":
                raise FencedLeader([key])
            if p.error_code.value != 0:
                raise StorageFailure(f"ReadShareGroupState of {key}: {p.error_code.name}")
            if p.start_offset < 0:
                return None  # never written
            batches = tuple(
                StateBatch(s.first_offset, s.last_offset, s.delivery_state, s.delivery_count)
                for s in p.state_batches
            )
            return ShareState(p.start_offset, batches, p.state_epoch)
    raise StorageFailure(f"ReadShareGroupState of {key}: no answer for it")


def _partition(m: Any, key: ShareKey, state: ShareState | None) -> Any:
    if state is None:
        return m.PartitionData(partition=key[2])
    return m.PartitionData(
        partition=key[2],
        state_epoch=state.state_epoch,
        leader_epoch=state.leader_epoch,
        start_offset=state.start_offset,
        state_batches=tuple(
            m.StateBatch(first_offset=b.first_offset, last_offset=b.last_offset,
                         delivery_state=b.delivery_state, delivery_count=b.delivery_count)
            for b in state.batches
        ),
    )  # fmt: skip


async def write_remote(core: BrokerCore, entries: list[tuple[ShareKey, ShareState | None]]):
    """Write (or delete, for None) each state at its coordinator, one request per coordinator,
    group and kind; raises FencedLeader or StorageFailure when any was not written."""
    requests: dict[tuple[Address, str, int], list[tuple[ShareKey, ShareState | None]]] = {}
    for key, state in entries:
        api = DELETE_SHARE_GROUP_STATE if state is None else WRITE_SHARE_GROUP_STATE
        requests.setdefault((_coordinator(core, key), key[0], api), []).append((key, state))

    async def one(address: Address, group: str, api: int, items) -> list[tuple[ShareKey, str]]:
        m = _schema(api)
        by_topic: dict = {}
        for key, state in items:
            by_topic.setdefault(key[1], []).append(_partition(m, key, state))
        data = m.WriteStateData if api == WRITE_SHARE_GROUP_STATE else m.DeleteStateData
        request = codec.request_class(api, 0)
        body = request(group_id=group, topics=tuple(
            data(topic_id=tid, partitions=tuple(parts)) for tid, parts in by_topic.items()
        ))  # fmt: skip
        resp = await _call(core, address, api, body)
        return [
            ((group, t.topic_id, p.partition), p.error_code.name.upper())
            for t in resp.results
            for p in t.partitions
            if p.error_code.value != 0
        ]

    answers = await asyncio.gather(*(one(*k, items) for k, items in requests.items()))
    errors = [e for a in answers for e in a]
    fenced = [key for key, e in errors if e == "FENCED_LEADER_EPOCH"]
    if fenced:
        raise FencedLeader(fenced)
    if errors:
        raise StorageFailure(f"WriteShareGroupState: {errors[:3]}")
