"""Produce and consume with each real client under one security setting, told once and
translated into each client's own configuration names (librdkafka's for kcat and
confluent-kafka, aiokafka's, kafka-python's)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

KCAT = "/usr/bin/kcat"
CLIENTS = ("kcat", "confluent-kafka", "aiokafka", "kafka-python")


@dataclass(frozen=True)
class Security:
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL
    ca: Path | None = None
    cert: Path | None = None  # client certificate (mutual TLS)
    key: Path | None = None
    mechanism: str | None = None
    user: str | None = None
    password: str | None = None

    def librdkafka(self) -> dict[str, str]:
        conf = {"security.protocol": self.protocol.lower()}
        if self.ca:
            conf["ssl.ca.location"] = str(self.ca)
        if self.cert:
            conf["ssl.certificate.location"] = str(self.cert)
            conf["ssl.key.location"] = str(self.key)
        if self.mechanism:
            conf.update(
                {
                    "sasl.mechanism": self.mechanism,
                    "sasl.username": self.user or "",
                    "sasl.password": self.password or "",
                }
            )
        return conf

    def aiokafka(self) -> dict:
        from aiokafka.helpers import create_ssl_context

        conf: dict = {"security_protocol": self.protocol}
        if self.ca:
            conf["ssl_context"] = create_ssl_context(
                cafile=str(self.ca),
                certfile=str(self.cert) if self.cert else None,
                keyfile=str(self.key) if self.key else None,
            )
        if self.mechanism:
            conf.update(
                sasl_mechanism=self.mechanism,
                sasl_plain_username=self.user,
                sasl_plain_password=self.password,
            )
        return conf

    def kafka_python(self) -> dict:
        conf: dict = {"security_protocol": self.protocol}
        if self.ca:
            conf["ssl_cafile"] = str(self.ca)
        if self.cert:
            conf.update(ssl_certfile=str(self.cert), ssl_keyfile=str(self.key))
        if self.mechanism:
            conf.update(
                sasl_mechanism=self.mechanism,
                sasl_plain_username=self.user,
                sasl_plain_password=self.password,
            )
        return conf

    def java(self) -> dict[str, str]:
        """Kafka's Java client settings (PEM stores)."""
        conf = {"security.protocol": self.protocol}
        if self.ca:
            conf.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ca)})
        if self.cert:
            # A PEM keystore: the client's key and certificate in one file (client.pem).
            conf.update(
                {
                    "ssl.keystore.type": "PEM",
                    "ssl.keystore.location": str(self.cert.with_suffix(".pem")),
                }
            )
        if self.mechanism:
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if self.mechanism == "PLAIN"
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            conf.update(
                {
                    "sasl.mechanism": self.mechanism,
                    "sasl.jaas.config": f'{module} required username="{self.user}" '
                    f'password="{self.password}";',
                }
            )
        return conf


def roundtrip(client: str, bootstrap: str, topic: str, sec: Security, n: int = 50) -> list[bytes]:
    """Produce ``n`` values to partition 0 of ``topic`` with ``client`` and read back every
    value of the partition from the beginning with the same client."""
    values = [f"{client}-{i}".encode() for i in range(n)]
    if client == "kcat":
        return _kcat(bootstrap, topic, sec, values)
    if client == "confluent-kafka":
        return _confluent(bootstrap, topic, sec, values)
    if client == "aiokafka":
        return asyncio.run(_aiokafka(bootstrap, topic, sec, values))
    if client == "kafka-python":
        return _kafka_python(bootstrap, topic, sec, values)
    raise ValueError(client)


def _kcat_args(sec: Security) -> list[str]:
    return [a for k, v in sec.librdkafka().items() for a in ("-X", f"{k}={v}")]


def _kcat(bootstrap: str, topic: str, sec: Security, values: list[bytes]) -> list[bytes]:
    base = [KCAT, "-b", bootstrap, "-t", topic, *_kcat_args(sec)]
    subprocess.run(
        [*base, "-P", "-p", "0"], input=b"\n".join(values) + b"\n", check=True, timeout=60
    )
    out = subprocess.run(
        [*base, "-C", "-p", "0", "-o", "beginning", "-e", "-q"],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return out.stdout.split(b"\n")[:-1]


def _confluent(bootstrap: str, topic: str, sec: Security, values: list[bytes]) -> list[bytes]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    conf = {"bootstrap.servers": bootstrap, **sec.librdkafka()}
    p = Producer(conf)
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0, "confluent-kafka did not deliver everything"
    c = Consumer({**conf, "group.id": f"sec-{topic}", "enable.partition.eof": True})
    out: list[bytes] = []
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == m.error()._PARTITION_EOF:
                    break
                raise AssertionError(m.error())
            out.append(m.value())
    finally:
        c.close()
    return out


async def _aiokafka(bootstrap: str, topic: str, sec: Security, values: list[bytes]) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, **sec.aiokafka())
    await p.start()
    try:
        for v in values:
            await p.send(topic, v, partition=0)
        await p.flush()
    finally:
        await p.stop()
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **sec.aiokafka())
    await c.start()
    out: list[bytes] = []
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        await c.seek_to_beginning(tp)
        end = (await c.end_offsets([tp]))[tp]
        deadline = time.monotonic() + 30
        while await c.position(tp) < end and time.monotonic() < deadline:
            batch = await c.getmany(tp, timeout_ms=500)
            out += [m.value for m in batch.get(tp, [])]
    finally:
        await c.stop()
    return out


def _kafka_python(bootstrap: str, topic: str, sec: Security, values: list[bytes]) -> list[bytes]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    p = KafkaProducer(bootstrap_servers=bootstrap, **sec.kafka_python())
    try:
        for f in [p.send(topic, v, partition=0) for v in values]:
            f.get(timeout=30)
    finally:
        p.close()
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **sec.kafka_python())
    out: list[bytes] = []
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        end = c.end_offsets([tp])[tp]
        deadline = time.monotonic() + 30
        while c.position(tp) < end and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                out += [r.value for r in recs]
    finally:
        c.close()
    return out
