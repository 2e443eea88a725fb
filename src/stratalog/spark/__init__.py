"""Stratalog for PySpark: ``format("stratalog")`` for reads and writes, batch and streaming.

``format("stratalog")`` is the JVM connector (its jar comes from ``stratalog.spark.jvm``;
``local_session`` adds it); ``format("stratalog-python")`` is the Python data source, which
needs no jar and which Spark finds by itself once this package is installed.
"""

from __future__ import annotations


def register(spark) -> None:
    """Register the Python data source with a SparkSession explicitly, as "stratalog-python"
    and, when the session cannot load the JVM connector, as "stratalog" too, so that a session
    without the jar still reads and writes ``format("stratalog")``."""
    from stratalog.spark.jvm import on_classpath
    from stratalog.spark.source import StratalogDataSource

    spark.dataSource.register(StratalogDataSource)
    if not on_classpath(spark):

        class StratalogFallback(StratalogDataSource):
            @classmethod
            def name(cls) -> str:
                return "stratalog"

        spark.dataSource.register(StratalogFallback)


def kafka_connector_package() -> str:
    """Spark's own Kafka connector at the installed PySpark version (for spark.jars.packages)."""
    import pyspark

    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def local_session(
    app: str = "stratalog",
    cores: int | str = 2,
    kafka_connector: bool = False,
    jvm_connector: bool = True,
    **conf: str,
):
    """A local SparkSession on loopback with the settings that suit this project's machines.

    ``kafka_connector=True`` adds Spark's own Kafka connector (resolved from Maven Central by
    Spark on first use, then cached in ~/.ivy2), so ``format("kafka")`` works too.
    ``jvm_connector`` (on by default) puts Stratalog's JVM connector, ``format("stratalog")``,
    on the classpath (compiled on first use, see ``stratalog.spark.jvm``).
    """
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if kafka_connector:
        builder = builder.config("spark.jars.packages", kafka_connector_package())
    if jvm_connector:
        from stratalog.spark.jvm import jar_path

        builder = builder.config("spark.jars", str(jar_path()))
    for k, v in conf.items():
        builder = builder.config(k, v)
    if not kafka_connector:
        session = builder.getOrCreate()
    else:
        # Ivy's cache takes no concurrent resolutions: sessions started at once on a machine
        # whose cache is cold (a fresh CI machine, parallel test workers) broke each other's
        # downloads ("unresolved dependency ... download failed"). One resolves at a time.
        import fcntl
        from pathlib import Path

        lock_path = Path.home() / ".cache" / "stratalog" / "spark-packages.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
