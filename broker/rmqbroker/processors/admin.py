"""Admin and replication-source codes: 17, 21, 28, 43, 45, 200, 201, 202, 207, 208, 215, 222, 300, 307,
314, 315, 317, 329 (reference §2.13, §2.14; 200-329 follow RocketMQ's AdminBrokerProcessor)."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable

from rmqbroker.broker_stats import BrokerStatsManager
from rmqbroker.metadata.jsonfile import dumps_mq_keyed, fastjson_loads
from rmqbroker.metadata.subscription_groups import SubscriptionGroupConfig
from rmqbroker.metadata.topics import (
    DELETED_TOPICS_KEY,
    DLQ_GROUP_TOPIC_PREFIX,
    LOG_ID_KEY,
    MULTI_TAG,
    RETRY_GROUP_TOPIC_PREFIX,
    SINGLE_TAG,
    TopicConfig,
    is_not_allowed_send_topic,
    is_topic_or_group_illegal,
    validate_topic,
)
from rmqbroker.processors.broker2client import Broker2Client
from rmqbroker.processors.context import BrokerContext
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import Connection, RemotingServer
from rmqbroker.remoting.wire import INT32_MAX, BadRequestError, Header
from rmqbroker.store.message_store import SCHEDULE_TOPIC
from rmqbroker.store.retention import CleanService, disk_capacity, disk_used_ratio

log = logging.getLogger(__name__)

BROKER_VERSION_DESC = "V4_9_8"


def human_bytes(n: int) -> str:
    """Java's ``MixAll.humanReadableByteCount(n, false)``: "512 B", "1.5 KiB", "45.2 GiB"."""
    if n < 1024:
        return f"{n} B"
    exp = min(int(math.log(n) / math.log(1024)), 6)
    return f"{n / 1024 ** exp:.1f} {'KMGTPE'[exp - 1]}iB"


GROUP_MAX_LENGTH = 255
SLAVE_REMARK = "Can't modify topic or subscription group from slave broker, please execute it from master broker."


def validate_group(name: str) -> str | None:
    """An error remark for an unusable consumer group name, or None."""
    if not name.strip():
        return "the specified group is blank"
    if len(name) > GROUP_MAX_LENGTH:
        return f"the specified group is longer than group max length {GROUP_MAX_LENGTH}"
    if is_topic_or_group_illegal(name):
        return f"the specified group[{name}] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    return None


def _group_numbers_problem(cfg: SubscriptionGroupConfig) -> str | None:
    """Numbers a group config cannot have: counts and broker ids are non-negative Java ints, and a
    retry topic has at most 1024 queues like any topic."""
    for name, value, lo, hi in (("retryQueueNums", cfg.retry_queue_nums, 0, 1024),
                                ("retryMaxTimes", cfg.retry_max_times, -1, INT32_MAX),
                                ("brokerId", cfg.broker_id, 0, INT32_MAX),
                                ("whichBrokerWhenConsumeSlowly", cfg.which_broker_when_consume_slowly, 0, INT32_MAX)):
        if not lo <= value <= hi:
            return f"{name} must be in [{lo}, {hi}], got {value}"
    return None


class AdminProcessor:
    """Topic administration, runtime info and the GET_ALL_* bodies a slave syncs from."""

    def __init__(self, ctx: BrokerContext, runtime_info: Callable[[], dict[str, str]] | None = None,
                 cleaner: CleanService | None = None, broker_stats: BrokerStatsManager | None = None) -> None:
        self.ctx = ctx
        self.boot_ms = int(time.time() * 1000)
        self._runtime_info = runtime_info
        self._cleaner = cleaner
        self._broker_stats = broker_stats
        self.b2c = Broker2Client(ctx.clients)

    def register(self, server: RemotingServer) -> None:
        server.register(RequestCode.UPDATE_AND_CREATE_TOPIC, self.update_and_create_topic)
        server.register(RequestCode.GET_ALL_TOPIC_CONFIG, self.get_all_topic_config)
        server.register(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER, self.get_system_topic_list)
        server.register(RequestCode.GET_ALL_CONSUMER_OFFSET, self.get_all_consumer_offset)
        server.register(RequestCode.GET_ALL_DELAY_OFFSET, self.get_all_delay_offset)
        server.register(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, self.get_all_subscription_groups)
        server.register(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, self.update_and_create_subscription_group)
        server.register(RequestCode.DELETE_SUBSCRIPTIONGROUP, self.delete_subscription_group)
        server.register(RequestCode.GET_TOPIC_STATS_INFO, self.get_topic_stats_info)
        server.register(RequestCode.GET_CONSUME_STATS, self.get_consume_stats)
        server.register(RequestCode.GET_BROKER_CONSUME_STATS, self.get_broker_consume_stats)
        if self._broker_stats is not None:
            server.register(RequestCode.VIEW_BROKER_STATS_DATA, self.view_broker_stats_data)
        server.register(RequestCode.DELETE_TOPIC_IN_BROKER, self.delete_topic)
        server.register(RequestCode.GET_BROKER_RUNTIME_INFO, self.get_runtime_info)
        server.register(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, self.reset_offset)
        server.register(RequestCode.GET_CONSUMER_RUNNING_INFO, self.consumer_running_info)
        server.register(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, self.topic_consumed_by_who)
        server.register(RequestCode.CLONE_GROUP_OFFSET, self.clone_group_offset)
        server.register(RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, self.clean_expired_consume_queue)
        server.register(RequestCode.CLEAN_UNUSED_TOPIC, self.clean_unused_topic)
        if self._cleaner is not None:
            server.register(RequestCode.DELETE_EXPIRED_COMMITLOG, self.delete_expired_commitlog)

    async def clean_expired_consume_queue(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin cleanExpiredCQ: consume queues whose every message retention deleted go."""
        dropped = await self.ctx.store.clean_expired_consume_queues()
        return cmd.make_response(ResponseCode.SUCCESS, f"removed {len(dropped)} expired consume queue(s)"
                                 + (f": {', '.join(dropped)}" if dropped else ""))

    async def clean_unused_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin cleanUnusedTopic: consume queues of topics this broker has no config for go
        (as a deleted topic's: their records stay out of queues from then on). System, retry and
        dead-letter topics' queues stay whatever the config says."""
        ctx = self.ctx
        configured = set(ctx.topics.topic_names())
        unused = sorted({topic for topic, _qid in ctx.store.list_queues()
                         if topic not in configured and not ctx.topics.is_system_topic(topic)
                         and not topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))})
        for topic in unused:
            await ctx.store.delete_topic_queues(topic)
        return cmd.make_response(ResponseCode.SUCCESS, f"removed the consume queues of {len(unused)} unused "
                                 f"topic(s)" + (f": {', '.join(unused)}" if unused else ""))

    async def delete_expired_commitlog(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin deleteExpiredCommitLog: expired segments go now and in the next rounds, whatever
        the hour in deleteWhen (segments younger than fileReservedTime stay, as in RocketMQ)."""
        cleaner = self._cleaner
        assert cleaner is not None
        cleaner.request_manual_delete()
        report = await cleaner.run_once()
        return cmd.make_response(ResponseCode.SUCCESS,
                                 f"deleted {report.commitlog_files_deleted} commitlog and "
                                 f"{report.consume_queue_files_deleted} consume queue file(s)")

    async def update_and_create_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        ctx = self.ctx
        if ctx.is_slave:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, SLAVE_REMARK)
        h = Header(cmd.ext_fields)
        topic = h.req_str(wire.TOPIC)
        problem = validate_topic(topic)
        # Raised, not returned: the server counts what the client got wrong (rmq_remoting_bad_requests).
        if problem is not None:
            raise BadRequestError(ResponseCode.SYSTEM_ERROR, problem)
        if is_not_allowed_send_topic(topic):
            raise BadRequestError(ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic.")
        read = h.req_int(wire.READ_QUEUE_NUMS)
        write = h.req_int(wire.WRITE_QUEUE_NUMS)
        perm = h.req_int(wire.PERM)
        filter_type = h.opt_str(wire.TOPIC_FILTER_TYPE) or SINGLE_TAG
        if not (0 < read <= 1024 and 0 < write <= 1024) or not 0 <= perm <= 15 \
                or filter_type not in (SINGLE_TAG, MULTI_TAG):
            raise BadRequestError(ResponseCode.SYSTEM_ERROR, "readQueueNums/writeQueueNums must be 1..1024, "
                                  "perm 0..15, topicFilterType SINGLE_TAG or MULTI_TAG")
        tc = TopicConfig(topic, read, write, perm, filter_type, h.opt_int(wire.TOPIC_SYS_FLAG, 0),
                         h.opt_bool(wire.ORDER))
        ctx.topics.update_topic_config(tc, persist=False)
        await ctx.topics.persist_async()
        # Answered once the nameservers route it, as Java's registerIncrementBrokerData is awaited:
        # `updateTopic` and then a consumer's start find the route.
        await ctx.register_and_wait()
        return cmd.make_response(ResponseCode.SUCCESS)

    async def update_and_create_subscription_group(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Create or replace a consumer group from its SubscriptionGroupConfig JSON body (mqadmin
        updateSubGroup): how groups come to exist when autoCreateSubscriptionGroup is off. Slaves
        get it through their metadata sync (the table's DataVersion moves)."""
        ctx = self.ctx
        if ctx.is_slave:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, SLAVE_REMARK)
        if not cmd.body:
            raise BadRequestError(ResponseCode.SYSTEM_ERROR, "the request body must be a SubscriptionGroupConfig "
                                                             "JSON object")
        try:
            cfg = SubscriptionGroupConfig.from_json_obj(fastjson_loads(bytes(cmd.body)))
        except ValueError as exc:  # MetadataFormatError: not JSON, or not a group object
            raise BadRequestError(ResponseCode.SYSTEM_ERROR, f"bad SubscriptionGroupConfig body: {exc}") from exc
        problem = validate_group(cfg.group_name) or _group_numbers_problem(cfg)
        if problem is not None:
            raise BadRequestError(ResponseCode.SYSTEM_ERROR, problem)
        ctx.groups.update(cfg, persist=False)
        await ctx.groups.persist_async()
        return cmd.make_response(ResponseCode.SUCCESS)

    async def delete_subscription_group(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Delete a consumer group (mqadmin deleteSubGroup), with its consumer offsets when the
        header asks for it. An absent group is not an error, as in RocketMQ."""
        ctx = self.ctx
        if ctx.is_slave:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, SLAVE_REMARK)
        h = Header(cmd.ext_fields)
        group = h.req_str(wire.GROUP_NAME)
        remove_offsets = h.opt_bool(wire.REMOVE_OFFSET) or h.opt_bool(wire.CLEAN_OFFSET)
        if ctx.groups.delete(group, persist=False):
            await ctx.groups.persist_async()
        if remove_offsets and ctx.offsets.remove_offsets(group):
            await ctx.offsets.persist_async()
        return cmd.make_response(ResponseCode.SUCCESS)

    async def get_topic_stats_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Min and max logical offset and last store time of each write queue (mqadmin
        topicStatus): a TopicStatsTable body."""
        ctx = self.ctx
        topic = Header(cmd.ext_fields).req_str(wire.TOPIC)
        tc = ctx.topics.select(topic)
        if tc is None:
            return cmd.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store = ctx.store
        entries = []
        for qid in range(tc.write_queue_nums):
            low = max(0, store.get_min_offset_in_queue(topic, qid))
            high = max(0, store.get_max_offset_in_queue(topic, qid))
            last = store.get_message_store_timestamp(topic, qid, high - 1) if high > 0 else 0
            entries.append((ctx.settings.brokerName, topic, qid,
                            {"lastUpdateTimestamp": last, "maxOffset": high, "minOffset": low}))
        return cmd.make_response(ResponseCode.SUCCESS, body=dumps_mq_keyed("offsetTable", entries))

    def _queue_progress(self, group: str, topic: str, queue_nums: int) -> list[tuple[str, str, int, dict[str, int]]]:
        """A group's OffsetWrapper of each of a topic's first ``queue_nums`` queues: broker offset,
        committed offset and the store time of the last consumed message (a ConsumeStats table)."""
        ctx = self.ctx
        store = ctx.store
        entries = []
        for qid in range(queue_nums):
            broker_offset = max(0, store.get_max_offset_in_queue(topic, qid))
            consumer_offset = max(0, ctx.offsets.query(group, topic, qid))
            last = 0
            if consumer_offset > 0:
                last = max(0, store.get_message_store_timestamp(topic, qid, consumer_offset - 1))
            entries.append((ctx.settings.brokerName, topic, qid, {
                "brokerOffset": broker_offset, "consumerOffset": consumer_offset, "lastTimestamp": last}))
        return entries

    async def get_consume_stats(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """A consumer group's progress per read queue (mqadmin consumerProgress): broker offset,
        committed offset and the store time of the last consumed message; a ConsumeStats body.
        Without a topic, every topic the group has committed offsets on. A topic the group's
        online consumers do not subscribe to is left out, as in RocketMQ."""
        ctx = self.ctx
        h = Header(cmd.ext_fields)
        group = h.req_str(wire.CONSUMER_GROUP)
        only = (h.opt_str(wire.TOPIC) or "").strip()
        topics = [only] if only else sorted(ctx.offsets.which_topics_by_group(group))
        entries = []
        for topic in topics:
            tc = ctx.topics.select(topic)
            if tc is None or ctx.clients.online_elsewhere(group, topic):
                continue
            entries += self._queue_progress(group, topic, tc.read_queue_nums)
        tps = float(ctx.stats.group_get_tps(group, topics))
        return cmd.make_response(ResponseCode.SUCCESS, body=dumps_mq_keyed("offsetTable", entries, consumeTps=tps))

    async def get_broker_consume_stats(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin brokerConsumeStats: every subscription group's ConsumeStats per topic it has
        offsets on (each write queue, as RocketMQ counts them here), with the broker-wide backlog; a
        ConsumeStatsList body. With ``isOrder`` only order topics count. As in GET_CONSUME_STATS, a
        topic the group's online consumers do not subscribe to is left out; a group with no topic
        left is still listed, with an empty list."""
        ctx = self.ctx
        # A Java boolean header field: required, and true only for "true".
        is_order = Header(cmd.ext_fields).req_str(wire.IS_ORDER).lower() == "true"
        groups = []
        total_diff = 0
        for group in sorted(ctx.groups.table()):
            per_topic = []
            for topic in sorted(ctx.offsets.which_topics_by_group(group)):
                tc = ctx.topics.select(topic)
                if tc is None or (is_order and not tc.order) or ctx.clients.online_elsewhere(group, topic):
                    continue
                entries = self._queue_progress(group, topic, tc.write_queue_nums)
                total_diff += sum(e[3]["brokerOffset"] - e[3]["consumerOffset"] for e in entries)
                tps = float(ctx.stats.group_get_tps(group, [topic]))
                per_topic.append(dumps_mq_keyed("offsetTable", entries, consumeTps=tps).decode("utf-8"))
            groups.append(f"{{{json.dumps(group)}:[{','.join(per_topic)}]}}")
        body = (f'{{"brokerAddr":{json.dumps(ctx.settings.broker_addr)},"consumeStatsList":[{",".join(groups)}],'
                f'"totalDiff":{total_diff}}}')
        return cmd.make_response(ResponseCode.SUCCESS, body=body.encode("utf-8"))

    async def view_broker_stats_data(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin statsAll and the Dashboard: one stats item's minute, hour and day figures (a
        BrokerStatsData body; see broker_stats for what is measured how)."""
        stats = self._broker_stats
        assert stats is not None
        h = Header(cmd.ext_fields)
        name = h.req_str(wire.STATS_NAME)
        key = h.req_str(wire.STATS_KEY)
        item = stats.get_item(name, key)
        if item is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        return cmd.make_response(ResponseCode.SUCCESS,
                                 body=json.dumps(item.to_json_obj(), separators=(",", ":")).encode("utf-8"))

    async def delete_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Delete a topic (mqadmin deleteTopic, which then asks the nameservers to drop its route):
        its config, its consume queues and every group's offsets on it, so that a topic created
        again under the name starts from queue offset 0. Slaves follow through their metadata
        sync. Deleting a topic that does not exist is not an error, as in RocketMQ."""
        ctx = self.ctx
        if ctx.is_slave:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, SLAVE_REMARK)
        topic = Header(cmd.ext_fields).req_str(wire.TOPIC)
        problem = validate_topic(topic)
        if problem is not None:
            raise BadRequestError(ResponseCode.SYSTEM_ERROR, problem)
        if ctx.topics.is_system_topic(topic) or is_not_allowed_send_topic(topic):
            raise BadRequestError(ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic.")
        if ctx.topics.delete_topic(topic, persist=False):
            await ctx.topics.persist_async()
            ctx.register_now()
        await ctx.store.delete_topic_queues(topic)
        if ctx.offsets.remove_offsets(topic=topic):
            await ctx.offsets.persist_async()
        return cmd.make_response(ResponseCode.SUCCESS)

    async def get_all_topic_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        if len(self.ctx.topics) == 0:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "No topic in this broker")
        deleted = self.ctx.store.deleted_topics()
        extra: dict[str, object] = {DELETED_TOPICS_KEY: deleted} if deleted else {}
        if (log_id := self.ctx.log_id()) is not None:
            extra[LOG_ID_KEY] = log_id
        body = await self.ctx.topics.encode_async(extra=extra or None)
        return cmd.make_response(ResponseCode.SUCCESS, body=body.encode("utf-8"))

    async def get_system_topic_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """TopicList of the system topics: what a Java admin client's getSystemTopicList adds to the
        nameserver's answer (GET_SYSTEM_TOPIC_LIST_FROM_NS), and fails without."""
        body = json.dumps({"topicList": self.ctx.topics.system_topic_names()}, separators=(",", ":"))
        return cmd.make_response(ResponseCode.SUCCESS, body=body.encode("utf-8"))

    async def get_all_consumer_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(ResponseCode.SUCCESS, body=(await self.ctx.offsets.encode_async()).encode("utf-8"))

    async def get_all_delay_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(ResponseCode.SUCCESS, body=self.ctx.delay_offsets.encode().encode("utf-8"))

    async def get_all_subscription_groups(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(ResponseCode.SUCCESS, body=(await self.ctx.groups.encode_async()).encode("utf-8"))

    async def reset_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin resetOffsetByTime for a group that is online (Broker2Client.resetOffset): each queue's
        offset moves where SEARCH_OFFSET_BY_TIMESTAMP points (reference §2.9, as Java 4.x: a message
        stored at ``timestamp``, else the nearer neighbour, which may be the last one stored before
        it; -1: the queue's end); without ``isForce`` only backwards. The group's online consumers get the new offsets
        (RESET_CONSUMER_CLIENT_OFFSET, in their own language's body) and drop what they hold."""
        ctx = self.ctx
        if ctx.is_slave:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "reset offset on the master: a slave's offsets "
                                                               "follow the master's")
        h = Header(cmd.ext_fields)
        topic = h.req_str(wire.TOPIC)
        group = h.req_str(wire.GROUP)
        timestamp = h.req_int(wire.TIMESTAMP)
        force = h.opt_bool(wire.IS_FORCE)
        tc = ctx.topics.select(topic)
        if tc is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "[reset-offset] reset offset failed, no topic in "
                                                                f"this broker. topic={topic}")
        store = ctx.store
        table: dict[int, int] = {}
        for qid in range(tc.write_queue_nums):
            current = ctx.offsets.query(group, topic, qid)
            if current < 0:
                return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"THe consumer group <{group}> not exist")
            target = store.get_max_offset_in_queue(topic, qid) if timestamp == -1 \
                else store.get_offset_in_queue_by_time(topic, qid, timestamp)
            target = max(target, 0)
            table[qid] = target if force or target < current else current
        if not self.b2c.group_channels(group):
            return cmd.make_response(ResponseCode.CONSUMER_NOT_ONLINE, "Consumer not online, so can not reset "
                                     f"offset, Group: {group} Topic: {topic} Timestamp: {timestamp}")
        for qid, offset in table.items():
            # Committed here too: a member that joins before the others persist theirs starts right.
            ctx.offsets.commit(group, topic, qid, offset, "reset-offset")
        java_body, told = self.b2c.reset_offset(group, topic, ctx.settings.brokerName, timestamp, force, table)
        log.info("reset offsets of group %s on %s to %s (timestamp %d, force %s) for %d client(s)", group, topic,
                 table, timestamp, force, told)
        return cmd.make_response(ResponseCode.SUCCESS, body=java_body)

    async def topic_consumed_by_who(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """The groups that consume a topic: online subscribers, and groups with offsets on it."""
        topic = Header(cmd.ext_fields).req_str(wire.TOPIC)
        clients = self.ctx.clients
        groups = {g for g, info in clients.consumers.items() if info.channels and topic in info.subscriptions}
        groups |= self.ctx.offsets.which_groups_by_topic(topic)
        return cmd.make_response(ResponseCode.SUCCESS, body=json.dumps({"groupList": sorted(groups)},
                                                                       separators=(",", ":")).encode())

    async def clone_group_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin cloneGroupOffset: a new group starts where another one is, on one topic or on
        every topic the source group has offsets on. Unless ``offline``, a topic the source group is
        online without subscribing to is skipped (RocketMQ's rule)."""
        ctx = self.ctx
        if ctx.is_slave:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, SLAVE_REMARK)
        h = Header(cmd.ext_fields)
        src = h.req_str(wire.SRC_GROUP)
        dest = h.req_str(wire.DEST_GROUP)
        problem = validate_group(dest)
        if problem is not None:
            raise BadRequestError(ResponseCode.SYSTEM_ERROR, problem)
        topic = h.opt_str(wire.TOPIC)
        offline = h.opt_bool(wire.OFFLINE)
        topics = [topic] if topic else sorted(ctx.offsets.which_topics_by_group(src))
        cloned = []
        for t in topics:
            if ctx.topics.select(t) is None or (not offline and ctx.clients.online_elsewhere(src, t)):
                continue
            if ctx.offsets.clone_offset(src, dest, t):
                cloned.append(t)
        log.info("cloned offsets of group %s to %s on %s", src, dest, cloned)
        return cmd.make_response(ResponseCode.SUCCESS, f"cloned {len(cloned)} topic(s): {', '.join(cloned)}")

    async def consumer_running_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin consumerStatus: the broker asks one connected consumer for its ConsumerRunningInfo
        (its properties, subscriptions, and the state of every queue it consumes) and passes the
        answer on as it came."""
        h = Header(cmd.ext_fields)
        group = h.req_str(wire.CONSUMER_GROUP)
        client_id = h.req_str(wire.RUNNING_INFO_CLIENT_ID)
        answer = await self.b2c.call_consumer(RequestCode.GET_CONSUMER_RUNNING_INFO, cmd, group, client_id)
        return answer.respond_to(cmd)

    async def get_runtime_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """RocketMQ 4.9's runtime table (``mqadmin brokerStatus``; ``clusterList`` and the Dashboard
        read several keys unguarded). The TPS and day figures (``msg{Put,Get}Total…``) come from
        ``runtime_info`` (:mod:`rmqbroker.store_stats`)."""
        ctx = self.ctx
        store = ctx.store
        now = int(time.time() * 1000)
        cfg = store.config
        table = {
            "brokerVersionDesc": BROKER_VERSION_DESC,
            "brokerVersion": "409",
            "commitLogMinOffset": str(store.min_phy_offset()),
            "commitLogMaxOffset": str(store.max_phy_offset()),
            "dispatchBehindBytes": str(store.dispatch_behind()),
            "remainHowManyDataToFlush": human_bytes(store.max_phy_offset() - store.flushed_phy_offset()),
            "bootTimestamp": str(self.boot_ms),
            "runtime": f"[ {(now - self.boot_ms) // 86_400_000} days, "
                       f"{(now - self.boot_ms) // 3_600_000 % 24} hours, "
                       f"{(now - self.boot_ms) // 60_000 % 60} minutes, "
                       f"{(now - self.boot_ms) // 1000 % 60} seconds ]",
            "brokerRole": ctx.role,
            "earliestMessageTimeStamp": str(store.earliest_message_time()),
            "startAcceptSendRequestTimeStamp": "0",
            # Requests run on the event loop as they are read: no thread-pool queue holds any, and
            # no put holds a commitlog lock across a wait.
            "pageCacheLockTimeMills": "0",
            **{f"{pool}ThreadPoolQueue{what}": "0" for pool in ("send", "pull", "query")
               for what in ("Size", "HeadWaitTimeMills")},
            "EndTransactionQueueSize": "0",
        }
        # Java's getDiskPartitionSpaceUsedPercent, as retention measures it (-1: no such path).
        table["commitLogDiskRatio"] = repr(disk_used_ratio(cfg.commit_log_dir))
        table["consumeQueueDiskRatio"] = repr(disk_used_ratio(cfg.consume_queue_dir))
        capacity = disk_capacity(cfg.store_path_root_dir)
        if capacity is not None:
            table["commitLogDirCapacity"] = f"Total : {human_bytes(capacity[0])}, Free : {human_bytes(capacity[1])}."
        for level, offset in sorted(ctx.delay_offsets.table().items()):
            # Java's ScheduleMessageService.buildRunningStats: delivered up to, and stored up to.
            max_offset = store.get_max_offset_in_queue(SCHEDULE_TOPIC, level - 1)
            table[f"scheduleMessageOffset_{level}"] = f"{offset},{max_offset}"
        if self._runtime_info is not None:
            table.update(self._runtime_info())
        return cmd.make_response(ResponseCode.SUCCESS,
                                 body=json.dumps({"table": table}, separators=(",", ":")).encode("utf-8"))
