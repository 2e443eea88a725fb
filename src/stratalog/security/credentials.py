"""Who may log in: users' SCRAM credentials (kept durably) and the PLAIN users file.

SCRAM credentials are salted and hashed (``scram.ScramCredential``: salt, iterations, StoredKey,
ServerKey; never the password) and changed only through AlterUserScramCredentials (Kafka's
``kafka-configs --alter --add-config 'SCRAM-SHA-256=[password=...]' --entity-type users``). A
single node keeps them in ``<data-dir>/meta/scram-credentials.json``, written to a temporary
file, fsynced and renamed over the old one (with its directory fsynced), with a CRC-32C of the
body; a cluster keeps them in etcd (``/stratalog/<cluster>/scram/<user>``, changed in one
guarded transaction by cluster/node.py's ``alter_scram`` and followed by its watch) so every
broker sees the same.

PLAIN checks a user first against ``sasl.plain.users.file`` (Kafka's JAAS syntax:
``user_alice="alice-secret"`` entries of a PlainLoginModule, as in Kafka's
``listener.name.<l>.plain.sasl.jaas.config``), then against the user's SCRAM credentials (the
password is salted and hashed as SCRAM would and compared with the StoredKey).
"""

from __future__ import annotations

import hmac
import json
import re
from pathlib import Path

from stratalog.config import ConfigError
from stratalog.security import checked_file
from stratalog.security.scram import MECHANISMS, ScramCredential, password_matches

# user -> mechanism name -> credential
Credentials = dict[str, dict[str, ScramCredential]]

_JAAS_USER = re.compile(r'user_([^\s=;"]+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def read_plain_users(location: str) -> dict[str, str]:
    """user -> password from a JAAS-style file (``sasl.plain.users.file``)."""
    if not location:
        return {}
    try:
        text = Path(location).read_text()
    except FileNotFoundError:
        raise ConfigError(f"sasl.plain.users.file: {location} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"sasl.plain.users.file: cannot read {location}: {e}") from None
    users = {m[1]: re.sub(r"\\(.)", r"\1", m[2]) for m in _JAAS_USER.finditer(text)}
    if not users:
        raise ConfigError(
            f'sasl.plain.users.file: {location} lists no user (entries look like user_alice="...")'
        )
    return users


class CredentialStore:
    """Users' SCRAM credentials, read by authentication and changed by the admin API; the
    embedded single node's are in a file of the data directory."""

    def __init__(self, path: Path | None, plain_users: dict[str, str] | None = None) -> None:
        self.path = path
        self.plain_users = dict(plain_users or {})
        self.users: Credentials = {}
        self._cluster = None  # cluster/node.py's ClusterNode, once the broker joined one

    def follow_cluster(self, node) -> None:
        """Cluster mode: the credentials are etcd's (``node.scram``), changed through etcd; the
        data directory's file is neither read nor written any more."""
        self._cluster = node
        self.path = None

        def taken_over() -> None:
            self.users = {
                user: {m: ScramCredential.from_json(c) for m, c in mechs.items()}
                for user, mechs in node.scram.items()
            }

        node.on_credentials = taken_over
        taken_over()

    def load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        raw = json.loads(self.path.read_text())
        body = raw["users"]
        if checked_file.body_crc(body) != raw["crc32c"]:
            raise ValueError(f"{self.path}: CRC-32C mismatch (the file is damaged)")
        self.users = {
            user: {m: ScramCredential.from_json(c) for m, c in mechs.items()}
            for user, mechs in body.items()
        }

    # -- reads -----------------------------------------------------------------------------------
    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.users.get(user, {}).get(mechanism)

    def check_plain(self, user: str, password: str) -> bool:
        known = self.plain_users.get(user)
        if known is not None:
            return hmac.compare_digest(known.encode(), password.encode())
        for name, cred in self.users.get(user, {}).items():
            return password_matches(MECHANISMS[name], cred, password)
        return False

    # -- changes ---------------------------------------------------------------------------------
    async def alter(
        self,
        upserts: list[tuple[str, str, ScramCredential]],
        deletes: list[tuple[str, str]],
    ) -> None:
        """Apply the changes at once and durably (all or none)."""
        if self._cluster is not None:
            await self._cluster.alter_scram([(u, m, c.to_json()) for u, m, c in upserts], deletes)
            return
        users = {u: dict(m) for u, m in self.users.items()}
        for user, mech in deletes:
            users.get(user, {}).pop(mech, None)
        for user, mech, cred in upserts:
            users.setdefault(user, {})[mech] = cred
        users = {u: m for u, m in users.items() if m}
        self._save(users)
        self.users = users

    def replace_all(self, users: Credentials) -> None:
        """A cluster's store hands over the credentials etcd holds now."""
        self.users = users

    def _save(self, users: Credentials) -> None:
        if self.path is None:
            return
        body = {u: {m: c.to_json() for m, c in mechs.items()} for u, mechs in users.items()}
        checked_file.write(self.path, "users", body)
