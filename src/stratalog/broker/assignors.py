"""Server-side partition assignors of the consumer group protocol (KIP-848): ``uniform`` and
``range``, the two Kafka's group coordinator offers, under the same names.

An assignor maps every member to the partitions it should own (the *target* assignment) from the
members' subscriptions and the previous target. Pure functions over plain values; the group
(``consumer_groups.py``) decides when a new target is computed and how members move to it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

# topic id -> partition indexes
Assignment = dict[uuid.UUID, frozenset[int]]
# topic id -> partition count, of the topics any member subscribes to that exist
TopicSizes = Mapping[uuid.UUID, int]

UNIFORM = "uniform"
RANGE = "range"
DEFAULT = UNIFORM


def _as_assignment(owned: Mapping[str, set[tuple[uuid.UUID, int]]]) -> dict[str, Assignment]:
    out: dict[str, Assignment] = {}
    for member, parts in owned.items():
        by_topic: dict[uuid.UUID, set[int]] = {}
        for tid, p in parts:
            by_topic.setdefault(tid, set()).add(p)
        out[member] = {tid: frozenset(ps) for tid, ps in by_topic.items()}
    return out


def uniform(
    subscriptions: Mapping[str, frozenset[uuid.UUID]],
    sizes: TopicSizes,
    previous: Mapping[str, Assignment],
) -> dict[str, Assignment]:
    """Spread all subscribed partitions so members' counts differ by at most one where their
    subscriptions allow, keeping each partition with its previous owner when that owner is still
    subscribed and not above its share (sticky: fewer partitions change hands)."""
    members = sorted(subscriptions)
    eligible: dict[tuple[uuid.UUID, int], list[str]] = {}
    for tid in sorted(sizes, key=str):
        subscribers = [m for m in members if tid in subscriptions[m]]
        if subscribers:
            for p in range(sizes[tid]):
                eligible[(tid, p)] = subscribers
    owned: dict[str, set[tuple[uuid.UUID, int]]] = {m: set() for m in members}
    share = -(-len(eligible) // len(members)) if members else 0  # ceiling
    for m in members:
        for tid, parts in previous.get(m, {}).items():
            for p in sorted(parts):
                tp = (tid, p)
                if m in eligible.get(tp, ()) and len(owned[m]) < share:
                    owned[m].add(tp)
    taken = {tp for parts in owned.values() for tp in parts}
    for tp, subscribers in eligible.items():
        if tp not in taken:
            least = min(subscribers, key=lambda m: (len(owned[m]), m))
            owned[least].add(tp)
    # Balance: move a partition from a member holding two more than another member subscribed to
    # its topic, until no such pair is left (heterogeneous subscriptions need this; the sticky
    # pass above leaves homogeneous ones balanced already).
    moved = True
    while moved:
        moved = False
        for m in sorted(members, key=lambda x: -len(owned[x])):
            for tp in sorted(owned[m], key=lambda x: (str(x[0]), x[1])):
                target = min(eligible[tp], key=lambda x: (len(owned[x]), x))
                if len(owned[m]) - len(owned[target]) >= 2:
                    owned[m].discard(tp)
                    owned[target].add(tp)
                    moved = True
                    break
            if moved:
                break
    return _as_assignment(owned)


def range_(
    subscriptions: Mapping[str, frozenset[uuid.UUID]],
    sizes: TopicSizes,
    previous: Mapping[str, Assignment],
) -> dict[str, Assignment]:
    """Per topic, contiguous ranges of partitions to its subscribers in member-id order, the
    first ``partitions % subscribers`` getting one more (the classic range assignor's split)."""
    owned: dict[str, set[tuple[uuid.UUID, int]]] = {m: set() for m in subscriptions}
    for tid, count in sizes.items():
        subscribers = sorted(m for m, topics in subscriptions.items() if tid in topics)
        if not subscribers:
            continue
        per, extra = divmod(count, len(subscribers))
        start = 0
        for i, m in enumerate(subscribers):
            n = per + (1 if i < extra else 0)
            owned[m].update((tid, p) for p in range(start, start + n))
            start += n
    return _as_assignment(owned)


ASSIGNORS = {UNIFORM: uniform, RANGE: range_}

SIMPLE = "simple"


def simple(
    subscriptions: Mapping[str, frozenset[uuid.UUID]],
    sizes: TopicSizes,
    previous: Mapping[str, Assignment],
) -> dict[str, Assignment]:
    """Share groups (KIP-932): members of a share group may consume the same partition, so per
    topic, with no more subscribers than partitions, each partition goes to one of them in turn;
    with more, each subscriber gets one partition in turn (a partition then has several), so
    nobody is left idle."""
    owned: dict[str, set[tuple[uuid.UUID, int]]] = {m: set() for m in subscriptions}
    for tid, count in sizes.items():
        subscribers = sorted(m for m, topics in subscriptions.items() if tid in topics)
        if not subscribers or count <= 0:
            continue
        if len(subscribers) <= count:
            for p in range(count):
                owned[subscribers[p % len(subscribers)]].add((tid, p))
        else:
            for i, m in enumerate(subscribers):
                owned[m].add((tid, i % count))
    return _as_assignment(owned)
