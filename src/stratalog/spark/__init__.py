"""Stratalog for PySpark: ``format("stratalog")`` for reads and writes, batch and streaming."""

from __future__ import annotations


def register(spark) -> None:
    """Register the "stratalog" data source with a SparkSession explicitly."""
    from stratalog.spark.source import StratalogDataSource

    spark.dataSource.register(StratalogDataSource)


def local_session(app: str = "stratalog", cores: int = 2, **conf: str):
    """A local SparkSession on loopback with the settings that suit this project's machines."""
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
    for k, v in conf.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
