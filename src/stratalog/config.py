"""Broker settings: one table of names, types, defaults and meanings.

Settings come from defaults, then a TOML file (nested tables flatten to dotted names, so
``[storage] layout = "virtual"`` is ``storage.layout``), then keyword overrides. Names follow
Kafka where Kafka has the same setting (``message.max.bytes``, ``auto.create.topics.enable``),
and topic-level defaults use Kafka's topic config names (``retention.ms``). docs/configuration.md
documents every entry of ``SETTINGS``; a test keeps the two in step.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratalog.security.listeners import DEFAULT_PROTOCOL_MAP, ListenerError, resolve
from stratalog.storage.journal import FsyncPolicy


@dataclass(frozen=True)
class Setting:
    name: str
    type: type
    default: Any
    doc: str


_S = Setting
SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in [
        _S("host", str, "127.0.0.1", "Address the Kafka listener binds to."),
        _S("port", int, 9092, "Port of the Kafka listener; 0 picks a free port."),
        _S("advertised.host", str, "", "Host clients are told to connect to (default: host)."),
        _S("advertised.port", int, 0, "Port clients are told to connect to (default: port)."),
        _S("node.id", int, 0, "This broker's id in Metadata responses (unique in a cluster)."),
        _S(
            "listeners",
            str,
            "",
            "Kafka listeners, NAME://host:port comma-separated (e.g. "
            "PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093); port 0 picks a free port. "
            "Empty: one PLAINTEXT listener on host and port.",
        ),
        _S(
            "advertised.listeners",
            str,
            "",
            "Addresses clients are told, per listener name (NAME://host:port); a listener "
            "not listed advertises its bound address (or advertised.host).",
        ),
        _S(
            "listener.security.protocol.map",
            str,
            DEFAULT_PROTOCOL_MAP,
            "Security protocol of each listener name, NAME:PROTOCOL comma-separated; protocols: "
            "PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL.",
        ),
        _S(
            "inter.broker.listener.name",
            str,
            "",
            "The listener brokers register for one another (default: the first in listeners); "
            "the replication link itself is plaintext (docs/security.md).",
        ),
        _S("ssl.keystore.type", str, "PEM", "Format of ssl.keystore.location: PEM only."),
        _S(
            "ssl.keystore.location",
            str,
            "",
            "PEM file with the broker's private key (PKCS#8) and certificate chain, for SSL and "
            "SASL_SSL listeners.",
        ),
        _S("ssl.key.password", str, "", "Password of an encrypted private key in the keystore."),
        _S("ssl.truststore.type", str, "PEM", "Format of ssl.truststore.location: PEM only."),
        _S(
            "ssl.truststore.location",
            str,
            "",
            "PEM bundle of the CAs client certificates are checked against (mutual TLS).",
        ),
        _S(
            "ssl.client.auth",
            str,
            "none",
            "Client certificates on SSL listeners: none, requested or required (mutual TLS; the "
            "certificate's subject is the principal).",
        ),
        _S(
            "ssl.enabled.protocols",
            str,
            "TLSv1.2,TLSv1.3",
            "TLS versions the listeners accept (TLSv1.2, TLSv1.3).",
        ),
        _S(
            "sasl.enabled.mechanisms",
            str,
            "SCRAM-SHA-256,SCRAM-SHA-512",
            "SASL mechanisms of SASL_PLAINTEXT and SASL_SSL listeners: PLAIN, SCRAM-SHA-256, "
            "SCRAM-SHA-512, OAUTHBEARER.",
        ),
        _S(
            "sasl.oauthbearer.jwks.endpoint.url",
            str,
            "",
            "OAUTHBEARER: the JSON Web Key Set whose keys sign the tokens, a file (file:///path "
            "or a path); needed when OAUTHBEARER is enabled.",
        ),
        _S(
            "sasl.oauthbearer.expected.audience",
            str,
            "",
            "OAUTHBEARER: audiences (comma-separated) of which a token's aud must name one; "
            "empty: not checked.",
        ),
        _S(
            "sasl.oauthbearer.expected.issuer",
            str,
            "",
            "OAUTHBEARER: the iss a token must carry; empty: not checked.",
        ),
        _S(
            "sasl.oauthbearer.sub.claim.name",
            str,
            "sub",
            "OAUTHBEARER: the claim that names the principal (User:<its value>).",
        ),
        _S(
            "sasl.oauthbearer.clock.skew.seconds",
            int,
            30,
            "OAUTHBEARER: slack allowed between the broker's clock and the token's times.",
        ),
        _S(
            "sasl.plain.users.file",
            str,
            "",
            'File of PLAIN users in Kafka\'s JAAS syntax (user_NAME="password" entries of a '
            "PlainLoginModule); users not in it are checked against the SCRAM credentials.",
        ),
        _S(
            "connections.max.reauth.ms",
            int,
            0,
            "Longest a SASL session lasts before the client must re-authenticate (KIP-368); a "
            "connection past it that sends anything else is closed. 0: sessions never expire.",
        ),
        _S(
            "sasl.server.max.receive.size",
            int,
            524288,
            "Largest frame accepted on a SASL listener before authentication (Kafka's "
            "setting); a larger size prefix closes the connection before anything is read.",
        ),
        _S(
            "authorizer.class.name",
            str,
            "",
            "Authorization by Kafka's ACLs (docs/security.md): empty, off (every client may do "
            "everything); Kafka's org.apache.kafka.metadata.authorizer.StandardAuthorizer (or "
            "kafka.security.authorizer.AclAuthorizer), on.",
        ),
        _S(
            "super.users",
            str,
            "",
            "Principals that may do everything whatever the ACLs say, ';'-separated (e.g. "
            "User:admin;User:CN=ops,O=Example), as in Kafka.",
        ),
        _S(
            "allow.everyone.if.no.acl.found",
            bool,
            False,
            "With the authorizer on: a resource no ACL applies to is open to everyone (true) or "
            "to super users only (false), as in Kafka.",
        ),
        _S(
            "cluster.etcd",
            str,
            "",
            "etcd endpoints (comma-separated, e.g. http://127.0.0.1:2379) of the cluster to "
            "join; empty: the embedded single node, whose metadata stays in its data directory.",
        ),
        _S(
            "cluster.etcd.ssl.truststore.location",
            str,
            "",
            "PEM bundle of the CAs etcd's certificate must chain to; needed when cluster.etcd "
            "names https:// endpoints (etcd over TLS).",
        ),
        _S(
            "cluster.etcd.ssl.keystore.location",
            str,
            "",
            "PEM file with the private key and certificate chain the broker presents to an "
            "https etcd (for etcd's --client-cert-auth); empty: no client certificate.",
        ),
        _S(
            "cluster.etcd.ssl.key.password",
            str,
            "",
            "Password of an encrypted private key in cluster.etcd.ssl.keystore.location.",
        ),
        _S(
            "cluster.name",
            str,
            "stratalog",
            "The cluster's name: its metadata lives under /stratalog/<name>/ in etcd.",
        ),
        _S(
            "cluster.replication.port",
            int,
            0,
            "Port the replication listener (where primaries push to this broker's backups) "
            "binds to on host; 0 picks a free port.",
        ),
        _S(
            "cluster.replication.tls",
            bool,
            False,
            "Replication between brokers over mutual TLS: each broker serves and presents its "
            "ssl.keystore.location certificate and accepts only peers whose certificates chain "
            "to ssl.truststore.location.",
        ),
        _S(
            "cluster.advertised.replication.port",
            int,
            0,
            "Replication port the other brokers are told to connect to, in the broker's etcd "
            "registration (default: the bound one); for a proxy in between, as "
            "advertised.listeners in Kafka.",
        ),
        _S(
            "replica.lag.time.max.ms",
            int,
            10_000,
            "A backup that has not caught up with its primary for this long leaves the "
            "in-sync set (Kafka's setting); acks=all waits for the in-sync set only.",
        ),
        _S(
            "default.replication.factor",
            int,
            1,
            "Replicas of a topic created without a replication factor (Kafka's setting).",
        ),
        _S(
            "admin.port",
            int,
            0,
            "Port of the HTTP admin endpoint (/status, /metrics, the web console at /) on the "
            "listener's host; 0: any free port; -1: off.",
        ),
        _S(
            "admin.auth",
            str,
            "auto",
            "Credentials on the HTTP admin endpoint: basic (HTTP basic authentication as a SASL "
            "user), none, or auto (basic when a listener is not PLAINTEXT or the authorizer is "
            "on).",
        ),
        _S(
            "gc.freeze",
            bool,
            True,
            "stratalog serve: move the objects that exist once the broker is up to Python's "
            "permanent generation, so the collector's full passes never scan them.",
        ),
        _S(
            "gc.young_threshold",
            int,
            0,
            "stratalog serve: net allocations between collections of Python's young "
            "generation; 0: Python's default (700).",
        ),
        _S(
            "max_request_bytes",
            int,
            100 * 1024 * 1024,
            "Largest request accepted; larger size prefixes close the connection before any "
            "allocation (Kafka: socket.request.max.bytes).",
        ),
        _S(
            "message.max.bytes",
            int,
            1048588,
            "Largest record batch accepted, the broker default of the topic's max.message.bytes.",
        ),
        _S(
            "auto.create.topics.enable",
            bool,
            False,
            "Create a topic on first Metadata or Produce for it.",
        ),
        _S(
            "num.partitions",
            int,
            1,
            "Partitions of an auto-created topic, or of CreateTopics with -1 partitions.",
        ),
        _S(
            "storage.layout",
            str,
            "virtual",
            "'virtual': partitions share storage.virtual_logs logs (KerA); 'per-partition': one "
            "log per partition, as Kafka.",
        ),
        _S("storage.virtual_logs", int, 4, "Virtual logs per broker in the virtual layout."),
        _S("storage.io_threads", int, 8, "Threads for fsync and segment sealing."),
        _S(
            "storage.fsync_via",
            str,
            "auto",
            "How the group commit's fdatasyncs run (fsync=always): 'io_uring' (submitted from the "
            "event loop, completed on it: no thread or GIL hand-off), 'thread' (the I/O threads), "
            "'auto' (io_uring where the kernel allows it, on x86-64).",
        ),
        _S(
            "storage.direct_io",
            bool,
            False,
            "Append to segments through O_DIRECT instead of the page cache (less CPU per byte "
            "while the disk writes back; fresh reads come from the tail cache, cache.tail_bytes). "
            "Off by default: "
            "consumers that lag read from the disk instead of the page cache.",
        ),
        _S(
            "storage.direct_min_bytes",
            int,
            131072,
            "With storage.direct_io, the smallest write that bypasses the page cache; smaller "
            "ones take it (a direct write waits for the device on the event loop).",
        ),
        _S(
            "storage.verify_on_open",
            bool,
            False,
            "Check every frame's CRCs when a log opens, not only those past its checkpoint "
            "(after a crash); damaged chunks found are fenced (CORRUPT_MESSAGE) and index "
            "entries that disagree with their frames rebuilt. Reads the whole hot tier at start.",
        ),
        _S(
            "storage.index_cache_bytes",
            int,
            64 * 1024 * 1024,
            "Memory for the sealed segments' index runs read lately (lookups in history read "
            "one run from disk and keep it here, least recently used out), for the whole "
            "broker.",
        ),
        _S(
            "storage.read_threads",
            int,
            2,
            "Threads that read segment files for Fetch; bounded so backlog reads cannot starve "
            "the write path.",
        ),
        _S(
            "storage.read_slots",
            bool,
            True,
            "Publish each partition's readable end in a slot file under <hot tier>/slots, so a "
            "reader on this host reads segment files itself (co-located reads) instead of "
            "asking Fetch.",
        ),
        _S(
            "storage.read_slots.mode",
            str,
            "",
            "File mode (octal, e.g. 640) of the slot files: who on this host may read directly "
            "(the others read through Fetch). Empty: 644, or 600 with the authorizer on.",
        ),
        _S(
            "storage.read_priority",
            str,
            "normal",
            "CPU and I/O priority of the read pool's threads: normal, or low (nice +10 and "
            "the idle I/O class, so backlog reads yield to the write path).",
        ),
        _S(
            "fetch.read_ahead.bytes",
            int,
            8 * 1024 * 1024,
            "How far past the span a backlog Fetch touches the read pool loads into the page "
            "cache (in fetch.backlog.io_bytes requests), for the next fetches and the other "
            "partitions sharing the log.",
        ),
        _S(
            "fetch.backlog.direct_reads",
            bool,
            False,
            "Read backlog (not page-cached) slices with O_DIRECT in windows of "
            "fetch.read_ahead.bytes, kept for the next reads, instead of through the page cache "
            "and its read-ahead; with storage.read_priority=low they run in the idle I/O class.",
        ),
        _S(
            "fetch.backlog.io_bytes",
            int,
            512 * 1024,
            "The largest single disk read of a backlog fetch (loaded into the page cache, or "
            "a direct-read window): a journal fsync queued behind backlog reads waits for at "
            "most fetch.backlog.io_depth of these.",
        ),
        _S(
            "fetch.backlog.io_depth",
            int,
            1,
            "How many backlog disk reads of the whole broker may be in the device at once.",
        ),
        _S(
            "fetch.backlog.max_bytes_per_sec",
            int,
            0,
            "Bytes per second Fetch serves from segment files over all consumers (disk reads "
            "and the sending of answers are both paced); 0: unlimited. A caught-up consumer's "
            "reads are not paced. With fetch.backlog.fsync_target_ms, the most the steered "
            "budget may reach.",
        ),
        _S(
            "fetch.backlog.sender",
            str,
            "loop",
            "Who sends history answers (a consumer behind the tail): 'loop', the event loop "
            "with sendfile after the read pool loaded the pages; or 'process', a process of its "
            "own at fetch.backlog.sender_priority, which loads and sends them while the loop "
            "goes on, at the fetch.backlog.max_bytes_per_sec budget if one is set (with "
            "fetch.backlog.fsync_target_ms's steered budget the loop sends them).",
        ),
        _S(
            "fetch.backlog.sender_priority",
            str,
            "idle",
            "CPU priority of the backlog sender process: idle (SCHED_IDLE: only CPU time no "
            "other task wants: history readers wait while the cores are busy), low (nice +10: "
            "a small share) or normal; its disk reads are in the idle I/O class unless normal.",
        ),
        _S(
            "fetch.backlog.sender_cpus",
            str,
            "",
            "CPUs the backlog sender process runs on and the rest of the broker does not (a "
            "Linux CPU list: '1', '2-3'); empty: no pinning. On a kernel that does not preempt "
            "system calls, a low priority alone does not keep the event loop from waiting "
            "behind a history send on its core (broker/cpu_isolation.py).",
        ),
        _S(
            "producer.id.expiration.ms",
            int,
            86_400_000,
            "An idempotent producer that appended nothing to a partition for this long is "
            "forgotten there (Kafka's setting): a retry of its older batches is then appended "
            "again. Bounds the memory of the Spark sinks' per-task producer ids; a micro-batch "
            "re-run after longer than this is no longer deduplicated.",
        ),
        _S(
            "fetch.backlog.fsync_target_ms",
            float,
            0.0,
            "Steer the backlog read budget by the journal (needs fsync=always): every 100 ms it "
            "grows while readers wait for it and the slowest group-commit fsync stayed within "
            "this many ms, and halves when it did not, between fetch.backlog.min_bytes_per_sec "
            "and fetch.backlog.max_bytes_per_sec (0 there: 4 GB/s); 0: a fixed budget.",
        ),
        _S(
            "fetch.backlog.min_bytes_per_sec",
            int,
            4_000_000,
            "The least the steered backlog budget gives history readers, however slow the "
            "journal's fsyncs: catch-up always makes progress.",
        ),
        _S(
            "fsync",
            str,
            "always",
            "'always': fsync before acks=all is answered (group commit); 'interval:<ms>': fsync "
            "periodically; 'never': leave it to the OS.",
        ),
        _S(
            "group_commit_ms",
            float,
            0.0,
            "0: adaptive group commit (an fsync starts as soon as there is something to sync "
            "and none is in flight; what arrives meanwhile is the next group). > 0: a group of "
            "appends waits up to this long for more before its fsync.",
        ),
        _S(
            "group_commit_bytes",
            int,
            512 * 1024,
            "With group_commit_ms > 0: a group is synced at once when it holds this much.",
        ),
        _S("segment.bytes", int, 128 * 1024 * 1024, "Roll a log's segment at this size."),
        _S(
            "storage.min_free_bytes",
            int,
            16 * 1024 * 1024,
            "Refuse produce (KAFKA_STORAGE_ERROR, retriable) while the logs' file system has "
            "less free space than this; it resumes by itself when space returns. 0: off.",
        ),
        _S("segment.ms", int, 7 * 24 * 3600 * 1000, "Roll a log's segment at this age."),
        _S(
            "cache.tail_bytes",
            int,
            -1,
            "Memory for the newest chunks of all partitions together (oldest evicted first), "
            "so consumers at or near the tail never touch a file. -1: 512 MiB with "
            "storage.direct_io, 0 (off) without, where the page cache holds fresh data.",
        ),
        _S(
            "index.checkpoint.interval.ms",
            int,
            5000,
            "How often index files are made durable; recovery scans only past the checkpoint.",
        ),
        _S("retention.check.interval.ms", int, 10000, "How often retention runs."),
        _S(
            "log.cleaner.enable",
            bool,
            True,
            "Compact the partitions of topics with cleanup.policy=compact (storage/cleaner.py).",
        ),
        _S(
            "log.cleaner.backoff.ms",
            int,
            15000,
            "How often the cleaner looks for compacted partitions due for a cleaning.",
        ),
        _S(
            "log.cleaner.io.max.bytes.per.second",
            int,
            0,
            "Bytes per second the cleaner's worker reads and writes at most; 0: no limit (it "
            "runs at a lower CPU priority either way).",
        ),
        _S(
            "log.cleaner.priority",
            str,
            "low",
            "CPU priority of the cleaner's worker process: low (nice +10: a small share of a "
            "busy core) or idle (SCHED_IDLE and the idle I/O class: only CPU time and disk "
            "time no other task wants; a cleaning waits while the cores are busy).",
        ),
        _S(
            "log.cleaner.fsync_target_ms",
            float,
            0.0,
            "Steer the cleaner's reads and writes by the journal (needs fsync=always), as "
            "fetch.backlog.fsync_target_ms steers backlog reads: every 100 ms its rate grows "
            "while the cleaner waits for it and the slowest group-commit fsync stayed within "
            "this many ms, and halves when it did not, between log.cleaner.min_bytes_per_sec "
            "and log.cleaner.io.max.bytes.per.second (0 there: 4 GB/s); 0: a fixed rate.",
        ),
        _S(
            "log.cleaner.min_bytes_per_sec",
            int,
            2_000_000,
            "The least the steered cleaner reads and writes, however slow the journal's "
            "fsyncs: a cleaning always ends.",
        ),
        _S(
            "log.cleaner.dedupe.buffer.size",
            int,
            128 * 1024 * 1024,
            "Memory for one cleaning's key map (about 128 bytes a key): a partition with more "
            "dirty keys is cleaned in several steps.",
        ),
        _S(
            "log.cleaner.min.cleanable.ratio",
            float,
            0.5,
            "Default min.cleanable.dirty.ratio of compacted topics.",
        ),
        _S(
            "log.cleaner.min.compaction.lag.ms",
            int,
            0,
            "Default min.compaction.lag.ms of compacted topics.",
        ),
        _S(
            "log.cleaner.max.compaction.lag.ms",
            int,
            (1 << 63) - 1,
            "Default max.compaction.lag.ms of compacted topics.",
        ),
        _S(
            "log.cleaner.delete.retention.ms",
            int,
            24 * 3600 * 1000,
            "Default delete.retention.ms of compacted topics (how long tombstones stay).",
        ),
        _S(
            "retention.ms",
            int,
            7 * 24 * 3600 * 1000,
            "Default topic retention by time; -1 keeps data forever.",
        ),
        _S("retention.bytes", int, -1, "Default topic retention by size per partition; -1: none."),
        _S(
            "local.retention.ms",
            int,
            -2,
            "Default time data stays in the hot tier before migration; -2: as retention.ms.",
        ),
        _S(
            "local.retention.bytes",
            int,
            -2,
            "Default hot bytes per partition before migration; -2: as retention.bytes.",
        ),
        _S(
            "tiers.hot.path",
            str,
            "",
            "Directory of the hot tier (the virtual logs); default: <data-dir>/logs.",
        ),
        _S(
            "tiers.hot.capacity",
            int,
            0,
            "Bytes the hot tier may hold; 0: no limit (no threshold migration, no spill).",
        ),
        _S(
            "tiers.cold.path",
            str,
            "",
            "Directory of the cold tier on a slower device; empty: "
            "no cold tier (unless tiers.cold.url).",
        ),
        _S("tiers.cold.url", str, "", "An fsspec URL for the cold tier (e.g. s3://bucket/prefix)."),
        _S(
            "tiers.cold.shared",
            bool,
            False,
            "Cluster mode: every broker has this same cold tier (one directory or object "
            "store): a virtual log's primary uploads each segment once and its backups read "
            "it from there; otherwise each backup copies the segments itself.",
        ),
        _S(
            "tiers.cold.options",
            str,
            "",
            "JSON object of fsspec storage options for "
            'tiers.cold.url, e.g. {"key": ..., "secret": ..., "client_kwargs": '
            '{"endpoint_url": ...}}.',
        ),
        _S(
            "tiers.migrate.threshold",
            float,
            0.5,
            "Migrate the oldest hot segments once hot usage passes this fraction of "
            "tiers.hot.capacity (Pafka); -1 turns migration by usage off.",
        ),
        _S("tiers.migrate.max_bytes_per_sec", int, 0, "Migration rate limit; 0: unlimited."),
        _S(
            "tiers.cold.max_bytes_per_sec",
            int,
            0,
            "Write bandwidth of the cold tier (its device's, or this broker's share of it): "
            "migration and the writes that spill to the cold tier while the hot tier is full "
            "both draw from it, and a Produce that spilled is answered at its pace; "
            "0: unlimited.",
        ),
        _S(
            "tiers.migrate.threads",
            int,
            2,
            "Partitions copied to the cold tier at once, each by a worker process.",
        ),
        _S("tiers.migrate.interval.ms", int, 1000, "How often the migrator looks for work."),
        _S(
            "tiers.promote",
            bool,
            False,
            "Below the threshold, copy the newest cold segments back to the hot tier's cache.",
        ),
        _S("group.min.session.timeout.ms", int, 6000, "Smallest session timeout a member may ask."),
        _S(
            "group.max.session.timeout.ms",
            int,
            1800000,
            "Largest session timeout a member may ask.",
        ),
        _S(
            "group.consumer.session.timeout.ms",
            int,
            45000,
            "Consumer group protocol (KIP-848): a member silent this long is removed.",
        ),
        _S(
            "group.consumer.heartbeat.interval.ms",
            int,
            5000,
            "Consumer group protocol (KIP-848): how often members are told to heartbeat.",
        ),
        _S(
            "group.share.session.timeout.ms",
            int,
            45000,
            "Share groups (KIP-932): a member silent this long is removed; its records return.",
        ),
        _S(
            "group.share.heartbeat.interval.ms",
            int,
            5000,
            "Share groups (KIP-932): how often members are told to heartbeat.",
        ),
        _S(
            "group.share.record.lock.duration.ms",
            int,
            30000,
            "Share groups (KIP-932): how long an acquired record stays locked to its consumer.",
        ),
        _S(
            "group.share.delivery.count.limit",
            int,
            5,
            "Share groups (KIP-932): deliveries of a record before it is archived.",
        ),
        _S(
            "group.share.partition.max.record.locks",
            int,
            2000,
            "Share groups (KIP-932): records in flight per share-partition at most.",
        ),
        _S(
            "group.share.max.size",
            int,
            200,
            "Share groups (KIP-932): members of one share group at most.",
        ),
        _S(
            "share.auto.offset.reset",
            str,
            "latest",
            "Share groups (KIP-932): where a share-partition starts: latest or earliest.",
        ),
        _S(
            "group.initial.rebalance.delay.ms",
            int,
            0,
            "Wait for more members before the first rebalance of an empty group.",
        ),
        _S(
            "offsets.retention.check.interval.ms",
            int,
            600000,
            "How long a classic group whose members all left without committing stays "
            "known (Empty: listed, described, deletable) before it is dropped, as Kafka's "
            "periodic clean-up of such groups does at this interval.",
        ),
        _S(
            "offsets.topic.num.partitions",
            int,
            50,
            "Partitions of the internal topic __consumer_offsets, created at the first "
            "FindCoordinator for a group or the first OffsetCommit; a group's commits go to "
            "partition abs(hash(group)) % this, as in Kafka. Changing it later does not change "
            "an existing topic.",
        ),
        _S(
            "transaction.state.log.num.partitions",
            int,
            50,
            "Partitions of the internal topic __transaction_state, created at the first "
            "FindCoordinator for a transactional id; an id's state goes to partition "
            "abs(hash(id)) % this, whose leader coordinates it, as in Kafka.",
        ),
        _S(
            "share.coordinator.state.topic.num.partitions",
            int,
            50,
            "Partitions of the internal topic __share_group_state, created at a share group's "
            "first state write; a share-partition's state goes to partition "
            "abs(hash(group:topicId:partition)) % this, as in Kafka.",
        ),
        _S(
            "transaction.max.timeout.ms",
            int,
            900_000,
            "The largest transaction.timeout.ms a transactional producer may ask for "
            "(InitProducerId answers INVALID_TRANSACTION_TIMEOUT above it).",
        ),
        _S(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms",
            int,
            10_000,
            "How often the transaction coordinator aborts transactions open for longer than "
            "their timeout (fencing their producers).",
        ),
        _S(
            "transactional.id.expiration.ms",
            int,
            604_800_000,
            "A transactional id with no transaction for this long is forgotten by its coordinator.",
        ),
    ]
}


class ConfigError(ValueError):
    pass


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _convert(setting: Setting, value: Any) -> Any:
    try:
        if setting.type is bool:
            if isinstance(value, str):
                if value.lower() in ("true", "1", "yes"):
                    return True
                if value.lower() in ("false", "0", "no"):
                    return False
                raise ValueError(value)
            return bool(value)
        if setting.type is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        return setting.type(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"setting {setting.name!r} must be {setting.type.__name__}, not {value!r}"
        ) from None


# Settings that take one of a few words.
_CHOICES = {
    "fetch.backlog.sender": ("loop", "process"),
    "fetch.backlog.sender_priority": ("idle", "low", "normal"),
    "storage.read_priority": ("low", "normal"),
    "storage.layout": ("virtual", "per-partition"),
    "storage.fsync_via": ("auto", "io_uring", "thread"),
    "share.auto.offset.reset": ("latest", "earliest"),
    "log.cleaner.priority": ("low", "idle"),
    "ssl.client.auth": ("none", "requested", "required"),
    "admin.auth": ("auto", "basic", "none"),
}

# The values of authorizer.class.name that turn Stratalog's ACL authorizer on: Kafka's own.
AUTHORIZER_CLASSES = (
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
)

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


class BrokerConfig:
    """Resolved settings; read them as ``config["storage.layout"]``."""

    def __init__(self, values: dict[str, Any] | None = None, file: Path | None = None) -> None:
        merged: dict[str, Any] = {name: s.default for name, s in SETTINGS.items()}
        if file is not None:
            try:
                with open(file, "rb") as f:
                    raw = tomllib.load(f)
            except FileNotFoundError:
                raise ConfigError(f"config file {file} does not exist") from None
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"config file {file} is not valid TOML: {e}") from None
            merged.update(self._checked(_flatten(raw)))
        merged.update(self._checked(values or {}))
        self._values = merged
        self.validate()

    @staticmethod
    def _checked(values: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, v in values.items():
            if key not in SETTINGS:
                raise ConfigError(f"unknown setting {key!r}")
            out[key] = _convert(SETTINGS[key], v)
        return out

    def validate(self) -> None:
        try:
            FsyncPolicy.parse(self["fsync"])
        except ValueError as e:
            raise ConfigError(str(e)) from None
        for name, allowed in _CHOICES.items():
            if self[name] not in allowed:
                listed = " or ".join(f"'{v}'" for v in allowed)
                raise ConfigError(f"{name} must be {listed}, not {self[name]!r}")
        if self["tiers.cold.options"]:
            import json

            try:
                if not isinstance(json.loads(self["tiers.cold.options"]), dict):
                    raise ValueError("not an object")
            except ValueError as e:
                raise ConfigError(f"tiers.cold.options must be a JSON object: {e}") from None
        if self["tiers.cold.path"] and self["tiers.cold.url"]:
            raise ConfigError("set tiers.cold.path or tiers.cold.url, not both")
        self._validate_steering(
            "fetch.backlog.fsync_target_ms",
            "backlog reads",
            "fetch.backlog.min_bytes_per_sec",
            "fetch.backlog.max_bytes_per_sec",
        )
        self._validate_steering(
            "log.cleaner.fsync_target_ms",
            "the cleaner",
            "log.cleaner.min_bytes_per_sec",
            "log.cleaner.io.max.bytes.per.second",
        )
        self._validate_sender_cpus()
        self._validate_ranges()
        self._validate_security()

    def _validate_steering(self, target: str, what: str, floor: str, top: str) -> None:
        if self[target] <= 0:
            return
        # Steered by the fsyncs acks wait for: with fsync=interval or never there are none.
        if self["fsync"] != "always":
            raise ConfigError(
                f"{target} steers {what} by the fsyncs that producers wait for, and "
                f"fsync={self['fsync']!r} has none: use fsync=always, or a fixed {top}"
            )
        if 0 < self[top] < self[floor]:
            raise ConfigError(f"{floor} ({self[floor]}) is above {top} ({self[top]})")

    def _validate_security(self) -> None:
        self._validate_etcd_tls()
        try:
            listeners = resolve(self)
        except ListenerError as e:
            raise ConfigError(str(e)) from None
        mechanisms = self.sasl_mechanisms
        unknown = [m for m in mechanisms if m not in SASL_MECHANISMS]
        if unknown:
            raise ConfigError(
                f"sasl.enabled.mechanisms: {', '.join(unknown)} is not supported (Stratalog "
                f"supports {', '.join(SASL_MECHANISMS)})"
            )
        if not mechanisms and any(x.sasl for x in listeners):
            raise ConfigError("sasl.enabled.mechanisms is empty but a listener uses SASL")
        if "OAUTHBEARER" in mechanisms and any(x.sasl for x in listeners):
            from stratalog.security.oauthbearer import OAuthConfigError

            try:
                self.token_validator()
            except OAuthConfigError as e:
                raise ConfigError(str(e)) from None
        authorizer = self["authorizer.class.name"].strip()
        if authorizer and authorizer not in AUTHORIZER_CLASSES:
            raise ConfigError(
                f"authorizer.class.name: {authorizer} is not available; Stratalog's ACL "
                f"authorizer answers to {' or '.join(AUTHORIZER_CLASSES)} (empty: off)"
            )
        mode = self["storage.read_slots.mode"].strip()
        if mode and not re.fullmatch(r"[0-7]{1,3}", mode):
            raise ConfigError(
                f"storage.read_slots.mode: {mode!r} is not an octal file mode (e.g. 640)"
            )

    @property
    def etcd_endpoints(self) -> list[str]:
        return [e.strip() for e in self["cluster.etcd"].split(",") if e.strip()]

    def _validate_etcd_tls(self) -> None:
        # Only the URLs and which settings are set: the files are read when the broker starts
        # (cluster/etcd_tls.py's etcd_client_tls), like the listeners' certificates.
        endpoints = self.etcd_endpoints
        https = [e for e in endpoints if e.lower().startswith("https://")]
        tls_set = [
            name
            for name in (
                "cluster.etcd.ssl.truststore.location",
                "cluster.etcd.ssl.keystore.location",
            )
            if self[name]
        ]
        if https and len(https) != len(endpoints):
            raise ConfigError(
                f"cluster.etcd mixes http and https endpoints: {self['cluster.etcd']}"
            )
        if https and not self["cluster.etcd.ssl.truststore.location"]:
            raise ConfigError(
                f"cluster.etcd names https endpoints ({', '.join(https)}) but "
                "cluster.etcd.ssl.truststore.location is not set: the CA that etcd's "
                "certificate must chain to"
            )
        if endpoints and not https and tls_set:
            raise ConfigError(
                f"{' and '.join(tls_set)} set, but cluster.etcd names plain http endpoints "
                f"({self['cluster.etcd']}): name them https:// for TLS to etcd"
            )

    def token_validator(self):
        """OAUTHBEARER's JWT validator, from the sasl.oauthbearer.* settings."""
        from stratalog.security.oauthbearer import JwtValidator

        return JwtValidator.from_settings(
            self["sasl.oauthbearer.jwks.endpoint.url"],
            self["sasl.oauthbearer.expected.audience"],
            self["sasl.oauthbearer.expected.issuer"],
            self["sasl.oauthbearer.sub.claim.name"],
            self["sasl.oauthbearer.clock.skew.seconds"],
        )

    @property
    def authorizer_enabled(self) -> bool:
        return bool(self["authorizer.class.name"].strip())

    @property
    def secured(self) -> bool:
        """Whether security is on: a listener other than PLAINTEXT, or the authorizer."""
        return self.authorizer_enabled or any(x.protocol != "PLAINTEXT" for x in resolve(self))

    @property
    def sasl_mechanisms(self) -> list[str]:
        return [m.strip().upper() for m in self["sasl.enabled.mechanisms"].split(",") if m.strip()]

    def _validate_sender_cpus(self) -> None:
        from stratalog.broker.cpu_isolation import CpuListError, broker_cpus, parse_cpus

        text = self["fetch.backlog.sender_cpus"]
        try:
            cpus = parse_cpus(text)
            if cpus:
                broker_cpus(cpus)
        except CpuListError as e:
            raise ConfigError(f"fetch.backlog.sender_cpus={text!r}: {e}") from None
        if cpus and self["fetch.backlog.sender"] != "process":
            raise ConfigError(
                "fetch.backlog.sender_cpus gives the backlog sender process its CPUs: set "
                "fetch.backlog.sender=process too"
            )

    # Settings whose meaning needs at least this value (below it the broker would start and then
    # misbehave: spin, never acknowledge, or divide by nothing). Settings with special negative
    # values (retention.ms -1, local.retention.* -2, admin.port -1) are in their own ranges.
    _AT_LEAST = {
        "storage.virtual_logs": 1,
        "storage.io_threads": 1,
        "storage.read_threads": 1,
        "fetch.read_ahead.bytes": 1,
        "fetch.backlog.io_bytes": 4096,
        "fetch.backlog.io_depth": 1,
        "segment.bytes": 1,
        "storage.min_free_bytes": 0,
        "max_request_bytes": 1,
        "message.max.bytes": 1,
        "storage.direct_min_bytes": 0,
        "group_commit_ms": 0,
        "group_commit_bytes": 0,
        "port": 0,
        "advertised.port": 0,
        "cluster.replication.port": 0,
        "cluster.advertised.replication.port": 0,
        "admin.port": -1,
        "node.id": 0,
        "gc.young_threshold": 0,
        "num.partitions": 1,
        "default.replication.factor": 1,
        "replica.lag.time.max.ms": 1,
        "fetch.backlog.max_bytes_per_sec": 0,
        "fetch.backlog.fsync_target_ms": 0,
        "fetch.backlog.min_bytes_per_sec": 1,
        "producer.id.expiration.ms": 1,
        "segment.ms": 1,
        "cache.tail_bytes": -1,
        "index.checkpoint.interval.ms": 1,
        "retention.check.interval.ms": 1,
        "log.cleaner.backoff.ms": 1,
        "log.cleaner.io.max.bytes.per.second": 0,
        "log.cleaner.fsync_target_ms": 0,
        "log.cleaner.min_bytes_per_sec": 1,
        "log.cleaner.dedupe.buffer.size": 1024,
        "log.cleaner.min.cleanable.ratio": 0,
        "log.cleaner.min.compaction.lag.ms": 0,
        "log.cleaner.max.compaction.lag.ms": 1,
        "log.cleaner.delete.retention.ms": 0,
        "retention.ms": -1,
        "retention.bytes": -1,
        "local.retention.ms": -2,
        "local.retention.bytes": -2,
        "tiers.hot.capacity": 0,
        "tiers.migrate.max_bytes_per_sec": 0,
        "tiers.cold.max_bytes_per_sec": 0,
        "tiers.migrate.threads": 1,
        "tiers.migrate.interval.ms": 1,
        "group.min.session.timeout.ms": 1,
        "group.max.session.timeout.ms": 1,
        "group.initial.rebalance.delay.ms": 0,
        "group.consumer.session.timeout.ms": 1,
        "group.consumer.heartbeat.interval.ms": 1,
        "group.share.session.timeout.ms": 1,
        "group.share.heartbeat.interval.ms": 1,
        "group.share.record.lock.duration.ms": 1,
        "group.share.delivery.count.limit": 1,
        "group.share.partition.max.record.locks": 1,
        "group.share.max.size": 1,
        "offsets.topic.num.partitions": 1,
        "offsets.retention.check.interval.ms": 1,
        "connections.max.reauth.ms": 0,
        "sasl.server.max.receive.size": 1,
        "transaction.state.log.num.partitions": 1,
        "share.coordinator.state.topic.num.partitions": 1,
        "transaction.max.timeout.ms": 1,
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1,
        "transactional.id.expiration.ms": 1,
    }

    def _validate_ranges(self) -> None:
        import math

        for name, low in self._AT_LEAST.items():
            v = self[name]
            if v < low:
                if low == 1:
                    raise ConfigError(f"setting {name!r} must be positive, not {v}")
                if low == 0:
                    raise ConfigError(f"{name} must be 0 or more, not {v}")
                raise ConfigError(f"setting {name!r} must be at least {low}, not {v}")
        ports = ("port", "advertised.port", "admin.port", "cluster.replication.port",
                 "cluster.advertised.replication.port")  # fmt: skip
        for name in ports:
            if self[name] > 65535:
                raise ConfigError(
                    f"setting {name!r} must be a port (at most 65535), not {self[name]}"
                )
        if self["log.cleaner.min.cleanable.ratio"] > 1:
            raise ConfigError("log.cleaner.min.cleanable.ratio must be between 0 and 1")
        for name, s in SETTINGS.items():
            if s.type is float and not math.isfinite(self[name]):
                raise ConfigError(f"setting {name!r} must be a finite number, not {self[name]}")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    @property
    def cold_options(self) -> dict:
        import json

        text = self["tiers.cold.options"]
        return json.loads(text) if text else {}

    @property
    def fsync_policy(self) -> FsyncPolicy:
        return FsyncPolicy.parse(self["fsync"])
