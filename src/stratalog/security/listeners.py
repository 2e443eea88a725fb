"""Kafka's listener settings: which ports a broker opens and what each one speaks.

``listeners = "PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093"`` names each listener and
its address; ``listener.security.protocol.map`` says which security protocol a listener name
means (a name that is itself a protocol needs no entry, as in Kafka's default map);
``advertised.listeners`` gives the addresses clients are told (per listener name, defaulting to
the bound address); ``inter.broker.listener.name`` names the listener brokers use among
themselves. Without ``listeners`` the broker has the one PLAINTEXT listener of ``host`` and
``port`` (and ``advertised.host``/``advertised.port``), as before.

Pure parsing and validation: nothing here opens a socket or reads a file.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, replace
from typing import Any

PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SASL_SSL = "SASL_SSL"
PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)

DEFAULT_PROTOCOL_MAP = ",".join(f"{p}:{p}" for p in PROTOCOLS)

_LISTENER = re.compile(
    r"^(?P<name>[A-Za-z0-9_.-]+)://(?P<host>\[[^\]]*\]|[^:\[\]]*):(?P<port>\d+)$"
)


class ListenerError(ValueError):
    """A listener setting that cannot work; the message names the setting."""


@dataclass(frozen=True)
class Listener:
    """One listener: its name, security protocol, bind address and advertised address."""

    name: str
    protocol: str
    host: str
    port: int  # 0: any free port (the bound one is filled in once listening)
    advertised_host: str
    advertised_port: int  # 0: the bound port

    @property
    def tls(self) -> bool:
        return self.protocol in (SSL, SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self.protocol in (SASL_PLAINTEXT, SASL_SSL)

    @property
    def endpoint(self) -> tuple[str, int]:
        """(host, port) clients are told for this listener."""
        return self.advertised_host or self.host, self.advertised_port or self.port

    def bound(self, port: int) -> Listener:
        return replace(self, port=port)

    def __str__(self) -> str:
        host, port = self.endpoint
        return f"{self.name}://{host}:{port} ({self.protocol})"


def parse_addresses(setting: str, text: str) -> list[tuple[str, str, int]]:
    """``NAME://host:port,...`` -> [(NAME, host, port)]; names are upper-cased as in Kafka."""
    out: list[tuple[str, str, int]] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        m = _LISTENER.match(item)
        if m is None:
            raise ListenerError(
                f"{setting}: {item!r} is not NAME://host:port (e.g. SASL_SSL://127.0.0.1:9093)"
            )
        port = int(m["port"])
        if port > 65535:
            raise ListenerError(f"{setting}: port {port} of {item!r} is past 65535")
        host = m["host"].removeprefix("[").removesuffix("]")
        out.append((m["name"].upper(), host, port))
    return out


def parse_protocol_map(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        name, sep, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name or not protocol:
            raise ListenerError(
                f"listener.security.protocol.map: {item!r} is not LISTENER_NAME:PROTOCOL"
            )
        if protocol not in PROTOCOLS:
            raise ListenerError(
                f"listener.security.protocol.map: unknown security protocol {protocol!r} for "
                f"listener {name} (known: {', '.join(PROTOCOLS)})"
            )
        out[name] = protocol
    return out


def resolve(config: Any) -> list[Listener]:
    """The broker's listeners from its settings (``config[name]``), checked; the first one is
    the inter-broker listener if none is named."""
    text = config["listeners"].strip()
    if not text:
        return [
            Listener(
                PLAINTEXT,
                PLAINTEXT,
                config["host"],
                config["port"],
                config["advertised.host"],
                config["advertised.port"],
            )
        ]
    protocols = parse_protocol_map(config["listener.security.protocol.map"])
    bound = parse_addresses("listeners", text)
    if not bound:
        raise ListenerError("listeners: no listener given")
    names = [n for n, _h, _p in bound]
    for n in names:
        if names.count(n) > 1:
            raise ListenerError(f"listeners: listener name {n} appears twice")
    ports = [p for _n, _h, p in bound if p != 0]
    for p in ports:
        if ports.count(p) > 1:
            raise ListenerError(f"listeners: port {p} is given to two listeners")
    advertised: dict[str, tuple[str, int]] = {}
    for n, h, p in parse_addresses("advertised.listeners", config["advertised.listeners"]):
        if n not in names:
            raise ListenerError(
                f"advertised.listeners: {n} is not one of the listeners ({', '.join(names)})"
            )
        if h in ("", "0.0.0.0", "::"):
            raise ListenerError(
                f"advertised.listeners: {n} advertises {h or 'no host'!r}, which clients cannot "
                "connect to: give the host name or address clients use"
            )
        advertised[n] = (h, p)
    out = []
    for n, h, p in bound:
        protocol = protocols.get(n)
        if protocol is None:
            raise ListenerError(
                f"listeners: no security protocol for listener {n}: add {n}:<protocol> to "
                f"listener.security.protocol.map (one of {', '.join(PROTOCOLS)})"
            )
        ah, ap = advertised.get(n, (config["advertised.host"], 0))
        host = h or "0.0.0.0"
        if not ah and host in ("0.0.0.0", "::"):
            ah = socket.getfqdn()  # as Kafka: a wildcard listener advertises the host's name
        out.append(Listener(n, protocol, host, p, ah, ap))
    inter = config["inter.broker.listener.name"].strip().upper()
    if inter:
        if inter not in names:
            raise ListenerError(
                f"inter.broker.listener.name: {inter} is not one of the listeners "
                f"({', '.join(names)})"
            )
        out.sort(key=lambda listener: listener.name != inter)
    return out
