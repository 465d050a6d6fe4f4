"""Slave metadata sync (RocketMQ's SlaveSynchronize, reference §7.6).

Every period the slave asks the master for its topic configs (21), consumer offsets (43), delay
offsets (45) and subscription groups (201). Topic and group tables are replaced only when the
master's DataVersion differs; offsets are merged; delay offsets are written when they changed.
Each table is synced on its own; a failed round is logged and retried next period.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from rmqbroker.ha.epoch import other_logs
from rmqbroker.metadata.consumer_offsets import (
    ConsumerOffsetManager,
    OffsetTable,
    decode_consumer_offsets,
    split_offset_key,
)
from rmqbroker.metadata.delay_offsets import DelayOffsetTable, decode_delay_offsets
from rmqbroker.metadata.errors import MetadataError
from rmqbroker.metadata.subscription_groups import SubscriptionGroupManager, decode_subscription_group_wrapper
from rmqbroker.metadata.topics import TopicConfigManager, decode_topic_sync
from rmqbroker.outer_api import BrokerOuterApi, OuterApiError, OuterApiRefused
from rmqbroker.remoting.codes import RequestCode

log = logging.getLogger(__name__)

# A step failing with one of these fails the round but not the round's other steps.
_STEP_ERRORS = (OuterApiError, MetadataError, ValueError)


class MetadataSyncError(Exception):
    """One sync round failed."""


class ForeignMasterError(MetadataSyncError):
    """The address answered as a broker of another broker name or cluster; nothing was taken."""


class RepointedError(MetadataSyncError):
    """The slave was re-pointed while a round asked its previous master: what that master answered
    afterwards is not taken (a hung master answering late would otherwise overwrite offsets and
    tables after the re-point, and get this slave's outage commits handed to it)."""


class SlaveMetadataSync:
    """Pulls metadata from the master broker address; re-pointable at runtime."""

    def __init__(self, api: BrokerOuterApi, own_addr: str, topics: TopicConfigManager,
                 groups: SubscriptionGroupManager, offsets: ConsumerOffsetManager, delay: DelayOffsetTable,
                 *, initial_delay: float = 3.0, interval: float = 10.0,
                 on_topic_deleted: Callable[[str], Awaitable[object]] | None = None,
                 on_master_deletions: Callable[[dict[str, int]], Awaitable[object]] | None = None,
                 stream_refusal: Callable[[], str | None] | None = None,
                 own_log_id: Callable[[], str | None] | None = None) -> None:
        self.api = api
        # The identity of this slave's log: a master's table that names another is not taken.
        self.own_log_id = own_log_id
        # Why the HA link refuses the followed master's log, if it does: then nothing is synced.
        self.stream_refusal = stream_refusal
        # Called for each non-system topic the master no longer has (its consume queues go too).
        self.on_topic_deleted = on_topic_deleted
        # Called every round with the master's deleted topics and where its log ended for each.
        self.on_master_deletions = on_master_deletions
        self.own_addr = own_addr
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.delay = delay
        self.initial_delay = initial_delay
        self.interval = interval
        self.master_addr: str | None = None
        self.last_success_ms = 0
        self.rounds = 0
        self.failures = 0
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._restart = asyncio.Event()
        self._soon = asyncio.Event()
        # The address whose topic table last showed it to be this slave's group's master.
        self._verified_master: str | None = None
        # The consumer offsets the master named here reported in its last round (in memory only:
        # after a restart, a re-point or a promotion nothing counts as received until a round is).
        self._received_offsets: OffsetTable = {}
        self._received_from: str | None = None

    def set_master(self, addr: str | None) -> None:
        if addr != self.master_addr:
            log.info("metadata sync master %s -> %s", self.master_addr, addr)
            self.master_addr = addr
            self._restart.set()

    def sync_soon(self) -> None:
        """Run the next round now rather than at the end of the period: the master this slave
        follows is back (its HA link streams again). Offsets a group committed here while it was
        away are handed to it in that round; until then a consumer that starts or takes over a
        queue reads the master's stale offset there and re-consumes what it consumed during the
        outage, for up to slaveSyncInterval (10 s) instead of the HA reconnect (about 1 s)."""
        self._soon.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="slave-metadata-sync")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # asyncio.wait, not ``await task``: a cancellation of the caller itself must not be
            # taken for the task's own and swallowed with it.
            await asyncio.wait({task})
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.warning("slave metadata sync ended with %r", exc)

    async def _run(self) -> None:
        delay = self.initial_delay
        while True:
            restart = asyncio.ensure_future(self._restart.wait())
            soon = asyncio.ensure_future(self._soon.wait())
            try:
                done, _ = await asyncio.wait({restart, soon}, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            finally:
                restart.cancel()
                soon.cancel()
            if restart in done:
                # Re-pointed (perhaps during the last round): sync against the new master after
                # the initial delay again.
                self._restart.clear()
                delay = self.initial_delay
                continue
            self._soon.clear()
            try:
                await self.sync_all()
            except RepointedError as exc:
                log.info("slave metadata sync round dropped: %s", exc)
                continue
            except MetadataSyncError as exc:
                self.failures += 1
                self.last_error = str(exc)
                log.warning("slave metadata sync failed (retrying in %gs): %s", self.interval, exc)
            except Exception as exc:
                # A bug (a callback's, a decoder's) must cost one round, not every later one: an
                # exception leaving this loop would end the sync until the process restarts.
                self.failures += 1
                self.last_error = f"unexpected error: {exc!r}"
                log.exception("slave metadata sync round failed unexpectedly (retrying in %gs)", self.interval)
            delay = self.interval

    async def sync_all(self, master: str | None = None) -> None:
        """One round against ``master`` (default: the master this slave follows).

        Each table is synced on its own, as in RocketMQ's SlaveSynchronize: one that fails (a
        timeout, a body that does not decode) is reported with the round's failure but does not
        hold back the others, so a topic table too slow to fetch cannot keep consumer offsets
        from reaching the slave. Only the topic table tells whose master the address is: until
        one was read from it, nothing else is taken, and a foreign one fails the whole round.
        A round against the followed master ends with :class:`RepointedError` at the first answer
        that comes after a re-point; one against a given ``master`` (a promotion's last) does not.
        """
        followed = master is None
        master = master or self.master_addr
        if not master or master == self.own_addr:
            return
        refusal = self.stream_refusal() if followed and self.stream_refusal is not None else None
        if refusal is not None:
            # Its log may not be this slave's (a master back on a replaced volume, an older term,
            # a slave): its topic table would delete this slave's topics and their consume queues.
            raise MetadataSyncError(f"nothing taken from {master}: {refusal}")

        def check() -> None:
            if followed and self.master_addr != master:
                raise RepointedError(f"re-pointed from {master} to {self.master_addr} during the round")

        failures: list[tuple[str, Exception]] = []
        try:
            await self._sync_topics(master, check)
        except _STEP_ERRORS as exc:
            failures.append(("topic config", exc))
        if master == self._verified_master:
            # Groups before offsets: whether the master still has an offset's group is read from them.
            for what, step in (("subscription groups", self._sync_groups), ("consumer offsets", self._sync_offsets),
                               ("delay offsets", self._sync_delay)):
                try:
                    await step(master, check)
                except _STEP_ERRORS as exc:
                    failures.append((what, exc))
        if failures:
            raise MetadataSyncError("; ".join(f"{what}: {exc}" for what, exc in failures)) from failures[0][1]
        self.rounds += 1
        self.last_error = None
        self.last_success_ms = int(time.time() * 1000)

    async def _sync_topics(self, master: str, check: Callable[[], None]) -> None:
        body = await self.api.get_all(master, RequestCode.GET_ALL_TOPIC_CONFIG)
        # Decoded in a worker thread, as every body of the round: thousands of topics or offsets
        # (a Java master's bare integer keys rewritten first) held the event loop ~0.2 s.
        table, version, deleted, log_id = await asyncio.to_thread(decode_topic_sync, body)
        check()
        self._check_same_group(master, table)
        own_log = self.own_log_id() if self.own_log_id is not None else None
        if other_logs(log_id, own_log):
            # Checked in the same answer as the table: a master restarted on a replaced volume
            # between the HA link's last handshake and this round is caught all the same.
            self._verified_master = None
            raise ForeignMasterError(f"{master} serves log {log_id}, not this slave's log {own_log} (a master back "
                                     "on a replaced volume?): nothing synced")
        if deleted and self.on_master_deletions is not None:
            # First, so that a topic deleted and created again since the last round loses the
            # queues of its earlier life even though it never went missing from the table.
            await self.on_master_deletions(deleted)
        before = set(self.topics.topic_names())
        if version is not None and self.topics.replace_all(table, version, persist=False):
            await self.topics.persist_async()
            log.info("topic config synced from %s (version %s)", master, version)
            if self.on_topic_deleted is not None:
                for topic in sorted(before - set(table)):
                    if not self.topics.is_system_topic(topic):
                        log.info("topic %s deleted on master %s", topic, master)
                        await self.on_topic_deleted(topic)

    def _check_same_group(self, master: str, table: Mapping[str, object]) -> None:
        """Refuse a master of another broker group (a re-point or an address reused by mistake).

        Every master's table holds a topic named after its brokerName and one after its cluster
        (built in, Java's brokers too, and refused by DELETE_TOPIC), so a table without this
        slave's names is another group's; adopting it would drop this slave's topics as deleted
        (their consume queues go) and mix that broker's offsets into this one's.
        """
        missing = [name for name in (self.topics.broker_name, self.topics.cluster_name) if name not in table]
        if missing:
            self._verified_master = None
            raise ForeignMasterError(
                f"{master} is not a master of broker {self.topics.broker_name} in cluster "
                f"{self.topics.cluster_name}: its topic table lacks {', '.join(missing)}; nothing synced")
        self._verified_master = master

    async def _sync_offsets(self, master: str, check: Callable[[], None]) -> None:
        body = await self.api.get_all(master, RequestCode.GET_ALL_CONSUMER_OFFSET)
        table = await asyncio.to_thread(decode_consumer_offsets, body)
        check()
        # Only the keys the master does not report are looked at beyond the merge; the table can
        # hold hundreds of thousands of queue offsets, so it is neither copied nor merged at once.
        current = self.offsets.entries([key for key in self.offsets.table_keys() if key not in table])
        changed = await self.offsets.merge_all_async(table)
        # Merged, not replaced (RocketMQ's putAll): offsets committed here while the master was
        # away stay. Those the master removed with their topic (DELETE_TOPIC) or their group
        # (DELETE_SUBSCRIPTIONGROUP with removeOffset) go: promoted, this broker would otherwise
        # hand them to a topic or group created again under the name, whose queues restart at 0.
        committed_here = self.offsets.keys_committed_here()
        gone = [key for key in current if key not in table and self._removed_on_master(key, committed_here)]
        dropped, kept = self._received_then_removed(master, current, table, set(gone))
        gone += dropped
        if kept:
            self.offsets.merge_all(kept)
            changed = True
        if gone and self.offsets.remove_keys(gone):
            log.info("offsets removed on master %s removed here too: %s", master, gone)
            changed = True
        if kept:
            log.info("offsets removed on master %s removed here too (queues committed here kept): %s", master,
                     {key: sorted(set(current[key]) - set(queues)) for key, queues in kept.items()})
        self._received_offsets = table  # decoded for this round alone: nothing else holds or changes it
        self._received_from = master
        if changed:
            await self.offsets.persist_async()
        await self._relay_offsets(master, check)

    async def _relay_offsets(self, master: str, check: Callable[[], None]) -> None:
        """Hand the master the commits a group made here while it was away and that it still has
        nothing newer than. Stock clients commit to the master again only once their route shows it
        (every 30 s), and read their offsets from it when they restart or take over a queue: without
        this, a group that stopped or rebalanced in that time would re-consume everything it
        consumed during the outage (RocketMQ 4.9 does). Until the master reports an offset other
        than the one handed to it, later commits here are handed on too."""
        refused: list[str] = []
        for group, topic, queue_id, offset in self.offsets.kept_over_master():
            check()
            try:
                await self.api.update_consumer_offset(master, group, topic, queue_id, offset)
            except OuterApiRefused as exc:
                # One group's refusal (e.g. aclAccessKey without SUB on it) must not hold back the
                # others' hand-over; it stays kept here and is offered again next round.
                refused.append(f"{group} on {topic} queue {queue_id}: {exc}")
                continue
            self.offsets.relayed(group, topic, queue_id, offset)
            log.info("offset of %s on %s queue %d committed here while master %s was away handed to it: %d",
                     group, topic, queue_id, master, offset)
        if refused:
            raise OuterApiError(f"{len(refused)} offset(s) committed here not handed over: {'; '.join(refused[:3])}")

    def _received_then_removed(self, master: str, current: OffsetTable, table: OffsetTable,
                               gone: set[str]) -> tuple[list[str], OffsetTable]:
        """The offsets this slave last received from ``master`` that ``master`` no longer reports.

        A topic deleted and created again between two rounds never leaves the topic table, so
        _removed_on_master keeps the offsets the master dropped with it (those of the groups that
        have not committed on the new topic yet); promoted, this slave would hand them to the new
        topic's queues. A queue offset still as the master reported it last round was removed
        there; one changed since (committed here while the master was away) is kept, as putAll
        keeps it. Returns the keys to remove whole and, for keys with some queues committed here,
        what remains of them.
        """
        if master != self._received_from:
            return [], {}
        dropped: list[str] = []
        kept: OffsetTable = {}
        for key, queues in current.items():
            last = self._received_offsets.get(key)
            if key in table or key in gone or not last:
                continue
            remaining = {qid: offset for qid, offset in queues.items() if last.get(qid) != offset}
            if not remaining:
                dropped.append(key)
            elif len(remaining) < len(queues):
                kept[key] = remaining
        return dropped, kept

    def forget_received(self) -> None:
        """This broker stopped being a slave: what a master reported before says nothing about
        the offsets it holds once it follows one again (they may be its own consumers' since)."""
        self._received_offsets = {}
        self._received_from = None

    def _removed_on_master(self, key: str, committed_here: set[str]) -> bool:
        """Whether the master no longer has the topic or the group of an offset table key (the
        topic and group tables are the master's as of this round); a group it never had whose
        commits here wait to be handed over (``committed_here``, keys) is not removed."""
        parts = split_offset_key(key)
        if parts is None:
            return False
        topic, group = parts
        if topic not in self.topics:
            return True
        # A group first seen while the master was away (its consumer started then) exists only
        # here: its commits are handed to the master below, not dropped as removed there.
        return group not in self.groups and key not in committed_here

    async def _sync_delay(self, master: str, check: Callable[[], None]) -> None:
        body = await self.api.get_all(master, RequestCode.GET_ALL_DELAY_OFFSET)
        decoded = await asyncio.to_thread(decode_delay_offsets, body)
        check()
        if decoded != self.delay.table():
            await asyncio.to_thread(self.delay.replace_from_json, body.decode("utf-8"))

    async def _sync_groups(self, master: str, check: Callable[[], None]) -> None:
        body = await self.api.get_all(master, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        table, version = await asyncio.to_thread(decode_subscription_group_wrapper, body)
        check()
        if version is not None and self.groups.replace_all(table, version, persist=False):
            await self.groups.persist_async()
            log.info("subscription groups synced from %s (version %s)", master, version)
