"""docs/grafana/stratalog.json stays true to the metrics the broker exports: every series a
panel asks for is one the code defines (a counter's `_total`, a histogram's `_bucket`), and a
live broker's /metrics carries the unlabelled ones."""

from __future__ import annotations

import json
import re

from stratalog import Broker

from .conftest import REPO, scrape_metrics

DASHBOARD = REPO / "docs" / "grafana" / "stratalog.json"
_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def _defined() -> set[str]:
    """Metric names given to prometheus_client in the product's code."""
    names = set()
    for path in (REPO / "src" / "stratalog").rglob("*.py"):
        text = path.read_text()
        names |= set(re.findall(r'(?:Counter|Gauge|Histogram)\(\s*"(stratalog_[a-z_]+)"', text))
    return names


def _asked() -> set[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    out = set()
    for name in re.findall(r"\b(stratalog_[a-z_]+)", " ".join(exprs)):
        for suffix in _SUFFIXES:
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        out.add(name)
    return out


def test_every_panel_asks_for_a_metric_the_broker_defines():
    defined = _defined()
    assert len(defined) > 15  # the scan itself works
    assert _asked() <= defined, sorted(_asked() - defined)


def test_a_live_broker_exports_what_the_dashboard_reads(tmp_path):
    with Broker(tmp_path / "data", config={"admin.port": 0}) as b:
        exported = {s.name for s in scrape_metrics(b.service.core.admin_address, "stratalog_")}
    bases = {n for n in exported}
    for name in exported:
        for suffix in _SUFFIXES:
            if name.endswith(suffix):
                bases.add(name[: -len(suffix)])
    # Series with labels appear once something happens; the plain ones are always there.
    always = {"stratalog_disk_free_bytes", "stratalog_log_dir_online", "stratalog_produced_bytes"}
    assert always <= bases, sorted(always - bases)
    assert always <= _asked()
