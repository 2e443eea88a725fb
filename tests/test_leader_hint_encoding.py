"""KIP-951's tagged fields in the hand-written Produce and Fetch encoders, read back with kio.

A partition refused as not led may name its current leader (Produce v10+, Fetch v16+) and the
response the leaders' endpoints; older versions have no such fields and must not carry them,
and a response without hints must be byte for byte what it was before.
"""

from __future__ import annotations

import uuid

import pytest

from stratalog.protocol import codec
from stratalog.protocol.fetch import PartitionFetchResult, encode_fetch_response
from stratalog.protocol.produce import PartitionProduceResult, encode_produce_response

ENDPOINTS = [(2, "127.0.0.1", 40013), (3, "broker-3.example", 9092)]


def _produce(version: int, hinted: bool) -> bytes:
    parts = [
        PartitionProduceResult(0, 6, current_leader=(2, 7) if hinted else None),
        PartitionProduceResult(1, 0, base_offset=41, log_start_offset=0),
        PartitionProduceResult(2, 6, current_leader=(3, 1) if hinted else None),
    ]
    return encode_produce_response(
        version, 11, [("t", parts)], node_endpoints=ENDPOINTS if hinted else None
    )


@pytest.mark.parametrize("version", range(3, 13))
def test_produce_hints_decode_as_kafka_defines_them(version):
    cid, body = codec.decode_response(0, version, _produce(version, True)[4:])
    assert cid == 11
    parts = body.responses[0].partition_responses
    assert [p.error_code.value for p in parts] == [6, 0, 6]
    assert parts[1].base_offset == 41
    if version < 10:
        assert not hasattr(parts[0], "current_leader")
        assert _produce(version, True) == _produce(version, False)
        return
    assert (parts[0].current_leader.leader_id, parts[0].current_leader.leader_epoch) == (2, 7)
    assert (parts[1].current_leader.leader_id, parts[1].current_leader.leader_epoch) == (-1, -1)
    assert (parts[2].current_leader.leader_id, parts[2].current_leader.leader_epoch) == (3, 1)
    assert [(e.node_id, e.host, e.port, e.rack) for e in body.node_endpoints] == [
        (n, h, p, None) for n, h, p in ENDPOINTS
    ]
    plain = codec.decode_response(0, version, _produce(version, False)[4:])[1]
    assert plain.node_endpoints == ()
    assert plain.responses[0].partition_responses[0].current_leader.leader_id == -1


def _fetch(version: int, hinted: bool) -> bytes:
    parts = [
        PartitionFetchResult(0, 6, current_leader=(2, 7) if hinted else None),
        PartitionFetchResult(1, 0, 5, 5, 0, records=[b"r" * 9], records_size=9),
    ]
    frame, size = encode_fetch_response(
        version,
        12,
        [("t", uuid.UUID(int=5), parts)],
        node_endpoints=ENDPOINTS[:1] if hinted else None,
    )
    data = b"".join(frame)
    assert len(data) == size
    return data


@pytest.mark.parametrize("version", range(4, 18))
def test_fetch_hints_decode_as_kafka_defines_them(version):
    cid, body = codec.decode_response(1, version, _fetch(version, True)[4:])
    assert cid == 12
    p0, p1 = body.responses[0].partitions
    assert p0.error_code.value == 6
    assert p1.records == b"r" * 9
    if version < 16:
        assert _fetch(version, True) == _fetch(version, False)
        return
    assert (p0.current_leader.leader_id, p0.current_leader.leader_epoch) == (2, 7)
    assert p1.current_leader.leader_id == -1
    assert [(e.node_id, e.host, e.port) for e in body.node_endpoints] == [ENDPOINTS[0]]
