"""The crash oracle's model of a power cut (stratalog.faults.crash_oracle.durability) and its
operation log, on logs written by hand: what a strict POSIX cut keeps, and what it must not."""

from __future__ import annotations

from pathlib import Path

from stratalog.faults.crash_oracle import durability
from stratalog.faults.crash_oracle.oplog import Kind, LogWriter, Op, OpLog, read_log

ROOT, D, F, G = 100, 200, 300, 400


def _log(tmp_path: Path, *ops: Op) -> OpLog:
    writer = LogWriter(tmp_path / "ops.log")
    for op in (Op(Kind.ROOT, ROOT), *ops):
        writer.append(op)
    writer.close()
    return read_log(tmp_path / "ops.log")


def _image(
    log: OpLog, root: Path, mode: durability.Mode = "strict", k: int | None = None, seed: int = 0
) -> dict[str, bytes]:
    model = durability.replay(log, len(log.ops) if k is None else k)
    durability.materialise(model, root, mode, seed)
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_the_log_reads_back_what_was_appended_and_drops_a_torn_last_record(tmp_path):
    log = _log(tmp_path, Op(Kind.MKDIR, ROOT, D, "d"), Op(Kind.WRITE, F, 7, data=b"\x00xyz"))
    assert log.ops[2] == Op(Kind.WRITE, F, 7, data=b"\x00xyz")
    assert [log.count_at(e) for e in log.ends] == [1, 2, 3]
    assert log.count_at(log.ends[1] - 1) == 1
    raw = (tmp_path / "ops.log").read_bytes()
    (tmp_path / "ops.log").write_bytes(raw[:-2])  # a kill in the middle of the last append
    assert len(read_log(tmp_path / "ops.log").ops) == 2


def test_unsynced_data_and_unsynced_names_are_lost(tmp_path):
    log = _log(
        tmp_path,
        Op(Kind.MKDIR, ROOT, D, "d"),
        Op(Kind.CREATE, D, F, "f"),
        Op(Kind.WRITE, F, 0, data=b"abc"),
        Op(Kind.FSYNC, F, 1),
        Op(Kind.WRITE, F, 3, data=b"def"),
    )
    # The root was never synced: d, and so f, are not on the disk at all.
    assert _image(log, tmp_path / "a") == {}
    assert not (tmp_path / "a" / "d").exists()
    # Everything issued reaches the disk when only the process dies.
    assert _image(log, tmp_path / "b", "kept") == {"d/f": b"abcdef"}


def test_a_synced_file_needs_its_directory_synced_too(tmp_path):
    ops = [
        Op(Kind.MKDIR, ROOT, D, "d"),
        Op(Kind.FSYNCDIR, ROOT),
        Op(Kind.CREATE, D, F, "f"),
        Op(Kind.WRITE, F, 0, data=b"abc"),
        Op(Kind.FSYNC, F, 1),
        Op(Kind.WRITE, F, 3, data=b"def"),
        Op(Kind.FSYNCDIR, D),
        Op(Kind.TRUNCATE, F, 1),
    ]
    log = _log(tmp_path, *ops)
    assert _image(log, tmp_path / "a", k=6) == {}  # f synced, its name not yet
    assert (tmp_path / "a" / "d").is_dir()
    assert _image(log, tmp_path / "b") == {"d/f": b"abc"}  # the later write and cut are lost
    # Torn: any subset of the write and the cut since the fsync, applied in order.
    torn = {_image(log, tmp_path / f"t{s}", "torn", seed=s)["d/f"] for s in range(20)}
    assert torn == {b"abc", b"abcdef", b"a"}


def test_a_rename_counts_once_its_directory_is_synced(tmp_path):
    ops = [
        Op(Kind.CREATE, ROOT, F, "state.tmp"),
        Op(Kind.WRITE, F, 0, data=b"new"),
        Op(Kind.FSYNC, F, 0),
        Op(Kind.FSYNCDIR, ROOT),
        Op(Kind.RENAME, ROOT, ROOT, "state.tmp", "state"),
        Op(Kind.FSYNCDIR, ROOT),
    ]
    log = _log(tmp_path, *ops)
    assert _image(log, tmp_path / "a", k=6) == {"state.tmp": b"new"}
    assert _image(log, tmp_path / "b") == {"state": b"new"}


def test_a_reused_inode_number_is_a_new_file(tmp_path):
    ops = [
        Op(Kind.CREATE, ROOT, F, "a"),
        Op(Kind.WRITE, F, 0, data=b"old"),
        Op(Kind.FSYNC, F, 0),
        Op(Kind.FSYNCDIR, ROOT),
        Op(Kind.UNLINK, ROOT, 0, "a"),
        Op(Kind.CREATE, ROOT, F, "b"),  # the backing file system hands out F again
        Op(Kind.WRITE, F, 0, data=b"new!"),
        Op(Kind.FSYNC, F, 0),
    ]
    log = _log(tmp_path, *ops)
    assert _image(log, tmp_path / "a") == {"a": b"old"}  # unlink and create not synced
    assert _image(log, tmp_path / "b", "kept") == {"b": b"new!"}


def test_crash_points_after_each_barrier(tmp_path):
    log = _log(
        tmp_path,
        Op(Kind.CREATE, ROOT, G, "g"),
        Op(Kind.FSYNC, G),
        Op(Kind.WRITE, G, 0, data=b"x"),
        Op(Kind.FSYNCDIR, ROOT),
    )
    assert durability.barrier_points(log) == [3, 5]
