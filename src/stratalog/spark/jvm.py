"""``format("stratalog")``: the connector that runs inside Spark's JVM.

A Python data source hands every row through a Python worker and Arrow IPC to the JVM; this
reader fetches raw record batches and decodes them on the JVM straight into Spark's column
vectors (``jvm/io/stratalog/spark``). Its Java sources are compiled on first use against the
installed PySpark's own jars, into ``~/.cache/stratalog/spark-jvm``, so the jar always matches
the Spark it runs in. Batch and streaming reads and writes, as the Python data source
``format("stratalog-python")``, which needs no jar.
"""

from __future__ import annotations

import os
from pathlib import Path

SOURCES = Path(__file__).parent / "jvm"
FORMAT = "stratalog"
JVM_CLASS = "io.stratalog.spark.StratalogJvmSource"


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "stratalog" / "spark-jvm"


def jar_path() -> Path:
    """The reader's jar for the installed PySpark, compiled on first use."""
    import pyspark

    from stratalog.javac import compile_java, jar_of

    jars = Path(pyspark.__path__[0]) / "jars"
    sources = sorted(SOURCES.rglob("*.java"))
    classes = compile_java(
        sources,
        f"{jars}/*",
        _cache_root() / pyspark.__version__,
        'the Spark connector format("stratalog")',
        resources=SOURCES / "META-INF",
    )
    return jar_of(classes, "stratalog-spark-jvm.jar")


def on_classpath(spark) -> bool:
    """Whether the session can load the JVM connector (its jar is in ``spark.jars``)."""
    jvm = spark.sparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    try:
        jvm.java.lang.Class.forName(JVM_CLASS, False, loader)
    except Exception:  # py4j raises Py4JJavaError wrapping ClassNotFoundException
        return False
    return True
