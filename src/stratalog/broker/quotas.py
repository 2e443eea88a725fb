"""Client quotas (KIP-546's DescribeClientQuotas and AlterClientQuotas) and their enforcement.

The quotas: per entity (a user, a client id, both, or an IP address; a name of None is that
type's default) a few values by key, as Kafka's controller keeps them
(ClientQuotaControlManager): ``producer_byte_rate``, ``consumer_byte_rate`` (whole numbers),
``request_percentage``, ``controller_mutation_rate`` for users and client ids,
``connection_creation_rate`` (a whole number) for IP addresses. ``QuotaStore`` keeps them in
``meta/quotas.json`` (written whole, fsynced, renamed) on a single node; in a cluster etcd holds
them (``ClusterNode``'s ``quotas`` key) and every broker's store follows it.

Enforcement (``ByteQuotas``), as Kafka's ClientQuotaManager does for byte rates: the bytes a
client produces (request sizes) and fetches (response sizes) are counted per quota entity over
``WINDOWS`` one-second windows; once the rate passes the entity's quota, the answer carries a
throttle time (long enough for the rate to come back to the quota, at most the whole window),
and the broker mutes the connection for that long after sending it (KIP-219), so well-behaved
clients and ill-behaved ones are slowed alike. A throttled Fetch is answered without records.
Which quota applies follows Kafka's order: user and client id, user and default client id,
user, default user and client id, default user and default client id, default user, client id,
default client id. Without authentication the user is ``ANONYMOUS``, as in Kafka.
``request_percentage``, ``controller_mutation_rate`` and ``connection_creation_rate`` are kept
and described but not enforced.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from stratalog.storage.segment import fsync_dir

USER, CLIENT_ID, IP = "user", "client-id", "ip"
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
# Key -> whether its value must be a whole number (Kafka: LONG/INT vs DOUBLE), per entity kind.
USER_CLIENT_KEYS = {
    PRODUCER_BYTE_RATE: True,
    CONSUMER_BYTE_RATE: True,
    "request_percentage": False,
    "controller_mutation_rate": False,
}
IP_KEYS = {"connection_creation_rate": True}
_MAX = {True: float(2**63 - 1)}
EXACT, DEFAULT, SPECIFIED = 0, 1, 2
ANONYMOUS = "ANONYMOUS"
WINDOWS = 11  # Kafka's quota.window.num
WINDOW_S = 1.0  # Kafka's quota.window.size.seconds

Entity = tuple[tuple[str, str | None], ...]  # (type, name or None: the default), sorted by type


class QuotaError(Exception):
    """A request Kafka answers with ``error`` (INVALID_REQUEST, UNSUPPORTED_VERSION)."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


def entity_of(pairs: list[tuple[str, str | None]]) -> Entity:
    """An entity from a request's (type, name) list; a type named twice keeps its last name,
    as Kafka's request reader makes a map of them."""
    return tuple(sorted(dict(pairs).items()))


def _describe_entity(entity: Entity) -> str:
    return "ClientQuotaEntity(entries={" + ", ".join(f"{t}={n}" for t, n in entity) + "})"


def check_entity(entity: Entity) -> dict[str, bool]:
    """The keys the entity may have (key -> whole number only), or QuotaError."""
    if not entity:
        raise QuotaError("INVALID_REQUEST", "Invalid empty client quota entity")
    types = {}
    for t, name in entity:
        if t not in (USER, CLIENT_ID, IP):
            raise QuotaError("INVALID_REQUEST", f"Unhandled client quota entity type: {t}")
        if name is not None and name == "":
            raise QuotaError("INVALID_REQUEST", f"Empty {t} not supported")
        types[t] = name
    if IP in types:
        if USER in types or CLIENT_ID in types:
            raise QuotaError(
                "INVALID_REQUEST",
                "Invalid quota entity combination, IP entity shouldnot be combined with User or "
                "ClientId",
            )
        ip = types[IP]
        if ip is not None:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise QuotaError(
                    "INVALID_REQUEST", f"{ip} is not a valid IP or resolvable host."
                ) from None
        return IP_KEYS
    return USER_CLIENT_KEYS


def check_value(keys: dict[str, bool], key: str, value: float) -> None:
    whole = keys.get(key)
    if whole is None:
        raise QuotaError("INVALID_REQUEST", f"Invalid configuration key {key}")
    if not value > 0.0:
        raise QuotaError("INVALID_REQUEST", f"Quota {key} must be greater than 0")
    if whole:
        limit = 2**31 - 1 if keys is IP_KEYS else 2**63 - 1
        if value > limit:
            kind = "an INT" if keys is IP_KEYS else "a LONG"
            raise QuotaError(
                "INVALID_REQUEST", f"Proposed value for {key} is too large for {kind}."
            )
        if abs(math.fmod(value, 1.0)) > 1e-6:
            raise QuotaError("INVALID_REQUEST", f"{key} cannot be a fractional value.")


@dataclass
class Alteration:
    """One entry of an AlterClientQuotas request: the entity and key -> value (None: remove)."""

    entity: Entity
    ops: list[tuple[str, float | None]]


def plan(
    current: dict[Entity, dict[str, float]], alterations: list[Alteration]
) -> tuple[dict[Entity, tuple[str, str | None]], dict[Entity, dict[str, float]]]:
    """Kafka's answer per entity ((error, message); an entity named twice is answered once, with
    INVALID_REQUEST, its first entry applied all the same, as Kafka's controller does) and the
    quotas after the entries that succeed (those that fail change nothing)."""
    results: dict[Entity, tuple[str, str | None]] = {}
    after = {e: dict(v) for e, v in current.items()}
    answered = results
    for alt in alterations:
        error: tuple[str, str] | None = None
        changes: dict[str, float | None] = {}
        for key, value in alt.ops:
            if key in changes:
                error = (
                    "INVALID_REQUEST",
                    f"Duplicate quota key {key} not updating quota for this entity "
                    f"{_describe_entity(alt.entity)}",
                )
            else:
                changes[key] = value
        if alt.entity in answered:
            error = ("INVALID_REQUEST", f"Ignoring duplicate entity {_describe_entity(alt.entity)}")
        if error is None:
            try:
                keys = check_entity(alt.entity)
                for key, value in changes.items():
                    if value is not None:
                        check_value(keys, key, value)
            except QuotaError as e:
                error = (e.error, str(e))
        if error is not None:
            results[alt.entity] = error
            continue
        values = after.setdefault(alt.entity, {})
        for key, value in changes.items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        if not values:
            del after[alt.entity]
        results[alt.entity] = ("NONE", None)
    return results, after


def describe(
    quotas: dict[Entity, dict[str, float]],
    components: list[tuple[str, int, str | None]],
    strict: bool,
) -> list[tuple[Entity, dict[str, float]]]:
    """The entities matching a DescribeClientQuotas filter (ClientQuotasImage.describe), or
    QuotaError."""
    exact: dict[str, str | None] = {}
    typed: set[str] = set()
    for etype, match_type, match in components:
        if not etype:
            raise QuotaError("INVALID_REQUEST", "Invalid empty entity type.")
        if etype in exact or etype in typed:
            raise QuotaError(
                "INVALID_REQUEST",
                f"Entity type {etype} cannot appear more than once in the filter.",
            )
        if etype not in (IP, USER, CLIENT_ID):
            raise QuotaError("UNSUPPORTED_VERSION", f"Unsupported entity type {etype}")
        if match_type == EXACT:
            if match is None:
                raise QuotaError(
                    "INVALID_REQUEST",
                    "Request specified MATCH_TYPE_EXACT, but set match string to null.",
                )
            exact[etype] = match
        elif match_type == DEFAULT:
            if match is not None:
                raise QuotaError(
                    "INVALID_REQUEST",
                    "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.",
                )
            exact[etype] = None
        elif match_type == SPECIFIED:
            if match is not None:
                raise QuotaError(
                    "INVALID_REQUEST",
                    "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.",
                )
            typed.add(etype)
        else:
            raise QuotaError("INVALID_REQUEST", f"Unknown match type {match_type}")
    if (IP in exact or IP in typed) and ({USER, CLIENT_ID} & (set(exact) | typed)):
        raise QuotaError(
            "INVALID_REQUEST",
            "Invalid entity filter component combination. IP filter component should not be "
            "used with user or clientId filter component.",
        )
    out = []
    for entity, values in quotas.items():
        names = dict(entity)
        if strict and len(names) != len(exact) + len(typed):
            continue
        if any(t not in names or names[t] != n for t, n in exact.items()):
            continue
        if any(t not in names for t in typed):
            continue
        out.append((entity, values))
    return out


def to_json(quotas: dict[Entity, dict[str, float]]) -> list:
    return [
        {"entity": [list(p) for p in e], "values": v} for e, v in sorted(quotas.items(), key=repr)
    ]


def from_json(raw: list) -> dict[Entity, dict[str, float]]:
    return {
        tuple((t, n) for t, n in item["entity"]): {k: float(v) for k, v in item["values"].items()}
        for item in raw
    }


class QuotaStore:
    """The quotas in force on this broker; durable in ``meta/quotas.json`` on a single node."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / "meta" / "quotas.json"
        self.quotas: dict[Entity, dict[str, float]] = {}
        self.version = 0  # bumped at every change (enforcement re-resolves then)

    def load(self) -> None:
        if self.path.exists():
            self.quotas = from_json(json.loads(self.path.read_text()))
            self.version += 1

    def replace(self, quotas: dict[Entity, dict[str, float]], *, save: bool) -> None:
        self.quotas = quotas
        self.version += 1
        if save:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".json.tmp")
            with open(tmp, "w") as f:
                json.dump(to_json(quotas), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            fsync_dir(self.path.parent)


def _lookup_order(user: str, client_id: str) -> list[Entity]:
    u, c, du, dc = (USER, user), (CLIENT_ID, client_id), (USER, None), (CLIENT_ID, None)
    # (An entity's pairs are sorted by type: "client-id" before "user".)
    return [(c, u), (dc, u), (u,), (c, du), (dc, du), (du,), (c,), (dc,)]


class _Rate:
    """Bytes over the last ``WINDOWS`` windows (Kafka's Rate with its SampledStat windows)."""

    __slots__ = ("samples", "start")

    def __init__(self, now: float) -> None:
        self.samples: list[list[float]] = []  # [window start, bytes]
        self.start = now

    def record(self, now: float, n: float) -> None:
        if not self.samples or now - self.samples[-1][0] >= WINDOW_S:
            self.samples.append([now, 0.0])
            if len(self.samples) > WINDOWS:
                del self.samples[0]
        self.samples[-1][1] += n

    def rate(self, now: float) -> float:
        while self.samples and now - self.samples[0][0] >= WINDOWS * WINDOW_S:
            del self.samples[0]
        if not self.samples:
            return 0.0
        # As Kafka: a young window counts as (WINDOWS - 1) whole windows so far.
        elapsed = max(now - self.samples[0][0], (WINDOWS - 1) * WINDOW_S)
        return sum(s[1] for s in self.samples) / elapsed


class ByteQuotas:
    """Produce and fetch byte-rate quotas in force: throttle times for a client's bytes."""

    def __init__(self, store: QuotaStore, clock=time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._rates: dict[tuple[str, Entity], _Rate] = {}

    def quota(self, key: str, user: str, client_id: str) -> tuple[Entity, float] | None:
        """The quota that applies to this client (its entity and value), if any."""
        quotas = self.store.quotas
        if not quotas:
            return None
        for entity in _lookup_order(user, client_id):
            value = quotas.get(entity, {}).get(key)
            if value is not None:
                return entity, value
        return None

    def throttle_ms(self, key: str, user: str, client_id: str) -> int:
        """How long this client must wait now (0: it is within its quota)."""
        found = self.quota(key, user, client_id)
        if found is None:
            return 0
        entity, bound = found
        r = self._rates.get((key, self._metric(entity, user, client_id)))
        if r is None:
            return 0
        now = self.clock()
        value = r.rate(now)
        if value <= bound:
            return 0
        elapsed = max(now - r.samples[0][0], (WINDOWS - 1) * WINDOW_S) if r.samples else 0.0
        return int(min((value - bound) / bound * elapsed, WINDOWS * WINDOW_S) * 1000)

    def record(self, key: str, user: str, client_id: str, n: int) -> int:
        """Count ``n`` bytes for this client; return its throttle time now."""
        found = self.quota(key, user, client_id)
        if found is None:
            return 0
        metric = (key, self._metric(found[0], user, client_id))
        now = self.clock()
        r = self._rates.get(metric)
        if r is None:
            r = self._rates[metric] = _Rate(now)
        r.record(now, n)
        return self.throttle_ms(key, user, client_id)

    @staticmethod
    def _metric(entity: Entity, user: str, client_id: str) -> Entity:
        """Which clients share one rate: those a quota's entity names (a default entity's
        quota applies to each user or client id on its own, as Kafka's metric tags do)."""
        names = dict(entity)
        out = []
        if CLIENT_ID in names:
            out.append((CLIENT_ID, client_id))
        if USER in names:
            out.append((USER, user))
        return tuple(out)
