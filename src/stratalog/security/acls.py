"""Kafka's ACL model: bindings, the filters that find them, and the checks a new one must pass.

An ACL binding is a resource pattern (resource type, name, pattern type LITERAL or PREFIXED)
and an access control entry (principal, host, operation, permission ALLOW or DENY), with the
numeric codes Kafka's CreateAcls, DescribeAcls and DeleteAcls carry (``AclOperation``,
``ResourceType``, ``PatternType``, ``AclPermissionType`` in Kafka's clients). A filter has the
same fields where ANY (and a null name, principal or host) matches everything, and a pattern
type MATCH matches the patterns that would apply to the name it names (LITERAL equal or ``*``,
PREFIXED a prefix of it), as Kafka's ``AclBindingFilter.matches``.

Sans-IO: plain data and pure functions; the authorizer (authorizer.py) decides with them, the
store (acl_store.py) keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


WILDCARD = "*"  # a LITERAL resource name matching every name, and the host matching every host
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"

# An ALLOW of one of these operations also allows DESCRIBE (or DESCRIBE_CONFIGS), as in Kafka.
IMPLIES = {
    Operation.DESCRIBE: frozenset(
        {Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
    ),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS}),
}

# The operations each resource type has (authorized-operations bit sets report these).
OPERATIONS = {
    ResourceType.TOPIC: (
        Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE, Operation.ALTER,
        Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (
        Operation.CREATE, Operation.ALTER, Operation.DESCRIBE, Operation.CLUSTER_ACTION,
        Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE,
    ),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: who (principal, host) may or may not (permission) do what (operation) to which
    resources (type, name, pattern type)."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def to_json(self) -> list:
        return [
            int(self.resource_type), self.name, int(self.pattern_type), self.principal,
            self.host, int(self.operation), int(self.permission),
        ]  # fmt: skip

    @classmethod
    def from_json(cls, raw: list) -> AclBinding:
        rt, name, pt, principal, host, op, perm = raw
        return cls(
            ResourceType(rt), name, PatternType(pt), principal, host, Operation(op),
            Permission(perm),
        )  # fmt: skip

    def sort_key(self) -> tuple:
        return (
            self.resource_type, self.pattern_type, self.name, self.principal, self.host,
            self.operation, self.permission,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class AclFilter:
    """DescribeAcls' filter, or one of DeleteAcls' filters (None: any name, principal, host)."""

    resource_type: int
    name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission: int

    def unknown(self) -> bool:
        """Whether a field holds a code Kafka does not know (or UNKNOWN itself): Kafka refuses
        such a filter as an invalid request."""
        return (
            _unknown(ResourceType, self.resource_type)
            or _unknown(PatternType, self.pattern_type)
            or _unknown(Operation, self.operation)
            or _unknown(Permission, self.permission)
        )

    def matches(self, b: AclBinding) -> bool:
        return self.matches_pattern(b) and self.matches_entry(b)

    def matches_pattern(self, b: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and self.resource_type != b.resource_type:
            return False
        pt = self.pattern_type
        if pt not in (PatternType.ANY, PatternType.MATCH) and pt != b.pattern_type:
            return False
        if self.name is None:
            return True
        if pt == PatternType.ANY or pt == b.pattern_type:
            return self.name == b.name
        # MATCH: the bindings that would apply to a resource of this name.
        if b.pattern_type == PatternType.LITERAL:
            return self.name == b.name or b.name == WILDCARD
        if b.pattern_type == PatternType.PREFIXED:
            return self.name.startswith(b.name)
        return False

    def matches_entry(self, b: AclBinding) -> bool:
        return (
            (self.principal is None or self.principal == b.principal)
            and (self.host is None or self.host == b.host)
            and (self.operation == Operation.ANY or self.operation == b.operation)
            and (self.permission == Permission.ANY or self.permission == b.permission)
        )


def _unknown(enum: type[IntEnum], value: int) -> bool:
    return value == 0 or value not in enum._value2member_map_


class InvalidAcl(ValueError):
    """A binding CreateAcls refuses (INVALID_REQUEST with this message)."""


def binding(
    resource_type: int,
    name: str | None,
    pattern_type: int,
    principal: str | None,
    host: str | None,
    operation: int,
    permission: int,
) -> AclBinding:
    """A new ACL from a CreateAcls entry, checked as Kafka checks it, or InvalidAcl. (An entry
    that is not ``concrete`` fails the whole CreateAcls in Kafka: the handler checks that
    first.)"""
    if _unknown(ResourceType, resource_type) or resource_type == ResourceType.ANY:
        raise InvalidAcl(f"Invalid resourceType {_name(ResourceType, resource_type)}")
    if pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAcl(f"Invalid patternType {_name(PatternType, pattern_type)}")
    if _unknown(Operation, operation) or operation == Operation.ANY:
        raise InvalidAcl(f"Invalid operation {_name(Operation, operation)}")
    if permission not in (Permission.ALLOW, Permission.DENY):
        raise InvalidAcl(f"Invalid permissionType {_name(Permission, permission)}")
    if resource_type == ResourceType.CLUSTER and name != CLUSTER_NAME:
        raise InvalidAcl(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if not name:
        raise InvalidAcl("Invalid empty resource name")
    if principal is None:
        raise InvalidAcl("Invalid null principal")
    if ":" not in principal:
        raise InvalidAcl(
            f"Could not parse principal from `{principal}` (no colon is present separating the "
            "principal type from the principal name)"
        )
    if host is None:
        raise InvalidAcl("Invalid null host")
    return AclBinding(
        ResourceType(resource_type), name, PatternType(pattern_type), principal, host,
        Operation(operation), Permission(permission),
    )  # fmt: skip


def concrete(resource_type: int, pattern_type: int, operation: int, permission: int) -> bool:
    """Whether an ACL's codes name one thing each (no UNKNOWN, ANY or MATCH): Kafka cannot even
    build the binding of one that does not, and fails the whole CreateAcls request with
    UNKNOWN_SERVER_ERROR (observed on Kafka 4.4)."""
    return (
        not _unknown(ResourceType, resource_type)
        and resource_type != ResourceType.ANY
        and pattern_type in (PatternType.LITERAL, PatternType.PREFIXED)
        and not _unknown(Operation, operation)
        and operation != Operation.ANY
        and permission in (Permission.ALLOW, Permission.DENY)
    )


def _name(enum: type[IntEnum], value: int) -> str:
    member = enum._value2member_map_.get(value)
    return member.name if member is not None else "UNKNOWN"


def operations_bits(ops) -> int:
    """Kafka's authorized-operations bit set: bit n for the operation of code n."""
    bits = 0
    for op in ops:
        bits |= 1 << int(op)
    return bits
