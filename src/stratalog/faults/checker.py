"""The checker: what a history says about the system, trusting nothing the system reported
except what the history recorded a client seeing.

A port of the ideas in jepsen.tests.kafka (our own code). Inputs are the history's events
(:mod:`stratalog.faults.history`); the log of each partition is reconstructed from every read
(polls and the final reads) and every acknowledged offset. Anomalies:

``lost-write``
    a value acknowledged (``ok``) or seen by a poll is missing from the final reads of its
    partition, although that final read completed (reached the end the broker reported) or went
    past the value's offset.
``unseen``
    an acknowledged value that no read ever returned (after the final reads, a superset of the
    acknowledged lost writes; it also counts values whose partition could not be read to its
    end).
``duplicate``
    a value read at two different offsets.
``inconsistent-offset``
    two values at one offset (across polls, final reads and acknowledgements), or a value
    acknowledged at one offset and read at another.
``nonmonotonic-send``
    one producer's acknowledged offsets in one partition do not increase in send order.
``nonmonotonic-poll``
    within one consumer session (an ``assign``, a ``rebalance``, a final read), a partition's
    offsets go backwards or repeat, or start before the assigned position.
``poll-skip``
    within one consumer session, consecutive reads of a partition jump over an offset that some
    read or acknowledgement shows to exist (or the first read jumps over the assigned start).
``g1a``
    a value whose send definitely failed (``fail``) is read (an aborted read).
``phantom``
    a value read that was never sent, or read in another partition than it was sent to.
``incomplete-final-read``
    a partition's final read did not reach the end (a liveness problem: lost writes there
    cannot be decided, so the run is ``unknown`` rather than valid).

:func:`check` returns ``{"valid": True | False | "unknown", "counts": {anomaly: n},
"anomalies": {anomaly: [examples]}, "stats": {...}}``; the stats count sends by outcome, reads,
final reads, nemesis operations and errors, and give acknowledged sends' latency quantiles and,
per fault, the time until the partitions it hit acknowledged a new send (``recovery``, None
when they never did), and the longest time any partition acknowledged nothing
(``longest_gap``): liveness, which the anomalies above do not judge.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stratalog.faults.history import FAIL, INFO, INVOKE, OK, Event

SAFETY = (
    "lost-write",
    "duplicate",
    "inconsistent-offset",
    "nonmonotonic-send",
    "nonmonotonic-poll",
    "poll-skip",
    "g1a",
    "phantom",
)
# Every anomaly, in report order; ``unseen`` and ``incomplete-final-read`` alone leave a run
# "unknown" (they may be lost writes, or only reads that never got there).
ANOMALIES = (
    "lost-write",
    "unseen",
    "duplicate",
    "inconsistent-offset",
    "nonmonotonic-send",
    "nonmonotonic-poll",
    "poll-skip",
    "g1a",
    "phantom",
    "incomplete-final-read",
)


@dataclass
class _Send:
    process: Any
    partition: int
    index: int
    status: str | None = None  # ok | fail | info | None (no completion recorded)
    offset: int = -1
    error: str | None = None
    invoked_at: float = 0.0
    done_at: float | None = None


@dataclass(frozen=True)
class _Read:
    source: str  # "poll" | "final"
    session: Any  # the consumer session the read belongs to (None: no session known)
    partition: int
    offset: int
    value: Any
    index: int  # the event's index in the history


@dataclass
class _Session:
    key: tuple
    mode: str  # assign | subscribe | final
    anchors: dict[int, int] = field(default_factory=dict)  # partition -> assigned start


def _msgs(ev: Event) -> list[tuple[int, int, Any]]:
    return [(int(p), int(o), v) for p, o, v in ev.get("msgs") or ()]


def check(events: Iterable[Event], *, examples: int = 20) -> dict[str, Any]:
    events = sorted(events, key=lambda e: e["index"])
    sends: dict[Any, _Send] = {}
    send_order: dict[tuple[Any, int], list[Any]] = defaultdict(list)
    reads: list[_Read] = []
    sessions: dict[Any, _Session] = {}  # process -> its current session
    final: dict[int, dict[str, Any]] = {}
    nemesis: Counter[str] = Counter()
    faults: list[Event] = []
    polls = Counter[str]()
    errors: Counter[str] = Counter()

    for ev in events:
        f, typ, proc = ev["f"], ev["type"], ev["process"]
        if f == "send":
            v = ev["value"]
            if typ == INVOKE:
                sends[v] = _Send(proc, int(ev["partition"]), ev["index"], invoked_at=ev["time"])
                send_order[(proc, int(ev["partition"]))].append(v)
                continue
            s = sends.get(v)
            if s is None:  # a completion without invocation: keep it, it is still evidence
                s = sends[v] = _Send(proc, int(ev.get("partition", -1)), ev["index"])
            if s.status == OK:
                continue  # an acknowledgement is never taken back by a later report
            s.status = typ
            s.done_at = ev["time"]
            if typ == OK:
                s.offset = int(ev.get("offset", -1))
            else:
                s.error = ev.get("error")
                errors[f"{typ}: {s.error}"] += 1
        elif f == "assign" and typ == OK:
            anchors = {int(p): int(o) for p, o in ev.get("value") or ()}
            sessions[proc] = _Session(("assign", proc, ev["index"]), "assign", anchors)
        elif f in ("subscribe", "rebalance") and typ == OK:
            sessions[proc] = _Session((f, proc, ev["index"]), "subscribe")
        elif f == "poll" and typ == OK:
            sess = sessions.get(proc)
            polls[sess.mode if sess else "unknown"] += 1
            for p, o, v in _msgs(ev):
                reads.append(_Read("poll", sess, p, o, v, ev["index"]))
        elif f == "final-read" and typ in (OK, INFO):
            p = int(ev["partition"])
            meta = ev.get("value") or {}
            sess = _Session(("final", p, ev["index"]), "final", {p: 0})
            msgs = _msgs(ev)
            final[p] = {
                "high": meta.get("high"),
                "complete": bool(meta.get("complete")) and typ == OK,
                "values": {v for _p, _o, v in msgs},
                "max_offset": max((o for _p, o, _v in msgs), default=-1),
                "records": len(msgs),
            }
            for _p, o, v in msgs:
                reads.append(_Read("final", sess, _p, o, v, ev["index"]))
        elif proc == "nemesis" and typ == INVOKE:
            nemesis[f] += 1
            if f in ("kill", "pause"):
                faults.append(ev)

    found: dict[str, list[dict[str, Any]]] = {a: [] for a in ANOMALIES}

    # -- the log as every observation shows it --------------------------------------------------
    at_offset: dict[tuple[int, int], dict[Any, set[str]]] = defaultdict(lambda: defaultdict(set))
    read_offsets: dict[Any, set[tuple[int, int]]] = defaultdict(set)
    known: dict[int, set[int]] = defaultdict(set)
    for r in reads:
        at_offset[(r.partition, r.offset)][r.value].add(r.source)
        read_offsets[r.value].add((r.partition, r.offset))
        known[r.partition].add(r.offset)
    for v, s in sends.items():
        if s.status == OK and s.offset >= 0:
            at_offset[(s.partition, s.offset)][v].add("ack")
            known[s.partition].add(s.offset)
    order = {p: sorted(offs) for p, offs in known.items()}

    # -- phantom: read but never sent, or read elsewhere -----------------------------------------
    for v, places in read_offsets.items():
        s = sends.get(v)
        for p, o in sorted(places):
            if s is None:
                found["phantom"].append(
                    {"value": v, "partition": p, "offset": o, "why": "never sent"}
                )
            elif s.partition != p:
                found["phantom"].append(
                    {"value": v, "partition": p, "offset": o, "sent_to": s.partition}
                )

    # -- duplicates and inconsistent offsets -----------------------------------------------------
    for v, places in read_offsets.items():
        if len(places) > 1:
            found["duplicate"].append({"value": v, "at": sorted(places)})
    for (p, o), values in sorted(at_offset.items()):
        if len(values) > 1:
            found["inconsistent-offset"].append(
                {
                    "partition": p,
                    "offset": o,
                    "values": {str(v): sorted(src) for v, src in values.items()},
                }
            )
    for v, s in sends.items():
        if s.status == OK and s.offset >= 0 and read_offsets.get(v):
            elsewhere = sorted(po for po in read_offsets[v] if po != (s.partition, s.offset))
            if elsewhere and (s.partition, s.offset) not in read_offsets[v]:
                found["inconsistent-offset"].append(
                    {
                        "value": v,
                        "partition": s.partition,
                        "acked_offset": s.offset,
                        "read_at": elsewhere,
                    }
                )

    # -- lost writes and unseen values -----------------------------------------------------------
    polled: dict[Any, int] = {}
    for r in reads:
        if r.source == "poll":
            polled.setdefault(r.value, r.offset)
    candidates = {v for v, s in sends.items() if s.status == OK} | set(polled)
    for v in sorted(candidates):
        s = sends.get(v)
        p = s.partition if s is not None else None
        if p is None or p < 0:
            continue  # a phantom already
        offset = (
            s.offset if s is not None and s.status == OK and s.offset >= 0 else polled.get(v, -1)
        )
        fr = final.get(p)
        if fr is None or v in fr["values"]:
            continue
        if fr["complete"] or (offset >= 0 and fr["max_offset"] > offset):
            found["lost-write"].append(
                {
                    "value": v,
                    "partition": p,
                    "offset": offset,
                    "acked": s is not None and s.status == OK,
                    "polled": v in polled,
                    "final_high": fr["high"],
                    "final_max_offset": fr["max_offset"],
                }
            )
    for v, s in sends.items():
        if s.status == OK and not read_offsets.get(v):
            found["unseen"].append({"value": v, "partition": s.partition, "offset": s.offset})

    # -- aborted reads ---------------------------------------------------------------------------
    for v, s in sends.items():
        if s.status == FAIL and read_offsets.get(v):
            found["g1a"].append({"value": v, "error": s.error, "read_at": sorted(read_offsets[v])})

    # -- nonmonotonic sends ----------------------------------------------------------------------
    for (proc, p), values in send_order.items():
        prev: tuple[Any, int] | None = None
        for v in values:
            s = sends[v]
            if s.status != OK or s.offset < 0:
                continue
            if prev is not None and s.offset <= prev[1]:
                found["nonmonotonic-send"].append(
                    {
                        "process": proc,
                        "partition": p,
                        "values": [prev[0], v],
                        "offsets": [prev[1], s.offset],
                    }
                )
            prev = (v, s.offset)

    # -- polls: nonmonotonic and skipping, per session and partition -----------------------------
    by_session: dict[tuple, list[_Read]] = defaultdict(list)
    session_of: dict[tuple, _Session] = {}
    for r in reads:
        if r.session is None:
            continue
        k = (r.session.key, r.partition)
        by_session[k].append(r)
        session_of[k] = r.session
    for k, rs in by_session.items():
        sess = session_of[k]
        p = k[1]
        offs = order.get(p, [])
        start = sess.anchors.get(p, -1)
        prev_off = start - 1 if start >= 0 else None
        prev_is_read = False
        for r in rs:  # reads are in history order, and within a poll in the consumer's order
            if prev_off is not None:
                if r.offset <= prev_off:
                    found["nonmonotonic-poll"].append(
                        {
                            "mode": sess.mode,
                            "session": list(sess.key),
                            "partition": p,
                            "offsets": [prev_off if prev_is_read else f"start {start}", r.offset],
                            "value": r.value,
                        }
                    )
                else:
                    between = offs[
                        bisect.bisect_right(offs, prev_off) : bisect.bisect_left(offs, r.offset)
                    ]
                    if between:
                        found["poll-skip"].append(
                            {
                                "mode": sess.mode,
                                "session": list(sess.key),
                                "partition": p,
                                "from": prev_off if prev_is_read else f"start {start}",
                                "to": r.offset,
                                "skipped": between[:10],
                                "skipped_count": len(between),
                            }
                        )
            # Follow the consumer wherever it went, so one jump back is one anomaly.
            prev_off = r.offset
            prev_is_read = True

    # -- final reads that did not finish -----------------------------------------------------------
    for p, fr in sorted(final.items()):
        if not fr["complete"]:
            found["incomplete-final-read"].append(
                {"partition": p, "high": fr["high"], "read_to": fr["max_offset"]}
            )
    send_partitions = {s.partition for s in sends.values() if s.partition >= 0}
    for p in sorted(send_partitions - set(final)):
        found["incomplete-final-read"].append({"partition": p, "high": None, "read_to": None})

    counts = {a: len(found[a]) for a in ANOMALIES}
    if any(counts[a] for a in SAFETY):
        valid: bool | str = False
    elif counts["unseen"] or counts["incomplete-final-read"]:
        valid = "unknown"
    else:
        valid = True

    status = Counter(s.status or "pending" for s in sends.values())
    info_values = {v for v, s in sends.items() if s.status == INFO}
    stats = {
        "sends": {
            "invoked": len(sends),
            "ok": status[OK],
            "fail": status[FAIL],
            "info": status[INFO],
            "pending": status["pending"],
            "info_seen": sum(1 for v in info_values if read_offsets.get(v)),
        },
        "reads": {
            "polls": dict(polls),
            "poll_records": sum(1 for r in reads if r.source == "poll"),
            "final_records": sum(1 for r in reads if r.source == "final"),
            "distinct_values": len(read_offsets),
        },
        "final": {
            "partitions": len(final),
            "complete": sum(1 for fr in final.values() if fr["complete"]),
            "high": {str(p): fr["high"] for p, fr in sorted(final.items())},
        },
        "nemesis": dict(nemesis),
        "latency_ms": _latency(sends),
        "recovery": _recovery(sends, faults),
        "longest_gap": _longest_gap(sends),
        "errors": dict(errors.most_common(10)),
    }
    return {
        "valid": valid,
        "counts": counts,
        "anomalies": {a: found[a][:examples] for a in ANOMALIES if found[a]},
        "stats": stats,
    }


def _latency(sends: dict[Any, _Send]) -> dict[str, float]:
    """Acknowledged sends' latency (invoke to ok): p50, p99, max in milliseconds."""
    lat = sorted(
        s.done_at - s.invoked_at for s in sends.values() if s.status == OK and s.done_at is not None
    )
    if not lat:
        return {}

    def q(x: float) -> float:
        return round(1000 * lat[min(len(lat) - 1, int(x * len(lat)))], 1)

    return {"p50": q(0.5), "p99": q(0.99), "max": round(1000 * lat[-1], 1)}


def _longest_gap(sends: dict[Any, _Send]) -> dict[str, Any]:
    """The longest time a partition acknowledged no send while the workload was sending (from
    the first send to the last one invoked): the worst unavailability of the run."""
    invoked = [s.invoked_at for s in sends.values()]
    if not invoked:
        return {}
    start, end = min(invoked), max(invoked)
    acks: dict[int, list[float]] = defaultdict(list)
    for s in sends.values():
        if s.status == OK and s.done_at is not None:
            acks[s.partition].append(s.done_at)
    partitions = {s.partition for s in sends.values()}
    worst: dict[str, Any] = {"seconds": 0.0}
    for p in sorted(partitions):
        times = [start, *sorted(t for t in acks.get(p, []) if t <= end), end]
        for a, b in itertools.pairwise(times):
            if b - a > worst["seconds"]:
                worst = {"seconds": round(b - a, 3), "partition": p, "from": a, "to": b}
    return worst


def _recovery(sends: dict[Any, _Send], faults: list[Event]) -> list[dict[str, Any]]:
    """For each kill or pause: seconds from it until a send invoked after it was acknowledged,
    in the slowest of the partitions its victims led (of every partition, for the
    coordinator). A rough unavailability per fault, from the history alone."""
    per: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for s in sends.values():
        if s.status == OK and s.done_at is not None:
            per[s.partition].append((s.invoked_at, s.done_at))
    suffix_min: dict[int, tuple[list[float], list[float]]] = {}
    for p, items in per.items():
        items.sort()
        mins = [0.0] * len(items)
        low = float("inf")
        for i in range(len(items) - 1, -1, -1):
            low = min(low, items[i][1])
            mins[i] = low
        suffix_min[p] = ([t for t, _d in items], mins)
    out = []
    for ev in faults:
        value = ev.get("value") or {}
        leads = value.get("leads") or {}
        parts = sorted({int(p) for ps in leads.values() for p in ps}) if leads else sorted(per)
        t = ev["time"]
        firsts = []
        for p in parts:
            if p not in suffix_min:
                continue
            invoked, mins = suffix_min[p]
            i = bisect.bisect_left(invoked, t)
            if i < len(invoked):
                firsts.append(mins[i] - t)
        out.append(
            {
                "f": ev["f"],
                "time": t,
                "nodes": value.get("nodes"),
                "partitions": parts,
                "first_ok_s": round(max(firsts), 3) if firsts else None,
            }
        )
    return out
