"""History at scale: what the bytes a broker retains cost its start-up time and its memory.

The storage issue's goal is that history costs disk, not memory: a broker's resident memory and
start-up time must not grow with the bytes it keeps. This tool fills a data directory with
small-chunk history (many partitions of a few virtual logs, idempotent producers, part of it
migrated to a cold tier) straight through the storage engine, then times start-ups in fresh
processes and reads their memory from ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``):

* ``open``: ``LogStore.open`` of every partition (the storage alone), then a clean close;
* ``serve``: ``stratalog serve`` until it answers an ApiVersions request, then SIGTERM;
* after a crash: an append of ``--tail`` bytes past the last index checkpoint, then the process
  ends without closing anything (what ``kill -9`` leaves), then ``serve`` again, killed with
  SIGKILL once it answers and started a second time;
* ``lookups``: random offsets and timestamps looked up in each partition's history, hot and
  cold, with the index-run cache emptied before each: the reads each makes, and its time.

``fill`` only adds: ``run --sizes 1G,10G`` fills to 1 GB, measures, fills on to 10 GB and
measures again. ``--drop-cache`` evicts the directory's files from the page cache before each
start (``posix_fadvise(DONTNEED)``, no root needed), so a start that reads history pays the disk.

    python -m stratalog.bench.history_scale run --dir /tmp/hist --sizes 1G,10G [--drop-cache]
    python -m stratalog.bench.history_scale fill --dir /tmp/hist --bytes 1G
    python -m stratalog.bench.history_scale open|serve|crash|lookups --dir /tmp/hist

Results go to stdout as JSON lines (and to ``--out`` with ``run``). The product never imports
this module.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from crc32c import crc32c

TOPIC = "history"
PRODUCERS_PER_PARTITION = 2


# -- settings shared by every step ------------------------------------------------------------
def _settings(args) -> dict[str, str]:
    d = Path(args.dir)
    return {
        "fsync": "never",  # filling: the page cache is enough; the start-ups read the same
        "storage.virtual_logs": str(args.logs),
        "segment.bytes": str(args.segment_bytes),
        "tiers.cold.path": str(d / "cold"),
        "retention.ms": "-1",
        "index.checkpoint.interval.ms": "5000",
    }


def _parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    for suffix, mult in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * mult)
    return int(text)


def _memory(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def _emit(doc: dict) -> None:
    print(json.dumps(doc), flush=True)


def _data_bytes(d: Path) -> dict[str, int]:
    """Bytes of segment data (.log) in the hot and the cold tier, and of everything else."""
    hot = cold = other = 0
    for root, _dirs, files in os.walk(d):
        for name in files:
            try:
                n = os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
            if name.endswith(".log") and "/cold" in root[len(str(d)) :]:
                cold += n
            elif name.endswith(".log") and "/logs" in root[len(str(d)) :]:
                hot += n
            else:
                other += n
    return {"hot": hot, "cold": cold, "other": other}


def drop_cache(d: Path) -> None:
    """Evict every file under ``d`` from the page cache (after syncing it: dirty pages stay)."""
    for root, _dirs, files in os.walk(d):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            finally:
                os.close(fd)


# -- filling -----------------------------------------------------------------------------------
class _Batches:
    """RecordBatch v2 of ``records`` records of about ``chunk`` bytes, made from one template
    whose timestamps, producer fields and CRC are rewritten per batch (a few µs each)."""

    def __init__(self, chunk: int, records: int) -> None:
        from stratalog.records import build_batch

        value = b"v" * max(1, (chunk - 61) // records - 10)
        self.template = bytearray(build_batch([(None, value, 0)] * records))
        self.records = records

    def make(self, ts: int, pid: int, seq: int) -> bytes:
        buf = bytearray(self.template)
        struct.pack_into(">qqqhi", buf, 27, ts, ts, pid, 0, seq)
        struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[21:]))
        return bytes(buf)


def _config(args):
    from stratalog.config import BrokerConfig

    return BrokerConfig({k: v for k, v in _settings(args).items()}, None)


def _store(args):
    """The broker's LogStore for the data directory, as ``stratalog serve`` would build it."""
    from stratalog.broker.core import BrokerCore

    core = BrokerCore(Path(args.dir), _config(args))
    return core


async def _fill(args) -> None:
    from stratalog.storage.tiering import Migrator, TierSettings
    from stratalog.storage.virtual_log import WriteBatch

    d = Path(args.dir)
    target = _parse_size(args.bytes)
    core = _store(args)
    core.metadata.load()
    if TOPIC not in core.metadata.topics:
        core.metadata.create_topic(TOPIC, args.partitions, {})
    t0 = time.monotonic()
    core.open()
    opened = time.monotonic() - t0
    store = core.store
    t = core.metadata.topics[TOPIC]
    parts = [store.partitions[uid] for uid in t.partitions]
    batches = _Batches(args.chunk, args.records)
    # Producer ids and sequences continue where the data stops (a refill after a measurement).
    seqs: dict[int, int] = {}
    for p in parts:
        for k in range(PRODUCERS_PER_PARTITION):
            pid = p.uid * 100 + k
            e = p.producers.producers.get(pid)
            seqs[pid] = e.last_seq + 1 if e is not None else 0
    now = int(time.time() * 1000)
    have = sum(_data_bytes(d)[k] for k in ("hot", "cold"))
    per_round = len(parts) * len(batches.template)
    rounds = max(0, (target - have) // per_round)
    # Timestamps: one ms per round, ending now (a history of ``rounds`` ms, in order).
    ts = now - rounds
    written = 0
    t1 = time.monotonic()
    for r in range(rounds):
        writes = WriteBatch()
        for p in parts:
            pid = p.uid * 100 + (r % PRODUCERS_PER_PARTITION)
            seq = seqs[pid]
            p.append(batches.make(ts + r, pid, seq), writes=writes)
            seqs[pid] = (seq + batches.records) & 0x7FFFFFFF
        failure = writes.commit()
        if failure is not None:
            raise failure
        written += per_round
        if r % 20000 == 0 and r:
            rate = written / (time.monotonic() - t1) / 1e6
            print(f"  filled {written / 1e9:.2f} GB ({rate:.0f} MB/s)", file=sys.stderr)
    fill_s = time.monotonic() - t1
    # Part of the history goes down to the cold tier, oldest segments first.
    migrator = Migrator(store, TierSettings(threads=args.migrate_threads), lambda: {})
    t2 = time.monotonic()
    moved = 0
    try:
        while True:
            sizes = _data_bytes(d)
            total = sizes["hot"] + sizes["cold"]
            if sizes["cold"] >= args.cold_fraction * total:
                break
            pick = None
            for vlog in store.logs.values():
                seg = vlog.oldest_sealed()
                if seg is not None and (pick is None or seg.created < pick[1].created):
                    pick = (vlog, seg)
            if pick is None:
                break
            await migrator.migrate(*pick)
            moved += 1
    finally:
        migrator.close()
    migrate_s = time.monotonic() - t2
    # Every log's active segment is sealed: each size is measured with empty active segments,
    # so what differs between sizes is the history alone (the active segments' dense index
    # and the entries read for it at start-up grow with how full they are, up to
    # segment.bytes, whatever the history).
    for vlog in store.logs.values():
        if vlog.active.size:
            vlog.roll()
    await store.checkpoint()
    await core.close()
    _emit(
        {
            "step": "fill",
            "target": target,
            "written": written,
            "open_s": round(opened, 2),
            "fill_s": round(fill_s, 1),
            "migrated_segments": moved,
            "migrate_s": round(migrate_s, 1),
            "sizes": _data_bytes(d),
        }
    )


def fill(args) -> None:
    asyncio.run(_fill(args))


# -- start-ups ---------------------------------------------------------------------------------
def open_store(args) -> None:
    """In this process: open the storage, report time and memory, close it (clean) or leave
    it as a crash would (``--abandon``)."""
    base = _memory()
    core = _store(args)
    t0 = time.monotonic()
    core.metadata.load()
    triples = [
        (t.name, i, uid)
        for t in core.metadata.topics.values()
        for i, uid in enumerate(t.partitions)
    ]
    core.store.open(triples)
    took = time.monotonic() - t0
    mem = _memory()
    chunks = sum(len(p.chunks) + len(p.cold) for p in core.store.partitions.values())
    doc = {
        "step": "open",
        "open_s": round(took, 3),
        "rss_kib": mem["VmRSS"],
        "hwm_kib": mem["VmHWM"],
        "rss_before_kib": base["VmRSS"],
        "chunks": chunks,
        "clean_start": all(r.clean for r in core.store.recovery.values()),
        "scanned_bytes": sum(r.scanned_bytes for r in core.store.recovery.values()),
    }
    _emit(doc)
    if args.abandon:
        os._exit(0)
    t1 = time.monotonic()
    asyncio.run(core.store.close())
    _emit({"step": "close", "close_s": round(time.monotonic() - t1, 3)})


def lookups(args) -> None:
    """In this process: open the storage, then look up random offsets and timestamps in each
    partition's history (both tiers) with the index-run cache emptied before each, counting
    the reads each lookup makes (``os.pread`` and whole-file reads) and timing it."""
    import builtins
    import random

    from stratalog.storage import chunk_index

    core = _store(args)
    core.metadata.load()
    triples = [
        (t.name, i, uid)
        for t in core.metadata.topics.values()
        for i, uid in enumerate(t.partitions)
    ]
    core.store.open(triples)
    counts = {"preads": 0, "opens": 0}
    real_pread, real_open = os.pread, builtins.open

    def pread(fd, n, at):
        counts["preads"] += 1
        return real_pread(fd, n, at)

    def opened(*a, **kw):
        counts["opens"] += 1
        return real_open(*a, **kw)

    rng = random.Random(1)
    rows = []
    os.pread = pread
    builtins.open = opened
    try:
        for p in core.store.partitions.values():
            for tier, ix in (("cold", p.cold), ("hot", p.chunks)):
                if not len(ix) or not getattr(ix, "runs", 1):
                    continue
                first, nxt = ix.first_offset, ix.next_offset
                for _ in range(args.lookups):
                    for kind in ("offset", "time"):
                        o = rng.randrange(first, nxt)
                        if kind == "time":
                            t = ix.max_timestamp_of(ix.locate(o))
                        chunk_index.RUN_CACHE.clear()
                        counts["preads"] = counts["opens"] = 0
                        t0 = time.perf_counter()
                        i = ix.locate(o) if kind == "offset" else ix.locate_time(t)
                        _ = ix[i]
                        took = time.perf_counter() - t0
                        rows.append((tier, kind, counts["preads"] + counts["opens"], took))
    finally:
        os.pread = real_pread
        builtins.open = real_open
    for tier in ("hot", "cold"):
        for kind in ("offset", "time"):
            mine = [r for r in rows if r[0] == tier and r[1] == kind]
            if not mine:
                continue
            _emit(
                {
                    "step": "lookup",
                    "tier": tier,
                    "kind": kind,
                    "lookups": len(mine),
                    "reads_max": max(r[2] for r in mine),
                    "reads_mean": round(sum(r[2] for r in mine) / len(mine), 2),
                    "ms_mean": round(1000 * sum(r[3] for r in mine) / len(mine), 3),
                    "ms_max": round(1000 * max(r[3] for r in mine), 3),
                }
            )
    asyncio.run(core.store.close())


def _api_versions(port: int, timeout: float) -> bool:
    """Whether a Kafka broker at 127.0.0.1:``port`` answers ApiVersions v0."""
    client = b"hist"
    body = struct.pack(">hhih", 18, 0, 1, len(client)) + client
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(struct.pack(">i", len(body)) + body)
            head = s.recv(8)
            return len(head) == 8 and struct.unpack(">ii", head)[1] == 1
    except OSError:
        return False


def serve_once(args, *, stop: int = signal.SIGTERM, note: str = "") -> dict:
    """Start ``stratalog serve`` on the directory, time it until it answers, read its memory,
    stop it with ``stop``."""
    if args.drop_cache:
        drop_cache(Path(args.dir))
    cmd = [
        sys.executable,
        "-m",
        "stratalog.cli",
        "serve",
        "--data-dir",
        str(args.dir),
        "--port",
        "0",
        "--log-level",
        "WARNING",
    ]
    for k, v in _settings(args).items():
        cmd += ["--set", f"{k}={v}"]
    log_path = Path(args.dir).parent / (Path(args.dir).name + "-serve.log")
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if "ready at" not in line:
            raise RuntimeError(f"serve did not start: {line!r} (see {log_path})")
        port = int(line.strip().rsplit(":", 1)[1])
        while not _api_versions(port, 5.0):
            time.sleep(0.01)
        took = time.monotonic() - t0
        mem = _memory(proc.pid)
        time.sleep(args.settle)
        later = _memory(proc.pid)
    finally:
        t1 = time.monotonic()
        os.kill(proc.pid, stop)
        proc.wait(timeout=600)
        stopped = time.monotonic() - t1
        if proc.stdout:
            proc.stdout.close()
    doc = {
        "step": "serve",
        "case": note,
        "start_s": round(took, 3),
        "rss_kib": mem["VmRSS"],
        "hwm_kib": mem["VmHWM"],
        "rss_settled_kib": later["VmRSS"],
        "stop": signal.Signals(stop).name,
        "stop_s": round(stopped, 3),
    }
    _emit(doc)
    return doc


async def _crash(args) -> None:
    """Append ``--tail`` bytes after an index checkpoint, then end as ``kill -9`` would (the
    page cache keeps what was written, nothing is closed)."""
    from stratalog.storage.virtual_log import WriteBatch

    core = _store(args)
    core.open()
    store = core.store
    await store.checkpoint()
    t = core.metadata.topics[TOPIC]
    parts = [store.partitions[uid] for uid in t.partitions]
    batches = _Batches(args.chunk, args.records)
    tail = _parse_size(args.tail)
    per_round = len(parts) * len(batches.template)
    now = int(time.time() * 1000)
    for _r in range(max(1, tail // per_round)):
        writes = WriteBatch()
        for p in parts:
            # No producer id: the tail's batches need no sequence bookkeeping here.
            p.append(batches.make(now, -1, -1), writes=writes)
        failure = writes.commit()
        if failure is not None:
            raise failure
    for vlog in store.logs.values():
        vlog.journal.sync_now()  # in the page cache anyway; as fsync=always would have it
    _emit({"step": "crash", "tail": tail})
    sys.stdout.flush()
    os._exit(0)


def crash(args) -> None:
    asyncio.run(_crash(args))


def _sub(args, step: str, *extra: str) -> list[dict]:
    """Run a step of this tool in a fresh process; its JSON lines."""
    cmd = [sys.executable, "-m", "stratalog.bench.history_scale", step, *_common(args), *extra]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _common(args) -> list[str]:
    return [
        "--dir",
        str(args.dir),
        "--partitions",
        str(args.partitions),
        "--logs",
        str(args.logs),
        "--chunk",
        str(args.chunk),
        "--records",
        str(args.records),
        "--segment-bytes",
        str(args.segment_bytes),
        "--cold-fraction",
        str(args.cold_fraction),
        "--migrate-threads",
        str(args.migrate_threads),
        "--tail",
        args.tail,
        "--settle",
        str(args.settle),
        "--lookups",
        str(args.lookups),
    ] + (["--drop-cache"] if args.drop_cache else [])


def run(args) -> None:
    results = []
    out = Path(args.out) if args.out else None
    for size in args.sizes.split(","):
        row: dict = {"size": size, "load": os.getloadavg()}
        if not args.no_fill:
            row["fill"] = _sub(args, "fill", "--bytes", size)[-1]
        row["open"] = []
        for _ in range(args.repeat):
            if args.drop_cache:
                drop_cache(Path(args.dir))
            row["open"] += _sub(args, "open")
        if not args.no_lookups:
            row["lookups"] = _sub(args, "lookups")
        row["serve_clean"] = [
            serve_once(args, note="after a clean stop") for _ in range(args.repeat)
        ]
        row["crash"] = _sub(args, "crash")[-1]
        row["serve_after_kill"] = serve_once(args, stop=signal.SIGKILL, note="after kill -9")
        row["serve_after_kill_again"] = serve_once(args, note="after kill -9 at once")
        row["sizes"] = _data_bytes(Path(args.dir))
        results.append(row)
        _emit({"step": "size done", **row})
        if out is not None:
            out.write_text(json.dumps(results, indent=1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=["run", "fill", "open", "serve", "crash", "lookups"])
    ap.add_argument("--dir", required=True, help="the broker's data directory (made if needed)")
    ap.add_argument("--bytes", default="1G", help="fill: the data to reach (hot + cold)")
    ap.add_argument("--sizes", default="1G", help="run: sizes to fill to and measure, in order")
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--logs", type=int, default=4, help="storage.virtual_logs")
    ap.add_argument("--chunk", type=int, default=1024, help="bytes per batch (chunk)")
    ap.add_argument("--records", type=int, default=4, help="records per batch")
    ap.add_argument("--segment-bytes", type=int, default=128 * 1024 * 1024)
    ap.add_argument("--cold-fraction", type=float, default=0.3)
    ap.add_argument("--migrate-threads", type=int, default=2)
    ap.add_argument("--tail", default="32M", help="crash: bytes appended past the checkpoint")
    ap.add_argument("--settle", type=float, default=1.0, help="serve: seconds before RSS again")
    ap.add_argument("--drop-cache", action="store_true")
    ap.add_argument("--no-lookups", action="store_true", help="run: skip the lookups step")
    ap.add_argument("--no-fill", action="store_true", help="run: measure the data as it is")
    ap.add_argument("--repeat", type=int, default=3, help="run: clean start-ups per size")
    ap.add_argument("--abandon", action="store_true", help="open: end without closing")
    ap.add_argument("--lookups", type=int, default=20, help="lookups: per partition and tier")
    ap.add_argument("--out", help="run: write the results here as JSON")
    args = ap.parse_args(argv)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    steps = {
        "run": run,
        "fill": fill,
        "open": open_store,
        "serve": serve_once,
        "crash": crash,
        "lookups": lookups,
    }
    steps[args.step](args)


if __name__ == "__main__":
    main()
