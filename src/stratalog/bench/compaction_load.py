"""Produce latency while a compacted topic is cleaned (issue 28's compaction goal).

One case on a Stratalog target:

1. a compacted topic (``cleanup.policy=compact``) is filled with ``compacted_bytes`` of keyed
   records whose keys repeat, so that ``compacted_live_fraction`` of them are each key's
   latest (10%: every key written ten times, in turns, the last turn live). The topic is
   created with ``min.compaction.lag.ms`` of a day, so nothing of it is cleanable yet;
2. *before*: the steady producers (the workload's ``rate``, acks, record size) run on a topic
   of their own for ``phase_duration_s``;
3. *cleaning*: ``min.compaction.lag.ms`` is set to 0 (IncrementalAlterConfigs), the cleaner
   finds the topic due at its next look (``log.cleaner.backoff.ms``), and the steady producers
   run until the cleaner has cleaned every partition (its ``/status`` counters), at most
   ``cleaning_max_s``;
4. *after*: the steady producers again, for ``phase_duration_s``, with nothing left to clean.

The goal compares the cleaning phase's publish p99 with the alone phases' (their median, and
each of them). The broker's own produce, fsync and event-loop-lag p99 of every phase are kept
beside the clients'.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from stratalog.bench import hist
from stratalog.bench.load import (
    LoadResult,
    Progress,
    load_context,
    start_process,
    topic_names,
)
from stratalog.bench.phases import fixed_rate, steady_phase
from stratalog.bench.results import CaseResult, median_of, result_from_load
from stratalog.bench.targets import StratalogTarget, Target
from stratalog.bench.workload import Workload

FILL_PROCESSES = 2
DAY_MS = 86_400_000


def fill_main(
    bootstrap: str, topic: str, first: int, last: int, keys: int, size: int, done
) -> None:
    """Child process: records ``first`` .. ``last`` - 1, record i keyed ``k<i % keys>``."""
    import os

    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "1",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 512 * 1024,
            "log_level": 3,
        }
    )
    value = os.urandom(size)
    for i in range(first, last):
        key = b"k%d" % (i % keys)
        while True:
            try:
                p.produce(topic, value, key)
                break
            except BufferError:
                p.poll(0.01)
        if i % 1024 == 0:
            p.poll(0)
            done.value = i - first - len(p)
    left = p.flush(300)
    done.value = last - first - left
    if left:
        raise RuntimeError(f"{left} records of the compacted topic not acknowledged")


def fill(w: Workload, target: Target, topic: str, progress: Progress) -> dict[str, Any]:
    """Fill the compacted topic (acks=1, as fast as it takes it); returns records and keys."""
    n = max(1, w.compacted_bytes // w.record_size)
    keys = max(1, int(n * w.compacted_live_fraction))
    ctx = load_context()
    bounds = [n * i // FILL_PROCESSES for i in range(FILL_PROCESSES + 1)]
    done = [ctx.Value("q", 0, lock=False) for _ in range(FILL_PROCESSES)]
    procs = [
        ctx.Process(
            target=fill_main,
            args=(target.bootstrap, topic, bounds[i], bounds[i + 1], keys, w.record_size, done[i]),
            daemon=True,
        )
        for i in range(FILL_PROCESSES)
    ]
    label = f"{w.name} · {target.name} · compacted topic"
    t0 = time.monotonic()
    try:
        for p in procs:
            start_process(p)
        while any(p.is_alive() for p in procs):
            progress(label, sum(v.value for v in done), 0, n)
            if time.monotonic() - t0 > 1800:
                raise RuntimeError("filling the compacted topic took more than 30 min")
            time.sleep(0.25)
    finally:
        for p in procs:
            if p.pid is None:
                continue  # never started (interrupted while starting the others)
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    progress(label, sum(v.value for v in done), 0, n)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError("a process filling the compacted topic failed")
    secs = time.monotonic() - t0
    return {"records": n, "keys": keys, "bytes": n * w.record_size, "fill_s": secs}


def cleaner_status(target: StratalogTarget) -> dict[str, Any]:
    """The cleaner's counters from the broker's /status."""
    with urllib.request.urlopen(f"http://{target.admin}/status", timeout=5) as r:
        return dict(json.loads(r.read())["compaction"])


def set_topic_config(bootstrap: str, topic: str, key: str, value: str) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    res = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)],
    )
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)


def run_compaction(
    w: Workload, target: Target, params: dict[str, Any], progress: Progress
) -> CaseResult:
    if not isinstance(target, StratalogTarget):
        raise RuntimeError(f"workload {w.name} measures Stratalog's cleaner, not {target.kind}")
    fixed_rate(w, "the steady producers")
    compacted = f"bench-{w.name}-compacted"
    target.create_topics(
        [compacted],
        w.compacted_partitions,
        config={"cleanup.policy": "compact", "min.compaction.lag.ms": str(DAY_MS)},
    )
    topics = topic_names(w)
    target.create_topics(topics, w.partitions)
    filled = fill(w, target, compacted, progress)
    status0 = cleaner_status(target)
    loads: dict[str, LoadResult] = {}
    rows = []
    load, row = steady_phase(w, target, topics, "before", w.phase_duration_s, progress)
    loads["before"] = load
    rows.append(row)
    # Cleaning: the topic becomes cleanable once the producers run (the first question asked
    # of ``cleaned``); the phase lasts until every partition is cleaned.
    state: dict[str, Any] = {"last_poll": 0.0, "done_at": None, "due_at": None, "status": status0}

    def cleaned() -> bool:
        now = time.time()
        if state["due_at"] is None:
            set_topic_config(target.bootstrap, compacted, "min.compaction.lag.ms", "0")
            state["due_at"] = now
        if now - state["last_poll"] < 0.5:
            return state["done_at"] is not None
        state["last_poll"] = now
        st = cleaner_status(target)
        state["status"] = st
        if st["cleanings"] - status0["cleanings"] >= w.compacted_partitions:
            state["done_at"] = state["done_at"] or now
        return state["done_at"] is not None

    load, row = steady_phase(w, target, topics, "cleaning", w.cleaning_max_s, progress, cleaned)
    loads["cleaning"] = load
    if state["due_at"] is None or state["done_at"] is None:
        cleaned()  # the phase ended before the first question, or between two polls
    row["cleaned"] = state["done_at"] is not None
    rows.append(row)
    status1 = state["status"]
    load, row = steady_phase(w, target, topics, "after", w.phase_duration_s, progress)
    loads["after"] = load
    rows.append(row)
    status2 = cleaner_status(target)

    res = result_from_load(w, target, loads["cleaning"], params)
    res.records = sum(x.acked for x in loads.values())
    errors = [e for x in loads.values() for e in x.errors]
    if errors:
        res.ok, res.error = False, "; ".join(errors)[:500]
    elif state["done_at"] is None:
        res.ok = False
        res.error = f"the cleaner did not clean every partition within {w.cleaning_max_s:.0f} s"
    alone = [r["publish_p99_ms"] for r in rows if r["phase"] != "cleaning"]
    busy = rows[1]["publish_p99_ms"]
    base = median_of([x for x in alone if x is not None])
    res.extra.update(
        compacted=filled,
        target_rate=w.rate,
        phases=rows,
        cleaning_s=(state["done_at"] - state["due_at"]) if state["done_at"] else None,
        cleaner=status2,
        cleaner_during_phase={
            k: status1[k] - status0[k]
            for k in ("cleanings", "read_bytes", "written_bytes", "records_removed", "discarded")
        },
        cleaner_error=status2.get("last_error"),
        publish_p99_alone_ms=base,
        publish_p99_cleaning_ms=busy,
        cleaning_p99_rise=(busy / base - 1.0) if base and busy else None,
        publish_alone=hist.summary(
            hist.merge([r.get("hist") for k in ("before", "after") for r in loads[k].producers])
        ),
    )
    removed = res.extra["cleaner_during_phase"]["records_removed"]
    res.extra["removed_share"] = removed / filled["records"] if filled["records"] else None
    return res
