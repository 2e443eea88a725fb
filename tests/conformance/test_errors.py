"""Error paths, on both brokers: the same mistakes must be answered with the same errors.

Produce and fetch on a missing topic, invalid topic names, CreateTopics of an existing topic or
with zero partitions, DeleteTopics of a missing topic, fetch out of range (raw, and a consumer's
auto.offset.reset earliest/latest/error), ListOffsets by a future timestamp, a record batch larger
than max.message.bytes, idempotent sequence gaps and duplicates (raw Produce), JoinGroup,
SyncGroup, Heartbeat and OffsetCommit with unknown members and stale generations (raw requests).
Error codes are shown by name.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaProducer
from kio.schema.errors import ErrorCode

from stratalog.records import build_batch

from . import wire
from .conftest import both
from .wire import ZERO_UUID

pytestmark = pytest.mark.kafka


def _now_ms() -> int:
    return int(time.time() * 1000)


def err(code: int) -> str:
    return ErrorCode(code).name.upper()


def _batch(n: int, ts: int, **kw: Any) -> bytes:
    return build_batch([(f"k{i}".encode(), f"v{i}".encode(), ts + i) for i in range(n)], **kw)


def check(strat: Any, kafka: Any) -> None:
    assert strat == kafka, wire.differences(strat, kafka)


# -- missing topics -------------------------------------------------------------------------------


def produce_missing(bs: str, topic: str, ts: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in (3, 7, 9, 12):
        r = wire.produce(bs, f"{topic}-missing", 0, _batch(1, ts), version=v)
        out[f"raw-v{v}"] = (err(r["error_code"]), r["base_offset"])
    assert wire.create_topic(bs, topic, 2) == 0
    r = wire.produce(bs, topic, 7, _batch(1, ts))
    out["missing-partition"] = (err(r["error_code"]), r["base_offset"])
    # librdkafka waits for the topic to appear until message.timeout.ms, then fails the message
    p = Producer({"bootstrap.servers": bs, "message.timeout.ms": 2000})
    errors: list[str] = []
    p.produce(f"{topic}-missing", b"v", on_delivery=lambda e, m: errors.append(e and e.name()))
    p.flush(10)
    out["confluent"] = errors
    kp = KafkaProducer(bootstrap_servers=bs, max_block_ms=1500)
    try:
        kp.send(f"{topic}-missing", b"v").get(timeout=5)
        out["kafka-python"] = "sent"
    except Exception as e:
        out["kafka-python"] = type(e).__name__
    finally:
        kp.close(timeout=5)
    return out


def test_produce_to_missing_topic(pair, name):
    strat, kafka = both(pair, produce_missing, name, _now_ms())
    check(strat, kafka)
    assert kafka["raw-v9"] == ("UNKNOWN_TOPIC_OR_PARTITION", -1)


def fetch_missing(bs: str, topic: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    p = wire.fetch(bs, f"{topic}-missing", 0, 0)
    out["by-name-v12"] = (err(p["error_code"]), p["high_watermark"], p["records"])
    r = wire.call(
        bs, 1, 17, replica_id=-1, max_wait=50, min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1,
        topics=[{"topic_id": uuid.UUID(int=12345), "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
             "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1024}]}],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip
    out["by-id-v17"] = wire.normalise(r)
    assert wire.create_topic(bs, topic, 1) == 0
    p = wire.fetch(bs, topic, 3, 0)
    out["missing-partition"] = (err(p["error_code"]), p["high_watermark"])
    return out


def test_fetch_from_missing_topic(pair, name):
    strat, kafka = both(pair, fetch_missing, name)
    check(strat, kafka)
    assert kafka["by-name-v12"][0] == "UNKNOWN_TOPIC_OR_PARTITION"


# -- topic names, CreateTopics, DeleteTopics ------------------------------------------------------

BAD_NAMES = ["", ".", "..", "a" * 250, "has space", "slash/name", "colon:name", "ünicode", "tab\t"]


def invalid_names(bs: str, prefix: str) -> dict[str, Any]:
    longest = prefix + "x" * (249 - len(prefix))  # 249 characters: the longest legal name
    names = [*BAD_NAMES, longest]
    out: dict[str, Any] = {}
    for n in names:
        key = n if len(n) < 40 else f"<{len(n)} chars>"
        created = wire.call(
            bs, 19, 7,
            topics=[{"name": n, "num_partitions": 1, "replication_factor": 1, "assignments": [],
                     "configs": []}],
            timeout=10000, validate_only=True,
        )["topics"][0]  # fmt: skip
        md = wire.metadata(bs, n)["topics"][0]
        produced = wire.produce(bs, n, 0, _batch(1, _now_ms()))
        deleted = wire.call(bs, 20, 6, topics=[{"name": n, "topic_id": ZERO_UUID}], timeout=5000)
        out[key] = {
            "create": err(created["error_code"]),
            "metadata": err(md["error_code"]),
            "produce": err(produced["error_code"]),
            "delete": err(deleted["responses"][0]["error_code"]),
        }
    # '.' and '_' collide in metric names: Kafka refuses a name that differs only in those
    assert wire.create_topic(bs, f"{prefix}_dot", 1) == 0
    r = wire.call(
        bs, 19, 7,
        topics=[{"name": f"{prefix}.dot", "num_partitions": 1, "replication_factor": 1,
                 "assignments": [], "configs": []}],
        timeout=10000, validate_only=False,
    )  # fmt: skip
    out["collision"] = err(r["topics"][0]["error_code"])
    return out


def test_invalid_topic_names(pair, name):
    strat, kafka = both(pair, invalid_names, name)
    check(strat, kafka)
    assert kafka["has space"]["create"] == "INVALID_TOPIC_EXCEPTION"


def create_topics_errors(bs: str, topic: str) -> dict[str, Any]:
    def create(n: str, partitions: int, rf: int = 1, validate: bool = False, **configs: str):
        r = wire.call(
            bs, 19, 7,
            topics=[{"name": n, "num_partitions": partitions, "replication_factor": rf,
                     "assignments": [], "configs": [{"name": k, "value": v}
                                                    for k, v in configs.items()]}],
            timeout=10000, validate_only=validate,
        )["topics"][0]  # fmt: skip
        return (err(r["error_code"]), r["num_partitions"], r["replication_factor"])

    out: dict[str, Any] = {}
    out["new"] = create(topic, 2)
    wire.wait_for_topic(bs, topic, 2)
    out["existing"] = create(topic, 2)
    out["existing-other-count"] = create(topic, 5)
    out["zero-partitions"] = create(f"{topic}-zero", 0)
    out["minus-two-partitions"] = create(f"{topic}-neg", -2)
    out["default-partitions"] = create(f"{topic}-default", -1, -1)
    out["replication-3"] = create(f"{topic}-rf3", 1, 3)
    out["replication-0"] = create(f"{topic}-rf0", 1, 0)
    out["validate-only"] = create(f"{topic}-validate", 3, validate=True)
    out["bad-config-value"] = create(f"{topic}-badval", 1, **{"retention.ms": "soon"})
    out["unknown-config"] = create(f"{topic}-unknown", 1, **{"no.such.config": "1"})
    out["bad-choice"] = create(f"{topic}-choice", 1, **{"message.timestamp.type": "Sometime"})
    dup = wire.call(
        bs, 19, 7,
        topics=[{"name": f"{topic}-dup", "num_partitions": 1, "replication_factor": 1,
                 "assignments": [], "configs": []}] * 2,
        timeout=10000, validate_only=False,
    )  # fmt: skip
    out["duplicate-in-request"] = sorted(err(t["error_code"]) for t in dup["topics"])
    time.sleep(0.3)  # let Kafka's metadata catch up before looking for what must not exist
    md = wire.metadata(bs, f"{topic}-validate", f"{topic}-zero", f"{topic}-dup")
    out["afterwards"] = sorted((t["name"], err(t["error_code"])) for t in md["topics"])
    return out


def test_create_topics_errors(pair, name):
    strat, kafka = both(pair, create_topics_errors, name)
    check(strat, kafka)
    assert kafka["existing"][0] == "TOPIC_ALREADY_EXISTS"
    assert kafka["zero-partitions"][0] == "INVALID_PARTITIONS"


def delete_topics_errors(bs: str, topic: str) -> dict[str, Any]:
    def delete(*entries: tuple[str | None, uuid.UUID]) -> list[Any]:
        r = wire.call(
            bs, 20, 6, topics=[{"name": n, "topic_id": t} for n, t in entries], timeout=10000
        )
        return [(err(x["error_code"]), x["name"]) for x in r["responses"]]

    out: dict[str, Any] = {}
    out["missing"] = delete((f"{topic}-missing", ZERO_UUID))
    out["unknown-id"] = delete((None, uuid.UUID(int=99)))
    assert wire.create_topic(bs, topic, 1) == 0
    out["by-id"] = delete((None, wire.topic_id(bs, topic)))
    out["again"] = delete((topic, ZERO_UUID))
    v1 = wire.call(bs, 20, 1, topic_names=[f"{topic}-missing"], timeout=10000)
    out["v1-missing"] = [err(x["error_code"]) for x in v1["responses"]]
    return out


def test_delete_topics_errors(pair, name):
    strat, kafka = both(pair, delete_topics_errors, name)
    check(strat, kafka)
    assert kafka["missing"] == [("UNKNOWN_TOPIC_OR_PARTITION", f"{name}-missing")]


# -- offsets --------------------------------------------------------------------------------------


def fetch_out_of_range(bs: str, topic: str, ts: int) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1) == 0
    assert wire.produce(bs, topic, 0, _batch(5, ts))["error_code"] == 0
    out: dict[str, Any] = {}
    for offset in (-5, 4, 5, 6, 100):
        p = wire.fetch(bs, topic, 0, offset)
        out[offset] = {
            "error": err(p["error_code"]),
            "high_watermark": p["high_watermark"],
            "log_start_offset": p["log_start_offset"],
            "batches": [(b["base_offset"], b["records"]) for b in wire.parse_batches(p["records"])],
        }
    return out


def test_fetch_out_of_range(pair, name):
    strat, kafka = both(pair, fetch_out_of_range, name, _now_ms() - 10_000)
    check(strat, kafka)
    assert kafka[100]["error"] == "OFFSET_OUT_OF_RANGE" and kafka[5]["error"] == "NONE"


class _LogLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def auto_offset_reset(bs: str, topic: str, ts: int) -> dict[str, Any]:
    """A consumer positioned past the end: earliest re-reads from 0, latest waits for new data."""
    assert wire.create_topic(bs, topic, 1) == 0
    assert wire.produce(bs, topic, 0, _batch(5, ts))["error_code"] == 0
    obs: dict[str, Any] = {}
    for reset in ("earliest", "latest", "error"):
        # One logger per broker: both scenarios run at once with the same topic name.
        log = logging.getLogger(f"rdkafka.{bs}.{topic}.{reset}")
        log.setLevel(logging.DEBUG)
        log.propagate = False
        lines = _LogLines()
        log.addHandler(lines)
        c = Consumer(
            {
                "bootstrap.servers": bs,
                "group.id": f"{topic}-{reset}",
                "auto.offset.reset": reset,
                "enable.auto.commit": False,
                "logger": log,
                "debug": "fetch,topic",
            }
        )
        seen: list[Any] = []
        try:
            c.assign([TopicPartition(topic, 0, 100)])
            # Generous: on a loaded machine the JVM broker can take seconds per round trip.
            deadline = time.monotonic() + 30
            produced = False
            while time.monotonic() < deadline and len(seen) < (5 if reset == "earliest" else 1):
                for m in c.consume(10, 0.1):
                    seen.append(m.error().name() if m.error() else m.offset())
                # Once librdkafka's ListOffsets(latest) for the reset returned, the record
                # produced next is the first one read.
                if (
                    reset == "latest"
                    and not produced
                    and any(
                        ("END request" in line and "returned offset" in line)
                        or ("Fetch topic" in line and "at offset 5 " in line)
                        for line in lines.lines
                    )
                ):
                    assert wire.produce(bs, topic, 0, _batch(1, ts))["error_code"] == 0
                    produced = True
        finally:
            c.close()
            log.removeHandler(lines)
        obs[reset] = seen
    return obs


def test_auto_offset_reset(pair, name):
    strat, kafka = both(pair, auto_offset_reset, name, _now_ms() - 60_000)
    check(strat, kafka)
    assert kafka == {"earliest": [0, 1, 2, 3, 4], "latest": [5], "error": ["_AUTO_OFFSET_RESET"]}


def list_offsets_edges(bs: str, topic: str, ts: int) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 2) == 0
    out: dict[str, Any] = {}
    out["empty"] = {t: wire.list_offset(bs, topic, 1, t) for t in (-2, -1, -3, ts)}
    assert wire.produce(bs, topic, 0, _batch(3, ts))["error_code"] == 0
    queries = {"future": _now_ms() + 3_600_000, "exact-last": ts + 2, "after-last": ts + 3}
    queries |= {"earliest": -2, "latest": -1, "max-timestamp": -3, "before-all": ts - 1000}
    out["data"] = {k: wire.list_offset(bs, topic, 0, t) for k, t in queries.items()}
    out["missing-partition"] = err(wire.list_offset(bs, topic, 9, -1)["error_code"])
    return out


def test_list_offsets_future_timestamp(pair, name):
    strat, kafka = both(pair, list_offsets_edges, name, _now_ms() - 60_000)
    check(strat, kafka)
    assert kafka["data"]["future"] == {
        "error_code": 0, "timestamp": -1, "offset": -1, "leader_epoch": -1,
    }  # fmt: skip


# -- record batches the broker must refuse --------------------------------------------------------

MESSAGE_MAX_BYTES = 1048588  # both brokers' default (message.max.bytes / max.message.bytes)


def _batch_of_size(size: int, ts: int) -> bytes:
    """One uncompressed record whose batch is exactly ``size`` bytes."""
    n = size - 100
    while True:
        b = build_batch([(b"k", b"x" * n, ts)])
        if len(b) == size:
            return b
        n += size - len(b)


def too_large(bs: str, topic: str, ts: int) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1) == 0
    assert wire.create_topic(bs, f"{topic}-small", 1, **{"max.message.bytes": "2000"}) == 0
    out: dict[str, Any] = {}
    for size in (MESSAGE_MAX_BYTES, MESSAGE_MAX_BYTES + 1, 2 * MESSAGE_MAX_BYTES):
        r = wire.produce(bs, topic, 0, _batch_of_size(size, ts))
        out[size] = (err(r["error_code"]), r["base_offset"])
    for size in (2000, 2001):
        r = wire.produce(bs, f"{topic}-small", 0, _batch_of_size(size, ts))
        out[f"small-{size}"] = (err(r["error_code"]), r["base_offset"])
    # librdkafka with a larger client limit: the broker refuses the message
    p = Producer({"bootstrap.servers": bs, "message.max.bytes": 4_000_000, "linger.ms": 0})
    errors: list[Any] = []
    p.produce(topic, b"x" * 1_500_000, on_delivery=lambda e, m: errors.append(e and e.name()))
    p.flush(15)
    out["confluent"] = errors
    out["end"] = wire.list_offset(bs, topic, 0, -1)["offset"]
    return out


def test_record_larger_than_message_max_bytes(pair, name):
    strat, kafka = both(pair, too_large, name, _now_ms() - 10_000)
    check(strat, kafka)
    assert kafka[MESSAGE_MAX_BYTES + 1][0] == "MESSAGE_TOO_LARGE"


def bad_batches(bs: str, topic: str, ts: int) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1) == 0
    good = _batch(2, ts)
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF  # the CRC no longer matches
    wrong_length = good[:8] + (len(good) - 12 + 5).to_bytes(4, "big") + good[12:]
    cases = {
        "crc-mismatch": bytes(corrupt),
        "length-past-end": wrong_length,
        "truncated": good[:-4],
        "future-timestamp": _batch(1, _now_ms() + 2 * 3_600_000),
        "ancient-timestamp": _batch(1, 1000),
        "acks-2": good,
    }
    out: dict[str, Any] = {}
    for case, records in cases.items():
        r = wire.produce(bs, topic, 0, records, acks=2 if case == "acks-2" else -1)
        out[case] = err(r["error_code"]) if "error_code" in r else r
    out["end"] = wire.list_offset(bs, topic, 0, -1)["offset"]
    return out


def test_invalid_batches(pair, name):
    strat, kafka = both(pair, bad_batches, name, _now_ms() - 10_000)
    check(strat, kafka)
    assert kafka["crc-mismatch"] == "CORRUPT_MESSAGE"


# -- idempotent producer: sequence numbers (raw Produce) ------------------------------------------


def idempotent_sequences(bs: str, topic: str, ts: int) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1) == 0
    r = wire.call(bs, 22, 4, transactional_id=None, transaction_timeout=60000,
                  producer_id=-1, producer_epoch=-1)  # fmt: skip
    pid, epoch = r["producer_id"], r["producer_epoch"]

    def send(seq: int, n: int, *, producer: int = pid, ep: int = epoch) -> tuple[str, int]:
        batch = _batch(n, ts + seq, producer_id=producer, producer_epoch=ep, base_sequence=seq)
        r = wire.produce(bs, topic, 0, batch)
        return err(r["error_code"]), r["base_offset"]

    steps = [
        ("first", lambda: send(0, 5)),
        ("duplicate-of-last", lambda: send(0, 5)),
        ("next", lambda: send(5, 5)),
        ("duplicate-of-older", lambda: send(0, 5)),
        ("gap", lambda: send(12, 3)),
        ("overlap", lambda: send(8, 4)),
        ("after-gap-refused", lambda: send(10, 2)),
        ("stale-epoch", lambda: send(12, 1, ep=epoch - 1 if epoch > 0 else 32767)),
        ("bumped-epoch-from-zero", lambda: send(0, 2, ep=epoch + 1)),
        ("old-epoch-after-bump", lambda: send(12, 1)),
        ("unknown-producer-nonzero-seq", lambda: send(7, 1, producer=pid + 1000)),
        ("unknown-producer-zero-seq", lambda: send(0, 1, producer=pid + 1001)),
    ]
    out: dict[str, Any] = {name: step() for name, step in steps}
    out["stored"] = [(b["base_offset"], b["records"], b["base_sequence"])
                     for b in wire.stored_batches(bs, topic, 0)]  # fmt: skip
    return out


def test_idempotent_sequence_gap_and_duplicate(pair, name):
    strat, kafka = both(pair, idempotent_sequences, name, _now_ms() - 10_000)
    check(strat, kafka)
    assert kafka["duplicate-of-last"] == ("NONE", 0)
    assert kafka["gap"][0] == "OUT_OF_ORDER_SEQUENCE_NUMBER"


# -- consumer-group protocol errors (raw requests) ------------------------------------------------

PROTOCOLS = [{"name": "range", "metadata": b"\x00\x01meta"}]


def group_errors(bs: str, group: str, topic: str) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1) == 0
    out: dict[str, Any] = {}

    def join(member: str, *, session: int = 10000, ptype: str = "consumer", g: str = group):
        r = wire.call(
            bs, 11, 9, group_id=g, session_timeout=session, rebalance_timeout=10000,
            member_id=member, group_instance_id=None, protocol_type=ptype, protocols=PROTOCOLS,
            reason=None,
        )  # fmt: skip
        return r

    def brief(r: dict[str, Any]) -> dict[str, Any]:
        keep = ("error_code", "generation_id", "protocol_type", "protocol_name", "members")
        out = {k: r[k] for k in keep if k in r}
        out["error_code"] = err(out["error_code"])
        out["is_leader"] = bool(r.get("leader")) and r.get("leader") == r.get("member_id")
        return wire.normalise(out)

    def heartbeat(member: str, generation: int) -> str:
        r = wire.call(bs, 12, 4, group_id=group, generation_id=generation, member_id=member,
                      group_instance_id=None)  # fmt: skip
        return err(r["error_code"])

    def commit(member: str, generation: int, g: str = group) -> str:
        r = wire.call(
            bs, 8, 9, group_id=g, generation_id_or_member_epoch=generation, member_id=member,
            group_instance_id=None,
            topics=[{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 7,
                     "committed_leader_epoch": -1, "committed_metadata": ""}]}],
        )  # fmt: skip
        return err(r["topics"][0]["partitions"][0]["error_code"])

    def sync(member: str, generation: int, assignments: list) -> dict[str, Any]:
        r = wire.call(
            bs, 14, 5, group_id=group, generation_id=generation, member_id=member,
            group_instance_id=None, protocol_type="consumer", protocol_name="range",
            assignments=assignments,
        )  # fmt: skip
        return {"error": err(r["error_code"]), "assignment": r["assignment"],
                "protocol": (r["protocol_type"], r["protocol_name"])}  # fmt: skip

    out["join-unknown-member-new-group"] = brief(join("nobody"))
    out["join-bad-session-timeout"] = brief(join("", session=1000))
    first = join("")
    out["join-without-member-id"] = brief(first)
    member = first["member_id"]
    joined = join(member)
    out["join-with-member-id"] = brief(joined)
    gen = joined["generation_id"]
    out["join-other-protocol-type"] = brief(join("", ptype="connect"))
    out["sync-stale-generation"] = sync(member, gen - 1, [])
    out["sync-unknown-member"] = sync("nobody", gen, [])
    out["sync-leader"] = sync(member, gen, [{"member_id": member, "assignment": b"\x00\x07plan"}])
    out["heartbeat"] = heartbeat(member, gen)
    out["heartbeat-stale-generation"] = heartbeat(member, gen - 1)
    out["heartbeat-future-generation"] = heartbeat(member, gen + 1)
    out["heartbeat-unknown-member"] = heartbeat("nobody", gen)
    out["commit"] = commit(member, gen)
    out["commit-stale-generation"] = commit(member, gen - 1)
    out["commit-unknown-member"] = commit("nobody", gen)
    out["commit-simple-on-active-group"] = commit("", -1)
    out["join-unknown-member-active-group"] = brief(join("nobody"))
    left = wire.call(
        bs,
        13,
        5,
        group_id=group,
        members=[{"member_id": member, "group_instance_id": None, "reason": None}],
    )
    out["leave"] = (err(left["error_code"]), [err(m["error_code"]) for m in left["members"]])
    out["heartbeat-after-leave"] = heartbeat(member, gen)
    out["commit-after-leave"] = commit(member, gen)
    out["commit-simple-after-leave"] = commit("", -1)
    out["commit-unknown-group-with-member"] = commit("nobody", 3, g=f"{group}-none")
    fetched = wire.call(bs, 9, 9, require_stable=False, groups=[
        {"group_id": group, "member_id": None, "member_epoch": -1,
         "topics": [{"name": topic, "partition_indexes": [0]}]}])  # fmt: skip
    out["committed"] = fetched["groups"][0]["topics"][0]["partitions"][0]["committed_offset"]
    return out


def test_group_protocol_errors(pair, name):
    strat, kafka = both(pair, group_errors, f"{name}-group", name)
    check(strat, kafka)
    assert kafka["join-without-member-id"]["error_code"] == "MEMBER_ID_REQUIRED"
    assert kafka["commit-stale-generation"] == "ILLEGAL_GENERATION"
    assert kafka["commit-unknown-member"] == "UNKNOWN_MEMBER_ID"
