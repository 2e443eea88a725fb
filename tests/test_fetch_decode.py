"""The client's hand-written Fetch response decoder against the general codec (kio).

``WireClient.fetch`` decodes responses by hand so that records stay views of the frame. Frames
made by the broker's own encoder, for every version the decoder accepts, must decode to what
the codec decodes; a truncated or padded frame must be an error, not a wrong answer.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratalog.protocol import codec
from stratalog.protocol.fetch import (
    PartitionFetchResult,
    decode_fetch_response,
    encode_fetch_response,
)
from stratalog.records import build_batch

partition = st.builds(
    lambda index, err, hw, lso, start, nrec, null: (index, err, hw, lso, start, nrec, null),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0, 0, 1, 3, 6]),
    st.integers(-1, 2**62),
    st.integers(-1, 2**62),
    st.integers(-1, 2**62),
    st.integers(0, 3),
    st.booleans(),
)


def _frame(version, topics, read_committed=False) -> bytes:
    parts, total = encode_fetch_response(
        version, 77, topics, session_id=5, throttle_ms=9, read_committed=read_committed
    )
    frame = b"".join(bytes(p) for p in parts)
    assert len(frame) == total
    return frame[4:]


@settings(max_examples=150, deadline=None)
@given(
    version=st.integers(4, 16),
    topics=st.lists(st.lists(partition, max_size=3), max_size=3),
    read_committed=st.booleans(),
)
def test_hand_decoder_agrees_with_the_codec(version, topics, read_committed) -> None:
    built = []
    for t, parts in enumerate(topics):
        results = []
        for index, err, hw, lso, start, nrec, null in parts:
            recs = (
                [build_batch([(b"k", b"v%d" % i, 1000 + i)], base_offset=i) for i in range(nrec)]
                if not null
                else []
            )
            results.append(
                PartitionFetchResult(
                    index, err, hw, lso, start, recs, sum(map(len, recs)), null_records=null
                )
            )
        built.append((f"topic-{t}", uuid.UUID(int=t + 1), results))
    frame = _frame(version, built, read_committed)
    mine = decode_fetch_response(version, memoryview(frame))
    cid, theirs = codec.decode_response(1, version, frame)
    assert mine.correlation_id == cid == 77
    assert mine.throttle_ms == 9
    assert len(mine.topics) == len(theirs.responses)
    for (topic, parts), t in zip(mine.topics, theirs.responses, strict=True):
        assert topic == (t.topic_id if version >= 13 else t.topic)
        for p, q in zip(parts, t.partitions, strict=True):
            assert p.index == q.partition_index
            assert p.error_code == int(q.error_code)
            assert p.high_watermark == q.high_watermark
            assert p.last_stable_offset == q.last_stable_offset
            if version >= 5:
                assert p.log_start_offset == q.log_start_offset
            assert (p.aborted is None) == (q.aborted_transactions is None)
            assert (None if p.records is None else bytes(p.records)) == q.records


def test_truncated_or_padded_frames_are_errors() -> None:
    batch = build_batch([(None, b"x" * 50, 0)])
    frame = _frame(12, [("t", None, [PartitionFetchResult(0, 0, 1, 1, 0, [batch], len(batch))])])
    assert bytes(decode_fetch_response(12, memoryview(frame)).topics[0][1][0].records) == batch
    for cut in (1, 5, len(batch), len(frame) - 4):
        with pytest.raises(ValueError, match="truncated"):
            decode_fetch_response(12, memoryview(frame[:-cut]))
    with pytest.raises(ValueError, match="after its last field"):
        decode_fetch_response(12, memoryview(frame + b"\x00"))
    with pytest.raises(ValueError, match="not supported"):
        decode_fetch_response(3, memoryview(frame))
