"""One ``stratalog bench`` run: the machine's limits, then every workload on every target, with
rich progress bars, written to a results directory as JSON, Markdown and PNG charts."""

from __future__ import annotations

import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from stratalog.bench import report
from stratalog.bench.runner import Runner
from stratalog.bench.workload import Workload


def run_suite(
    workloads: list[Workload],
    results_dir: Path,
    *,
    only_targets: set[str] | None = None,
    limits: bool = True,
    quick: bool = False,
    runs: int = 1,
    console: Console | None = None,
) -> dict[str, Any]:
    console = console or Console(stderr=True)
    # A filter that names a target (in any workload) selects by name; any other, by kind: so
    # "kafka" means the target named kafka, not kafka-fsync, and "redis" every Redis target.
    all_names = {t.name for w in workloads for t in w.targets}
    names = {t for t in only_targets or () if t in all_names}
    kinds = {t for t in only_targets or () if t not in all_names}
    run: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(shlex.quote(a) for a in ["stratalog", *sys.argv[1:]])
        if Path(sys.argv[0]).name in ("stratalog", "cli.py")
        else "stratalog bench",
        "profile": "quick" if quick else "full",
        "runs": runs,
        "python": platform.python_version(),
        "workloads": {w.name: w.title for w in workloads},
        "machine": None,
        # The machine is shared: a run on a busy one says more about the neighbours.
        "load_average": {"start": os.getloadavg()},
        "results": [],
    }
    if limits:
        from stratalog.bench.limits import measure_limits

        console.print("[bold]Measuring the machine's limits[/] (fio, loopback TCP)…")
        # The data directory of every target is a temporary directory: measure that disk.
        run["machine"] = measure_limits(Path(tempfile.gettempdir()), quick=quick)
    with Progress(
        TextColumn("{task.description}", style="bold"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[consumed]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bars:
        tasks: dict[str, Any] = {}

        def progress(label: str, produced: int, consumed: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bars.add_task(label, total=total or None, consumed="")
            bars.update(
                tasks[label],
                completed=produced,
                total=total or None,
                consumed=f"consumed {consumed:,}" if consumed else "",
            )

        runner = Runner(progress=progress, log=lambda s: bars.console.print(s))
        for w in workloads:
            runner.run(w, names, kinds, runs)
            run["results"] = [r.to_dict() for r in runner.results]
            # Written after every workload, so a long run that is stopped keeps what it measured.
            report.write(run, results_dir)
    run["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    run["load_average"]["end"] = os.getloadavg()
    paths = report.write(run, results_dir)
    console.print(
        f"Results in {paths['markdown'].parent}: " + ", ".join(p.name for p in paths.values())
    )
    return run
