"""One run: start a target, create the topic, run the workload under the nemesis, heal, settle,
read everything back, check; ``history.jsonl`` and ``result.json`` under the run's directory.

Phases, in order (``progress`` is told each one): ``start`` (cluster up, topic created and led),
``workload`` (``duration`` seconds of sends, polls and faults), ``heal`` (every process running
again; producers get a report for every send, bounded by ``message.timeout.ms``), ``settle``,
``final-reads`` and ``check``. The target is stopped whatever happens; its data is removed
after a valid run unless ``keep_data``, and its logs are copied to ``<run>/logs/``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import NewTopic

from stratalog.faults.checker import check
from stratalog.faults.history import History
from stratalog.faults.nemesis import CUTS, FAULTS, Nemesis, NemesisConfig
from stratalog.faults.proxy import Mode
from stratalog.faults.targets import Target, admin_client, make_target, remove_data
from stratalog.faults.workload import Workload, WorkloadConfig, final_reads

Progress = Callable[[str, float, float], None]  # (phase, done, total) in seconds


@dataclass
class RunConfig:
    target: str = "stratalog"  # stratalog | kafka
    duration: float = 60.0
    seed: int = 0
    faults: tuple[str, ...] = FAULTS
    fixed: bool = False  # the faults once, in order (else drawn at random)
    rate: float = 200.0
    partitions: int = 6
    producers: int = 4
    assign_consumers: int = 2
    subscribe_consumers: int = 2
    quiet_start: float = 5.0
    gap: tuple[float, float] = (5.0, 15.0)
    restart_delay: tuple[float, float] = (0.0, 5.0)
    pause: tuple[float, float] = (5.0, 5.0)
    cut: tuple[float, float] = (6.0, 6.0)  # etcd-cut1 / isolate1 length
    cut_mode: Mode = "blackhole"
    settle: float = 10.0
    led_timeout: float = 30.0  # after settling, how long to wait for every partition's leader
    final_read_timeout: float = 60.0
    message_timeout_ms: int = 120_000  # long: see stratalog.faults.workload
    drain_timeout: float = 30.0  # after the workload, for every send's report
    topic: str = "faults"
    settings: dict[str, str] = field(default_factory=dict)  # broker settings / properties
    flush_messages: bool = False  # Kafka: flush.messages=1 on the topic
    broker_log_level: str = "WARNING"  # Stratalog brokers' --log-level
    keep_data: bool = False


def _wait_led(target: Target, topic: str, partitions: int, timeout: float) -> bool:
    """Until every partition has a leader in the metadata; False when it never did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(target.leaders(topic, timeout=5)) == partitions:
            return True
        time.sleep(0.5)
    return False


def _create_topic(target: Target, cfg: RunConfig) -> None:
    admin = admin_client(target.bootstrap)
    topic = NewTopic(cfg.topic, cfg.partitions, 3, config=target.topic_configs())
    deadline = time.monotonic() + 60
    while True:
        try:
            admin.create_topics([topic])[cfg.topic].result(timeout=30)
            break
        except KafkaException as e:
            if "TOPIC_ALREADY_EXISTS" in str(e):
                break
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    if not _wait_led(target, cfg.topic, cfg.partitions, 60):
        raise RuntimeError(f"topic {cfg.topic!r} had no leader for every partition within 60 s")


def _client_log(path: Path) -> logging.Logger:
    """librdkafka's own log lines, to a file of the run (not the console)."""
    logger = logging.getLogger(f"stratalog.faults.clients.{path.parent.name}.{id(path)}")
    logger.propagate = False
    # librdkafka's debug lines (STRATALOG_FAULTS_CLIENT_DEBUG, see workload.py) are DEBUG
    debug = os.environ.get("STRATALOG_FAULTS_CLIENT_DEBUG")
    logger.setLevel(logging.DEBUG if debug else logging.INFO)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.addHandler(handler)
    return logger


def run(cfg: RunConfig, out: Path, progress: Progress | None = None) -> dict[str, Any]:
    """One run into ``out``; returns what ``result.json`` holds."""
    out.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda phase, done, total: None)
    target = make_target(
        cfg.target,
        out / "cluster",
        settings=cfg.settings,
        flush_messages=cfg.flush_messages,
        log_level=cfg.broker_log_level,
        network=any(f in CUTS for f in cfg.faults),
    )
    history = History(out / "history.jsonl")
    client_log = _client_log(out / "clients.log")
    timings: dict[str, float] = {}
    result: dict[str, Any] = {
        "config": dataclasses.asdict(cfg),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    t0 = time.monotonic()
    # The wall clock at history time 0, to line the history up with the brokers' logs.
    history.info("harness", "start", value={"wall_clock": round(time.time(), 6)})
    result["wall_clock_at_0"] = round(time.time() - history.now(), 6)

    def mark(name: str) -> None:
        timings[name] = round(time.monotonic() - t0, 3)

    nemesis: Nemesis | None = None
    workload: Workload | None = None
    try:
        say("start", 0, cfg.duration)
        target.start()
        _create_topic(target, cfg)
        mark("started")
        workload = Workload(
            WorkloadConfig(
                bootstrap=target.bootstrap,
                topic=cfg.topic,
                partitions=cfg.partitions,
                rate=cfg.rate,
                producers=cfg.producers,
                assign_consumers=cfg.assign_consumers,
                subscribe_consumers=cfg.subscribe_consumers,
                message_timeout_ms=cfg.message_timeout_ms,
                drain_timeout=cfg.drain_timeout,
                seed=cfg.seed,
            ),
            history,
            client_log,
        )
        nemesis = Nemesis(
            target,
            history,
            NemesisConfig(
                faults=tuple(cfg.faults),
                fixed=cfg.fixed,
                quiet_start=cfg.quiet_start,
                gap=cfg.gap,
                restart_delay=cfg.restart_delay,
                pause=cfg.pause,
                cut=cfg.cut,
                cut_mode=cfg.cut_mode,
                seed=cfg.seed,
            ),
            cfg.topic,
        )
        workload.start()
        nemesis.start()
        begin = time.monotonic()
        while (elapsed := time.monotonic() - begin) < cfg.duration:
            say("workload", elapsed, cfg.duration)
            time.sleep(min(0.5, cfg.duration - elapsed))
        mark("workload")

        say("heal", cfg.duration, cfg.duration)
        workload.stop_sending()
        nemesis.stop()
        nemesis.join(timeout=180)
        healed = nemesis.heal()
        workload.join_producers(cfg.drain_timeout + 30)
        workload.stop_consumers()
        mark("healed")

        say("settle", cfg.duration, cfg.duration)
        time.sleep(cfg.settle)
        led = _wait_led(target, cfg.topic, cfg.partitions, cfg.led_timeout)
        mark("settled")

        say("final-reads", cfg.duration, cfg.duration)
        final_reads(
            target.bootstrap,
            cfg.topic,
            cfg.partitions,
            history,
            client_log,
            timeout=cfg.final_read_timeout,
        )
        mark("final_reads")
        result["nemesis"] = {
            "applied": nemesis.applied,
            "errors": nemesis.errors,
            "healed": healed,
            "led_after_settle": led,
        }
        result["workload"] = {"unfinished_threads": workload.unfinished}
    finally:
        if workload is not None:  # an exception above: no client may outlive the run
            workload.stop_sending()
            workload.stop_consumers(timeout=5)
        if nemesis is not None:
            nemesis.stop()
        history.close()
        for h in list(client_log.handlers):
            client_log.removeHandler(h)
            h.close()
        try:
            target.stop()
        finally:
            logs = out / "logs"
            logs.mkdir(exist_ok=True)
            for path in target.logs():
                if path.is_file():
                    shutil.copy(path, logs / f"{path.parent.name}-{path.name}")

    say("check", cfg.duration, cfg.duration)
    result["check"] = check(history.events)
    mark("checked")
    result["timings"] = timings
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    if result["check"]["valid"] is True and not cfg.keep_data:
        remove_data(target)
    return result
