"""A connection of a TLS listener whose TLS the offload process terminated (``ssl.offload``,
security/tls_offload.py): it arrives in clear on a Unix socket, after a PROXY v2 header.

The header names the client's address (what ACLs match hosts against, and the log says) and,
with mutual TLS, the certificate the handshake verified, whose subject is the principal as on
the broker's own TLS. Everything after it is the client's Kafka bytes, handled as on any
connection; since the socket carries them in clear, stored bytes go out by ``sendfile`` again.
"""

from __future__ import annotations

import logging

from stratalog.broker.server import ClientConnection
from stratalog.protocol import proxy_header
from stratalog.security.tls import principal_of_der

log = logging.getLogger(__name__)


class ProxiedConnection(ClientConnection):
    _head: bytearray | None = None

    def connection_made(self, transport) -> None:
        self.zero_copy = True  # (a TLS listener's, but in clear on this socket)
        super().connection_made(transport)
        self._head = bytearray()

    def data_received(self, data: bytes) -> None:
        head = self._head
        if head is None:
            super().data_received(data)
            return
        head += data
        try:
            parsed = proxy_header.parse(head)
        except proxy_header.ProxyHeaderError as e:
            log.warning("closing an offloaded TLS connection: %s", e)
            self.abort()
            return
        if parsed is None:
            return
        header, used = parsed
        self._head = None
        self.peer = header.client_host
        if self._auth is None:  # SASL_SSL: the SASL user is the principal
            self.principal = principal_of_der(header.client_cert)
        rest = bytes(head[used:])
        if rest:
            super().data_received(rest)
