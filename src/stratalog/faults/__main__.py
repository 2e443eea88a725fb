"""``python -m stratalog.faults``: soak, run, check, summary (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from stratalog.faults.checker import check
from stratalog.faults.history import compress, load_history
from stratalog.faults.nemesis import CUTS, FAULTS, KNOWN
from stratalog.faults.proxy import MODES
from stratalog.faults.report import anomaly_table, load_results, row, table
from stratalog.faults.runner import RunConfig, run

console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 250)


def _pairs(items: list[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _range(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    return float(lo), float(hi or lo)


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", choices=("stratalog", "kafka"), default="stratalog")
    p.add_argument("--duration", type=float, default=300, help="seconds of workload (300)")
    p.add_argument("--seed", type=int, default=None, help="first run's seed (default: time)")
    p.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"comma-separated mix, drawn at random, of {','.join(KNOWN)} (default "
        f"{','.join(FAULTS)}; etcd-cut1 and isolate1 need --target stratalog)",
    )
    p.add_argument("--fixed", action="store_true", help="the faults once, in the given order")
    p.add_argument("--rate", type=float, default=200, help="sends per second (200)")
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--assign-consumers", type=int, default=2)
    p.add_argument("--subscribe-consumers", type=int, default=2)
    p.add_argument("--quiet-start", type=float, default=5)
    p.add_argument("--gap", type=_range, default=(5.0, 15.0), help="fault-free gap LO,HI (5,15)")
    p.add_argument("--restart-delay", type=_range, default=(0.0, 5.0), help="LO,HI s (0,5)")
    p.add_argument("--pause", type=_range, default=(5.0, 5.0), help="SIGSTOP length LO,HI (5)")
    p.add_argument("--cut", type=_range, default=(6.0, 6.0), help="network cut length LO,HI (6)")
    p.add_argument("--cut-mode", choices=MODES, default="blackhole",
                   help="blackhole: silence, as a partition (default); refuse: resets")  # fmt: skip
    p.add_argument("--settle", type=float, default=10)
    p.add_argument("--final-read-timeout", type=float, default=200)
    p.add_argument("--message-timeout-ms", type=int, default=120_000)
    p.add_argument("--drain-timeout", type=float, default=30)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="broker setting (Stratalog) or property (Kafka), repeatable")  # fmt: skip
    p.add_argument("--flush-messages", action="store_true", help="Kafka: flush.messages=1")
    p.add_argument("--broker-log-level", default="WARNING", help="Stratalog brokers' log level")
    p.add_argument("--keep-data", action="store_true", help="keep data dirs of valid runs too")
    p.add_argument("--results", type=Path, default=Path("faults-results"))


def _faults(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, ...]:
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = [f for f in faults if f not in KNOWN]
    if unknown:
        parser.error(f"unknown fault(s) {', '.join(unknown)}: choose from {', '.join(KNOWN)}")
    cuts = [f for f in faults if f in CUTS]
    if cuts and args.target != "stratalog":
        parser.error(f"{', '.join(cuts)} need --target stratalog (Kafka runs without proxies)")
    return faults


def _config(args: argparse.Namespace, parser: argparse.ArgumentParser, seed: int) -> RunConfig:
    return RunConfig(
        target=args.target,
        duration=args.duration,
        seed=seed,
        faults=_faults(args, parser),
        fixed=args.fixed,
        rate=args.rate,
        partitions=args.partitions,
        producers=args.producers,
        assign_consumers=args.assign_consumers,
        subscribe_consumers=args.subscribe_consumers,
        quiet_start=args.quiet_start,
        gap=args.gap,
        restart_delay=args.restart_delay,
        pause=args.pause,
        cut=args.cut,
        cut_mode=args.cut_mode,
        settle=args.settle,
        final_read_timeout=args.final_read_timeout,
        message_timeout_ms=args.message_timeout_ms,
        drain_timeout=args.drain_timeout,
        settings=_pairs(args.set, parser),
        flush_messages=args.flush_messages,
        broker_log_level=args.broker_log_level,
        keep_data=args.keep_data,
    )


def _soak(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    first_seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    root = args.results / f"{args.target}-{stamp}"
    root.mkdir(parents=True, exist_ok=True)
    console.print(f"results in [bold]{root}[/]")
    rows = []
    invalid = 0
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as progress:
        runs = progress.add_task(f"{args.runs} runs against {args.target}", total=args.runs)
        current = progress.add_task("", total=args.duration)
        for i in range(args.runs):
            seed = first_seed + i
            cfg = _config(args, parser, seed)
            out = root / f"run-{i + 1:03d}-seed-{seed}"
            label = f"run {i + 1}/{args.runs} seed {seed}"

            def show(phase: str, done: float, total: float, label: str = label) -> None:
                progress.update(current, description=f"{label}: {phase}", completed=done)

            progress.reset(current, total=args.duration, description=f"{label}: start")
            try:
                result = run(cfg, out, show)
            except Exception as e:  # a run that could not finish is reported, and the soak goes on
                result = {"config": asdict(cfg), "error": repr(e), "traceback":
                          traceback.format_exc()}  # fmt: skip
                out.mkdir(parents=True, exist_ok=True)
                (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
            if (out / "history.jsonl").is_file():
                compress(out / "history.jsonl")
            r = row(out, result)
            rows.append(r)
            (root / "summary.json").write_text(json.dumps(rows, indent=1, default=str))
            counts = {k: v for k, v in result.get("check", {}).get("counts", {}).items() if v}
            style = {True: "green", False: "bold red"}.get(r["valid"], "yellow")
            progress.console.print(
                f"{label}: [{style}]valid={r['valid']}[/] ok={r['ok']} info={r['info']} "
                f"fail={r['fail']} faults={r['faults']} {counts or ''}"
                + (f" error={result['error']}" if "error" in result else "")
            )
            if r["valid"] is not True:
                invalid += 1
                if args.stop_on_anomaly and r["valid"] is False:
                    progress.advance(runs)
                    break
            progress.advance(runs)
    console.print(table(rows, title=f"{args.target}: {root}"))
    return 1 if invalid else 0


def _one(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    out = args.results / f"{args.target}-seed-{seed}"
    console.print(f"results in [bold]{out}[/]")
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=console) as progress:  # fmt: skip
        task = progress.add_task("start", total=args.duration)
        result = run(
            _config(args, parser, seed),
            out,
            lambda phase, done, total: progress.update(task, description=phase, completed=done),
        )
    console.print(anomaly_table(result["check"]))
    return 0 if result["check"]["valid"] is True else 1


def _check(args: argparse.Namespace) -> int:
    result = check(load_history(args.history))
    console.print(anomaly_table(result))
    if args.json:
        console.print_json(json.dumps(result, default=str))
    return 0 if result["valid"] is True else 1


def _summary(args: argparse.Namespace) -> int:
    results = load_results(args.results)
    if not results:
        console.print(f"no result.json under {args.results}")
        return 1
    console.print(table([row(d, r) for d, r in results], title=str(args.results)))
    return 0


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM unwinds like an error, so a run's ``finally`` stops its brokers and etcd by PID
    (left running otherwise, and the next run or test suite shares the cores with them).
    Further SIGTERMs are ignored while it does."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stratalog.faults",
        description="Jepsen-style fault injection against Stratalog or a 3-node Kafka cluster.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    soak = sub.add_parser("soak", help="many runs, a summary table at the end")
    _run_options(soak)
    soak.add_argument("--runs", type=int, default=10)
    soak.add_argument("--stop-on-anomaly", action="store_true")
    one = sub.add_parser("run", help="one run")
    _run_options(one)
    chk = sub.add_parser("check", help="check a history.jsonl again")
    chk.add_argument("history", type=Path)
    chk.add_argument("--json", action="store_true", help="also print the whole result")
    summ = sub.add_parser("summary", help="the table of every run under a results directory")
    summ.add_argument("results", type=Path)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    if args.command == "soak":
        return _soak(args, parser)
    if args.command == "run":
        return _one(args, parser)
    if args.command == "check":
        return _check(args)
    return _summary(args)


if __name__ == "__main__":
    sys.exit(main())
