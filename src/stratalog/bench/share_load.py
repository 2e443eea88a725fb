"""A share group draining a topic (issue 28's share-group goal: a share group of 4 consumers
delivers >= 100,000 records/s, every record acknowledged exactly once when no consumer fails).

One case per target:

1. *fill*: the workload's producers write ``records`` to the topic (max rate, its acks);
2. *drain*: ``share_consumers`` share consumers of one share group (bench/share_client.py,
   librdkafka's, implicit acknowledgement) read the topic from its start
   (``share.auto.offset.reset=earliest`` on the broker) until the broker confirmed an
   acknowledgement of every record. The case's ``records_per_s`` is the drain's: records
   acknowledged over the time from the consumers' start to the last confirmation; the fill's
   rate is kept beside it, and the deliveries (more than the records if a lock ran out).

Then the consumers' confirmed acknowledgements are counted across the group: every record must
have been acknowledged once, none twice, none never (``share_acks_verdict``); the case fails
otherwise.
"""

from __future__ import annotations

from typing import Any

from stratalog.bench.clients import ConsumerJob
from stratalog.bench.load import Progress, producer_jobs, run_load, topic_names
from stratalog.bench.results import CaseResult, result_from_load
from stratalog.bench.share_client import share_acks_verdict
from stratalog.bench.targets import Target
from stratalog.bench.workload import Workload


def run_share_group(
    w: Workload, target: Target, params: dict[str, Any], progress: Progress
) -> CaseResult:
    if not target.kafka_protocol:
        raise RuntimeError("share groups need a target that speaks the Kafka protocol")
    topics = topic_names(w)
    target.create_topics(topics, w.partitions)
    name = f"{w.name} · {target.name}"
    fill = run_load(target, producer_jobs(w, topics, None, w.records), [],
                    label=f"{name} · fill", progress=progress)  # fmt: skip
    if fill.errors:
        raise RuntimeError("the fill failed: " + "; ".join(fill.errors))
    jobs = [
        ConsumerJob(index=i, count=w.share_consumers, topics=topics, partitions=w.partitions,
                    track_latency=False, max_duration_s=w.drain_timeout_s, client="share")
        for i in range(w.share_consumers)
    ]  # fmt: skip
    drain = run_load(target, [], jobs, label=f"{name} · drain", progress=progress,
                     drain_timeout_s=w.drain_timeout_s, expect=fill.acked)  # fmt: skip
    res = result_from_load(w.with_overrides(consumers=0), target, drain, params)
    secs = drain.consume_seconds
    res.records = fill.acked
    res.bytes = fill.acked_bytes
    res.seconds = secs
    res.records_per_s = drain.consumed / secs if secs else 0.0
    res.mb_per_s = drain.consumed_bytes / 1e6 / secs if secs else 0.0
    res.publish = fill.publish_hist()
    fill_secs = fill.produce_seconds
    res.extra["fill_records_per_s"] = fill.acked / fill_secs if fill_secs else 0.0
    verdict = share_acks_verdict(drain.consumers, fill.acked)
    verdict["expected"] = fill.acked
    verdict["delivered"] = sum(r.get("share_delivered", 0) for r in drain.consumers)
    verdict["refused"] = sum(r.get("share_refused", 0) for r in drain.consumers)
    res.extra["share"] = verdict
    res.extra["per_consumer"] = [r.get("share_delivered", 0) for r in drain.consumers]
    if drain.errors:
        res.ok, res.error = False, "; ".join(drain.errors)[:500]
    elif verdict["acked_once"] != fill.acked or verdict["acked_more"]:
        res.ok = False
        res.error = (
            f"{verdict['acked_once']} of {fill.acked} records acknowledged once, "
            f"{verdict['acked_more']} more than once, {verdict['never']} never"
        )
    return res
