"""format("stratalog") resolves without register() (Spark's discovery of pyspark_* modules), and
``stratalog.spark.register(spark)`` works as well."""

from __future__ import annotations

import pytest

import stratalog.spark
from stratalog.spark.source import StratalogDataSource

from ..conftest import create_topic
from .conftest import Rec, collect_records, produce, sent_tuple, topic_name

pytestmark = pytest.mark.spark


def _static_sources(spark) -> dict:
    """The Python data sources Spark found by importing pyspark_* modules (SPARK-45917), as
    opposed to ones registered at runtime through spark.dataSource.register()."""
    jvm = spark.sparkContext._jvm
    manager = getattr(jvm.org.apache.spark.sql.execution.datasources, "DataSourceManager$")
    found = getattr(manager, "MODULE$").dataSourceBuilders()
    if found.isEmpty():
        return {}
    keys = found.get().keys().iterator()
    out = {}
    while keys.hasNext():
        k = keys.next()
        out[k] = found.get().apply(k)
    return out


def test_format_resolves_without_register_then_with_register(spark, bootstrap):
    topic = topic_name("reg")
    create_topic(bootstrap, topic, 1)
    sent = produce(
        bootstrap, topic, [Rec(f"v{i}".encode(), key=f"k{i}".encode()) for i in range(5)]
    )

    def read():
        return (
            spark.read.format("stratalog")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("includeHeaders", "true")
            .load()
        )

    # No test and no fixture calls register(); the name comes from pyspark_stratalog.
    assert sorted(collect_records(read())) == sorted(sent_tuple(s) for s in sent)
    static = _static_sources(spark)
    assert "stratalog" in static, f"pyspark_stratalog was not discovered: {sorted(static)}"

    stratalog.spark.register(spark)
    assert StratalogDataSource.name() == "stratalog"
    assert sorted(collect_records(read())) == sorted(sent_tuple(s) for s in sent)
    # Streaming resolves the same name.
    assert read().isStreaming is False
    assert (
        spark.readStream.format("stratalog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
        .isStreaming
    )
