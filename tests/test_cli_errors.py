"""The `stratalog` command as a user meets it: bad input fails with one line, round trips hold.

Every command runs as a child process (`python -m stratalog.cli ...`) with a timeout. Client
commands share one `stratalog serve` broker per module (each test uses its own topics); tests of
`serve` itself start their own and stop them by PID. A bad input must end with exit code != 0
and one line on stderr naming the problem, never a traceback, and nothing acknowledged is lost.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition

from .conftest import REPO, BrokerProcess, create_topic
from .test_bad_input import assert_one_line_error, closed_port

CLI = [sys.executable, "-m", "stratalog.cli"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("COLUMNS", None)  # as in a pipe or a CI log: no terminal width
    return env


def run_cli(
    args: list[str], stdin: bytes | str = b"", timeout: float = 45
) -> subprocess.CompletedProcess:
    """Run one command; subprocess.run kills the child by PID if it outlives the timeout."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = subprocess.run(
        CLI + args, input=data, capture_output=True, timeout=timeout, cwd=REPO, env=_env()
    )
    proc.stdout = proc.stdout.decode("utf-8", "replace")
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    return proc


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


_counter = iter(range(10**6))


def new_topic(bootstrap: str, partitions: int = 1) -> str:
    name = f"cli-{os.getpid()}-{next(_counter)}"
    create_topic(bootstrap, name, partitions)
    return name


def stored(bootstrap: str, topic: str, n: int, timeout: float = 15) -> list[tuple]:
    """The first n records of partition 0 as (key, value) bytes, read with a plain client."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "cli-test-verify",
            "enable.auto.commit": False,
        }
    )
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[tuple] = []
        deadline = time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                out.append((m.key(), m.value()))
        return out
    finally:
        c.close()


def start_serve(args: list[str], timeout: float = 30) -> tuple[subprocess.Popen, str]:
    """`stratalog serve ARGS` and its first stdout line ('' if it exited or said nothing)."""
    proc = subprocess.Popen(
        [*CLI, "serve", "--log-level", "WARNING", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=_env(),
        start_new_session=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().decode() if ready else ""
    return proc, line


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
            return proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.wait(timeout=10)


def serve_must_refuse(args: list[str], *needles: str) -> None:
    """serve with these arguments must not start; it must exit with one line naming the problem."""
    proc, line = start_serve(args)
    try:
        assert "ready at" not in line, f"serve {args} started anyway: {line.strip()!r}"
        proc.wait(timeout=30)
        out, err = proc.communicate(timeout=10)
    finally:
        stop(proc, signal.SIGKILL)
    done = subprocess.CompletedProcess(
        args, proc.returncode, line + out.decode(errors="replace"), err.decode(errors="replace")
    )
    assert_one_line_error(done, *needles)


@pytest.fixture(scope="module")
def bp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One `stratalog serve` for the module's client-command tests."""
    b = BrokerProcess(tmp_path_factory.mktemp("cli") / "data")
    try:
        b.start()
        yield b
    finally:
        b.stop()


# == 1. bad input =================================================================================
# -- serve ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "setting, needle",
    [
        ("segment.bytes=-5", "segment.bytes"),
        ("storage.virtual_logs=0", "storage.virtual_logs"),
        ("storage.io_threads=1.5", "storage.io_threads"),
        ("tiers.migrate.threshold=abc", "tiers.migrate.threshold"),
        ("fsync=interval:0", "fsync"),
        ("fsync=interval:abc", "fsync"),
        ("=5", "unknown setting"),
        ("storage.layout=columnar", "storage.layout"),
    ],
)
def test_serve_refuses_bad_setting(tmp_path, setting, needle):
    serve_must_refuse(["-d", str(tmp_path / "d"), "--port", "0", "--set", setting], needle)


@pytest.mark.parametrize(
    "setting",
    [
        "cache.tail_bytes=-2",  # below -1 (automatic)
        "tiers.hot.capacity=-1",  # a negative size (0 is 'no limit')
        "group_commit_ms=inf",  # acks=all is never answered
        "group_commit_ms=nan",
        "retention.check.interval.ms=0",  # retention in a busy loop
        "admin.port=70000",  # not a port
        "num.partitions=0",  # auto-created topics with no partition
    ],
)
def test_serve_refuses_impossible_setting(tmp_path, setting):
    serve_must_refuse(
        ["-d", str(tmp_path / "d"), "--port", "0", "--set", setting], setting.split("=")[0]
    )


@pytest.mark.parametrize("port", ["-1", "70000"])
def test_serve_refuses_port_out_of_range(tmp_path, port):
    serve_must_refuse(["-d", str(tmp_path / "d"), "--port", port], "port", port)


def test_serve_port_from_config_file_is_used(tmp_path):
    """docs/configuration.md: `port` may be set in the TOML file given with --config."""
    port = closed_port()
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'port = {port}\nhost = "127.0.0.1"\n')
    proc, line = start_serve(["-d", str(tmp_path / "d"), "-c", str(cfg)])
    try:
        assert line.strip().endswith(f":{port}"), f"config file port {port} ignored: {line!r}"
    finally:
        stop(proc, signal.SIGKILL)


def test_serve_data_dir_is_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    serve_must_refuse(["-d", str(f), "--port", "0"], str(f))


def test_serve_data_dir_not_creatable(tmp_path):
    # /proc refuses mkdir even for root, where a chmod-ed directory would not.
    serve_must_refuse(["-d", "/proc/stratalog-cli-test/data", "--port", "0"], "data directory")


def test_serve_port_in_use(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        port = s.getsockname()[1]
        serve_must_refuse(["-d", str(tmp_path / "d"), "--port", str(port)], str(port), "in use")
    finally:
        s.close()


def test_serve_bad_host(tmp_path):
    serve_must_refuse(
        ["-d", str(tmp_path / "d"), "--port", "0", "--host", "no-such-host.invalid"],
        "no-such-host.invalid",
    )


# -- nothing listening at --bootstrap -------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["produce", "t"],
        ["consume", "t"],
        ["status"],
        ["topics", "list"],
        ["topics", "create", "t"],
        ["topics", "describe", "t"],
        ["topics", "delete", "t"],
        ["replay", "t", "--from", "0", "--to", "1"],
    ],
    ids=lambda a: "-".join(a[:2]),
)
def test_unreachable_bootstrap(args):
    addr = f"127.0.0.1:{closed_port()}"
    start = time.monotonic()
    proc = run_cli([*args, "-b", addr], "x\n", timeout=60)
    assert time.monotonic() - start < 30
    assert_one_line_error(proc, addr, "cannot reach")


def test_malformed_bootstrap():
    assert_one_line_error(run_cli(["topics", "list", "-b", "localhost"]), "HOST:PORT")


def test_ipv6_broker_is_usable_from_the_cli(tmp_path):
    """`serve --host ::1` must print an address clients accept, and `-b [::1]:PORT` must work."""
    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    proc, line = start_serve(["-d", str(tmp_path / "d"), "--port", "0", "--host", "::1"])
    try:
        assert "ready at" in line, line
        port = line.strip().rsplit(":", 1)[1]
        listed = run_cli(["topics", "list", "-b", f"[::1]:{port}"])
        assert listed.returncode == 0, listed.stderr.strip()
        assert f"[::1]:{port}" in line, f"ready line not usable as --bootstrap: {line.strip()!r}"
    finally:
        stop(proc)


# -- topics ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, needles",
    [
        (["-p", "0"], ["partitions"]),
        (["-p", "-3"], ["partitions"]),
        (["--config", "retention.ms=abc"], ["retention.ms"]),
        (["--config", "no.such.config=1"], ["no.such.config"]),
        (["--config", "retention.ms"], ["key=value"]),
    ],
    ids=["zero-partitions", "negative-partitions", "bad-value", "unknown-config", "no-equals"],
)
def test_topics_create_bad_input(bp, extra, needles):
    name = f"bad-create-{next(_counter)}"
    assert_one_line_error(run_cli(["topics", "create", name, "-b", bp.bootstrap, *extra]), *needles)
    assert name not in run_cli(["topics", "list", "-b", bp.bootstrap]).stdout.split()


@pytest.mark.parametrize(
    "name, needle",
    [("", "empty"), ("a" * 300, "249"), ("..", ".."), ("bad name!", "bad name!")],
    ids=["empty", "too-long", "dots", "bad-chars"],
)
def test_topics_create_invalid_name(bp, name, needle):
    assert_one_line_error(run_cli(["topics", "create", name, "-b", bp.bootstrap]), needle)


def test_error_message_shows_allowed_characters(bp):
    """The broker says "characters outside [a-zA-Z0-9._-]"; the CLI must print all of it."""
    line = assert_one_line_error(run_cli(["topics", "create", "bad name!", "-b", bp.bootstrap]))
    assert "[a-zA-Z0-9._-]" in line, line


def test_topics_create_existing(bp):
    name = new_topic(bp.bootstrap)
    assert_one_line_error(run_cli(["topics", "create", name, "-b", bp.bootstrap]), "already exists")


def test_topics_describe_missing(bp):
    assert_one_line_error(
        run_cli(["topics", "describe", "no-such-topic", "-b", bp.bootstrap]), "does not exist"
    )


def test_topics_delete_missing_names_the_problem(bp):
    line = assert_one_line_error(
        run_cli(["topics", "delete", "no-such-topic", "-b", bp.bootstrap]), "no-such-topic"
    )
    assert "does not exist" in line or "nknown topic" in line, line


# -- produce and consume ---------------------------------------------------------------------------
def test_consume_missing_topic(bp):
    proc = run_cli(["consume", "no-such-topic", "-b", bp.bootstrap, "--timeout", "1"])
    assert_one_line_error(proc, "no-such-topic", "does not exist")


def test_produce_line_over_max_message_bytes(bp):
    topic = new_topic(bp.bootstrap)
    proc = run_cli(["produce", topic, "-b", bp.bootstrap], "y" * 2_000_000 + "\n")
    assert_one_line_error(proc, topic, "too large")


def test_produce_bad_acks(bp):
    topic = new_topic(bp.bootstrap)
    line = assert_one_line_error(
        run_cli(["produce", topic, "-b", bp.bootstrap, "--acks", "bogus"], "x\n"), "acks"
    )
    assert "KafkaError{" not in line, f"internal error object instead of a message: {line}"


# -- replay ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "frm, to, needle",
    [
        ("yesterday", "2030-01-01", "yesterday"),
        ("2020-13-45", "2030-01-01", "2020-13-45"),
        ("0", "soon", "soon"),
        ("2030-01-01", "2020-01-01", "before it starts"),
    ],
)
def test_replay_bad_times(bp, frm, to, needle):
    topic = new_topic(bp.bootstrap)
    proc = run_cli(["replay", topic, "--from", frm, "--to", to, "-b", bp.bootstrap])
    assert_one_line_error(proc, needle)


def test_replay_missing_topic(bp):
    proc = run_cli(["replay", "no-such-topic", "--from", "0", "--to", "1", "-b", bp.bootstrap])
    assert_one_line_error(proc, "no-such-topic", "does not exist")


def test_replay_past_the_end_is_empty_not_an_error(bp):
    topic = new_topic(bp.bootstrap)
    assert_ok(run_cli(["produce", topic, "-b", bp.bootstrap], "a\nb\n"))
    proc = run_cli(
        ["replay", topic, "--from", "2100-01-01", "--to", "2100-01-02", "-b", bp.bootstrap]
    )
    assert_ok(proc)
    assert proc.stdout == ""
    assert "0 record(s) of 0" in proc.stderr


# == 2. round trips ================================================================================
def test_produce_consume_round_trip_with_keys_empty_and_long_lines(bp):
    topic = new_topic(bp.bootstrap)
    long = "L" * 500_000
    lines = ["k1:v1", "", "no-key", "k2:", ":v3", "k4:a:b", long, "last-without-newline"]
    proc = run_cli(["produce", topic, "-b", bp.bootstrap, "--key-separator", ":"], "\n".join(lines))
    assert_ok(proc)
    assert f"produced {len(lines)} record(s)" in proc.stderr
    out = run_cli(
        [
            "consume",
            topic,
            "-b",
            bp.bootstrap,
            "--from-beginning",
            "--print-key",
            "--max-messages",
            str(len(lines)),
            "--timeout",
            "10",
        ]
    )
    assert_ok(out)
    assert out.stdout.split("\n")[:-1] == [
        "k1\tv1",
        "\t",
        "\tno-key",
        "k2\t",
        "\tv3",
        "k4\ta:b",
        "\t" + long,
        "\tlast-without-newline",
    ]
    assert stored(bp.bootstrap, topic, 3)[:3] == [(b"k1", b"v1"), (None, b""), (None, b"no-key")]


def test_produce_non_utf8_bytes_round_trip(bp):
    """Kafka values are bytes; a line that is not UTF-8 is stored as it came."""
    topic = new_topic(bp.bootstrap)
    proc = run_cli(["produce", topic, "-b", bp.bootstrap], b"ok\n\xff\xfebin\nafter\n")
    assert_ok(proc)
    assert [v for _, v in stored(bp.bootstrap, topic, 3)] == [b"ok", b"\xff\xfebin", b"after"]


def test_consume_stops_at_max_messages_and_commits_with_group(bp):
    topic = new_topic(bp.bootstrap)
    assert_ok(run_cli(["produce", topic, "-b", bp.bootstrap], "1\n2\n3\n"))
    group = f"g-{topic}"
    args = ["consume", topic, "-b", bp.bootstrap, "--from-beginning", "--group", group]
    first = run_cli([*args, "--max-messages", "2", "--timeout", "10"])
    assert_ok(first)
    assert first.stdout.split() == ["1", "2"]
    rest = run_cli([*args, "--timeout", "2"])
    assert_ok(rest)
    assert rest.stdout.split() == ["3"]
    # Past the end: nothing more, a clean exit.
    again = run_cli([*args, "--timeout", "1"])
    assert_ok(again)
    assert again.stdout == "" and "consumed 0 record(s)" in again.stderr


def test_topics_create_list_describe(bp):
    name = f"roundtrip-{next(_counter)}"
    created = run_cli(
        [
            "topics",
            "create",
            name,
            "-p",
            "3",
            "--config",
            "retention.ms=3600000",
            "-b",
            bp.bootstrap,
        ]
    )
    assert_ok(created)
    assert f"created topic {name} with 3 partition(s)" in created.stdout
    assert name in run_cli(["topics", "list", "-b", bp.bootstrap]).stdout.split()
    assert_ok(run_cli(["produce", name, "-b", bp.bootstrap], "a\nb\n"))
    d = run_cli(["topics", "describe", name, "-b", bp.bootstrap])
    assert_ok(d)
    rows = re.findall(r"│\s*(\d+)\s*│\s*(\d+)\s*│\s*(\d+)\s*│\s*(\d+)\s*│", d.stdout)
    assert [r[0] for r in rows] == ["0", "1", "2"], d.stdout
    assert sum(int(r[3]) for r in rows) == 2
    assert re.search(r"retention\.ms\s*│\s*3600000\s*│\s*topic", d.stdout), d.stdout


def test_topics_delete_removes_the_topic(bp):
    name = new_topic(bp.bootstrap)
    proc = run_cli(["topics", "delete", name, "-b", bp.bootstrap])
    assert_ok(proc)
    assert f"deleted topic {name}" in proc.stdout
    assert name not in run_cli(["topics", "list", "-b", bp.bootstrap]).stdout.split()


def test_status_json_counts_the_records(bp):
    topic = new_topic(bp.bootstrap)
    assert_ok(run_cli(["produce", topic, "-b", bp.bootstrap], "a\nb\nc\n"))
    proc = run_cli(["status", "-b", bp.bootstrap, "--json"])
    assert_ok(proc)
    doc = json.loads(proc.stdout)
    assert sum(doc["topics"][topic]["log_end_offsets"]) == 3
    assert doc["broker"]["bootstrap"] == bp.bootstrap


def test_status_table_shows_whole_topic_names_and_times(bp):
    """Piped (no terminal), `status` must still print topic names and times in full."""
    topic = new_topic(bp.bootstrap)
    assert_ok(run_cli(["produce", topic, "-b", bp.bootstrap], "a\n"))
    proc = run_cli(["status", "-b", bp.bootstrap])
    assert_ok(proc)
    assert topic in proc.stdout
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", proc.stdout), proc.stdout[-3000:]


def test_help_of_every_command(bp):
    for args in (
        [],
        ["serve"],
        ["produce"],
        ["consume"],
        ["replay"],
        ["status"],
        ["bench"],
        ["topics"],
        ["topics", "create"],
    ):
        proc = run_cli([*args, "--help"])
        assert_ok(proc)
        assert "Usage:" in proc.stdout


def test_bench_help_shows_the_profile_name():
    """`bench --quick` is documented as "The workloads' small [profile.quick] sizes."."""
    proc = run_cli(["bench", "--help"], timeout=30)
    assert_ok(proc)
    assert "[profile.quick]" in proc.stdout, re.findall(r".*--quick.*", proc.stdout)


# == 3. signals ==================================================================================
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_exits_0_on_signal_and_restarts_with_every_record(tmp_path, sig):
    b = BrokerProcess(tmp_path / "data")
    try:
        b.start()
        topic = new_topic(b.bootstrap)
        lines = [f"r{i}" for i in range(20)]
        assert_ok(run_cli(["produce", topic, "-b", b.bootstrap], "\n".join(lines) + "\n"))
        assert b.proc is not None
        os.kill(b.proc.pid, sig)
        assert b.proc.wait(timeout=30) == 0
        assert "Traceback" not in b.log_path.read_text()
        b.proc.stdout.close()
        b.proc = None
        b.start()
        out = run_cli(
            [
                "consume",
                topic,
                "-b",
                b.bootstrap,
                "--from-beginning",
                "--max-messages",
                "20",
                "--timeout",
                "10",
            ]
        )
        assert_ok(out)
        assert out.stdout.split() == lines
    finally:
        b.kill()


@pytest.mark.parametrize(
    ("option", "value"), [("--limit", "-1"), ("--lateness-ms", "-1")], ids=["limit", "lateness"]
)
def test_replay_refuses_negative_numbers(bp, option, value):
    span = ["--from", "2026-01-01T00:00", "--to", "2026-01-02T00:00"]
    proc = run_cli(["replay", "t", *span, option, value, "-b", bp.bootstrap])
    assert_one_line_error(proc, option, value)
