"""Makes ``spark.read.format("stratalog-python")`` (the Python data source) work without
registration; ``format("stratalog")`` is the JVM connector (``stratalog.spark.jvm``).

Spark imports every top-level module named ``pyspark_*`` at its first data-source lookup and
registers its ``DefaultSource`` (SPARK-45917). Keep this import cheap.
"""

from stratalog.spark.source import StratalogDataSource as DefaultSource

__all__ = ["DefaultSource"]
