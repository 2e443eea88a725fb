"""Replication of virtual logs between brokers (KerA: the log is the unit, not the partition).

The primary of a virtual log pushes every write, byte for byte as stored, to each backup the
moment it is written (``VirtualLog.on_write``), so the backups' fsyncs run beside its own. A
backup checks the epoch (the fencing token) and continuity (segment, position), appends the
same bytes, and acknowledges once its group commit made them durable. An append is committed,
and acks=all answered, when the primary and every in-sync backup have it
(``VirtualLog.require_replicas`` / ``replica_acked``).

A link to a backup starts with a Fence at the primary's epoch: the backup promises the epoch
(durably: it refuses older epochs from then on, so a deposed primary can never again collect an
acknowledgement) and says where its log ends. A longer log is cut back to the primary's end
(KIP-101's rule, one cut for every partition in the log); a shorter one is sent what it lacks
from the primary's segment files, then follows live. A backup that has caught up joins the
in-sync set; one that falls ``replica.lag.time.max.ms`` behind leaves it. Both are etcd
transactions at the current epoch, made by the primary.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable

from stratalog.cluster.damage_repair import DamageRepair
from stratalog.cluster.node import ClusterNode
from stratalog.cluster.placement import VirtualLogState
from stratalog.protocol.replication import (
    CLOSED,
    NEED_DATA,
    REFUSED_CORRUPT,
    REFUSED_GAP,
    REFUSED_STALE_EPOCH,
    REFUSED_STORAGE,
    Ack,
    Append,
    Commit,
    Fence,
    FenceAck,
    Migrated,
    ProtocolError,
    Refused,
    ReplicationConnection,
    encode,
)
from stratalog.storage.journal import StorageFailure
from stratalog.storage.log_store import LogStore
from stratalog.storage.replica import (
    CorruptReplica,
    PositionUnavailable,
    ReplicaGap,
    StaleEpoch,
    parting_point,
)
from stratalog.storage.virtual_log import VirtualLog

log = logging.getLogger(__name__)

CATCH_UP_BYTES = 1024 * 1024  # one message of a lagging backup's catch-up
MAX_MESSAGE = 64 * 1024 * 1024
NO_CUT = (-1, -1)


class _Peer:
    """The primary's stream connection to a backup, with the replication codec on top (the
    backup's end is a _BackupConnection)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.codec = ReplicationConnection(MAX_MESSAGE)

    def send(self, msg) -> None:
        # Called from durability callbacks too: a peer that went away is not their problem.
        if self.writer.is_closing():
            return
        try:
            self.writer.writelines(encode(msg))
        except (RuntimeError, OSError) as e:
            log.debug("replication peer gone: %s", e)

    async def receive(self):
        while True:
            ev = self.codec.next_event()
            if ev is CLOSED:
                raise ConnectionError("peer closed the connection")
            if ev is not NEED_DATA:
                return ev
            self.codec.receive_data(await self.reader.read(256 * 1024))

    def close(self) -> None:
        self.writer.close()


class BackupLink:
    """The primary's link to one backup of one virtual log."""

    def __init__(self, primary: PrimaryLog, backup: int) -> None:
        self.primary = primary
        self.backup = backup
        self.peer: _Peer | None = None
        self.live = False
        self.acked = 0  # primary LSN the backup has durably
        self.caught_up_at = time.monotonic()
        self.joined_lsn = -1  # LSN at which it went live (acks from there make it in sync)
        self.joined = False  # it acknowledged everything up to joined_lsn
        self.catch_up_started = 0.0  # when a catch-up that sent bytes began (for its log line)
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except (OSError, ConnectionError, ProtocolError, asyncio.IncompleteReadError) as e:
                log.info(
                    "%s: link to backup %d lost: %s",
                    self.primary.vlog.name,
                    self.backup,
                    e,
                )
                if self.peer is not None:  # a session that was up ended: dead? out of sync now
                    self.primary.node.suspect(self.backup)
            except _Deposed:
                self.primary.deposed()
                return
            except Exception:
                log.exception("%s: link to backup %d failed", self.primary.vlog.name, self.backup)
            finally:
                self.live = False
                self.joined = False
                if self.peer is not None:
                    self.peer.close()
                    self.peer = None
            await asyncio.sleep(0.2)

    async def _session(self) -> None:
        p = self.primary
        info = p.node.brokers.get(self.backup)
        if info is None or not info.replication_port:
            raise ConnectionError(f"broker {self.backup} is not registered")
        tls = p.tls
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                info.host,
                info.replication_port,
                ssl=tls,
                server_hostname=info.host if tls else None,
            ),
            5,
        )
        peer = self.peer = _Peer(reader, writer)
        name, epoch = p.vlog.name, p.epoch
        peer.send(Fence(name, epoch, *NO_CUT))
        ack = await self._fenced(peer)
        end = (ack.end_seq, ack.end_position)
        # KIP-101: the backup's bytes agree with ours up to where our histories part; past
        # that they were never committed, and go.
        agree = parting_point(p.vlog.epoch_history, p.vlog.end, ack.history, end)
        if agree < end:
            peer.send(Fence(name, epoch, *agree))
            ack = await self._fenced(peer)
            end = (ack.end_seq, ack.end_position)
        reading = asyncio.ensure_future(self._read_acks(peer))
        try:
            await self._catch_up(peer, end)
            await reading
        finally:
            reading.cancel()

    async def _fenced(self, peer: _Peer) -> FenceAck:
        msg = await asyncio.wait_for(peer.receive(), 10)
        if isinstance(msg, Refused):
            if msg.error == REFUSED_STALE_EPOCH and msg.epoch > self.primary.epoch:
                raise _Deposed()
            # An older epoch: the backup still leads the log at it, not having seen etcd move
            # the primary here yet (a preferred election or a hand-over); try again shortly.
            raise ConnectionError(f"fence refused: {msg.error} at epoch {msg.epoch}")
        if not isinstance(msg, FenceAck):
            raise ProtocolError(f"expected FenceAck, got {type(msg).__name__}")
        return msg

    async def _catch_up(self, peer: _Peer, pos: tuple[int, int]) -> None:
        """Send what the backup lacks from the segment files, then follow live."""
        vlog = self.primary.vlog
        t0, sent = time.monotonic(), 0
        while pos < vlog.end:
            try:
                msg = catch_up_append(vlog, self.primary.epoch, pos)
            except PositionUnavailable as e:
                # Retention took what it lacks: it starts again from our oldest segment.
                first = (e.first_seq, e.first_position)
                peer.send(Fence(vlog.name, self.primary.epoch, *first))
                await self._fenced(peer)
                pos = first
                continue
            if msg is None:
                break
            peer.send(msg)
            pos = (msg.seq, msg.position + msg.nbytes)
            sent += msg.nbytes
            await peer.writer.drain()
            if self.primary.closed:
                return
        if sent:
            secs = time.monotonic() - t0
            self.catch_up_started = t0
            log.info(
                "%s: sent backup %d a catch-up of %.1f MB in %.2f s (%.0f MB/s)",
                vlog.name,
                self.backup,
                sent / 1e6,
                secs,
                sent / 1e6 / max(secs, 1e-6),
            )
        # From here every write is pushed as it happens (no await since the check above).
        self.live = True
        self.joined_lsn = vlog.lsn
        end = vlog.end
        peer.send(Append(vlog.name, self.primary.epoch, end[0], end[1], vlog.lsn, b""))
        self.primary.send_commit(self)
        self.primary.tell_cold(self)

    async def _read_acks(self, peer: _Peer) -> None:
        vlog = self.primary.vlog
        while True:
            msg = await peer.receive()
            if isinstance(msg, Ack):
                if msg.epoch != self.primary.epoch:
                    continue
                if msg.lsn > self.acked:
                    self.acked = msg.lsn
                    vlog.replica_acked(self.backup, msg.lsn)
                if msg.lsn >= vlog.lsn:
                    self.caught_up_at = time.monotonic()
                if self.live and msg.lsn >= self.joined_lsn:
                    if not self.joined and self.catch_up_started:
                        log.info(
                            "%s: backup %d has all of it, %.2f s after the catch-up began",
                            vlog.name,
                            self.backup,
                            time.monotonic() - self.catch_up_started,
                        )
                        self.catch_up_started = 0.0
                    self.joined = True
                    self.primary.in_sync(self.backup)
            elif isinstance(msg, Refused):
                if msg.error == REFUSED_STALE_EPOCH and msg.epoch > self.primary.epoch:
                    raise _Deposed()
                raise ConnectionError(f"append refused: {msg.error} at epoch {msg.epoch}")

    def ship(self, seq: int, position: int, parts: list, lsn_end: int) -> None:
        peer = self.peer
        if not self.live or peer is None:
            return
        peer.send(Append(self.primary.vlog.name, self.primary.epoch, seq, position, lsn_end, parts))

    def close(self) -> None:
        self.task.cancel()


def catch_up_append(
    vlog: VirtualLog, epoch: int, pos: tuple[int, int], max_bytes: int = CATCH_UP_BYTES
) -> Append | None:
    """The next Append of a catch-up from ``pos`` (None: nothing left): frames read from the
    segment files, never past the end of the epoch they were written in, and sent as that
    epoch's (``data_epoch``) so the backup's epoch history becomes a copy of ours."""
    seq, position, data = vlog.read_range(pos[0], pos[1], max_bytes)
    if not data:
        return None
    written, following = vlog.epoch_at(seq, position)
    if following is not None and following[0] == seq:
        data = data[: following[1] - position]  # epochs start at frame boundaries
    return Append(vlog.name, epoch, seq, position, 0, data, written)


class _Deposed(Exception):
    """A backup promised a newer epoch: this broker is no longer the primary."""


class PrimaryLog:
    """This broker leads one virtual log at ``epoch``: links to every backup, the in-sync set
    it keeps in etcd, and the commit rule it hands to storage."""

    def __init__(
        self,
        node: ClusterNode,
        state: VirtualLogState,
        vlog: VirtualLog,
        lag_ms: int,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.node = node
        self.tls = tls  # the client side of mutual TLS to the backups, if on
        self.vid = state.vid
        self.epoch = state.epoch
        self.vlog = vlog
        self.lag_s = lag_ms / 1000
        self.closed = False
        self.paused = False  # unregistered (its lease lost): takes no write until it is back
        self._isr_busy = False
        self._isr_task: asyncio.Future | None = None
        others = [r for r in state.replicas if r != node.node_id]
        self.links = {b: BackupLink(self, b) for b in others}
        # What this log took as a backup beyond its old primary's commit point is committed
        # only once the in-sync set acknowledges it (or it leads alone).
        vlog.require_replicas(
            [b for b in state.isr if b != node.node_id],
            committed=vlog.lsn_at(*min(vlog.primary_commit, vlog.end)),
        )
        self._commit_sent = -1
        self._commit_soon = False
        vlog.on_write = self._written
        vlog.leading = True
        self._lag_task = asyncio.ensure_future(self._watch_lag())

    def _written(self, seq: int, position: int, parts: list, lsn_end: int) -> None:
        for link in self.links.values():
            link.ship(seq, position, parts, lsn_end)
        self.vlog.when_durable(lsn_end, self._committed)

    def _committed(self, ok: bool) -> None:
        # One Commit per loop turn however many writes it released.
        if ok and not self._commit_soon and not self.closed:
            self._commit_soon = True
            asyncio.get_running_loop().call_soon(self.send_commit)

    def send_commit(self, link: BackupLink | None = None, *, again: bool = False) -> None:
        """Tell the backups (or one that just went live) the commit point, as a position;
        ``again``: even if it has not moved (the heartbeat of an idle log)."""
        self._commit_soon = False
        lsn = self.vlog.committed
        if self.closed or lsn <= 0 or (link is None and not again and lsn <= self._commit_sent):
            return  # (LSN 0: nothing committed at this epoch yet)
        self._commit_sent = max(self._commit_sent, lsn)
        msg = Commit(self.vlog.name, self.epoch, *self.vlog.position_at(lsn))
        for each in [link] if link is not None else self.links.values():
            if each.live and each.peer is not None:
                each.peer.send(msg)

    def tell_cold(self, link: BackupLink | None = None) -> None:
        """Tell the backups (or one that just went live) where this log's hot segments begin
        now: what is before has gone to the cold tier (cluster/tiers.py)."""
        if self.closed or not self.vlog.segments:
            return
        msg = Migrated(self.vlog.name, self.epoch, min(self.vlog.segments))
        for each in [link] if link is not None else self.links.values():
            if each.live and each.peer is not None:
                each.peer.send(msg)

    def state(self) -> VirtualLogState | None:
        return self.node.vlogs.get(self.vid)

    def in_sync(self, backup: int) -> None:
        st = self.state()
        if st is None or backup in st.isr or self._isr_busy:
            return
        if backup not in self.node.brokers:
            # Not registered (its lease lost while its link to us lives on): the controller
            # drops it from every in-sync set, so naming it would only start a tug of war.
            return
        # Commits wait for it from now on, before etcd names it in sync: once named, it may be
        # elected, so it must already hold everything committed from then on.
        self.vlog.require_replicas([b for b in [*st.isr, backup] if b != self.node.node_id])
        self._change_isr(lambda isr: [*isr, backup] if backup not in isr else None)

    def _change_isr(self, change) -> None:
        self._isr_busy = True

        def apply(now: VirtualLogState) -> VirtualLogState | None:
            if now.epoch != self.epoch or now.primary != self.node.node_id:
                return None
            isr = change(list(now.isr))
            if isr is None:
                return None
            return VirtualLogState(now.vid, now.replicas, now.primary, now.epoch, isr)

        async def run() -> None:
            try:
                new = await self.node.update_vlog(self.vid, apply)
                if new is not None and not self.closed:
                    log.info("%s: in-sync set now %s", self.vlog.name, new.isr)
                now = self.state()
                if now is not None and not self.closed:
                    # What etcd holds now (a failed join falls back to the set without it).
                    self.vlog.require_replicas([b for b in now.isr if b != self.node.node_id])
            except Exception as e:
                log.warning("%s: cannot change the in-sync set: %s", self.vlog.name, e)
            finally:
                self._isr_busy = False

        self._isr_task = asyncio.ensure_future(run())

    async def _watch_lag(self) -> None:
        """Drop a backup that has not caught up for replica.lag.time.max.ms (Kafka's rule)."""
        while not self.closed:
            await asyncio.sleep(min(1.0, self.lag_s / 4))
            # A heartbeat: a backup fenced by a newer primary refuses it, so a primary replaced
            # while cut from etcd stops answering reads as the leader even if no write comes.
            self.send_commit(again=True)
            st = self.state()
            if st is None or self._isr_busy:
                continue
            now = time.monotonic()
            for b, link in self.links.items():
                if link.acked >= self.vlog.lsn:
                    link.caught_up_at = now
                if link.joined and b not in st.isr and b in self.node.brokers:
                    self.in_sync(b)  # a join that met another in-sync change is tried again
                    break
                if b in st.isr and now - link.caught_up_at > self.lag_s:
                    log.warning(
                        "%s: backup %d is %.1f s behind: out of the in-sync set",
                        self.vlog.name,
                        b,
                        now - link.caught_up_at,
                    )
                    # It joins again only by acknowledging everything up to here, as a new
                    # backup does: a link that froze (a partition resets nothing) would
                    # otherwise still count as joined and be named in sync a moment later.
                    link.joined = False
                    link.joined_lsn = self.vlog.lsn
                    self._change_isr(lambda isr, b=b: [x for x in isr if x != b])
                    break

    def pause(self) -> None:
        """This broker lost its registration (its lease ended, say in an etcd outage): take no
        new write, as the controller may be moving the log on, but keep what is in flight. If
        etcd still names it primary at this epoch once it is registered again, it resumes
        where it was; closing here instead failed the writes in flight (NOT_LEADER_OR_FOLLOWER,
        which librdkafka takes for not persisted, and re-sent under a bumped producer epoch:
        duplicates) and made it lead again at a new epoch, whose validation made librdkafka
        drop records it had fetched but not yet handed over (the soak's poll-skip)."""
        if not self.closed and not self.paused:
            log.info("%s: paused at epoch %d while unregistered", self.vlog.name, self.epoch)
            self.paused = True
            self.vlog.leading = False

    def resume(self) -> None:
        if not self.closed and self.paused:
            log.info("%s: resumed at epoch %d", self.vlog.name, self.epoch)
            self.paused = False
            self.vlog.leading = True

    def deposed(self, why: str = "a backup holds a newer epoch") -> None:
        """Proof that etcd moved the log on (epochs come only from its guarded writes): stop
        leading now, not once this broker's copy of etcd says so, which for a broker cut from
        etcd can be long after its backups were fenced (a zombie answering reads and fences as
        the primary meanwhile). Etcd's copy names it again only at a newer epoch."""
        if self.closed:
            return
        log.warning("%s: %s than %d: no longer primary", self.vlog.name, why, self.epoch)
        self.close(fail_waiters=True)

    def close(self, *, fail_waiters: bool) -> None:
        if self.closed:  # deposed already: the log may be a backup's by now, not to be touched
            return
        self.closed = True
        self._lag_task.cancel()
        for link in self.links.values():
            link.close()
        self.vlog.on_write = None
        # What it committed stays known committed (the commit checkpoint keeps it).
        self.vlog.primary_commit = self.vlog.commit_point
        self.vlog.leading = False
        if fail_waiters:
            self.vlog.abandon_waiters()
        self.vlog.require_replicas([])


class Replicator:
    """This broker's part in replication: a PrimaryLog for each virtual log it leads, and the
    server its primaries push to for the logs it backs up."""

    def __init__(
        self,
        node: ClusterNode,
        store: LogStore,
        lag_ms: int,
        tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None,
    ) -> None:
        self.node = node
        self.store = store
        self.lag_ms = lag_ms
        self.tls = tls  # (server, client) contexts: mutual TLS between brokers, or plain TCP
        self.primaries: dict[int, PrimaryLog] = {}
        self._server: asyncio.Server | None = None
        self._peers: set[_BackupConnection] = set()
        self._closing = False
        self._restarting: set[int] = set()
        # Called with (log name, settled) after this broker starts leading a log (the offsets
        # table reloads then), settled once what the log held then is committed (at once if
        # it was), when it is called again.
        self.on_lead: Callable[[str, bool], None] | None = None
        # Called with (log name, first hot seq) when a primary says where its hot tier begins.
        self.on_cold: Callable[[str, int], None] | None = None
        self._tasks: set[asyncio.Future] = set()
        self.repair = DamageRepair(node, store)

    async def start(self, host: str, port: int = 0) -> int:
        """Listen for primaries on ``host``:``port`` (0: a free port); returns the port."""
        server_tls = self.tls[0] if self.tls else None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _BackupConnection(self), host, port, ssl=server_tls
        )
        return self._server.sockets[0].getsockname()[1]

    def reconcile(self) -> None:
        """Lead what etcd says this broker leads, and nothing else."""
        me = self.node.node_id
        for vid, st in list(self.node.vlogs.items()):
            current = self.primaries.get(vid)
            if st.primary == me and me in self.node.brokers:
                if current is not None and current.epoch == st.epoch:
                    if not current.closed:  # (closed: deposed at this epoch, see deposed())
                        current.resume()
                        # The controller may have dropped a dead backup from the in-sync set.
                        current.vlog.require_replicas([b for b in st.isr if b != me])
                    continue
                if current is not None:
                    current.close(fail_waiters=True)
                    del self.primaries[vid]
                if self.store.open_log(st.log_name).promised_epoch >= st.epoch:
                    # This broker led at this epoch before a restart: what it wrote then may
                    # not be what its backups have. It leads again only at a new epoch, and
                    # only if no other in-sync replica is there to take over.
                    self._restarted(st)
                    continue
                self._lead(st)
            elif current is not None and st.primary == me and st.epoch == current.epoch:
                current.pause()  # named still, but not registered: see pause()
            elif current is not None:
                log.info("%s: no longer primary (epoch %d)", current.vlog.name, st.epoch)
                current.close(fail_waiters=True)
                del self.primaries[vid]
            if st.primary != me and me in st.replicas:
                self.repair.check(st, self.reconcile)

    def leads(self, vid: int, epoch: int) -> bool:
        """Whether this broker runs the primary of ``vid`` at ``epoch`` now: etcd naming it is
        not enough (between losing its registration and leading again it must take no write,
        or it would commit alone what the next primary never saw)."""
        p = self.primaries.get(vid)
        return p is not None and p.epoch == epoch and not p.closed and not p.paused

    def _restarted(self, st: VirtualLogState) -> None:
        """A primary back from a crash before the controller moved its log on (a restart
        within its lease, whose old registration went just before the new one came) hands the
        log to a registered in-sync peer at a new epoch and leaves the in-sync set, to rejoin
        as a backup once caught up, as Kafka's controller treats a broker back from an unclean
        shutdown (KIP-966). Whether the controller or the restart acted first then no longer
        decides who leads. Alone in sync, it leads again itself at a new epoch."""
        if st.vid in self._restarting:
            return
        self._restarting.add(st.vid)
        me = self.node.node_id

        def hand_over(now: VirtualLogState) -> VirtualLogState | None:
            if now.primary != me or now.epoch != st.epoch:
                return None
            peer = next((r for r in now.isr if r != me and r in self.node.brokers), None)
            if peer is None:
                return VirtualLogState(now.vid, now.replicas, me, now.epoch + 1, now.isr)
            isr = [r for r in now.isr if r != me]
            return VirtualLogState(now.vid, now.replicas, peer, now.epoch + 1, isr)

        async def run() -> None:
            try:
                new = await self.node.update_vlog(st.vid, hand_over)
                if new is not None:
                    led = (st.log_name, new.epoch, new.primary)
                    log.info("%s: epoch %d after a restart, led by %d", *led)
            except Exception as e:
                log.warning("%s: cannot start a new epoch: %s", st.log_name, e)
            finally:
                self._restarting.discard(st.vid)
                self.reconcile()

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _lead(self, st: VirtualLogState) -> None:
        vlog = self.store.open_log(st.log_name)
        try:
            vlog.begin_epoch(st.epoch)
        except StaleEpoch:
            log.warning("%s: etcd says epoch %d, a newer one was promised", vlog.name, st.epoch)
            return
        primary = PrimaryLog(self.node, st, vlog, self.lag_ms, self.tls[1] if self.tls else None)
        self.primaries[st.vid] = primary
        # What this log holds is committed once the in-sync set has it too; its partitions'
        # high watermarks follow then (a new primary's tail may be more than was committed).
        end_lsn = vlog.lsn
        for p in self.store.partitions.values():
            if p.vlog is vlog:
                nxt = p.next_offset
                vlog.when_durable(
                    end_lsn, lambda ok, p=p, n=nxt: ok and p.advance_high_watermark(n)
                )
        log.info("%s: primary at epoch %d, in sync %s", vlog.name, st.epoch, st.isr)
        settled = vlog.committed >= end_lsn
        self._led(vlog.name, settled)
        if not settled:
            # Records past the commit point it knew become visible only now: read them too.
            vlog.when_durable(end_lsn, lambda ok: ok and self._led(vlog.name, True))

    def _led(self, name: str, settled: bool) -> None:
        if self.on_lead is not None:
            try:
                self.on_lead(name, settled)
            except Exception:
                log.exception("%s: reacting to the new leadership failed", name)

    async def hand_over(self) -> None:
        """A clean stop: give each log this broker leads to another in-sync replica first
        (epoch + 1, this broker out of the in-sync set), so producers see a leader change and
        retry instead of waiting for the lease to expire."""
        me = self.node.node_id

        def move(now: VirtualLogState) -> VirtualLogState | None:
            others = [r for r in now.isr if r != me and r in self.node.brokers]
            if now.primary != me or not others:
                return None
            return VirtualLogState(now.vid, now.replicas, others[0], now.epoch + 1, others)

        for vid in list(self.primaries):
            try:
                new = await self.node.update_vlog(vid, move)
            except Exception as e:  # etcd unreachable: the lease will expire instead
                log.warning("cannot hand over virtual log g%d: %s", vid, e)
                continue
            if new is not None:
                log.info("g%d handed over to %d at epoch %d", vid, new.primary, new.epoch)
        self.reconcile()

    async def close(self) -> None:
        self._closing = True
        for p in self.primaries.values():
            p.close(fail_waiters=True)
        self.primaries.clear()
        if self._server is not None:
            self._server.close()
        for c in list(self._peers):
            c.close()

    # -- the backup's side ---------------------------------------------------------------------
    def _handle(self, peer: _BackupConnection, msg) -> None:
        if isinstance(msg, Fence):
            self._on_fence(peer, msg)
        elif isinstance(msg, Append):
            self._on_append(peer, msg)
        elif isinstance(msg, Commit):
            self._on_commit(peer, msg)
        elif isinstance(msg, Migrated):
            self._on_migrated(msg)

    def _primary_gone(self, name: str) -> None:
        """A primary's connection to us ended: if its process died, fail over now."""
        if self._closing:
            return
        primary = next((s.primary for s in self.node.vlogs.values() if s.log_name == name), -1)
        if primary >= 0:
            self.node.suspect(primary)

    def _leading(self, name: str) -> PrimaryLog | None:
        return next(
            (p for p in self.primaries.values() if p.vlog.name == name and not p.closed), None
        )

    def _leads(self, name: str) -> bool:
        return self._leading(name) is not None

    def primary_of(self, name: str) -> object | None:
        """This broker's primary of log ``name`` (an identity: a new one starts a new
        leadership), None if it leads it no longer (paused still leads)."""
        return self._leading(name)

    def _on_fence(self, peer: _BackupConnection, msg: Fence) -> None:
        name = msg.vlog
        vlog = self.store.open_log(name)
        leading = self._leading(name)
        if leading is not None and msg.epoch > leading.epoch:
            leading.deposed("a primary fences it at a newer epoch")
        elif leading is not None:
            peer.send(Refused(name, vlog.promised_epoch, REFUSED_STALE_EPOCH))
            return
        try:
            vlog.promise_epoch(msg.epoch)
        except StaleEpoch:
            peer.send(Refused(name, vlog.promised_epoch, REFUSED_STALE_EPOCH))
            return
        if (msg.truncate_seq, msg.truncate_position) != NO_CUT:
            cut = (msg.truncate_seq, msg.truncate_position)
            if vlog.end > cut:
                log.warning(
                    "%s: cut back from %s to %s at epoch %d", name, vlog.end, cut, msg.epoch
                )
                try:
                    self.store.truncate_log(name, *cut)
                except ValueError as e:  # not a frame boundary here: the histories lie
                    log.error("%s: cannot cut where the primary says: %s", name, e)
                    peer.send(Refused(name, msg.epoch, REFUSED_CORRUPT))
                    return
        if not self.repair.cut_at_fence(name, msg.epoch):
            # Damaged and still named in sync: no Fence completes (so nothing is acknowledged)
            # until it has left the in-sync set; the primary tries again.
            self.repair.check_log(name, self.reconcile)
            peer.send(Refused(name, msg.epoch, REFUSED_CORRUPT))
            return
        peer.send(FenceAck(name, msg.epoch, *vlog.end, vlog.epoch_history))

    def _on_commit(self, peer: _BackupConnection, msg: Commit) -> None:
        vlog = self.store.open_log(msg.vlog)
        if msg.epoch < vlog.promised_epoch:  # from a replaced primary: tell it (it steps down)
            peer.send(Refused(msg.vlog, vlog.promised_epoch, REFUSED_STALE_EPOCH))
        elif msg.epoch == vlog.promised_epoch and not self._leads(msg.vlog):
            vlog.commit_to(msg.seq, msg.position)

    def _on_migrated(self, msg: Migrated) -> None:
        vlog = self.store.open_log(msg.vlog)
        if msg.epoch == vlog.promised_epoch and not self._leads(msg.vlog) and self.on_cold:
            self.on_cold(msg.vlog, msg.first_hot_seq)

    def _on_append(self, peer: _BackupConnection, msg: Append) -> None:
        name = msg.vlog
        vlog = self.store.open_log(name)
        if msg.epoch != vlog.promised_epoch or self._leads(name):
            peer.send(Refused(name, vlog.promised_epoch, REFUSED_STALE_EPOCH))
            return
        try:
            lsn = vlog.append_replica(
                msg.seq, msg.position, _joined(msg.data), epoch=msg.epoch, data_epoch=msg.written_in
            )
        except ReplicaGap as e:
            peer.send(Refused(name, msg.epoch, REFUSED_GAP, e.expected_seq, e.expected_position))
            return
        except CorruptReplica as e:
            log.error("%s: corrupt frames from the primary: %s", name, e)
            peer.send(Refused(name, msg.epoch, REFUSED_CORRUPT))
            return
        except StaleEpoch:
            peer.send(Refused(name, vlog.promised_epoch, REFUSED_STALE_EPOCH))
            return
        except StorageFailure as e:
            log.error("%s: cannot append replicated frames: %s", name, e)
            peer.send(Refused(name, msg.epoch, REFUSED_STORAGE))
            return
        if msg.lsn_end <= 0 and msg.data:
            # Catch-up: unacknowledged; the empty Append that ends it is (after all of it).
            return
        epoch, lsn_end = msg.epoch, msg.lsn_end

        def durable(ok: bool) -> None:
            if ok:
                end = vlog.end
                peer.send(Ack(name, epoch, lsn_end, end[0], end[1]))

        vlog.when_durable(lsn, durable)


class _BackupConnection(asyncio.BufferedProtocol):
    """The backup's end of a primary's connection. Bytes are received straight into the
    codec's buffers (an Append's data into a buffer of its own, which the segment write then
    takes as it is: no copy in between), and each message is handled as it completes, on the
    loop: reading goes no faster than the writes it feeds."""

    def __init__(self, replicator: Replicator) -> None:
        self.replicator = replicator
        self.codec = ReplicationConnection(MAX_MESSAGE)
        self.transport: asyncio.Transport | None = None
        self.name = ""  # the log of the last message: whose primary to suspect when it ends
        self._closed = False  # close() was called: nothing more is handled

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.replicator._closing:
            self.close()
            return
        self.replicator._peers.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.codec.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        if self._closed:
            return  # (a TLS transport may still deliver what it had decrypted)
        try:
            self.codec.buffer_updated(nbytes)
            self._handle_all()
        except ProtocolError as e:
            log.warning("replication connection from a primary of %s: %s", self.name or "?", e)
            self.close()
        except Exception:
            log.exception("replication connection from a primary of %s failed", self.name or "?")
            self.close()

    def eof_received(self) -> bool:
        if self._closed:
            return False
        try:
            self.codec.receive_data(b"")
            self._handle_all()
        except ProtocolError as e:
            log.warning("replication connection from a primary of %s: %s", self.name or "?", e)
        return False  # close our end too

    def _handle_all(self) -> None:
        while self.transport is not None and not self._closed:
            msg = self.codec.next_event()
            if msg is NEED_DATA or msg is CLOSED:
                return
            self.name = msg.vlog
            self.replicator._handle(self, msg)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        # Durability callbacks may keep this object a while: not the frame buffers with it.
        self.codec = ReplicationConnection(MAX_MESSAGE)
        self.replicator._peers.discard(self)
        self.replicator._primary_gone(self.name)

    def send(self, msg) -> None:
        # Called from durability callbacks too: a primary that went away is not their problem.
        t = self.transport
        if t is None or t.is_closing():
            return
        t.writelines(encode(msg))

    def close(self) -> None:
        self._closed = True
        if self.transport is not None:
            self.transport.close()


def _joined(data) -> bytes | memoryview:
    if isinstance(data, bytes | bytearray | memoryview):
        return data
    return b"".join(data)
