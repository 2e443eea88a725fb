"""format("stratalog") on a record batch that was corrupted on disk after it was stored.

The broker checks CRCs when it takes a batch and then serves the stored bytes as they are, so
a batch damaged later (a bad disk, a stray write) reaches the reader. The reader checks each
batch's CRC-32C, as Kafka's consumer does, and fails the query naming the batch, instead of
handing Spark wrong values. Spark's own Kafka source fails the same read too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stratalog import Broker

from ..conftest import create_topic
from .conftest import Rec, produce, topic_name

MARK = b"corrupt-me-"


def _read(spark, fmt: str, bootstrap: str, topic: str):
    return (
        spark.read.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
        .selectExpr("offset", "value")
        .collect()
    )


def _flip_a_marked_byte(data_dir: Path) -> Path:
    for f in sorted(data_dir.rglob("*.log")):
        data = bytearray(f.read_bytes())
        at = data.find(MARK)
        if at >= 0:
            with f.open("r+b") as out:
                out.seek(at + 3)
                out.write(bytes([data[at + 3] ^ 0xFF]))
            return f
    raise AssertionError(f"no segment under {data_dir} holds the marked records")


def test_a_batch_corrupted_on_disk_fails_the_read_and_names_it(spark, tmp_path):
    topic = topic_name("corrupt")
    with Broker(tmp_path / "broker") as b:
        create_topic(b.bootstrap, topic, 1)
        produce(b.bootstrap, topic, [Rec(MARK + b"%03d" % i) for i in range(20)])
        # Enough after them that the marked batch is served from the segment file, not from
        # the partition's in-memory tail cache (4 MiB).
        produce(b.bootstrap, topic, [Rec(b"f" * 1024) for _ in range(6000)])
        assert len(_read(spark, "stratalog", b.bootstrap, topic)) == 6020  # intact first

        _flip_a_marked_byte(tmp_path / "broker")

        named = r"record batch at offset 0 of corrupt-\w+-0 is corrupt"
        with pytest.raises(Exception, match=named):
            _read(spark, "stratalog", b.bootstrap, topic)
        with pytest.raises(Exception, match=r"(?i)corrupt"):
            _read(spark, "kafka", b.bootstrap, topic)
