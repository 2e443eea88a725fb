"""Where the report's charts go: one PNG per figure, at one resolution for all of them (the
single-broker charts, the cluster's and the features')."""

from __future__ import annotations

from pathlib import Path


def save_figure(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
