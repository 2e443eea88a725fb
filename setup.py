"""The native parts, both optional: without a C compiler the package installs and does the same
work in Python, only slower.

* Kafka record batches into Arrow buffers (src/stratalog/client/_columns.c), for the readers.
* The record walk of log compaction's two passes (src/stratalog/storage/_key_scan.c).
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]
VARINT = "src/stratalog/kafka_varint.h"  # shared by both (in the sdist through depends)

setup(
    ext_modules=[
        Extension(
            "stratalog.client._columns",
            sources=["src/stratalog/client/_columns.c"],
            depends=[VARINT],
            extra_compile_args=FLAGS,
            optional=True,
        ),
        Extension(
            "stratalog.storage._key_scan",
            sources=["src/stratalog/storage/_key_scan.c"],
            depends=[VARINT],
            extra_compile_args=FLAGS,
            optional=True,
        ),
    ]
)
