"""Produce to an internal topic is refused, as by Kafka.

Kafka's internal topics (``__consumer_offsets``) are written by the broker alone: a client's
Produce to one is answered INVALID_TOPIC_EXCEPTION (no message, base offset -1), while the other
topics of the same request are appended as usual; with acks=0 the error closes the connection.
Reading them is allowed.

This guard stands in front of ``produce.handle_produce`` and leaves it as it is: a request that
names no existing internal topic (every ordinary one) costs a set lookup per topic and goes
straight through. Only a request naming one takes the slow path: the other topics are produced
by the real handler and its answer is decoded and encoded again with the refused topics added.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime

from stratalog.cluster.metadata import INTERNAL_TOPICS
from stratalog.protocol import codec
from stratalog.protocol.connection import Request
from stratalog.protocol.errors import code
from stratalog.protocol.produce import PartitionProduceResult, encode_produce_response

from . import produce

_REFUSED = "INVALID_TOPIC_EXCEPTION"


def handle_produce(core, req: Request, conn):
    body = req.body
    topics = core.metadata.topics
    refused = [td for td in body.topic_data if td.name in INTERNAL_TOPICS and td.name in topics]
    if not refused or body.acks not in (-1, 0, 1):
        return produce.handle_produce(core, req, conn)
    results = [
        (
            td.name,
            [
                PartitionProduceResult(
                    pd.index,
                    code(
                        _REFUSED
                        if core.partition(td.name, pd.index)
                        else "UNKNOWN_TOPIC_OR_PARTITION"
                    ),
                )
                for pd in td.partition_data
            ],
        )
        for td in refused
    ]
    kept = tuple(td for td in body.topic_data if not any(td is r for r in refused))
    answer = None
    if kept:
        rest = dataclasses.replace(body, topic_data=kept)
        answer = produce.handle_produce(
            core,
            Request(
                req.api_key, req.api_version, req.correlation_id, req.client_id, rest, req.size
            ),
            conn,
        )
    if body.acks == 0:
        conn.abort()  # Kafka's answer to a failed acks=0 produce: drop the connection
        return None
    if answer is None:
        return encode_produce_response(req.api_version, req.correlation_id, results)
    if isinstance(answer, bytes):
        return merged(req, answer, results)
    return _merged_later(req, answer, results)


async def _merged_later(req: Request, answer, results: list) -> bytes:
    frame = await answer if asyncio.isfuture(answer) or asyncio.iscoroutine(answer) else answer
    return merged(req, frame, results)


def merged(req: Request, frame: bytes, refused: list) -> bytes:
    """The real handler's response with the refused topics' results added."""
    _corr, resp = codec.decode_response(req.api_key, req.api_version, frame[4:])
    results = [
        (t.name, [_result(p) for p in t.partition_responses]) for t in resp.responses
    ] + refused
    return encode_produce_response(req.api_version, req.correlation_id, results)


def _result(p) -> PartitionProduceResult:
    stamp = p.log_append_time
    return PartitionProduceResult(
        int(p.index),
        int(p.error_code),
        int(p.base_offset),
        -1 if stamp is None else _ms(stamp),
        int(getattr(p, "log_start_offset", -1)),
        getattr(p, "error_message", None),
    )


def _ms(stamp: datetime) -> int:
    return int(stamp.timestamp() * 1000)
