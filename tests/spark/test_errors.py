"""Bad options fail with a message that names the problem (through Spark's error wrapping)."""

from __future__ import annotations

import json

import pytest

from ..conftest import create_topic
from .conftest import Rec, produce, topic_name

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def topic(spark_broker):
    name = topic_name("errors")
    create_topic(spark_broker.bootstrap, name, 2)
    produce(spark_broker.bootstrap, name, [Rec(b"v", partition=p) for p in (0, 1)])
    return name


def _batch_error(spark, bootstrap, **options) -> str:
    r = spark.read.format("stratalog-python").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    with pytest.raises(Exception) as info:
        r.load().collect()
    return str(info.value)


def _stream_error(spark, bootstrap, tmp_path, **options) -> str:
    r = spark.readStream.format("stratalog-python").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    query = None
    with pytest.raises(Exception) as info:
        query = (
            r.load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        finished = query.awaitTermination(60)
        query.stop()
        pytest.fail(f"the query did not fail (finished: {finished})")
    if query is not None and query.isActive:
        query.stop()
    return str(info.value)


def test_both_subscribe_and_assign(spark, bootstrap, topic):
    msg = _batch_error(spark, bootstrap, subscribe=topic, assign=json.dumps({topic: [0]}))
    assert "exactly one of 'subscribe', 'subscribePattern' or 'assign'" in msg
    assert "'subscribe' and 'assign'" in msg


def test_none_of_subscribe_pattern_assign(spark, bootstrap):
    msg = _batch_error(spark, bootstrap)
    assert "exactly one of 'subscribe', 'subscribePattern' or 'assign' must be given" in msg


def test_unknown_topic(spark, bootstrap):
    missing = topic_name("no-such-topic")
    msg = _batch_error(spark, bootstrap, subscribe=missing)
    assert f"topic '{missing}' does not exist" in msg


def test_unknown_topic_streaming(spark, bootstrap, tmp_path):
    missing = topic_name("no-such-topic")
    msg = _stream_error(spark, bootstrap, tmp_path, subscribe=missing)
    assert f"topic '{missing}' does not exist" in msg


def test_malformed_offsets_json(spark, bootstrap, topic):
    msg = _batch_error(spark, bootstrap, subscribe=topic, startingOffsets='{"t": {0: 1}')
    assert "option 'startingOffsets' is not valid JSON" in msg


def test_negative_max_offsets_per_trigger(spark, bootstrap, topic, tmp_path):
    msg = _stream_error(spark, bootstrap, tmp_path, subscribe=topic, maxOffsetsPerTrigger="-5")
    assert "option 'maxOffsetsPerTrigger' must be a positive integer" in msg
    assert "'-5'" in msg


def test_options_not_implemented_are_refused(spark, bootstrap, topic, tmp_path):
    msg = _stream_error(spark, bootstrap, tmp_path, subscribe=topic, minOffsetsPerTrigger="10")
    assert "option 'minOffsetsPerTrigger' is not supported" in msg


def test_starting_offsets_latest_in_batch(spark, bootstrap, topic):
    msg = _batch_error(spark, bootstrap, subscribe=topic, startingOffsets="latest")
    assert "option 'startingOffsets' can't be 'latest' for batch queries" in msg


def test_ending_offsets_in_streaming(spark, bootstrap, topic, tmp_path):
    msg = _stream_error(spark, bootstrap, tmp_path, subscribe=topic, endingOffsets="latest")
    assert "option 'endingOffsets' is for batch queries only" in msg


def test_write_without_value_column(spark, bootstrap, topic):
    df = spark.createDataFrame([("k1", "not-a-value")], "key string, payload string")
    with pytest.raises(Exception) as info:
        df.write.format("stratalog-python").mode("append").option(
            "kafka.bootstrap.servers", bootstrap
        ).option("topic", topic).save()
    assert "required attribute 'value' not found" in str(info.value)


def test_write_without_topic(spark, bootstrap):
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception) as info:
        df.write.format("stratalog-python").mode("append").option(
            "kafka.bootstrap.servers", bootstrap
        ).save()
    assert "topic option required" in str(info.value)
