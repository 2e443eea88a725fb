"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51): users' SCRAM
credentials, as ``kafka-configs --entity-type users`` manages them.

Describe lists each user's mechanisms and iteration counts (never salts or keys); a user named
twice is DUPLICATE_RESOURCE, an unknown one RESOURCE_NOT_FOUND. Alter receives what the client
computed (salt, iterations, SaltedPassword) and keeps the derived StoredKey and ServerKey
(security/scram.py); Kafka's checks and messages apply: an unknown mechanism, an empty name,
iterations outside 4096..16384, a deletion of a credential that does not exist, and a user
altered twice in one request fail that user alone; the rest are applied together and durably
(security/credentials.py) before the answer.
"""

from __future__ import annotations

from stratalog.protocol.connection import Request
from stratalog.security.scram import BY_TYPE, MAX_ITERATIONS, MIN_ITERATIONS, credential_from_salted

from .common import NONE, err, reply, sub

_TWICE = "A user credential cannot be altered twice in the same request"
_MISSING = "Attempt to delete a user credential that does not exist"


def handle_describe_user_scram_credentials(core, req: Request, conn) -> bytes:
    store = core.credentials
    asked = req.body.users
    if not asked:
        names = {u: False for u in sorted(store.users)}
    else:
        names = {}
        for u in asked:
            names[u.name] = u.name in names
    results = []
    for user, duplicate in names.items():
        infos = ()
        if duplicate:
            code = err("DUPLICATE_RESOURCE")
            message = (
                "Cannot describe SCRAM credentials for the same user twice in a single "
                f"request: {user}"
            )
        elif user not in store.users:
            code = err("RESOURCE_NOT_FOUND")
            message = f"Attempt to describe a user credential that does not exist: {user}"
        else:
            code, message = NONE, None
            by_name = {m.name: m for m in BY_TYPE.values()}
            infos = tuple(
                sub(req, "CredentialInfo", mechanism=by_name[m].type, iterations=c.iterations)
                for m, c in sorted(store.users[user].items(), key=lambda x: by_name[x[0]].type)
            )
        results.append(
            sub(
                req,
                "DescribeUserScramCredentialsResult",
                user=user,
                error_code=code,
                error_message=message,
                credential_infos=infos,
            )
        )
    return reply(req, error_code=NONE, error_message=None, results=tuple(results))


def _check(name: str, mechanism: int) -> tuple[str, str] | None:
    if not name:
        return "UNACCEPTABLE_CREDENTIAL", "Username must not be empty"
    if mechanism not in BY_TYPE:
        return "UNSUPPORTED_SASL_MECHANISM", "Unknown SCRAM mechanism"
    return None


async def handle_alter_user_scram_credentials(core, req: Request, conn) -> bytes:
    store = core.credentials
    body = req.body
    errors: dict[str, tuple[str, str]] = {}
    deletes: dict[str, tuple[str, str]] = {}
    upserts: dict[str, tuple] = {}
    for d in body.deletions:
        if d.name in errors:
            continue
        if deletes.pop(d.name, None) is not None:
            errors[d.name] = ("DUPLICATE_RESOURCE", _TWICE)
            continue
        problem = _check(d.name, d.mechanism)
        if problem is None and store.get(d.name, BY_TYPE[d.mechanism].name) is None:
            problem = ("RESOURCE_NOT_FOUND", _MISSING)
        if problem is not None:
            errors[d.name] = problem
        else:
            deletes[d.name] = (d.name, BY_TYPE[d.mechanism].name)
    for u in body.upsertions:
        if u.name in errors:
            continue
        if deletes.pop(u.name, None) is not None or upserts.pop(u.name, None) is not None:
            errors[u.name] = ("DUPLICATE_RESOURCE", _TWICE)
            continue
        problem = _check(u.name, u.mechanism)
        if problem is None and u.iterations < MIN_ITERATIONS:
            problem = ("UNACCEPTABLE_CREDENTIAL", "Too few iterations")
        elif problem is None and u.iterations > MAX_ITERATIONS:
            problem = ("UNACCEPTABLE_CREDENTIAL", "Too many iterations")
        if problem is not None:
            errors[u.name] = problem
            continue
        mech = BY_TYPE[u.mechanism]
        cred = credential_from_salted(mech, bytes(u.salt), bytes(u.salted_password), u.iterations)
        upserts[u.name] = (u.name, mech.name, cred)
    if deletes or upserts:
        await store.alter(list(upserts.values()), list(deletes.values()))
    results = [
        sub(req, "AlterUserScramCredentialsResult", user=n, error_code=NONE, error_message=None)
        for n in [*deletes, *upserts]
    ]
    results += [
        sub(req, "AlterUserScramCredentialsResult", user=n, error_code=err(c), error_message=m)
        for n, (c, m) in errors.items()
    ]
    return reply(req, results=tuple(results))
