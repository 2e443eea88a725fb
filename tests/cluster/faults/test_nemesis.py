"""The nemesis against a fake target (no processes): what it does, in what order, what it
records, and that heal() brings back whatever a fault left down."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratalog.faults.history import History
from stratalog.faults.nemesis import Nemesis, NemesisConfig
from stratalog.faults.targets import Target


class FakeTarget(Target):
    kind = "fake"

    def __init__(self, fail_restarts: int = 0) -> None:
        self.calls: list[tuple[str, str]] = []
        self.pids = {"b-1": 11, "b-2": 12, "b-3": 13, "coord": 99}
        self.fail_restarts = fail_restarts

    def start(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def bootstrap(self) -> str:
        return "127.0.0.1:1"

    @property
    def brokers(self) -> list[str]:
        return ["b-1", "b-2", "b-3"]

    def node_id(self, name: str) -> int | None:
        return int(name[2:]) if name.startswith("b-") else None

    def coordinator(self) -> str | None:
        return "coord"

    def pid(self, name: str) -> int | None:
        return self.pids.get(name)

    def kill(self, name: str) -> None:
        self.calls.append(("kill", name))

    def restart(self, name: str, timeout: float = 120) -> int:
        self.calls.append(("restart", name))
        if self.fail_restarts:
            self.fail_restarts -= 1
            raise RuntimeError("refused")
        self.pids[name] += 100
        return 1

    def pause(self, name: str) -> None:
        self.calls.append(("pause", name))

    def resume(self, name: str) -> None:
        self.calls.append(("resume", name))

    def cut(self, name: str, link: str, mode: str = "blackhole") -> None:
        self.calls.append((f"cut-{link}-{mode}", name))

    def reconnect(self, name: str, link: str) -> None:
        self.calls.append((f"reconnect-{link}", name))

    def topic_configs(self) -> dict[str, str]:
        return {}

    def logs(self) -> list[Path]:
        return []

    def data_root(self) -> Path | None:
        return None

    def leaders(self, topic: str, timeout: float = 5) -> dict[int, str]:
        return {0: "b-2", 1: "b-2", 2: "b-3"}

    def controller(self, timeout: float = 5) -> str | None:
        return "b-3"


def fast(faults: tuple[str, ...], fixed: bool = True, seed: int = 3) -> NemesisConfig:
    return NemesisConfig(faults=faults, fixed=fixed, quiet_start=0, gap=(0, 0),
                         restart_delay=(0, 0.01), pause=(0.01, 0.01), seed=seed)  # fmt: skip


def run_schedule(target: FakeTarget, cfg: NemesisConfig) -> tuple[Nemesis, History]:
    h = History()
    n = Nemesis(target, h, cfg, "t")
    n.start()
    n.join(10)
    assert not n.is_alive()
    h.sync()
    return n, h


def test_a_fixed_mix_runs_once_in_order_against_leaders_and_the_coordinator() -> None:
    t = FakeTarget()
    n, h = run_schedule(t, fast(("kill1", "pause1", "coord-kill", "coord-pause", "kill2")))
    assert n.applied == ["kill1", "pause1", "coord-kill", "coord-pause", "kill2"]
    kinds = [c for c, _ in t.calls]
    assert kinds == ["kill", "restart", "pause", "resume", "kill", "restart", "pause", "resume",
                     "kill", "kill", "restart", "restart"]  # fmt: skip
    assert t.calls[0][1] in {"b-2", "b-3"}  # a leader
    assert t.calls[4] == ("kill", "coord") and t.calls[6] == ("pause", "coord")
    killed2 = [name for c, name in t.calls[8:10]]
    assert len(set(killed2)) == 2 and killed2[0] in {"b-2", "b-3"}
    assert not n.down and not n.paused
    kill = next(e for e in h.events if e["f"] == "kill" and e["type"] == "invoke")
    assert kill["process"] == "nemesis"
    assert kill["value"]["pids"] == [FakeTarget().pids[kill["value"]["nodes"][0]]]  # the first
    assert set(kill["value"]["leads"]) == set(kill["value"]["nodes"])


def test_ctl_pause_stops_the_broker_named_controller() -> None:
    t = FakeTarget()
    n, h = run_schedule(t, fast(("ctl-pause",)))
    assert n.applied == ["ctl-pause"]
    assert t.calls == [("pause", "b-3"), ("resume", "b-3")]
    pause = next(e for e in h.events if e["f"] == "pause" and e["type"] == "invoke")
    assert pause["value"]["leads"] == {"b-3": [2]}


def test_the_schedule_is_seeded() -> None:
    def choices(seed: int) -> list[tuple[str, str]]:
        t = FakeTarget()
        n = Nemesis(t, History(), fast(("kill1", "pause1", "kill2"), fixed=False, seed=seed), "t")
        for _ in range(12):
            n._apply(n.rng.choice(list(n.cfg.faults)))
        return t.calls

    assert choices(5) == choices(5)
    assert choices(5) != choices(6)


def test_heal_restarts_what_a_failed_restart_left_down_coordinator_first() -> None:
    t = FakeTarget(fail_restarts=2)  # the fault's own restart fails, and heal's first try
    n, h = run_schedule(t, fast(("coord-kill",)))
    assert n.errors and "coord" in n.down
    n.paused.add("b-1")
    n.down.add("b-3")
    assert n.heal()
    assert not n.down and not n.paused
    restarts = [name for c, name in t.calls if c == "restart"]
    assert restarts[-1] == "b-3" and restarts[-2] == "coord"
    assert ("resume", "b-1") in t.calls
    h.close()
    assert h.events[-1]["f"] == "heal" and h.events[-1]["type"] == "ok"


def test_network_cuts_go_to_a_leader_and_are_recorded_and_reconnected() -> None:
    t = FakeTarget()
    n, h = run_schedule(t, NemesisConfig(faults=("etcd-cut1", "isolate1"), fixed=True,
                                         quiet_start=0, gap=(0, 0), cut=(0.01, 0.01)))  # fmt: skip
    assert n.applied == ["etcd-cut1", "isolate1"]
    kinds = [c for c, _ in t.calls]
    assert kinds == ["cut-etcd-blackhole", "reconnect-etcd", "cut-replication-blackhole",
                     "reconnect-replication"]  # fmt: skip
    assert all(name in {"b-2", "b-3"} for _, name in t.calls)  # leaders
    cuts = [e for e in h.events if e["f"] == "cut"]
    assert [(e["type"], e["value"]["link"]) for e in cuts] == [
        ("invoke", "etcd"), ("ok", "etcd"), ("invoke", "replication"), ("ok", "replication")
    ]  # fmt: skip
    assert cuts[0]["value"]["pids"] == [t.pids[cuts[0]["value"]["nodes"][0]]]
    assert not n.cut


def test_heal_reconnects_a_cut_left_open() -> None:
    t = FakeTarget()
    n = Nemesis(t, History(), fast(("kill1",)), "t")
    n.cut.add(("b-2", "replication"))
    assert n.heal()
    assert t.calls == [("reconnect-replication", "b-2")]


def test_an_unknown_fault_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown faults"):
        NemesisConfig(faults=("kill1", "partition"))
    with pytest.raises(ValueError, match="cut mode"):
        NemesisConfig(faults=("isolate1",), cut_mode="drop")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--target", "kafka", "--faults", "kill1,isolate1"], "isolate1 need --target stratalog"),
        (["--faults", "kill1,explode"], "unknown fault(s) explode"),
    ],
)
def test_the_cli_refuses_a_mix_it_cannot_run(args, said, capsys):
    from stratalog.faults.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["run", *args, "--duration", "1"])
    assert e.value.code == 2 and said in capsys.readouterr().err
