"""Where the ACLs are kept, and who is told when they change.

A single node keeps them in ``<data-dir>/meta/acls.json`` (written to a temporary file, fsynced,
renamed over the old one, its directory fsynced; with a CRC-32C of the body, as the SCRAM
credentials). A cluster keeps them in etcd beside the other cluster metadata
(``/stratalog/<cluster>/acls``, one key holding the whole set, changed by a revision-guarded
replace and followed by every broker's watch), so an ACL created through one broker is enforced
by all. Every change is handed to the authorizer (security/authorizer.py), which starts its
answers over.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from stratalog.security import checked_file
from stratalog.security.acls import AclBinding
from stratalog.security.authorizer import Authorizer

Acls = frozenset[AclBinding]


def to_json(acls: Acls) -> list:
    return [b.to_json() for b in sorted(acls, key=AclBinding.sort_key)]


def from_json(raw: list) -> Acls:
    return frozenset(AclBinding.from_json(item) for item in raw)


class AclStore:
    def __init__(self, path: Path | None, authorizer: Authorizer | None) -> None:
        self.path = path
        self.authorizer = authorizer
        self.acls: Acls = frozenset()
        self._cluster = None  # cluster/node.py's ClusterNode, once the broker joined one

    def _take(self, acls: Acls) -> None:
        self.acls = acls
        if self.authorizer is not None:
            self.authorizer.replace(acls)

    def load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        raw = json.loads(self.path.read_text())
        body = raw["acls"]
        if checked_file.body_crc(body) != raw["crc32c"]:
            raise ValueError(f"{self.path}: CRC-32C mismatch (the file is damaged)")
        self._take(from_json(body))

    def follow_cluster(self, node) -> None:
        """Cluster mode: the ACLs are etcd's (``node.acls``), changed through etcd; the data
        directory's file is neither read nor written any more."""
        self._cluster = node
        self.path = None
        node.on_acls = lambda: self._take(from_json(node.acls))
        self._take(from_json(node.acls))

    def change(self, fn: Callable[[Acls], Acls]) -> Awaitable[Acls] | Acls:
        """Apply ``fn`` (ACLs -> ACLs) durably: to the file here (returns the new set), or in a
        cluster to the set etcd holds (an awaitable of the new set; ``fn`` may run again if
        another broker changed it meanwhile)."""
        if self._cluster is not None:
            return self._change_in_cluster(fn)
        new = fn(self.acls)
        if new != self.acls:
            self._save(new)
            self._take(new)
        return new

    async def _change_in_cluster(self, fn: Callable[[Acls], Acls]) -> Acls:
        raw = await self._cluster.update_acls(lambda current: to_json(fn(from_json(current))))
        return from_json(raw)

    def _save(self, acls: Acls) -> None:
        if self.path is None:
            return
        body = to_json(acls)
        checked_file.write(self.path, "acls", body)
