"""The nemesis: a seeded schedule of process and network faults with fault-free periods, then a
heal.

Faults (each to one process, recorded in the history with the PIDs it hit):

``kill1``
    ``kill -9`` of one broker - a partition leader when the metadata names one - restarted after
    0-5 s (``restart_delay``).
``kill2``
    ``kill -9`` of two brokers (the first a leader), both restarted after 0-5 s.
``pause1``
    ``SIGSTOP`` of one leader for ``pause`` seconds (5 s: past Stratalog's 3 s lease), then
    ``SIGCONT``.
``coord-kill``
    ``kill -9`` of the coordinator (etcd; on Kafka the active KRaft controller), restarted after
    0-5 s.
``coord-pause``
    ``SIGSTOP`` of the coordinator for ``pause`` seconds, then ``SIGCONT``.
``ctl-pause``
    ``SIGSTOP`` of the broker the metadata names controller, for ``pause`` seconds: the one
    that would move a paused leader's logs is itself away (on Kafka in combined mode, the
    active controller's broker).
``etcd-cut1``
    One leader's link to etcd cut for ``cut`` seconds (6 s: past its 3 s lease), while it still
    serves clients and replicates: the zombie leader, deposed in etcd without knowing it.
``isolate1``
    One leader cut from the other brokers' replication traffic, both ways, for ``cut`` seconds,
    while it still reaches etcd and clients.

Network cuts go through the target's fault proxies (``cut_mode``: ``blackhole``, silence as in
a real partition, or ``refuse``, resets); they are recorded as ``cut`` and ``reconnect``.

The schedule waits ``quiet_start`` seconds, then runs one fault at a time - each to its end,
restart included - with a fault-free gap of ``gap`` seconds after each. ``fixed`` runs the
listed faults once in order (a test's mix); otherwise each fault is drawn at random from the
list. :meth:`Nemesis.heal` reconnects what is cut, then resumes and restarts whatever is still
down (the coordinator first).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from stratalog.faults.history import History
from stratalog.faults.proxy import MODES, Mode
from stratalog.faults.targets import Target

FAULTS = ("kill1", "kill2", "pause1", "coord-kill", "coord-pause")
PAUSES = frozenset({"pause1", "coord-pause", "ctl-pause"})
CUTS = {"etcd-cut1": "etcd", "isolate1": "replication"}  # fault -> the link it cuts
# The default mix keeps to process faults that every target has (cuts need proxies).
KNOWN = (*FAULTS, "ctl-pause", *CUTS)


@dataclass
class NemesisConfig:
    faults: tuple[str, ...] = FAULTS
    fixed: bool = False
    quiet_start: float = 5.0
    gap: tuple[float, float] = (5.0, 15.0)
    restart_delay: tuple[float, float] = (0.0, 5.0)
    pause: tuple[float, float] = (5.0, 5.0)
    cut: tuple[float, float] = (6.0, 6.0)
    cut_mode: Mode = "blackhole"
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(KNOWN)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {', '.join(KNOWN)}")
        if self.cut_mode not in MODES:
            raise ValueError(f"unknown cut mode {self.cut_mode!r}: {' or '.join(MODES)}")


class Nemesis(threading.Thread):
    """Runs the schedule against ``target`` until :meth:`stop` (the fault under way finishes,
    restart included)."""

    def __init__(self, target: Target, history: History, config: NemesisConfig, topic: str):
        super().__init__(name="nemesis", daemon=True)
        self.target = target
        self.history = history
        self.cfg = config
        self.topic = topic
        self.rng = random.Random(config.seed)
        self._halt = threading.Event()
        self.down: set[str] = set()  # killed and not yet restarted
        self.paused: set[str] = set()
        self.cut: set[tuple[str, str]] = set()  # (node, link) partitioned and not reconnected
        self.applied: list[str] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()  # the schedule and heal() never act at once

    def stop(self) -> None:
        self._halt.set()

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless stopped; True when the sleep ran its course."""
        return not self._halt.wait(seconds)

    def run(self) -> None:
        if not self._sleep(self.cfg.quiet_start):
            return
        plan = list(self.cfg.faults)
        while not self._halt.is_set():
            if self.cfg.fixed:
                if not plan:
                    return
                fault = plan.pop(0)
            else:
                fault = self.rng.choice(plan)
            with self._lock:
                try:
                    self._apply(fault)
                except Exception as e:  # recorded; heal() still brings everything back
                    self.errors.append(f"{fault}: {e!r}")
                    self.history.info("nemesis", fault, error=repr(e))
            if not self._sleep(self.rng.uniform(*self.cfg.gap)):
                return

    # -- faults ------------------------------------------------------------------------------
    def _victims(self, count: int) -> tuple[list[str], dict[int, str]]:
        """``count`` brokers, the first one leading some partition when the metadata says."""
        leaders = self.target.leaders(self.topic)
        brokers = sorted(self.target.brokers)
        leading = sorted(set(leaders.values()))
        first = self.rng.choice(leading) if leading else self.rng.choice(brokers)
        rest = [b for b in brokers if b != first]
        return [first, *self.rng.sample(rest, count - 1)], leaders

    def _describe(self, names: list[str], leaders: dict[int, str] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"nodes": names, "pids": [self.target.pid(n) for n in names]}
        if leaders is not None:
            out["leads"] = {n: sorted(p for p, lead in leaders.items() if lead == n) for n in names}
        return out

    def _apply(self, fault: str) -> None:
        h = self.history
        if fault in ("kill1", "kill2", "pause1", *CUTS):
            names, leaders = self._victims(2 if fault == "kill2" else 1)
        elif fault == "ctl-pause":
            ctl = self.target.controller()
            if ctl is None:
                h.info("nemesis", fault, error="no controller known: skipped")
                return
            names, leaders = [ctl], self.target.leaders(self.topic)
        else:
            coord = self.target.coordinator()
            if coord is None:
                h.info("nemesis", fault, error="no coordinator known: skipped")
                return
            names, leaders = [coord], None
        self.applied.append(fault)
        if fault in CUTS:
            link, mode = CUTS[fault], self.cfg.cut_mode
            seconds = self.rng.uniform(*self.cfg.cut)
            h.invoke("nemesis", "cut", value={**self._describe(names, leaders), "link": link})
            for n in names:
                self.target.cut(n, link, mode)
                self.cut.add((n, link))
            h.ok("nemesis", "cut", value={**self._describe(names), "link": link, "mode": mode,
                                          "seconds": round(seconds, 3)})  # fmt: skip
            time.sleep(seconds)  # never cut short, like a pause
            self._reconnect([(n, link) for n in names])
        elif fault in PAUSES:
            seconds = self.rng.uniform(*self.cfg.pause)
            h.invoke("nemesis", "pause", value=self._describe(names, leaders))
            for n in names:
                self.target.pause(n)
                self.paused.add(n)
            h.ok("nemesis", "pause", value={**self._describe(names), "seconds": round(seconds, 3)})
            time.sleep(seconds)  # never cut short: a paused process must come back
            self._resume(names)
        else:
            delay = self.rng.uniform(*self.cfg.restart_delay)
            h.invoke("nemesis", "kill", value=self._describe(names, leaders))
            for n in names:
                self.target.kill(n)
                self.down.add(n)
            h.ok("nemesis", "kill", value={"nodes": names, "restart_in": round(delay, 3)})
            time.sleep(delay)
            self._restart(names)

    def _reconnect(self, cuts: list[tuple[str, str]]) -> None:
        h = self.history
        for n, link in cuts:
            h.invoke("nemesis", "reconnect", value={"nodes": [n], "link": link})
            self.target.reconnect(n, link)
            self.cut.discard((n, link))
            h.ok("nemesis", "reconnect", value={"nodes": [n], "link": link})

    def _resume(self, names: list[str]) -> None:
        h = self.history
        h.invoke("nemesis", "resume", value=self._describe(names))
        for n in names:
            self.target.resume(n)
            self.paused.discard(n)
        h.ok("nemesis", "resume", value={"nodes": names})

    def _restart(self, names: list[str]) -> None:
        h = self.history
        for n in names:
            h.invoke("nemesis", "restart", value={"nodes": [n]})
            t0 = time.monotonic()
            try:
                attempts = self.target.restart(n)
            except Exception as e:
                h.info("nemesis", "restart", value={"nodes": [n]}, error=repr(e)[:2000])
                raise
            self.down.discard(n)
            h.ok(
                "nemesis",
                "restart",
                value={
                    **self._describe([n]),
                    "attempts": attempts,
                    "seconds": round(time.monotonic() - t0, 3),
                },
            )

    def heal(self, attempts: int = 3) -> bool:
        """Everything running again: links reconnected, paused processes continued, killed ones
        restarted (the coordinator first). True when nothing is left down."""
        with self._lock:
            self.history.invoke("nemesis", "heal")
            if self.cut:
                try:
                    self._reconnect(sorted(self.cut))
                except Exception as e:
                    self.errors.append(f"heal: {e!r}")
            if self.paused:
                self._resume(sorted(self.paused))
            for _ in range(attempts):
                if not self.down:
                    break
                brokers = set(self.target.brokers)
                order = sorted(self.down, key=lambda n: (n in brokers, n))  # etcd first
                try:
                    self._restart(order)
                except Exception as e:
                    self.errors.append(f"heal: {e!r}")
            healed = not self.down and not self.paused and not self.cut
            if healed:
                self.history.ok("nemesis", "heal")
            else:
                left = {"down": sorted(self.down), "cut": sorted(map(list, self.cut))}
                self.history.info("nemesis", "heal", value=left)
            return healed
