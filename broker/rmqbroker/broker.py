"""Composition root: builds the store, metadata, processors, servers and background tasks of one broker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any, TypeGuard, cast

from aiohttp import web

from rmqbroker.acl import AclConfigError, AclFileWatcher, PlainAcl, guard
from rmqbroker.admin.http import AdminServer, json_error, json_response, load_or_create_token, read_json_object
from rmqbroker.admin.metrics import LabeledGauge, build_registry
from rmqbroker.broker_stats import BrokerStatsManager
from rmqbroker.config import BrokerSettings, ConfigError, SettingsOrigin
from rmqbroker.ha.controller import ReplicationController, RoleChangeError
from rmqbroker.ha.epoch import EpochStore
from rmqbroker.metadata.consumer_offsets import ConsumerOffsetManager, split_offset_key
from rmqbroker.metadata.delay_offsets import DelayOffsetTable
from rmqbroker.metadata.subscription_groups import SubscriptionGroupManager
from rmqbroker.metadata.topics import PERM_WRITE, TopicConfig, TopicConfigManager, perm_readable, perm_writeable
from rmqbroker.outer_api import BrokerOuterApi
from rmqbroker.processors.acl_admin import AclAdminProcessor
from rmqbroker.processors.admin import AdminProcessor
from rmqbroker.processors.admin_client_ops import AdminClientOpsProcessor
from rmqbroker.processors.broker_config import REGISTER_TIMEOUT_S, BrokerConfigProcessor
from rmqbroker.processors.client_manage import ClientManageProcessor, make_notifier
from rmqbroker.processors.clients import ClientManager
from rmqbroker.processors.context import BrokerContext
from rmqbroker.processors.offsets import OffsetProcessor
from rmqbroker.processors.pull import PullMessageProcessor
from rmqbroker.processors.query import QueryMessageProcessor
from rmqbroker.processors.relay import WriteRelay
from rmqbroker.processors.reply import ReplyMessageProcessor
from rmqbroker.processors.send import SendMessageProcessor
from rmqbroker.processors.transaction import TransactionService
from rmqbroker.remoting.client import RemotingClient, split_addr
from rmqbroker.remoting.codes import RequestCode
from rmqbroker.remoting.server import RemotingServer
from rmqbroker.remoting.tls import ClientContexts
from rmqbroker.runtime import Supervisor
from rmqbroker.schedule import ScheduleMessageService
from rmqbroker.store.config import StoreConfig, parse_delay_levels
from rmqbroker.store.consume_queue import UNIT
from rmqbroker.store.message_store import MessageStore
from rmqbroker.store.retention import CleanService, RetentionConfig, parse_delete_when
from rmqbroker.store_stats import StoreStatsService

log = logging.getLogger(__name__)
# How often the ACL file is checked for changes (s).
ACL_RELOAD_SECONDS = 2.0
# A demotion's drain (POST /role drainMillis) waits at most this long for its slaves.
MAX_DRAIN_MILLIS = 60_000
# How long a request that created a topic waits for the nameservers to route it before it is
# answered anyway (a nameserver that is down or slow; the registration loop retries): well under
# the clients' 3 s send timeout.
ROUTE_WAIT_S = 1.0
# How soon a registration that did not reach every nameserver is tried again.
REGISTER_RETRY_S = 3.0
# ...and names at most this many of them (drainFor) as the ones it waits for.
MAX_DRAIN_FOR = 16
# Generated under storePathRootDir/config/ when neither adminToken nor adminTokenFile is set.
ADMIN_TOKEN_FILE = "adminToken"


def store_config(s: BrokerSettings) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=s.store_root,
        store_path_commit_log=s.commitlog_dir,
        mapped_file_size_commit_log=s.mappedFileSizeCommitLog,
        mapped_file_size_consume_queue=s.mappedFileSizeConsumeQueue,
        flush_disk_type=cast(Any, s.flushDiskType),
        flush_interval_commit_log_ms=s.flushIntervalCommitLog,
        flush_interval_consume_queue_ms=s.flushIntervalConsumeQueue,
        sync_flush_timeout_ms=s.syncFlushTimeout,
        max_message_size=s.maxMessageSize,
        message_delay_levels=parse_delay_levels(s.messageDelayLevel),
        store_host=(s.host_ip, s.listenPort),
        check_crc_on_recover=s.checkCRCOnRecover,
        broker_role=s.brokerRole,
        message_index_enable=s.messageIndexEnable,
        max_hash_slot_num=s.maxHashSlotNum,
        max_index_num=s.maxIndexNum,
    )


def retention_config(s: BrokerSettings) -> RetentionConfig:
    return RetentionConfig(
        file_reserved_time_hours=s.fileReservedTime,
        delete_when=parse_delete_when(s.deleteWhen),
        disk_max_used_space_ratio=s.diskMaxUsedSpaceRatio,
        disk_space_warning_level_ratio=s.diskSpaceWarningLevelRatio,
        disk_space_clean_forcibly_ratio=s.diskSpaceCleanForciblyRatio,
        clean_file_forcibly_enable=s.cleanFileForciblyEnable,
        clean_resource_interval_ms=s.cleanResourceInterval,
        delete_commit_log_files_interval_ms=s.deleteCommitLogFilesInterval,
    )


class Broker:
    """One broker process's parts and their lifecycle."""

    def __init__(self, settings: BrokerSettings, origin: SettingsOrigin | None = None) -> None:
        config_dir = settings.store_root / "config"
        config_dir.mkdir(parents=True, exist_ok=True)
        self.store = MessageStore(store_config(settings))
        self.topics = TopicConfigManager(
            config_dir, cluster_name=settings.brokerClusterName, broker_name=settings.brokerName,
            auto_create_topic_enable=settings.autoCreateTopicEnable,
            default_topic_queue_nums=settings.defaultTopicQueueNums)
        self.groups = SubscriptionGroupManager(config_dir, auto_create=settings.autoCreateSubscriptionGroup)
        self.offsets = ConsumerOffsetManager(config_dir)
        self.delay_offsets = DelayOffsetTable(config_dir)

        def group_notify_enabled(group: str) -> bool:
            cfg = self.groups.get(group)
            return cfg is None or cfg.notify_consumer_ids_changed_enable

        self.clients = ClientManager(make_notifier(lambda: self.settings.notifyConsumerIdsChangedEnable,
                                                   group_notify_enabled))
        self.ctx = BrokerContext(settings, self.store, self.topics, self.groups, self.offsets, self.delay_offsets,
                                 self.clients, register_now=self.request_register,
                                 register_and_wait=self.register_and_wait)
        self.tls = settings.tls_settings()
        self.server = RemotingServer(settings.listenHost, settings.listenPort, name="broker", tls=self.tls,
                                     idle_seconds=settings.serverChannelMaxIdleTimeSeconds)
        self.transactions = TransactionService(self.ctx)
        self.send = SendMessageProcessor(
            self.ctx, None if settings.rejectTransactionMessage else self.transactions)
        self.pull = PullMessageProcessor(self.ctx)
        self.reply = ReplyMessageProcessor(self.ctx, self.send)
        self.cleaner = CleanService(self.store, retention_config(settings))
        self.store_stats = StoreStatsService(self.ctx.stats)
        self.broker_stats = BrokerStatsManager(self.store, self.ctx.stats, settings.brokerClusterName,
                                               lambda: not self.ctx.is_slave, settings.statsSamplingInterval)
        for proc in (self.send, self.pull, OffsetProcessor(self.ctx), ClientManageProcessor(self.ctx),
                     AdminProcessor(self.ctx, self.store_stats.runtime_info, cleaner=self.cleaner,
                                    broker_stats=self.broker_stats),
                     AdminClientOpsProcessor(self.ctx),
                     BrokerConfigProcessor(self.ctx, origin, self._settings_applied),
                     QueryMessageProcessor(self.ctx),
                     self.transactions, self.reply):
            proc.register(self.server)
        acl: PlainAcl | None = None
        self.acl_watcher: AclFileWatcher | None = None
        if settings.aclEnable:
            try:
                acl = PlainAcl.load(settings.acl_path)
            except AclConfigError as exc:
                raise ConfigError(f"aclEnable: {exc}") from exc
            self.acl_watcher = AclFileWatcher(acl, settings.acl_path, self.ctx.stats)
        AclAdminProcessor(settings.acl_path, self.acl_watcher, cluster=settings.brokerClusterName,
                          broker_name=settings.brokerName, broker_addr=settings.broker_addr).register(self.server)
        if acl is not None:
            guard(self.server, acl, self.ctx.stats)  # every handler is registered by now
            log.info("plain ACL on: %d account(s), %d global white-list entr(ies) from %s",
                     len(acl.accounts), len(acl.global_white), settings.acl_path)
        self.fast_server = self._fast_server(self.server, settings)
        self.topics.add_change_listener(self._topic_changed)
        self.outer = BrokerOuterApi(RemotingClient(ssl_context=ClientContexts(self.tls), on_close=self._peer_closed),
                                    credentials=(settings.aclAccessKey, settings.aclSecretKey)
                                    if settings.aclAccessKey else None)
        self.schedule = ScheduleMessageService(self.store, self.delay_offsets,
                                               parse_delay_levels(settings.messageDelayLevel))
        self.supervisor = Supervisor()
        self.epochs = EpochStore(config_dir)
        self.replication = ReplicationController(self.ctx, settings, self.epochs, self.outer, self._role_changed,
                                                 self.request_master_query)
        self.ctx.relays_from = self.replication.ha.streams_to
        self.ctx.log_id = lambda: self.epochs.log_id
        if settings.relaySendsToMaster:
            self.ctx.relay = WriteRelay(self.outer.client, self.replication.relay_target,
                                        lambda: self.replication.demoted_at, settings.broker_addr)
        self._schedule_task: asyncio.Task[None] | None = None
        self._last_role = self.ctx.role
        self.registered = False
        self.master_addr: str | None = None
        self.master_ha_addr: str | None = None
        self._register_event = asyncio.Event()
        # Requests waiting for the next full registration to be answered (register_and_wait).
        self._register_waiters: list[asyncio.Future[None]] = []
        # The next registration carries the whole topic table (see _register_loop); cleared as it starts.
        self._full_register_due = True
        self._last_full_register = float("-inf")  # monotonic time the last full one started
        self._last_register_try = float("-inf")  # monotonic time the last one of any kind started
        self.started_ms = 0
        labels = {"cluster": settings.brokerClusterName, "broker": settings.brokerName,
                  "broker_id": str(settings.brokerId)}
        self.registry = build_registry(self.ctx.stats, self.server.stats, self._gauges, labels,
                                       self.server.latency, self._counters, self._labeled_gauges)
        self.admin: AdminServer | None = None
        if settings.adminListenPort:
            token = settings.admin_token() or load_or_create_token(settings.store_root / "config" / ADMIN_TOKEN_FILE)
            self.admin = AdminServer(settings.listenHost, settings.adminListenPort, token=token,
                                     registry=self.registry, status=self.status, ready=self.ready,
                                     idle_seconds=settings.serverChannelMaxIdleTimeSeconds)
            self.admin.add_route("POST", "/ha/master", self._http_repoint)
            self.admin.add_route("POST", "/ha/fence", self._http_fence)
            self.admin.add_route("POST", "/role", self._http_role)
            self.admin.add_route("GET", "/commitlog", self._http_commitlog)
            # Read-only views for replica verification (rmqbroker.verify).
            self.admin.add_route("GET", "/consumequeue", self._http_consume_queue)
            self.admin.add_route("GET", "/metadata", self._http_metadata)

    @property
    def settings(self) -> BrokerSettings:
        """The current settings (UPDATE_BROKER_CONFIG replaces the context's object)."""
        return self.ctx.settings

    async def _settings_applied(self, old: BrokerSettings, new: BrokerSettings) -> None:
        """Pushes a run-time settings change to the parts that do not read ``ctx.settings`` themselves."""
        retention = retention_config(new)
        if retention != self.cleaner.config:
            self.cleaner.config = retention  # read at the start of each round
        if new.brokerPermission != old.brokerPermission:
            # As Java: a new table version so the nameservers take it, and registered at once so routes
            # show the new permission before the answer goes back.
            self.topics.next_data_version()
            try:
                async with asyncio.timeout(REGISTER_TIMEOUT_S):
                    await self.register_all()
            except TimeoutError:
                log.warning("re-registration after the brokerPermission change timed out; the registration "
                            "loop retries")
                self.request_register()

    # -- metrics/status --
    def _gauges(self) -> dict[str, float]:
        return {
            "commitlog_max_offset": self.store.max_phy_offset(),
            "commitlog_min_offset": self.store.min_phy_offset(),
            "commitlog_flushed_offset": self.store.flushed_phy_offset(),
            "topics": len(self.topics),
            "pull_requests_held": self.pull.holds.held_count,
            "remoting_connections_open": self.server.stats.connections_open,
            "disk_used_ratio": self.cleaner.last_ratio,
            "disk_full": float(self.store.disk_full),
        }

    def _labeled_gauges(self) -> list[LabeledGauge]:
        """What dashboards alert on, computed at scrape time: each group's backlog per topic (messages
        stored and not yet consumed; a queue the group never committed on counts from its start) and
        each topic's stored messages (the sum of its queues' max offsets)."""
        store = self.store
        lag: list[tuple[tuple[str, ...], float]] = []
        for key, committed in sorted(self.offsets.table().items()):
            parts = split_offset_key(key)
            if parts is None or (tc := self.topics.select(parts[0])) is None:
                continue
            topic, group = parts
            backlog = 0
            for qid in range(tc.read_queue_nums):
                base = committed.get(qid, store.get_min_offset_in_queue(topic, qid))
                backlog += max(0, store.get_max_offset_in_queue(topic, qid) - base)
            lag.append(((group, topic), float(backlog)))
        stored: list[tuple[tuple[str, ...], float]] = [
            ((topic,), float(sum(store.get_max_offset_in_queue(topic, q) for q in range(tc.read_queue_nums))))
            for topic in self.topics.topic_names() if (tc := self.topics.select(topic)) is not None]
        return [("consumer_lag_messages", "Messages of a topic stored and not yet consumed by a group",
                 ("group", "topic"), lag),
                ("topic_max_offset", "Messages a topic's queues have stored (sum of their max offsets)",
                 ("topic",), stored),
                *self.replication.metric_gauges()]

    def _counters(self) -> dict[str, tuple[str, float]]:
        c = self.cleaner
        tx = self.transactions
        return {
            "retention_commitlog_files_deleted": ("Commitlog segments deleted by retention",
                                                  c.commitlog_files_deleted),
            "retention_consume_queue_files_deleted": ("Consume-queue files deleted by retention",
                                                      c.consume_queue_files_deleted),
            "transactions_committed": ("Transactional messages committed (END_TRANSACTION)", tx.committed),
            "transactions_rolled_back": ("Transactional messages rolled back (END_TRANSACTION)", tx.rolled_back),
            "transaction_checks": ("CHECK_TRANSACTION_STATE requests sent to producers", tx.checks_sent),
            "transactions_given_up": ("Half messages given up after transactionCheckMax checks", tx.given_up),
            "store_no_space_failures": ("Store writes refused for want of disk space (sends, consume-queue "
                                        "units, a slave's replicated stream); nothing was written",
                                        self.store.no_space_failures),
            "store_index_failures": ("Failed attempts to index a stored record (it is indexed when one succeeds)",
                                     self.store.index_failures),
            "reply_messages_pushed": ("Request-reply replies pushed to their requester", self.reply.pushed),
            "reply_messages_not_pushed": ("Request-reply replies no requester took (not connected, refused, "
                                          "no answer)", self.reply.not_pushed),
            **self.replication.metric_counters(),
            "relayed_writes": ("Client writes this broker relayed to its master while a slave (stale routes)",
                               relay.relayed if (relay := self.ctx.relay) else 0),
            "relayed_writes_failed": ("Client writes this broker could not relay to its master",
                                      relay.failed if (relay := self.ctx.relay) else 0),
        }

    def status(self) -> dict[str, Any]:
        s = self.settings
        return {
            **self.replication.status(),
            "cluster": s.brokerClusterName,
            "brokerName": s.brokerName,
            "brokerId": self.ctx.broker_id,
            "role": self.ctx.role,
            "brokerPermission": s.brokerPermission,
            "brokerAddr": s.broker_addr,
            "haServerAddr": s.ha_server_addr,
            "maxPhyOffset": self.store.max_phy_offset(),
            "minPhyOffset": self.store.min_phy_offset(),
            "flushedPhyOffset": self.store.flushed_phy_offset(),
            # Where GET /commitlog stops serving: the end of the records already in consume queues.
            # A catching-up slave's dispatch trails its maxPhyOffset (by up to hundreds of MB), and
            # a verifier must treat the bytes in between as not there yet, not as missing.
            "dispatchedPhyOffset": self.store.dispatched_phy_offset(),
            "retention": self.cleaner.status(),
            "relay": {"enabled": (relay := self.ctx.relay) is not None, "target": self.replication.relay_target(),
                      "relayed": relay.relayed if relay else 0, "failed": relay.failed if relay else 0},
            "topics": len(self.topics),
            "dataVersions": {
                "topics": self.topics.data_version.to_json_obj(),
                "subscriptionGroups": self.groups.data_version.to_json_obj(),
            },
            "registered": self.registered,
            "masterAddr": self.master_addr if self.ctx.is_slave else None,
            "bootTimestamp": self.started_ms,
        }

    def ready(self) -> bool:
        return self.store.running and (self.registered or not self.settings.namesrv_addrs)

    # -- registration --
    def request_register(self) -> None:
        """Register with the whole topic table soon (a topic, the role or the permission changed)."""
        self._full_register_due = True
        self._register_event.set()

    def _peer_closed(self, addr: str) -> None:
        """A nameserver that closed our connection has restarted, or will: it has forgotten this
        broker (a nameserver drops a broker whose connection closes), and clients it answers get
        no route to it until the next registration. That is tried soon (and every 3 s while it
        fails) rather than a whole registerNameServerPeriod later, as Java's would be."""
        if addr not in self.settings.namesrv_addrs:
            return
        self._full_register_due = True
        # At most one registration every 3 s on this account: a peer that accepts and closes at
        # once (a TLS mismatch) must not turn the loop into a busy one.
        delay = max(0.0, REGISTER_RETRY_S - (time.monotonic() - self._last_register_try))
        asyncio.get_running_loop().call_later(delay, self._register_event.set)

    def request_master_query(self) -> None:
        """Register soon to learn which broker is master now (a slave that cannot follow its own);
        a slave's topic table is not sent for that (see register_all's ``lean``)."""
        self._register_event.set()

    async def register_and_wait(self) -> None:
        """Return once a registration round that carries the topic table as it is now has been
        answered, or after ROUTE_WAIT_S: Java's broker registers a topic it creates before it
        answers the request that created it, so clients can read its route at once."""
        if not self.settings.namesrv_addrs:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._register_waiters.append(waiter)
        self._full_register_due = True
        self._register_event.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ROUTE_WAIT_S):
                await asyncio.shield(waiter)

    def _topic_changed(self, topic: str, tc: TopicConfig | None) -> None:
        if tc is None:
            self.broker_stats.forget_topic(topic)
        self.request_register()

    async def register_all(self, *, lean: bool = False) -> bool:
        """Register with every nameserver; True when all of them accepted.

        ``lean``: a slave sends its topic table's dataVersion without the table. The nameservers
        take a topic table from brokerId 0 only (ours, and RocketMQ 4.9's RouteInfoManager.
        registerBroker); of a slave they keep the address, the HA address and the dataVersion,
        all of which a lean registration carries. A slave that cannot follow its master asks
        again every few seconds for as long as the master is gone, and its whole table (hundreds
        of KB with thousands of topics) went to every nameserver each time for nothing.
        """
        s = self.settings
        if not s.namesrv_addrs:
            return True
        # Read once: the body's form and the brokerId it is registered under must agree.
        broker_id = self.ctx.broker_id
        wrapper = self.topics.wrapper_obj(topics=() if lean and broker_id != 0 else None)
        perm = s.brokerPermission & ~PERM_WRITE if self.store.term_fenced else s.brokerPermission
        if not (perm_readable(perm) and perm_writeable(perm)):
            # As Java's registerBrokerAll: while the broker is not read-write, every route it registers
            # carries the broker's permission instead of the topic's.
            for tc in wrapper["topicConfigTable"].values():
                tc["perm"] = perm
        results = await self.outer.register_broker_all(
            s.namesrv_addrs, cluster_name=s.brokerClusterName, broker_addr=s.broker_addr,
            broker_name=s.brokerName, broker_id=broker_id, ha_server_addr=s.ha_server_addr,
            topic_config_wrapper=wrapper, epoch=self.epochs.epoch)
        if results:
            self.registered = True
            self.master_addr = next((r.master_addr for r in results if r.master_addr), None)
            self.master_ha_addr = next((r.ha_server_addr for r in results if r.ha_server_addr), None)
            if not self.ctx.is_slave and self.master_addr and self.master_addr != s.broker_addr:
                # The nameserver keeps a master of a newer epoch at brokerId 0 (this one hung or was
                # cut off through a failover): clients are not routed here; a demotion follows.
                log.warning("the nameserver routes brokerId 0 of %s to %s, a master of a newer epoch than this "
                            "broker's (%d)", s.brokerName, self.master_addr, self.epochs.epoch)
            self.replication.on_registration(self.master_addr, self.master_ha_addr)
        return len(results) == len(s.namesrv_addrs)

    async def _register_loop(self) -> None:
        while True:
            # Read each round: UPDATE_BROKER_CONFIG may change it.
            period = max(10.0, min(self.settings.registerNameServerPeriod / 1000, 60.0))
            # Cleared before the registration, not after: a request made while it is in flight (a
            # promotion's, a new topic's) is answered by another one, not left to the next period.
            self._register_event.clear()
            # Full: the periodic one, what request_register asked for, and a retry after a failure
            # (a nameserver that missed it gets everything). Lean: only a slave's question for its
            # master (request_master_query, or the last answer named none).
            now = self._last_register_try = time.monotonic()
            full = self._full_register_due or now - self._last_full_register >= period
            self._full_register_due = False
            if full:
                self._last_full_register = now
            complete = False
            ask_again = False
            # Taken just before register_all reads the table: these waiters' changes are in it
            # (register_and_wait asked for a full registration, so this one is).
            waiters: list[asyncio.Future[None]] = []
            if full:
                waiters, self._register_waiters = self._register_waiters, []
            try:
                complete = await self.register_all(lean=not full)
                # Registered before its master did (a group starting together), or the master is
                # gone: the answer named no master, and the slave waits for one. Ask again soon.
                ask_again = complete and self.ctx.is_slave and not self.master_addr
            except Exception:
                log.exception("registration with nameservers failed")
            finally:
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
            if not complete:
                self._full_register_due = True
            try:
                # A nameserver that was unreachable is retried soon, not a whole period later.
                async with asyncio.timeout(period if complete and not ask_again else REGISTER_RETRY_S):
                    await self._register_event.wait()
                # Coalesce bursts of topic changes (e.g. many auto-created topics) into one register.
                await asyncio.sleep(0.05)
            except TimeoutError:
                pass

    async def _persist_metadata(self) -> None:
        await self.topics.persist_if_dirty_async()
        await self.groups.persist_if_dirty_async()

    async def _persist_offsets(self) -> None:
        await self.offsets.persist_if_dirty_async()

    async def _persist_delay_offsets(self) -> None:
        await self.delay_offsets.persist_if_dirty_async()

    async def _reload_acl(self) -> None:
        watcher = self.acl_watcher
        if watcher is not None and (fresh := await asyncio.to_thread(watcher.load_if_changed)) is not None:
            watcher.apply(fresh)

    async def _clean_files(self) -> None:
        await self.cleaner.run_once()

    async def _check_transactions(self) -> None:
        await self.transactions.check_round()

    async def _scan_clients(self) -> None:
        self.clients.scan_expired(self.settings.clientChannelExpiredMillis / 1000)

    @staticmethod
    def _fast_server(main: RemotingServer, settings: BrokerSettings) -> RemotingServer | None:
        """RocketMQ's VIP channel: a second listener (``listenPort - 2`` by default) with the main
        port's handlers, ACL included, except PULL_MESSAGE, which it answers REQUEST_CODE_NOT_SUPPORTED
        as Java's does. Java clients up to 4.4 send there by default, and Java slaves sync metadata
        there. Its connections and requests count in the main port's statistics."""
        port = settings.fast_port
        if not port:
            return None
        fast = RemotingServer(settings.listenHost, port, name="broker VIP channel", stats=main.stats, tls=main.tls,
                              idle_seconds=main.idle_seconds)
        fast.latency = main.latency
        fast.handlers = {code: h for code, h in main.handlers.items() if code != RequestCode.PULL_MESSAGE}
        return fast

    # -- lifecycle --
    async def start(self) -> None:
        s = self.settings
        await self.store.start()
        self.started_ms = int(time.time() * 1000)
        # Before the listener opens: a master back on a replaced volume (or in another broker's
        # term) must refuse the very first send, not one that arrives after the HA service starts.
        await self.replication.prepare()
        await self.server.start()
        if self.fast_server is not None:
            try:
                await self.fast_server.start()
            except OSError as exc:
                await self.server.stop()
                raise OSError(exc.errno, f"fastListenPort {self.fast_server.port} (the VIP channel; 0 turns it "
                                         f"off): {exc.strerror}") from exc
        if self.admin is not None:
            await self.admin.start()
        sup = self.supervisor
        sup.spawn("pull-hold", self.pull.holds.run())
        sup.spawn("register", self._register_loop())
        sup.every("persist-metadata", 1.0, self._persist_metadata)
        sup.every("persist-offsets", s.flushConsumerOffsetInterval / 1000, self._persist_offsets)
        sup.every("persist-delay-offsets", s.flushDelayOffsetInterval / 1000, self._persist_delay_offsets)
        sup.every("scan-clients", 10.0, self._scan_clients)
        # The first round at once: it takes the baseline later rounds count from.
        sup.every("broker-stats", s.statsSamplingInterval / 1000, self.broker_stats.sample, initial_delay=0)
        sup.every("store-stats", 1.0, self.store_stats.sample, initial_delay=0)
        sup.every("transaction-check", s.transactionCheckInterval / 1000, self._check_transactions)
        # The first round soon after start: a disk that is already full refuses sends at once.
        sup.every("clean-files", s.cleanResourceInterval / 1000, self._clean_files,
                  initial_delay=min(1.0, s.cleanResourceInterval / 1000))
        if self.acl_watcher is not None:
            sup.every("acl-reload", ACL_RELOAD_SECONDS, self._reload_acl)
        await self.replication.start()
        self._role_changed(self.ctx.role, at_start=True)
        log.info("broker %s (%s, id %d) serving on %s", s.brokerName, s.brokerRole, s.brokerId, s.broker_addr)

    def _role_changed(self, role: str, *, at_start: bool = False) -> None:
        """Masters deliver delayed messages; slaves don't. Re-register so routes show the new id."""
        previous, self._last_role = self._last_role, role
        if role == "SLAVE":
            self.pull.ended_term()
            if self._schedule_task is not None:
                self._schedule_task.cancel()
                self._schedule_task = None
        else:
            # Synchronously, right after the store took the role: no send is served before the
            # progress copied from the old master is checked against this log.
            self.schedule.correct_offsets()
            self.transactions.correct_progress()
            # Commits a group made here as a slave (kept in consumerOffset.json to hand to that
            # master) are this master's own offsets: on a promotion, and when it starts as one.
            self.offsets.forget_slave_commits()
            if not at_start:
                # A promoted slave: topics created after its last metadata round have messages
                # here but no config. (A master's own queues without config at start are left to
                # cleanUnusedTopic, as in RocketMQ.)
                counts: dict[str, int] = {}
                ends: dict[tuple[str, int], int] = {}
                for topic, queue_id in self.store.list_queues():
                    counts[topic] = max(counts.get(topic, 0), queue_id + 1)
                    ends[(topic, queue_id)] = self.store.get_max_offset_in_queue(topic, queue_id)
                self.topics.restore_from_queues(counts)
                if previous == "SLAVE":
                    self.pull.began_term(ends)
            if self._schedule_task is None or self._schedule_task.done():
                self._schedule_task = self.supervisor.spawn("schedule", self.schedule.run())
        self.request_register()

    # -- admin routes for replication control --
    async def _http_repoint(self, request: web.Request) -> web.Response:
        body = await read_json_object(request)
        ha_addr = body.get("haAddress")
        broker_addr = body.get("brokerAddress")
        epoch = body.get("epoch")
        if not isinstance(ha_addr, str) or not _is_host_port(ha_addr):
            return json_error(400, "haAddress (host:port) is required")
        if broker_addr is not None and (not isinstance(broker_addr, str) or not _is_host_port(broker_addr)):
            return json_error(400, "brokerAddress must be host:port")
        if epoch is not None and not _is_int64(epoch):
            return json_error(400, "epoch must be an integer from 0 to 2^63-1")
        try:
            end = await self.replication.repoint(ha_addr, broker_addr, epoch)
        except RoleChangeError as exc:
            return json_error(409, str(exc))
        return json_response({"haAddress": ha_addr, "brokerAddress": broker_addr, "maxPhyOffset": end})

    async def _http_fence(self, request: web.Request) -> web.Response:
        body = await read_json_object(request)
        epoch = body.get("epoch")
        if not _is_int64(epoch):
            return json_error(400, "epoch must be an integer from 0 to 2^63-1")
        try:
            result = await self.replication.fence(epoch)
        except RoleChangeError as exc:
            return json_error(409, str(exc))
        return json_response(result)

    async def _http_role(self, request: web.Request) -> web.Response:
        body = await read_json_object(request)
        role, broker_id, epoch = body.get("role"), body.get("brokerId"), body.get("epoch")
        if not isinstance(role, str):
            return json_error(400, "role is required")
        if not _is_int64(broker_id):
            return json_error(400, "brokerId must be an integer from 0 to 2^63-1")
        if not _is_int64(epoch):
            return json_error(400, "epoch must be an integer from 0 to 2^63-1")
        drain_ms, sync_metadata = body.get("drainMillis", 0), body.get("syncMetadata", False)
        if not _is_int64(drain_ms) or drain_ms > MAX_DRAIN_MILLIS:
            return json_error(400, f"drainMillis must be an integer from 0 to {MAX_DRAIN_MILLIS}")
        if not isinstance(sync_metadata, bool):
            return json_error(400, "syncMetadata must be true or false")
        drain_for = body.get("drainFor", [])
        if not isinstance(drain_for, list) or len(drain_for) > MAX_DRAIN_FOR or \
                not all(isinstance(a, str) and _is_host_port(a) for a in drain_for):
            return json_error(400, f"drainFor must be a list of at most {MAX_DRAIN_FOR} slave addresses (host:port)")
        if drain_for and not drain_ms:
            return json_error(400, "drainFor needs drainMillis")
        source, not_after = body.get("metadataSource"), body.get("notAfterMillis")
        if source is not None and (not isinstance(source, str) or not _is_host_port(source)):
            return json_error(400, "metadataSource must be host:port")
        if not_after is not None and not _is_int64(not_after):
            return json_error(400, "notAfterMillis must be an integer from 0 to 2^63-1 (Unix milliseconds)")
        try:
            result = await self.replication.change_role(role, broker_id, epoch, drain=drain_ms / 1000,
                                                        drain_for=frozenset(drain_for),
                                                        sync_metadata=sync_metadata, metadata_source=source,
                                                        not_after_ms=not_after)
        except RoleChangeError as exc:
            return json_error(409, str(exc))
        return json_response(result)

    async def _http_commitlog(self, request: web.Request) -> web.StreamResponse:
        try:
            offset = int(request.query.get("offset", "0"))
            length = int(request.query.get("length", str(1 << 20)))
        except ValueError:
            return json_error(400, "offset and length must be integers")
        if offset < 0 or length <= 0:
            return json_error(400, "offset must be >= 0 and length > 0")
        start = max(offset, self.store.min_phy_offset())
        end = min(offset + length, self.store.dispatched_phy_offset())
        resp = web.StreamResponse()
        resp.headers["Content-Type"] = "application/octet-stream"
        resp.headers["X-Commitlog-Offset"] = str(start)
        resp.headers["X-Commitlog-Max-Offset"] = str(self.store.max_phy_offset())
        resp.content_length = max(0, end - start)
        await resp.prepare(request)
        pos = start
        while pos < end:
            view = self.store.read_commitlog(pos, min(end - pos, 1 << 20))
            if view is None:
                break
            # Copy: the mapped file may be truncated by a role change while we await the socket.
            await resp.write(bytes(view))
            pos += len(view)
        await resp.write_eof()
        return resp

    async def _http_consume_queue(self, request: web.Request) -> web.Response:
        """Raw 20-byte units (§4.2) of one queue from a logical offset; without ``topic``, the queue list.

        Units are sent as stored (blank fillers included) so a verifier sees exactly what consumers
        would; ``X-CQ-Min-Offset``/``X-CQ-Max-Offset`` give the queue's current logical range.
        """
        topic = request.query.get("topic")
        if topic is None:
            return json_response([
                {"topic": t, "queueId": qid, "minOffset": self.store.get_min_offset_in_queue(t, qid),
                 "maxOffset": self.store.get_max_offset_in_queue(t, qid)}
                for t, qid in self.store.list_queues()])
        try:
            queue_id = int(request.query.get("queueId", "0"))
            offset = int(request.query.get("offset", "0"))
            count = int(request.query.get("count", "1000"))
        except ValueError:
            return json_error(400, "queueId, offset and count must be integers")
        if queue_id < 0 or offset < 0 or count <= 0:
            return json_error(400, "queueId and offset must be >= 0 and count > 0")
        # Bounded so one request never builds more than ~20 MB of response.
        units = self.store.get_consume_queue_units(topic, queue_id, offset, min(count, 1 << 20))
        resp = web.Response(body=b"".join([UNIT.pack(*u) for u in units]), content_type="application/octet-stream")
        resp.headers["X-CQ-Offset"] = str(offset)
        resp.headers["X-CQ-Min-Offset"] = str(self.store.get_min_offset_in_queue(topic, queue_id))
        resp.headers["X-CQ-Max-Offset"] = str(self.store.get_max_offset_in_queue(topic, queue_id))
        return resp

    async def _http_metadata(self, request: web.Request) -> web.Response:
        """The metadata files' current content (topics and groups with their DataVersion, offsets)."""
        return json_response({
            "topics": json.loads(self.topics.encode()),
            "subscriptionGroups": json.loads(self.groups.encode()),
            "consumerOffsets": json.loads(self.offsets.encode()),
            "delayOffsets": json.loads(self.delay_offsets.encode()),
            # Needed to recompute SCHEDULE_TOPIC_XXXX tagsCodes (delivery time = store time + delay).
            "messageDelayLevel": self.settings.messageDelayLevel,
        })

    async def stop(self) -> None:
        s = self.settings
        await self.supervisor.stop()
        await self.replication.stop()
        await self.server.stop()
        if self.fast_server is not None:
            await self.fast_server.stop()
        if s.namesrv_addrs:
            await self.outer.unregister_broker_all(
                s.namesrv_addrs, cluster_name=s.brokerClusterName, broker_addr=s.broker_addr,
                broker_name=s.brokerName, broker_id=self.ctx.broker_id)
        await self.outer.close()
        for manager in (self.topics, self.groups, self.offsets, self.delay_offsets):
            try:
                await manager.persist_if_dirty_async()
            except Exception:
                log.exception("persisting %s at shutdown failed", manager.path)
        await self.store.shutdown()
        if self.admin is not None:
            await self.admin.stop()
        log.info("broker stopped")


def _is_int64(value: object) -> TypeGuard[int]:
    """A JSON integer Java's long holds and no count goes below: epochs and brokerIds (an epoch
    persisted beyond int64 could never be exceeded by another tool, nor shown by one)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _is_host_port(addr: str) -> bool:
    try:
        host, port = split_addr(addr)
    except ValueError:
        return False
    return bool(host) and 0 < port < 65536


def read_conf(path: str | None) -> str | None:
    return Path(path).read_text(encoding="utf-8") if path else None
