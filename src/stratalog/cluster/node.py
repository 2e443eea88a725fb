"""A broker's membership of a cluster whose metadata lives in etcd.

Everything shared lives under ``/stratalog/<cluster>/`` (``keys`` below): the cluster id, the
live brokers (each under its own lease, so a dead broker's key goes with its lease), topics with
their partitions' storage uids and virtual logs, each virtual log's replicas, primary, epoch and
in-sync set, and the id generators. Every change is a transaction guarded by the revision it
read (``EtcdStore.txn``), so two brokers creating topics at once cannot hand out one uid twice.
A lease never proves anything to a replica: the epoch in each virtual log does.

The node keeps a copy of that state, filled by one read at join and kept current by a watch on
the prefix; the broker reads the copy (``brokers``, ``topics``, ``vlogs``) without waiting.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from stratalog.cluster.errors import ClusterError
from stratalog.cluster.etcd import EtcdStore, Lease
from stratalog.cluster.etcd_tls import EtcdTls
from stratalog.cluster.placement import VirtualLogState, assign_virtual_logs, replica_lists
from stratalog.cluster.reassignment import Reassignment
from stratalog.splits import SPLIT_HISTORY, next_history

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK = 1000
LEASE_TTL_S = 3.0  # a stuck event loop loses its lease within this (replication-facts.md §6)
PROBE_ATTEMPTS = 10  # connections tried on a suspected broker's replication port ...
PROBE_PAUSE = 0.15  # ... this far apart: about half the lease in all


class Keys:
    def __init__(self, cluster: str) -> None:
        self.root = f"/stratalog/{cluster}/"
        self.cluster_id = self.root + "id"
        self.brokers = self.root + "brokers/"
        self.topics = self.root + "topics/"
        self.vlogs = self.root + "vlogs/"
        self.reassignments = self.root + "reassignments/"
        self.scram = self.root + "scram/"  # one key per user: {mechanism: credential}
        self.log_starts = self.root + "logstarts/"
        self.quotas = self.root + "quotas"
        self.acls = self.root + "acls"  # the whole ACL set (security/acl_store.py's JSON)
        self.controller = self.root + "controller"  # the elected controller's node id
        self.next_uid = self.root + "idgen/uid"
        self.next_vid = self.root + "idgen/vid"
        self.next_producer = self.root + "idgen/producer"

    def broker(self, node: int) -> str:
        return f"{self.brokers}{node}"

    def topic(self, name: str) -> str:
        return self.topics + name

    def scram_user(self, user: str) -> str:
        return self.scram + user

    def vlog(self, vid: int) -> str:
        return f"{self.vlogs}{vid}"

    def reassignment(self, topic: str, index: int) -> str:
        return f"{self.reassignments}{topic}/{index}"

    def log_start(self, topic: str, index: int) -> str:
        return f"{self.log_starts}{topic}/{index}"


@dataclass(frozen=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    incarnation: str
    replication_port: int = 0
    lease: int = 0  # its etcd lease, which a peer that saw it die revokes
    # Listener name -> advertised (host, port): Metadata answers a client with the address of
    # the listener it connected to (host/port above are the inter-broker listener's).
    listeners: dict[str, tuple[str, int]] = field(default_factory=dict, compare=False)


@dataclass
class ClusterTopic:
    name: str
    topic_id: uuid.UUID
    partitions: list[int]  # partition index -> storage uid
    vlogs: list[int]  # partition index -> virtual log id
    configs: dict[str, str]
    # Partitions moved by a reassignment: index -> (end of the copied records, [(leader
    # epoch, start offset)] of them), the epochs their new log's history does not hold.
    inherited: dict[int, tuple[int, list[tuple[int, int]]]] = field(default_factory=dict)

    def to_json(self) -> dict:
        raw = {
            "id": str(self.topic_id),
            "partitions": self.partitions,
            "vlogs": self.vlogs,
            "configs": self.configs,
        }
        if self.inherited:
            raw["inherited"] = {
                str(i): {"end": end, "epochs": [list(e) for e in epochs]}
                for i, (end, epochs) in self.inherited.items()
            }
        return raw

    @classmethod
    def from_json(cls, name: str, raw: dict) -> ClusterTopic:
        return cls(
            name,
            uuid.UUID(raw["id"]),
            list(raw["partitions"]),
            list(raw["vlogs"]),
            dict(raw["configs"]),
            {
                int(i): (v["end"], [(e, s) for e, s in v["epochs"]])
                for i, v in raw.get("inherited", {}).items()
            },
        )


def _dump(obj) -> bytes:
    return json.dumps(obj, sort_keys=True).encode()


class ClusterNode:
    """This broker in its cluster: registration, the shared state, and its changes."""

    def __init__(
        self,
        endpoints: list[str],
        cluster: str,
        node_id: int,
        host: str,
        port: int,
    ) -> None:
        self.endpoints = endpoints
        self.keys = Keys(cluster)
        self.cluster = cluster
        self.node_id = node_id
        self.host = host
        self.port = port
        self.incarnation = uuid.uuid4().hex
        self.replication_port = 0  # where primaries push to this broker (set before register)
        self.listeners: dict[str, tuple[str, int]] = {}  # advertised, by name (set before register)
        self.store: EtcdStore | None = None
        self.etcd_tls: EtcdTls | None = None  # CA and client certificate of an https etcd
        self.lease: Lease | None = None
        self.cluster_id = ""
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics: dict[str, ClusterTopic] = {}
        self.vlogs: dict[int, VirtualLogState] = {}
        # (topic, partition) -> its reassignment in flight (or just done), as etcd holds it.
        self.reassignments: dict[tuple[str, int], Reassignment] = {}
        # (topic, partition) -> (topic id, log start) a leader moved it to (DeleteRecords).
        self.log_starts: dict[tuple[str, int], tuple[uuid.UUID, int]] = {}
        # Called when ``log_starts`` changed (replicas move their log starts after it).
        self.on_log_start: Callable[[], None] | None = None
        # The client quotas (broker/quotas.py's JSON), and what is called when they change.
        self.quotas: list = []
        self.on_quotas: Callable[[], None] | None = None
        # The ACLs (security/acl_store.py's JSON), and what is called when they change.
        self.acls: list = []
        self.on_acls: Callable[[], None] | None = None
        # Called with (name, topic or None) when a topic appears, changes or goes away.
        self.on_topic: Callable[[str, ClusterTopic | None], None] | None = None
        # Called after any change of brokers or virtual logs (replication reconciles itself).
        self.on_change: Callable[[], None] | None = None
        # Users' SCRAM credentials as etcd holds them (user -> mechanism -> credential JSON),
        # and who is told when they change (security/credentials.py's store).
        self.scram: dict[str, dict[str, dict]] = {}
        self.on_credentials: Callable[[], None] | None = None
        self._watch: asyncio.Task | None = None
        self._renewal: asyncio.Task | None = None
        self._producer_ids: tuple[int, int] = (0, 0)  # [next, limit) of this node's block
        self._probing: set[int] = set()
        # Brokers whose replication port refused connections (monotonic time of the proof).
        self.proven_gone: dict[int, float] = {}
        self.controller_id: int | None = None  # as etcd names it (Metadata's controller)
        # Each broker's last registration, kept after it goes, and when it went (monotonic,
        # as this broker saw it): see leaders_named().
        self.last_registered: dict[int, BrokerInfo] = {}
        self.unregistered_at: dict[int, float] = {}
        self.leaving = False  # stopping: a lost lease is not taken again

    # -- joining and leaving -------------------------------------------------------------------
    async def connect(self, local_cluster_id: str | None) -> str:
        """Reach etcd and agree on the cluster id: a new cluster takes ``local_cluster_id`` (or
        a fresh one); a data directory that already belongs to another cluster is refused.
        Returns the cluster id."""
        self.store = await EtcdStore.connect(self.endpoints, tls=self.etcd_tls)
        proposal = local_cluster_id or uuid.uuid4().hex
        await self.store.create(self.keys.cluster_id, proposal.encode())
        got = await self.store.get(self.keys.cluster_id)
        assert got is not None
        self.cluster_id = got[0].decode()
        if local_cluster_id and local_cluster_id != self.cluster_id:
            raise ClusterError(
                f"the data directory belongs to cluster {local_cluster_id}, but etcd at "
                f"{', '.join(self.endpoints)} holds cluster {self.cluster_id} under "
                f"{self.keys.root!r}: use this broker's own data directory"
            )
        return self.cluster_id

    async def register(self) -> None:
        """Register this broker under a lease; refused if its node id is live elsewhere."""
        assert self.store is not None
        if not await self._create_registration():
            key = self.keys.broker(self.node_id)
            got = await self.store.get(key)
            other = json.loads(got[0]) if got else {}
            assert self.lease is not None
            await self.lease.revoke()
            raise ClusterError(
                f"node id {self.node_id} is already registered in cluster {self.cluster!r} by "
                f"a live broker at {other.get('host')}:{other.get('port')}: every broker needs "
                f"its own node.id"
            )
        await self.load()
        self._watch = asyncio.ensure_future(self._follow())
        self._renewal = asyncio.ensure_future(self._stay_registered())

    async def _create_registration(self) -> bool:
        """Take a new lease and create this broker's key under it, as a new incarnation; False
        if the key stayed taken. A broker restarted at once finds its previous registration
        still there until that lease expires: wait that long before calling the id taken."""
        assert self.store is not None
        self.lease = await self.store.grant_lease(LEASE_TTL_S)
        self.incarnation = uuid.uuid4().hex
        me = {
            "host": self.host,
            "port": self.port,
            "incarnation": self.incarnation,
            "replication_port": self.replication_port,
            "listeners": {n: [h, p] for n, (h, p) in self.listeners.items()},
            "lease": self.lease.id,  # so a peer that sees this process die can end it at once
        }
        key = self.keys.broker(self.node_id)
        deadline = time.monotonic() + LEASE_TTL_S * 1.5
        while not await self.store.create(key, _dump(me), lease=self.lease):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.25)
        return True

    async def _stay_registered(self) -> None:
        """A lease lost (the process was paused past it, cut off from etcd, or taken for dead
        by a peer) took this broker's registration with it: the controller has moved its logs
        away. Register again under a new lease, as a new incarnation, so it can serve as a
        replica again."""
        assert self.store is not None
        while True:
            assert self.lease is not None
            await self.lease.lost.wait()
            if self.leaving:
                return
            log.warning("node %d lost its etcd lease: registering again", self.node_id)
            while True:
                try:
                    if not await self._create_registration():
                        raise ClusterError(f"node id {self.node_id} is registered by another")
                    log.warning("node %d registered again", self.node_id)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    log.warning("node %d cannot register again yet: %s", self.node_id, e)
                    await asyncio.sleep(1.0)

    def suspect(self, node_id: int) -> None:
        """A replication connection to broker ``node_id`` ended: if its replication port (open
        from before it registers until it stops) now refuses connections, its process is gone
        (kill -9 closes its sockets at once; a paused process still accepts), so its lease is
        revoked and the controller fails over now, not when the lease expires. Anything else
        leaves it to the lease. A broker no longer registered is probed at its last
        registration's address: a new controller proves for itself that one absent when its
        term began is gone (a peer revoked its lease), instead of granting it a lease's grace."""
        info = self.brokers.get(node_id) or self.last_registered.get(node_id)
        if node_id == self.node_id or info is None or not info.lease or not info.replication_port:
            return
        if node_id in self._probing or self.store is None:
            return
        self._probing.add(node_id)
        task = asyncio.ensure_future(self._probe(info))
        task.add_done_callback(lambda _t: self._probing.discard(node_id))

    async def _probe(self, info: BrokerInfo) -> None:
        # Two refusals prove it. An accepted connection proves nothing: a process being killed
        # still has its listening socket open while the kernel tears it down (its files close
        # in descriptor order, so a peer's link can end before the listener does), and the
        # kernel completes handshakes for it meanwhile. Nor does a timeout (a starved event
        # loop here, a full backlog there). So it is tried again, for about the lease's time.
        refused = accepted = failed = 0
        for attempt in range(PROBE_ATTEMPTS):
            if attempt:
                await asyncio.sleep(PROBE_PAUSE)
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(info.host, info.replication_port), 1.0
                )
            except ConnectionRefusedError:
                refused += 1
                if refused == 2:
                    break
                continue
            except (OSError, TimeoutError):
                failed += 1
                continue
            writer.close()
            accepted += 1
            refused = 0  # listening again (a restart): only refusals in a row count
        if refused < 2:
            log.warning(
                "broker %d: not proven gone (%d accepted, %d failed): its lease decides",
                info.node_id,
                accepted,
                failed,
            )
            return
        now = self.brokers.get(info.node_id)
        if self.last_registered.get(info.node_id) != info or self.store is None:
            return  # it registered again meanwhile (perhaps elsewhere): this proves nothing
        self.proven_gone[info.node_id] = time.monotonic()  # the controller's grace ends here
        if now is None:
            self._changed()  # already unregistered: nothing in etcd will wake the controller
            return
        try:
            if await self.store.revoke_lease(info.lease):
                log.warning(
                    "broker %d is gone (%s:%d refuses connections): its lease revoked",
                    info.node_id,
                    info.host,
                    info.replication_port,
                )
        except ClusterError as e:
            log.info("cannot revoke broker %d's lease: %s", info.node_id, e)

    async def load(self) -> int:
        """Read the whole shared state; returns the revision it was read at."""
        assert self.store is not None
        revision = 0
        brokers, topics, vlogs = {}, {}, {}
        self.reassignments = {}
        self.scram = {}
        self.log_starts = {}
        self.quotas = []
        self.acls = []
        self.controller_id = None
        for key, value, rev in await self.store.get_prefix(self.keys.root):
            revision = max(revision, rev)
            self._apply(key, value, brokers, topics, vlogs, rev)
        now = time.monotonic()
        for gone in set(self.brokers) - set(brokers):
            self.unregistered_at[gone] = now
        self.brokers, self.vlogs = brokers, vlogs
        self._credentials_changed()
        for name in set(self.topics) - set(topics):
            self._topic_changed(name, None)
        for name, t in topics.items():
            self._topic_changed(name, t)
        self._log_starts_changed()
        self._quotas_changed()
        self._acls_changed()
        return revision

    def _apply(self, key: str, value: bytes | None, brokers, topics, vlogs, rev: int = 0) -> None:
        k = self.keys
        if key.startswith(k.scram):
            user = key[len(k.scram) :]
            if value is None:
                self.scram.pop(user, None)
            else:
                self.scram[user] = json.loads(value)
        elif key.startswith(k.reassignments):
            topic, _, index = key[len(k.reassignments) :].rpartition("/")
            if value is None:
                self.reassignments.pop((topic, int(index)), None)
            else:
                r = Reassignment.from_json(topic, int(index), json.loads(value), rev)
                self.reassignments[(topic, int(index))] = r
        elif key == k.quotas:
            self.quotas = json.loads(value) if value is not None else []
        elif key == k.acls:
            self.acls = json.loads(value) if value is not None else []
        elif key == k.controller:
            self.controller_id = int(value) if value is not None else None
        elif key.startswith(k.log_starts):
            topic, _, index = key[len(k.log_starts) :].rpartition("/")
            if value is None:
                self.log_starts.pop((topic, int(index)), None)
            else:
                raw = json.loads(value)
                self.log_starts[(topic, int(index))] = (uuid.UUID(raw["id"]), int(raw["start"]))
        elif key.startswith(k.brokers):
            node = int(key[len(k.brokers) :])
            if value is None:
                if brokers.pop(node, None) is not None:
                    self.unregistered_at[node] = time.monotonic()
            else:
                raw = json.loads(value)
                self.proven_gone.pop(node, None)  # a proof was of an earlier run of it
                brokers[node] = self.last_registered[node] = BrokerInfo(
                    node,
                    raw["host"],
                    raw["port"],
                    raw["incarnation"],
                    raw.get("replication_port", 0),
                    raw.get("lease", 0),
                    {n: (h, p) for n, (h, p) in raw.get("listeners", {}).items()},
                )
        elif key.startswith(k.topics):
            name = key[len(k.topics) :]
            if value is None:
                topics.pop(name, None)
            else:
                topics[name] = ClusterTopic.from_json(name, json.loads(value))
        elif key.startswith(k.vlogs):
            vid = int(key[len(k.vlogs) :])
            if value is None:
                vlogs.pop(vid, None)
            else:
                vlogs[vid] = VirtualLogState.from_json(vid, json.loads(value))

    def _topic_changed(self, name: str, topic: ClusterTopic | None) -> None:
        if topic is None:
            self.topics.pop(name, None)
        else:
            self.topics[name] = topic
        if self.on_topic is not None:
            self.on_topic(name, topic)

    async def _follow(self) -> None:
        """Keep the copy current: one watch on the whole prefix, re-read on any trouble."""
        assert self.store is not None
        while True:
            try:
                revision = await self.load()
                self._changed()
                async for ev in self.store.watch_prefix(self.keys.root, revision + 1):
                    topics = dict(self.topics)
                    self._apply(ev.key, ev.value, self.brokers, topics, self.vlogs, ev.mod_revision)
                    if ev.key.startswith(self.keys.topics):
                        name = ev.key[len(self.keys.topics) :]
                        self._topic_changed(name, topics.get(name))
                    elif ev.key.startswith(self.keys.scram):
                        self._credentials_changed()
                    elif ev.key.startswith(self.keys.log_starts):
                        self._log_starts_changed()
                    elif ev.key == self.keys.quotas:
                        self._quotas_changed()
                    elif ev.key == self.keys.acls:
                        self._acls_changed()
                    else:
                        self._changed()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("cluster watch lost (%s); reading the state again", e)
                await asyncio.sleep(0.5)

    def _credentials_changed(self) -> None:
        if self.on_credentials is not None:
            try:
                self.on_credentials()
            except Exception:
                log.exception("taking over changed SCRAM credentials failed")

    async def alter_scram(
        self, upserts: list[tuple[str, str, dict]], deletes: list[tuple[str, str]]
    ) -> None:
        """Apply AlterUserScramCredentials' changes (credentials as JSON) in one guarded etcd
        transaction over the users they touch, retried while another broker changes them."""
        assert self.store is not None
        users = sorted({u for u, _m, _c in upserts} | {u for u, _m in deletes})
        for _attempt in range(20):
            expect: dict[str, int] = {}
            puts: dict[str, bytes] = {}
            dels: list[str] = []
            new: dict[str, dict] = {}
            for user in users:
                key = self.keys.scram_user(user)
                got = await self.store.get(key)
                expect[key] = got[1] if got is not None else 0
                mechs = dict(json.loads(got[0])) if got is not None else {}
                for u, m in deletes:
                    if u == user:
                        mechs.pop(m, None)
                for u, m, cred in upserts:
                    if u == user:
                        mechs[m] = cred
                new[user] = mechs
                if mechs:
                    puts[key] = _dump(mechs)
                elif got is not None:
                    dels.append(key)
            if await self.store.txn(expect, puts, dels):
                for user, mechs in new.items():  # at once here; the watch brings the same
                    if mechs:
                        self.scram[user] = mechs
                    else:
                        self.scram.pop(user, None)
                self._credentials_changed()
                return
            await asyncio.sleep(0.05)
        raise ClusterError("SCRAM credentials kept changing under this request; try again")

    def _log_starts_changed(self) -> None:
        if self.on_log_start is not None:
            try:
                self.on_log_start()
            except Exception:
                log.exception("moving log starts failed")

    def _quotas_changed(self) -> None:
        if self.on_quotas is not None:
            try:
                self.on_quotas()
            except Exception:
                log.exception("taking the new client quotas failed")

    def _acls_changed(self) -> None:
        if self.on_acls is not None:
            try:
                self.on_acls()
            except Exception:
                log.exception("taking the new ACLs failed")

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:
                log.exception("reacting to a cluster change failed")

    async def leave(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
        if self._watch is not None:
            self._watch.cancel()
            try:
                await self._watch
            except (asyncio.CancelledError, Exception):
                pass
        if self.lease is not None:
            try:
                await self.lease.revoke()
            except Exception as e:  # etcd gone: the lease expires by itself
                log.warning("could not revoke the broker's lease: %s", e)
        if self.store is not None:
            await self.store.close()

    # -- changes -------------------------------------------------------------------------------
    async def _next_ids(self, key: str, count: int, start: int = 1) -> int:
        """Take ``count`` ids from the counter at ``key`` (a guarded read-modify-write)."""
        assert self.store is not None
        while True:
            got = await self.store.get(key)
            first, rev = (int(got[0]), got[1]) if got else (start, 0)
            if await self.store.replace(key, str(first + count).encode(), rev):
                return first

    async def registered_brokers(self) -> list[int]:
        """The node ids registered in etcd now. Read, not the watched copy: a broker that
        registered a moment ago may not have reached this node's watch yet, and a topic
        created then would be refused too few brokers or placed on fewer of them."""
        assert self.store is not None
        prefix = self.keys.brokers
        return sorted(int(k[len(prefix) :]) for k, _v, _r in await self.store.get_prefix(prefix))

    async def create_topic(
        self,
        name: str,
        partitions: int,
        factor: int,
        configs: dict[str, str],
        brokers: list[int] | None = None,
    ) -> ClusterTopic:
        """Create a topic cluster-wide, placed on ``brokers`` (the registered ones, read now,
        unless the caller read them to validate the request: then it places on what it
        checked); raises ValueError for too few brokers and KeyError if the name is taken."""
        assert self.store is not None
        live = brokers if brokers is not None else await self.registered_brokers()
        lists = replica_lists(live, partitions, factor, first=int(time.time()) % max(1, len(live)))
        while True:
            expect = {self.keys.topic(name): 0}
            puts: dict[str, bytes] = {}
            vids, new_logs = await self._plan_logs(lists, expect, puts)
            first_uid = await self._next_ids(self.keys.next_uid, partitions)
            topic = ClusterTopic(
                name,
                uuid.uuid4(),
                list(range(first_uid, first_uid + partitions)),
                vids,
                dict(configs),
            )
            puts[self.keys.topic(name)] = _dump(topic.to_json())
            if await self.store.txn(expect, puts):
                self.vlogs.update(new_logs)
                self._topic_changed(name, topic)
                return topic
            if await self.store.get(self.keys.topic(name)) is not None:
                raise KeyError(name)
            # Another broker made virtual logs meanwhile: plan again on the new state.

    async def _plan_logs(
        self, lists: list[list[int]], expect: dict[str, int], puts: dict[str, bytes]
    ) -> tuple[list[int], dict[int, VirtualLogState]]:
        """The virtual log of each replica list (placement.assign_virtual_logs) as etcd holds
        them now; the new logs and the next id go into ``puts``, guarded in ``expect``. They go
        in the same transaction as the topic, before it, so a watcher meets them first."""
        assert self.store is not None
        vl_items = await self.store.get_prefix(self.keys.vlogs)
        existing = {
            int(k[len(self.keys.vlogs) :]): VirtualLogState.from_json(
                int(k[len(self.keys.vlogs) :]), json.loads(v)
            )
            for k, v, _r in vl_items
        }
        got = await self.store.get(self.keys.next_vid)
        next_vid, vid_rev = (int(got[0]), got[1]) if got else (0, 0)
        vids, new_logs, after = assign_virtual_logs(lists, existing, next_vid)
        if new_logs:
            expect[self.keys.next_vid] = vid_rev
            puts[self.keys.next_vid] = str(after).encode()
            for vid, v in new_logs.items():
                puts[self.keys.vlog(vid)] = _dump(v.to_json())
                expect[self.keys.vlog(vid)] = 0
        return vids, new_logs

    async def add_partitions(self, name: str, total: int, *, split: bool = False) -> ClusterTopic:
        """Grow topic ``name`` to ``total`` partitions in one guarded write. New partitions get
        replica lists as a new topic's would (the topic's replication factor, over the
        registered brokers); a ``split`` (stratalog.splits) puts child ``p + N`` into the
        virtual log of its parent ``p`` instead and records the history. Raises KeyError if
        the topic is gone, ValueError for too few brokers or a count that is no increase,
        SplitError for a split to other than twice the count."""
        assert self.store is not None
        key = self.keys.topic(name)
        while True:
            got = await self.store.get(key)
            if got is None:
                raise KeyError(name)
            t = ClusterTopic.from_json(name, json.loads(got[0]))
            current = len(t.partitions)
            if total <= current:
                raise ValueError(f"topic {name} has {current} partitions, not fewer than {total}")
            expect = {key: got[1]}
            puts: dict[str, bytes] = {}
            new_logs: dict[int, VirtualLogState] = {}
            if split:
                history = next_history(t.configs.get(SPLIT_HISTORY), current, total)
                vids = t.vlogs[: total - current]  # each child in its parent's log
                t.configs[SPLIT_HISTORY] = history
            else:
                first = self.vlogs.get(t.vlogs[0]) if t.vlogs else None
                factor = len(first.replicas) if first is not None else 1
                live = await self.registered_brokers()
                lists = replica_lists(live, total - current, factor, first=current % len(live))
                vids, new_logs = await self._plan_logs(lists, expect, puts)
            first_uid = await self._next_ids(self.keys.next_uid, total - current)
            t.partitions += list(range(first_uid, first_uid + total - current))
            t.vlogs += vids
            puts[key] = _dump(t.to_json())
            if await self.store.txn(expect, puts):
                self.vlogs.update(new_logs)
                self._topic_changed(name, t)
                return t
            # The topic or the logs changed meanwhile: plan again on the new state.

    async def delete_topic(self, name: str) -> bool:
        assert self.store is not None
        got = await self.store.get(self.keys.topic(name))
        if got is None:
            return False
        # Its reassignments and moved log starts go with it.
        prefix = f"{self.keys.reassignments}{name}/"
        moving = [k for k, _v, _r in await self.store.get_prefix(prefix)]
        starts = f"{self.keys.log_starts}{name}/"
        moving += [k for k, _v, _r in await self.store.get_prefix(starts)]
        ok = await self.store.txn(
            {self.keys.topic(name): got[1]}, {}, [self.keys.topic(name), *moving]
        )
        if ok:
            self._topic_changed(name, None)
        return ok

    async def set_topic_configs(
        self, name: str, topic_id: uuid.UUID, changes: dict[str, str | None]
    ) -> bool:
        """Set (None: delete) config overrides of topic ``name`` (if it still has this id),
        guarded by the topic's revision; False if it is gone."""
        assert self.store is not None
        key = self.keys.topic(name)
        while True:
            got = await self.store.get(key)
            if got is None:
                return False
            t = ClusterTopic.from_json(name, json.loads(got[0]))
            if t.topic_id != topic_id:
                return False
            for k, v in changes.items():
                if v is None:
                    t.configs.pop(k, None)
                else:
                    t.configs[k] = v
            if await self.store.replace(key, _dump(t.to_json()), got[1]):
                self._topic_changed(name, t)
                return True

    async def update_quotas(self, change: Callable[[list], list]) -> None:
        """Apply ``change`` to the client quotas as etcd holds them, guarded by the key's
        revision (retried on a concurrent change)."""
        assert self.store is not None
        while True:
            got = await self.store.get(self.keys.quotas)
            current = json.loads(got[0]) if got is not None else []
            new = change(current)
            if new == current:
                return
            if await self.store.replace(self.keys.quotas, _dump(new), got[1] if got else 0):
                self.quotas = new
                self._quotas_changed()
                return

    async def update_acls(self, change: Callable[[list], list]) -> list:
        """Apply ``change`` to the ACLs as etcd holds them, guarded by the key's revision
        (retried on a concurrent change); returns the ACLs as they are now."""
        assert self.store is not None
        while True:
            got = await self.store.get(self.keys.acls)
            current = json.loads(got[0]) if got is not None else []
            new = change(current)
            if new == current:
                return current
            if await self.store.replace(self.keys.acls, _dump(new), got[1] if got else 0):
                self.acls = new
                self._acls_changed()
                return new

    async def record_log_starts(
        self, topic: str, topic_id: uuid.UUID, starts: dict[int, int]
    ) -> bool:
        """Record that the leader moved these partitions' log starts (partition index ->
        offset) forward (DeleteRecords), in one transaction guarded by the topic (same id) and
        each start's key; a start is never moved back. False if the topic is gone."""
        assert self.store is not None
        topic_key = self.keys.topic(topic)
        while True:
            got_topic = await self.store.get(topic_key)
            if got_topic is None or json.loads(got_topic[0])["id"] != str(topic_id):
                return False
            expect = {topic_key: got_topic[1]}
            puts: dict[str, bytes] = {}
            for index, start in sorted(starts.items()):
                key = self.keys.log_start(topic, index)
                got = await self.store.get(key)
                if got is not None:
                    raw = json.loads(got[0])
                    if raw["id"] == str(topic_id) and int(raw["start"]) >= start:
                        continue
                expect[key] = got[1] if got is not None else 0
                puts[key] = _dump({"id": str(topic_id), "start": start})
            if not puts or await self.store.txn(expect, puts):
                return True

    async def allocate_producer_id(self) -> int:
        """A cluster-unique producer id, from blocks this node takes from etcd."""
        nxt, limit = self._producer_ids
        if nxt >= limit:
            nxt = await self._next_ids(self.keys.next_producer, PRODUCER_ID_BLOCK, start=0)
            limit = nxt + PRODUCER_ID_BLOCK
        self._producer_ids = (nxt + 1, limit)
        return nxt

    async def update_vlog(
        self, vid: int, change: Callable[[VirtualLogState], VirtualLogState | None]
    ) -> VirtualLogState | None:
        """Apply ``change`` to virtual log ``vid`` as etcd holds it now, guarded by the revision
        read: retried on a concurrent change; ``change`` returns None to give up. Returns the
        state written (or None)."""
        assert self.store is not None
        key = self.keys.vlog(vid)
        while True:
            got = await self.store.get(key)
            if got is None:
                return None
            now = VirtualLogState.from_json(vid, json.loads(got[0]))
            new = change(now)
            if new is None:
                return None
            if await self.store.replace(key, _dump(new.to_json()), got[1]):
                self.vlogs[vid] = new
                return new

    # -- questions the broker asks -------------------------------------------------------------
    def leaders_named(self) -> dict[int, BrokerInfo]:
        """The brokers clients are told of: the registered ones, and any whose registration
        went less than two lease times ago while etcd still names it the primary of a virtual
        log (paused past its lease, say, before a controller moved its logs: a new controller
        waits a lease time first). Until a new epoch names another primary it is the leader,
        as a Kafka partition's leader stays named until the controller moves it. Left out,
        librdkafka dropped its connection and took the requests in flight for not written,
        though the broker wrote them once it ran again at the same epoch; re-sent under a
        bumped producer epoch they were written twice (the fault harness's duplicates). Past
        that time a primary still named has no in-sync replica to succeed it, and its
        partitions are offline (leader -1), as Kafka's are."""
        named = dict(self.brokers)
        since = time.monotonic() - 2 * LEASE_TTL_S
        for v in self.vlogs.values():
            p = v.primary
            recent = self.unregistered_at.get(p, 0.0) >= since
            if p not in named and p in self.last_registered and recent:
                named[p] = self.last_registered[p]
        return named

    def vlog_of(self, topic: str, index: int) -> VirtualLogState | None:
        t = self.topics.get(topic)
        if t is None or not 0 <= index < len(t.vlogs):
            return None
        return self.vlogs.get(t.vlogs[index])

    def hosts(self, vid: int) -> bool:
        v = self.vlogs.get(vid)
        return v is not None and self.node_id in v.replicas
