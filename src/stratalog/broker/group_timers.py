"""The modern groups' timers: members past their session (and share records past their locks)
are removed, and the group records that changed are written.

Both run on the broker's event loop and take the broker core (its groups, its timers, its
writes); they are started by a heartbeat, a share fetch, or a restore that brought members back
(so that members that never return still expire).
"""

from __future__ import annotations

import asyncio
import logging

from stratalog.broker.consumer_groups import clock_ms

log = logging.getLogger(__name__)

CONSUMER_GROUP_EXPIRY_S = 1.0  # how often consumer-protocol session timeouts are checked


def _write_soon(core, groups: list[tuple[str, str]]) -> None:
    """Write what removing these (group, member)s changed, in the background."""
    for gid in dict.fromkeys(g for g, _member in groups):
        task = asyncio.ensure_future(_write(core, gid))
        core.group_writes.add(task)
        task.add_done_callback(core.group_writes.discard)


async def _write(core, group: str) -> None:
    try:
        await core.persist_group_records(group)
    except Exception as e:  # (written again with the group's next change)
        log.warning("group %s: the removal of expired members was not written: %s", group, e)


def keep_expiring_consumer_groups(core) -> None:
    """While a consumer-protocol group has members, look for expired ones every second."""
    if core.consumer_group_timer is not None:
        return
    loop = asyncio.get_running_loop()

    def tick() -> None:
        core.consumer_group_timer = None
        _write_soon(core, core.consumer_groups.expire(clock_ms(), core.group_topics()))
        if core.consumer_groups.next_deadline() is not None:
            core.consumer_group_timer = loop.call_later(CONSUMER_GROUP_EXPIRY_S, tick)

    core.consumer_group_timer = loop.call_later(CONSUMER_GROUP_EXPIRY_S, tick)


def keep_expiring_share_groups(core) -> None:
    """Keep a timer at the next deadline of any share group (a member's session, a record's
    lock); when it fires, expire what is due and wake share fetches waiting for records."""
    deadline = core.share_groups.next_deadline()
    timer = core.share_group_timer
    if deadline is None:
        return
    loop = asyncio.get_running_loop()
    when = deadline / 1000
    if timer is not None:
        if timer.when() <= when:
            return
        timer.cancel()

    def tick() -> None:
        core.share_group_timer = None
        _write_soon(core, core.share_groups.expire(clock_ms(), core.group_topics()))
        wake_share_fetches(core)
        keep_expiring_share_groups(core)

    core.share_group_timer = loop.call_at(when, tick)


def wake_share_fetches(core) -> None:
    """Records may have become acquirable (released, or a lock ran out)."""
    waiters, core.share_waiters = core.share_waiters, []
    for w in waiters:
        if not w.done():
            w.set_result(None)
