"""Shared fixtures: real brokers on loopback, started in-process or as `stratalog serve`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from stratalog import Broker

REPO = Path(__file__).resolve().parent.parent
# `make test` runs the suite on three pytest-xdist workers (--dist loadgroup): many tests wait
# on leases, kills and JVM starts rather than compute, so a third worker keeps two cores busy.
# A group of tests runs on one worker: each test module (its module-scoped brokers, the quick
# benchmark run), and each directory whose tests share a session fixture (one SparkSession; the
# reference Kafka beside an embedded broker) or start JVMs of their own (the Kafka Streams and
# Kafka Connect applications of tests/apps/, one JVM at a time). The slowest groups start first
# so the workers end together. The Spark tests are two groups, each with its own SparkSession
# on its worker: one alone took a third of the suite's time on one worker.
_SHARED_DIRS = ("spark", "conformance", "apps")
# The tests' SparkSessions compile with the JVM's client compiler alone: their queries are
# small and many, so the optimizing compiler's work never paid off and cost a sixth of the
# Spark tests' CPU time on this 2-core machine.
SPARK_TEST_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
# The reference Kafka too: a third less CPU to start, and its answers are what is compared.
KAFKA_TEST_JVM = ("-XX:TieredStopAtLevel=1",)
_SPARK_SECOND = (
    "test_jvm_on_kafka.py",  # the modules that compare with the reference Kafka, and a few more
    "test_kafka_connector.py",
    "test_kafka_source_semantics.py",
    "test_kafka_sink_semantics.py",
    "test_time_range.py",
    "test_jvm_reader_corrupt.py",
)
_FIRST = (
    "spark",
    "spark-2",
    "apps",
    "tests/test_bench.py",
    "tests/test_bench_tiers.py",
    "conformance",
    "tests/test_crash.py",
    "tests/security/test_kafka_parity.py",
)


def _group(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) > 2 and parts[1] == "spark" and parts[2] in _SPARK_SECOND:
        return "spark-2"
    return parts[1] if len(parts) > 2 and parts[1] in _SHARED_DIRS else path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        group = _group(item.nodeid)
        return _FIRST.index(group) if group in _FIRST else len(_FIRST)

    items.sort(key=rank)  # stable: each group keeps its own order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    # xdist's own loadgroup reads xdist_group marks through a node id it rewrites, which
    # pytest 9 no longer lets it do; the scope of each test is computed here instead.
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    config.option.loadscopereorder = False  # keep the order above: slowest groups first
    return GroupScheduling(config, log)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A fresh embedded broker (own thread and event loop) on a free port."""
    with Broker(tmp_path / "data") as b:
        yield b


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One embedded broker for a whole test module (tests use their own topics)."""
    with Broker(tmp_path_factory.mktemp("data")) as b:
        yield b


def scrape_metrics(admin: str, prefix: str) -> list[Sample]:
    """Every sample whose name starts with ``prefix`` from a broker's /metrics endpoint."""
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as r:
        text = r.read().decode()
    return [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(prefix)
    ]


def create_topic(bootstrap: str, name: str, partitions: int = 1, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(name, partitions, 1, config=configs)])
    fs[name].result(timeout=15)


def produce_keyed(bootstrap: str, topic: str, partitions: int, n: int, **conf: str) -> None:
    """``n`` keyed records (``k<i>``, about 80 bytes each) round-robin over the partitions, in
    small batches (8 KiB), so a topic holds many."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 8192, **conf})
    for i in range(n):
        while True:
            try:
                value = b"value-%d-" % i * 8
                p.produce(topic, key=b"k%d" % i, value=value, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(30) == 0


def fetch_requests(admin: str) -> float:
    """Fetch requests the broker whose admin endpoint is ``admin`` has received (its own
    Prometheus counter)."""
    samples = scrape_metrics(admin, "stratalog_requests_total")
    return sum(x.value for x in samples if x.labels.get("api") == "fetch")


def committed_offsets(bootstrap: str, group: str, topic: str, partitions) -> dict[int, int]:
    """partition -> ``group``'s committed offset on ``topic``, as confluent-kafka reads it."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic, p) for p in partitions], timeout=15)
    finally:
        c.close()
    return {tp.partition: tp.offset for tp in got}


def read_values(
    bootstrap: str, topic: str, partitions: int, count: int, timeout: float = 30
) -> list[bytes]:
    """Up to ``count`` values read from the start of ``topic``'s partitions with confluent-kafka
    (assigned, no group commits), in the order they arrive; fewer if ``timeout`` passes."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}",
                  "enable.auto.commit": False})  # fmt: skip
    try:
        c.assign([TopicPartition(topic, n, 0) for n in range(partitions)])
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value())
    finally:
        c.close()
    return got


@contextlib.contextmanager
def console_process(bootstrap: str) -> Iterator[str]:
    """`stratalog console --bootstrap` on a free port as a child process: its URL."""
    cmd = [sys.executable, "-m", "stratalog.cli", "console", "-b", bootstrap, "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert "Stratalog console of" in line, line + proc.stderr.read()
        yield line.strip().rsplit(" ", 1)[1].rstrip("/")
    finally:
        proc.terminate()
        proc.wait(10)


class BrokerProcess:
    """`stratalog serve` as a child process, killed by PID (SIGTERM or SIGKILL)."""

    def __init__(self, data_dir: Path, port: int = 0, settings: dict[str, str] | None = None):
        self.data_dir = data_dir
        self.port = port
        self.settings = dict(settings or {})
        self.proc: subprocess.Popen | None = None
        self.bootstrap = ""
        self.log_path = data_dir.parent / f"{data_dir.name}-broker.log"

    def start(self, timeout: float = 30) -> BrokerProcess:
        cmd = [
            sys.executable,
            "-m",
            "stratalog.cli",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--log-level",
            "WARNING",
        ]
        for k, v in self.settings.items():
            cmd += ["--set", f"{k}={v}"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if "ready at" not in line or time.monotonic() > deadline:
            self.kill()
            raise RuntimeError(f"broker did not start: {line!r}\n{self.log_path.read_text()}")
        self.bootstrap = line.strip().rsplit(" ", 1)[1]
        # Later restarts reuse the port so clients' bootstrap addresses stay valid.
        self.port = int(self.bootstrap.rsplit(":", 1)[1])
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is None:
            return
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()
        self.proc = None

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[BrokerProcess]:
    bp = BrokerProcess(tmp_path / "data")
    try:
        yield bp
    finally:
        bp.kill()
