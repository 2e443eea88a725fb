"""Differential conformance tests: Stratalog against the reference Apache Kafka."""
