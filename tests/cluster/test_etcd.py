"""EtcdStore against a real etcd process: reads, guarded writes, leases, watches, failures."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import Awaitable, Callable

import pytest

from stratalog.cluster.errors import ClusterError
from stratalog.cluster.etcd import EtcdStore, WatchEvent
from stratalog.cluster.etcd_server import EtcdServer


def _run(etcd: EtcdServer, body: Callable[[EtcdStore], Awaitable[None]]) -> None:
    async def main() -> None:
        async with await EtcdStore.connect([etcd.endpoint]) as store:
            await body(store)

    asyncio.run(main())


async def _take(events, n: int, timeout: float = 5) -> list[WatchEvent]:
    got: list[WatchEvent] = []
    async with asyncio.timeout(timeout):
        while len(got) < n:
            got.append(await anext(events))
    return got


async def _gone(store: EtcdStore, key: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await store.get(key) is None:
            return True
        await asyncio.sleep(0.1)
    return False


def test_put_and_get(etcd):
    async def body(store: EtcdStore) -> None:
        rev = await store.put("/t/get/a", b'{"x": 1}')
        assert await store.get("/t/get/a") == (b'{"x": 1}', rev)
        rev2 = await store.put("/t/get/a", b"")
        assert rev2 > rev
        assert await store.get("/t/get/a") == (b"", rev2)  # empty is a value, not absence
        assert await store.get("/t/get/missing") is None

    _run(etcd, body)


def test_get_prefix_is_sorted_by_key_and_stops_at_the_prefix(etcd):
    async def body(store: EtcdStore) -> None:
        revs = {}
        for k in ["b", "a/2", "c", "a", "a/10"]:
            revs[k] = await store.put(f"/t/prefix/{k}", k.encode())
        await store.put("/t/prefix0", b"neighbour")  # shares the string prefix without "/"
        await store.put("/t/prefi", b"shorter")
        got = await store.get_prefix("/t/prefix/")
        assert got == [(f"/t/prefix/{k}", k.encode(), revs[k]) for k in sorted(revs)]
        assert await store.get_prefix("/t/prefix/none/") == []

    _run(etcd, body)


def test_create_is_refused_when_the_key_exists(etcd):
    async def body(store: EtcdStore) -> None:
        assert await store.create("/t/create/k", b"first")
        first = await store.get("/t/create/k")
        assert not await store.create("/t/create/k", b"second")
        assert await store.get("/t/create/k") == first
        await store.delete("/t/create/k")
        await store.delete("/t/create/k")  # deleting an absent key is fine
        assert await store.create("/t/create/k", b"third")
        assert (await store.get("/t/create/k"))[0] == b"third"

    _run(etcd, body)


def test_replace_is_guarded_by_mod_revision(etcd):
    async def body(store: EtcdStore) -> None:
        key = "/t/replace/k"
        assert await store.replace(key, b"v1", 0)  # 0: only if absent
        _, rev1 = await store.get(key)
        assert not await store.replace(key, b"nope", 0)
        assert await store.replace(key, b"v2", rev1)
        # A second writer that read rev1 too has a stale revision and loses.
        assert not await store.replace(key, b"stale", rev1)
        value, rev2 = await store.get(key)
        assert value == b"v2" and rev2 > rev1
        assert await store.replace(key, b"v3", rev2)

    _run(etcd, body)


def test_txn_is_all_or_nothing(etcd):
    async def body(store: EtcdStore) -> None:
        ra = await store.put("/t/txn/a", b"a1")
        rb = await store.put("/t/txn/b", b"b1")
        puts = {"/t/txn/a": b"a2", "/t/txn/new": b"n"}
        # One stale expectation (b changed after it was read) and nothing is applied.
        rb2 = await store.put("/t/txn/b", b"b2")
        stale = {"/t/txn/a": ra, "/t/txn/b": rb, "/t/txn/new": 0}
        assert not await store.txn(stale, puts, ["/t/txn/b"])
        assert await store.get("/t/txn/a") == (b"a1", ra)
        assert await store.get("/t/txn/b") == (b"b2", rb2)
        assert await store.get("/t/txn/new") is None
        # All expectations hold: every put and delete lands, in one revision.
        assert await store.txn(
            {"/t/txn/a": ra, "/t/txn/b": rb2, "/t/txn/new": 0}, puts, ["/t/txn/b"]
        )
        (va, rev_a), (vn, rev_n) = await store.get("/t/txn/a"), await store.get("/t/txn/new")
        assert (va, vn) == (b"a2", b"n") and rev_a == rev_n
        assert await store.get("/t/txn/b") is None
        # An absent key expected to be absent (0) passes; expected present, it fails.
        assert await store.txn({"/t/txn/b": 0}, {"/t/txn/c": b"c"})
        assert not await store.txn({"/t/txn/gone": 5}, {"/t/txn/d": b"d"})
        with pytest.raises(ValueError):
            await store.txn({}, {"/t/txn/a": b"x"}, ["/t/txn/a"])

    _run(etcd, body)


def test_a_key_under_a_revoked_lease_disappears(etcd):
    async def body(store: EtcdStore) -> None:
        lease = await store.grant_lease(2)
        assert lease.id and lease.ttl >= 2 and lease.held
        assert await store.create("/t/lease/k", b"mine", lease=lease)
        await store.put("/t/lease/k2", b"also", lease=lease)
        await lease.revoke()
        assert lease.lost.is_set() and not lease.held
        assert await store.get("/t/lease/k") is None
        assert await store.get("/t/lease/k2") is None
        await lease.revoke()  # already gone: not an error

    _run(etcd, body)


def test_a_stalled_event_loop_loses_its_lease(etcd):
    async def body(store: EtcdStore) -> None:
        lease = await store.grant_lease(2)
        assert lease.ttl == 2
        await store.put("/t/stall/k", b"alive", lease=lease)
        # The keep-alive task holds it past its TTL while the loop runs...
        await asyncio.sleep(3)
        assert not lease.lost.is_set()
        assert await store.get("/t/stall/k") is not None
        # ...but not while the loop is stuck (a long GC, a blocking call, SIGSTOP).
        time.sleep(4)
        assert not lease.held  # known at once, before the keep-alive task has run
        await asyncio.wait_for(lease.lost.wait(), timeout=2)
        assert await _gone(store, "/t/stall/k", timeout=3)
        assert await store.create("/t/stall/k", b"someone else")

    _run(etcd, body)


def test_a_lease_is_lost_when_keep_alives_cannot_reach_etcd(etcd):
    async def body(store: EtcdStore) -> None:
        lease = await store.grant_lease(2)
        etcd.pause()
        try:
            # Keep-alives time out; once its TTL has run out without one, it is lost here
            # (etcd, frozen, has not expired it yet: the lease is still not to be trusted).
            await asyncio.wait_for(lease.lost.wait(), timeout=3.5)
            assert not lease.held
        finally:
            etcd.resume()

    _run(etcd, body)


def test_watch_sees_puts_and_deletes_in_order(etcd):
    async def body(store: EtcdStore) -> None:
        p = "/t/watch/"
        first = await store.put(p + "a", b"1")
        await store.put("/t/watchX", b"outside the prefix")
        await store.put(p + "b", b"2")
        await store.delete(p + "a")
        events = store.watch_prefix(p, start_revision=first)
        async with contextlib.aclosing(events):
            replay = await _take(events, 3)  # history from start_revision, inclusive
            assert [(e.key, e.value) for e in replay] == [
                (p + "a", b"1"),
                (p + "b", b"2"),
                (p + "a", None),
            ]
            assert replay[0].mod_revision == first
            assert [e.mod_revision for e in replay] == sorted(e.mod_revision for e in replay)
            # Live changes, a txn's changes sharing one revision.
            r = await store.put(p + "c", b"3")
            assert await store.txn({}, {p + "d": b"4"}, [p + "b"])
            live = await _take(events, 3)
            assert live[0] == WatchEvent(p + "c", b"3", r)
            assert {(e.key, e.value) for e in live[1:]} == {(p + "d", b"4"), (p + "b", None)}
            assert live[1].mod_revision == live[2].mod_revision > r

    _run(etcd, body)


def test_watch_from_now_and_cancelling_it(etcd):
    async def body(store: EtcdStore) -> None:
        p = "/t/watchnow/"
        await store.put(p + "old", b"before the watch")
        seen: list[WatchEvent] = []
        started = asyncio.Event()

        async def consume() -> None:
            started.set()
            async for ev in store.watch_prefix(p):
                seen.append(ev)

        task = asyncio.create_task(consume())
        await started.wait()
        # The watch is set up at the first iteration; keep writing until it shows up.
        async with asyncio.timeout(5):
            while not seen:
                await store.put(p + "new", b"x")
                await asyncio.sleep(0.1)
        assert all(e.key == p + "new" for e in seen)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        count = len(seen)
        await store.put(p + "after", b"y")
        await asyncio.sleep(0.2)
        assert len(seen) == count

    _run(etcd, body)


def test_watch_resumes_after_etcd_restarts(etcd):
    p = "/t/restart/"

    async def main() -> None:
        async with await EtcdStore.connect([etcd.endpoint]) as store:
            first = await store.put(p + "k", b"1")
            events = store.watch_prefix(p, start_revision=first)
            async with contextlib.aclosing(events):
                assert [e.value for e in await _take(events, 1)] == [b"1"]
                # Blocks the loop only while etcd is down; the watch notices and re-creates.
                etcd.stop()
                etcd.start()
                async with await EtcdStore.connect([etcd.endpoint]) as writer:
                    for v in (b"2", b"3"):
                        await writer.put(p + "k", v)
                # Nothing lost, nothing repeated.
                assert [e.value for e in await _take(events, 2, timeout=10)] == [b"2", b"3"]
                with pytest.raises(TimeoutError):
                    await _take(events, 1, timeout=0.5)

    asyncio.run(main())


def test_a_watch_from_compacted_history_fails_loudly(etcd):
    async def body(store: EtcdStore) -> None:
        old = await store.put("/t/compact/k", b"1")
        now = await store.put("/t/compact/k", b"2")
        # Compact through etcd's JSON gateway, so this test imports no etcd client.
        req = urllib.request.Request(
            f"{etcd.endpoint}/v3/kv/compaction",
            data=json.dumps({"revision": str(now), "physical": True}).encode(),
            method="POST",
        )
        await asyncio.to_thread(urllib.request.urlopen(req, timeout=5).close)
        events = store.watch_prefix("/t/compact/", start_revision=old)
        async with contextlib.aclosing(events):
            with pytest.raises(ClusterError, match="compact"):
                await _take(events, 1)

    _run(etcd, body)


def test_close_ends_watches_and_keep_alives(etcd):
    async def main() -> None:
        store = await EtcdStore.connect([etcd.endpoint])
        lease = await store.grant_lease(2)
        start = await store.put("/t/close/k", b"1")

        async def consume() -> None:
            async for _ in store.watch_prefix("/t/close/", start_revision=start):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.2)
        await store.close()
        # An error, not a cancellation the consumer never asked for.
        with pytest.raises(ClusterError, match="closed"):
            await asyncio.wait_for(task, timeout=3)
        assert lease.lost.is_set()
        with pytest.raises(ClusterError, match="closed"):
            await store.get("/t/close/k")

    asyncio.run(main())


def test_connect_to_a_dead_port_names_the_address(etcd):
    async def main() -> None:
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=r"cannot reach etcd at http://127\.0\.0\.1:1\b"):
            await EtcdStore.connect(["http://127.0.0.1:1"], timeout=2)
        assert time.monotonic() - t0 < 4

    asyncio.run(main())


def test_a_lease_granted_late_is_renewed_before_its_deadline(etcd):
    """A grant sent while etcd is paused is answered when it resumes: the lease's deadline,
    counted from the send, is then near. Its first keep-alive must go out at once, not a third
    of the TTL later, when it used to find the deadline passed and drop a lease etcd still held
    (every broker lost its new registration a second after an etcd pause)."""

    async def body(store: EtcdStore) -> None:
        etcd.pause()
        try:
            grant = asyncio.ensure_future(store.grant_lease(3))
            await asyncio.sleep(2.2)
        finally:
            etcd.resume()
        lease = await asyncio.wait_for(grant, timeout=5)
        await store.put("/t/late/k", b"alive", lease=lease)
        await asyncio.sleep(4)
        assert not lease.lost.is_set() and lease.held
        assert await store.get("/t/late/k") is not None

    _run(etcd, body)


def test_connect_to_a_paused_etcd_times_out(etcd):
    async def main() -> None:
        etcd.pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(ClusterError, match=f"cannot reach etcd at {etcd.endpoint}"):
                await EtcdStore.connect([etcd.endpoint], timeout=1)
            assert time.monotonic() - t0 < 3
        finally:
            etcd.resume()
        async with await EtcdStore.connect([etcd.endpoint]) as store:
            assert await store.put("/t/paused/k", b"back") > 0

    asyncio.run(main())


def test_missing_etcd_binary_is_a_clear_error(tmp_path):
    with pytest.raises(ClusterError, match="etcd binary not found"):
        EtcdServer(tmp_path / "data", binary=tmp_path / "no-such-etcd")
