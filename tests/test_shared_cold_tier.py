"""One cold tier shared by every broker of a cluster (``ColdStore.shared``), on a directory and
on a real S3 server (SeaweedFS): two ColdStores on the same location play two brokers, one
the primary writing a partition's segments, the other a backup that reads them and is later
promoted. Loading must not take another broker's upload under way for a leftover, and a
commit by a broker whose view of the manifests is old must still be the newest generation.
"""

from __future__ import annotations

import pytest

from stratalog.records import build_batch
from stratalog.storage.batch import set_base_offset
from stratalog.storage.cold_tier import ColdStore

from .test_tiers import s3_server  # noqa: F401  (the fixture)

UID = 5


@pytest.fixture(params=["dir", "s3"])
def location(request, tmp_path) -> tuple[str, dict | None]:
    if request.param == "dir":
        (tmp_path / "cold").mkdir()
        return str(tmp_path / "cold"), None
    return "s3://cold/shared", request.getfixturevalue("s3_server")


def _batches(base: int, n: int) -> list[bytes]:
    out = []
    for i in range(n):
        b = bytearray(build_batch([(b"k", b"v%d" % (base + i), 1_700_000_000_000 + base + i)]))
        set_base_offset(b, 0, base + i)
        out.append(bytes(b))
    return out


def _files(store: ColdStore) -> set[str]:
    return set(store._list(UID))


def test_brokers_sharing_a_cold_tier_never_remove_or_shadow_each_others_segments(location):
    url, options = location
    primary, backup = ColdStore(url, options), ColdStore(url, options)
    primary.shared = backup.shared = True
    assert backup.load(UID) == []  # the backup's view, taken before anything was written

    first, _ = primary.write_segment(UID, _batches(0, 3))
    primary.commit(UID, [first])
    under_way, _ = primary.write_segment(UID, _batches(3, 3))  # not committed yet

    # A backup (re)loading meanwhile sees the committed segment and removes nothing.
    assert backup.load(UID) == [first]
    assert {f"{under_way.name}.log", f"{under_way.name}.idx"} <= _files(backup)

    # The primary dies before committing; the promoted backup migrates the same offsets again.
    # Its commit is the newest generation, and the dead primary's upload goes with it.
    again, _ = backup.write_segment(UID, _batches(3, 3))
    backup.commit(UID, [first, again])
    reader = ColdStore(url, options)
    reader.shared = True
    assert reader.load(UID) == [first, again]
    names = {f"{m.name}.{ext}" for m in (first, again) for ext in ("log", "idx")}
    assert {n for n in _files(reader) if not n.startswith("manifest-")} == names
    manifests = [n for n in _files(reader) if n.startswith("manifest-")]
    assert manifests == ["manifest-000000000002.json"]
    assert reader.read_entries(UID, again)[0][0] == 3
