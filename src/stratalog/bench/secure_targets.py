"""Targets with secured listeners (issue 29's SASL_SSL and failed-login workloads).

``stratalog-secure`` is ``stratalog serve`` with three listeners, PLAINTEXT, SASL_PLAINTEXT and
SASL_SSL (certificates from :func:`stratalog.security.certs.make_test_certificates`, PLAIN users
in a JAAS file, a SCRAM-SHA-256 user created through AlterUserScramCredentials);
``kafka-secure`` is Apache Kafka with the same listeners, its keystore and truststore the same
PEM files. The broker's configuration is the same whichever listener the load uses: the
target's ``listener`` setting (PLAINTEXT, SASL_PLAINTEXT or SASL_SSL) only chooses where the
load clients connect, so plaintext and SASL_SSL compare on one broker configuration. Topics are
created and counted over the PLAINTEXT listener.

Settings: ``listener`` (default SASL_SSL), ``mechanism`` (the load clients' SASL mechanism,
default SCRAM-SHA-256); every other setting goes to the broker as for ``stratalog`` / ``kafka``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from stratalog.bench.clients import ClientFactory, KafkaClientFactory
from stratalog.bench.targets import KafkaTarget, StratalogTarget, TargetUnavailable, register
from stratalog.bench.workload import TargetSpec, Workload
from stratalog.loopback import free_port

LISTENERS = ("PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL")
SCRAM_USER, SCRAM_PASSWORD = "bench", "bench-secret"
PLAIN_USER, PLAIN_PASSWORD = "bench-plain", "bench-plain-secret"


def _jaas_plain() -> str:
    return (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'user_{PLAIN_USER}="{PLAIN_PASSWORD}";'
    )


@dataclass
class Credentials:
    """What a load client needs to log in on one listener of a secure target."""

    address: str
    listener: str
    mechanism: str
    ca: str

    def user(self) -> tuple[str, str]:
        if self.mechanism == "PLAIN":
            return PLAIN_USER, PLAIN_PASSWORD
        return SCRAM_USER, SCRAM_PASSWORD

    def librdkafka(self, password: str | None = None) -> dict[str, str]:
        """confluent-kafka settings for this listener (another ``password``: a wrong login)."""
        if self.listener == "PLAINTEXT":
            return {}
        user, good = self.user()
        out = {
            "security.protocol": self.listener,
            "sasl.mechanism": self.mechanism,
            "sasl.username": user,
            "sasl.password": good if password is None else password,
        }
        if self.listener == "SASL_SSL":
            # The chain is checked against the test CA; the certificate names 127.0.0.1.
            out |= {"ssl.ca.location": self.ca, "ssl.endpoint.identification.algorithm": "https"}
        return out


def add_scram_user(bootstrap: str, user: str = SCRAM_USER, password: str = SCRAM_PASSWORD) -> None:
    """Create a SCRAM-SHA-256 user as Kafka's admin client does (AlterUserScramCredentials)."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(user, info, password.encode())]
    )
    for f in futures.values():
        f.result(30)


def wait_login(creds: Credentials, timeout: float = 60) -> None:
    """Until a client logs in on the listener (Kafka applies a new SCRAM user a moment after
    AlterUserScramCredentials returns)."""
    from confluent_kafka import KafkaException, Producer

    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        p = Producer({"bootstrap.servers": creds.address, "log_level": 0, **creds.librdkafka()})
        try:
            p.list_topics(timeout=5)
            return
        except KafkaException as e:
            last = str(e)
            time.sleep(0.5)
    raise RuntimeError(
        f"no login on {creds.listener} {creds.address} within {timeout:.0f}s: {last}"
    )


class _Secure:
    """The part both secure targets share: certificates, listener choice, client settings.
    First in a target's bases: its methods wrap the broker target's."""

    spec: TargetSpec
    bootstrap: str

    def __init__(self, spec: TargetSpec, workload: Workload) -> None:
        settings = dict(spec.settings)
        self.listener = str(settings.pop("listener", "SASL_SSL")).upper()
        self.mechanism = str(settings.pop("mechanism", "SCRAM-SHA-256")).upper()
        if self.listener not in LISTENERS:
            raise TargetUnavailable(f"listener must be one of {', '.join(LISTENERS)}")
        self.ports: dict[str, int] = {}
        self.certdir: Path | None = None
        self.certs: dict[str, Path] = {}
        # The broker target sees the settings without listener and mechanism.
        inner = TargetSpec(spec.name, spec.kind, settings, spec.topic_config)
        super().__init__(inner, workload)  # type: ignore[call-arg]
        self.spec = spec

    def describe(self) -> str:
        what = self.listener
        if what != "PLAINTEXT":
            what += f" {self.mechanism}"
        base = super().describe()  # type: ignore[misc]
        return f"{base}; clients over {what}, broker with PLAINTEXT, SASL_PLAINTEXT, SASL_SSL"

    def stop(self) -> None:
        super().stop()  # type: ignore[misc]
        if self.certdir is not None:
            shutil.rmtree(self.certdir, ignore_errors=True)
            self.certdir = None

    def _logins(self) -> None:
        """After the start: the SCRAM user (over PLAINTEXT), and a login that works."""
        add_scram_user(self.bootstrap)
        wait_login(self.credentials())

    def _make_certs(self) -> None:
        from stratalog.security.certs import make_test_certificates

        self.certdir = Path(tempfile.mkdtemp(prefix="stratalog-bench-certs-"))
        self.certs = make_test_certificates(self.certdir)
        (self.certdir / "plain.jaas").write_text(f"KafkaServer {{\n  {_jaas_plain()}\n}};\n")

    def credentials(self, listener: str | None = None, mechanism: str | None = None) -> Credentials:
        name = listener or self.listener
        return Credentials(
            address=f"127.0.0.1:{self.ports[name]}",
            listener=name,
            mechanism=mechanism or self.mechanism,
            ca=str(self.certs["ca.pem"]),
        )

    def client_factory(self) -> ClientFactory:
        creds = self.credentials()
        cfg = creds.librdkafka()
        return KafkaClientFactory(creds.address, producer_config=cfg, consumer_config=cfg)


@register
class SecureStratalogTarget(_Secure, StratalogTarget):
    kind = "stratalog-secure"

    def start(self) -> None:
        self._make_certs()
        assert self.certdir is not None
        self.ports = {name: free_port() for name in LISTENERS}
        self.settings.update(
            {
                "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in self.ports.items()),
                "ssl.keystore.location": str(self.certs["broker.pem"]),
                "ssl.truststore.location": str(self.certs["ca.pem"]),
                "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
                "sasl.plain.users.file": str(self.certdir / "plain.jaas"),
                # /metrics stays readable by the harness without credentials.
                "admin.auth": "none",
            }
        )
        super().start()
        # Admin requests (topics, users, counts) over the PLAINTEXT listener.
        self.bootstrap = f"127.0.0.1:{self.ports['PLAINTEXT']}"
        self._logins()


@register
class SecureKafkaTarget(_Secure, KafkaTarget):
    kind = "kafka-secure"

    def start(self) -> None:
        self._make_certs()
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        props = {
            "num.network.threads": "3",
            "num.io.threads": "8",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.certs["broker.pem"]),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.certs["ca.pem"]),
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
            **self.props,
        }
        for listener in ("sasl_plaintext", "sasl_ssl"):
            props[f"listener.name.{listener}.plain.sasl.jaas.config"] = _jaas_plain()
            props[f"listener.name.{listener}.scram-sha-256.sasl.jaas.config"] = scram
        self._start_broker(props, {"SASL_PLAINTEXT": "SASL_PLAINTEXT", "SASL_SSL": "SASL_SSL"})
        assert self.broker is not None
        self.ports = {
            name: int(addr.rsplit(":", 1)[1]) for name, addr in self.broker.bootstraps.items()
        }
        self._logins()
