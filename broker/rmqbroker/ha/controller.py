"""Replication control: the broker's role, its HA client/server and metadata sync, and role changes.

Owns what changes when a broker is promoted, demoted or re-pointed at runtime (POST /role,
POST /ha/master) so that none of it needs a process restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from rmqbroker.config import BrokerSettings
from rmqbroker.ha.epoch import EpochError, EpochStore
from rmqbroker.ha.master import HAConfig, HAService
from rmqbroker.ha.metadata_sync import MetadataSyncError, SlaveMetadataSync
from rmqbroker.ha.slave import HAClient
from rmqbroker.outer_api import BrokerOuterApi
from rmqbroker.processors.context import BrokerContext
from rmqbroker.store.errors import StoreFullError
from rmqbroker.store.message_store import ROLES

log = logging.getLogger(__name__)

# A slave that learns its master from the nameserver and cannot follow it asks the nameserver
# again (a registration without its topic table, which no nameserver takes from a slave) at most
# this often: as often as a slave whose answer named no master.
MASTER_LOST_REGISTER_SECONDS = 3.0
# A promotion slower than this logs how long each of its steps took.
SLOW_PROMOTION_SECONDS = 1.0
# The last metadata round of a hand-over's promotion waits at most this long for the old master.
FINAL_SYNC_SECONDS = 5.0

# A gauge's samples for /metrics: (label values, value) each.
Samples = list[tuple[tuple[str, ...], float]]


class RoleChangeError(ValueError):
    """A role or master change that must be refused (stale epoch, bad arguments)."""


def _check_deadline(not_after_ms: int | None) -> None:
    if not_after_ms is not None and time.time() * 1000 > not_after_ms:
        raise RoleChangeError(f"role change request expired (notAfterMillis {not_after_ms} has passed)")


class ReplicationController:
    """HA master listener (always on), slave-side HA client and metadata sync (slaves only)."""

    def __init__(self, ctx: BrokerContext, settings: BrokerSettings, epochs: EpochStore, api: BrokerOuterApi,
                 on_role_change: Callable[[str], None], request_register: Callable[[], None] | None = None) -> None:
        # request_register: asks for a registration whose answer names the master (Broker.request_master_query).
        self.ctx = ctx
        self.settings = settings
        self.epochs = epochs
        self.store = ctx.store
        self._on_role_change = on_role_change
        self.ha = HAService(self.store, HAConfig(
            listen_host=settings.listenHost,
            listen_port=settings.ha_port,
            transfer_batch_size=settings.haTransferBatchSize,
            heartbeat_interval=settings.haSendHeartbeatInterval / 1000,
            housekeeping_interval=settings.haHousekeepingInterval / 1000,
            slave_fallbehind_max=settings.haSlaveFallbehindMax,
            sync_timeout=settings.syncFlushTimeout / 1000,
            push_after_ack=settings.haPushAfterAck,
        ), epochs, role=lambda: ctx.role)
        self.ha.broker_addr = settings.broker_addr
        group = (settings.brokerName, settings.brokerClusterName)
        self.ha.group = group
        self.store.add_arrival_listener(self.ha.notify_data)
        self.ha_client = HAClient(self.store, settings.haMasterAddress or None,
                                  heartbeat_interval=settings.haSendHeartbeatInterval / 1000,
                                  housekeeping_interval=settings.haHousekeepingInterval / 1000,
                                  epochs=epochs, truncate=self._truncate, on_master_lost=self._master_lost,
                                  on_following=self._master_following, group=group,
                                  retry_soon=ctx.offsets.awaits_hand_over)
        self.metadata_sync = SlaveMetadataSync(
            api, settings.broker_addr, ctx.topics, ctx.groups, ctx.offsets, ctx.delay_offsets,
            initial_delay=settings.slaveSyncInitialDelay / 1000, interval=settings.slaveSyncInterval / 1000,
            on_topic_deleted=self.store.delete_topic_queues, on_master_deletions=self.store.apply_topic_deletions,
            stream_refusal=self._stream_refusal, own_log_id=lambda: self.epochs.log_id)
        # An explicitly configured or injected master is not overridden by the nameserver (an
        # injected one only until this broker is promoted).
        self.pinned_master = bool(settings.haMasterAddress)
        self._request_register = request_register
        self._followed_before = False  # whether the HA link ever streamed from a master
        self._master_lost_asked = float("-inf")  # monotonic time of the last registration it asked for
        self._lock = asyncio.Lock()
        # When (monotonic) this broker last stopped being a master (a slave relaying writes waits
        # for its new master shortly after; processors/relay.py).
        self.demoted_at: float | None = None

    def relay_target(self) -> str | None:
        """The broker address of the master this slave streams from now, or None: a TCP connection
        alone is no master (the peer may be a slave, or a broker that never answers the handshake)."""
        if not self.ctx.is_slave or not self.ha_client.streaming:
            return None
        # The master's own word in the handshake; the metadata sync's address (a re-point's
        # brokerAddress, the nameserver's answer) may name another broker (a re-point with the HA
        # address only) and is left for masters that do not tell it (Java's, older ones).
        return self.ha_client.master_broker_addr or self.metadata_sync.master_addr

    def _stream_refusal(self) -> str | None:
        """Why the metadata sync takes nothing from the followed master now: the HA link refused
        its log (another log, an older term, a slave), so its tables are not this log's. Between
        a master's restart and the link's next handshake the log identity in the topic table's
        answer decides (SlaveMetadataSync)."""
        refusal = self.ha_client.refusal
        return f"its HA stream is refused ({refusal})" if refusal is not None else None

    def _truncate(self, offset: int) -> None:
        """Cut this log at ``offset``; slaves streaming from it are dropped first, so that none
        keeps bytes from beyond the cut or goes on from an offset that no longer continues it."""
        self.ha.drop_slaves(f"commitlog truncated to {offset}")
        self.store.truncate_to(offset)

    # -- lifecycle --
    async def prepare(self) -> None:
        """What must hold before the broker takes its first request (called before
        :meth:`start`, ahead of the remoting listener): a master has its log's identity (a slave
        checks it before following, and so does the metadata sync), and one that may not write
        in this term refuses sends from the first one on."""
        if not self.ctx.is_slave:
            await asyncio.to_thread(self.epochs.ensure_log_id, self.store.max_phy_offset())
        self._check_term()

    async def start(self) -> None:
        await self.ha.start()
        self._apply_role()

    def _check_term(self) -> None:
        """A master writes only in an epoch it began (or in epoch 0, which nobody began). One that
        starts as master in another broker's term (demoted and restarted from a broker.conf that
        still says master, e.g. a ConfigMap not yet updated) would write a second log of that
        term, which no follower could tell from the first: its puts are refused until it is
        promoted at a new epoch or made a slave. So are those of a master whose epoch record ends
        below the group's (``haGroupEpoch``): it came back on a volume without its store, and
        what it wrote (acknowledged by a slave that lost its store too) would be cut when the
        slave holding the group's log is promoted."""
        epochs = self.epochs
        if epochs.epoch < self.settings.haGroupEpoch:
            why: str | None = (f"at epoch {epochs.epoch}, older than its group's epoch {self.settings.haGroupEpoch}: "
                               "its store is not the one it served from (a lost or replaced volume)")
        elif epochs.epoch > 0 and epochs.own_epoch != epochs.epoch:
            why = f"in epoch {epochs.epoch}, which another broker began (its own latest is {epochs.own_epoch})"
        else:
            why = None
        fenced = not self.ctx.is_slave and why is not None
        if fenced and not self.store.term_fenced:
            log.error("this broker is %s %s: refusing writes until it is promoted at a new epoch (POST /role) "
                      "or made a slave", self.ctx.role, why)
        elif self.store.term_fenced and not fenced:
            log.warning("writes taken again (%s, epoch %d)", self.ctx.role, epochs.epoch)
        self.store.set_term_fenced(fenced)

    async def stop(self) -> None:
        await self.ha_client.stop()
        await self.metadata_sync.stop()
        await self.ha.stop()

    def _apply_role(self) -> None:
        role = self.ctx.role
        sync = role == "SYNC_MASTER"
        self.store.replication_callback = self.ha.group_transfer.wait_then if sync else None
        self.store.set_role(role)
        if role == "SLAVE":
            self.ha_client.start()
            self.metadata_sync.start()

    # -- master discovery --
    def on_registration(self, master_addr: str | None, master_ha_addr: str | None) -> None:
        """Nameserver answer to REGISTER_BROKER: follow the master it names (NameServer discovery)."""
        if not self.ctx.is_slave:
            return
        if master_addr:
            self.metadata_sync.set_master(master_addr)
        if master_ha_addr and not self.pinned_master:
            self.ha_client.set_master(master_ha_addr)

    def _master_following(self, addr: str) -> None:
        """The HA link streams from a master again (it was lost: the master restarted or resumed):
        sync metadata now, not at the period's end. Not at the first link, which the initial delay
        covers before the metadata sync may even know the master's broker address."""
        if self._followed_before:
            self.metadata_sync.sync_soon()
        self._followed_before = True

    def _master_lost(self, addr: str) -> None:
        """The HA client could not follow ``addr``. With NameServer discovery the master may have
        changed (a promotion, a failover: the old master refuses as a SLAVE, or is gone), and only a
        registration's answer tells: ask now rather than at the next periodic registration
        (registerNameServerPeriod, 30 s), during which this slave would replicate nothing."""
        if self.pinned_master or not self.ctx.is_slave or self._request_register is None:
            return
        now = time.monotonic()
        if now - self._master_lost_asked < MASTER_LOST_REGISTER_SECONDS:
            return
        self._master_lost_asked = now
        log.info("cannot follow master %s; asking the nameserver which broker is master now", addr)
        self._request_register()

    async def repoint(self, ha_addr: str, broker_addr: str | None, epoch: int | None) -> int:
        """POST /ha/master: follow another master without a restart. Returns the log's end once the
        previous master's connection is closed: final for that master."""
        async with self._lock:
            if epoch is not None:
                try:
                    self.epochs.check_not_older(epoch)
                except EpochError as exc:
                    raise RoleChangeError(str(exc)) from exc
            if not self.ctx.is_slave:
                raise RoleChangeError(f"this broker is {self.ctx.role}; demote it (POST /role) before re-pointing")
            self.pinned_master = True
            was_fenced = bool(self.epochs.fence)
            if was_fenced:
                # The failover that fenced this slave chose whom it follows now.
                await asyncio.to_thread(self.epochs.unfence)
            await self.ha_client.switch_master(ha_addr, reconnect=was_fenced)
            if broker_addr:
                self.metadata_sync.set_master(broker_addr)
            return self.store.max_phy_offset()

    async def fence(self, epoch: int) -> dict[str, Any]:
        """POST /ha/fence: stop acknowledging any master older than ``epoch``, at once.

        A failover fences every slave before it picks the one to promote: the old master, if it
        is only hung, could otherwise still get a slave's ack for a send after the choice (and
        answer SEND_OK for bytes the new master never gets). The answer's offset is final for
        that master: the connection is closed and its writes in flight are complete.
        """
        async with self._lock:
            if not self.ctx.is_slave:
                raise RoleChangeError(f"this broker is {self.ctx.role}; only a slave is fenced")
            try:
                self.epochs.check_not_older(epoch)
            except EpochError as exc:
                raise RoleChangeError(str(exc)) from exc
            await asyncio.to_thread(self.epochs.fence_below, epoch)
            await self.ha_client.restart()
            log.warning("fenced below epoch %d at offset %d (following no master older than that)", epoch,
                        self.store.max_phy_offset())
            return {"epoch": self.epochs.epoch, "fencedBelowEpoch": self.epochs.fence,
                    "maxPhyOffset": self.store.max_phy_offset()}

    async def change_role(self, role: str, broker_id: int, epoch: int, *, drain: float = 0.0,
                          drain_for: frozenset[str] = frozenset(), sync_metadata: bool = False,
                          metadata_source: str | None = None, not_after_ms: int | None = None) -> dict[str, Any]:
        """POST /role: promote to a master or demote to a slave at ``epoch``.

        A planned hand-over (the operator moving the master before restarting it) asks a master's
        demotion to ``drain``: sends are refused at once, but its slaves keep streaming until each
        has acknowledged the last byte (or ``drain`` seconds pass), and SYNC sends waiting for a
        slave are answered as the acks come; ``drain_for`` names the slave connections it waits
        for (the slave taking over), so that another slave stalled cannot hold the sends paused.
        It asks the slave's promotion to ``sync_metadata`` first: one last metadata round from its
        master (still reachable, now a slave), so that offsets committed since the last periodic
        round are not lost; ``metadata_source`` names that master's broker address when the
        caller knows it better than this slave does.
        ``not_after_ms`` (Unix ms): refused once past, checked again just before a promotion takes
        effect; a request read late (a paused process) cannot make a master its caller gave up on.
        """
        if role not in ROLES:
            raise RoleChangeError(f"role must be one of {', '.join(ROLES)}")
        if (role == "SLAVE") != (broker_id > 0):
            raise RoleChangeError("a SLAVE needs brokerId > 0 and a master brokerId 0")
        async with self._lock:
            try:
                self.epochs.check_not_older(epoch)
            except EpochError as exc:
                raise RoleChangeError(str(exc)) from exc
            _check_deadline(not_after_ms)
            old = self.ctx.role
            started = time.monotonic()
            extra: dict[str, Any] = {}
            if role == "SLAVE":
                extra = await self._demote(broker_id, epoch, drain, drain_for)
            else:
                extra = await self._promote(role, epoch, sync_metadata, metadata_source, not_after_ms)
            self.ctx.broker_id = broker_id
            self._check_term()
            self._on_role_change(role)
            log.warning("role %s -> %s (brokerId %d, epoch %d) in %.0f ms", old, role, broker_id, epoch,
                        (time.monotonic() - started) * 1000)
            return {"role": role, "brokerId": broker_id, "epoch": self.epochs.epoch,
                    "maxPhyOffset": self.store.max_phy_offset(), **extra}

    async def _promote(self, role: str, epoch: int, sync_metadata: bool = False,
                       metadata_source: str | None = None, not_after_ms: int | None = None) -> dict[str, Any]:
        if self.ctx.role != "SLAVE":
            # Master to master (SYNC <-> ASYNC) keeps the epoch history; only the mode changes.
            if epoch > self.epochs.epoch:
                await asyncio.to_thread(self.epochs.begin_epoch, epoch, self.store.max_phy_offset())
                # Its slaves re-handshake and take the new epoch (the operator counts a slave in
                # sync only in its master's epoch); nothing is cut, the log goes on where it is.
                self.ha.drop_slaves(f"epoch {epoch} began")
            self.ctx.role = role
            self._apply_role()
            return {}
        # stop() waits for a handshake's epoch adoption still in flight, so begin_epoch below is
        # checked against the epoch that adoption left (a newer master's term makes it a 409)
        # rather than overwritten by the adoption afterwards.
        steps: list[tuple[str, float]] = [("start", time.monotonic())]
        await self.ha_client.stop()
        steps.append(("HA client stopped", time.monotonic()))
        await self.metadata_sync.stop()
        steps.append(("metadata sync stopped", time.monotonic()))
        extra: dict[str, Any] = {}
        if sync_metadata:
            extra = await self._final_metadata_sync(metadata_source)
            steps.append(("metadata synced", time.monotonic()))
        # Every replicated record gets its consume-queue unit before this broker serves as master;
        # a tail that ends inside a record is cut: the new epoch starts at the last whole one.
        try:
            self.store.dispatch_some()
        except StoreFullError as exc:
            # Cutting the undispatched records instead would drop sends a slave acknowledged.
            self._apply_role()
            raise RoleChangeError(f"cannot promote: no disk space for the consume queues of the replicated "
                                  f"log ({exc})") from exc
        end = self.store.dispatched_phy_offset()
        if end < self.store.max_phy_offset():
            self._truncate(end)
        steps.append(("log dispatched", time.monotonic()))
        try:
            _check_deadline(not_after_ms)
        except RoleChangeError:
            self._apply_role()  # a slave again: its HA client and metadata sync restart
            raise
        try:
            await asyncio.to_thread(self.epochs.begin_epoch, epoch, end)
        except EpochError as exc:
            self._apply_role()
            raise RoleChangeError(str(exc)) from exc
        steps.append(("epoch persisted", time.monotonic()))
        if steps[-1][1] - steps[0][1] > SLOW_PROMOTION_SECONDS:
            timings = ", ".join(f"{name} +{(t - prev) * 1000:.0f} ms"
                                for (name, t), (_, prev) in zip(steps[1:], steps, strict=False))
            log.warning("slow promotion: %s", timings)
        # Acks this broker took as a master of an earlier term say nothing about the new one.
        self.ha.group_transfer.reset()
        # A re-point named the master to follow as a slave; it is spent now. Demoted later, this
        # broker follows the master the nameserver names (unless haMasterAddress is configured),
        # not a broker it was re-pointed at terms ago.
        self.pinned_master = bool(self.settings.haMasterAddress)
        self.metadata_sync.forget_received()
        self.ctx.role = role
        self._apply_role()
        return extra

    async def _final_metadata_sync(self, source: str | None) -> dict[str, Any]:
        """One metadata round from the master being handed over from; its failure is reported, not
        fatal (the promotion goes on with what the periodic rounds brought)."""
        master = source or self.metadata_sync.master_addr
        if not master or master == self.settings.broker_addr:
            log.warning("no last metadata sync before the promotion: no master broker address known")
            return {"metadataSynced": False, "metadataSyncError": "no master broker address known"}
        try:
            async with asyncio.timeout(FINAL_SYNC_SECONDS):
                await self.metadata_sync.sync_all(master)
        except (MetadataSyncError, TimeoutError) as exc:
            error = str(exc) or type(exc).__name__
            log.warning("last metadata sync before the promotion failed: %s", error)
            return {"metadataSynced": False, "metadataSyncError": error}
        except Exception as exc:
            # Raised here, it would abort the promotion half-done: HA client and sync stopped,
            # still a SLAVE. The round is optional; the promotion is not.
            log.exception("last metadata sync before the promotion failed unexpectedly")
            return {"metadataSynced": False, "metadataSyncError": f"unexpected error: {exc!r}"}
        return {"metadataSynced": True}

    async def _demote(self, broker_id: int, epoch: int, drain: float = 0.0,
                      drain_for: frozenset[str] = frozenset()) -> dict[str, Any]:
        await asyncio.to_thread(self.epochs.set_epoch, epoch)
        was_master = not self.ctx.is_slave
        if was_master:
            self.demoted_at = time.monotonic()
        self.ctx.role = "SLAVE"
        extra: dict[str, Any] = {}
        if was_master and drain > 0:
            # Refuse sends first; the HA client starts only after the drain, so this broker follows
            # nobody while its own slaves still stream from it.
            self.store.set_role("SLAVE")
            started = time.monotonic()
            drained = await self.ha.drain(drain, drain_for)
            extra = {"drained": drained, "drainMillis": round((time.monotonic() - started) * 1000),
                     "slaves": self.ha.slaves_status()}
            log.warning("demotion drained %s slave(s) to offset %d in %d ms%s", len(extra["slaves"]),
                        self.store.max_phy_offset(), extra["drainMillis"], "" if drained else " (timed out)")
        self._apply_role()
        # Sends still waiting for a slave of this term will not get one, and its slaves follow
        # the new master (a re-point, or their reconnect finds where the group's master is).
        self.ha.group_transfer.reset()
        self.ha.drop_slaves("demoted to SLAVE")
        return extra

    # -- metrics --
    def metric_counters(self) -> dict[str, tuple[str, float]]:
        """Replication counters for /metrics (name -> (help, total)); both sides', whatever the role
        is now, since a promoted or demoted broker keeps what it counted in the other role."""
        ha, client, ms = self.ha, self.ha_client, self.metadata_sync
        return {
            "ha_pushes": ("Frames of new commitlog bytes pushed to slaves from the event loop", ha.pushes),
            "ha_bulk_transfers": ("Catch-up transfers sent to slaves with sendfile", ha.bulk_transfers),
            "ha_bytes_sent": ("Commitlog bytes handed to slave connections", ha.bytes_pushed),
            "ha_reports": ("Offset reports (acks) received from slaves", ha.reports),
            "ha_rejected_reports": ("Slave connections dropped for a malformed or impossible report",
                                    ha.rejected_reports),
            "ha_slaves_behind_retention": ("Slaves refused because retention deleted what they need next",
                                           ha.behind_retention),
            "ha_refused_followers": ("HA peers refused because this broker was a slave when they asked to follow",
                                     ha.refused_followers),
            "ha_bytes_received": ("Commitlog bytes received from the master and made visible", client.bytes_received),
            "ha_master_connects": ("Connections made to a master, reconnects included", client.connects),
            "ha_master_failed_attempts": ("Attempts to follow a master that failed (unreachable, refused)",
                                          client.failed_attempts),
            "ha_refused_streams": ("Master streams refused (not continuing this log, malformed)", client.mismatches),
            "ha_truncated_bytes": ("Divergent commitlog bytes cut before following a master", client.truncated_bytes),
            "metadata_sync_rounds": ("Slave metadata sync rounds that succeeded", ms.rounds),
            "metadata_sync_failures": ("Slave metadata sync rounds that failed", ms.failures),
        }

    def metric_gauges(self) -> list[tuple[str, str, tuple[str, ...], Samples]]:
        """Replication gauges for /metrics, as (name, help, label names, samples)."""
        ctx, ha, client = self.ctx, self.ha, self.ha_client
        slaves = ha.slave_states()
        lag = ha.replication_lag_ms()
        lag_samples: Samples = [((q,), float(ms) / 1000) for q, key in (("0.5", "p50"), ("0.99", "p99"), ("1", "max"))
                                if (ms := lag[key]) is not None]
        return [
            ("broker_role", "1 for the broker's current role and brokerId", ("role", "role_broker_id"),
             [((ctx.role, str(ctx.broker_id)), 1.0)]),
            ("ha_epoch", "Replication epoch this broker is at", (), [((), float(self.epochs.epoch))]),
            ("ha_slaves_connected", "Slaves streaming from this broker", (),
             [((), float(sum(1 for c in ha.connections if c.request_offset >= 0)))]),
            ("ha_slave_acked_offset", "Commitlog offset a slave has acknowledged", ("slave",),
             [((s.address,), float(s.acked_offset)) for s in slaves]),
            ("ha_slave_lag_bytes", "Commitlog bytes a slave has not acknowledged yet", ("slave",),
             [((s.address,), float(s.lag_bytes)) for s in slaves]),
            ("ha_slave_in_sync", "1 when a slave is within haSlaveFallbehindMax and not silent", ("slave",),
             [((s.address,), float(s.in_sync)) for s in slaves]),
            ("ha_slave_last_ack_timestamp_seconds", "When a slave last reported its offset (Unix time)",
             ("slave",), [((s.address,), s.last_ack_millis / 1000) for s in slaves]),
            ("ha_replication_lag_seconds", "Time from an append to the first slave ack covering it, over the "
             "recent window (quantile 1: the maximum)", ("quantile",), lag_samples),
            ("ha_master_connected", "1 while this slave is connected to its master", (),
             [((), float(ctx.is_slave and client.connected))]),
            ("ha_ahead_of_master_bytes", "Bytes of the master's own term this slave holds beyond the master's "
             "end", (), [((), float(client.ahead_bytes))]),
            ("metadata_sync_last_success_timestamp_seconds", "When this slave's metadata sync last succeeded "
             "(Unix time; 0: never)", (), [((), self.metadata_sync.last_success_ms / 1000)]),
            ("metadata_sync_offsets_to_hand_over", "Queue offsets groups committed to this slave while its "
             "master was away that the master has not been given yet", (),
             [((), float(len(self.ctx.offsets.kept_over_master())))]),
        ]

    # -- status --
    def status(self) -> dict[str, Any]:
        ms = self.metadata_sync
        return {
            "epoch": self.epochs.epoch,
            # The latest epoch this broker began as a promoted master (null: none): the broker
            # that owns the current epoch holds that term's log.
            "ownEpoch": self.epochs.own_epoch,
            "logId": self.epochs.log_id,
            # A master refusing writes: the current epoch is another broker's term.
            "termFenced": self.store.term_fenced,
            "ha": {
                "masterAddress": self.ha_client.master_addr if self.ctx.is_slave else None,
                "connected": self.ha_client.connected if self.ctx.is_slave else False,
                # This slave's end of its HA connection, as the master lists it in ha.slaves[].
                "localAddress": self.ha_client.local_address if self.ctx.is_slave else None,
                "listenPort": self.ha.port,
                "slaves": self.ha.slaves_status(),
                "replicationLagMs": self.ha.replication_lag_ms(),
                "rejectedReports": self.ha.rejected_reports,
                "slavesBehindRetention": self.ha.behind_retention,
                "refusedFollowers": self.ha.refused_followers,
                "truncatedBytes": self.ha_client.truncated_bytes,
                "aheadOfMasterBytes": self.ha_client.ahead_bytes,
                "connects": self.ha_client.connects,
                "failedAttempts": self.ha_client.failed_attempts,
                "masterWithoutEpochs": self.ctx.is_slave and self.ha_client.legacy_master,
                "refusedStreams": self.ha_client.mismatches,
                "fencedBelowEpoch": self.epochs.fence if self.epochs.fenced else 0,
            },
            "metadataSync": {
                "masterAddress": ms.master_addr if self.ctx.is_slave else None,
                "lastSuccessMillis": ms.last_success_ms,
                "rounds": ms.rounds,
                "failures": ms.failures,
                # A verifier that finds the slave's metadata behind waits about this long for a round.
                "intervalMillis": int(ms.interval * 1000),
                "lastError": ms.last_error,
                # Queue offsets committed here while the master was away, not handed to it yet.
                "offsetsToHandOver": len(self.ctx.offsets.kept_over_master()),
                "topicVersion": self.ctx.topics.data_version.to_json_obj(),
                "subscriptionVersion": self.ctx.groups.data_version.to_json_obj(),
            },
        }
