"""NATS JetStream as a benchmark peer: target kind ``nats``.

Server: Debian's ``nats-server`` (``/usr/sbin/nats-server``, ``make bench-deps``), started by the
target on 127.0.0.1 on a free port with ``-js -sd <tmpdir>`` (file storage) and stopped by PID.

Layout: **one stream per topic-partition** (stream ``<topic>-p<n>``, subject
``bench.<topic>.<n>``, file storage, limits retention, one replica). A JetStream stream is one
ordered log with its own store and lock, so it is what a Kafka partition is; one stream per topic
with partitioned subjects would serialise every partition through one store. Producers spread a
topic's records round-robin over its partitions' subjects; consumer ``i`` of ``n`` reads every
``n``-th (topic, partition) from the start, like the Kafka consumers.

Durability (setting ``sync``):

* ``"default"``: JetStream's file store writes to the page cache and fsyncs in the background
  (every 60 s in nats-server 2.9, every 2 min from 2.10): a power cut loses up to that window.
* ``"always"``: a config file with ``jetstream { sync_interval: always }`` (fsync on every write).
  That option exists from nats-server 2.10 on; older servers (Debian bookworm ships 2.9.10) reject
  it, and the target then reports itself unavailable rather than run with weaker durability.

Other settings: ``max_pending`` (publishes in flight per producer, default 4000).

Clients: nats-py (asyncio) inside the child process. The synchronous
:class:`~stratalog.bench.clients.ProducerClient` interface is kept by driving a private event loop
from ``send``/``idle``/``flush``: ``send`` buffers, and every 64 records the loop runs once to hand
them to ``js.publish_async`` (many acks in flight, so publishing is pipelined) and to serve the
acks that have arrived.
"""

from __future__ import annotations

import asyncio
import functools
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratalog.bench.clients import (
    _UNPACK_FROM,
    ClientFactory,
    ConsumerClient,
    ConsumerJob,
    ProducerClient,
    ProducerJob,
)
from stratalog.bench.targets import (
    Target,
    TargetUnavailable,
    free_port,
    register,
    stop_process,
    wait_port,
)
from stratalog.bench.workload import TargetSpec, Workload

NATS_SERVER = Path("/usr/sbin/nats-server")
SYNC_CHOICES = ("default", "always")
_PUMP_EVERY = 64  # records buffered by send() before the event loop runs


def _safe(topic: str) -> str:
    # Stream names may not hold '.', '*', '>' or spaces; subjects split on '.'.
    return re.sub(r"[^A-Za-z0-9_-]", "_", topic)


def stream_name(topic: str, partition: int) -> str:
    return f"{_safe(topic)}-p{partition}"


def subject(topic: str, partition: int) -> str:
    return f"bench.{_safe(topic)}.{partition}"


def server_version(binary: Path = NATS_SERVER) -> str:
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    m = re.search(r"v?(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else out.strip()


async def _connect(url: str, **kw: Any):
    import nats

    return await nats.connect(
        url, connect_timeout=10, allow_reconnect=False, max_reconnect_attempts=0, **kw
    )


@register
class NatsTarget(Target):
    """NATS JetStream (file store, one stream per topic-partition); see the module docstring."""

    kind = "nats"

    def __init__(self, spec: TargetSpec, workload: Workload) -> None:
        super().__init__(spec, workload)
        self.proc: subprocess.Popen | None = None
        self.sync = str(spec.settings.get("sync", "default"))
        self.max_pending = int(spec.settings.get("max_pending", 4000))
        self.url = ""
        self._version = ""

    def version(self) -> str:
        if not self._version and NATS_SERVER.exists():
            self._version = server_version()
        return self._version

    def describe(self) -> str:
        v = self.version() or "?"
        if self.sync == "always":
            dur = "sync_interval: always, fsync on every write"
        else:
            every = "60 s" if v.startswith("2.9") else "2 min"
            dur = f"default durability: page cache, background fsync every {every}"
        return f"NATS JetStream {v} (file store, a stream per partition, {dur})"

    def start(self) -> None:
        if not NATS_SERVER.exists():
            raise TargetUnavailable(f"{NATS_SERVER} is missing (make bench-deps)")
        if self.sync not in SYNC_CHOICES:
            raise RuntimeError(f"nats: sync must be one of {SYNC_CHOICES}, not {self.sync!r}")
        wd = self._mkworkdir()
        store = wd / "js"
        port = free_port()
        cmd = [str(NATS_SERVER), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)]
        if self.sync == "always":
            conf = wd / "nats.conf"
            conf.write_text(f'jetstream {{\n  store_dir: "{store}"\n  sync_interval: always\n}}\n')
            # Ask the server whether it knows the option before starting it for real.
            test = subprocess.run(
                [str(NATS_SERVER), "-c", str(conf), "-t"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if test.returncode != 0 or "unknown field" in test.stdout + test.stderr:
                self._rmworkdir()
                raise TargetUnavailable(
                    f'sync = "always" needs nats-server 2.10+ (sync_interval: always); '
                    f"the installed {self.version()} only fsyncs its file store every 60 s"
                )
            cmd += ["-c", str(conf)]
        with open(wd / "nats-server.log", "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=wd,
            )
        try:
            wait_port(port, 30, self.proc)
            self.url = f"nats://127.0.0.1:{port}"
            asyncio.run(asyncio.wait_for(self._wait_jetstream(), 30))
        except BaseException:
            self.stop()
            raise

    async def _wait_jetstream(self) -> None:
        nc = await _connect(self.url)
        try:
            js = nc.jetstream()
            while True:
                try:
                    await js.account_info()
                    return
                except Exception:  # JetStream still starting
                    await asyncio.sleep(0.1)
        finally:
            await nc.close()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, timeout=15)
        self._rmworkdir()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def data_dirs(self) -> list[Path]:
        return [self.workdir / "js"] if self.workdir else []

    def create_topics(self, names: list[str], partitions: int) -> None:
        asyncio.run(asyncio.wait_for(self._create(names, partitions), 300))

    async def _create(self, names: list[str], partitions: int) -> None:
        from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

        nc = await _connect(self.url)
        try:
            js = nc.jetstream(timeout=30)
            for t in names:
                for p in range(partitions):
                    await js.add_stream(
                        StreamConfig(
                            name=stream_name(t, p),
                            subjects=[subject(t, p)],
                            storage=StorageType.FILE,
                            retention=RetentionPolicy.LIMITS,
                            discard=DiscardPolicy.OLD,
                            num_replicas=1,
                        )
                    )
        finally:
            await nc.close()

    def count_records(self, topics: list[str], partitions: int) -> int | None:
        return asyncio.run(asyncio.wait_for(self._count(topics, partitions), 120))

    async def _count(self, topics: list[str], partitions: int) -> int:
        nc = await _connect(self.url)
        try:
            js = nc.jetstream(timeout=30)
            total = 0
            for t in topics:
                for p in range(partitions):
                    info = await js.stream_info(stream_name(t, p))
                    total += int(info.state.messages)
            return total
        finally:
            await nc.close()

    def client_factory(self) -> ClientFactory:
        return NatsClientFactory(self.url, self.max_pending)


# ------------------------------------------------------------------------------------------------
# Clients (run in the load child processes)
# ------------------------------------------------------------------------------------------------


def _shutdown(loop: asyncio.AbstractEventLoop, nc: Any) -> None:
    """Close the connection, then cancel what nats-py leaves running (heartbeat checks...)."""
    try:
        loop.run_until_complete(asyncio.wait_for(nc.close(), 10))
    except Exception:
        pass
    tasks = asyncio.all_tasks(loop)
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.close()


@dataclass
class NatsClientFactory(ClientFactory):
    url: str
    max_pending: int = 4000


class NatsProducerClient(ProducerClient):
    """``js.publish_async`` with up to ``max_pending`` acks in flight, driven synchronously."""

    def __init__(self, factory: NatsClientFactory, job: ProducerJob) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.nc = self.loop.run_until_complete(
            _connect(factory.url, skip_subject_validation=True, pending_size=8 * 1024 * 1024)
        )
        self.js = self.nc.jetstream(publish_async_max_pending=factory.max_pending)
        self.subjects = {t: [subject(t, p) for p in range(job.partitions)] for t in job.topics}
        self.next = dict.fromkeys(job.topics, 0)
        self.buf: list[tuple[str, bytes, bool]] = []
        # One PING/PONG so the connection is up before the clock starts.
        self.loop.run_until_complete(self.nc.flush(timeout=10))

    def _done(self, fut: asyncio.Future) -> None:
        if fut.cancelled():
            self._failed("cancelled")
        elif (e := fut.exception()) is not None:
            self._failed(f"{type(e).__name__}: {e}")

    def _done_tracked(self, value: bytes, fut: asyncio.Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self._done(fut)
            return
        self.latency.pending.append(time.time_ns() // 1000 - _UNPACK_FROM(value)[0])

    def _failed(self, why: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = why

    async def _pump(self) -> None:
        buf, self.buf = self.buf, []
        pub = self.js.publish_async
        for subj, value, track in buf:
            fut = await pub(subj, value)
            fut.add_done_callback(
                functools.partial(self._done_tracked, value) if track else self._done
            )
        # Let the flusher write and the reader deliver acks that are already here.
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    def send(self, topic: str, value: bytes, track: bool) -> None:
        subs = self.subjects[topic]
        i = self.next[topic]
        self.next[topic] = i + 1
        self.buf.append((subs[i % len(subs)], value, track))
        self.sent += 1
        if len(self.buf) >= _PUMP_EVERY:
            self.loop.run_until_complete(self._pump())

    def idle(self, seconds: float) -> None:
        if self.buf:
            self.loop.run_until_complete(self._pump())
        self.loop.run_until_complete(asyncio.sleep(max(0.0, min(seconds, 0.05))))

    def flush(self, timeout: float) -> None:
        async def wait_all() -> None:
            if self.buf:
                await self._pump()
            await self.nc.flush(timeout=max(1, int(timeout)))
            if self.js.publish_async_pending():
                await asyncio.wait_for(self.js.publish_async_completed(), timeout)

        try:
            self.loop.run_until_complete(wait_all())
        except TimeoutError:
            pass
        except Exception as e:  # connection lost: what is not acked stays unacked
            self._failed(f"flush: {type(e).__name__}: {e}")
        self.unacked = self.js.publish_async_pending()
        self.latency.fold()

    def close(self) -> None:
        _shutdown(self.loop, self.nc)


class NatsConsumerClient(ConsumerClient):
    """Ordered push consumers (ephemeral, no acks, flow-controlled) from each stream's start."""

    def __init__(self, factory: NatsClientFactory, job: ConsumerJob) -> None:
        super().__init__(job.track_latency)
        self.loop = asyncio.new_event_loop()
        self.values: list[bytes] = []
        self.event = asyncio.Event()
        tps = [(t, p) for t in job.topics for p in range(job.partitions)]
        mine = tps[job.index :: job.count]
        self.nc = self.loop.run_until_complete(_connect(factory.url))
        self.subs = self.loop.run_until_complete(self._subscribe(mine))

    async def _subscribe(self, mine: list[tuple[str, int]]) -> list[Any]:
        from nats.js.api import DeliverPolicy

        js = self.nc.jetstream(timeout=30)
        subs = []
        for t, p in mine:
            subs.append(
                await js.subscribe(
                    subject(t, p),
                    stream=stream_name(t, p),
                    cb=self._on_msg,
                    ordered_consumer=True,
                    deliver_policy=DeliverPolicy.ALL,
                )
            )
        await self.nc.flush(timeout=10)
        return subs

    async def _on_msg(self, msg: Any) -> None:
        self.values.append(msg.data)
        self.event.set()

    async def _wait(self, timeout: float) -> None:
        await asyncio.sleep(0)
        if not self.values:
            self.event.clear()
            try:
                await asyncio.wait_for(self.event.wait(), timeout)
            except TimeoutError:
                return
        # A couple more turns of the loop: whatever is already read joins this batch.
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    def consume(self, timeout: float) -> tuple[int, int]:
        self.loop.run_until_complete(self._wait(timeout))
        values, self.values = self.values, []
        if not values:
            return 0, 0
        if self.track:
            self.record_latencies(values)
        return len(values), sum(map(len, values))

    def close(self) -> None:
        _shutdown(self.loop, self.nc)


NatsClientFactory.producer_class = NatsProducerClient
NatsClientFactory.consumer_class = NatsConsumerClient
