"""Reading and deleting etcd keys through etcd's own JSON gateway: an oracle for what etcd holds
that does not go through Stratalog's etcd client."""

from __future__ import annotations

import base64
import json
import urllib.request


def _post(endpoint: str, path: str, key: str) -> dict:
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    req = urllib.request.Request(f"{endpoint}/v3/kv/{path}", body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def etcd_value(endpoint: str, key: str) -> bytes | None:
    kvs = _post(endpoint, "range", key).get("kvs", [])
    return base64.b64decode(kvs[0]["value"]) if kvs else None


def etcd_delete(endpoint: str, key: str) -> None:
    _post(endpoint, "deleterange", key)
