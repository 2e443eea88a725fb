"""The broker's own view of a phase: Stratalog's request, fsync, group-commit, collector-pause and
event-loop-lag histograms from its /metrics, before and after, as p99s and maxima in ms. They
tell the broker's share of the clients' publish p99 from the clients' own scheduling."""

from __future__ import annotations

from stratalog.bench import hist
from stratalog.bench.targets import StratalogTarget, Target


def broker_buckets(target: Target) -> dict[str, dict[float, float]]:
    """Stratalog's own produce-request, group-commit fsync, group commit as the loop sees it,
    collector pause and event-loop lag histograms (cumulative buckets from /metrics); empty
    for other targets."""
    if not isinstance(target, StratalogTarget):
        return {}
    return {
        "produce": target.histogram_buckets("stratalog_request_seconds", api="produce"),
        "fsync": target.histogram_buckets("stratalog_fsync_seconds"),
        "commit": target.histogram_buckets("stratalog_group_commit_seconds"),
        "gc": target.histogram_buckets("stratalog_gc_pause_seconds"),
        "loop_lag": target.histogram_buckets("stratalog_event_loop_lag_seconds"),
    }


def broker_p99_since(target: Target, before: dict[str, dict[float, float]]) -> dict:
    """p99 in ms of each of broker_buckets' histograms over what was observed since ``before``."""
    out: dict[str, float | None] = {}
    for what, b in broker_buckets(target).items():
        q = hist.bucket_quantile(before.get(what, {}), b, 0.99)
        out[what] = q * 1000 if q is not None else None
        # The longest one too (its bucket's bound): a few stalls of hundreds of ms move the
        # clients' p99 while the broker's p99s, counted per request or per commit, hide them.
        top = hist.bucket_quantile(before.get(what, {}), b, 1.0)
        out[f"{what}_max"] = top * 1000 if top is not None else None
    return out
