"""Broker metrics (Prometheus client): what operators and the benchmarks look at."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter("stratalog_requests", "Kafka requests received", ["api"])
# Kafka's TotalTimeMs: from a request's last byte read to its response handed to the socket,
# including the wait behind earlier responses on the same connection (and, for acks=all
# Produce, the fsync). Buckets grow by 1.25x from 0.1 ms to ~26 s: a p99 read from them is
# within about 12% (1.5x steps could not tell a 25% rise from none).
LATENCY_BUCKETS = [round(0.0001 * 1.25**i, 7) for i in range(57)]
REQUEST_SECONDS = Histogram(
    "stratalog_request_seconds",
    "Time from a request received to its response written, by API",
    ["api"],
    buckets=LATENCY_BUCKETS,
)
PRODUCED_BYTES = Counter("stratalog_produced_bytes", "Record-batch bytes appended")
CONSUMER_GROUP_LAG = Gauge(
    "stratalog_consumer_group_lag",
    "A group's lag on a partition: its high watermark minus the group's committed offset (the "
    "groups this broker keeps offsets for, on the partitions it holds)",
    ["group", "topic", "partition"],
)
RECORDS_PAST_RETENTION = Counter(
    "stratalog_records_past_retention",
    "Records appended with timestamps already past their topic's retention.ms (deleted soon)",
)
SASL_AUTHENTICATIONS = Counter(
    "stratalog_sasl_authentications",
    "SASL exchanges on SASL listeners by result: ok, reauthenticated (KIP-368), failed (the "
    "connection was closed: bad credentials, unknown mechanism, or a request not allowed yet)",
    ["result"],
)
FETCH_SENDFILE_BYTES = Counter(
    "stratalog_fetch_sendfile_bytes", "Fetch bytes sent with sendfile from the page cache"
)
FETCH_SENDER_BYTES = Counter(
    "stratalog_fetch_sender_bytes",
    "Fetch bytes of history sent by the backlog sender process (fetch.backlog.sender=process)",
)
FETCH_PACED_BYTES = Counter(
    "stratalog_fetch_paced_bytes",
    "Fetch bytes sent at the backlog budget's rate (history; tail reads are not paced)",
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
LOGS_BY_STATE = Gauge(
    "stratalog_logs",
    "Virtual logs by state: online, read-only (the last write met EROFS), write-error (it "
    "failed otherwise), failed (an fsync failed: nothing more acknowledged); set at each scrape",
    ["state"],
)
LOG_DIR_STATE = Gauge(
    "stratalog_log_dir_online",
    "1 while every virtual log takes writes; 0 when one is read-only, failing or failed",
)
BACKLOG_RATE = Gauge(
    "stratalog_backlog_rate_bytes_per_second",
    "The backlog read budget now (0: unlimited); steered with fetch.backlog.fsync_target_ms",
)
CLEANER_RATE = Gauge(
    "stratalog_cleaner_rate_bytes_per_second",
    "The cleaner's read and write rate now (0: unlimited); steered with "
    "log.cleaner.fsync_target_ms",
)
TAIL_CACHE_BYTES = Gauge(
    "stratalog_tail_cache_bytes", "Bytes of chunks in the broker-wide tail cache (cache.tail_bytes)"
)
# Each collection of Python's collector stops the event loop (a serving broker only: the
# embedded one leaves the host process's collector alone).
GC_PAUSE_SECONDS = Histogram(
    "stratalog_gc_pause_seconds",
    "Duration of each garbage collection in a serving broker",
    buckets=[round(0.00025 * 1.5**i, 6) for i in range(27)],
)
# How late the event loop runs a timer: anything that holds the loop (a long step on it, a
# collection, the GIL held by a pool thread) delays every request queued behind it by as much.
LOOP_LAG_SECONDS = Histogram(
    "stratalog_event_loop_lag_seconds",
    "How late a 10 ms timer on the broker's event loop fired",
    buckets=LATENCY_BUCKETS,
)
