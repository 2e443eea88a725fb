"""Failed SASL logins against a broker while a good client produces (issue 29's goal).

One case on a secure target (``stratalog-secure``, bench/secure_targets.py), on the listener
the target names (SASL_PLAINTEXT or SASL_SSL):

1. *before*: the good client (the workload's producers, logged in with SCRAM-SHA-256) produces
   at the workload's ``rate`` for ``phase_duration_s``;
2. *storm*: the good client goes on while an attacker process makes ``failed_logins`` logins
   with wrong passwords, alternately SCRAM-SHA-256 (a real user) and PLAIN (a real user), each
   on a new connection, ``failed_login_concurrency`` connections at a time; the phase ends when
   the attacker is done;
3. *after*: the good client alone again for ``phase_duration_s``.

The broker's resident memory (VmRSS of the ``stratalog serve`` process, /proc/<pid>/status) is
read before the storm, every quarter second during it, right after it and after the last phase;
the good client's errors and publish latency (p99, max) are kept per phase.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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
from stratalog.bench.results import CaseResult, result_from_load
from stratalog.bench.secure_targets import PLAIN_USER, SCRAM_USER, Credentials, _Secure
from stratalog.bench.targets import Target
from stratalog.bench.workload import Workload

MECHANISMS = ("SCRAM-SHA-256", "PLAIN")


def rss_mib(pid: int | None) -> float | None:
    """A process's resident memory in MiB (VmRSS), None when it cannot be read."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def one_bad_login(creds: Credentials, i: int) -> tuple[str, int]:
    """Log in with a wrong password on a new connection: ("refused" | "accepted" | an error's
    kind, microseconds until the broker's answer)."""
    from stratalog.client.connection import BrokerConnection
    from stratalog.client.errors import WireError
    from stratalog.client.security import ClientSecurity

    mechanism = MECHANISMS[i % len(MECHANISMS)]
    user = PLAIN_USER if mechanism == "PLAIN" else SCRAM_USER
    host, port = creds.address.rsplit(":", 1)
    sec = ClientSecurity(
        protocol=creds.listener,
        truststore=creds.ca,
        mechanism=mechanism,
        username=user,
        password=f"wrong-{i}",
    )
    conn = BrokerConnection((host, int(port)), timeout=30, client_id="intruder", security=sec)
    t0 = time.perf_counter_ns()
    try:
        conn.open()
        outcome = "accepted"
    except WireError:
        outcome = "refused"
    except OSError as e:
        outcome = type(e).__name__
    except Exception as e:  # a ConnectionLost or anything else: counted by kind
        outcome = type(e).__name__
    finally:
        conn.close()
    return outcome, (time.perf_counter_ns() - t0) // 1000


def attacker_main(creds: Credentials, n: int, concurrency: int, go, done, result_q) -> None:
    """Child process: ``n`` failed logins, ``concurrency`` at a time, once ``go`` is set."""
    from collections import Counter
    from concurrent.futures import ThreadPoolExecutor

    from stratalog.bench.hist import LatencyRecorder

    go.wait()
    outcomes: Counter[str] = Counter()
    lat = LatencyRecorder()
    t0 = time.time()
    with ThreadPoolExecutor(concurrency) as pool:
        for outcome, us in pool.map(lambda i: one_bad_login(creds, i), range(n)):
            outcomes[outcome] += 1
            lat.add(us)
            done.value += 1
    result_q.put({"outcomes": dict(outcomes), "seconds": time.time() - t0, "hist": lat.encode()})


def run_auth_storm(
    w: Workload, target: Target, params: dict[str, Any], progress: Progress
) -> CaseResult:
    if not isinstance(target, _Secure):
        raise RuntimeError(f"workload {w.name} needs a secure target, not {target.kind}")
    fixed_rate(w, "the good client")
    creds = target.credentials()
    if creds.listener == "PLAINTEXT":
        raise RuntimeError(f"workload {w.name}: failed logins need a SASL listener")
    topics = topic_names(w)
    target.create_topics(topics, w.partitions)
    rss: dict[str, Any] = {"at_start": rss_mib(target.pid)}

    loads: dict[str, LoadResult] = {}
    rows: list[dict[str, Any]] = []

    def phase(name: str, seconds: float, stop_when: Callable[[], bool] | None = None) -> None:
        loads[name], row = steady_phase(w, target, topics, name, seconds, progress, stop_when)
        rows.append(row)

    phase("before", w.phase_duration_s)
    ctx = load_context()
    go, result_q = ctx.Event(), ctx.Queue()
    done = ctx.Value("q", 0, lock=False)
    attacker = ctx.Process(
        target=attacker_main,
        args=(creds, w.failed_logins, w.failed_login_concurrency, go, done, result_q),
        daemon=True,
    )
    start_process(attacker)
    samples: list[tuple[float, float]] = []
    label = f"{w.name} · {target.name} · failed logins"
    state: dict[str, float] = {}

    def storm_over() -> bool:
        now = time.time()
        if not go.is_set():
            rss["before_storm"] = rss_mib(target.pid)
            state["t0"] = now
            go.set()
        m = rss_mib(target.pid)
        if m is not None:
            samples.append((now - state["t0"], m))
        progress(label, done.value, 0, w.failed_logins)
        if done.value >= w.failed_logins or not attacker.is_alive():
            state.setdefault("t1", now)
            return True
        return False

    try:
        # The storm phase's good client runs until the attacker is done (at most
        # max_duration_s).
        phase("storm", w.max_duration_s, storm_over)
        attacker.join(timeout=120)
        got = result_q.get(timeout=30) if attacker.exitcode == 0 else None
    finally:
        go.set()
        if attacker.is_alive():
            attacker.kill()
            attacker.join(timeout=10)
    rss["after_storm"] = rss_mib(target.pid)
    phase("after", w.phase_duration_s)
    rss["at_end"] = rss_mib(target.pid)
    rss["peak_during"] = max((m for _t, m in samples), default=None)
    step = max(1, len(samples) // 200)

    res = result_from_load(w, target, loads["storm"], params)
    res.records = sum(x.acked for x in loads.values())
    errors = [e for x in loads.values() for e in x.errors]
    failed = sum(r["failed_sends"] for r in rows)
    storm: dict[str, Any] = {"logins": w.failed_logins, "concurrency": w.failed_login_concurrency}
    if got is not None:
        storm.update(
            outcomes=got["outcomes"],
            seconds=got["seconds"],
            logins_per_s=sum(got["outcomes"].values()) / got["seconds"] if got["seconds"] else 0,
            answer=hist.summary(hist.merge([got["hist"]])),
        )
    refused = (got or {}).get("outcomes", {}).get("refused", 0)
    base = rss.get("before_storm")
    res.extra.update(
        listener=creds.listener,
        target_rate=w.rate,
        phases=rows,
        storm=storm,
        rss_mib=rss,
        rss_timeline=[{"t": round(t, 2), "mib": round(m, 1)} for t, m in samples[::step]],
        rss_growth_mib=(max(rss["after_storm"], rss["peak_during"] or 0) - base)
        if base is not None and rss["after_storm"] is not None
        else None,
        rss_growth_end_mib=(rss["at_end"] - base)
        if base is not None and rss["at_end"] is not None
        else None,
        good_client_failed_sends=failed,
    )
    if errors or failed:
        res.ok = False
        res.error = ("; ".join(errors) or f"the good client lost {failed} records")[:500]
    elif refused < w.failed_logins:
        res.ok = False
        res.error = f"{refused} of {w.failed_logins} bad logins refused: {storm.get('outcomes')}"
    return res
