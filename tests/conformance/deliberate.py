"""The allow-list: where Stratalog differs from Apache Kafka on purpose.

Each entry is a scenario id -> the reason. docs/compatibility.md lists every entry with the same
reason (checked by test_deliberate.py::test_allow_list_is_documented). A test of a listed
difference does not compare the two brokers for equality: it calls :func:`check_deliberate`,
which asserts Stratalog's documented behaviour AND that Kafka really behaves differently, so an
entry cannot outlive the difference it excuses. Nothing else may be allow-listed: an unlisted
difference is a broker bug and its test fails.
"""

from __future__ import annotations

from typing import Any

DELIBERATE: dict[str, str] = {
    "configs.compression-type-rejected": (
        "Stratalog stores batches as the producer compressed them and never recompresses: a topic "
        "compression.type other than 'producer' is rejected with INVALID_CONFIG."
    ),
    "configs.unsupported-topic-config-rejected": (
        "Stratalog accepts only the topic configs it implements (docs/configuration.md); other "
        "Kafka topic configs (e.g. preallocate, index.interval.bytes) are rejected with "
        "INVALID_CONFIG instead of being accepted and ignored."
    ),
    "configs.segment-bytes-default": (
        "Partitions share virtual logs, whose segments roll at the broker's segment.bytes, "
        "default 134217728 (128 MiB); DescribeConfigs reports that as the topic default where "
        "Kafka reports its 1073741824 (1 GiB)."
    ),
    "retention.per-chunk": (
        "Retention drops whole chunks (record batches) whose newest timestamp is older than "
        "retention.ms, not whole segments: the log start offset moves past expired batches even "
        "when newer batches follow them in the same segment."
    ),
    "groups.consumer-protocol-without-classic-members": (
        "A group of the consumer protocol (KIP-848) takes no classic members and is not converted "
        "between protocols: a JoinGroup for one with members is answered "
        "INCONSISTENT_GROUP_PROTOCOL, and a ConsumerGroupHeartbeat for a classic group with "
        "members GROUP_ID_NOT_FOUND. Kafka 4.4 (group.consumer.migration.policy=bidirectional) "
        "lets classic members join a consumer group and converts a group between the protocols "
        "as its members move."
    ),
    "share.start-offset-current": (
        "DescribeShareGroupOffsets reports a share-partition's start offset as it is once the "
        "acknowledgements it answered took effect. Kafka 4.4 reports the start offset its share "
        "coordinator last persisted, which trails by one state change: after the last "
        "outstanding record is archived at the delivery limit, Kafka still reports the start "
        "offset from before (with lag 0) until something else changes."
    ),
    "offsets.commit-value-version-3": (
        "Committed offsets are written to __consumer_offsets as OffsetCommitValue version 3, "
        "the newest non-flexible version, which Kafka's readers since 2.1 decode; Kafka 4.4 "
        "writes version 4 (flexible, with the topic id in a tagged field), which readers from "
        "before KIP-915 cannot. The keys (record type 1) are the same, and both values decode "
        "to the same offset, leader epoch, metadata and commit timestamp."
    ),
    "fsync.high-watermark-after-fsync": (
        "Under fsync=always (the default) the high watermark moves only once the group commit's "
        "fsync covered the batch: an acks=1 produce is answered at append, before the record is "
        "visible to ListOffsets(latest) and Fetch."
    ),
    "cluster.backups-refuse-consumer-fetches": (
        "A consumer's Fetch sent to a replica that is not the partition's leader is answered "
        "NOT_LEADER_OR_FOLLOWER, naming the leader (KIP-951) from Fetch v16; Kafka's followers "
        "serve consumers' fetches from Fetch v11 (KIP-392). Stratalog's backups hold a copy of "
        "the leader's virtual log but do not serve reads from it yet."
    ),
    "cluster.election-moves-the-virtual-log": (
        "A partition's leader is the primary of its virtual log, which every partition with the "
        "same replica list shares (KerA): a preferred leader election for one partition moves "
        "all the partitions of its log to the same preferred replica at once, where Kafka moves "
        "only the partitions named. Partitions of one log always share their preferred replica, "
        "so no partition is moved away from it."
    ),
    "cluster.reassigned-partition-led-by-first-replica": (
        "A reassigned partition moves into the virtual log of its new replica list, whose "
        "primary is that list's first replica (when alive): the partition's leader becomes the "
        "first target replica when the move completes. Kafka keeps the current leader if it "
        "stays a replica and moves it only on a preferred election. During the move Metadata "
        "shows the old replicas (Kafka shows target plus removing); ListPartitionReassignments "
        "shows Kafka's view (replicas = target then removing, adding, removing)."
    ),
}


def check_deliberate(scenario: str, stratalog: Any, kafka: Any, *, documented: Any) -> None:
    """Stratalog shows its documented behaviour, and Kafka differs from it."""
    assert scenario in DELIBERATE, f"{scenario} is not on the allow-list"
    assert stratalog == documented, (
        f"{scenario}: Stratalog no longer behaves as documented ({DELIBERATE[scenario]})"
    )
    assert kafka != stratalog, (
        f"{scenario}: Kafka now behaves like Stratalog; drop the allow-list entry"
    )
