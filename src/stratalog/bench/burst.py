"""The burst case (workload h, Pafka's): a burst into a tiered broker whose hot tier is filled to
just under its migration threshold, the hot tier's usage followed until migration drains it."""

from __future__ import annotations

import time
from typing import Any

from stratalog.bench.load import Progress, producer_jobs, run_load, topic_names
from stratalog.bench.results import CaseResult, result_from_load
from stratalog.bench.targets import StratalogTarget, Target
from stratalog.bench.workload import Workload


def run_burst(
    w: Workload, target: Target, params: dict[str, Any], progress: Progress, *, rate: float | None
) -> CaseResult:
    """Pafka's burst: with the hot tier filled to just under its migration threshold, a
    burst faster than the cold tier's bandwidth is taken at hot-tier speed until the reserve
    (capacity - threshold) is used up, then at the cold tier's pace; afterwards migration
    drains the hot tier back to the threshold. The hot tier's usage is followed throughout."""
    if not rate or not w.records:
        raise RuntimeError(f"workload {w.name}: a burst needs a fixed rate and records")
    topics = topic_names(w)
    target.create_topics(topics, w.partitions)
    plan = target.tier_plan() if isinstance(target, StratalogTarget) else None
    hot = target.hot_bytes if isinstance(target, StratalogTarget) else None
    prefill = max(1, w.prefill_bytes // w.record_size) if w.prefill_bytes else 0
    if prefill:
        fill = run_load(
            target,
            producer_jobs(
                w.with_overrides(acks="1", latency_sample_every=1000),
                topics,
                None,
                prefill,
            ),
            [],
            label=f"{w.name} · {target.name} · prefill",
            progress=progress,
        )
        if fill.errors:
            raise RuntimeError("the prefill failed: " + "; ".join(fill.errors))
        if hasattr(target, "settle"):
            target.settle()
    hot_before = hot() if hot else 0
    timeline: list[tuple[float, int, int]] = []  # (time, acknowledged bytes, hot bytes)
    last = [0.0]

    def sample(t: float, acked: int) -> None:
        if t - last[0] >= 0.2:
            last[0] = t
            timeline.append((t, acked * w.record_size, hot() if hot else 0))

    load = run_load(
        target,
        producer_jobs(w, topics, rate, w.records),
        [],
        label=f"{w.name} · {target.name}",
        progress=progress,
        sample=sample,
    )
    res = result_from_load(w, target, load, params)
    res.extra["target_rate"] = rate
    t_end = max((r["t_last"] for r in load.producers if "t_last" in r), default=time.time())
    timeline.append((t_end, load.acked_bytes, hot() if hot else 0))
    # After the burst: follow the hot tier until migration has brought it back down.
    drained_at = None
    if plan and hot:
        floor = plan["threshold"] * plan["capacity"] + plan["segment_bytes"]
        deadline = time.monotonic() + w.drain_max_s
        while time.monotonic() < deadline:
            used = hot()
            timeline.append((time.time(), load.acked_bytes, used))
            if used <= floor:
                drained_at = time.time()
                break
            time.sleep(0.2)
    res.extra["burst"] = burst_analysis(
        timeline, load.t_start, t_end, drained_at, rate * w.record_size, plan, hot_before
    )
    res.stored = target.count_records(topics, w.partitions)
    expected = w.records + prefill
    if res.ok and res.stored is not None and res.stored < expected:
        res.ok = False
        res.error = f"the server holds {res.stored} records, {expected} were acknowledged"
    return res


def burst_analysis(
    timeline: list[tuple[float, int, int]],
    t_start: float,
    t_end: float,
    drained_at: float | None,
    burst_bytes_per_s: float,
    plan: dict[str, float] | None,
    hot_before: int = 0,
) -> dict[str, Any]:
    """What the burst's timeline says, beside Pafka's estimates: the burst is absorbed at the
    offered rate for about reserve / (rate - cold bandwidth) seconds (reserve / rate if the
    cold tier took nothing meanwhile), and the hot tier drains back to the threshold in about
    (hot usage at the end - threshold) / cold bandwidth."""
    out: dict[str, Any] = {
        "offered_mb_per_s": burst_bytes_per_s / 1e6,
        "timeline": [
            {"t": round(t - t_start, 2), "acked_mb": a / 1e6, "hot_mb": h / 1e6}
            for t, a, h in timeline
        ],
    }
    if not plan or not timeline:
        return out
    cap, thr, cold = plan["capacity"], plan["threshold"], plan["cold_bytes_per_s"]
    seg = plan["segment_bytes"]
    during = [(t, a, h) for t, a, h in timeline if t <= t_end]
    reserve = max(0.0, cap - hot_before)
    full = next(((t, a) for t, a, h in during if h >= cap - seg), None)
    out.update(
        capacity_mb=cap / 1e6,
        threshold=thr,
        cold_mb_per_s=cold / 1e6,
        hot_at_start_mb=hot_before / 1e6,
        reserve_mb=reserve / 1e6,
        pafka_absorb_s=reserve / burst_bytes_per_s,
        expected_absorb_s=reserve / (burst_bytes_per_s - cold)
        if cold and burst_bytes_per_s > cold
        else None,
    )
    if full is not None:
        t_full, a_full = full
        out["absorb_s"] = t_full - t_start
        out["absorb_mb_per_s"] = a_full / 1e6 / (t_full - t_start) if t_full > t_start else None
        a_end = during[-1][1]
        if t_end - t_full > 1.0:
            out["after_full_mb_per_s"] = (a_end - a_full) / 1e6 / (t_end - t_full)
    hot_end = next((h for t, _a, h in timeline if t >= t_end), None)
    if hot_end is not None:
        out["hot_at_end_mb"] = hot_end / 1e6
        if cold:
            out["expected_drain_s"] = max(0.0, hot_end - thr * cap) / cold
    out["drain_s"] = drained_at - t_end if drained_at is not None else None
    return out
