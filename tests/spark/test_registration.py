"""format("stratalog-python") resolves without register() (Spark's discovery of pyspark_*
modules), and ``stratalog.spark.register(spark)`` works as well."""

from __future__ import annotations

import pytest

import stratalog.spark
import stratalog.spark.jvm
from stratalog.spark.source import StratalogDataSource

from ..conftest import SPARK_TEST_CONF, create_topic
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
            spark.read.format("stratalog-python")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("includeHeaders", "true")
            .load()
        )

    # No test and no fixture calls register(); the name comes from pyspark_stratalog.
    assert sorted(collect_records(read())) == sorted(sent_tuple(s) for s in sent)
    static = _static_sources(spark)
    assert "stratalog-python" in static, f"pyspark_stratalog was not discovered: {sorted(static)}"

    stratalog.spark.register(spark)
    assert StratalogDataSource.name() == "stratalog-python"
    assert sorted(collect_records(read())) == sorted(sent_tuple(s) for s in sent)
    # Streaming resolves the same name.
    assert read().isStreaming is False
    assert (
        spark.readStream.format("stratalog-python")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
        .isStreaming
    )


# A session of its own, in its own process (one SparkContext per process), without the jar.
_WITHOUT_JAR = """
import json, sys
from stratalog.spark import local_session, register
from stratalog.spark.jvm import on_classpath

spark = local_session("no-jar", cores=1, jvm_connector=False, **json.loads(sys.argv[3]))
try:
    before = on_classpath(spark)
    register(spark)
    rows = (
        spark.read.format("stratalog")
        .option("kafka.bootstrap.servers", sys.argv[1])
        .option("subscribe", sys.argv[2])
        .load()
        .selectExpr("CAST(value AS STRING) AS v")
        .collect()
    )
    print(json.dumps({"on_classpath": before, "values": sorted(r.v for r in rows)}))
finally:
    spark.stop()
"""


def test_without_the_jar_register_makes_format_stratalog_the_python_source(spark, bootstrap):
    import json
    import subprocess
    import sys

    topic = topic_name("nojar")
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, [Rec(f"v{i}".encode()) for i in range(3)])
    assert stratalog.spark.jvm.on_classpath(spark)  # this session has the jar
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_JAR, bootstrap, topic, json.dumps(SPARK_TEST_CONF)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"on_classpath": False, "values": ["v0", "v1", "v2"]}
