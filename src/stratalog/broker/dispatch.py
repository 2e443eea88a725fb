"""API key -> handler."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from stratalog.broker import metrics
from stratalog.broker.authorization import guarded
from stratalog.broker.quotas import ANONYMOUS, CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE
from stratalog.protocol import versions as v
from stratalog.protocol.fetch import encode_fetch_response

from .api import (
    acls,
    admin,
    consumer_groups,
    delete_records,
    elections,
    fetch,
    group_admin,
    groups,
    internal_topics,
    log_dirs,
    metadata,
    offsets,
    produce,
    quotas,
    reassignments,
    sasl,
    scram_users,
    share_fetch,
    share_groups,
    share_state,
    transactions,
)
from .api import versions as api_versions

HANDLERS = {
    v.API_VERSIONS: api_versions.handle_api_versions,
    v.METADATA: metadata.handle_metadata,
    v.DESCRIBE_CLUSTER: metadata.handle_describe_cluster,
    v.DESCRIBE_TOPIC_PARTITIONS: metadata.handle_describe_topic_partitions,
    v.PRODUCE: internal_topics.handle_produce,  # produce.handle_produce, internal topics refused
    v.INIT_PRODUCER_ID: produce.handle_init_producer_id,
    v.FETCH: fetch.handle_fetch,
    v.LIST_OFFSETS: offsets.handle_list_offsets,
    v.OFFSET_FOR_LEADER_EPOCH: offsets.handle_offset_for_leader_epoch,
    v.CREATE_TOPICS: admin.handle_create_topics,
    v.DELETE_TOPICS: admin.handle_delete_topics,
    v.DELETE_RECORDS: delete_records.handle_delete_records,
    v.CREATE_PARTITIONS: admin.handle_create_partitions,
    v.DESCRIBE_CONFIGS: admin.handle_describe_configs,
    v.ALTER_CONFIGS: admin.handle_alter_configs,
    v.DESCRIBE_LOG_DIRS: log_dirs.handle_describe_log_dirs,
    v.INCREMENTAL_ALTER_CONFIGS: admin.handle_incremental_alter_configs,
    v.ELECT_LEADERS: elections.handle_elect_leaders,
    v.ALTER_PARTITION_REASSIGNMENTS: reassignments.handle_alter_partition_reassignments,
    v.LIST_PARTITION_REASSIGNMENTS: reassignments.handle_list_partition_reassignments,
    v.FIND_COORDINATOR: groups.handle_find_coordinator,
    v.JOIN_GROUP: groups.handle_join_group,
    v.SYNC_GROUP: groups.handle_sync_group,
    v.HEARTBEAT: groups.handle_heartbeat,
    v.LEAVE_GROUP: groups.handle_leave_group,
    v.OFFSET_COMMIT: groups.handle_offset_commit,
    v.OFFSET_FETCH: groups.handle_offset_fetch,
    v.LIST_GROUPS: groups.handle_list_groups,
    v.DESCRIBE_GROUPS: groups.handle_describe_groups,
    v.CONSUMER_GROUP_HEARTBEAT: consumer_groups.handle_consumer_group_heartbeat,
    v.CONSUMER_GROUP_DESCRIBE: consumer_groups.handle_consumer_group_describe,
    v.SHARE_GROUP_HEARTBEAT: share_groups.handle_share_group_heartbeat,
    v.SHARE_GROUP_DESCRIBE: share_groups.handle_share_group_describe,
    v.SHARE_FETCH: share_fetch.handle_share_fetch,
    v.SHARE_ACKNOWLEDGE: share_fetch.handle_share_acknowledge,
    v.DESCRIBE_SHARE_GROUP_OFFSETS: share_groups.handle_describe_share_group_offsets,
    v.READ_SHARE_GROUP_STATE: share_state.handle_read_share_group_state,
    v.WRITE_SHARE_GROUP_STATE: share_state.handle_write_share_group_state,
    v.DELETE_SHARE_GROUP_STATE: share_state.handle_delete_share_group_state,
    v.SASL_HANDSHAKE: sasl.handle_sasl_handshake,
    v.SASL_AUTHENTICATE: sasl.handle_sasl_authenticate,
    v.DESCRIBE_USER_SCRAM_CREDENTIALS: scram_users.handle_describe_user_scram_credentials,
    v.ALTER_USER_SCRAM_CREDENTIALS: scram_users.handle_alter_user_scram_credentials,
    v.DELETE_GROUPS: group_admin.handle_delete_groups,
    v.OFFSET_DELETE: group_admin.handle_offset_delete,
    v.DESCRIBE_CLIENT_QUOTAS: quotas.handle_describe_client_quotas,
    v.ALTER_CLIENT_QUOTAS: quotas.handle_alter_client_quotas,
    v.ADD_PARTITIONS_TO_TXN: transactions.handle_add_partitions_to_txn,
    v.ADD_OFFSETS_TO_TXN: transactions.handle_add_offsets_to_txn,
    v.END_TXN: transactions.handle_end_txn,
    v.WRITE_TXN_MARKERS: transactions.handle_write_txn_markers,
    v.TXN_OFFSET_COMMIT: transactions.handle_txn_offset_commit,
    v.LIST_TRANSACTIONS: transactions.handle_list_transactions,
    v.DESCRIBE_TRANSACTIONS: transactions.handle_describe_transactions,
    v.DESCRIBE_PRODUCERS: transactions.handle_describe_producers,
    v.DESCRIBE_ACLS: acls.handle_describe_acls,
    v.CREATE_ACLS: acls.handle_create_acls,
    v.DELETE_ACLS: acls.handle_delete_acls,
}

missing = (set(v.SUPPORTED) | set(v.INTER_BROKER)) - set(HANDLERS)
assert not missing, f"advertised APIs without a handler: {missing}"


def make_dispatch(core):
    counters = {
        k: metrics.REQUESTS.labels(h.__name__.removeprefix("handle_")) for k, h in HANDLERS.items()
    }
    byte_quotas = core.byte_quotas
    # With an authorizer, each API's check stands in front of its handler (authorization/);
    # without one the handlers are called as they are.
    handlers = HANDLERS if core.authorizer is None else guarded(HANDLERS, core.authorizer)

    def dispatch(request, conn):
        counters[request.api_key].inc()
        if byte_quotas.store.quotas and request.api_key in (v.PRODUCE, v.FETCH):
            return _under_quota(core, request, conn, handlers)
        return handlers[request.api_key](core, request, conn)

    return dispatch


def _under_quota(core, request, conn, handlers=HANDLERS):
    """Produce and Fetch while client quotas exist (broker/quotas.py): a produce's bytes are
    counted and its answer carries the throttle time they caused; a fetch whose answer would
    put its client over its rate is answered with no records and the throttle time instead. A
    throttled connection takes no new request for the throttle time (KIP-219)."""
    quotas = core.byte_quotas
    user = getattr(conn, "principal", None) or ANONYMOUS
    client_id = request.client_id or ""
    if request.api_key == v.PRODUCE:
        request.throttle_ms = quotas.record(PRODUCER_BYTE_RATE, user, client_id, request.size)
        result = handlers[v.PRODUCE](core, request, conn)
        if request.throttle_ms:
            conn.mute(request.throttle_ms / 1000)
        return result
    result = handlers[v.FETCH](core, request, conn)

    def decide(answer):
        # As Kafka: the answer's bytes are counted; if they put the client over its quota they
        # are taken back and the answer is dropped for an empty one carrying the throttle time.
        n = _size(answer)
        throttle = quotas.record(CONSUMER_BYTE_RATE, user, client_id, n)
        if not throttle:
            return answer
        quotas.record(CONSUMER_BYTE_RATE, user, client_id, -n)
        for part in answer or ():
            release = getattr(part, "release", None)
            if release is not None:
                release()
        conn.mute(throttle / 1000)
        return encode_fetch_response(
            request.api_version, request.correlation_id, [], throttle_ms=throttle
        )[0]

    if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):

        async def decided():
            return decide(await result)

        return decided()
    return decide(result)


def _size(answer) -> int:
    if answer is None:
        return 0
    if isinstance(answer, bytes | bytearray | memoryview):
        return len(answer)
    size = getattr(answer, "size", None)
    if isinstance(size, int):
        return size
    return sum(len(p) if isinstance(p, bytes | bytearray | memoryview) else getattr(p, "size", 0)
               for p in answer)  # fmt: skip


class RequestTimers(dict):
    """The latency histogram's ``observe`` per API key, its labels resolved at the key's first
    request and kept (not per request). An API never called has no series: each one costs 58
    lines of /metrics, and rendering the 23 APIs' took 20-40 ms of the broker's time per scrape."""

    def __missing__(self, api_key: int) -> Callable[[float], None] | None:
        handler = HANDLERS.get(api_key)
        if handler is None:
            return None
        observe = metrics.REQUEST_SECONDS.labels(handler.__name__.removeprefix("handle_")).observe
        self[api_key] = observe
        return observe

    def get(self, api_key: int, default=None):  # dict.get does not call __missing__
        observe = dict.get(self, api_key)
        if observe is None and api_key in HANDLERS:
            observe = self[api_key]
        return default if observe is None else observe


def request_timers() -> RequestTimers:
    return RequestTimers()
