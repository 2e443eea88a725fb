"""Stratalog: a Kafka-compatible, tiered stream store for Python and Spark pipelines."""

__version__ = "0.1.0"
