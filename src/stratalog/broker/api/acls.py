"""CreateAcls (30), DescribeAcls (29) and DeleteAcls (31): the ACLs, as ``kafka-acls.sh`` and
every admin client manage them.

Kafka's rules (security/acls.py): a creation is checked alone (an invalid one is answered
INVALID_REQUEST and the others are still made; one that exists already is answered as made);
DescribeAcls lists the ACLs its filter matches, grouped by resource pattern; each DeleteAcls
filter deletes what it matches and lists it (an ACL two filters match is listed under both).
Changes are durable before the answer (security/acl_store.py: the data directory, or etcd in a
cluster). Without an authorizer all three answer SECURITY_DISABLED, as Kafka does; who may call
them (ALTER, DESCRIBE on the cluster) is broker/authorization/'s.
"""

from __future__ import annotations

import asyncio

from stratalog.protocol.connection import Request
from stratalog.security.acls import AclBinding, AclFilter, InvalidAcl, binding, concrete

from .common import NONE, err, reply, sub

NO_AUTHORIZER = "No Authorizer is configured."


def _filter(f) -> AclFilter:
    return AclFilter(
        f.resource_type_filter,
        f.resource_name_filter,
        getattr(f, "pattern_type_filter", 3),
        f.principal_filter,
        f.host_filter,
        f.operation,
        f.permission_type,
    )


def handle_create_acls(core, req: Request, conn):
    creations = req.body.creations
    if core.authorizer is None:
        return _created(req, [("SECURITY_DISABLED", NO_AUTHORIZER)] * len(creations))
    if not all(
        concrete(c.resource_type, getattr(c, "resource_pattern_type", 3), c.operation,
                 c.permission_type)
        for c in creations
    ):  # fmt: skip
        # As Kafka: an ANY, MATCH or unknown code fails the whole request, nothing is made.
        return _created(req, [("UNKNOWN_SERVER_ERROR", None)] * len(creations))
    results: list[tuple[str, str | None]] = []
    new: list[AclBinding] = []
    for c in creations:
        try:
            b = binding(
                c.resource_type,
                c.resource_name,
                getattr(c, "resource_pattern_type", 3),
                c.principal,
                c.host,
                c.operation,
                c.permission_type,
            )
        except InvalidAcl as e:
            results.append(("INVALID_REQUEST", str(e)))
            continue
        new.append(b)
        results.append(("NONE", ""))  # (Kafka's answer carries an empty message)
    if not new:
        return _created(req, results)
    changed = core.acls.change(lambda acls: acls | frozenset(new))
    if not asyncio.isfuture(changed) and not asyncio.iscoroutine(changed):
        return _created(req, results)

    async def in_cluster() -> bytes:
        try:
            await changed
        except Exception as e:
            failed = [(c, m) if c != "NONE" else ("UNKNOWN_SERVER_ERROR", str(e))
                      for c, m in results]  # fmt: skip
            return _created(req, failed)
        return _created(req, results)

    return in_cluster()


def _created(req: Request, results: list[tuple[str, str | None]]) -> bytes:
    return reply(
        req,
        results=tuple(
            sub(req, "AclCreationResult", error_code=err(c), error_message=m) for c, m in results
        ),
    )


def handle_describe_acls(core, req: Request, conn) -> bytes:
    if core.authorizer is None:
        return _described(req, "SECURITY_DISABLED", NO_AUTHORIZER, ())
    flt = _filter(req.body)
    if flt.unknown():
        return _described(req, "INVALID_REQUEST", "The filter contains UNKNOWN elements", ())
    by_pattern: dict[tuple, list[AclBinding]] = {}
    for b in sorted(core.acls.acls, key=AclBinding.sort_key):
        if flt.matches(b):
            by_pattern.setdefault((b.resource_type, b.name, b.pattern_type), []).append(b)
    resources = tuple(
        sub(
            req,
            "DescribeAclsResource",
            resource_type=rtype,
            resource_name=name,
            pattern_type=pattern,
            acls=tuple(
                sub(
                    req,
                    "AclDescription",
                    principal=b.principal,
                    host=b.host,
                    operation=b.operation,
                    permission_type=b.permission,
                )
                for b in acls
            ),
        )
        for (rtype, name, pattern), acls in by_pattern.items()
    )
    return _described(req, "NONE", "", resources)  # (Kafka's carries an empty message)


def _described(req: Request, error: str, message: str | None, resources: tuple) -> bytes:
    return reply(req, error_code=err(error), error_message=message, resources=resources)


def handle_delete_acls(core, req: Request, conn):
    filters = [_filter(f) for f in req.body.filters]
    if core.authorizer is None:
        return _deleted(req, [("SECURITY_DISABLED", NO_AUTHORIZER, [])] * len(filters))

    def results_for(acls) -> list[tuple[str, str | None, list[AclBinding]]]:
        out = []
        for flt in filters:
            if flt.unknown():
                out.append(("INVALID_REQUEST", "The filter contains UNKNOWN elements", []))
            else:
                found = sorted((b for b in acls if flt.matches(b)), key=AclBinding.sort_key)
                out.append(("NONE", None, found))
        return out

    outcome: list = []

    def delete(acls):
        # (In a cluster this may run again on a newer set: the last run's matches are the
        # answer, as they are what was deleted.)
        outcome[:] = results_for(acls)
        gone = {b for _e, _m, found in outcome for b in found}
        return acls - gone if gone else acls

    changed = core.acls.change(delete)
    if not asyncio.isfuture(changed) and not asyncio.iscoroutine(changed):
        return _deleted(req, outcome)

    async def in_cluster() -> bytes:
        try:
            await changed
        except Exception as e:
            return _deleted(req, [("UNKNOWN_SERVER_ERROR", str(e), [])] * len(filters))
        return _deleted(req, outcome)

    return in_cluster()


def _deleted(req: Request, results: list) -> bytes:
    return reply(
        req,
        filter_results=tuple(
            sub(
                req,
                "DeleteAclsFilterResult",
                error_code=err(code),
                error_message=message,
                matching_acls=tuple(
                    sub(
                        req,
                        "DeleteAclsMatchingAcl",
                        error_code=NONE,
                        error_message=None,
                        resource_type=b.resource_type,
                        resource_name=b.name,
                        pattern_type=b.pattern_type,
                        principal=b.principal,
                        host=b.host,
                        operation=b.operation,
                        permission_type=b.permission,
                    )
                    for b in found
                ),
            )
            for code, message, found in results
        ),
    )
