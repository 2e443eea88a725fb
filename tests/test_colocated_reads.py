"""Co-located reads (issue 32 item 2): a reader on the broker's host reads the partition's
segment files itself, guided by the broker's read slots, and falls back to Fetch for the rest.

The oracle is always the broker's wire answers (Fetch, ListOffsets), never the slot: the same
records as Fetch returns, nothing past what ListOffsets says is committed, and a reader that is
refused (file modes, another broker's files) reads the same records through Fetch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from stratalog import Broker
from stratalog.client.arrow_reader import read_partition
from stratalog.client.colocated import ColocatedPartition, find
from stratalog.client.wire import EARLIEST, LATEST, WireClient
from stratalog.colocated_format import IDENTITY_FILE, SLOT_SIZE, SLOTS_DIR
from stratalog.config import ConfigError
from stratalog.storage import reaper

from .conftest import create_topic, fetch_requests, produce_keyed


def _table(batches: list[pa.RecordBatch]) -> pa.Table:
    return pa.Table.from_batches(batches) if batches else pa.table({})


def _end(client: WireClient, topic: str, partition: int) -> int:
    return client.list_offsets(topic, [partition], LATEST)[partition][0]


def _fetches(b: Broker) -> float:
    return fetch_requests(b.service.core.admin_address)


def _open_files() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass  # (the listing's own descriptor, closed since)
    return out


def _local_reads(local: ColocatedPartition, start: int, end: int) -> tuple[int, int]:
    """(records' bytes read from the files, offset reached) reading [start, end) directly."""
    offset, total = start, 0
    while offset < end:
        got = local.read(offset, 1 << 20)
        if got is None or not got.records:
            break
        total += len(got.records)
        offset = got.next_offset
    return total, offset


def test_colocated_reads_equal_fetch_over_shared_logs_segments_and_codecs(tmp_path: Path) -> None:
    """Two topics interleaved in one virtual log, over many segments (small segment.bytes),
    plain and compressed batches, and a transaction's marker: every partition read directly
    is the same table as through Fetch, and the direct reader read all of it."""
    config = {"storage.virtual_logs": 1, "segment.bytes": 64 * 1024}
    with Broker(tmp_path / "d", config=config) as b:
        create_topic(b.bootstrap, "a", 3)
        create_topic(b.bootstrap, "b", 1)
        produce_keyed(b.bootstrap, "a", 3, 3000)
        produce_keyed(b.bootstrap, "b", 1, 1000, **{"compression.type": "lz4"})
        produce_keyed(b.bootstrap, "a", 3, 600, **{"compression.type": "zstd"})
        tx = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "t1"})
        tx.init_transactions(30)
        tx.begin_transaction()
        tx.produce("a", key=b"tx", value=b"in a transaction", partition=0)
        tx.commit_transaction(30)
        segments = list((b.core.store.root / "v0").glob("*.log"))
        assert len(segments) > 2, segments
        with WireClient(b.bootstrap) as c:
            # The commit's marker is written after EndTxn answers: wait for it (a stable end).
            deadline = time.monotonic() + 10
            while _end(c, "a", 0) < 1202:
                assert time.monotonic() < deadline, "no commit marker"
                time.sleep(0.05)
            for topic, part in [("a", 0), ("a", 1), ("a", 2), ("b", 0)]:
                end = _end(c, topic, part)
                local = find(c, topic, part)
                assert local is not None, (topic, part)
                with local:
                    read, reached = _local_reads(local, 0, end)
                    assert reached == end and read > 0
                    direct = list(read_partition(c, topic, part, 0, end, colocated=local))
                fetches = _fetches(b)
                ahead = list(read_partition(c, topic, part, 0, end, colocated=True))
                assert _fetches(b) == fetches  # the broker served none of it
                fetched = list(read_partition(c, topic, part, 0, end))
                assert _fetches(b) > fetches
                assert _table(direct).equals(_table(fetched)), (topic, part)
                assert _table(ahead).equals(_table(fetched)), (topic, part)
                assert sum(r.num_rows for r in fetched) > 0


def test_a_colocated_reader_sees_what_fetch_sees_and_nothing_more(tmp_path: Path) -> None:
    """While a producer writes (acks=all): whatever a direct read returns is below the end
    ListOffsets gives right after it (never an uncommitted record), and once ListOffsets has
    shown an end, direct reads reach it without Fetch (never later than a fetching reader)."""
    with Broker(tmp_path / "d") as b:
        create_topic(b.bootstrap, "live", 1)
        stop = threading.Event()

        def produce() -> None:
            p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 1, "acks": "all"})
            i = 0
            while not stop.is_set():
                p.produce("live", value=b"x" * 200 + str(i).encode())
                i += 1
                if i % 50 == 0:
                    p.poll(0.002)
            p.flush(30)

        writer = threading.Thread(target=produce)
        writer.start()
        try:
            with WireClient(b.bootstrap) as c:
                deadline = time.monotonic() + 4
                local = find(c, "live", 0)
                assert local is not None
                offset, checks, caught_up = 0, 0, 0
                with local:
                    while time.monotonic() < deadline:
                        got = local.read(offset, 256 * 1024)
                        assert got is not None
                        if got.records:
                            offset = got.next_offset
                            assert _end(c, "live", 0) >= offset  # committed before it was read
                            checks += 1
                        target = _end(c, "live", 0)
                        reached = _local_reads(local, offset, target)[1]
                        assert reached >= target  # what Fetch could return, read directly
                        offset = reached
                        caught_up += 1
                assert checks > 5 and caught_up > 5
        finally:
            stop.set()
            writer.join(30)


def test_the_cold_tier_is_read_through_fetch(tmp_path: Path) -> None:
    """Offsets migrated to the cold tier are not in the hot tier's files: the direct reader
    answers None for them, and read_partition's result is the same as Fetch's."""
    config = {
        "segment.bytes": 32 * 1024,
        "tiers.cold.path": str(tmp_path / "cold"),
        "tiers.hot.capacity": 100_000,
        "tiers.migrate.threshold": 0.5,
        "tiers.migrate.interval.ms": 100,
    }
    with Broker(tmp_path / "d", config=config) as b:
        create_topic(b.bootstrap, "tiered", 1)
        produce_keyed(b.bootstrap, "tiered", 1, 3000)
        with WireClient(b.bootstrap) as c:
            local = find(c, "tiered", 0)
            assert local is not None
            with local:
                deadline = time.monotonic() + 30
                while b.call(lambda: b.core.store.partitions[1].cold_bytes) == 0:
                    assert time.monotonic() < deadline, "nothing migrated"
                    time.sleep(0.1)
                assert local.read(0, 1 << 20) is None
                end = _end(c, "tiered", 0)
                direct = list(read_partition(c, "tiered", 0, 0, end, colocated=local))
            fetched = list(read_partition(c, "tiered", 0, 0, end))
            assert _table(direct).equals(_table(fetched))
            assert sum(r.num_rows for r in fetched) == 3000


def test_segments_deleted_under_a_reader_fall_back(tmp_path: Path) -> None:
    """Retention deletes segments the reader had open: offsets before the new log start are
    not read directly, and what is left reads the same as through Fetch."""
    config = {"segment.bytes": 32 * 1024, "retention.check.interval.ms": 3_600_000}
    with Broker(tmp_path / "d", config=config) as b:
        create_topic(b.bootstrap, "r", 1, **{"retention.bytes": "60000"})
        produce_keyed(b.bootstrap, "r", 1, 1500)
        with WireClient(b.bootstrap) as c:
            local = find(c, "r", 0)
            assert local is not None
            with local:
                end = _end(c, "r", 0)
                assert _local_reads(local, 0, end)[1] == end  # every segment opened
                b.call(b.core.run_retention)
                start = c.list_offsets("r", [0], EARLIEST)[0][0]
                assert start > 0
                assert local.read(0, 1 << 20) is None
                direct = list(read_partition(c, "r", 0, start, end, colocated=local))
                # No descriptor of a deleted segment is kept (it would keep the file's space),
                # once the broker's reaper (in this process) has finished deleting them.
                reaper.drain()
                log_dir = str(b.core.store.root)
                gone = [h for h in _open_files() if h.startswith(log_dir) and not os.path.exists(h)]
                assert gone == []
            fetched = list(read_partition(c, "r", 0, start, end))
            assert _table(direct).equals(_table(fetched)) and len(fetched) > 0


_AS_NOBODY = """
import ctypes, json, sys
from stratalog.client.colocated import find
from stratalog.client.arrow_reader import read_partition
from stratalog.client.wire import WireClient
with WireClient(sys.argv[1]) as c:
    end = c.list_offsets("p", [0], -1)[0][0]
    # Everything this process imports lazily, imported now (its code may lie in a directory
    # only root may read, such as a fresh clone's temporary one).
    c.leader_log_dir("p", 0)
    sum(r.num_rows for r in read_partition(c, "p", 0, 0, end))
    # From here on files are opened as nobody (setfsuid drops root's file capabilities too).
    ctypes.CDLL(None).setfsuid(65534)
    local = find(c, "p", 0)
    rows = sum(r.num_rows for r in read_partition(c, "p", 0, 0, end, colocated=True))
    print(json.dumps({"direct": local is not None, "rows": rows}))
"""


@pytest.mark.parametrize(("mode", "direct"), [("600", False), ("644", True)])
def test_slot_file_modes_decide_who_reads_directly(mode: str, direct: bool) -> None:
    """Another user is refused the slot files of mode 600 (and reads through Fetch, the same
    rows), and given those of mode 644."""
    top = Path(tempfile.mkdtemp(prefix="stratalog-colocated-"))
    os.chmod(top, 0o755)  # so that only the slot files' own modes decide
    try:
        with Broker(top / "d", config={"storage.read_slots.mode": mode}) as b:
            create_topic(b.bootstrap, "p", 1)
            produce_keyed(b.bootstrap, "p", 1, 500)
            out = subprocess.run(
                [sys.executable, "-c", _AS_NOBODY, b.bootstrap],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert out.returncode == 0, out.stderr[-2000:]
            answer = json.loads(out.stdout.strip().splitlines()[-1])
            assert answer == {"direct": direct, "rows": 500}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_another_brokers_files_or_a_damaged_slot_are_not_read(tmp_path: Path) -> None:
    """A log directory whose identity names another node is not used, and a slot whose bytes
    are not a slot reads as None (the caller fetches)."""
    with Broker(tmp_path / "d") as b:
        create_topic(b.bootstrap, "x", 1)
        produce_keyed(b.bootstrap, "x", 1, 100)
        root = b.core.store.root
        identity = root / SLOTS_DIR / IDENTITY_FILE
        saved = identity.read_bytes()
        with WireClient(b.bootstrap) as c:
            identity.write_text(json.dumps({**json.loads(saved), "node_id": 7}))
            assert find(c, "x", 0) is None
            identity.write_bytes(saved)
            assert find(c, "x", 0) is not None
    fake = tmp_path / "fake"
    (fake / SLOTS_DIR / "x").mkdir(parents=True)
    (fake / SLOTS_DIR / "x" / "0.slot").write_bytes(b"\xff" * SLOT_SIZE)
    with ColocatedPartition(fake, "x", 0) as bad:
        assert bad.state() is None
        assert bad.read(0, 1024) is None


def test_a_bad_slot_mode_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"storage\.read_slots\.mode"):
        Broker(tmp_path / "d", config={"storage.read_slots.mode": "rw-r--r--"}).start()


def test_a_reader_follows_a_restarted_broker(tmp_path: Path) -> None:
    """After the broker restarts (a new slot file, positions learned again), the same reader
    object reads the records written since, directly."""
    restartable = tmp_path / "d"
    b = Broker(restartable).start()
    try:
        create_topic(b.bootstrap, "re", 1)
        produce_keyed(b.bootstrap, "re", 1, 300)
        port = int(b.bootstrap.rsplit(":", 1)[1])
        with WireClient(b.bootstrap) as c:
            local = find(c, "re", 0)
            assert local is not None
        b.stop()
        b = Broker(restartable, port=port).start()
        produce_keyed(b.bootstrap, "re", 1, 300)
        with WireClient(b.bootstrap) as c, local:
            end = _end(c, "re", 0)
            assert end == 600
            assert _local_reads(local, 0, end)[1] == end
            direct = list(read_partition(c, "re", 0, 0, end, colocated=local))
            assert _table(direct).equals(_table(list(read_partition(c, "re", 0, 0, end))))
    finally:
        b.stop()
