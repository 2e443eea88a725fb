"""A backlog reader that reads history the way the Spark source does.

The catch-up's default backlog readers are confluent-kafka consumers: librdkafka hands Python one
message object per record, which at hundreds of MB/s of 1 KiB records costs a core or more of the
reader's own. On this project's two-core benchmark machine that CPU is taken from the broker and
the producers, so the catch-up would measure the readers' decoding rather than the broker's
isolation. This reader fetches raw record batches of all its partitions in one Fetch (as any
Kafka consumer's fetcher does) and decodes them into Arrow columns with the Spark source's
decoder (``client/arrow_reader.py``): no Python object per record, as in a pipeline that replays
history into Spark.
"""

from __future__ import annotations

import pyarrow.compute as pc

from stratalog.bench.clients import ConsumerClient, ConsumerJob
from stratalog.client.arrow_reader import ArrowDecoder
from stratalog.client.wire import EARLIEST, WireClient, WireError

# librdkafka's defaults for the same two limits (max.partition.fetch.bytes, fetch.max.bytes).
PARTITION_FETCH_BYTES = 1024 * 1024
FETCH_BYTES = 52_428_800
_END = 2**63 - 1


class ArrowHistoryReader(ConsumerClient):
    """Reads its share of the topics' partitions (``job.index`` of ``job.count``) from their
    start; ``consume`` is one Fetch of all of them per topic (the broker holds it up to the
    timeout when none has records), returning (records, value bytes) decoded."""

    def __init__(self, bootstrap: str, job: ConsumerJob) -> None:
        super().__init__(track_latency=False)
        self.client = WireClient(bootstrap, client_id=f"stratalog-bench-history-{job.index}")
        tps = [(t, p) for t in job.topics for p in range(job.partitions)]
        mine = tps[job.index :: job.count]
        self.partition_bytes = int(job.extra.get("partition_fetch_bytes", PARTITION_FETCH_BYTES))
        self.fetch_bytes = int(job.extra.get("fetch_bytes", FETCH_BYTES))
        self.offsets: dict[str, dict[int, int]] = {}
        self.decoders: dict[tuple[str, int], ArrowDecoder] = {}
        for topic in dict.fromkeys(t for t, _ in mine):
            parts = [p for t, p in mine if t == topic]
            start = self.client.list_offsets(topic, parts, EARLIEST)
            self.offsets[topic] = {p: start[p][0] for p in parts}
            for p in parts:
                self.decoders[topic, p] = ArrowDecoder(topic, p)

    def consume(self, timeout: float) -> tuple[int, int]:
        records = nbytes = 0
        for topic, offsets in self.offsets.items():
            data = self.client.fetch(
                topic,
                offsets,
                max_bytes=self.fetch_bytes,
                partition_max_bytes=self.partition_bytes,
                max_wait_ms=int(timeout * 1000),
                reuse_buffer=True,  # each answer is decoded before the next Fetch
            )
            for p, d in data.items():
                if d.error_code:
                    raise WireError(f"Fetch {topic}-{p}: error {d.error_code}", d.error_code)
                if not d.records:
                    continue
                dec = self.decoders[topic, p]
                nxt = dec.add(d.records, offsets[p], _END)
                if nxt <= offsets[p]:
                    raise WireError(f"Fetch {topic}-{p} at {offsets[p]} made no progress")
                offsets[p] = nxt
                for batch in dec.drain():
                    records += batch.num_rows
                    nbytes += pc.sum(pc.binary_length(batch.column(1))).as_py() or 0
        return records, nbytes

    def close(self) -> None:
        self.client.close()
