"""Whether a principal may do an operation on a resource: Kafka's ACL semantics over an ACL set.

The rules, as Kafka's StandardAuthorizer applies them:

* A super user (``super.users``, exact principals such as ``User:admin``) may do everything.
* The ACLs that apply to a resource are those of its type whose pattern covers its name: the
  LITERAL ones of that name, the LITERAL ``*`` ones, and the PREFIXED ones whose name begins it.
  When no ACL applies to the resource at all (for anyone), the answer is
  ``allow.everyone.if.no.acl.found``.
* Of those, the ones for this principal (or ``User:*``) and this client address (or ``*``)
  decide: a DENY of the operation (or of ALL) denies, whatever allows it; otherwise an ALLOW of
  the operation, of ALL, or of an operation that implies it (READ, WRITE, DELETE and ALTER imply
  DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS) allows; otherwise it is denied.

``authorize`` remembers its answers per (principal, host, operation, resource) until the ACLs
change, so a check on the produce path is one dictionary lookup. Sans-IO: the broker hands it
the ACLs (``replace``) and asks; nothing here blocks or touches a file.
"""

from __future__ import annotations

from collections.abc import Iterable

from stratalog.security.acls import (
    IMPLIES,
    OPERATIONS,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    operations_bits,
)

CACHE_ENTRIES = 100_000  # answers remembered before the cache starts over

_Key = tuple[str, str, int, int, str]


def parse_super_users(text: str) -> frozenset[str]:
    """``super.users``: principals separated by ``;`` (Kafka's syntax), blanks ignored."""
    return frozenset(p.strip() for p in text.split(";") if p.strip())


def _principal_matches(acl: AclBinding, principal: str) -> bool:
    return acl.principal == principal or (
        acl.principal == WILDCARD_PRINCIPAL and principal.startswith("User:")
    )


def _host_matches(acl: AclBinding, host: str) -> bool:
    return acl.host == host or acl.host == WILDCARD


class Authorizer:
    def __init__(self, super_users: Iterable[str] = (), allow_if_no_acl: bool = False) -> None:
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self.acls: frozenset[AclBinding] = frozenset()
        self._literal: dict[tuple[int, str], list[AclBinding]] = {}
        self._prefixed: dict[int, list[AclBinding]] = {}
        self._cache: dict[_Key, bool] = {}
        self.version = 0  # bumped at every change of the ACLs

    def replace(self, acls: Iterable[AclBinding]) -> None:
        """Take a new ACL set (every answer is worked out again from now on)."""
        acls = frozenset(acls)
        literal: dict[tuple[int, str], list[AclBinding]] = {}
        prefixed: dict[int, list[AclBinding]] = {}
        for acl in acls:
            if acl.pattern_type == PatternType.PREFIXED:
                prefixed.setdefault(acl.resource_type, []).append(acl)
            else:
                literal.setdefault((acl.resource_type, acl.name), []).append(acl)
        self.acls, self._literal, self._prefixed = acls, literal, prefixed
        self._cache = {}
        self.version += 1

    # -- the questions ---------------------------------------------------------------------------
    def authorize(
        self, principal: str, host: str, op: Operation, rtype: ResourceType, name: str
    ) -> bool:
        key = (principal, host, op, rtype, name)
        answer = self._cache.get(key)
        if answer is None:
            answer = self.decide(principal, host, op, rtype, name)
            if len(self._cache) >= CACHE_ENTRIES:
                self._cache = {}
            self._cache[key] = answer
        return answer

    def applicable(self, rtype: ResourceType, name: str) -> list[AclBinding]:
        """Every ACL whose pattern covers resource ``name`` of type ``rtype``, for anyone."""
        found = list(self._literal.get((rtype, name), ()))
        if name != WILDCARD:
            found += self._literal.get((rtype, WILDCARD), ())
        found += (a for a in self._prefixed.get(rtype, ()) if name.startswith(a.name))
        return found

    def decide(
        self, principal: str, host: str, op: Operation, rtype: ResourceType, name: str
    ) -> bool:
        """The answer itself (``authorize`` without the cache)."""
        if principal in self.super_users:
            return True
        acls = self.applicable(rtype, name)
        if not acls:
            return self.allow_if_no_acl
        implied = IMPLIES.get(op, ())
        allowed = False
        for acl in acls:
            if not _principal_matches(acl, principal) or not _host_matches(acl, host):
                continue
            if acl.permission == Permission.DENY:
                if acl.operation == op or acl.operation == Operation.ALL:
                    return False
            elif acl.operation == op or acl.operation == Operation.ALL or acl.operation in implied:
                allowed = True
        return allowed

    def authorize_any(self, principal: str, host: str, op: Operation, rtype: ResourceType) -> bool:
        """Whether the principal may do ``op`` on at least one resource of type ``rtype`` (Kafka's
        authorizeByResourceType, KIP-679: InitProducerId of an idempotent producer needs WRITE
        on some topic): an ALLOW of it on some literal name or prefix that no DENY of it
        covers (a literal DENY of the same name, or a PREFIXED DENY of a prefix of the name);
        a DENY on the literal ``*`` denies."""
        # A name no ACL is likely to name: super users and "no ACL found" answer through it.
        if self.authorize(principal, host, op, rtype, "\x00stratalog-any"):
            return True
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allow: list[tuple[PatternType, str]] = []
        for acl in self.acls:
            if acl.resource_type != rtype or not _host_matches(acl, host):
                continue
            if not _principal_matches(acl, principal):
                continue
            if acl.operation != op and acl.operation != Operation.ALL:
                continue
            if acl.permission == Permission.DENY:
                if acl.pattern_type == PatternType.LITERAL:
                    if acl.name == WILDCARD:
                        return False
                    deny_literal.add(acl.name)
                else:
                    deny_prefixed.add(acl.name)
            elif acl.pattern_type == PatternType.LITERAL and acl.name == WILDCARD:
                return True
            else:
                allow.append((acl.pattern_type, acl.name))
        for pattern, name in allow:
            if pattern == PatternType.LITERAL and name in deny_literal:
                continue
            if not any(name[:i] in deny_prefixed for i in range(1, len(name) + 1)):
                return True
        return False

    def authorized_operations(
        self, principal: str, host: str, rtype: ResourceType, name: str
    ) -> int:
        """The bit set of the operations of this resource's type the principal may do on it."""
        return operations_bits(
            op
            for op in OPERATIONS.get(rtype, ())
            if self.authorize(principal, host, op, rtype, name)
        )
