"""Share sessions (broker/share_sessions.py) on their own: opening, epochs, closing."""

from __future__ import annotations

import uuid

import pytest

from stratalog.broker.share_partition import ShareError
from stratalog.broker.share_sessions import ShareSessions

T = uuid.UUID(int=7)


def _error(call) -> str:
    with pytest.raises(ShareError) as e:
        call()
    return e.value.error


def test_epochs_follow_each_other_from_the_opening_request():
    sessions = ShareSessions()
    s = sessions.begin("g", "m", 0, [(T, 0), (T, 1)])
    assert s.partitions == [(T, 0), (T, 1)]
    assert sessions.begin("g", "m", 1, [(T, 2)], [(T, 0)]).partitions == [(T, 1), (T, 2)]
    assert _error(lambda: sessions.begin("g", "m", 1)) == "INVALID_SHARE_SESSION_EPOCH"
    assert sessions.begin("g", "m", 2) is s
    sessions.begin("g", "m", -1)  # the final request: the caller closes the session
    sessions.close("g", "m")
    assert _error(lambda: sessions.begin("g", "m", 3)) == "SHARE_SESSION_NOT_FOUND"


def test_an_opening_request_replaces_the_session_and_the_limit_holds():
    sessions = ShareSessions(max_sessions=1)
    sessions.begin("g", "m", 0, [(T, 0)])
    assert sessions.begin("g", "m", 0, [(T, 1)]).partitions == [(T, 1)]
    assert _error(lambda: sessions.begin("g", "other", 0)) == "SHARE_SESSION_LIMIT_REACHED"


def test_fetches_take_the_partitions_in_turn():
    s = ShareSessions().begin("g", "m", 0, [(T, 0), (T, 1), (T, 2)])
    assert [s.rotated()[0] for _ in range(4)] == [(T, 0), (T, 1), (T, 2), (T, 0)]
