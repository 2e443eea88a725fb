"""A topic is placed on the brokers registered in etcd, not on a node's watched copy of them.

A broker's watch of etcd lags a registration a little, and more under load: a CreateTopics
answered in that moment was refused INVALID_REPLICATION_FACTOR ("only 1 broker(s) are
registered") though Metadata elsewhere listed both (seen in CI). Here the lag is made as long
as it can be: the first node's watch is stopped before the second registers.
"""

from __future__ import annotations

import asyncio
import uuid

from stratalog.cluster.etcd_server import EtcdServer
from stratalog.cluster.node import ClusterNode


def test_a_topic_is_placed_on_brokers_registered_after_the_watch_last_saw(
    etcd: EtcdServer,
) -> None:
    name = f"placed-{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        first = ClusterNode([etcd.endpoint], name, 1, "127.0.0.1", 1)
        second = ClusterNode([etcd.endpoint], name, 2, "127.0.0.1", 2)
        try:
            await first.connect(None)
            await first.register()
            assert first._watch is not None
            first._watch.cancel()  # what it knows of brokers now stays as it is
            await second.connect(None)
            await second.register()
            assert sorted(first.brokers) == [1]  # the watched copy never saw node 2
            topic = await first.create_topic("spread", 4, 2, {})
            placed = {tuple(sorted(first.vlogs[vid].replicas)) for vid in topic.vlogs}
            assert placed == {(1, 2)}  # every partition on both
        finally:
            await second.leave()
            await first.leave()

    asyncio.run(run())
