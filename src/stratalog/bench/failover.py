"""Failover time on a three-broker cluster: under a steady ``acks=all`` load, ``kill -9`` the
broker that leads the partition being written and time how long until the next write on that
partition is acknowledged; restart the broker, wait until it is in sync again, repeat.

The load is the lab's own generator (``clients._produce``) driving the lab's confluent-kafka
producer at a fixed rate, run on a thread of the harness so that the trial can see each
acknowledgement as it arrives. A trial ends at the first acknowledgement of a record *sent*
after the kill: the old leader is dead by then, so only the new one can have acknowledged it
(a record sent before the kill may carry an acknowledgement the old leader gave just before).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from stratalog.bench.clients import (
    _UNPACK_FROM,
    KafkaClientFactory,
    KafkaProducerClient,
    ProducerJob,
    _produce,
)
from stratalog.bench.cluster_targets import ClusterTarget
from stratalog.bench.workload import Workload

Progress = Callable[[str, int, int, int], None]


class AckWatch(KafkaProducerClient):
    """The lab's producer, also noting when the first record sent after a given moment is
    acknowledged (delivery callbacks run on the load thread; the harness only reads)."""

    def __init__(self, factory: KafkaClientFactory, job: ProducerJob) -> None:
        super().__init__(factory, job)
        self.watch_from_us: int | None = None
        self.first_ok: float | None = None
        self.failed = 0

    def watch(self, since: float) -> None:
        self.first_ok = None
        self.failed = 0
        self.watch_from_us = int(since * 1e6)

    def _cb(self, err, msg) -> None:
        super()._cb(err, msg)
        since = self.watch_from_us
        if since is None:
            return
        if err is not None:
            self.failed += 1
        elif self.first_ok is None and _UNPACK_FROM(msg.value())[0] >= since:
            self.first_ok = time.time()


def quantile(xs: list[float], q: float) -> float | None:
    """Nearest-rank quantile (of 20 trials, p99 is the slowest; p50 the 10th)."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def run_failover(
    w: Workload,
    target: ClusterTarget,
    progress: Progress,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Run ``w.failover_trials`` trials; returns the load's figures and every trial."""
    if not w.rate:
        raise RuntimeError(f"workload {w.name}: failover needs a steady rate")
    topic = f"bench-{w.name}"
    target.create_topics([topic], w.partitions)
    target.wait_all_in_sync(topic)
    job = ProducerJob(
        index=0,
        topics=[topic],
        partitions=w.partitions,
        record_size=w.record_size,
        records=10**12,  # stopped by the harness, not by a count
        rate=w.rate,
        acks=w.acks,
        linger_ms=w.linger_ms,
        batch_bytes=w.batch_bytes,
        max_duration_s=10**6,
        extra={"log_level": 0},  # refused connections to the killed broker are expected
    )
    factory = target.client_factory()
    assert isinstance(factory, KafkaClientFactory)
    client = AckWatch(factory, job)
    stop = threading.Event()
    acked = SimpleNamespace(value=0)
    load: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: load.update(_produce(client, job, stop, acked)),
        name="failover-load",
        daemon=True,
    )
    label = f"{w.name} · {target.name} · trials"
    trials: list[dict[str, Any]] = []
    t0 = time.time()
    thread.start()
    try:
        # A second of steady load first, so the first trial starts like the others.
        _wait(lambda: acked.value >= w.rate, 30)
        for i in range(w.failover_trials):
            progress(label, i, 0, w.failover_trials)
            trials.append(_trial(w, target, topic, client, i))
            t = trials[-1]
            log(
                f"{w.name} {target.name} trial {i + 1}: killed {t['killed']}, next ack after "
                + (f"{t['seconds']:.2f} s" if t["seconds"] is not None else "never")
                + f", leader moved in metadata after {t['leader_moved_s'] or 0:.2f} s"
                + f" (new leader {t['new_leader']}, back in sync {t['resync_s']} s)"
            )
        progress(label, w.failover_trials, 0, w.failover_trials)
    finally:
        stop.set()
        thread.join(timeout=200)
    seconds = [t["seconds"] for t in trials if t["seconds"] is not None]
    return {
        "load": load,
        "wall_s": time.time() - t0,
        "trials": trials,
        "recovered": len(seconds),
        "never": len(trials) - len(seconds),
        "failover_p50_s": quantile(seconds, 0.5),
        "failover_p99_s": quantile(seconds, 0.99) if len(seconds) == len(trials) else None,
        "failover_max_s": max(seconds) if seconds else None,
        "failover_min_s": min(seconds) if seconds else None,
    }


def _trial(
    w: Workload, target: ClusterTarget, topic: str, client: AckWatch, i: int
) -> dict[str, Any]:
    leader = None
    deadline = time.monotonic() + 30
    while leader is None and time.monotonic() < deadline:
        leader = target.leader(topic, 0)
        if leader is None:
            time.sleep(0.1)
    if leader is None:
        raise RuntimeError(f"{target.name}: partition 0 of {topic} has no leader")
    admin = target.admin()
    t_kill = time.time()
    client.watch(t_kill)
    target.kill(leader)
    # Meanwhile, when the metadata first names another leader: the cluster's share of the
    # failover, apart from the client's rediscovery of it.
    moved: list[float] = []

    def acked_or_moved() -> bool:
        if not moved:
            now = target.leader_id(admin, topic, 0)
            if now is not None and now != target.node_id(leader):
                moved.append(time.time() - t_kill)
        return client.first_ok is not None

    got = _wait(acked_or_moved, w.failover_timeout_s, interval=0.02)
    seconds = client.first_ok - t_kill if got and client.first_ok is not None else None
    failed = client.failed
    client.watch_from_us = None
    new_leader = target.leader(topic, 0)
    t_restart = time.monotonic()
    target.restart(leader)
    resync = target.wait_in_sync(topic, target.node_id(leader), True, timeout=180)
    if resync is None:
        raise RuntimeError(f"{target.name}: {leader} was not in sync again within 180 s")
    return {
        "trial": i + 1,
        "killed": leader,
        "seconds": seconds,
        "leader_moved_s": moved[0] if moved else None,
        "new_leader": new_leader,
        "failed_sends": failed,
        "resync_s": round(time.monotonic() - t_restart, 2),
    }


def _wait(cond: Callable[[], bool], timeout: float, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return cond()
