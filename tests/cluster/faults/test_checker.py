"""The checker against hand-made histories: each anomaly is found when it is there, and nothing
is reported when it is not (a timed-out send may be in the log or not; a failed one never)."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError

from stratalog.faults.checker import ANOMALIES, SAFETY, check
from stratalog.faults.history import History, load_history
from stratalog.faults.workload import outcome


class H:
    """A history built by hand, in the order the calls are made."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def add(self, process: Any, type_: str, f: str, **fields: Any) -> H:
        ev = {"index": len(self.events), "time": len(self.events) / 1000, "process": process,
              "type": type_, "f": f}  # fmt: skip
        ev.update({k: v for k, v in fields.items() if v is not None})
        self.events.append(ev)
        return self

    def invoke(self, proc: int, p: int, v: int) -> H:
        return self.add(proc, "invoke", "send", partition=p, value=v)

    def done(self, proc: int, p: int, v: int, offset: int | None = None, type_: str = "ok",
             error: str | None = None) -> H:  # fmt: skip
        return self.add(proc, type_, "send", partition=p, value=v, offset=offset, error=error)

    def send(self, proc: int, p: int, v: int, offset: int | None = None, type_: str = "ok") -> H:
        error = None if type_ == "ok" else ("_MSG_TIMED_OUT" if type_ == "info" else "INVALID")
        return self.invoke(proc, p, v).done(proc, p, v, offset, type_, error)

    def assign(self, proc: int, starts: list[list[int]]) -> H:
        return self.add(proc, "ok", "assign", value=starts)

    def subscribe(self, proc: int) -> H:
        return self.add(proc, "ok", "subscribe")

    def rebalance(self, proc: int, parts: list[int]) -> H:
        return self.add(proc, "ok", "rebalance", value=parts)

    def poll(self, proc: int, msgs: list[list[int]]) -> H:
        return self.add(proc, "invoke", "poll").add(proc, "ok", "poll", msgs=msgs)

    def final(self, p: int, msgs: list[list[int]], high: int | None = None,
              complete: bool = True) -> H:  # fmt: skip
        if high is None:
            high = (max(o for _p, o, _v in msgs) + 1) if msgs else 0
        return self.add("final", "ok" if complete else "info", "final-read", partition=p,
                        value={"high": high, "complete": complete}, msgs=msgs)  # fmt: skip

    def check(self) -> dict[str, Any]:
        return check(self.events)


def only(result: dict[str, Any], *anomalies: str) -> None:
    """Exactly ``anomalies`` (each at least once) and no other."""
    found = {a for a, n in result["counts"].items() if n}
    assert found == set(anomalies), result["anomalies"]


def clean() -> H:
    """Two producers, two partitions, an assign consumer, a subscriber, final reads."""
    h = H()
    h.send(0, 0, 1, 0).send(1, 1, 2, 0).send(0, 0, 3, 1).send(1, 1, 4, 1)
    h.assign(10, [[0, 0], [1, 0]]).poll(10, [[0, 0, 1], [1, 0, 2], [0, 1, 3]]).poll(10, [[1, 1, 4]])
    h.subscribe(11).rebalance(11, [0, 1]).poll(11, [[0, 1, 3], [1, 1, 4]])
    h.final(0, [[0, 0, 1], [0, 1, 3]]).final(1, [[1, 0, 2], [1, 1, 4]])
    return h


def test_a_clean_history_is_valid() -> None:
    r = clean().check()
    assert r["valid"] is True
    assert set(r["counts"]) == set(ANOMALIES)
    assert not any(r["counts"].values())
    assert r["stats"]["sends"] == {"invoked": 4, "ok": 4, "fail": 0, "info": 0, "pending": 0,
                                   "info_seen": 0}  # fmt: skip
    assert r["stats"]["final"]["complete"] == 2


def test_an_unknown_send_may_be_absent_or_present() -> None:
    h = H().send(0, 0, 1, 0).send(0, 0, 2, type_="info").send(0, 0, 3, type_="info")
    h.send(0, 0, 4, 2)
    h.final(0, [[0, 0, 1], [0, 1, 3], [0, 2, 4]])
    r = h.check()
    assert r["valid"] is True, r["anomalies"]
    assert r["stats"]["sends"]["info"] == 2 and r["stats"]["sends"]["info_seen"] == 1


def test_a_failed_send_never_read_is_fine() -> None:
    h = H().send(0, 0, 1, 0).send(0, 0, 2, type_="fail").final(0, [[0, 0, 1]])
    assert h.check()["valid"] is True


# -- each anomaly ----------------------------------------------------------------------------


def test_lost_write_acked_but_missing_from_a_complete_final_read() -> None:
    h = H().send(0, 0, 1, 0).send(0, 0, 2, 1).send(0, 0, 3, 2)
    h.final(0, [[0, 0, 1], [0, 2, 3]])
    r = h.check()
    only(r, "lost-write", "unseen", "poll-skip")  # the final read also skips offset 1
    assert r["valid"] is False
    assert r["anomalies"]["lost-write"][0]["value"] == 2
    assert r["anomalies"]["unseen"][0]["value"] == 2


def test_lost_write_when_the_log_is_cut_below_an_acked_offset() -> None:
    # The broker reports an end below the acknowledged offsets: a "complete" read that misses
    # them is still a loss (the checker does not trust the reported end).
    h = H().send(0, 0, 1, 0).send(0, 0, 2, 1).final(0, [[0, 0, 1]], high=1)
    r = h.check()
    only(r, "lost-write", "unseen")
    assert r["anomalies"]["lost-write"][0]["offset"] == 1


def test_lost_write_of_a_polled_value_even_when_its_send_was_unknown() -> None:
    h = H().send(0, 0, 1, type_="info").send(0, 0, 2, 1)
    h.assign(10, [[0, 0]]).poll(10, [[0, 0, 1], [0, 1, 2]])
    h.final(0, [[0, 1, 2]])
    r = h.check()
    assert r["counts"]["lost-write"] == 1 and r["anomalies"]["lost-write"][0]["value"] == 1
    assert r["anomalies"]["lost-write"][0]["polled"] is True


def test_lost_write_past_an_incomplete_final_read() -> None:
    # The final read did not finish, but it went past offset 1: value 2 is gone.
    h = H().send(0, 0, 1, 0).send(0, 0, 2, 1).send(0, 0, 3, 2).send(0, 0, 4, 3)
    h.final(0, [[0, 0, 1], [0, 2, 3]], high=4, complete=False)
    r = h.check()
    assert r["counts"]["lost-write"] == 1 and r["anomalies"]["lost-write"][0]["value"] == 2
    assert r["counts"]["incomplete-final-read"] == 1
    assert r["counts"]["unseen"] == 2  # 2 is lost; 4 may be beyond where the read stopped


def test_unseen_alone_leaves_the_run_unknown() -> None:
    h = H().send(0, 0, 1, 0).send(0, 0, 2, 1).final(0, [[0, 0, 1]], high=2, complete=False)
    r = h.check()
    only(r, "unseen", "incomplete-final-read")
    assert r["valid"] == "unknown"


def test_a_partition_never_read_at_the_end_is_incomplete() -> None:
    h = H().send(0, 0, 1, 0).send(0, 1, 2, 0).final(0, [[0, 0, 1]])
    r = h.check()
    only(r, "unseen", "incomplete-final-read")
    assert r["anomalies"]["incomplete-final-read"] == [
        {"partition": 1, "high": None, "read_to": None}
    ]


def test_duplicate_a_value_at_two_offsets() -> None:
    h = H().send(0, 0, 1, 0).send(0, 0, 2, 1)
    h.final(0, [[0, 0, 1], [0, 1, 2], [0, 2, 1]])
    r = h.check()
    assert r["counts"]["duplicate"] == 1
    assert r["anomalies"]["duplicate"][0] == {"value": 1, "at": [(0, 0), (0, 2)]}
    assert r["valid"] is False


def test_inconsistent_offset_two_values_at_one_offset_across_reads() -> None:
    h = H().send(0, 0, 1, type_="info").send(0, 0, 2, type_="info")
    h.assign(10, [[0, 0]]).poll(10, [[0, 0, 1]])
    h.final(0, [[0, 0, 2]])
    r = h.check()
    assert r["counts"]["inconsistent-offset"] == 1
    assert r["anomalies"]["inconsistent-offset"][0]["values"] == {"1": ["poll"], "2": ["final"]}


def test_inconsistent_offset_an_acked_offset_holding_another_value() -> None:
    h = H().send(0, 0, 1, 0).send(1, 0, 2, 0)  # two acks at one offset
    h.final(0, [[0, 0, 1], [0, 1, 2]])
    r = h.check()
    assert r["counts"]["inconsistent-offset"] >= 1
    assert {"partition": 0, "offset": 0, "values": {"1": ["ack", "final"], "2": ["ack"]}} in r[
        "anomalies"
    ]["inconsistent-offset"]
    assert r["valid"] is False


def test_inconsistent_offset_a_value_read_elsewhere_than_acked() -> None:
    h = H().send(0, 0, 1, 0).send(0, 0, 2, 5)
    h.final(0, [[0, 0, 1], [0, 1, 2]])
    r = h.check()
    assert {"value": 2, "partition": 0, "acked_offset": 5, "read_at": [(0, 1)]} in r["anomalies"][
        "inconsistent-offset"
    ]


def test_nonmonotonic_send() -> None:
    h = H()
    h.invoke(0, 0, 1).invoke(0, 0, 2)  # sent 1 then 2 ...
    h.done(0, 0, 2, 0).done(0, 0, 1, 1)  # ... but 2 landed first
    h.final(0, [[0, 0, 2], [0, 1, 1]])
    r = h.check()
    only(r, "nonmonotonic-send")
    assert r["anomalies"]["nonmonotonic-send"][0] == {
        "process": 0, "partition": 0, "values": [1, 2], "offsets": [1, 0]
    }  # fmt: skip


def test_sends_of_different_processes_or_partitions_may_interleave() -> None:
    h = H()
    h.invoke(0, 0, 1).invoke(1, 0, 2).invoke(0, 1, 3)
    h.done(1, 0, 2, 0).done(0, 0, 1, 1).done(0, 1, 3, 0)
    h.final(0, [[0, 0, 2], [0, 1, 1]]).final(1, [[1, 0, 3]])
    assert h.check()["valid"] is True


def test_nonmonotonic_poll_backwards_and_repeated() -> None:
    base = H().send(0, 0, 1, 0).send(0, 0, 2, 1).send(0, 0, 3, 2)
    back = H()
    back.events = list(base.events)
    back.assign(10, [[0, 0]]).poll(10, [[0, 0, 1], [0, 1, 2], [0, 2, 3]]).poll(10, [[0, 1, 2]])
    back.final(0, [[0, 0, 1], [0, 1, 2], [0, 2, 3]])
    r = back.check()
    only(r, "nonmonotonic-poll")
    assert r["anomalies"]["nonmonotonic-poll"][0]["offsets"] == [2, 1]
    again = H()
    again.events = list(base.events)
    again.assign(10, [[0, 0]]).poll(10, [[0, 0, 1], [0, 0, 1]])
    again.final(0, [[0, 0, 1], [0, 1, 2], [0, 2, 3]])
    only(again.check(), "nonmonotonic-poll")


def test_nonmonotonic_poll_before_the_assigned_start() -> None:
    h = H().send(0, 0, 1, 0).send(0, 0, 2, 1)
    h.assign(10, [[0, 1]]).poll(10, [[0, 0, 1], [0, 1, 2]])
    h.final(0, [[0, 0, 1], [0, 1, 2]])
    only(h.check(), "nonmonotonic-poll")


def test_poll_skip_over_a_known_offset() -> None:
    h = H().send(0, 0, 1, 0).send(0, 0, 2, 1).send(0, 0, 3, 2)
    h.assign(10, [[0, 0]]).poll(10, [[0, 0, 1]]).poll(10, [[0, 2, 3]])
    h.final(0, [[0, 0, 1], [0, 1, 2], [0, 2, 3]])
    r = h.check()
    only(r, "poll-skip")
    assert r["anomalies"]["poll-skip"][0]["skipped"] == [1]


def test_poll_skip_from_the_assigned_start() -> None:
    h = H().send(0, 0, 1, 0).send(0, 0, 2, 1)
    h.assign(10, [[0, 0]]).poll(10, [[0, 1, 2]])
    h.final(0, [[0, 0, 1], [0, 1, 2]])
    r = h.check()
    only(r, "poll-skip")
    assert r["anomalies"]["poll-skip"][0]["from"] == "start 0"


def test_no_skip_across_sessions_and_gaps_no_one_saw() -> None:
    h = H().send(0, 0, 1, 0).send(0, 0, 2, 1).send(0, 0, 3, 5)  # 2..4: never seen by anyone
    h.assign(10, [[0, 0]]).poll(10, [[0, 0, 1]])
    h.assign(10, [[0, 5]]).poll(10, [[0, 5, 3]])  # a new session starts where it says
    h.assign(11, [[0, -1]]).poll(11, [[0, 5, 3]])  # "the end": no anchor
    h.final(0, [[0, 0, 1], [0, 1, 2], [0, 5, 3]])
    assert h.check()["valid"] is True


def test_a_rebalance_starts_a_new_session() -> None:
    h = H().send(0, 0, 1, 0).send(0, 0, 2, 1)
    h.subscribe(11).rebalance(11, [0]).poll(11, [[0, 0, 1], [0, 1, 2]])
    h.rebalance(11, [0]).poll(11, [[0, 1, 2]])  # from the committed offset again: fine
    h.final(0, [[0, 0, 1], [0, 1, 2]])
    assert h.check()["valid"] is True
    h.poll(11, [[0, 0, 1]])  # but within one generation it must not go back
    only(h.check(), "nonmonotonic-poll")


def test_g1a_a_definitely_failed_send_is_read() -> None:
    h = H().send(0, 0, 1, 0).send(0, 0, 2, type_="fail")
    h.final(0, [[0, 0, 1], [0, 1, 2]])
    r = h.check()
    only(r, "g1a")
    assert r["anomalies"]["g1a"][0]["value"] == 2


def test_phantom_never_sent_or_in_another_partition() -> None:
    h = H().send(0, 0, 1, 0).send(0, 1, 2, type_="info")
    h.final(0, [[0, 0, 1], [0, 1, 99], [0, 2, 2]]).final(1, [])
    r = h.check()
    assert r["counts"]["phantom"] == 2
    assert {"value": 99, "partition": 0, "offset": 1, "why": "never sent"} in r["anomalies"][
        "phantom"
    ]
    assert {"value": 2, "partition": 0, "offset": 2, "sent_to": 1} in r["anomalies"]["phantom"]


# -- mutations of a larger, clean simulated history ------------------------------------------


def simulate(seed: int, sends: int = 300, partitions: int = 3) -> H:
    """A clean history as a correct system would produce it: pipelined sends of four
    producers, some of them timed out (and then in the log or not) or refused, assign
    consumers that restart, a subscriber, and final reads."""
    rng = random.Random(seed)
    h = H()
    log: dict[int, list[int]] = {p: [] for p in range(partitions)}
    inflight: list[tuple[int, int, int, str]] = []
    for v in range(sends):
        proc, p = rng.randrange(4), rng.randrange(partitions)
        h.invoke(proc, p, v)
        fate = rng.choices(["ok", "info-in", "info-out", "fail"], [90, 4, 4, 2])[0]
        inflight.append((proc, p, v, fate))
        if len(inflight) > 5 or v == sends - 1:
            for proc, p, v, fate in inflight:  # in send order: per partition, in order
                if fate in ("ok", "info-in"):
                    log[p].append(v)
                if fate == "ok":
                    h.done(proc, p, v, len(log[p]) - 1)
                elif fate == "fail":
                    h.done(proc, p, v, None, "fail", "INVALID_RECORD")
                else:
                    h.done(proc, p, v, None, "info", "_MSG_TIMED_OUT")
            inflight.clear()
        if rng.random() < 0.1:
            proc = 100 + v
            start = {p: rng.randint(0, len(log[p])) for p in range(partitions)}
            h.assign(proc, [[p, s] for p, s in start.items()])
            msgs = [
                [p, o, log[p][o]] for p in range(partitions) for o in range(start[p], len(log[p]))
            ]
            cut = rng.randint(0, len(msgs))
            h.poll(proc, msgs[:cut]).poll(proc, msgs[cut:])
    h.subscribe(7).rebalance(7, list(range(partitions)))
    h.poll(7, [[p, o, v] for p in range(partitions) for o, v in enumerate(log[p])])
    for p in range(partitions):
        h.final(p, [[p, o, v] for o, v in enumerate(log[p])])
    return h


def _final(h: H, p: int) -> dict[str, Any]:
    return next(e for e in h.events if e["f"] == "final-read" and e["partition"] == p)


def _acked(h: H) -> list[dict[str, Any]]:
    return [e for e in h.events if e["f"] == "send" and e["type"] == "ok"]


def mutate(h: H, how: str, rng: random.Random) -> str:
    """Break ``h`` in one way; returns the anomaly the checker must now find."""
    fin = _final(h, 0)
    msgs = fin["msgs"]
    if how == "drop-final":  # an acked record vanishes from the log
        acked = {e["value"] for e in _acked(h) if e["partition"] == 0}
        i = rng.choice([i for i, m in enumerate(msgs) if m[2] in acked])
        del msgs[i]
        return "lost-write"
    if how == "truncate-final":  # the log's tail is gone and the broker says so
        del msgs[len(msgs) // 2 :]
        fin["value"]["high"] = len(msgs)
        return "lost-write"
    if how == "duplicate-final":
        msgs.append([0, len(msgs), msgs[0][2]])
        return "duplicate"
    if how == "overwrite-poll":  # a poll saw another value at an offset
        polls = [e for e in h.events if e["f"] == "poll" and e["type"] == "ok" and e["msgs"]]
        ev = rng.choice(polls)
        m = rng.choice(ev["msgs"])
        m[2] = next(e["value"] for e in _acked(h) if e["value"] != m[2])
        return "inconsistent-offset"
    if how == "swap-acks":  # two acks of one producer in one partition, in the wrong order
        by: dict[tuple[Any, int], list[dict[str, Any]]] = {}
        for e in _acked(h):
            by.setdefault((e["process"], e["partition"]), []).append(e)
        pair = rng.choice([evs for evs in by.values() if len(evs) >= 2])
        a, b = pair[0], pair[1]
        a["offset"], b["offset"] = b["offset"], a["offset"]
        return "nonmonotonic-send"
    if how == "fail-a-read-send":
        acked = {e["value"] for e in _acked(h) if e["partition"] == 0}
        v = rng.choice([m[2] for m in msgs if m[2] in acked])
        for e in h.events:
            if e["f"] == "send" and e["value"] == v and e["type"] == "ok":
                e["type"], e["error"] = "fail", "INVALID_RECORD"
                del e["offset"]
        return "g1a"
    if how in ("skip-in-poll", "reorder-poll"):
        subscriber = next(e for e in h.events if e["f"] == "poll" and e["process"] == 7
                          and e["type"] == "ok")  # fmt: skip
        m = subscriber["msgs"]
        # A record between two of the same partition (not a session's first read of one).
        i = rng.choice([i for i in range(1, len(m) - 1) if m[i - 1][0] == m[i][0] == m[i + 1][0]])
        if how == "skip-in-poll":
            del m[i]
            return "poll-skip"
        m[i], m[i + 1] = m[i + 1], m[i]
        return "nonmonotonic-poll"
    if how == "phantom":
        msgs.append([0, len(msgs), 10**9])
        return "phantom"
    raise AssertionError(how)


MUTATIONS = ["drop-final", "truncate-final", "duplicate-final", "overwrite-poll", "swap-acks",
             "fail-a-read-send", "skip-in-poll", "reorder-poll", "phantom"]  # fmt: skip


@pytest.mark.parametrize("seed", range(5))
def test_simulated_histories_are_clean(seed: int) -> None:
    r = simulate(seed).check()
    assert r["valid"] is True, r["anomalies"]
    assert r["stats"]["sends"]["info"] > 0 and r["stats"]["sends"]["fail"] > 0


@pytest.mark.parametrize("how", MUTATIONS)
@pytest.mark.parametrize("seed", range(3))
def test_each_mutation_is_caught(how: str, seed: int) -> None:
    h = simulate(seed)
    expected = mutate(h, how, random.Random(seed))
    r = h.check()
    assert expected in SAFETY
    assert r["counts"][expected] >= 1, (how, r["counts"])
    assert r["valid"] is False


# -- the history file and the send outcomes ----------------------------------------------------


def test_history_from_many_threads_is_numbered_in_one_order(tmp_path) -> None:
    h = History(tmp_path / "h.jsonl")

    def sends(i: int) -> None:
        for j in range(500):
            h.add(i, "invoke", "send", value=i * 1000 + j)

    threads = [threading.Thread(target=sends, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    h.sync()
    assert len(h.events) == 4 * 500
    h.add(9, "invoke", "send", value=-1)
    h.close()
    h.add(9, "invoke", "send", value=-2)  # after close: dropped, never blocks
    assert [e["index"] for e in h.events] == list(range(4 * 500 + 1))
    for i in range(4):  # each thread's events in its own order
        mine = [e["value"] for e in h.events if e["process"] == i]
        assert mine == sorted(mine)
    assert load_history(tmp_path / "h.jsonl") == h.events


def test_the_history_round_trips_through_jsonl(tmp_path) -> None:
    h = History(tmp_path / "history.jsonl")
    for ev in simulate(1).events:
        fields = {k: v for k, v in ev.items() if k not in ("index", "time", "process", "type", "f")}
        h.add(ev["process"], ev["type"], ev["f"], **fields)
    h.close()
    with open(tmp_path / "history.jsonl", "a") as fh:
        fh.write('{"index": 99999, "torn')  # a writer killed mid-line
    loaded = load_history(tmp_path / "history.jsonl")
    assert len(loaded) == len(h.events)
    assert check(loaded) == check(h.events)
    assert check(loaded)["valid"] is True


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        (KafkaError(KafkaError._MSG_TIMED_OUT), "info"),
        (KafkaError(KafkaError.REQUEST_TIMED_OUT), "info"),
        (KafkaError(KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND), "info"),
        (KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), "info"),
        (KafkaError(KafkaError._PURGE_QUEUE), "info"),  # a retry may already be in the log
        (KafkaError(KafkaError._PURGE_INFLIGHT), "info"),
        (KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, fatal=True), "info"),
        (KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), "fail"),
        (KafkaError(KafkaError.INVALID_RECORD), "fail"),
        (KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "fail"),
    ],
)
def test_only_definite_errors_fail_a_send(err: KafkaError, expected: str) -> None:
    assert outcome(err) == expected


def test_latency_and_recovery_per_fault_from_the_history_alone() -> None:
    h = H()
    h.events.append({"index": 0, "time": 0.0, "process": 0, "type": "invoke", "f": "send",
                     "partition": 0, "value": 1})  # fmt: skip
    h.events.append({"index": 1, "time": 0.1, "process": 0, "type": "ok", "f": "send",
                     "partition": 0, "value": 1, "offset": 0})  # fmt: skip
    h.events.append({"index": 2, "time": 1.0, "process": "nemesis", "type": "invoke",
                     "f": "kill", "value": {"nodes": ["b-1"], "leads": {"b-1": [0]}}})  # fmt: skip
    h.events.append({"index": 3, "time": 1.5, "process": 0, "type": "invoke", "f": "send",
                     "partition": 0, "value": 2})  # fmt: skip
    h.events.append({"index": 4, "time": 4.0, "process": 0, "type": "ok", "f": "send",
                     "partition": 0, "value": 2, "offset": 1})  # fmt: skip
    h.final(0, [[0, 0, 1], [0, 1, 2]])
    r = h.check()
    assert r["valid"] is True
    assert r["stats"]["latency_ms"] == {"p50": 2500.0, "p99": 2500.0, "max": 2500.0}
    assert r["stats"]["recovery"] == [
        {"f": "kill", "time": 1.0, "nodes": ["b-1"], "partitions": [0], "first_ok_s": 3.0}
    ]
    # Sends went on until 1.5 s; the partition acknowledged nothing after 0.1 s until then.
    assert r["stats"]["longest_gap"] == {"seconds": 1.4, "partition": 0, "from": 0.1, "to": 1.5}
