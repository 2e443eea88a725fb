"""A classic group dropped by a coordinator whose offsets partition another broker led
meanwhile (GroupCoordinator.unload): its parked requests are answered NOT_COORDINATOR, its
timers stop, and a restore from the records takes the group back whole."""

from __future__ import annotations

import asyncio

from stratalog.broker.group_coordinator import GroupCoordinator

PROTOCOLS = [("range", b"")]


def _join(c: GroupCoordinator, member: str = ""):
    return c.join("g", member, None, "client", "/127.0.0.1", 10_000, 10_000, "consumer",
                  PROTOCOLS, False)  # fmt: skip


def test_unload_answers_parked_joins_not_coordinator_and_restore_takes_the_group_back():
    async def run() -> None:
        c = GroupCoordinator()
        first = await _join(c)
        assert first.error == "NONE"
        parked = asyncio.ensure_future(_join(c))  # a second member: a rebalance waits on it
        await asyncio.sleep(0.05)
        assert not parked.done()
        record = c.record_of(c.groups["g"])
        c.unload("g")
        assert (await asyncio.wait_for(parked, 5)).error == "NOT_COORDINATOR"
        assert c.group("g") is None
        assert c.restore({"g": record}) == 1
        assert set(c.groups["g"].members) == {m.member_id for m in record.members}
        c.shutdown()

    asyncio.run(run())
