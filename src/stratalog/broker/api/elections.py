"""ElectLeaders (API 43): preferred and unclean leader elections, as kafka-leader-election asks.

A single node leads every partition it has, so every election there is not needed. In a
cluster the election moves the partition's virtual log (cluster/election.py): every partition of
that log changes leader with it, those not named in the request included. Partitions are
answered as Kafka's controller answers them: UNKNOWN_TOPIC_OR_PARTITION for what does not exist,
and, when the request names no partitions (all of them), only the partitions an election was
tried for (those that needed none are left out), under an entry for every topic.
"""

from __future__ import annotations

from collections.abc import Awaitable

from stratalog.cluster.election import NOT_NEEDED, PREFERRED, UNCLEAN, Outcome, elect
from stratalog.protocol.connection import Request

from .common import NONE, err, reply, sub

# (topic, [(partition, virtual log id, or the outcome when there is none to elect)])
Plan = list[tuple[str, list[tuple[int, int | Outcome]]]]


def _plan(core, requested) -> Plan:
    plan: Plan = []
    for name, partitions in requested:
        t = core.metadata.topics.get(name)
        entries: list[tuple[int, int | Outcome]] = []
        for i in partitions:
            if t is None:
                entries.append(
                    (i, Outcome("UNKNOWN_TOPIC_OR_PARTITION", f"No such topic as {name}"))
                )
            elif not 0 <= i < len(t.partitions):
                entries.append(
                    (i, Outcome("UNKNOWN_TOPIC_OR_PARTITION", f"No such partition as {name}-{i}"))
                )
            elif core.cluster is None:
                entries.append((i, NOT_NEEDED))  # the single node leads it, and is its replica
            else:
                topic = core.cluster.topics.get(name)
                if topic is None or i >= len(topic.vlogs):
                    entries.append(
                        (
                            i,
                            Outcome(
                                "UNKNOWN_TOPIC_OR_PARTITION", f"No such partition as {name}-{i}"
                            ),
                        )
                    )
                else:
                    entries.append((i, topic.vlogs[i]))
        plan.append((name, entries))
    return plan


def _answer(req: Request, plan: Plan, outcomes: dict[int, Outcome], everything: bool) -> bytes:
    results = []
    for name, entries in plan:
        rows = []
        for i, target in entries:
            o = target if isinstance(target, Outcome) else outcomes[target]
            if everything and o.error == NOT_NEEDED.error:
                continue
            rows.append(
                sub(
                    req,
                    "PartitionResult",
                    partition_id=i,
                    error_code=err(o.error),
                    error_message=o.message,
                )
            )
        results.append(sub(req, "ReplicaElectionResult", topic=name, partition_result=tuple(rows)))
    return reply(req, error_code=NONE, replica_election_results=tuple(results))


def handle_elect_leaders(core, req: Request, conn) -> bytes | Awaitable[bytes]:
    body = req.body
    kind = getattr(body, "election_type", PREFERRED)  # v0 knows only preferred elections
    if kind not in (PREFERRED, UNCLEAN):
        return reply(req, error_code=err("INVALID_REQUEST"), replica_election_results=())
    everything = body.topic_partitions is None
    if everything:
        requested = [(n, range(len(t.partitions))) for n, t in sorted(core.metadata.topics.items())]
    else:
        requested = [(tp.topic, tp.partitions) for tp in body.topic_partitions]
    plan = _plan(core, requested)
    vids = [target for _n, entries in plan for _i, target in entries if isinstance(target, int)]
    if core.cluster is None or not vids:
        return _answer(req, plan, {}, everything)

    async def elected() -> bytes:
        outcomes = await elect(core.cluster, vids, kind)
        return _answer(req, plan, outcomes, everything)

    return elected()
