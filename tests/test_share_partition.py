"""The share-partition state machine (broker/share_partition.py), on its own: acquisition,
acknowledgement, lock expiry, the delivery limit and the in-flight bound."""

from __future__ import annotations

import pytest

from stratalog.broker.share_partition import (
    ACCEPT,
    GAP,
    REJECT,
    RELEASE,
    RENEW,
    Acquired,
    ShareError,
    SharePartition,
)


def test_members_acquire_disjoint_records_and_accepts_move_the_start():
    sp = SharePartition(10, lock_ms=1000)
    assert sp.fetch_from() == 10
    a = sp.acquire("a", 10, 20, 4, now=0)
    assert a == [Acquired(10, 13, 1)]
    assert sp.fetch_from() == 14
    b = sp.acquire("b", 14, 20, 100, now=0)
    assert b == [Acquired(14, 19, 1)]
    sp.acknowledge("b", 14, 19, (ACCEPT,), now=1)
    assert sp.start == 10  # a's records still hold it
    sp.acknowledge("a", 10, 13, (ACCEPT,), now=1)
    assert sp.start == sp.end == 20
    assert sp.records == {}


def test_release_redelivers_with_a_higher_count():
    sp = SharePartition(0)
    sp.acquire("a", 0, 3, 10, now=0)
    sp.acknowledge("a", 0, 2, (ACCEPT, RELEASE, ACCEPT), now=1)
    assert sp.start == 1
    assert sp.fetch_from() == 1
    assert sp.acquire("b", 1, 3, 10, now=2) == [Acquired(1, 1, 2)]


def test_lock_expiry_makes_records_available_to_others():
    sp = SharePartition(0, lock_ms=500)
    sp.acquire("a", 0, 5, 10, now=0)
    assert sp.next_deadline() == 500
    assert sp.acquire("b", 0, 5, 10, now=100) == []
    assert sp.expire(499) == 0
    assert sp.expire(500) == 5
    assert sp.acquire("b", 0, 5, 10, now=600) == [Acquired(0, 4, 2)]
    with pytest.raises(ShareError) as e:
        sp.acknowledge("a", 0, 0, (ACCEPT,), now=700)
    assert e.value.error == "INVALID_RECORD_STATE"


def test_records_past_the_delivery_limit_are_archived():
    sp = SharePartition(0, delivery_limit=3)
    for delivery in range(1, 4):
        assert sp.acquire("a", 0, 1, 10, now=delivery) == [Acquired(0, 0, delivery)]
        sp.acknowledge("a", 0, 0, (RELEASE,), now=delivery)
    assert sp.start == 1  # archived: done, never offered again
    assert sp.fetch_from() == 1


def test_reject_and_gap_archive():
    sp = SharePartition(0)
    sp.acquire("a", 0, 3, 10, now=0)
    sp.acknowledge("a", 0, 1, (REJECT, GAP), now=0)
    assert sp.start == 2


def test_acknowledging_records_not_acquired_changes_nothing():
    sp = SharePartition(0)
    sp.acquire("a", 0, 2, 10, now=0)
    for member, first, last in (("b", 0, 0), ("a", 0, 2), ("a", 5, 5)):
        with pytest.raises(ShareError) as e:
            sp.acknowledge(member, first, last, (ACCEPT,), now=1)
        assert e.value.error == "INVALID_RECORD_STATE"
    assert sp.start == 0 and sp.records[0].member == "a"
    with pytest.raises(ShareError) as e:
        sp.acknowledge("a", 0, 1, (ACCEPT, ACCEPT, ACCEPT), now=1)
    assert e.value.error == "INVALID_REQUEST"


def test_renew_extends_the_lock():
    sp = SharePartition(0, lock_ms=100)
    sp.acquire("a", 0, 1, 10, now=0)
    sp.acknowledge("a", 0, 0, (RENEW,), now=90)
    assert sp.expire(150) == 0
    sp.acknowledge("a", 0, 0, (ACCEPT,), now=160)
    assert sp.start == 1


def test_in_flight_records_are_bounded():
    sp = SharePartition(0, max_locks=4)
    assert sp.acquire("a", 0, 10, 10, now=0) == [Acquired(0, 3, 1)]
    assert sp.fetch_from() is None
    sp.acknowledge("a", 0, 1, (ACCEPT,), now=1)
    assert sp.fetch_from() == 4
    assert sp.acquire("b", 4, 10, 10, now=1) == [Acquired(4, 5, 1)]


def test_a_departed_member_gives_its_records_back():
    sp = SharePartition(0)
    sp.acquire("a", 0, 2, 10, now=0)
    sp.acquire("b", 2, 4, 10, now=0)
    assert sp.release_member("a") == 2
    assert sp.acquire("b", 0, 4, 10, now=1) == [Acquired(0, 1, 2)]


def test_offsets_the_log_skipped_are_done_and_a_moved_log_start_is_followed():
    sp = SharePartition(0)
    assert sp.acquire("a", 3, 5, 10, now=0) == [Acquired(3, 4, 1)]
    assert sp.start == 3
    sp.move_start(10)
    assert sp.start == sp.end == 10 and sp.records == {}


def test_a_read_needs_to_go_only_as_far_as_the_records_a_fetch_may_acquire():
    sp = SharePartition(0, max_locks=10)
    assert sp.acquirable_until(0, 4) == 4
    sp.acquire("a", 0, 4, 4, now=0)
    sp.acknowledge("a", 1, 1, (RELEASE,), now=0)
    assert sp.acquirable_until(0, 3) == 6  # offset 1 again, then 4 and 5
    assert sp.acquirable_until(0, 100) == 10  # the in-flight bound


def test_acknowledgements_below_the_start_are_left_alone():
    sp = SharePartition(0)
    sp.acquire("a", 0, 3, 10, now=0)
    sp.acknowledge("a", 0, 0, (ACCEPT,), now=0)
    sp.acknowledge("a", 0, 1, (RELEASE,), now=0)  # offset 0 done: only 1 is released
    assert sp.start == 1 and sp.fetch_from() == 1
    sp.acknowledge("a", 0, 0, (REJECT,), now=0)
    with pytest.raises(ShareError):  # released, not acquired any more
        sp.acknowledge("a", 1, 1, (ACCEPT,), now=0)


def test_the_next_deadline_is_of_a_record_still_locked():
    sp = SharePartition(0, lock_ms=100)
    sp.acquire("a", 0, 2, 10, now=0)  # 0-1 locked until 100
    sp.acquire("b", 2, 4, 10, now=50)  # 2-3 until 150
    sp.acknowledge("a", 0, 0, (ACCEPT,), now=60)
    assert sp.next_deadline() == 100  # offset 1 still holds its lock
    sp.acknowledge("a", 1, 1, (RENEW,), now=70)  # until 170
    assert sp.next_deadline() == 150
    sp.acknowledge("b", 2, 3, (RELEASE,), now=80)
    assert sp.next_deadline() == 170
    assert sp.expire(169) == 0 and sp.expire(170) == 1
    assert sp.next_deadline() is None
