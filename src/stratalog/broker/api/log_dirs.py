"""DescribeLogDirs (API 35): the one log directory of a broker and the partitions it holds.

kafka-reassign-partitions asks it of every replica before it moves anything (to print the
current assignment with its directories). A Stratalog broker has one hot-tier directory; the
partitions listed are the ones stored here, a cluster's backups included (offset lag 0: a
backup's lag is its virtual log's, not the partition's).
"""

from __future__ import annotations

import shutil

from stratalog.protocol.connection import Request

from .common import NONE, reply, sub


def handle_describe_log_dirs(core, req: Request, conn) -> bytes:
    body = req.body
    wanted = None
    if body.topics is not None:
        wanted = {(t.topic, int(i)) for t in body.topics for i in t.partitions}
    by_topic: dict[str, list] = {}
    for name, t in sorted(core.metadata.topics.items()):
        for index, uid in enumerate(t.partitions):
            p = core.store.partitions.get(uid)
            if p is None or (wanted is not None and (name, index) not in wanted):
                continue
            by_topic.setdefault(name, []).append(
                sub(
                    req,
                    "DescribeLogDirsPartition",
                    partition_index=index,
                    partition_size=p.size_bytes + p.cold_bytes,
                    offset_lag=0,
                    is_future_key=False,
                )
            )
    root = core.store.root
    try:
        usage = shutil.disk_usage(root)
        total, usable = usage.total, usage.free
    except OSError:
        total = usable = -1
    result = sub(
        req,
        "DescribeLogDirsResult",
        error_code=NONE,
        log_dir=str(root),
        topics=tuple(
            sub(req, "DescribeLogDirsTopic", name=n, partitions=tuple(ps))
            for n, ps in by_topic.items()
        ),
        total_bytes=total,
        usable_bytes=usable,
    )
    return reply(req, error_code=NONE, results=(result,))
