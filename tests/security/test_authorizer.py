"""The authorizer's semantics (security/authorizer.py) and the ACL model's filters and checks
(security/acls.py), as Kafka's StandardAuthorizer and AclBindingFilter define them."""

from __future__ import annotations

import pytest

from stratalog.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    InvalidAcl,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    binding,
)
from stratalog.security.authorizer import Authorizer, parse_super_users

T, G, C, X = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
Op = Operation
ALICE, BOB = "User:alice", "User:bob"
HOST = "127.0.0.1"


def acl(rtype, name, principal, op, perm=ALLOW, pattern=LIT, host="*") -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


def authz(*acls: AclBinding, supers=(), allow_if_none=False) -> Authorizer:
    a = Authorizer(supers, allow_if_none)
    a.replace(acls)
    return a


def test_no_acl_at_all_follows_allow_everyone():
    assert not authz().authorize(ALICE, HOST, Op.READ, T, "t")
    assert authz(allow_if_none=True).authorize(ALICE, HOST, Op.READ, T, "t")


def test_an_acl_for_someone_else_makes_the_resource_guarded():
    a = authz(acl(T, "t", BOB, Op.READ), allow_if_none=True)
    assert a.authorize(BOB, HOST, Op.READ, T, "t")
    assert not a.authorize(ALICE, HOST, Op.READ, T, "t")  # the resource has ACLs: default deny
    assert a.authorize(ALICE, HOST, Op.READ, T, "other")  # no ACL applies here: allowed


def test_literal_allow_is_for_that_name_and_operation_only():
    a = authz(acl(T, "t", ALICE, Op.WRITE))
    assert a.authorize(ALICE, HOST, Op.WRITE, T, "t")
    assert not a.authorize(ALICE, HOST, Op.READ, T, "t")
    assert not a.authorize(ALICE, HOST, Op.WRITE, T, "t2")
    assert not a.authorize(ALICE, HOST, Op.WRITE, G, "t")  # another resource type


def test_deny_wins_over_allow():
    a = authz(acl(T, "t", ALICE, Op.ALL), acl(T, "t", ALICE, Op.WRITE, DENY))
    assert a.authorize(ALICE, HOST, Op.READ, T, "t")
    assert not a.authorize(ALICE, HOST, Op.WRITE, T, "t")
    # A DENY on a prefix beats an ALLOW on the literal name, and the other way round.
    b = authz(acl(T, "orders", ALICE, Op.READ), acl(T, "ord", ALICE, Op.READ, DENY, PRE))
    assert not b.authorize(ALICE, HOST, Op.READ, T, "orders")
    c = authz(acl(T, "ord", ALICE, Op.READ, pattern=PRE), acl(T, "orders", ALICE, Op.READ, DENY))
    assert not c.authorize(ALICE, HOST, Op.READ, T, "orders")
    assert c.authorize(ALICE, HOST, Op.READ, T, "ordinal")


def test_deny_all_denies_every_operation():
    a = authz(acl(T, "*", ALICE, Op.ALL), acl(T, "t", ALICE, Op.ALL, DENY))
    for op in (Op.READ, Op.WRITE, Op.DESCRIBE, Op.DELETE, Op.ALTER_CONFIGS):
        assert not a.authorize(ALICE, HOST, op, T, "t")
        assert a.authorize(ALICE, HOST, op, T, "u")


def test_prefixed_patterns():
    a = authz(acl(T, "app-", ALICE, Op.READ, pattern=PRE))
    assert a.authorize(ALICE, HOST, Op.READ, T, "app-orders")
    assert a.authorize(ALICE, HOST, Op.READ, T, "app-")
    assert not a.authorize(ALICE, HOST, Op.READ, T, "app")
    assert not a.authorize(ALICE, HOST, Op.READ, T, "my-app-orders")


def test_wildcard_resource_principal_and_host():
    a = authz(acl(T, "*", "User:*", Op.READ))
    assert a.authorize(ALICE, HOST, Op.READ, T, "anything")
    assert a.authorize(BOB, "10.0.0.1", Op.READ, T, "x")
    # A wildcard principal is for User principals only.
    assert not a.authorize("Group:ops", HOST, Op.READ, T, "x")
    # The wildcard is the literal name "*", not a glob: a PREFIXED "*" names topics beginning
    # with a star.
    b = authz(acl(T, "*", ALICE, Op.READ, pattern=PRE))
    assert not b.authorize(ALICE, HOST, Op.READ, T, "t")


def test_host_must_match():
    a = authz(acl(T, "t", ALICE, Op.READ, host="10.0.0.5"))
    assert a.authorize(ALICE, "10.0.0.5", Op.READ, T, "t")
    assert not a.authorize(ALICE, HOST, Op.READ, T, "t")
    b = authz(acl(T, "t", ALICE, Op.READ), acl(T, "t", ALICE, Op.READ, DENY, host="10.0.0.9"))
    assert b.authorize(ALICE, HOST, Op.READ, T, "t")
    assert not b.authorize(ALICE, "10.0.0.9", Op.READ, T, "t")


@pytest.mark.parametrize("granted", [Op.READ, Op.WRITE, Op.DELETE, Op.ALTER, Op.DESCRIBE, Op.ALL])
def test_describe_is_implied(granted):
    a = authz(acl(T, "t", ALICE, granted))
    assert a.authorize(ALICE, HOST, Op.DESCRIBE, T, "t")


@pytest.mark.parametrize("granted", [Op.CREATE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS])
def test_describe_is_not_implied_by_the_others(granted):
    assert not authz(acl(T, "t", ALICE, granted)).authorize(ALICE, HOST, Op.DESCRIBE, T, "t")


def test_describe_configs_is_implied_by_alter_configs():
    a = authz(acl(T, "t", ALICE, Op.ALTER_CONFIGS))
    assert a.authorize(ALICE, HOST, Op.DESCRIBE_CONFIGS, T, "t")
    assert not a.authorize(ALICE, HOST, Op.ALTER, T, "t")


def test_implication_does_not_carry_denials():
    # A DENY of READ does not deny DESCRIBE (implication widens ALLOWs only).
    a = authz(acl(T, "t", ALICE, Op.DESCRIBE), acl(T, "t", ALICE, Op.READ, DENY))
    assert a.authorize(ALICE, HOST, Op.DESCRIBE, T, "t")
    assert not a.authorize(ALICE, HOST, Op.READ, T, "t")


def test_super_users_bypass_denials():
    a = authz(acl(T, "*", "User:*", Op.ALL, DENY), supers=parse_super_users(" User:admin ;User:b"))
    assert a.authorize("User:admin", HOST, Op.WRITE, T, "t")
    assert a.authorize("User:b", HOST, Op.ALTER, C, CLUSTER_NAME)
    assert not a.authorize(ALICE, HOST, Op.WRITE, T, "t")


def test_the_cache_follows_changes():
    a = authz(acl(T, "t", ALICE, Op.WRITE))
    assert a.authorize(ALICE, HOST, Op.WRITE, T, "t")
    a.replace([acl(T, "t", ALICE, Op.WRITE, DENY)])
    assert not a.authorize(ALICE, HOST, Op.WRITE, T, "t")
    a.replace([])
    assert not a.authorize(ALICE, HOST, Op.WRITE, T, "t")


def test_authorize_any_of_a_type():
    # KIP-679: an idempotent producer needs WRITE on some topic.
    assert authz(acl(T, "t", ALICE, Op.WRITE)).authorize_any(ALICE, HOST, Op.WRITE, T)
    assert authz(acl(T, "p-", ALICE, Op.WRITE, pattern=PRE)).authorize_any(ALICE, HOST, Op.WRITE, T)
    assert not authz(acl(T, "t", ALICE, Op.READ)).authorize_any(ALICE, HOST, Op.WRITE, T)
    # Every allowed name is covered by a denial.
    assert not authz(
        acl(T, "t", ALICE, Op.WRITE), acl(T, "t", ALICE, Op.WRITE, DENY)
    ).authorize_any(ALICE, HOST, Op.WRITE, T)
    assert not authz(
        acl(T, "pre-x", ALICE, Op.WRITE), acl(T, "pre", ALICE, Op.WRITE, DENY, PRE)
    ).authorize_any(ALICE, HOST, Op.WRITE, T)
    assert not authz(
        acl(T, "t", ALICE, Op.WRITE), acl(T, "*", ALICE, Op.WRITE, DENY)
    ).authorize_any(ALICE, HOST, Op.WRITE, T)
    assert authz(allow_if_none=True).authorize_any(ALICE, HOST, Op.WRITE, T)
    assert authz(supers=[ALICE]).authorize_any(ALICE, HOST, Op.WRITE, T)


def test_authorized_operations():
    a = authz(acl(T, "t", ALICE, Op.READ), acl(T, "t", ALICE, Op.ALTER_CONFIGS))
    bits = a.authorized_operations(ALICE, HOST, T, "t")
    want = {Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS}
    assert bits == sum(1 << op for op in want)
    assert authz(supers=[ALICE]).authorized_operations(ALICE, HOST, G, "g") == 328


# -- filters (DescribeAcls, DeleteAcls) ------------------------------------------------------------
LIT_T = acl(T, "orders", ALICE, Op.READ)
WILD_T = acl(T, "*", BOB, Op.WRITE)
PRE_T = acl(T, "ord", ALICE, Op.READ, DENY, PRE)
GROUP = acl(G, "orders", ALICE, Op.READ)
ALL_ACLS = [LIT_T, WILD_T, PRE_T, GROUP]


def f(rtype=1, name=None, pattern=1, principal=None, host=None, op=1, perm=1) -> AclFilter:
    return AclFilter(rtype, name, pattern, principal, host, op, perm)


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (f(), ALL_ACLS),
        (f(rtype=T), [LIT_T, WILD_T, PRE_T]),
        (f(name="orders"), [LIT_T, GROUP]),  # ANY pattern type: the exact name
        (f(name="orders", pattern=PatternType.MATCH), [LIT_T, WILD_T, PRE_T, GROUP]),
        (f(name="other", pattern=PatternType.MATCH, rtype=T), [WILD_T]),
        (f(name="ord", pattern=PRE), [PRE_T]),
        (f(name="orders", pattern=PRE), []),
        (f(pattern=LIT), [LIT_T, WILD_T, GROUP]),
        (f(principal=BOB), [WILD_T]),
        (f(perm=DENY), [PRE_T]),
        (f(op=Op.WRITE), [WILD_T]),
        (f(host="*"), ALL_ACLS),
        (f(host="10.0.0.1"), []),
    ],
)
def test_filters(flt, expected):
    assert [b for b in ALL_ACLS if flt.matches(b)] == expected


def test_unknown_codes_in_a_filter():
    assert f(rtype=0).unknown()
    assert f(op=99).unknown()
    assert not f().unknown()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((1, "t", 3, ALICE, "*", 3, 3), "Invalid resourceType ANY"),
        ((2, "t", 2, ALICE, "*", 3, 3), "Invalid patternType MATCH"),
        ((2, "t", 3, ALICE, "*", 1, 3), "Invalid operation ANY"),
        ((2, "t", 3, ALICE, "*", 3, 1), "Invalid permissionType ANY"),
        ((4, "other", 3, ALICE, "*", 7, 3), "The only valid name for the CLUSTER resource"),
        ((2, "", 3, ALICE, "*", 3, 3), "Invalid empty resource name"),
        ((2, "t", 3, "alice", "*", 3, 3), "Could not parse principal"),
    ],
)
def test_invalid_bindings(args, message):
    with pytest.raises(InvalidAcl, match=message):
        binding(*args)


def test_a_valid_binding_round_trips_through_json():
    b = binding(2, "t", 4, ALICE, "*", 3, 2)
    assert b == AclBinding(T, "t", PRE, ALICE, "*", Op.READ, DENY)
    assert AclBinding.from_json(b.to_json()) == b
