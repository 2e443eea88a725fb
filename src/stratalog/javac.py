"""Compiling the project's small Java sources once, into a cache keyed by their content.

Two parts of Stratalog run on the JVM: the benchmark's load producer (Kafka's Java client) and
the Spark connector ``format("stratalog")``. Both are compiled with the machine's JDK on first
use, against the jars they run with, so nothing prebuilt is checked in.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path


def compile_java(
    sources: list[Path], classpath: str, cache_root: Path, what: str, resources: Path | None = None
) -> Path:
    """Compile ``sources`` against ``classpath`` into ``cache_root/<digest>`` and return that
    directory. ``resources`` (a directory) is copied beside the classes. A concurrent compile of
    the same sources may win the final rename; either result is the same."""
    h = hashlib.sha256(classpath.encode())
    for src in sorted(sources):
        h.update(src.name.encode() + src.read_bytes())
    if resources is not None:
        for f in sorted(p for p in resources.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(resources)).encode() + f.read_bytes())
    digest = h.hexdigest()[:16]
    out = cache_root / digest
    if (out / ".complete").exists():
        return out
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError(f"javac (a JDK) is needed for {what}: apt-get install default-jdk")
    partial = cache_root / f"{digest}.{os.getpid()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    proc = subprocess.run(
        [javac, "-nowarn", "-d", str(partial), "-cp", classpath, *map(str, sources)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"javac failed for {what}: {proc.stderr[-1200:]}")
    if resources is not None:
        shutil.copytree(resources, partial / resources.name, dirs_exist_ok=True)
    (partial / ".complete").touch()
    try:
        partial.rename(out)  # atomic
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
    return out


def jar_of(classes: Path, name: str) -> Path:
    """A jar of a compiled directory, written beside it once (Spark's ``spark.jars`` wants a
    file)."""
    jar = classes / name
    if jar.exists():
        return jar
    tmp = classes / f".{name}.{os.getpid()}"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(classes.rglob("*")):
            if f.is_file() and not f.name.startswith(".") and f.suffix != ".jar":
                z.write(f, str(f.relative_to(classes)))
    tmp.rename(jar)
    return jar
