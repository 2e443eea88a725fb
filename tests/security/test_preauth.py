"""Before authentication: a fuzz of frames, oversized and malformed SASL frames, and a flood of
failed logins. Each bad connection is closed, nothing is allocated beyond a small bound (the
size prefix is checked against ``sasl.server.max.receive.size`` before anything is read), and
a client that logged in keeps being served throughout.

One broker for the module (SASL_PLAINTEXT and SASL_SSL with PLAIN and SCRAM, and PLAINTEXT
for set-up); a SASL_SSL producer sends throughout the module and must lose nothing.
"""

from __future__ import annotations

import gc
import struct
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratalog import Broker
from stratalog.broker import metrics

from ..conftest import create_topic
from .clients import Security
from .conftest import PLAIN_USERS, SCRAM_USERS, add_scram_users, secure_config
from .wire import Closed, Conn

LIMIT = 524288  # sasl.server.max.receive.size (Kafka's default)
MARK = 0x5EC  # correlation id of the Metadata request that must never be answered


class Bystander:
    """A SASL_SSL producer sending a record every 20 ms from its own thread."""

    def __init__(self, bootstrap: str, topic: str, sec: Security) -> None:
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, **sec.librdkafka()})
        self.topic = topic
        self.sent = self.acked = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _done(self, err, _msg) -> None:
        if err is None:
            self.acked += 1
        else:
            self.errors.append(str(err))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.producer.produce(self.topic, b"still-served", on_delivery=self._done)
            self.sent += 1
            self.producer.poll(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        assert self.producer.flush(30) == 0


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path], plain_users_file: Path
) -> Iterator[Broker]:
    with Broker(
        tmp_path_factory.mktemp("preauth") / "data", config=secure_config(certs, plain_users_file)
    ) as b:
        add_scram_users(b.bootstrap)
        topic = f"bystander-{uuid.uuid4().hex[:8]}"
        create_topic(b.bootstrap, topic)
        user, password = SCRAM_USERS["SCRAM-SHA-256"]
        sec = Security("SASL_SSL", certs["ca.pem"], mechanism="SCRAM-SHA-256", user=user,
                       password=password)  # fmt: skip
        bystander = Bystander(b.bootstraps["SASL_SSL"], topic, sec)
        yield b
        bystander.stop()
        assert bystander.errors == [] and bystander.acked == bystander.sent > 0


@pytest.fixture
def logged_in(broker: Broker) -> Iterator[Conn]:
    """A client that authenticated before the test and must still be served after it."""
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        assert c.login("PLAIN", "alice", PLAIN_USERS["alice"])["error_code"] == 0
        yield c
        assert len(c.metadata()["brokers"]) == 1


def _prefixed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


@pytest.mark.parametrize("size", [LIMIT + 1, 100 * 1024 * 1024, 2**31 - 1, -1])
def test_oversized_prefix_closes_before_anything_is_read(broker, logged_in, size):
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as bad:
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            t0 = time.monotonic()
            bad.send_raw(struct.pack(">i", size))  # the prefix alone decides
            assert bad.is_closed(timeout=3)
            elapsed = time.monotonic() - t0
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert elapsed < 2
    assert peak < 2 * 1024 * 1024, f"{peak} bytes allocated while refusing a {size}-byte frame"


def test_a_frame_at_the_limit_is_read_and_refused(broker, logged_in):
    """A SaslHandshake padded to exactly the limit is read (and, as garbage past its mechanism,
    still only a handshake): the limit is inclusive, as Kafka's."""
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        frame = c.frame(17, 1, mechanism="X")
        payload = frame[4:] + b"\0" * (LIMIT - len(frame) + 4)
        c.send_raw(_prefixed(payload))
        out = c.read_frame()  # answered: UNSUPPORTED_SASL_MECHANISM, then closed
        assert struct.unpack_from(">h", out, 4)[0] == 33
        assert c.is_closed()


def test_a_stream_after_an_oversized_prefix_is_cut_off(broker, logged_in):
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as bad:
        chunk = b"\xab" * (256 * 1024)
        sent = 0
        with pytest.raises((BrokenPipeError, ConnectionResetError, TimeoutError)):
            bad.send_raw(struct.pack(">i", LIMIT + 1))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                bad.send_raw(chunk)
                sent += len(chunk)
        assert sent < 32 * 1024 * 1024


def test_plaintext_bytes_on_a_tls_listener_are_closed(broker, logged_in):
    with Conn(broker.bootstraps["SASL_SSL"]) as bad:
        bad.send_raw(bad.frame(18, 0))
        assert bad.is_closed()


# A frame: a request header (an API key the pre-authentication state knows, or any) with a
# random body, or bytes with no header at all.
_KEYS = st.sampled_from([17, 36, 18, 3, 0, 1, 50, 51, -1, 999])
_frames = st.one_of(
    st.tuples(_KEYS, st.integers(-2, 20), st.integers(-(2**31), 2**31 - 1),
              st.binary(max_size=2048)).map(
        lambda t: struct.pack(">hhih", t[0], t[1], t[2], -1) + t[3]
    ),
    st.binary(max_size=64),
)  # fmt: skip


def _metadata_marker(c: Conn) -> bytes:
    from ..conformance import wire

    body = wire.build(3, 12, topics=None, allow_auto_topic_creation=False,
                      include_topic_authorized_operations=False)  # fmt: skip
    return wire.request_frame(3, 12, body, MARK)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(_frames, min_size=1, max_size=4), handshake=st.booleans())
def test_fuzz_before_authentication(broker, frames, handshake):
    """Whatever comes before authentication, a Metadata request after it is never answered:
    the connection is closed instead (answers to ApiVersions or SaslHandshake may come first)."""
    with Conn(broker.bootstraps["SASL_PLAINTEXT"], timeout=5) as c:
        data = c.frame(17, 1, mechanism="SCRAM-SHA-256") if handshake else b""
        data += b"".join(_prefixed(f) for f in frames) + _metadata_marker(c)
        try:
            c.send_raw(data)
        except (BrokenPipeError, ConnectionResetError):
            return  # closed already
        while True:
            try:
                frame = c.read_frame()
            except Closed:
                return
            except TimeoutError:
                raise AssertionError("the connection stayed open after a request") from None
            assert struct.unpack_from(">i", frame)[0] != MARK, "Metadata answered before login"


def test_failed_logins_leave_memory_flat(broker, logged_in):
    """2,000 failed attempts (wrong PLAIN password, unknown SCRAM user, a request before
    login): the broker keeps no memory for them, and logged-in clients are served."""
    failed = metrics.SASL_AUTHENTICATIONS.labels("failed")
    before = failed._value.get()
    bs = broker.bootstraps["SASL_PLAINTEXT"]

    def attempts(n: int) -> None:
        for i in range(n):
            with Conn(bs) as c:
                if i % 3 == 0:
                    out = c.login("PLAIN", "alice", f"wrong-{i}")
                elif i % 3 == 1:
                    out = c.login("SCRAM-SHA-512", f"nobody-{i}", "x")
                else:
                    c.send_raw(_metadata_marker(c))
                    out = {"error_code": -1}
                assert out["error_code"] != 0
                assert c.is_closed()

    attempts(200)  # warm up: caches, pools
    gc.collect()
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        attempts(2000)
        gc.collect()
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert end - start < 1024 * 1024, f"{end - start} bytes kept after 2,000 failed logins"
    assert failed._value.get() - before >= 2200
    assert broker.call(lambda: sum(len(s.connections) for s in broker.service.servers)) < 20
