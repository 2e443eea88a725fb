"""A deterministic producer (a Spark write task's id) that repeats sequences must repeat the same
records. The broker compares a repeat with what that producer wrote under those sequences: the
same rows (key, value, headers; a sink stamps rows without an event time when it sends them) are
a duplicate, answered without appending; other rows (a re-run that saw its rows in another order
after a shuffle) are refused with INVALID_RECORD, so the sink can go on at least once instead of
silently dropping rows that were never written. The history survives a broker restart."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, TopicPartition

from stratalog import Broker
from stratalog.client.wire import LATEST, WireClient
from stratalog.protocol.errors import code
from stratalog.records import build_batch
from stratalog.spark.writer import derived_producer_id

from .conftest import create_topic

TOPIC = "reruns"
INVALID_RECORD = int(code("INVALID_RECORD"))


def _batch(pid: int, seq: int, values: list[bytes], headers=None) -> bytes:
    now = int(time.time() * 1000)
    return build_batch(
        [(b"k" + v, v, now) for v in values],
        headers=headers,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
    )


def _send(c: WireClient, raw: bytes) -> tuple[int, int]:
    return c.produce(TOPIC, {0: raw})[0]


def _end(c: WireClient) -> int:
    return c.list_offsets(TOPIC, [0], LATEST)[0][0]


def _values(bootstrap: str, n: int) -> list[bytes]:
    """The topic's values, read back with confluent-kafka."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "rerun-check"})
    try:
        c.assign([TopicPartition(TOPIC, 0, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append(m.value())
        return out
    finally:
        c.close()


def _vals(lo: int, hi: int) -> list[bytes]:
    return [b"v%d" % i for i in range(lo, hi)]


def test_a_repeat_with_other_rows_is_refused_and_the_same_rows_are_a_duplicate(tmp_path):
    pid = derived_producer_id("test", "rerun")
    with Broker(tmp_path / "d") as b:
        create_topic(b.bootstrap, TOPIC)
        with WireClient(b.bootstrap) as c:
            assert _send(c, _batch(pid, 0, _vals(0, 5))) == (0, 0)
            assert _send(c, _batch(pid, 5, _vals(5, 10))) == (0, 5)
            time.sleep(0.01)  # the repeats carry other timestamps: not part of a row's identity
            # The same batch again (one of the last five): its original offsets.
            assert _send(c, _batch(pid, 0, _vals(0, 5))) == (0, 0)
            # A repeat across both batches' boundary, same rows: a duplicate.
            err, _ = _send(c, _batch(pid, 2, _vals(2, 8)))
            assert err == 0
            # The same rows in another order under the same sequences: still each row once.
            assert _send(c, _batch(pid, 0, _vals(0, 5)[::-1]))[0] == 0
            assert _send(c, _batch(pid, 2, _vals(2, 8)[::-1]))[0] == 0
            # Other rows under those sequences (a re-run whose rows went to other partitions
            # or other batches): refused.
            assert _send(c, _batch(pid, 0, _vals(1, 6)))[0] == INVALID_RECORD
            # One row swapped for a row of the other batch, across the boundary: refused.
            other = _vals(3, 7)
            other[1] = b"v9"
            assert _send(c, _batch(pid, 3, other))[0] == INVALID_RECORD
            # Same key and value, other headers: another row.
            hdrs = [[("h", b"x")]] + [[]] * 4
            assert _send(c, _batch(pid, 5, _vals(5, 10), hdrs))[0] == INVALID_RECORD
            assert _end(c) == 10  # nothing appended by any repeat
            # The producer goes on where it was.
            assert _send(c, _batch(pid, 10, _vals(10, 12))) == (0, 10)

    # After a restart the producer's batches are rebuilt from the chunk index.
    with Broker(tmp_path / "d") as b, WireClient(b.bootstrap) as c:
        assert _send(c, _batch(pid, 4, _vals(4, 12)))[0] == 0
        assert _send(c, _batch(pid, 4, _vals(4, 12)[::-1]))[0] == 0
        assert _send(c, _batch(pid, 4, _vals(3, 11)))[0] == INVALID_RECORD
        assert _end(c) == 12
        assert _values(b.bootstrap, 12) == _vals(0, 12)


def test_an_ordinary_idempotent_producer_is_not_compared(tmp_path):
    """Kafka's rule for producer ids the broker handed out: a retry of one of the last five
    batches is answered by its sequences alone (a client's retry sends the same bytes)."""
    with Broker(tmp_path / "d") as b:
        create_topic(b.bootstrap, TOPIC)
        with WireClient(b.bootstrap) as c:
            assert _send(c, _batch(7, 0, _vals(0, 3))) == (0, 0)
            assert _send(c, _batch(7, 0, _vals(3, 6))) == (0, 0)
            assert _end(c) == 3
