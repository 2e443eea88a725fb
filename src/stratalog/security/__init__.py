"""Security: listeners as Kafka names them, TLS, SASL (PLAIN, SCRAM) and the credential store.

One concept per module: ``listeners`` (which ports speak which security protocol), ``tls`` (the
server's TLS context and a client certificate's principal), ``scram`` (RFC 5802 arithmetic and
the server side of one SCRAM exchange), ``plain`` (RFC 4616), ``sasl`` (the sans-IO state
machine of one connection's authentication, as Kafka's SaslServerAuthenticator), ``credentials``
(users' salted SCRAM credentials, kept durably) and ``certs`` (a test CA and certificates).
"""
