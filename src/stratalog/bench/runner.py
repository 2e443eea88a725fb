"""Runs workloads on targets: the suite's cases, each kept for the report and for later workloads.

``Runner.run`` runs a workload on each of its targets (``--runs`` times, in rounds), a *sweep*
once per combination of the swept keys (KerA's 1..1,000 topics x layout). Each case starts its
target, runs the case of the workload's kind and stops the target whatever happened: the plain
case (``plain_case.py``), a catch-up (``catchup.py``), a burst (``burst.py``), Spark reads
(``spark_case.py``), cluster trials (``cluster_case.py``), compaction (``compaction_load.py``)
or failed logins (``auth_storm.py``). A workload may run at a fraction of the max rate an earlier
one reached (``resolve_rate``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from stratalog.bench.burst import run_burst
from stratalog.bench.catchup import run_catchup
from stratalog.bench.cluster_case import run_cluster_case
from stratalog.bench.load import Progress, no_progress
from stratalog.bench.plain_case import run_plain, run_tool
from stratalog.bench.results import CaseResult
from stratalog.bench.spark_case import run_spark
from stratalog.bench.targets import TargetUnavailable, make_target
from stratalog.bench.workload import TargetSpec, Workload


class Runner:
    """Runs workloads on targets and keeps every case's result (later workloads may refer to
    earlier ones: workload c runs at a fraction of b's max rate)."""

    def __init__(self, progress: Progress = no_progress, log: Callable[[str], None] = print):
        self.progress = progress
        self.log = log
        self.results: list[CaseResult] = []

    # -- entry ---------------------------------------------------------------------------------
    def run(
        self,
        w: Workload,
        names: set[str] | None = None,
        kinds: set[str] | None = None,
        runs: int = 1,
    ) -> list[CaseResult]:
        """Run the workload on its targets (or only on those with one of ``names`` or
        ``kinds``), ``runs`` times; each round runs every target once, so a drift of the
        machine's speed touches all of them alike."""
        out = []
        for i in range(runs):
            for spec in w.targets:
                if (
                    (names or kinds)
                    and spec.name not in (names or ())
                    and spec.kind not in (kinds or ())
                ):
                    continue
                cases = self.run_target(w, spec)
                for c in cases:
                    c.run = i + 1
                out += cases
        return out

    def run_target(self, w: Workload, spec: TargetSpec) -> list[CaseResult]:
        if w.kind == "sweep":
            keys = list(w.sweep)
            out = []
            seen: set[tuple] = set()
            for combo in itertools.product(*(w.sweep[k] for k in keys)):
                over = dict(zip(keys, combo, strict=True))
                # storage.layout means nothing to a peer: run it once per other key.
                if spec.kind != "stratalog" and "layout" in over:
                    over["layout"] = "n/a"
                key = tuple(sorted(over.items()))
                if key in seen:
                    continue
                seen.add(key)
                case_w = w.with_overrides(**{k: v for k, v in over.items() if v != "n/a"})
                out.append(self._guarded(case_w, spec, over))
            return out
        return [self._guarded(w, spec, {})]

    def _guarded(self, w: Workload, spec: TargetSpec, params: dict[str, Any]) -> CaseResult:
        try:
            target = make_target(spec, w)
        except TargetUnavailable as e:
            return self._record(self._failed(w, spec, params, f"not available: {e}"))
        try:
            target.start()
        except TargetUnavailable as e:
            target.stop()
            return self._record(self._failed(w, spec, params, f"not available: {e}"))
        except Exception as e:
            target.stop()
            return self._record(self._failed(w, spec, params, f"did not start: {e}"))
        except BaseException:  # Ctrl-C or SIGTERM while it started: stop what did start
            target.stop()
            raise
        try:
            if getattr(target, "role", spec.role) == "tool":
                res = run_tool(w, target, params, self.progress)
            elif w.kind == "spark":
                res = run_spark(w, target, params, self.progress)
            elif w.kind == "catchup":
                rate = self.resolve_rate(w, target.spec)
                res = run_catchup(w, target, params, self.progress, rate=rate)
            elif w.kind == "burst":
                rate = self.resolve_rate(w, target.spec)
                res = run_burst(w, target, params, self.progress, rate=rate)
            elif w.kind in ("failover", "rejoin"):
                res = run_cluster_case(w, target, params, self.progress, self.log)
            elif w.kind == "compaction":
                from stratalog.bench.compaction_load import run_compaction

                res = run_compaction(w, target, params, self.progress)
            elif w.kind == "share":
                from stratalog.bench.share_load import run_share_group

                res = run_share_group(w, target, params, self.progress)
            elif w.kind == "auth-storm":
                from stratalog.bench.auth_storm import run_auth_storm

                res = run_auth_storm(w, target, params, self.progress)
            else:
                rate = self.resolve_rate(w, target.spec)
                res = run_plain(w, target, params, self.progress, rate=rate)
        except Exception as e:
            res = self._failed(w, spec, params, f"{type(e).__name__}: {e}")
            res.describe = target.describe()
        finally:
            target.stop()
        return self._record(res)

    def _record(self, res: CaseResult) -> CaseResult:
        self.results.append(res)
        what = f"{res.workload} {res.target}" + (f" {res.params}" if res.params else "")
        if res.ok:
            p99 = res.publish["p99"] if res.publish else float("nan")
            self.log(
                f"{what}: {res.records_per_s:,.0f} rec/s, {res.mb_per_s:,.1f} MB/s, "
                f"publish p99 {p99:.2f} ms, server {res.server_cores:.2f} cores"
                + (f", clients {res.client_cores:.2f}" if res.client_cores is not None else "")
            )
        else:
            self.log(f"{what}: FAILED: {res.error}")
        return res

    @staticmethod
    def _failed(w: Workload, spec: TargetSpec, params: dict[str, Any], error: str) -> CaseResult:
        return CaseResult(w.name, spec.name, spec.kind, spec.name, params, ok=False, error=error)

    # -- rates ---------------------------------------------------------------------------------
    def resolve_rate(self, w: Workload, spec: TargetSpec) -> float | None:
        """A fixed rate, or a fraction of the max rate another workload reached."""
        if not w.rate_from:
            return w.rate
        ref_target = spec.rate_reference or w.rate_reference or spec.name
        for r in reversed(self.results):
            if r.workload == w.rate_from and r.target == ref_target and r.ok and r.records_per_s:
                return r.records_per_s * w.rate_fraction
        raise RuntimeError(
            f"workload {w.name} runs at {w.rate_fraction:g} x the max rate of workload "
            f"{w.rate_from} on {ref_target}: run {w.rate_from} first (e.g. "
            f"'stratalog bench {w.rate_from} {w.name}')"
        )
