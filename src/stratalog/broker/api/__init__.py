"""Kafka API handlers, one module per family; each takes (core, request, connection)."""
