"""Bad input from the network and the command line: the right error, or one closed connection.

Requests are hand-built frames sent over plain sockets (bodies encoded with kio), so each case
controls every byte. A malformed request must get the Kafka error code the protocol defines for
it, or a closed connection for that client alone; other clients, and every record acknowledged
before the garbage, must be untouched. The CLI must fail with one line, never a traceback.
"""

from __future__ import annotations

import datetime
import importlib
import io
import socket
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import kio.serial
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from crc32c import crc32c

from stratalog import Broker
from stratalog.protocol import codec
from stratalog.protocol.versions import advertised
from stratalog.records import build_batch, iter_records

from .conftest import create_topic

# Kafka error codes
NONE = 0
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
INVALID_TOPIC_EXCEPTION = 17
INVALID_REQUIRED_ACKS = 21
UNSUPPORTED_VERSION = 35
INVALID_RECORD = 87

PRODUCE_V = 9
CREATE_TOPICS_V = 7
METADATA_V = 12
IO_TIMEOUT = 10.0


# -- a raw Kafka client: frames by hand ---------------------------------------------------------
def _mod(api_key: int, version: int):
    return importlib.import_module(codec.request_class(api_key, version).__module__)


def encode_body(api_key: int, version: int, body) -> bytes:
    out = io.BytesIO()
    kio.serial.entity_writer(codec.request_class(api_key, version))(out, body)
    return out.getvalue()


def request_payload(
    api_key: int, version: int, correlation_id: int, body: bytes, client_id: bytes = b"raw"
) -> bytes:
    """Header + body, without the length prefix."""
    head = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    try:
        flexible = codec.request_class(api_key, version).__flexible__
    except Exception:  # no such API or version in kio: build a non-flexible header
        flexible = False
    if flexible:
        head += b"\x00"
    return head + body


def with_prefix(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def frame(api_key: int, version: int, correlation_id: int, body) -> bytes:
    return with_prefix(
        request_payload(api_key, version, correlation_id, encode_body(api_key, version, body))
    )


def produce_body(topics: dict[str, dict[int, bytes | None]], acks: int = -1):
    m = _mod(0, PRODUCE_V)
    return m.ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=10),
        topic_data=tuple(
            m.TopicProduceData(
                name=name,
                partition_data=tuple(
                    m.PartitionProduceData(index=i, records=r) for i, r in parts.items()
                ),
            )
            for name, parts in topics.items()
        ),
    )


def create_topics_body(names: list[str]):
    m = _mod(19, CREATE_TOPICS_V)
    return m.CreateTopicsRequest(
        topics=tuple(
            m.CreatableTopic(
                name=n, num_partitions=1, replication_factor=1, assignments=(), configs=()
            )
            for n in names
        ),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )


def metadata_body(names: list[str]):
    m = _mod(3, METADATA_V)
    return m.MetadataRequest(
        topics=tuple(m.MetadataRequestTopic(topic_id=None, name=n) for n in names),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def api_versions_body(version: int = 3):
    m = _mod(18, version)
    if version >= 3:
        return m.ApiVersionsRequest(client_software_name="raw", client_software_version="1")
    return m.ApiVersionsRequest()


class RawClient:
    """One TCP connection speaking hand-built Kafka frames."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=IO_TIMEOUT)
        self.sock.settimeout(IO_TIMEOUT)
        self._corr = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_corr(self) -> int:
        self._corr += 1
        return self._corr

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise EOFError(f"connection closed after {len(out)} of {n} bytes")
            out += chunk
        return bytes(out)

    def read_response(self, api_key: int, version: int, correlation_id: int):
        (size,) = struct.unpack(">i", self._recv_exact(4))
        data = self._recv_exact(size)
        (corr,) = struct.unpack_from(">i", data)
        assert corr == correlation_id, f"response to {corr}, expected {correlation_id}"
        pos = 4
        cls = codec.response_class(api_key, version)
        if api_key != 18 and cls.__flexible__:
            assert data[4] == 0, "flexible response header must carry empty tagged fields"
            pos += 1
        obj, _ = kio.serial.entity_reader(cls)(data, pos)
        return obj

    def call(self, api_key: int, version: int, body):
        corr = self.next_corr()
        self.send(frame(api_key, version, corr, body))
        return self.read_response(api_key, version, corr)

    def produce(self, topics: dict[str, dict[int, bytes | None]], acks: int = -1):
        """{topic: {partition: records}} -> {(topic, partition): (error code, base offset)}."""
        resp = self.call(0, PRODUCE_V, produce_body(topics, acks))
        return {
            (t.name, p.index): (int(p.error_code), p.base_offset)
            for t in resp.responses
            for p in t.partition_responses
        }

    def wait_closed(self, within: float = 3.0) -> float:
        """Seconds until the broker closed this connection; fails if it stays open."""
        start = time.monotonic()
        self.sock.settimeout(within)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                raise AssertionError(f"broker answered {data[:40]!r} instead of closing")
        except (ConnectionResetError, BrokenPipeError):
            pass
        except TimeoutError:
            raise AssertionError(f"connection still open after {within} s") from None
        finally:
            self.sock.settimeout(IO_TIMEOUT)
        return time.monotonic() - start

    def assert_alive(self) -> None:
        """This connection still gets answers (an ApiVersions round trip)."""
        resp = self.call(18, 3, api_versions_body(3))
        assert int(resp.error_code) == NONE


def now_ms() -> int:
    return int(time.time() * 1000)


def batch(n: int = 1, value: bytes = b"v", key: bytes = b"k") -> bytes:
    t = now_ms()
    return build_batch([(key, value + b"-%d" % i, t) for i in range(n)])


def recompute_crc(b: bytearray) -> None:
    struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))


def values_in(bootstrap: str, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
    """Every (offset, value) in one partition, read with confluent-kafka."""
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "verify", "enable.auto.commit": False}
    )
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        c.assign([TopicPartition(topic, partition, lo)])
        rows: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 20
        while len(rows) < hi - lo and time.monotonic() < deadline:
            for m in c.consume(1000, 0.2):
                assert m.error() is None, m.error()
                rows.append((m.offset(), m.value()))
        assert len(rows) == hi - lo, f"read {len(rows)} of {hi - lo} records"
        return rows
    finally:
        c.close()


@pytest.fixture(scope="module")
def topic_counter():
    n = [0]

    def make(prefix: str) -> str:
        n[0] += 1
        return f"{prefix}-{n[0]}"

    return make


# -- framing: truncated, absurd and oversized requests ------------------------------------------
def _valid_produce_payload(topic: str, corr: int) -> bytes:
    body = encode_body(0, PRODUCE_V, produce_body({topic: {0: batch(3, b"x" * 50)}}))
    return request_payload(0, PRODUCE_V, corr, body)


@pytest.mark.parametrize("cut", [1, 7, 20, 45, 90, "header-only", "half-header"])
def test_truncated_request_body_closes_only_that_connection(shared_broker, topic_counter, cut):
    topic = topic_counter("trunc")
    create_topic(shared_broker.bootstrap, topic)
    with RawClient(shared_broker.bootstrap) as bystander, RawClient(shared_broker.bootstrap) as bad:
        bystander.assert_alive()
        bad.assert_alive()
        payload = _valid_produce_payload(topic, 99)
        if cut == "header-only":
            cut_payload = payload[:8]  # api key, version, correlation id; no client id length
        elif cut == "half-header":
            cut_payload = struct.pack(">hh", 0, PRODUCE_V)
        else:
            cut_payload = payload[: len(payload) - cut]
        # The length prefix is honest about the (short) frame: the body itself is cut short.
        bad.send(with_prefix(cut_payload))
        assert bad.wait_closed() < 3
        bystander.assert_alive()
        # Nothing of the cut request was appended.
        assert shared_broker.core.partition(topic, 0).next_offset == 0
        assert bystander.produce({topic: {0: batch(2)}}) == {(topic, 0): (NONE, 0)}


def test_client_id_longer_than_the_frame_closes_the_connection(shared_broker):
    with RawClient(shared_broker.bootstrap) as bad:
        payload = struct.pack(">hhih", 18, 3, 1, 500) + b"short"
        bad.send(with_prefix(payload))
        bad.wait_closed()


def test_partial_frame_waits_and_never_blocks_other_clients(shared_broker, topic_counter):
    """A frame whose prefix promises more than was sent is not processed; others carry on."""
    topic = topic_counter("partial")
    create_topic(shared_broker.bootstrap, topic)
    with RawClient(shared_broker.bootstrap) as slow, RawClient(shared_broker.bootstrap) as other:
        payload = _valid_produce_payload(topic, 5)
        slow.send(struct.pack(">i", len(payload)) + payload[:-10])
        assert other.produce({topic: {0: batch(1)}}) == {(topic, 0): (NONE, 0)}
        # The rest arrives: now the request is complete and is answered.
        slow.send(payload[-10:])
        resp = slow.read_response(0, PRODUCE_V, 5)
        p = resp.responses[0].partition_responses[0]
        assert (int(p.error_code), p.base_offset) == (NONE, 1)


@pytest.mark.parametrize("size", [2**31 - 1, -1, -(2**31), 100 * 1024 * 1024 + 1])
def test_absurd_length_prefix_is_refused_before_any_body(shared_broker, size):
    with RawClient(shared_broker.bootstrap) as bystander, RawClient(shared_broker.bootstrap) as bad:
        bystander.assert_alive()
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            # Only the 4-byte prefix is sent: the broker can only decide from it, and must not
            # wait for (or reserve room for) a body that size.
            bad.send(struct.pack(">i", size))
            elapsed = bad.wait_closed(within=3)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert elapsed < 2, f"closing took {elapsed:.2f} s"
        assert peak < 32 * 1024 * 1024, f"{peak} bytes allocated while refusing the request"
        bystander.assert_alive()


def test_stream_of_bytes_after_an_absurd_prefix_is_cut_off(shared_broker):
    """A client that keeps streaming a 2 GiB 'request' is cut off, not buffered."""
    with RawClient(shared_broker.bootstrap) as bad:
        chunk = b"\xab" * (1024 * 1024)
        sent = 0
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            bad.send(struct.pack(">i", 2**31 - 1))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                bad.send(chunk)
                sent += len(chunk)
        assert sent < 64 * 1024 * 1024, f"{sent} bytes were accepted before the broker hung up"


def _produce_payload_of_size(topic: str, corr: int, size: int) -> bytes:
    """A valid Produce payload (header + body) of exactly ``size`` bytes."""
    for n in range(size, 0, -1):
        body = encode_body(0, PRODUCE_V, produce_body({topic: {0: batch(1, b"p" * n)}}))
        payload = request_payload(0, PRODUCE_V, corr, body)
        if len(payload) == size:
            return payload
        if len(payload) < size:
            break
    raise AssertionError(f"no produce payload of exactly {size} bytes")


def test_small_max_request_bytes_is_enforced_at_the_boundary(tmp_path):
    with Broker(tmp_path / "data", config={"max_request_bytes": 1024}) as b:
        create_topic(b.bootstrap, "small")
        with RawClient(b.bootstrap) as ok:
            ok.send(with_prefix(_produce_payload_of_size("small", 1, 1024)))
            resp = ok.read_response(0, PRODUCE_V, 1)
            p = resp.responses[0].partition_responses[0]
            assert (int(p.error_code), p.base_offset) == (NONE, 0)
        with RawClient(b.bootstrap) as over:
            over.send(with_prefix(_produce_payload_of_size("small", 2, 1025)))
            over.wait_closed()
        with RawClient(b.bootstrap) as big:
            payload = _produce_payload_of_size("small", 3, 2048)
            big.send(struct.pack(">i", len(payload)))  # the prefix alone is enough to refuse
            assert big.wait_closed() < 2
        with RawClient(b.bootstrap) as after:
            after.assert_alive()
            assert after.produce({"small": {0: batch(1)}}) == {("small", 0): (NONE, 1)}
        assert b.core.partition("small", 0).next_offset == 2


# -- unknown APIs and versions -------------------------------------------------------------------
@pytest.mark.parametrize(
    "api_key, version",
    [
        (9999, 0),  # no such API
        (-1, 0),
        (4, 0),  # LeaderAndIsr: a real (inter-broker) Kafka API that Stratalog does not offer
        (0, 99),  # Produce at a version nobody has
        (0, 2),  # Produce below the supported minimum
        (3, 13),  # Metadata one past the maximum
    ],
)
def test_unsupported_api_or_version_closes_the_connection(shared_broker, api_key, version):
    with RawClient(shared_broker.bootstrap) as bystander, RawClient(shared_broker.bootstrap) as bad:
        bad.assert_alive()
        bad.send(with_prefix(request_payload(api_key, version, 7, b"\x00" * 16)))
        bad.wait_closed()
        bystander.assert_alive()


@pytest.mark.parametrize("version", [99, 5, 32767])
def test_api_versions_unsupported_version_answers_in_v0_with_error_35(shared_broker, version):
    with RawClient(shared_broker.bootstrap) as c:
        # A future client's ApiVersions: flexible header and a body we cannot know.
        payload = struct.pack(">hhih", 18, version, 42, 3) + b"raw" + b"\x00" + b"\x01\x02\x03"
        c.send(with_prefix(payload))
        resp = c.read_response(18, 0, 42)
        assert int(resp.error_code) == UNSUPPORTED_VERSION
        ranges = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        assert ranges == advertised()
        assert ranges[18] == (0, 4)
        # The client may now retry with a version we know, on the same connection.
        c.assert_alive()


# -- Produce: record batch validation ------------------------------------------------------------
@pytest.fixture(scope="module")
def produce_topic(shared_broker):
    create_topic(shared_broker.bootstrap, "bad-produce", 2, **{"max.message.bytes": "4096"})
    return "bad-produce"


class OffsetTracker:
    """Checks that a bad request appends nothing: the next good produce continues densely."""

    def __init__(self, client: RawClient, topic: str) -> None:
        self.client = client
        self.topic = topic
        self.next = {0: None, 1: None}

    def good(self, partition: int = 0, n: int = 2) -> None:
        res = self.client.produce({self.topic: {partition: batch(n)}})
        err, base = res[(self.topic, partition)]
        assert err == NONE
        if self.next[partition] is not None:
            assert base == self.next[partition], "a rejected request left records behind"
        self.next[partition] = base + n


@pytest.fixture
def tracked(shared_broker, produce_topic):
    with RawClient(shared_broker.bootstrap) as c:
        t = OffsetTracker(c, produce_topic)
        t.good(0)
        t.good(1)
        yield t
        # The same connection is still usable after every error, and nothing was appended.
        t.good(0)
        t.good(1)


def _flip(b: bytes, pos: int) -> bytes:
    m = bytearray(b)
    m[pos] ^= 0x5A
    return bytes(m)


@pytest.mark.parametrize(
    "where", ["last payload byte", "first record byte", "crc field", "attributes", "max timestamp"]
)
def test_corrupt_crc_is_corrupt_message(tracked, where):
    good = batch(3, b"y" * 40)
    pos = {
        "last payload byte": len(good) - 1,
        "first record byte": 61,
        "crc field": 18,
        "attributes": 22,
        "max timestamp": 40,
    }[where]
    res = tracked.client.produce({tracked.topic: {0: _flip(good, pos)}})
    assert res == {(tracked.topic, 0): (CORRUPT_MESSAGE, -1)}


@pytest.mark.parametrize("delta", [1, 3, 0, -1, 1000])
def test_last_offset_delta_mismatch_is_invalid_record(tracked, delta):
    b = bytearray(batch(3))  # recordCount 3, lastOffsetDelta 2
    struct.pack_into(">i", b, 23, delta)
    recompute_crc(b)  # only the delta is wrong, the CRC is right
    res = tracked.client.produce({tracked.topic: {0: bytes(b)}})
    assert res == {(tracked.topic, 0): (INVALID_RECORD, -1)}


def test_batch_length_past_the_records_is_invalid_record(tracked):
    # Kafka 4.4 answers a truncated batch with INVALID_RECORD (tests/conformance agree).
    b = batch(2)
    res = tracked.client.produce({tracked.topic: {0: b[:-5]}})
    assert res == {(tracked.topic, 0): (INVALID_RECORD, -1)}


def test_one_bad_batch_rejects_the_whole_partition_append(tracked):
    good = batch(2)
    bad = _flip(batch(2), 70)
    res = tracked.client.produce({tracked.topic: {0: good + bad}})
    assert res == {(tracked.topic, 0): (CORRUPT_MESSAGE, -1)}


def test_bad_partition_does_not_fail_the_good_one(tracked):
    n0 = tracked.next[0]
    res = tracked.client.produce({tracked.topic: {0: batch(2), 1: _flip(batch(2), 70)}})
    assert res == {(tracked.topic, 0): (NONE, n0), (tracked.topic, 1): (CORRUPT_MESSAGE, -1)}
    tracked.next[0] = n0 + 2


def test_batch_over_topic_max_message_bytes_is_message_too_large(tracked):
    big = batch(1, b"z" * 5000)
    assert len(big) > 4096
    res = tracked.client.produce({tracked.topic: {0: big}})
    assert res == {(tracked.topic, 0): (MESSAGE_TOO_LARGE, -1)}
    just_fits = batch(1, b"z" * 3900)
    assert len(just_fits) <= 4096
    n0 = tracked.next[0]
    assert tracked.client.produce({tracked.topic: {0: just_fits}}) == {(tracked.topic, 0): (0, n0)}
    tracked.next[0] = n0 + 1


def test_batch_over_broker_message_max_bytes_is_message_too_large(shared_broker, topic_counter):
    topic = topic_counter("default-max")
    create_topic(shared_broker.bootstrap, topic)
    big = batch(1, b"z" * 1_100_000)
    assert len(big) > 1048588
    with RawClient(shared_broker.bootstrap) as c:
        assert c.produce({topic: {0: big}}) == {(topic, 0): (MESSAGE_TOO_LARGE, -1)}
        assert c.produce({topic: {0: batch(1)}}) == {(topic, 0): (NONE, 0)}


def test_produce_to_missing_topic_or_partition(tracked):
    res = tracked.client.produce({"no-such-topic": {0: batch(1)}, tracked.topic: {7: batch(1)}})
    assert res == {
        ("no-such-topic", 0): (UNKNOWN_TOPIC_OR_PARTITION, -1),
        (tracked.topic, 7): (UNKNOWN_TOPIC_OR_PARTITION, -1),
    }


@pytest.mark.parametrize("acks", [5, 2, -2, 32767])
def test_produce_with_invalid_acks(tracked, acks):
    res = tracked.client.produce({tracked.topic: {0: batch(1), 1: batch(1)}}, acks=acks)
    assert res == {
        (tracked.topic, 0): (INVALID_REQUIRED_ACKS, -1),
        (tracked.topic, 1): (INVALID_REQUIRED_ACKS, -1),
    }


def test_rejected_batches_are_not_served(shared_broker, produce_topic, tracked):
    # The values in the log are exactly those of the good produces (tracked fixture + earlier).
    for p in (0, 1):
        rows = values_in(shared_broker.bootstrap, produce_topic, p)
        offsets = [o for o, _ in rows]
        assert offsets == list(range(len(offsets)))
        assert len(rows) == tracked.next[p]
        assert all(not v.startswith(b"y" * 10) for _, v in rows)  # the corrupted 'y' batches


# -- CreateTopics: names -------------------------------------------------------------------------
def test_invalid_topic_names_are_invalid_topic_exception(shared_broker):
    bad = ["bad name", "..", ".", "x" * 250, "", "a/b", "tab\there", "ümlaut"]
    good = ["ok-name_1.x", "y" * 249]
    with RawClient(shared_broker.bootstrap) as c:
        resp = c.call(19, CREATE_TOPICS_V, create_topics_body(bad + good))
        errors = {t.name: int(t.error_code) for t in resp.topics}
        assert errors == {**dict.fromkeys(bad, INVALID_TOPIC_EXCEPTION), **dict.fromkeys(good, 0)}
        md = c.call(3, METADATA_V, metadata_body(good))
        assert {t.name: int(t.error_code) for t in md.topics} == dict.fromkeys(good, 0)
    topics = set(shared_broker.core.metadata.topics)
    assert not topics & set(bad)
    assert set(good) <= topics


# -- other clients are unaffected, nothing acknowledged is lost ----------------------------------
def _garbage_frames(topic: str) -> list[tuple[str, bytes, bool]]:
    """(name, bytes, closes) for every kind of garbage; closes=False means an error response."""
    good_payload = _valid_produce_payload(topic, 1)
    crc_bad = _flip(batch(3), 70)
    delta_bad = bytearray(batch(3))
    struct.pack_into(">i", delta_bad, 23, 7)
    recompute_crc(delta_bad)
    return [
        ("truncated body", with_prefix(good_payload[:-20]), True),
        ("header only", with_prefix(good_payload[:6]), True),
        ("prefix 2^31-1", struct.pack(">i", 2**31 - 1) + b"\x00" * 1000, True),
        ("negative prefix", struct.pack(">i", -5) + b"\x00" * 100, True),
        ("unknown api", with_prefix(request_payload(4242, 0, 1, b"\x00" * 32)), True),
        ("unknown version", with_prefix(request_payload(0, 99, 1, b"\x00" * 32)), True),
        ("random bytes", with_prefix(bytes(range(256)) * 4), True),
        ("crc", frame(0, PRODUCE_V, 1, produce_body({topic: {0: crc_bad}})), False),
        ("delta", frame(0, PRODUCE_V, 1, produce_body({topic: {0: bytes(delta_bad)}})), False),
        ("acks", frame(0, PRODUCE_V, 1, produce_body({topic: {0: batch(1)}}, acks=5)), False),
        ("missing", frame(0, PRODUCE_V, 1, produce_body({"nope-x": {0: batch(1)}})), False),
        ("names", frame(19, CREATE_TOPICS_V, 1, create_topics_body(["bad name"])), False),
    ]


def test_garbage_leaves_other_clients_and_acknowledged_records_alone(broker):
    topic = "steady"
    create_topic(broker.bootstrap, topic, 2)
    acked: dict[bytes, tuple[int, int]] = {}
    errors: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(err.str())
        else:
            acked[msg.value()] = (msg.partition(), msg.offset())

    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 1})
    for i in range(300):
        producer.produce(topic, value=b"before-%d" % i, partition=i % 2, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    before = dict(acked)
    assert len(before) == 300

    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "steady", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    seen: dict[bytes, tuple[int, int]] = {}

    def drain(until: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(seen) < until and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.2):
                assert m.error() is None, m.error()
                assert m.value() not in seen, "a record was delivered twice"
                seen[m.value()] = (m.partition(), m.offset())

    try:
        drain(300)
        assert seen == before
        bystander = RawClient(broker.bootstrap)
        bystander.assert_alive()

        # Garbage on fresh connections while the producer keeps writing.
        failures: list[str] = []

        def send_garbage() -> None:
            for _round in range(3):
                for name, data, closes in _garbage_frames(topic):
                    try:
                        with RawClient(broker.bootstrap) as g:
                            try:
                                g.send(data)
                            except (BrokenPipeError, ConnectionResetError):
                                if not closes:
                                    failures.append(f"{name}: closed instead of answered")
                                continue
                            if closes:
                                g.wait_closed()
                            else:
                                (size,) = struct.unpack(">i", g._recv_exact(4))
                                g._recv_exact(size)
                    except AssertionError as e:
                        failures.append(f"{name}: {e}")

        t = threading.Thread(target=send_garbage)
        t.start()
        i = 0
        while t.is_alive() or i < 300:
            producer.produce(
                topic, value=b"during-%d" % i, partition=i % 2, on_delivery=on_delivery
            )
            producer.poll(0)
            i += 1
            time.sleep(0.001)
        t.join(timeout=60)
        assert not failures, failures
        assert producer.flush(30) == 0
        assert not errors, errors[:3]

        # The idle bystander's connection survived, and answers on it still work.
        md = bystander.call(3, METADATA_V, metadata_body([topic]))
        assert int(md.topics[0].error_code) == 0
        assert len(md.topics[0].partitions) == 2
        bystander.close()

        # A new producer works too; the old consumer, on its old connections, sees everything.
        p2 = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
        for j in range(50):
            p2.produce(topic, value=b"after-%d" % j, partition=j % 2, on_delivery=on_delivery)
        assert p2.flush(30) == 0
        assert not errors, errors[:3]
        drain(len(acked))
        assert seen == acked, "consumed records differ from acknowledged ones"
        for p in (0, 1):
            offsets = sorted(o for part, o in acked.values() if part == p)
            assert offsets == list(range(len(offsets))), f"offsets of partition {p} not dense"
        assert all(before[v] == acked[v] for v in before)
    finally:
        consumer.close()


def test_stored_batches_are_exactly_what_was_acknowledged(broker):
    """Down to the bytes: a good batch sent by hand comes back from storage identical."""
    create_topic(broker.bootstrap, "exact")
    sent = batch(4, b"exact")
    with RawClient(broker.bootstrap) as c:
        assert c.produce({"exact": {0: _flip(sent, 70)}}) == {("exact", 0): (CORRUPT_MESSAGE, -1)}
        assert c.produce({"exact": {0: sent}}) == {("exact", 0): (NONE, 0)}
    rows = values_in(broker.bootstrap, "exact")
    assert [v for _, v in rows] == [r.value for r in iter_records(sent)]


# -- the CLI: one line, no traceback --------------------------------------------------------------
CLI = [sys.executable, "-m", "stratalog.cli"]


def run_cli(args: list[str], stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
    # subprocess.run kills the child by PID if it outlives the timeout.
    return subprocess.run(
        CLI + args,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parent.parent,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode != 0, f"exit code 0; stdout {proc.stdout!r}"
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"{len(lines)} lines on stderr:\n" + "\n".join(lines[:10])
    line = lines[0]
    assert line.startswith("error:"), line
    for n in needles:
        assert n in line, f"{n!r} not in {line!r}"
    return line


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_cli_produce_to_missing_topic(shared_broker):
    proc = run_cli(["produce", "no-such-cli-topic", "-b", shared_broker.bootstrap], "hello\n")
    assert_one_line_error(proc, "no-such-cli-topic", "does not exist")


@pytest.mark.parametrize(
    "setting, needle",
    [
        ("no.such.setting=1", "unknown setting 'no.such.setting'"),
        ("segment.bytes=lots", "'segment.bytes' must be int"),
        ("auto.create.topics.enable=maybe", "must be bool"),
        ("fsync=sometimes", "fsync must be"),
        ("segment.bytes", "not of the form key=value"),
    ],
)
def test_cli_serve_with_bad_setting(tmp_path, setting, needle):
    data = tmp_path / "data"
    proc = run_cli(["serve", "--data-dir", str(data), "--port", "0", "--set", setting])
    assert_one_line_error(proc, needle)
    assert "ready at" not in proc.stdout


def test_cli_serve_with_missing_config_file(tmp_path):
    missing = tmp_path / "nope.toml"
    proc = run_cli(["serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "-c", str(missing)])
    assert_one_line_error(proc, str(missing), "does not exist")


def test_cli_serve_with_invalid_toml(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("fsync = [unclosed\n")
    proc = run_cli(["serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "-c", str(cfg)])
    assert_one_line_error(proc, "not valid TOML")


def test_cli_unreachable_bootstrap(tmp_path):
    port = closed_port()
    start = time.monotonic()
    proc = run_cli(["produce", "t", "-b", f"127.0.0.1:{port}"], "hello\n", timeout=60)
    assert time.monotonic() - start < 45
    assert_one_line_error(proc, f"127.0.0.1:{port}")


def test_cli_usage_error_has_no_traceback():
    proc = run_cli(["produce", "t", "-b"])  # -b without its value
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "-b" in proc.stderr
