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
from rmqbroker.ha.metadata_sync import SlaveMetadataSync
from rmqbroker.ha.slave import HAClient
from rmqbroker.outer_api import BrokerOuterApi
from rmqbroker.processors.context import BrokerContext
from rmqbroker.store.message_store import ROLES

log = logging.getLogger(__name__)


class RoleChangeError(ValueError):
    """A role or master change that must be refused (stale epoch, bad arguments)."""


class ReplicationController:
    """HA master listener (always on), slave-side HA client and metadata sync (slaves only)."""

    def __init__(self, ctx: BrokerContext, settings: BrokerSettings, epochs: EpochStore, api: BrokerOuterApi,
                 on_role_change: Callable[[str], None]) -> None:
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
        ), epochs)
        self.store.add_arrival_listener(self.ha.notify_data)
        self.ha_client = HAClient(self.store, settings.haMasterAddress or None,
                                  heartbeat_interval=settings.haSendHeartbeatInterval / 1000,
                                  housekeeping_interval=settings.haHousekeepingInterval / 1000,
                                  epochs=epochs, truncate=self._truncate)
        self.metadata_sync = SlaveMetadataSync(
            api, settings.broker_addr, ctx.topics, ctx.groups, ctx.offsets, ctx.delay_offsets,
            initial_delay=settings.slaveSyncInitialDelay / 1000, interval=settings.slaveSyncInterval / 1000,
            on_topic_deleted=self.store.delete_topic_queues, on_master_deletions=self.store.apply_topic_deletions)
        # An explicitly configured or injected master is not overridden by the nameserver.
        self.pinned_master = bool(settings.haMasterAddress)
        self._lock = asyncio.Lock()

    def _truncate(self, offset: int) -> None:
        """Cut this log at ``offset``; slaves streaming from it are dropped first, so that none
        keeps bytes from beyond the cut or goes on from an offset that no longer continues it."""
        self.ha.drop_slaves(f"commitlog truncated to {offset}")
        self.store.truncate_to(offset)

    # -- lifecycle --
    async def start(self) -> None:
        await self.ha.start()
        self._apply_role()

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

    async def repoint(self, ha_addr: str, broker_addr: str | None, epoch: int | None) -> None:
        """POST /ha/master: follow another master without a restart."""
        async with self._lock:
            if epoch is not None:
                try:
                    self.epochs.check_not_older(epoch)
                except EpochError as exc:
                    raise RoleChangeError(str(exc)) from exc
            if not self.ctx.is_slave:
                raise RoleChangeError(f"this broker is {self.ctx.role}; demote it (POST /role) before re-pointing")
            self.pinned_master = True
            self.ha_client.set_master(ha_addr)
            if broker_addr:
                self.metadata_sync.set_master(broker_addr)

    async def change_role(self, role: str, broker_id: int, epoch: int) -> dict[str, Any]:
        """POST /role: promote to a master or demote to a slave at ``epoch``."""
        if role not in ROLES:
            raise RoleChangeError(f"role must be one of {', '.join(ROLES)}")
        if (role == "SLAVE") != (broker_id > 0):
            raise RoleChangeError("a SLAVE needs brokerId > 0 and a master brokerId 0")
        async with self._lock:
            try:
                self.epochs.check_not_older(epoch)
            except EpochError as exc:
                raise RoleChangeError(str(exc)) from exc
            old = self.ctx.role
            started = time.monotonic()
            if role == "SLAVE":
                await self._demote(broker_id, epoch)
            else:
                await self._promote(role, epoch)
            self.ctx.broker_id = broker_id
            self._on_role_change(role)
            log.warning("role %s -> %s (brokerId %d, epoch %d) in %.0f ms", old, role, broker_id, epoch,
                        (time.monotonic() - started) * 1000)
            return {"role": role, "brokerId": broker_id, "epoch": self.epochs.epoch,
                    "maxPhyOffset": self.store.max_phy_offset()}

    async def _promote(self, role: str, epoch: int) -> None:
        if self.ctx.role != "SLAVE":
            # Master to master (SYNC <-> ASYNC) keeps the epoch history; only the mode changes.
            if epoch > self.epochs.epoch:
                await asyncio.to_thread(self.epochs.begin_epoch, epoch, self.store.max_phy_offset())
            self.ctx.role = role
            self._apply_role()
            return
        # stop() waits for a handshake's epoch adoption still in flight, so begin_epoch below is
        # checked against the epoch that adoption left (a newer master's term makes it a 409)
        # rather than overwritten by the adoption afterwards.
        await self.ha_client.stop()
        await self.metadata_sync.stop()
        # Every replicated record gets its consume-queue unit before this broker serves as master;
        # a tail that ends inside a record is cut: the new epoch starts at the last whole one.
        self.store.dispatch_some()
        end = self.store.dispatched_phy_offset()
        if end < self.store.max_phy_offset():
            self._truncate(end)
        try:
            await asyncio.to_thread(self.epochs.begin_epoch, epoch, end)
        except EpochError as exc:
            self._apply_role()
            raise RoleChangeError(str(exc)) from exc
        # Acks this broker took as a master of an earlier term say nothing about the new one.
        self.ha.group_transfer.reset()
        self.ctx.role = role
        self._apply_role()

    async def _demote(self, broker_id: int, epoch: int) -> None:
        await asyncio.to_thread(self.epochs.set_epoch, epoch)
        self.ctx.role = "SLAVE"
        self._apply_role()
        # Sends still waiting for a slave of this term will not get one, and its slaves follow
        # the new master (a re-point, or their reconnect finds where the group's master is).
        self.ha.group_transfer.reset()
        self.ha.drop_slaves("demoted to SLAVE")

    # -- status --
    def status(self) -> dict[str, Any]:
        ms = self.metadata_sync
        return {
            "epoch": self.epochs.epoch,
            "ha": {
                "masterAddress": self.ha_client.master_addr if self.ctx.is_slave else None,
                "connected": self.ha_client.connected if self.ctx.is_slave else False,
                "listenPort": self.ha.port,
                "slaves": self.ha.slaves_status(),
                "replicationLagMs": self.ha.replication_lag_ms(),
                "rejectedReports": self.ha.rejected_reports,
                "slavesBehindRetention": self.ha.behind_retention,
                "truncatedBytes": self.ha_client.truncated_bytes,
                "aheadOfMasterBytes": self.ha_client.ahead_bytes,
                "connects": self.ha_client.connects,
                "refusedStreams": self.ha_client.mismatches,
            },
            "metadataSync": {
                "masterAddress": ms.master_addr if self.ctx.is_slave else None,
                "lastSuccessMillis": ms.last_success_ms,
                "rounds": ms.rounds,
                "failures": ms.failures,
                "lastError": ms.last_error,
                "topicVersion": self.ctx.topics.data_version.to_json_obj(),
                "subscriptionVersion": self.ctx.groups.data_version.to_json_obj(),
            },
        }
