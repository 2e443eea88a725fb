"""Results of a ``stratalog bench`` run, written to its results directory: JSON (everything),
Markdown (``tables.py``, with the goals of ``goals.py``) and PNG charts (``charts.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stratalog.bench.charts import charts
from stratalog.bench.rows import aggregate
from stratalog.bench.tables import markdown


def write(run: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json", "markdown": out_dir / "results.md"}
    from stratalog.bench import cluster_report

    rows = aggregate(run["results"])
    if cluster_report.has_cluster(rows):
        run["cluster_goals"] = cluster_report.summary(rows)
    paths["json"].write_text(json.dumps(run, indent=2, default=str))
    pngs = charts(run, out_dir)
    md = markdown(run)
    if pngs:
        md += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in pngs) + "\n"
    paths["markdown"].write_text(md)
    for p in pngs:
        paths[p.stem] = p
    return paths
