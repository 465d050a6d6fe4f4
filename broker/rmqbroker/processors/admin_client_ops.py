"""Admin requests about consumers, producers and consume queues (RocketMQ 4.9's AdminBrokerProcessor):
INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223), QUERY_CONSUME_TIME_SPAN (303), QUERY_CORRECTION_OFFSET (308),
CONSUME_MESSAGE_DIRECTLY (309), QUERY_CONSUME_QUEUE (321) and GET_ALL_PRODUCER_INFO (328), with Java's
header names, body shapes and remarks. Requests that reach a consumer go through :class:`Broker2Client`."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from rmqbroker.processors.broker2client import Broker2Client
from rmqbroker.processors.client_manage import subscription_json
from rmqbroker.processors.clients import SQL92_TYPE, SubscriptionData
from rmqbroker.processors.context import BrokerContext
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import Connection, RemotingServer
from rmqbroker.remoting.wire import INT64_MAX, BadRequestError, Header
from rmqbroker.store.errors import MessageIdError
from rmqbroker.store.record import decode_offset_msg_id

log = logging.getLogger(__name__)


def _compact(obj: Any) -> bytes:
    """A body as fastjson writes it: members in name order, no spaces."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode("utf-8")


def _java_date(ms: int) -> str:
    """UtilAll.formatDate with yyyy-MM-dd#HH:mm:ss:SSS (local time), as QueueTimeSpan's *Str getters."""
    return time.strftime("%Y-%m-%d#%H:%M:%S", time.localtime(ms / 1000)) + f":{ms % 1000:03d}"


def _filter_data(group: str, sd: SubscriptionData) -> str:
    """QueryConsumeQueueResponseBody.filterData: the group's ConsumerFilterData as pretty JSON, which
    exists only for a compiled SQL92 subscription ("null" otherwise, as fastjson writes a null)."""
    if sd.expression_type != SQL92_TYPE or sd.selector is None:
        return "null"
    return json.dumps({"clientVersion": sd.sub_version, "consumerGroup": group, "dead": False, "deadTime": 0,
                       "expired": False, "expression": sd.sub_string, "expressionType": sd.expression_type,
                       "topic": sd.topic}, indent="\t", separators=(",", ":"), sort_keys=True)


class AdminClientOpsProcessor:
    """What an admin asks about the clients and queues of this broker."""

    def __init__(self, ctx: BrokerContext, b2c: Broker2Client | None = None) -> None:
        self.ctx = ctx
        self.b2c = b2c if b2c is not None else Broker2Client(ctx.clients)

    def register(self, server: RemotingServer) -> None:
        server.register(RequestCode.CONSUME_MESSAGE_DIRECTLY, self.consume_message_directly)
        server.register(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, self.get_consumer_status)
        server.register(RequestCode.QUERY_CONSUME_TIME_SPAN, self.query_consume_time_span)
        server.register(RequestCode.QUERY_CORRECTION_OFFSET, self.query_correction_offset)
        server.register(RequestCode.QUERY_CONSUME_QUEUE, self.query_consume_queue)
        server.register(RequestCode.GET_ALL_PRODUCER_INFO, self.get_all_producer_info)

    async def consume_message_directly(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin queryMsgById -g -d and the Dashboard's "resend message": the record an offset msg
        id points at goes, as the body of the admin's request (with this broker's ``brokerName``
        added), to one connected member of the group, which consumes it and answers a
        ConsumeMessageDirectlyResult; that answer comes back as it is. A member that does not answer
        within 10 s (the stock C++ client never does) gives CONSUME_MSG_TIMEOUT."""
        h = Header(cmd.ext_fields)
        group = h.req_str(wire.CONSUMER_GROUP)
        client_id = h.opt_str(wire.RUNNING_INFO_CLIENT_ID)
        msg_id = h.req_str(wire.MSG_ID)
        try:
            _ip, _port, phy = decode_offset_msg_id(msg_id)
        except MessageIdError as exc:
            raise BadRequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from exc
        data = self.ctx.store.look_message_by_offset(phy)
        if data is None:
            # RocketMQ fails here with a NullPointerException (SYSTEM_ERROR); the remark says why.
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset msg id {msg_id} "
                                                                f"(commitlog offset {phy})")
        ext = dict(cmd.ext_fields)
        ext[wire.BROKER_NAME] = self.ctx.settings.brokerName
        answer = await self.b2c.call_consumer(RequestCode.CONSUME_MESSAGE_DIRECTLY, cmd, group, client_id,
                                              ext_fields=ext, body=data)
        return answer.respond_to(cmd)

    async def get_consumer_status(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin getConsumerStatus: each member's offsets on a topic as the member holds them (it is
        asked with GET_CONSUMER_STATUS_FROM_CLIENT), as a GetConsumerStatusBody ``consumerTable``."""
        h = Header(cmd.ext_fields)
        topic = h.req_str(wire.TOPIC)
        group = h.req_str(wire.GROUP)
        client_addr = h.opt_str(wire.CLIENT_ADDR)
        log.info("[get-consumer-status] get consumer status by %s. topic=%s, group=%s", conn.remote_addr, topic, group)
        answer = await self.b2c.get_consume_status(topic, group, client_addr)
        return answer.respond_to(cmd)

    async def query_consume_time_span(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """A group's position in time per write queue (QueryConsumeTimeSpanBody): the store times of the
        queue's first and last message, of the last message the group committed past (the first
        message's when it committed nothing) and, when it is behind, how long ago the next message
        it will get was stored. Where RocketMQ subtracts an unreadable store time (-1), giving "now",
        ``delayTime`` stays 0."""
        h = Header(cmd.ext_fields)
        topic = h.req_str(wire.TOPIC)
        group = h.req_str(wire.GROUP)
        ctx = self.ctx
        tc = ctx.topics.select(topic)
        if tc is None:
            return cmd.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store = ctx.store
        now = int(time.time() * 1000)
        spans = []
        for qid in range(tc.write_queue_nums):
            min_time = store.get_earliest_message_time(topic, qid)
            max_offset = store.get_max_offset_in_queue(topic, qid)
            max_time = store.get_message_store_timestamp(topic, qid, max_offset - 1)
            consumer_offset = ctx.offsets.query(group, topic, qid)
            consume_time = store.get_message_store_timestamp(topic, qid, consumer_offset - 1) \
                if consumer_offset > 0 else min_time
            delay = 0
            if consumer_offset < max_offset:
                next_time = store.get_message_store_timestamp(topic, qid, consumer_offset)
                delay = now - next_time if next_time >= 0 else 0
            spans.append({
                "messageQueue": {"brokerName": ctx.settings.brokerName, "queueId": qid, "topic": topic},
                "minTimeStamp": min_time, "minTimeStampStr": _java_date(min_time),
                "maxTimeStamp": max_time, "maxTimeStampStr": _java_date(max_time),
                "consumeTimeStamp": consume_time, "consumeTimeStampStr": _java_date(consume_time),
                "delayTime": delay})
        return cmd.make_response(ResponseCode.SUCCESS, body=_compact({"consumeTimeSpanSet": spans}))

    async def query_correction_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """QueryCorrectionOffsetBody: per queue of ``topic``, the lowest offset any group committed that
        is still in the queue, the groups of ``filterGroups`` (comma-separated) left out; a queue where
        ``compareGroup`` is behind that minimum gets Long.MAX_VALUE.

        RocketMQ 4.9 means this but (a) looks the compare group's offsets up with topic and group
        swapped, so it never finds them and never answers MAX_VALUE, and (b) leaves the filter groups
        out by deleting their offsets from its live offset table. Here the compare group is looked up
        as meant and nothing is deleted."""
        h = Header(cmd.ext_fields)
        topic = h.req_str(wire.TOPIC)
        compare_group = h.req_str(wire.COMPARE_GROUP)
        filters = {g for g in (h.opt_str(wire.FILTER_GROUPS) or "").split(",") if g.strip()}
        ctx = self.ctx
        lowest: dict[int, int] = {}
        for group in ctx.offsets.which_groups_by_topic(topic):
            if group in filters:
                continue
            for qid, offset in ctx.offsets.query_all(group, topic).items():
                if offset >= ctx.store.get_min_offset_in_queue(topic, qid):
                    lowest[qid] = min(offset, lowest.get(qid, offset))
        for qid, offset in ctx.offsets.query_all(compare_group, topic).items():
            if qid in lowest and lowest[qid] > offset:
                lowest[qid] = INT64_MAX
        body = {"correctionOffsets": {str(qid): offset for qid, offset in sorted(lowest.items())}}
        return cmd.make_response(ResponseCode.SUCCESS, body=json.dumps(body, separators=(",", ":")).encode())

    async def query_consume_queue(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin queryCq: up to ``count`` consume-queue units from ``index`` (QueryConsumeQueueResponseBody),
        with the group's subscription when ``consumerGroup`` is given. This store writes no
        consume-queue extension, so no unit carries extendDataJson, bitMap or an evaluation."""
        h = Header(cmd.ext_fields)
        topic = h.req_str(wire.TOPIC)
        queue_id = h.req_int32(wire.QUEUE_ID)
        index = h.req_int(wire.INDEX)
        count = h.req_int32(wire.COUNT)
        group = h.opt_str(wire.CONSUMER_GROUP)
        store = self.ctx.store
        if (topic, queue_id) not in store.list_queues(topic):
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"{queue_id}@{topic} is not exist!")
        body: dict[str, Any] = {"maxQueueIndex": store.get_max_offset_in_queue(topic, queue_id),
                                "minQueueIndex": store.get_min_offset_in_queue(topic, queue_id)}
        if group is not None:
            sd = self.ctx.clients.find_subscription(group, topic)
            if sd is None:
                body["filterData"] = f"{group}@{topic} is not online!"
            else:
                body["subscriptionData"] = subscription_json(sd)
                body["filterData"] = _filter_data(group, sd)
        if not body["minQueueIndex"] <= index < body["maxQueueIndex"]:
            # As RocketMQ: SUCCESS, no body, and the remark.
            return cmd.make_response(ResponseCode.SUCCESS, f"Index {index} of {queue_id}@{topic} is not exist!")
        units = store.get_consume_queue_units(topic, queue_id, index, max(count, 0))
        body["queueData"] = [{"eval": False, "physicOffset": phy, "physicSize": size, "tagsCode": tags}
                             for phy, size, tags in units]
        return cmd.make_response(ResponseCode.SUCCESS, body=_compact(body))

    async def get_all_producer_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """ProducerTableInfo: every connected producer by group (client id, remote address as Java's
        channel prints it, language, version, last heartbeat time)."""
        wall_minus_mono = time.time() - time.monotonic()
        data: dict[str, list[dict[str, Any]]] = {}
        for group, channels in sorted(self.ctx.clients.producers.items()):
            data[group] = [{"clientId": ch.client_id, "language": ch.language,
                            "lastUpdateTimestamp": int((ch.last_update + wall_minus_mono) * 1000),
                            "remoteIP": f"/{ch.conn.remote_addr}", "version": ch.version}
                           for ch in sorted(channels.values(), key=lambda c: (c.client_id, c.conn.remote_addr))
                           if not ch.conn.closed]
        return cmd.make_response(ResponseCode.SUCCESS, body=_compact({"data": data}))
