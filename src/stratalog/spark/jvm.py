"""``format("stratalog-jvm")``: the connector that runs inside Spark's JVM.

A Python data source hands every row through a Python worker and Arrow IPC to the JVM; this
reader fetches raw record batches and decodes them on the JVM straight into Spark's column
vectors (``jvm/io/stratalog/spark``). Its Java sources are compiled on first use against the
installed PySpark's own jars, into ``~/.cache/stratalog/spark-jvm``, so the jar always matches
the Spark it runs in. Batch and streaming reads and writes, as ``format("stratalog")``.
"""

from __future__ import annotations

import os
from pathlib import Path

SOURCES = Path(__file__).parent / "jvm"
FORMAT = "stratalog-jvm"


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
        'the Spark reader format("stratalog-jvm")',
        resources=SOURCES / "META-INF",
    )
    return jar_of(classes, "stratalog-spark-jvm.jar")
