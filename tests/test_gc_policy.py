"""A serving broker's garbage-collector policy (``gc.freeze``, ``gc.young_threshold``), seen
from /status.

``stratalog serve`` freezes what exists once it is up (the reasons are in
stratalog/broker/gc_policy.py) and can collect the young generation less often;
``gc.freeze=false`` keeps Python's collector as it comes. Checked on real broker processes
through the admin endpoint while a client produces.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request

from confluent_kafka import Producer

from .conftest import BrokerProcess, create_topic


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gc_status(admin_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/status", timeout=10) as r:
        return json.loads(r.read())["broker"]["gc"]


def _produce(bootstrap: str, n: int) -> None:
    create_topic(bootstrap, "gc-load", 4)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1})
    for i in range(n):
        p.produce("gc-load", b"x" * 200, partition=i % 4)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def test_serve_freezes_its_start_up_objects_and_sets_the_young_threshold(tmp_path):
    python_default = int(
        subprocess.check_output(
            [sys.executable, "-c", "import gc; print(gc.get_threshold()[0])"], text=True
        )
    )
    tuned_port, default_port = _free_port(), _free_port()
    tuned = BrokerProcess(
        tmp_path / "tuned",
        settings={"admin.port": str(tuned_port), "gc.young_threshold": "50000"},
    )
    plain = BrokerProcess(
        tmp_path / "plain", settings={"admin.port": str(default_port), "gc.freeze": "false"}
    )
    try:
        tuned.start()
        plain.start()
        for b in (tuned, plain):
            _produce(b.bootstrap, 20_000)
        t, d = _gc_status(tuned_port), _gc_status(default_port)
    finally:
        tuned.kill()
        plain.kill()
    assert t["thresholds"][0] == 50_000 and t["frozen_objects"] > 10_000
    assert d["thresholds"][0] == python_default and d["frozen_objects"] == 0
    # The same load: the tuned broker ran fewer young collections than Python's defaults do.
    assert t["collections"][0] < d["collections"][0]
