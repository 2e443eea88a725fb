"""Stratalog: a Kafka-compatible, tiered stream store for Python and Spark pipelines."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Broker", "__version__"]


def __getattr__(name: str):
    # Lazy, so that `import stratalog` (e.g. by Spark's data-source discovery) stays cheap.
    if name == "Broker":
        from stratalog.broker.broker import Broker

        return Broker
    raise AttributeError(name)
