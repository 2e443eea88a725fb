"""API key -> handler."""

from __future__ import annotations

from collections.abc import Callable

from stratalog.broker import metrics
from stratalog.protocol import versions as v

from .api import (
    admin,
    elections,
    fetch,
    groups,
    internal_topics,
    log_dirs,
    metadata,
    offsets,
    produce,
    reassignments,
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
    v.CREATE_PARTITIONS: admin.handle_create_partitions,
    v.DESCRIBE_CONFIGS: admin.handle_describe_configs,
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
    v.ADD_PARTITIONS_TO_TXN: transactions.handle_add_partitions_to_txn,
    v.ADD_OFFSETS_TO_TXN: transactions.handle_add_offsets_to_txn,
    v.END_TXN: transactions.handle_end_txn,
    v.WRITE_TXN_MARKERS: transactions.handle_write_txn_markers,
    v.TXN_OFFSET_COMMIT: transactions.handle_txn_offset_commit,
    v.LIST_TRANSACTIONS: transactions.handle_list_transactions,
    v.DESCRIBE_TRANSACTIONS: transactions.handle_describe_transactions,
    v.DESCRIBE_PRODUCERS: transactions.handle_describe_producers,
}

missing = set(v.SUPPORTED) - set(HANDLERS)
assert not missing, f"advertised APIs without a handler: {missing}"


def make_dispatch(core):
    counters = {
        k: metrics.REQUESTS.labels(h.__name__.removeprefix("handle_")) for k, h in HANDLERS.items()
    }

    def dispatch(request, conn):
        counters[request.api_key].inc()
        return HANDLERS[request.api_key](core, request, conn)

    return dispatch


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
