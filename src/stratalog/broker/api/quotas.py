"""DescribeClientQuotas and AlterClientQuotas (``kafka-configs --entity-type clients/users/ips``).

The rules are Kafka's (broker/quotas.py). An alteration is durable before the answer: on a
single node in ``meta/quotas.json``, in a cluster in etcd, from where every broker takes it.
"""

from __future__ import annotations

from stratalog.broker.quotas import Alteration, QuotaError, describe, entity_of, plan
from stratalog.protocol.connection import Request

from .common import err, reply, sub


def _entity(req: Request, cls: str, entity) -> tuple:
    return tuple(sub(req, cls, entity_type=t, entity_name=n) for t, n in entity)


def handle_describe_client_quotas(core, req: Request, conn) -> bytes:
    b = req.body
    components = [(c.entity_type, c.match_type, c.match) for c in b.components]
    try:
        found = describe(core.quotas.quotas, components, b.strict)
    except QuotaError as e:
        return reply(req, error_code=err(e.error), error_message=str(e), entries=None)
    entries = tuple(
        sub(
            req,
            "EntryData",
            entity=_entity(req, "EntityData", entity),
            values=tuple(sub(req, "ValueData", key=k, value=v) for k, v in sorted(values.items())),
        )
        for entity, values in found
    )
    return reply(req, error_code=err("NONE"), error_message=None, entries=entries)


def handle_alter_client_quotas(core, req: Request, conn):
    b = req.body
    alterations = [
        Alteration(
            entity_of([(e.entity_type, e.entity_name) for e in entry.entity]),
            [(op.key, None if op.remove else float(op.value)) for op in entry.ops],
        )
        for entry in b.entries
    ]
    results, after = plan(core.quotas.quotas, alterations)

    def respond(failed: str | None = None) -> bytes:
        return reply(
            req,
            entries=tuple(
                sub(
                    req,
                    "EntryData",
                    error_code=err(failed if failed and error == "NONE" else error),
                    error_message=message,
                    entity=_entity(req, "EntityData", entity),
                )
                for entity, (error, message) in results.items()
            ),
        )

    if b.validate_only or after == core.quotas.quotas:
        return respond()
    # Applied to the quotas as they are where they are kept (in a cluster, etcd's may be newer
    # than this broker's copy); the answers do not depend on them.
    saved = core.set_quotas(lambda current: plan(current, alterations)[1])
    if saved is None:
        return respond()

    async def in_cluster() -> bytes:
        try:
            await saved
        except Exception:
            return respond("REQUEST_TIMED_OUT")
        return respond()

    return in_cluster()
