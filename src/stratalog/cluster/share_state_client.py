"""Share-group state kept by another broker (cluster mode): placeholder."""

from __future__ import annotations

from stratalog.storage.journal import StorageFailure


async def read_remote(core, key):
    raise StorageFailure("share state of another coordinator: not yet")


async def write_remote(core, entries):
    raise StorageFailure("share state of another coordinator: not yet")
