"""The API versions Stratalog advertises: only those real clients exercise in the tests.

Minimums follow Kafka 4.x (KIP-896 removed older versions). Each range was checked against
kcat/librdkafka, confluent-kafka, aiokafka, kafka-python and Kafka's own Java client.
"""

from __future__ import annotations

PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
SASL_HANDSHAKE = 17
API_VERSIONS = 18
CREATE_TOPICS = 19
DELETE_TOPICS = 20
DELETE_RECORDS = 21
INIT_PRODUCER_ID = 22
OFFSET_FOR_LEADER_EPOCH = 23
ADD_PARTITIONS_TO_TXN = 24
ADD_OFFSETS_TO_TXN = 25
END_TXN = 26
WRITE_TXN_MARKERS = 27
TXN_OFFSET_COMMIT = 28
DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
DESCRIBE_LOG_DIRS = 35
SASL_AUTHENTICATE = 36
CREATE_PARTITIONS = 37
DELETE_GROUPS = 42
ELECT_LEADERS = 43
INCREMENTAL_ALTER_CONFIGS = 44
DESCRIBE_USER_SCRAM_CREDENTIALS = 50
ALTER_USER_SCRAM_CREDENTIALS = 51
ALTER_PARTITION_REASSIGNMENTS = 45
LIST_PARTITION_REASSIGNMENTS = 46
OFFSET_DELETE = 47
DESCRIBE_CLIENT_QUOTAS = 48
ALTER_CLIENT_QUOTAS = 49
DESCRIBE_CLUSTER = 60
DESCRIBE_PRODUCERS = 61
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66
CONSUMER_GROUP_HEARTBEAT = 68
CONSUMER_GROUP_DESCRIBE = 69
DESCRIBE_TOPIC_PARTITIONS = 75
SHARE_GROUP_HEARTBEAT = 76
SHARE_GROUP_DESCRIBE = 77
SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79
READ_SHARE_GROUP_STATE = 84
WRITE_SHARE_GROUP_STATE = 85
DELETE_SHARE_GROUP_STATE = 86
DESCRIBE_SHARE_GROUP_OFFSETS = 90

SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 12),
    FETCH: (4, 17),
    LIST_OFFSETS: (1, 10),
    METADATA: (0, 12),
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (1, 9),
    FIND_COORDINATOR: (0, 6),
    JOIN_GROUP: (0, 9),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    SYNC_GROUP: (0, 5),
    DESCRIBE_GROUPS: (0, 5),
    LIST_GROUPS: (0, 5),
    API_VERSIONS: (0, 4),
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 6),
    DELETE_RECORDS: (0, 2),
    INIT_PRODUCER_ID: (0, 5),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
    # Transactions (KIP-98) without KIP-890's part 2 (a new epoch at every transaction): clients
    # send AddPartitionsToTxn up to v3 (v4+ is between brokers), EndTxn v5 and TxnOffsetCommit
    # v5 only when the broker finalizes transaction.version 2, which Stratalog does not.
    ADD_PARTITIONS_TO_TXN: (0, 3),
    ADD_OFFSETS_TO_TXN: (0, 4),
    END_TXN: (0, 4),
    WRITE_TXN_MARKERS: (1, 1),
    TXN_OFFSET_COMMIT: (0, 4),
    DESCRIBE_CONFIGS: (1, 4),
    ALTER_CONFIGS: (0, 2),
    DESCRIBE_LOG_DIRS: (1, 4),
    CREATE_PARTITIONS: (0, 3),
    DELETE_GROUPS: (0, 2),
    ELECT_LEADERS: (0, 2),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ALTER_PARTITION_REASSIGNMENTS: (0, 1),
    LIST_PARTITION_REASSIGNMENTS: (0, 0),
    OFFSET_DELETE: (0, 0),
    DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ALTER_CLIENT_QUOTAS: (0, 1),
    DESCRIBE_CLUSTER: (0, 1),
    DESCRIBE_PRODUCERS: (0, 0),
    DESCRIBE_TRANSACTIONS: (0, 0),
    LIST_TRANSACTIONS: (0, 2),
    DESCRIBE_TOPIC_PARTITIONS: (0, 0),
    # The consumer group protocol (KIP-848; broker/api/consumer_groups.py).
    CONSUMER_GROUP_HEARTBEAT: (0, 1),
    CONSUMER_GROUP_DESCRIBE: (0, 1),
    # Share groups (KIP-932; broker/api/share_groups.py, broker/api/share_fetch.py).
    SHARE_GROUP_HEARTBEAT: (1, 1),
    SHARE_GROUP_DESCRIBE: (1, 1),
    SHARE_FETCH: (1, 2),
    SHARE_ACKNOWLEDGE: (1, 2),
    DESCRIBE_SHARE_GROUP_OFFSETS: (0, 1),
    # Security (security/, broker/api/sasl.py, broker/api/scram_users.py).
    SASL_HANDSHAKE: (0, 1),
    SASL_AUTHENTICATE: (0, 2),
    DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    # ACLs (broker/api/acls.py), from v1 as Kafka 4.x (KIP-896 removed v0).
    DESCRIBE_ACLS: (1, 3),
    CREATE_ACLS: (1, 3),
    DELETE_ACLS: (1, 3),
}


# Answered but not advertised: APIs only brokers send each other, which Kafka answers on its
# inter-broker listener alone. The share coordinator's (broker/api/share_state.py): a cluster's
# share-partition leader reads and writes its state at the coordinator.
INTER_BROKER: dict[int, tuple[int, int]] = {
    READ_SHARE_GROUP_STATE: (0, 0),
    WRITE_SHARE_GROUP_STATE: (0, 0),
    DELETE_SHARE_GROUP_STATE: (0, 0),
}

# Advertised minimums that differ from what is accepted. Kafka 4.x advertises Produce from v0
# although it rejects v0-v2: librdkafka < 2.x checks for Produce v0 before it compresses, and
# silently sends uncompressed batches to a broker that does not list it.
ADVERTISED_MIN: dict[int, int] = {PRODUCE: 0}


def advertised() -> dict[int, tuple[int, int]]:
    return {k: (ADVERTISED_MIN.get(k, lo), hi) for k, (lo, hi) in SUPPORTED.items()}


def is_supported(api_key: int, version: int) -> bool:
    r = SUPPORTED.get(api_key) or INTER_BROKER.get(api_key)
    return r is not None and r[0] <= version <= r[1]
