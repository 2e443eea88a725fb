"""The transaction coordinator's durable state: the internal topic ``__transaction_state``.

Every transition of a transactional id (a new producer epoch, partitions added, prepare commit or
abort, complete) is appended as a record of Kafka's own format (txn_records.py) to the topic's
partition of that id and counts only once durable; at start, or when this broker starts leading
a partition of the topic, the state is read back from the partition's log start. The machinery
(durable writes, replay, the snapshot rewrite that keeps the topic short) is ``state_log.py``'s,
shared with the share-group state.
"""

from __future__ import annotations

from typing import Protocol

from stratalog.broker.state_log import StateCodec, StateLog
from stratalog.broker.txn_records import (
    TxnValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
)
from stratalog.storage.partition import PartitionLog

TXN_CODEC: StateCodec[str, TxnValue] = StateCodec(
    "transactional ids", partition_for, encode_key, encode_value, decode_key, decode_value
)


class TxnLogHost(Protocol):
    def txn_state_partitions(self, create: bool) -> list[PartitionLog | None]:
        """The topic's partitions in order (None: one another broker of a cluster holds);
        creates the topic if ``create``, else [] when it does not exist."""
        ...

    def delete_records(self, p: PartitionLog, before: int) -> None: ...


class TxnLog(StateLog[str, TxnValue]):
    def __init__(self, host: TxnLogHost) -> None:
        super().__init__(TXN_CODEC, host.txn_state_partitions, host.delete_records)
