"""``stratalog bench``: workloads from bench/workloads/ run side by side on Stratalog, its peers
(Apache Kafka, NATS JetStream, Redis Streams) and against the machine's own limits."""
