"""Spark on a secured broker: both of Stratalog's connectors (the JVM one and the Python data
source), sink and source, over SASL_SSL (SCRAM) and over SSL with a client certificate, given
the same `kafka.*` settings as Spark's own Kafka connector, which reads the result as the
reference.

Real certificates (``stratalog certs``' CA), a real broker with those listeners, a real
SparkSession."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stratalog import Broker
from stratalog.security.certs import make_test_certificates

from ..conftest import create_topic
from ..security.conftest import PLAIN_USERS, add_scram_users, jaas_plain

USER, PASSWORD = "spark-user", "spark-secret"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, dict]]:
    certs = make_test_certificates(tmp_path_factory.mktemp("spark-certs"))
    users = tmp_path_factory.mktemp("spark-jaas") / "users.jaas"
    users.write_text(f"KafkaServer {{\n  {jaas_plain(PLAIN_USERS)}\n}};\n")
    config = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "ssl.keystore.location": str(certs["broker.pem"]),
        "ssl.truststore.location": str(certs["ca.pem"]),
        "ssl.client.auth": "required",  # on the SSL listener; SASL_SSL asks for none
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "sasl.plain.users.file": str(users),
    }
    with Broker(tmp_path_factory.mktemp("spark-secured") / "data", config=config) as b:
        add_scram_users(b.bootstrap, {"SCRAM-SHA-512": (USER, PASSWORD)})
        yield b, certs


def _jaas(user: str, password: str) -> str:
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";'
    )


def _options(broker: Broker, certs: dict, listener: str) -> dict[str, str]:
    """The same settings for format("kafka") and format("stratalog-python")."""
    out = {
        "kafka.bootstrap.servers": broker.bootstraps[listener],
        "kafka.security.protocol": listener,
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": str(certs["ca.pem"]),
    }
    if listener == "SASL_SSL":
        out["kafka.sasl.mechanism"] = "SCRAM-SHA-512"
        out["kafka.sasl.jaas.config"] = _jaas(USER, PASSWORD)
    else:
        out["kafka.ssl.keystore.type"] = "PEM"
        out["kafka.ssl.keystore.location"] = str(certs["client.pem"])
    return out


# The Python client's SSL and SASL paths are tested beside the broker
# (tests/security/test_own_clients.py); the JVM connector's only here.
@pytest.mark.parametrize(
    ("listener", "fmt"),
    [("SASL_SSL", "stratalog"), ("SSL", "stratalog"), ("SASL_SSL", "stratalog-python")],
)
def test_source_and_sink_work_on_a_secured_listener(spark, secured, listener, fmt):
    broker, certs = secured
    topic = f"secured-{listener.lower()}-{fmt}"
    opts = _options(broker, certs, listener)
    create_topic(broker.bootstrap, topic, 2)
    rows = [(f"k{i % 3}", f"v{i}") for i in range(30)]
    df = spark.createDataFrame(rows, "key string, value string")
    df.write.format(fmt).options(**opts).option("topic", topic).mode("append").save()

    def read(reader: str) -> list[tuple]:
        got = spark.read.format(reader).options(**opts).option("subscribe", topic).load()
        return sorted(
            (r.key.decode(), r.value.decode(), r.partition, r.offset) for r in got.collect()
        )

    reference = read("kafka")  # Spark's Kafka connector, the Java client's TLS and SASL
    assert sorted((k, v) for k, v, _p, _o in reference) == sorted(rows)
    assert read(fmt) == reference


@pytest.mark.parametrize("fmt", ["stratalog", "stratalog-python"])
def test_settings_that_cannot_work_are_named(spark, secured, fmt):
    broker, certs = secured
    opts = _options(broker, certs, "SASL_SSL")
    cases = [
        ({"kafka.sasl.mechanism": "GSSAPI"}, r"sasl\.mechanism GSSAPI is not offered"),
        ({"kafka.sasl.jaas.config": _jaas(USER, "wrong")}, f"SASL authentication of '{USER}'"),
        ({"kafka.ssl.truststore.location": str(certs["other-ca.pem"])}, "TLS with the broker"),
    ]
    for change, message in cases:
        bad = {**opts, **change}
        with pytest.raises(Exception, match=message):
            spark.read.format(fmt).options(**bad).option("subscribe", "x").load().collect()
