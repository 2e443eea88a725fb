"""The reference peer: a real Apache Kafka 4.4.0 broker, resolved from Maven Central on first use.

Stratalog is compared against the genuine article, not a mock. This module

* resolves Apache Kafka's jars with Maven (``tests/peers/kafka/pom.xml``) into a cache outside the
  repository (``~/.cache/stratalog/kafka-4.4.0/``, or ``$STRATALOG_KAFKA_CACHE``), once, under a
  file lock, reusing it afterwards (:func:`resolve_kafka`);
* starts a single-node KRaft cluster (combined broker and controller) on 127.0.0.1 with free ports
  and a temporary log directory (:class:`KafkaBroker`);
* runs Kafka's command-line tools by their script names, with the main classes that Kafka's
  ``bin/*.sh`` scripts use (:func:`run_tool`);
* resolves the Kafka applications that ``tests/apps/`` runs against Stratalog (Kafka Streams with
  Kafka's streams examples, the Kafka Connect worker with the file connectors), from
  ``tests/peers/kafka-apps/pom.xml`` into a cache of their own (:func:`resolve_kafka_apps`).

Two classpaths are resolved, so that every JVM runs one consistent Kafka release: the broker's
(Kafka 4.4.0, which also runs ``kafka-storage``) and the tools' (``org.apache.kafka:kafka-tools``
at the newest release Maven Central has; see the POM for why that is 4.3.1 and not 4.4.0).

``python -m stratalog.peers.kafka`` (``make kafka``) starts a broker and prints its address until
Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from stratalog.loopback import free_port as _free_port

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.4.0"
"""The broker's Apache Kafka release (the POM's ``kafka.version``)."""

CACHE_ENV = "STRATALOG_KAFKA_CACHE"
MIN_JAVA = 17

REPO_ROOT = Path(__file__).resolve().parents[3]
POM = REPO_ROOT / "tests" / "peers" / "kafka" / "pom.xml"
APPS_POM = REPO_ROOT / "tests" / "peers" / "kafka-apps" / "pom.xml"
APPS_VERSION = "4.3.1"
"""The applications' Kafka release (``tests/peers/kafka-apps/pom.xml``)."""

BROKER_MAIN = "kafka.Kafka"

# Script name (bin/<name>.sh) -> main classes, first one present on the classpath wins. The first
# entry is what Kafka 4.4's script runs; a later one is the same tool in the older tools release
# that Maven Central has (kafka-configs moved from core's kafka.admin to kafka-tools in 4.4).
TOOL_MAIN_CLASSES: dict[str, tuple[str, ...]] = {
    "kafka-topics": ("org.apache.kafka.tools.TopicCommand",),
    "kafka-console-producer": ("org.apache.kafka.tools.ConsoleProducer",),
    "kafka-console-consumer": ("org.apache.kafka.tools.consumer.ConsoleConsumer",),
    "kafka-consumer-groups": ("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",),
    "kafka-console-share-consumer": ("org.apache.kafka.tools.consumer.ConsoleShareConsumer",),
    "kafka-share-groups": ("org.apache.kafka.tools.consumer.group.ShareGroupCommand",),
    "kafka-configs": ("org.apache.kafka.tools.ConfigCommand", "kafka.admin.ConfigCommand"),
    "kafka-producer-perf-test": ("org.apache.kafka.tools.ProducerPerformance",),
    "kafka-consumer-perf-test": ("org.apache.kafka.tools.ConsumerPerformance",),
    "kafka-storage": ("kafka.tools.StorageTool",),
    "kafka-leader-election": ("org.apache.kafka.tools.LeaderElectionCommand",),
    "kafka-reassign-partitions": ("org.apache.kafka.tools.reassign.ReassignPartitionsCommand",),
    "kafka-delete-records": ("org.apache.kafka.tools.DeleteRecordsCommand",),
    "kafka-transactions": ("org.apache.kafka.tools.TransactionsCommand",),
    "kafka-acls": ("org.apache.kafka.tools.AclCommand",),
}
# Tools that must run on the broker's own release: kafka-storage writes the on-disk format
# (metadata version, bootstrap checkpoint) that the 4.4.0 broker then reads.
BROKER_CLASSPATH_TOOLS = frozenset({"kafka-storage"})

_INSTALL_HINT = (
    "Install it with `make setup` (scripts/install-system-deps.sh), or directly with "
    "`sudo apt-get install -y {package}`."
)
_MARKER = ".complete"
_LIBS = {"broker": "libs", "tools": "tools-libs"}
_APPS_LIBS = {"streams": "streams-libs", "connect": "connect-libs"}


class KafkaSetupError(RuntimeError):
    """The reference Kafka cannot be resolved or started (missing Java/Maven, no checkout...)."""


# --------------------------------------------------------------------------------------------
# Resolution
# --------------------------------------------------------------------------------------------


def _cache_dir(cache_dir: Path | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "stratalog" / f"kafka-{KAFKA_VERSION}"


def _pom(pom: Path) -> Path:
    if not pom.is_file():
        raise KafkaSetupError(
            f"cannot find the POM {pom}: stratalog.peers.kafka resolves Apache Kafka and its "
            "applications from tests/peers/, which only exists in a source checkout of "
            "Stratalog (this package is installed from elsewhere). Run it from a clone with "
            "`pip install -e .`."
        )
    return pom


def _require_command(command: str, package: str, what: str) -> str:
    path = shutil.which(command)
    if path is None:
        raise KafkaSetupError(
            f"`{command}` ({what}) is not on PATH; the reference Apache Kafka needs it. "
            + _INSTALL_HINT.format(package=package)
        )
    return path


def _java() -> str:
    """The ``java`` executable, checked to be Java 17 or newer (Kafka 4.x brokers need 17)."""
    return _checked_java(_require_command("java", "openjdk-17-jre-headless", "Java 17+ runtime"))


@functools.cache
def _checked_java(java: str) -> str:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match:
        major = int(match.group(1))
        if major == 1 and match.group(2):  # "1.8.0_..." style
            major = int(match.group(2))
        if major < MIN_JAVA:
            raise KafkaSetupError(
                f"{java} is Java {major}; Apache Kafka {KAFKA_VERSION} needs Java {MIN_JAVA}+. "
                + _INSTALL_HINT.format(package="openjdk-17-jre-headless")
            )
    return java


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _marker_text(pom: Path) -> str:
    return f"pom-sha256={hashlib.sha256(pom.read_bytes()).hexdigest()}\n"


def _is_complete(cache: Path, pom: Path, libs: Mapping[str, str]) -> bool:
    marker = cache / _MARKER
    if not marker.is_file() or marker.read_text() != _marker_text(pom):
        return False
    return all(any((cache / d).glob("*.jar")) for d in libs.values())


def _mvn_copy(mvn: str, pom: Path, profile: str, out: Path, what: str) -> None:
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom),
        f"-P{profile}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={out}",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired as e:
        raise KafkaSetupError(f"Maven did not finish resolving {what}: {' '.join(cmd)}") from e
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
        raise KafkaSetupError(
            f"Maven could not resolve {what} (profile {profile}, exit {proc.returncode}); "
            f"it needs to reach Maven Central.\n$ {' '.join(cmd)}\n{tail}"
        )


def _resolve(pom: Path, cache: Path, libs: Mapping[str, str], what: str) -> None:
    """Copy each profile's dependencies of ``pom`` into ``cache/<libs[profile]>``, once.

    Reused once a marker file records a complete resolution of the current POM; concurrent
    callers serialise on a file lock in the cache. Raises :class:`KafkaSetupError` when Java or
    Maven is missing or Maven cannot resolve everything.
    """
    _java()
    if _is_complete(cache, pom, libs):
        return
    with _locked(cache / ".lock"):
        if _is_complete(cache, pom, libs):  # another process finished it while we waited
            return
        mvn = _require_command("mvn", "maven", f"Apache Maven, which resolves {what}'s jars")
        (cache / _MARKER).unlink(missing_ok=True)
        for profile, name in libs.items():
            final, partial = cache / name, cache / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            _mvn_copy(mvn, pom, profile, partial, what)
            if not any(partial.glob("*.jar")):
                raise KafkaSetupError(f"Maven resolved no jars (profile {profile}) into {partial}")
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)
        (cache / _MARKER).write_text(_marker_text(pom))


def resolve_kafka(cache_dir: Path | None = None) -> Path:
    """Resolve Apache Kafka's jars from Maven Central into the cache; return the broker's libs dir.

    The cache is ``cache_dir``, else ``$STRATALOG_KAFKA_CACHE``, else
    ``~/.cache/stratalog/kafka-4.4.0/``. It holds ``libs/`` (the broker's classpath) and
    ``tools-libs/`` (the command-line tools'), and is reused once a marker file records a complete
    resolution of the current POM. Concurrent callers serialise on a file lock in the cache.
    Raises :class:`KafkaSetupError` naming what is missing when Java or Maven is not installed.
    """
    cache = _cache_dir(cache_dir)
    _resolve(_pom(POM), cache, _LIBS, "Apache Kafka")
    return cache / _LIBS["broker"]


def resolve_kafka_apps(cache_dir: Path | None = None) -> dict[str, Path]:
    """Resolve the applications of ``tests/apps/`` (Kafka Streams with its examples, the Kafka
    Connect worker with the file connectors, all Kafka 4.3.1) from Maven Central; return each
    application's libs directory by name (``streams``, ``connect``).

    The cache is ``cache_dir``, else ``kafka-apps-4.3.1/`` beside the reference broker's cache;
    reused as :func:`resolve_kafka`'s is. Raises :class:`KafkaSetupError` when anything cannot be
    resolved: the tests that run these applications fail rather than skip.
    """
    cache = (
        Path(cache_dir).expanduser()
        if cache_dir is not None
        else _cache_dir(None).parent / f"kafka-apps-{APPS_VERSION}"
    )
    _resolve(_pom(APPS_POM), cache, _APPS_LIBS, "Kafka Streams and Kafka Connect")
    return {name: cache / libs for name, libs in _APPS_LIBS.items()}


def apps_classpath(app: str, cache_dir: Path | None = None) -> str:
    """The Java classpath of one application of ``tests/apps/`` (``streams`` or ``connect``)."""
    return str(resolve_kafka_apps(cache_dir)[app] / "*")


def kafka_classpath(cache_dir: Path | None = None) -> str:
    """The broker's Java classpath (Apache Kafka 4.4.0 and the log4j2 backend), resolving first."""
    return str(resolve_kafka(cache_dir) / "*")


def tools_classpath(cache_dir: Path | None = None) -> str:
    """The command-line tools' Java classpath, resolving first."""
    return str(resolve_kafka(cache_dir).parent / _LIBS["tools"] / "*")


_class_index: dict[Path, frozenset[str]] = {}


def _classes_in(libs: Path) -> frozenset[str]:
    if libs not in _class_index:
        names: set[str] = set()
        for jar in sorted(libs.glob("*.jar")):
            with zipfile.ZipFile(jar) as zf:
                names.update(
                    n[:-6].replace("/", ".")
                    for n in zf.namelist()
                    if n.endswith(".class") and "$" not in n
                )
        _class_index[libs] = frozenset(names)
    return _class_index[libs]


def tool_main_class(tool: str, cache_dir: Path | None = None) -> tuple[str, str]:
    """``(main class, classpath)`` that runs the Kafka script ``tool`` (e.g. ``kafka-topics``)."""
    name = tool.removesuffix(".sh")
    if name not in TOOL_MAIN_CLASSES:
        known = ", ".join(sorted(TOOL_MAIN_CLASSES))
        raise ValueError(f"unknown Kafka tool {tool!r}; known: {known}")
    broker_libs = resolve_kafka(cache_dir)
    libs = broker_libs if name in BROKER_CLASSPATH_TOOLS else broker_libs.parent / _LIBS["tools"]
    present = _classes_in(libs)
    for main in TOOL_MAIN_CLASSES[name]:
        if main in present:
            return main, str(libs / "*")
    raise KafkaSetupError(f"none of {TOOL_MAIN_CLASSES[name]} is on the classpath {libs}")


# --------------------------------------------------------------------------------------------
# Logging
# --------------------------------------------------------------------------------------------


def _log4j2_config(path: Path, log_file: Path | None, level: str = "WARN") -> Path:
    """Write a log4j2 properties config: ``level`` and up, to ``log_file`` or else stderr."""
    pattern = "[%d] %p %m (%c)%n"
    if log_file is None:
        appender = ["appender.out.type = Console", "appender.out.target = SYSTEM_ERR"]
    else:
        appender = ["appender.out.type = File", f"appender.out.fileName = {log_file}"]
    lines = [
        "status = error",
        *appender,
        "appender.out.name = OUT",
        "appender.out.layout.type = PatternLayout",
        f"appender.out.layout.pattern = {pattern}",
        f"rootLogger.level = {level}",
        "rootLogger.appenderRef.out.ref = OUT",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _tools_log_config(cache_dir: Path | None) -> Path:
    cache = resolve_kafka(cache_dir).parent
    path = cache / "tools-log4j2.properties"
    if not path.is_file():
        tmp = cache / f"tools-log4j2.properties.{os.getpid()}"
        _log4j2_config(tmp, None)
        tmp.replace(path)
    return path


def _jvm_base(
    java: str, heap: str, log_config: Path, classpath: str, short_lived: bool = False
) -> list[str]:
    # A short-lived tool (kafka-topics, a console consumer) spends most of its CPU starting:
    # the client compiler alone and the serial collector start it with about a third less
    # CPU time. Brokers and perf tools, whose speed is measured, keep the JVM's defaults.
    gc = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"] if short_lived else ["-XX:+UseG1GC"]
    return [
        java,
        f"-Xmx{heap}",
        *gc,
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile=file:{log_config}",
        "-cp",
        classpath,
    ]


def app_command(
    app: str,
    main: str,
    *args: str,
    log_dir: Path,
    heap: str = "256m",
    level: str = "INFO",
    cache_dir: Path | None = None,
) -> list[str]:
    """The command that runs one of ``tests/apps/``'s applications (``streams`` or ``connect``):
    ``java -cp <its classpath> main args...``, logging ``level`` and up to
    ``log_dir/<app>.log`` (config in ``log_dir/<app>-log4j2.properties``)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    config = _log4j2_config(log_dir / f"{app}-log4j2.properties", log_dir / f"{app}.log", level)
    return [*_jvm_base(_java(), heap, config, apps_classpath(app, cache_dir)), main, *args]


# --------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------


def tool_command(
    tool: str,
    *args: str,
    heap: str = "512m",
    cache_dir: Path | None = None,
    jvm_properties: dict[str, str] | None = None,
) -> list[str]:
    """The command line that runs a Kafka tool (for a caller that runs it in the background)."""
    main, classpath = tool_main_class(tool, cache_dir)
    props = [f"-D{k}={v}" for k, v in (jvm_properties or {}).items()]
    short_lived = not tool.endswith("perf-test")
    base = _jvm_base(_java(), heap, _tools_log_config(cache_dir), classpath, short_lived)
    return [*base[:1], *props, *base[1:], main, *args]


def run_tool(
    tool: str,
    *args: str,
    timeout: float = 120,
    input: str | None = None,
    heap: str = "512m",
    cache_dir: Path | None = None,
    check: bool = False,
    jvm_properties: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a Kafka command-line tool by its script name, e.g. ``run_tool("kafka-topics", ...)``
    (``jvm_properties``: ``-D`` system properties, as KAFKA_OPTS would give them).

    The tool runs as ``java -cp <classpath> <MainClass> args...``, logging WARN and up to stderr.
    Output is captured as text; ``check=True`` raises on a non-zero exit.
    """
    cmd = tool_command(tool, *args, heap=heap, cache_dir=cache_dir, jvm_properties=jvm_properties)
    return subprocess.run(
        cmd,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        stdin=None if input is not None else subprocess.DEVNULL,
    )


# --------------------------------------------------------------------------------------------
# Broker
# --------------------------------------------------------------------------------------------


def _random_cluster_id() -> str:
    """A Kafka cluster id: a random UUID, URL-safe base64 without padding (22 characters).

    Like Kafka's own Uuid.randomUuid(), never one starting with '-' (kafka-storage would read it
    as an option).
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _metadata_round_trip(bootstrap: str, timeout: float) -> bool:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        md = admin.list_topics(timeout=timeout)
    except KafkaException:
        return False
    return bool(md.brokers)


class KafkaBroker:
    """A single-node Apache Kafka 4.4.0 KRaft cluster (``process.roles=broker,controller``).

    Listens on 127.0.0.1 (a free client port and a free controller port), keeps its logs in a
    temporary directory (removed on :meth:`stop` unless ``keep=True``), and logs WARN and up to
    ``<log_dir>/kafka.log``. ``properties`` override the defaults in :attr:`DEFAULTS` and the
    listener settings. Use as a context manager, or call :meth:`start` / :meth:`stop`; the
    broker is also stopped at interpreter exit.
    """

    DEFAULTS: Mapping[str, str] = {
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Stratalog's default: topics are created explicitly.
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
    }

    def __init__(
        self,
        properties: Mapping[str, object] | None = None,
        *,
        heap: str = "512m",
        keep: bool = False,
        startup_timeout: float = 90,
        stop_timeout: float = 30,
        cache_dir: Path | None = None,
        listeners: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] = (),
    ) -> None:
        self.properties = {k: str(v) for k, v in (properties or {}).items()}
        self.jvm_options = list(jvm_options)  # more JVM flags for the broker
        # More client listeners beside PLAINTEXT: name -> security protocol (SSL, SASL_SSL,
        # ...), each on a free port; their settings (keystores, JAAS) go in ``properties``.
        self.extra_listeners = dict(listeners or {})
        self.listener_ports: dict[str, int] = {}
        self.heap = heap
        self.keep = keep
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.cache_dir = cache_dir
        self.port = 0
        self.controller_port = 0
        self.bootstrap = ""
        self.cluster_id = ""
        self.log_dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def server_log(self) -> Path:
        assert self.log_dir is not None, "broker not started"
        return self.log_dir / "kafka.log"

    @property
    def console_log(self) -> Path:
        assert self.log_dir is not None, "broker not started"
        return self.log_dir / "console.log"

    @property
    def bootstraps(self) -> dict[str, str]:
        """Listener name -> 127.0.0.1:port, PLAINTEXT and the extra listeners."""
        return {"PLAINTEXT": self.bootstrap} | {
            name: f"127.0.0.1:{port}" for name, port in self.listener_ports.items()
        }

    def _server_properties(self) -> dict[str, str]:
        assert self.log_dir is not None
        extra = "".join(f",{n}://127.0.0.1:{p}" for n, p in self.listener_ports.items())
        protocols = "".join(f",{n}:{self.extra_listeners[n]}" for n in self.listener_ports)
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
                + extra
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}" + extra,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
            + protocols,
            "log.dirs": str(self.log_dir / "data"),
            **self.DEFAULTS,
        }
        props.update(self.properties)
        return props

    def start(self) -> KafkaBroker:
        if self.alive:
            return self
        # The ports are chosen free, then bound by the JVM seconds later: another process on
        # a busy machine can take one meanwhile ("Address already in use"), so that start is
        # tried again on new ports.
        for attempt in range(3):
            try:
                return self._start_once()
            except KafkaSetupError as e:
                if "Address already in use" not in str(e) or attempt == 2:
                    raise
                log.warning("Apache Kafka lost a port to another process; starting again")
        raise AssertionError("unreachable")

    def _start_once(self) -> KafkaBroker:
        libs = resolve_kafka(self.cache_dir)
        java = _java()
        classpath = str(libs / "*")
        self.log_dir = Path(tempfile.mkdtemp(prefix="stratalog-kafka-"))
        self.port, self.controller_port = _free_port(), _free_port()
        while self.controller_port == self.port:
            self.controller_port = _free_port()
        taken = {self.port, self.controller_port}
        self.listener_ports = {}
        for name in self.extra_listeners:
            port = _free_port()
            while port in taken:
                port = _free_port()
            taken.add(port)
            self.listener_ports[name] = port
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.cluster_id = _random_cluster_id()

        config = self.log_dir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self._server_properties().items()))
        log_config = _log4j2_config(self.log_dir / "log4j2.properties", self.server_log)
        base = _jvm_base(java, self.heap, log_config, classpath)

        fmt = subprocess.run(
            [
                *_jvm_base(java, self.heap, log_config, classpath, short_lived=True),
                "kafka.tools.StorageTool",
                "format",
                "--ignore-formatted",
                "--cluster-id",
                self.cluster_id,
                "--config",
                str(config),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        if fmt.returncode != 0:
            self._cleanup()
            raise KafkaSetupError(
                f"kafka-storage format failed (exit {fmt.returncode}):\n{fmt.stdout}{fmt.stderr}"
            )

        with open(self.console_log, "ab") as console:
            self._proc = subprocess.Popen(
                [
                    *base[:1],
                    *self.jvm_options,
                    *base[1:],
                    f"-Dkafka.logs.dir={self.log_dir}",
                    BROKER_MAIN,
                    str(config),
                ],
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own session and process group, led by the JVM
            )
        atexit.register(self.stop)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._proc.poll() is not None:
                raise KafkaSetupError(
                    f"Apache Kafka exited with status {self._proc.returncode} while starting.\n"
                    + self._log_tails()
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaSetupError(
                    f"Apache Kafka was not ready at {self.bootstrap} within "
                    f"{self.startup_timeout:.0f}s.\n" + self._log_tails()
                )
            if _port_open(self.port) and _metadata_round_trip(self.bootstrap, min(5, remaining)):
                return
            time.sleep(0.2)

    def _log_tails(self) -> str:
        parts = []
        for path in (self.console_log, self.server_log):
            tail = _tail(path)
            if tail:
                parts.append(f"--- {path} (tail) ---\n{tail}")
        return "\n".join(parts) or "(the broker wrote no log output)"

    def stop(self) -> None:
        """Stop the JVM by its PID (its process group): SIGTERM, bounded wait, then SIGKILL."""
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        if proc is not None:
            self._signal(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                proc.wait(timeout=30)
            # Anything else left in the group (there should be nothing) goes too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self._cleanup()

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)

    def _cleanup(self) -> None:
        if self.log_dir is not None and not self.keep:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid} at {self.bootstrap}" if self.alive else "stopped"
        return f"<KafkaBroker {KAFKA_VERSION} {state}>"


# --------------------------------------------------------------------------------------------
# python -m stratalog.peers.kafka
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stratalog.peers.kafka",
        description=f"Run the reference Apache Kafka {KAFKA_VERSION} broker until Ctrl-C.",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra broker property (repeatable)",
    )
    parser.add_argument("--heap", default="512m", help="JVM max heap (default 512m)")
    parser.add_argument("--keep", action="store_true", help="keep the log directory on exit")
    args = parser.parse_args(argv)
    props: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        props[key.strip()] = value.strip()

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # Explicit handlers: a shell's background job starts with SIGINT ignored.
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    try:
        with KafkaBroker(props, heap=args.heap, keep=args.keep) as broker:
            print(f"Apache Kafka {KAFKA_VERSION} ready at {broker.bootstrap}", flush=True)
            print(
                f"(pid {broker.pid}, logs in {broker.log_dir}; Ctrl-C stops it)",
                file=sys.stderr,
                flush=True,
            )
            while broker.alive:
                time.sleep(0.5)
            print(f"Apache Kafka exited unexpectedly.\n{broker._log_tails()}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        return 0
    except KafkaSetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
