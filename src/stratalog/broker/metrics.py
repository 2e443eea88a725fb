"""Broker metrics (Prometheus client): what operators and the benchmarks look at."""

from __future__ import annotations

from prometheus_client import Counter

REQUESTS = Counter("stratalog_requests", "Kafka requests received", ["api"])
PRODUCED_BYTES = Counter("stratalog_produced_bytes", "Record-batch bytes appended")
FETCH_SENDFILE_BYTES = Counter(
    "stratalog_fetch_sendfile_bytes", "Fetch bytes sent with sendfile from the page cache"
)
FETCH_COPIED_BYTES = Counter(
    "stratalog_fetch_copied_bytes", "Fetch bytes of segment files read into memory first"
)
FETCH_MEMORY_BYTES = Counter(
    "stratalog_fetch_memory_bytes", "Fetch bytes served from the in-memory tail cache"
)
SPILLED_BYTES = Counter(
    "stratalog_spilled_bytes",
    "Record-batch bytes appended to segments in the cold tier's directory (hot tier full)",
)
