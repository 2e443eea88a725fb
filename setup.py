"""The one native part: Kafka record batches into Arrow buffers (src/stratalog/client/_columns.c).

Optional: without a C compiler the package installs and decodes in Python (through aiokafka's
decoder), only slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "stratalog.client._columns",
            sources=["src/stratalog/client/_columns.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
