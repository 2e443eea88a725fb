"""``stratalog scrub``: check every CRC of every file of a data directory, both tiers, read-only.

Each file is checked against what its format promises and reported as ``ok``, ``damaged``
(with the byte ranges that fail, when the file has ranges) or ``unreadable`` (the file system
refused it):

* hot segments (``logs/<log>/<seq>.log``, and segments spilled to the cold tier's directory):
  every frame's frame CRC and batch CRC, each partition's offsets going on (a jump is only
  accepted past damage); a damaged range is stepped over to the next valid frame, as recovery
  does. Ranges already in the log's ``damaged.json`` are damage too, but fenced (``recorded``).
* segment indexes (``.idx``): whole entries, each equal to the frame at its position, and none
  missing below the checkpoint (or anywhere after a clean shutdown);
* sealed indexes (``.pix``, sealed_index.py): the table's and every run's CRC, that it describes
  its segment (size, first and last frame), and every entry against the segment's frames;
* producer snapshots (``.snapshot``, producer_snapshot.py): their CRCs;
* checkpoints, ``damaged.json``, ``epochs.json``, ``partition-state.json``: their CRCs (files
  from before the CRCs: that they parse), and that a checkpoint points at a frame boundary;
* ``meta/cluster.json``: that it parses and holds its fields (it carries no CRC);
* cold segments, their indexes and manifests: every batch's CRC, entries equal to the batches.

A broker holds its hot tier's lock (log_store.data_dir_lock) for its whole life; scrub takes it
shared and refuses to run when a broker holds it: an active segment being appended to would
read as a torn tail.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stratalog.colocated_format import SLOTS_DIR
from stratalog.storage import damage as damage_record
from stratalog.storage import producer_snapshot, sealed_index
from stratalog.storage.batch import CorruptBatchError, validate_batch
from stratalog.storage.cold_tier import COLD_ENTRY, entry_of
from stratalog.storage.log_store import STATE_FILE, parse_state
from stratalog.storage.recovery import (
    CHECKPOINT,
    CLEAN_SHUTDOWN,
    FRAME_HEAD,
    _Damage,
    _direct_padding,
    indexed_end,
    parse_checkpoint,
    scan,
)
from stratalog.storage.replica import EPOCHS_FILE, parse_epochs
from stratalog.storage.segment import ENTRY, ENTRY_SIZE, FRAME_SIZE, IndexEntry

OK, DAMAGED, UNREADABLE = "ok", "damaged", "unreadable"


@dataclass
class Finding:
    path: str
    kind: str  # segment, index, sealed-index, checkpoint, damage-record, epochs,
    #            producer-snapshot, partition-state, metadata, cold-segment, cold-index,
    #            cold-manifest
    status: str = OK
    detail: str = ""
    ranges: list[tuple[int, int]] = field(default_factory=list)  # damaged bytes [start, end)
    recorded: bool = False  # every damaged range is in damaged.json: fenced already
    size: int = 0

    def damaged(self, detail: str, ranges: list[tuple[int, int]] | None = None) -> None:
        self.status = DAMAGED
        self.detail = detail
        self.ranges = ranges or []

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "kind": self.kind,
            "status": self.status,
            "detail": self.detail,
            "ranges": [list(r) for r in self.ranges],
            "recorded": self.recorded,
            "bytes": self.size,
        }


class _ReadOnlySegment:
    """What recovery's scan reads of a segment, through a read-only descriptor."""

    def __init__(self, path: Path, seq: int) -> None:
        self.data_path = path
        self.directory = path.parent
        self.seq = seq
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = os.fstat(self.fd).st_size

    def read(self, position: int, size: int) -> bytes:
        return os.pread(self.fd, size, position)

    def close(self) -> None:
        os.close(self.fd)


# -- planning: which files, how many bytes -----------------------------------------------------
@dataclass
class _Log:
    name: str
    directory: Path
    segments: list[tuple[int, Path]]  # (seq, .log path), hot and spilled, in seq order


@dataclass
class Plan:
    logs: list[_Log]
    singles: list[tuple[str, Path]]  # (kind, path) of small files checked on their own
    cold_partitions: list[Path]  # <cold>/p<uid>

    def files(self) -> int:
        return (
            sum(2 * len(lg.segments) for lg in self.logs)
            + sum(p.with_suffix(".pix").exists() for lg in self.logs for _, p in lg.segments)
            + len(self.singles)
            + len(self.cold_partitions)
        )

    def total_bytes(self) -> int:
        n = 0
        for lg in self.logs:
            n += sum(
                _size(p) + _size(p.with_suffix(".idx")) + _size(p.with_suffix(".pix"))
                for _, p in lg.segments
            )
        n += sum(_size(p) for _, p in self.singles)
        for d in self.cold_partitions:
            n += sum(_size(f) for f in d.iterdir() if f.is_file())
        return n


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _segments(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    return sorted((int(p.stem), p) for p in directory.glob("*.log") if p.stem.isdigit())


def plan(data_dir: Path, hot: Path | None = None, cold: Path | None = None) -> Plan:
    hot = hot or data_dir / "logs"
    logs = []
    singles: list[tuple[str, Path]] = []
    for d in sorted(p for p in hot.iterdir() if p.is_dir()) if hot.is_dir() else []:
        if d.name == "promoted":
            continue  # a cache of cold segments, dropped at every start
        if d.name == "compacted":
            continue  # compacted partitions' segments: checked as a cold tier's, below
        if d.name == SLOTS_DIR:
            continue  # read slots, rewritten at every start (read_slots.py)
        spilled = _segments(cold / "spill" / d.name) if cold is not None else []
        logs.append(_Log(d.name, d, sorted(_segments(d) + spilled)))
        for kind, name in (
            ("checkpoint", CHECKPOINT),
            ("damage-record", damage_record.DAMAGE_FILE),
            ("epochs", EPOCHS_FILE),
        ):
            if (d / name).exists():
                singles.append((kind, d / name))
        singles += [("producer-snapshot", s) for s in producer_snapshot.listed(d)]
    if (hot / STATE_FILE).exists():
        singles.append(("partition-state", hot / STATE_FILE))
    if (data_dir / "meta" / "cluster.json").exists():
        singles.append(("metadata", data_dir / "meta" / "cluster.json"))
    cold_parts = []
    for tier in (cold, hot / "compacted"):
        if tier is not None and tier.is_dir():
            cold_parts += sorted(
                p
                for p in tier.iterdir()
                if p.is_dir() and p.name[:1] == "p" and p.name[1:].isdigit()
            )
    return Plan(logs, singles, cold_parts)


# -- checks --------------------------------------------------------------------------------------
Progress = Callable[[str, int], None]  # (path being checked, bytes done since the last call)


def run(p: Plan, progress: Progress | None = None) -> list[Finding]:
    """Check every file of the plan; ``progress`` is told of each file and its bytes."""
    tick = progress or (lambda _path, _n: None)
    out: list[Finding] = []
    frames_by_log: dict[str, dict[int, list[IndexEntry]]] = {}
    damaged_by_log: dict[str, dict[int, list[tuple[int, int]]]] = {}
    for lg in p.logs:
        out += _check_log(lg, tick, frames_by_log, damaged_by_log)
    for kind, path in p.singles:
        tick(str(path), 0)
        f = _check_single(kind, path, frames_by_log, damaged_by_log)
        tick(str(path), f.size)
        out.append(f)
    for d in p.cold_partitions:
        out += _check_cold_partition(d, tick)
    return out


def _unreadable(path: Path, kind: str, e: OSError) -> Finding:
    return Finding(str(path), kind, UNREADABLE, f"{e.strerror or e}")


def _check_log(
    lg: _Log,
    tick: Progress,
    frames_by_log: dict[str, dict[int, list[IndexEntry]]],
    damaged_by_log: dict[str, dict[int, list[tuple[int, int]]]],
) -> list[Finding]:
    out = []
    try:
        recorded = damage_record.load(lg.directory)
    except damage_record.DamageRecordError:
        recorded = []  # reported as a file of its own
    holes = damage_record.holes_by_segment(recorded)
    clean = (lg.directory / CLEAN_SHUTDOWN).exists()
    try:
        ck = parse_checkpoint((lg.directory / CHECKPOINT).read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        ck = None
    expected: dict[int, int] = {}
    dmg = _Damage(holes)
    frames_by_log[lg.name] = frames = {}
    damaged_by_log[lg.name] = damaged = {}
    present = {seq for seq, _ in lg.segments}
    gone = sorted((r for r in recorded if r.seq not in present), key=lambda r: r.seq)
    for k, (seq, path) in enumerate(lg.segments):
        while gone and gone[0].seq < seq:
            # A recorded range in a segment deleted since (none of its chunks lived on): the
            # offsets that jump past it are explained.
            dmg.met(gone.pop(0), expected)
        tick(str(path), 0)
        f = Finding(str(path), "segment", size=_size(path))
        try:
            seg = _ReadOnlySegment(path, seq)
        except OSError as e:
            out.append(_unreadable(path, "segment", e))
            continue
        try:
            before = len(dmg.ranges)
            entries, end = scan(seg, 0, expected, dmg)  # type: ignore[arg-type]
            ranges = [(r.start, r.end) for r in dmg.ranges[before:]]
            tail = ""
            if end < seg.size and not _direct_padding(seg, end):  # type: ignore[arg-type]
                ranges.append((end, seg.size))
                last = k == len(lg.segments) - 1
                tail = " (a torn tail: recovery cuts it)" if last else " (to the segment's end)"
            frames[seq] = entries
            idx_end = _indexed_end(path.with_suffix(".idx"), end, seg.size)
            if idx_end > seg.size:
                # Its index describes frames past its end, starting where it ends: the file
                # lost its end (an index entry damaged instead would point elsewhere).
                if ranges and ranges[-1][1] == seg.size:
                    ranges[-1] = (ranges[-1][0], idx_end)
                else:
                    ranges.append((seg.size, idx_end))
                tail = f" (cut short: its index goes on to {idx_end})"
            last = dmg.ranges[-1] if dmg.ranges else None
            if (
                ranges
                and ranges[-1][1] >= seg.size
                and (last is None or (last.seq, last.end) != (seq, ranges[-1][1]))
            ):
                # Later partitions' offsets jump past what this end lost: attribute them here.
                dmg.met(damage_record.DamagedRange(seq, *ranges[-1]), expected)
            damaged[seq] = ranges
            if ranges:
                known = holes.get(seq, {}).items()
                f.recorded = all(any(a <= s and e <= b for a, b in known) for s, e in ranges)
                f.damaged(
                    f"{len(ranges)} damaged range(s), {sum(e - s for s, e in ranges)} B"
                    + tail
                    + (" (fenced: recorded in damaged.json)" if f.recorded else ""),
                    ranges,
                )
            else:
                f.detail = f"{len(entries)} frames"
        except OSError as e:
            f = _unreadable(path, "segment", e)
        finally:
            seg.close()
        tick(str(path), f.size)
        out.append(f)
        idx = path.with_suffix(".idx")
        tick(str(idx), 0)
        fi = _check_index(idx, seq, frames.get(seq, []), f.ranges, ck, clean)
        tick(str(idx), fi.size)
        out.append(fi)
        pix = path.with_suffix(".pix")
        if pix.exists():
            tick(str(pix), 0)
            fp = _check_sealed_index(pix, path, frames.get(seq, []), bool(f.ranges))
            tick(str(pix), fp.size)
            out.append(fp)
    return out


def _check_sealed_index(
    pix: Path, data: Path, frames: list[IndexEntry], segment_damaged: bool
) -> Finding:
    """A sealed index: its table's and runs' CRCs, that it describes its segment, and every
    entry against the frames the scan found (recovery rebuilds one that fails). Beside a
    damaged segment only its own CRCs are checked: it describes the frames as they were, and
    is rebuilt when the damage is fenced (reported with the segment)."""
    f = Finding(str(pix), "sealed-index", size=_size(pix))
    try:
        si = sealed_index.load(pix)
        assert si is not None
        if segment_damaged:
            for uid in si.rows:
                si.read_run(uid)
            f.detail = f"{len(si.rows)} partitions (its segment is damaged: not compared)"
            return f
        fd = os.open(data, os.O_RDONLY | os.O_CLOEXEC)
        try:
            si.check_segment(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
    except sealed_index.SealedIndexError as e:
        f.damaged(f"{e} (rebuilt at the next start)")
        return f
    except OSError as e:
        return _unreadable(pix, "sealed-index", e)
    problems = sealed_index.verify(pix, frames)
    if problems:
        f.damaged("; ".join(problems[:3]) + " (rebuilt when read)")
    else:
        entries = si.entries_bytes() // sealed_index.RUN_ENTRY.size
        f.detail = f"{len(si.rows)} partitions, {entries} entries"
    return f


def _indexed_end(path: Path, end: int, size: int) -> int:
    try:
        raw = path.read_bytes()
    except OSError:
        return size
    whole = raw[: len(raw) - len(raw) % ENTRY_SIZE]
    return indexed_end([IndexEntry(*f) for f in ENTRY.iter_unpack(whole)], end, size)


def _check_index(
    path: Path,
    seq: int,
    frames: list[IndexEntry],
    damaged: list[tuple[int, int]],
    ck: tuple[int, int] | None,
    clean: bool,
) -> Finding:
    f = Finding(str(path), "index", size=_size(path))
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raw = b""
    except OSError as e:
        return _unreadable(path, "index", e)
    problems = []
    if len(raw) % ENTRY_SIZE:
        problems.append(f"a partial entry at {len(raw) - len(raw) % ENTRY_SIZE}")
    by_position = {e.position: e for e in frames}
    seen = set()
    for i, fields in enumerate(ENTRY.iter_unpack(raw[: len(raw) - len(raw) % ENTRY_SIZE])):
        e = IndexEntry(*fields)
        want = by_position.get(e.position)
        if want is None:
            at = e.position - FRAME_SIZE
            if any(s <= at < end for s, end in damaged):
                continue  # describes a damaged frame: cannot be checked
            problems.append(f"entry {i} points at no frame ({e.position})")
        elif want != e:
            problems.append(f"entry {i} disagrees with its frame at {e.position}")
        else:
            seen.add(e.position)
    # Entries are written lazily: only those a checkpoint or a clean shutdown vouches for
    # must be there.
    if clean or (ck is not None and seq < ck[0]):
        vouched = frames
    elif ck is not None and seq == ck[0]:
        vouched = [e for e in frames if e.position + e.size <= ck[1]]
    else:
        vouched = []
    missing = [e for e in vouched if e.position not in seen]
    if missing:
        problems.append(f"{len(missing)} entries missing below the checkpoint")
    if problems:
        f.damaged("; ".join(problems[:3]) + (" ..." if len(problems) > 3 else ""))
    else:
        f.detail = f"{len(raw) // ENTRY_SIZE} entries"
    return f


def _check_single(
    kind: str,
    path: Path,
    frames_by_log: dict[str, dict[int, list[IndexEntry]]],
    damaged_by_log: dict[str, dict[int, list[tuple[int, int]]]],
) -> Finding:
    f = Finding(str(path), kind, size=_size(path))
    try:
        raw = path.read_bytes()
    except OSError as e:
        return _unreadable(path, kind, e)
    try:
        if kind == "checkpoint":
            seq, position = parse_checkpoint(raw)
            frames = frames_by_log.get(path.parent.name, {})
            damaged = damaged_by_log.get(path.parent.name, {}).get(seq, [])
            if any(position >= start for start, _end in damaged):
                f.detail = "points into a damaged segment (reported there)"
                return f
            if seq in frames:
                ends = {0} | {e.position + e.size for e in frames[seq]}
                if position not in ends:
                    raise ValueError(f"({seq}, {position}) is not a frame boundary")
            elif frames and seq < max(frames):
                raise ValueError(f"segment {seq} is not there")
            f.detail = f"segment {seq} position {position}"
        elif kind == "damage-record":
            ranges = damage_record.load(path.parent)
            f.detail = "; ".join(r.describe() for r in ranges)
        elif kind == "epochs":
            promised, starts = parse_epochs(raw)
            f.detail = f"promised epoch {promised}, {len(starts)} epochs"
        elif kind == "partition-state":
            f.detail = f"{len(parse_state(raw))} partitions"
        elif kind == "producer-snapshot":
            snap = producer_snapshot.decode(raw, path, 0)
            f.detail = (
                f"as of segment {snap.seq} position {snap.position}, "
                f"{len(snap.tables)} partitions (an older one, or the entries, if damaged)"
            )
        elif kind == "metadata":
            doc = json.loads(raw)
            _require(doc, ("cluster_id", "next_uid", "producer_id_limit", "topics"))
            f.detail = f"{len(doc['topics'])} topics (no CRC: only its syntax is checked)"
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as e:
        f.damaged(str(e) or type(e).__name__)
    return f


def _require(doc: object, keys: tuple[str, ...]) -> None:
    if not isinstance(doc, dict):
        raise TypeError("not an object")
    missing = [k for k in keys if k not in doc]
    if missing:
        raise KeyError(f"missing {', '.join(missing)}")


def _check_cold_partition(d: Path, tick: Progress) -> Iterator[Finding]:
    names = sorted(p.name for p in d.iterdir() if p.is_file())
    manifests = [n for n in names if n.startswith("manifest-") and n.endswith(".json")]
    compacted = False  # a manifest with a clean point: log compaction leaves offset gaps
    for m in manifests:
        path = d / m
        tick(str(path), 0)
        f = Finding(str(path), "cold-manifest", size=_size(path))
        try:
            doc = json.loads(path.read_bytes())
            for s in doc["segments"]:
                _require(s, ("name", "base", "last", "size", "entries", "max_timestamp"))
            f.detail = f"{len(doc['segments'])} segments"
            compacted = compacted or "cleaned" in doc
        except OSError as e:
            f = _unreadable(path, "cold-manifest", e)
        except (ValueError, KeyError, TypeError) as e:
            f.damaged(str(e) or type(e).__name__)
        tick(str(path), f.size)
        yield f
    for n in names:
        if not n.endswith(".log"):
            continue
        path = d / n
        tick(str(path), 0)
        f, batches = _check_cold_segment(path, compacted)
        tick(str(path), f.size)
        yield f
        idx = path.with_suffix(".idx")
        if idx.exists():
            tick(str(idx), 0)
            fi = _check_cold_index(idx, batches, f.ranges)
            tick(str(idx), fi.size)
            yield fi


def _check_cold_segment(path: Path, compacted: bool = False) -> tuple[Finding, dict[int, tuple]]:
    """Batches back to back; a damaged one is stepped over to the next valid batch."""
    f = Finding(str(path), "cold-segment", size=_size(path))
    try:
        data = path.read_bytes()
    except OSError as e:
        return _unreadable(path, "cold-segment", e), {}
    batches: dict[int, tuple] = {}
    ranges: list[tuple[int, int]] = []
    pos = 0
    nxt_offset = None  # a partition's batches lie back to back: offsets continue
    while pos < len(data):
        h = _batch_at(data, pos)
        # (Compaction leaves gaps between batches: there offsets only go up.)
        if (
            h is not None
            and nxt_offset is not None
            and (h.base_offset < nxt_offset if compacted else h.base_offset != nxt_offset)
        ):
            # The base offset is outside the batch CRC (the hot tier's frame CRC covers it).
            h = None if not ranges or ranges[-1][1] != pos else h
        if h is not None:
            nxt_offset = h.base_offset + h.last_offset_delta + 1
            batches[pos] = entry_of(h, pos, h.size)
            pos += h.size
            continue
        nxt = pos + 1
        while nxt < len(data):
            q = data.find(b"\x02", nxt + 16)  # a batch's magic byte is at 16
            if q < 0:
                nxt = len(data)
                break
            if _batch_at(data, q - 16) is not None:
                nxt = q - 16
                break
            nxt = q - 15
        ranges.append((pos, nxt))
        pos = nxt
    if ranges:
        f.damaged(f"{len(ranges)} damaged range(s), {sum(e - s for s, e in ranges)} B", ranges)
    else:
        f.detail = f"{len(batches)} batches"
    return f, batches


def _batch_at(data: bytes, pos: int):
    if pos < 0 or pos + FRAME_HEAD - FRAME_SIZE > len(data):
        return None
    length = int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True)
    if length < 49 or pos + 12 + length > len(data):
        return None
    try:
        return validate_batch(memoryview(data)[pos : pos + 12 + length], compacted=True)
    except CorruptBatchError:
        return None


def _check_cold_index(
    path: Path, batches: dict[int, tuple], damaged: list[tuple[int, int]]
) -> Finding:
    f = Finding(str(path), "cold-index", size=_size(path))
    try:
        raw = path.read_bytes()
    except OSError as e:
        return _unreadable(path, "cold-index", e)
    problems = []
    if len(raw) % COLD_ENTRY.size:
        problems.append("a partial entry")
    whole = raw[: len(raw) - len(raw) % COLD_ENTRY.size]
    entries = list(COLD_ENTRY.iter_unpack(whole))
    for i, e in enumerate(entries):
        want = batches.get(e[2])
        if want is None:
            if not any(s <= e[2] < end for s, end in damaged):
                problems.append(f"entry {i} points at no batch ({e[2]})")
        elif want != e:
            problems.append(f"entry {i} disagrees with its batch at {e[2]}")
    listed = {e[2] for e in entries}
    if any(p not in listed for p in batches):
        problems.append(f"{sum(p not in listed for p in batches)} batches have no entry")
    if problems:
        f.damaged("; ".join(problems[:3]))
    else:
        f.detail = f"{len(entries)} entries"
    return f
