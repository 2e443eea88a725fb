"""Cluster metadata of the embedded single node, kept in its data directory.

Topics (name, persisted UUID, partitions, configs), the partition uids that storage knows them
by, and the producer-id allocator live in ``meta/cluster.json``, rewritten atomically (write,
fsync, rename, fsync the directory) on every change. Changes are rare, so a whole-file rewrite
is simpler and safer than a log.
"""

from __future__ import annotations

import json
import os
import re
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from stratalog.storage.segment import mkdir_durable

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_LENGTH = 249
PRODUCER_ID_BLOCK = 1000
# Kafka's internal topics (Topic.INTERNAL_TOPICS), internal by name as in Kafka: listed with
# is_internal=true and refused to producers. Only __consumer_offsets exists here (offset_store.py).
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


def is_internal(name: str | None) -> bool:
    return name in INTERNAL_TOPICS


class MetadataError(Exception):
    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


def validate_topic_name(name: str | None) -> None:
    """Kafka's rules: 1-249 characters of [a-zA-Z0-9._-], and not '.' or '..'."""
    if not name:
        raise MetadataError("INVALID_TOPIC_EXCEPTION", "topic name is empty")
    if name in (".", ".."):
        raise MetadataError("INVALID_TOPIC_EXCEPTION", f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_LENGTH:
        raise MetadataError(
            "INVALID_TOPIC_EXCEPTION",
            f"topic name is {len(name)} characters long, the limit is {MAX_TOPIC_LENGTH}",
        )
    if not _LEGAL_TOPIC.match(name):
        raise MetadataError(
            "INVALID_TOPIC_EXCEPTION",
            f"topic name {name!r} has characters outside [a-zA-Z0-9._-]",
        )


@dataclass
class TopicMeta:
    name: str
    topic_id: uuid.UUID
    partitions: list[int]  # partition index -> storage uid
    configs: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "id": str(self.topic_id),
            "partitions": self.partitions,
            "configs": self.configs,
        }


class MetadataStore:
    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir) / "meta"
        self.path = self.dir / "cluster.json"
        self._lock = threading.Lock()
        self.topics: dict[str, TopicMeta] = {}
        self.cluster_id = ""
        self.fresh = False  # the data directory had no metadata before this start
        self.next_uid = 1
        self.producer_id_limit = 0
        self._next_producer_id = 0

    def load(self) -> None:
        mkdir_durable(self.dir)
        if self.path.exists():
            raw = json.loads(self.path.read_text())
            self.cluster_id = raw["cluster_id"]
            self.next_uid = raw["next_uid"]
            self.producer_id_limit = raw["producer_id_limit"]
            for name, t in raw["topics"].items():
                self.topics[name] = TopicMeta(
                    name, uuid.UUID(t["id"]), list(t["partitions"]), dict(t["configs"])
                )
        else:
            # Kafka cluster ids are 22-character URL-safe base64 of 16 random bytes.
            import base64

            cid = "-"
            while cid.startswith("-"):  # as Kafka: never an id a command line reads as an option
                cid = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
            self.cluster_id = cid
            self.fresh = True
            self._save()
        # Ids below the persisted limit may have been handed out before a crash: skip them.
        self._next_producer_id = self.producer_id_limit

    def _save(self) -> None:
        raw = {
            "cluster_id": self.cluster_id,
            "next_uid": self.next_uid,
            "producer_id_limit": self.producer_id_limit,
            "topics": {n: t.to_json() for n, t in self.topics.items()},
        }
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(raw, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- topics --------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicMeta:
        validate_topic_name(name)
        if partitions < 1:
            raise MetadataError(
                "INVALID_PARTITIONS", f"number of partitions must be positive, not {partitions}"
            )
        with self._lock:
            if name in self.topics:
                raise MetadataError("TOPIC_ALREADY_EXISTS", f"topic {name!r} already exists")
            # Kafka's rule: '.' and '_' collide in metric names, so such names are refused.
            folded = name.replace(".", "_")
            clash = next((t for t in self.topics if t.replace(".", "_") == folded), None)
            if clash is not None:
                raise MetadataError(
                    "INVALID_TOPIC_EXCEPTION",
                    f"Topic '{name}' collides with existing topic: {clash}",
                )
            uids = list(range(self.next_uid, self.next_uid + partitions))
            self.next_uid += partitions
            t = TopicMeta(name, uuid.uuid4(), uids, dict(configs))
            self.topics[name] = t
            self._save()
            return t

    def delete_topic(self, name: str) -> TopicMeta:
        with self._lock:
            t = self.topics.pop(name, None)
            if t is None:
                raise MetadataError("UNKNOWN_TOPIC_OR_PARTITION", f"topic {name!r} does not exist")
            self._save()
            return t

    def add_partitions(
        self, name: str, total: int, configs: dict[str, str] | None = None
    ) -> list[int]:
        """Grow ``name`` to ``total`` partitions (and set ``configs`` with them, in the same
        write: a split's history never disagrees with the count after a crash); their uids."""
        with self._lock:
            t = self.topics.get(name)
            if t is None:
                raise MetadataError("UNKNOWN_TOPIC_OR_PARTITION", f"topic {name!r} does not exist")
            if total <= len(t.partitions):
                raise MetadataError(
                    "INVALID_PARTITIONS",
                    f"topic currently has {len(t.partitions)} partitions, which is higher than "
                    f"the requested {total}.",
                )
            new = list(range(self.next_uid, self.next_uid + total - len(t.partitions)))
            self.next_uid += len(new)
            t.partitions.extend(new)
            t.configs.update(configs or {})
            self._save()
            return new

    def set_configs(self, name: str, configs: dict[str, str | None]) -> None:
        with self._lock:
            t = self.topics[name]
            for k, v in configs.items():
                if v is None:
                    t.configs.pop(k, None)
                else:
                    t.configs[k] = v
            self._save()

    # -- cluster mode: a copy of what etcd holds -----------------------------------------------
    def adopt_cluster(self, cluster_id: str) -> None:
        """A fresh data directory joins a cluster: take its id, so a later start with another
        cluster's etcd is refused."""
        with self._lock:
            self.cluster_id = cluster_id
            self.fresh = False
            self._save()

    def put_topic(self, topic: TopicMeta) -> None:
        """Record a topic as the cluster has it (its uids come from etcd)."""
        with self._lock:
            self.topics[topic.name] = topic
            self.next_uid = max([self.next_uid, *(u + 1 for u in topic.partitions)])
            self._save()

    def forget_topic(self, name: str) -> TopicMeta | None:
        with self._lock:
            t = self.topics.pop(name, None)
            if t is not None:
                self._save()
            return t

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicMeta | None:
        for t in self.topics.values():
            if t.topic_id == topic_id:
                return t
        return None

    # -- producer ids --------------------------------------------------------------------------
    def allocate_producer_id(self) -> int:
        with self._lock:
            if self._next_producer_id >= self.producer_id_limit:
                self.producer_id_limit = self._next_producer_id + PRODUCER_ID_BLOCK
                self._save()
            pid = self._next_producer_id
            self._next_producer_id += 1
            return pid
