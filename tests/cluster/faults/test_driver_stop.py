"""``python -m stratalog.faults`` stopped by SIGTERM stops the cluster it started.

A soak driver ended with ``kill`` used to leave its etcd and three brokers running, idle but
sharing the cores with whatever ran next (a test suite ran 30% slower beside four of them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults


def _processes_under(path: Path, but: int) -> list[int]:
    """PIDs of processes whose command line names ``path`` (the brokers' and etcd's data
    directories are under it), other than ``but``."""
    out = subprocess.run(["pgrep", "-f", str(path)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if int(p) not in (but, os.getpid())]


def test_sigterm_stops_the_cluster_the_driver_started(tmp_path: Path) -> None:
    results = tmp_path / "results"
    driver = subprocess.Popen(
        [sys.executable, "-m", "stratalog.faults", "run", "--duration", "120", "--seed", "1",
         "--faults", "kill1", "--results", str(results)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    started: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while len(started) < 4:  # etcd and three brokers
            assert driver.poll() is None, driver.stderr.read() if driver.stderr else ""
            assert time.monotonic() < deadline, f"the cluster did not start: {started}"
            time.sleep(0.5)
            started = _processes_under(results, driver.pid)
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(60) == 128 + signal.SIGTERM
        assert _processes_under(results, driver.pid) == []
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        for pid in _processes_under(results, driver.pid):
            os.kill(pid, signal.SIGKILL)
