"""Which resource each API touches, and what a client may not do answered as Kafka answers it.

With an authorizer configured (``authorizer.class.name``), dispatch.py puts a check in front of
each API's handler (``guarded``); without one nothing here runs and no request pays for it. A
check asks the authorizer (security/authorizer.py) about the request's resources for the
connection's principal and address, then:

* everything allowed: the handler runs on the request as it came (the common case costs one
  cached lookup per resource);
* a resource denied: the handler runs on the request without it, and its answer gets an entry
  for it with TOPIC_AUTHORIZATION_FAILED (29), GROUP_AUTHORIZATION_FAILED (30),
  CLUSTER_AUTHORIZATION_FAILED (31) or TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), the answer
  decoded and encoded again (the error path only);
* the request's own resource denied (a group, a transactional id, the cluster): it is answered
  with the error alone, shaped as Kafka's ``getErrorResponse`` for that request.

The rules per API are Kafka's (KafkaApis, ControllerApis, KIP-11); docs/security.md lists them.
Metadata, DescribeTopicPartitions, ListGroups, ListTransactions and an OffsetFetch of all of a
group's topics leave out what the principal may not describe, as Kafka does, so a client learns
nothing of topics it may not see; a topic it names but may not describe is answered
TOPIC_AUTHORIZATION_FAILED whether it exists or not.
"""

from __future__ import annotations

from stratalog.protocol import versions as v
from stratalog.protocol.connection import Request
from stratalog.security.authorizer import Authorizer

from . import cluster, data, groups, topics, transactions
from .access import Access, Handler


def guarded(handlers: dict[int, Handler], authorizer: Authorizer) -> dict[int, Handler]:
    """``handlers`` with each API's check in front of its handler."""
    out = dict(handlers)
    for key, check in CHECKS.items():
        if key in handlers:
            out[key] = _bind(check, handlers[key], authorizer)
    return out


def _bind(check, handler: Handler, authorizer: Authorizer) -> Handler:
    def checked(core, req: Request, conn):
        return check(core, req, conn, handler, Access(authorizer, conn))

    checked.__name__ = handler.__name__
    return checked


# Each API's check, by API key (each module holds its family's).
CHECKS = {
    **data.CHECKS,
    **topics.CHECKS,
    **groups.CHECKS,
    **transactions.CHECKS,
    **cluster.CHECKS,
}
# What needs no check: ApiVersions and the SASL exchange (before any principal is known).
UNCHECKED = frozenset({v.API_VERSIONS, v.SASL_HANDSHAKE, v.SASL_AUTHENTICATE})
_ANSWERED = set(v.SUPPORTED) | set(v.INTER_BROKER)
assert set(CHECKS) | UNCHECKED == _ANSWERED, _ANSWERED - set(CHECKS) - UNCHECKED
