"""Transaction markers for partitions another broker leads (cluster mode): WriteTxnMarkers v1 to
each partition's leader, as Kafka's TransactionMarkerChannelManager sends them.

The coordinator (broker/txn_coordinator.py) writes the markers of the partitions it leads itself
and hands the rest here, grouped by leader; a partition whose leader is unknown or answers an
error is reported as such and retried by the coordinator. A blocking connection per request,
run on a thread: markers are one small request per leader and transaction. They go to the
leader's inter-broker listener with that listener's security: over PLAINTEXT as
``User:ANONYMOUS``; over SSL presenting this broker's own certificate (``ssl.keystore.location``,
checked against ``ssl.truststore.location``), so the principal is the broker's certificate
subject, as Kafka's brokers are known to each other (give it CLUSTER_ACTION, or make it a super
user, when the authorizer is on).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import TYPE_CHECKING

from stratalog.client.connection import BrokerConnection
from stratalog.client.errors import WireError
from stratalog.client.security import ClientSecurity
from stratalog.protocol import codec

if TYPE_CHECKING:
    from stratalog.broker.core import BrokerCore

log = logging.getLogger(__name__)

WRITE_TXN_MARKERS = 27
VERSION = 1
_TIMEOUT_S = 30.0

TopicPartition = tuple[str, int]


def _request(producer_id: int, epoch: int, commit: bool, coordinator_epoch: int, tps) -> object:
    by_topic: dict[str, list[int]] = {}
    for topic, index in tps:
        by_topic.setdefault(topic, []).append(index)
    request = codec.request_class(WRITE_TXN_MARKERS, VERSION)
    mod = importlib.import_module(request.__module__)
    topics = tuple(
        mod.WritableTxnMarkerTopic(name=t, partition_indexes=tuple(ix))
        for t, ix in by_topic.items()
    )
    marker = mod.WritableTxnMarker(
        producer_id=producer_id,
        producer_epoch=epoch,
        transaction_result=commit,
        topics=topics,
        coordinator_epoch=coordinator_epoch,
    )
    return request(markers=(marker,))


def inter_broker_security(core: BrokerCore) -> ClientSecurity | None:
    """How this broker connects to its peers' inter-broker listeners (the same listener as its
    own; None: PLAINTEXT). A SASL inter-broker listener has no broker credentials here."""
    listener = core.listener
    protocol = listener.protocol if listener is not None else "PLAINTEXT"
    if protocol == "PLAINTEXT":
        return None
    config = core.config
    if protocol != "SSL":
        raise WireError(
            f"transaction markers over a {protocol} inter-broker listener need broker "
            "credentials Stratalog does not have yet: make the inter-broker listener "
            "(inter.broker.listener.name) PLAINTEXT or SSL"
        )
    return ClientSecurity(
        protocol="SSL",
        truststore=config["ssl.truststore.location"] or None,
        keystore=config["ssl.keystore.location"] or None,
        key_password=config["ssl.key.password"] or None,
    )


def _send(
    address: tuple[str, int], body: object, security: ClientSecurity | None
) -> dict[TopicPartition, str]:
    conn = BrokerConnection(address, timeout=_TIMEOUT_S, client_id="txn-markers", security=security)
    try:
        resp = conn.request(WRITE_TXN_MARKERS, VERSION, body)
    finally:
        conn.close()
    out: dict[TopicPartition, str] = {}
    for m in resp.markers:
        for t in m.topics:
            for p in t.partitions:
                out[(t.name, p.partition_index)] = p.error_code.name.upper()
    return out


async def send_markers(
    core: BrokerCore,
    producer_id: int,
    epoch: int,
    commit: bool,
    coordinator_epoch: int,
    partitions: list[TopicPartition],
) -> dict[TopicPartition, str]:
    """Ask each partition's leader for the marker; the error name per partition."""
    cluster = core.cluster
    assert cluster is not None
    errors: dict[TopicPartition, str] = {}
    by_leader: dict[tuple[str, int], list[TopicPartition]] = {}
    for tp in partitions:
        v = cluster.vlog_of(*tp)
        b = cluster.brokers.get(v.primary) if v is not None else None
        if v is None:
            errors[tp] = "UNKNOWN_TOPIC_OR_PARTITION"
        elif b is None:
            errors[tp] = "NOT_LEADER_OR_FOLLOWER"
        else:
            by_leader.setdefault((b.host, b.port), []).append(tp)

    async def one(address: tuple[str, int], tps: list[TopicPartition]) -> None:
        body = _request(producer_id, epoch, commit, coordinator_epoch, tps)
        try:
            got = await asyncio.to_thread(_send, address, body, inter_broker_security(core))
        except (OSError, WireError) as e:
            log.info("markers to %s:%d failed: %s", *address, e)
            got = {}
        for tp in tps:
            errors[tp] = got.get(tp, "NOT_LEADER_OR_FOLLOWER")

    await asyncio.gather(*(one(a, tps) for a, tps in by_leader.items()))
    return errors
