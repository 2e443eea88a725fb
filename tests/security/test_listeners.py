"""Listener settings as Kafka spells them (security/listeners.py), without opening a port."""

from __future__ import annotations

import socket

import pytest

from stratalog.config import BrokerConfig, ConfigError
from stratalog.security.listeners import resolve


def test_without_listeners_host_and_port_are_one_plaintext_listener():
    (only,) = resolve(BrokerConfig({"host": "127.0.0.2", "port": 9999}))
    assert (only.name, only.protocol, only.host, only.port) == ("PLAINTEXT", "PLAINTEXT",
                                                                 "127.0.0.2", 9999)  # fmt: skip
    assert only.endpoint == ("127.0.0.2", 9999)
    (adv,) = resolve(BrokerConfig({"advertised.host": "kafka.example", "advertised.port": 19092}))
    assert adv.endpoint == ("kafka.example", 19092)


def test_names_protocols_and_advertised_addresses():
    config = BrokerConfig(
        {
            "listeners": "internal://127.0.0.1:9092,CLIENT://[::1]:9093,SASL_SSL://:9094",
            "listener.security.protocol.map": "INTERNAL:PLAINTEXT,CLIENT:SASL_SSL,"
            "SASL_SSL:SASL_SSL",
            "advertised.listeners": "CLIENT://broker.example:19093",
            "inter.broker.listener.name": "client",
        }
    )
    by_name = {x.name: x for x in resolve(config)}
    assert resolve(config)[0].name == "CLIENT"  # the inter-broker one first
    assert by_name["INTERNAL"].protocol == "PLAINTEXT" and not by_name["INTERNAL"].tls
    client = by_name["CLIENT"]
    assert (client.host, client.port, client.tls, client.sasl) == ("::1", 9093, True, True)
    assert client.endpoint == ("broker.example", 19093)
    wildcard = by_name["SASL_SSL"]
    assert wildcard.host == "0.0.0.0" and wildcard.endpoint == (socket.getfqdn(), 9094)


BAD = {
    "listeners=PLAINTEXT:9092": "is not NAME://host:port",
    "listeners=PLAINTEXT://127.0.0.1:99999": "past 65535",
    "listeners=A://127.0.0.1:1,A://127.0.0.1:2": "listener name A appears twice",
    "listeners=SSL://127.0.0.1:1,SASL_SSL://127.0.0.1:1": "port 1 is given to two listeners",
    "listeners=CLIENT://127.0.0.1:1": "no security protocol for listener CLIENT",
    "listener.security.protocol.map=CLIENT": "is not LISTENER_NAME:PROTOCOL",
    "advertised.listeners=SSL://h:1": "SSL is not one of the listeners",
    "inter.broker.listener.name=SSL": "SSL is not one of the listeners",
    "sasl.enabled.mechanisms=GSSAPI": "GSSAPI is not supported",
    "ssl.client.auth=maybe": "ssl.client.auth must be",
}


@pytest.mark.parametrize("setting", list(BAD))
def test_bad_settings_name_the_problem(setting):
    key, _, value = setting.partition("=")
    values = {"listeners": "PLAINTEXT://127.0.0.1:0", key: value}
    with pytest.raises(ConfigError) as e:
        BrokerConfig(values)
    assert BAD[setting] in str(e.value)


def test_a_wildcard_cannot_be_advertised():
    with pytest.raises(ConfigError, match="which clients cannot connect to"):
        BrokerConfig(
            {
                "listeners": "PLAINTEXT://0.0.0.0:0",
                "advertised.listeners": "PLAINTEXT://0.0.0.0:9092",
            }
        )
