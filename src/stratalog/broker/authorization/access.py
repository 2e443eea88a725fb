"""One request's questions to the authorizer, and the errors a refusal is answered with."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from stratalog.protocol.connection import Request
from stratalog.security.acls import CLUSTER_NAME
from stratalog.security.acls import Operation as Op
from stratalog.security.acls import ResourceType as R
from stratalog.security.authorizer import Authorizer
from stratalog.security.tls import ANONYMOUS

TOPIC_DENIED = "TOPIC_AUTHORIZATION_FAILED"
GROUP_DENIED = "GROUP_AUTHORIZATION_FAILED"
CLUSTER_DENIED = "CLUSTER_AUTHORIZATION_FAILED"
TXN_DENIED = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
# Kafka's messages for these errors (Errors.java), where Kafka's answer carries one.
MESSAGES = {
    TOPIC_DENIED: "Topic authorization failed.",
    GROUP_DENIED: "Group authorization failed.",
    CLUSTER_DENIED: "Cluster authorization failed.",
    TXN_DENIED: "Transactional Id authorization failed.",
}
ZERO_UUID = uuid.UUID(int=0)

Handler = Callable[[Any, Request, Any], Any]


class Access:
    """One request's questions to the authorizer: its connection's principal and address."""

    __slots__ = ("authorizer", "host", "principal")

    def __init__(self, authorizer: Authorizer, conn) -> None:
        self.authorizer = authorizer
        self.principal: str = getattr(conn, "principal", None) or ANONYMOUS
        self.host: str = getattr(conn, "peer", "") or ""

    def topic(self, op: Op, name: str) -> bool:
        return self.authorizer.authorize(self.principal, self.host, op, R.TOPIC, name)

    def group(self, op: Op, name: str) -> bool:
        return self.authorizer.authorize(self.principal, self.host, op, R.GROUP, name)

    def txn(self, op: Op, name: str) -> bool:
        return self.authorizer.authorize(self.principal, self.host, op, R.TRANSACTIONAL_ID, name)

    def cluster(self, op: Op) -> bool:
        return self.authorizer.authorize(self.principal, self.host, op, R.CLUSTER, CLUSTER_NAME)

    def any_topic(self, op: Op) -> bool:
        return self.authorizer.authorize_any(self.principal, self.host, op, R.TOPIC)

    def operations(self, rtype: R, name: str) -> int:
        return self.authorizer.authorized_operations(self.principal, self.host, rtype, name)
