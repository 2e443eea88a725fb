"""API key -> handler."""

from __future__ import annotations

from collections.abc import Callable

from stratalog.broker import metrics
from stratalog.protocol import versions as v

from .api import admin, fetch, groups, metadata, offsets, produce
from .api import versions as api_versions

HANDLERS = {
    v.API_VERSIONS: api_versions.handle_api_versions,
    v.METADATA: metadata.handle_metadata,
    v.DESCRIBE_CLUSTER: metadata.handle_describe_cluster,
    v.DESCRIBE_TOPIC_PARTITIONS: metadata.handle_describe_topic_partitions,
    v.PRODUCE: produce.handle_produce,
    v.INIT_PRODUCER_ID: produce.handle_init_producer_id,
    v.FETCH: fetch.handle_fetch,
    v.LIST_OFFSETS: offsets.handle_list_offsets,
    v.OFFSET_FOR_LEADER_EPOCH: offsets.handle_offset_for_leader_epoch,
    v.CREATE_TOPICS: admin.handle_create_topics,
    v.DELETE_TOPICS: admin.handle_delete_topics,
    v.CREATE_PARTITIONS: admin.handle_create_partitions,
    v.DESCRIBE_CONFIGS: admin.handle_describe_configs,
    v.INCREMENTAL_ALTER_CONFIGS: admin.handle_incremental_alter_configs,
    v.FIND_COORDINATOR: groups.handle_find_coordinator,
    v.JOIN_GROUP: groups.handle_join_group,
    v.SYNC_GROUP: groups.handle_sync_group,
    v.HEARTBEAT: groups.handle_heartbeat,
    v.LEAVE_GROUP: groups.handle_leave_group,
    v.OFFSET_COMMIT: groups.handle_offset_commit,
    v.OFFSET_FETCH: groups.handle_offset_fetch,
    v.LIST_GROUPS: groups.handle_list_groups,
    v.DESCRIBE_GROUPS: groups.handle_describe_groups,
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


def request_timers() -> dict[int, Callable[[float], None]]:
    """The latency histogram's ``observe`` per API key (labels resolved once, not per request)."""
    return {
        k: metrics.REQUEST_SECONDS.labels(h.__name__.removeprefix("handle_")).observe
        for k, h in HANDLERS.items()
    }
