"""The Kafka wire protocol, sans-IO: bytes in, events out, and back; no sockets here."""
