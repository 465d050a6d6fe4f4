"""HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, LOCK/UNLOCK_BATCH_MQ (reference §2.6-§2.7, §2.11),
and the connection lists mqadmin consumerConnection / producerConnection read (203, 204)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from rmqbroker.metadata.jsonfile import fastjson_loads
from rmqbroker.metadata.topics import PERM_READ, PERM_WRITE, retry_topic
from rmqbroker.processors.clients import (
    CONSUME_FROM,
    CONSUME_TYPES,
    MESSAGE_MODELS,
    SQL92_TYPE,
    ClientChannel,
    SubscriptionData,
    SubscriptionParseError,
    build_subscription,
    unsupported_filter,
)
from rmqbroker.processors.context import BrokerContext
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import Connection, RemotingServer
from rmqbroker.remoting.wire import BadRequestError, Header

log = logging.getLogger(__name__)


def _connection_set(channels: Iterable[ClientChannel]) -> list[dict[str, Any]]:
    return [{"clientId": ch.client_id, "clientAddr": ch.conn.remote_addr, "language": ch.language,
             "version": ch.version} for ch in sorted(channels, key=lambda c: (c.client_id, c.conn.remote_addr))]


def subscription_json(sd: SubscriptionData) -> dict[str, Any]:
    """A SubscriptionData as Java's fastjson writes it."""
    return {"classFilterMode": False, "codeSet": sorted(sd.codes), "expressionType": sd.expression_type,
            "subString": sd.sub_string, "subVersion": sd.sub_version, "tagsSet": sorted(sd.tags), "topic": sd.topic}


def _name(names: tuple[str, ...], ordinal: int) -> str:
    return names[ordinal] if 0 <= ordinal < len(names) else str(ordinal)


def _json_object(body: bytes | bytearray | memoryview, what: str) -> dict[str, Any]:
    try:
        obj = fastjson_loads(bytes(body).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(ResponseCode.SYSTEM_ERROR, f"{what} body is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise BadRequestError(ResponseCode.SYSTEM_ERROR, f"{what} body is not a JSON object")
    return obj


def _json_array(obj: dict[str, Any], key: str, what: str) -> list[Any]:
    """``obj[key]`` as a list (absent or null is empty); anything else is the client's error."""
    value = obj.get(key) or []
    if not isinstance(value, list):
        raise BadRequestError(ResponseCode.SYSTEM_ERROR, f"{what} body: {key} is not a JSON array")
    return value


def _mq_list(obj: dict[str, Any], what: str) -> list[tuple[str, int]]:
    out = []
    for mq in _json_array(obj, "mqSet", what):
        if isinstance(mq, dict) and isinstance(mq.get("topic"), str):
            try:
                out.append((mq["topic"], int(mq.get("queueId", 0))))
            except (ValueError, TypeError) as exc:
                raise BadRequestError(ResponseCode.SYSTEM_ERROR,
                                      f"{what} body: queueId {mq.get('queueId')!r} is not a number") from exc
    return out


def _subscriptions(cd: Any) -> list[SubscriptionData]:
    """The subscriptions of one heartbeat consumerData (entries without a topic are skipped)."""
    if not isinstance(cd, dict) or not isinstance(cd.get("groupName"), str):
        raise BadRequestError(ResponseCode.SYSTEM_ERROR, "heartbeat body: consumerData without groupName")
    subs = []
    for sd in _json_array(cd, "subscriptionDataSet", "heartbeat"):
        if not isinstance(sd, dict) or not isinstance(sd.get("topic"), str):
            continue
        try:
            version = int(sd.get("subVersion") or 0)
            expression_type = sd.get("expressionType")
            subs.append(build_subscription(sd["topic"], sd.get("subString"), version,
                                           expression_type if isinstance(expression_type, str) else None,
                                           strict=False))
        except (SubscriptionParseError, ValueError, TypeError) as exc:
            raise BadRequestError(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc)) from exc
    return subs


def make_notifier(settings_enabled: Callable[[], bool],
                  group_enabled: Callable[[str], bool]) -> Callable[[str, list[Connection]], None]:
    """Build the NOTIFY_CONSUMER_IDS_CHANGED sender the client registry calls (``settings_enabled``
    is asked each time: the broker-wide switch can change at run time)."""

    def notify(group: str, conns: list[Connection]) -> None:
        if not settings_enabled() or not group_enabled(group):
            return
        for conn in conns:
            conn.send_oneway(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                             ext_fields={wire.CONSUMER_GROUP: group}))

    return notify


class ClientManageProcessor:
    """Client registration and orderly-consumption locks."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def register(self, server: RemotingServer) -> None:
        server.register(RequestCode.HEART_BEAT, self.heartbeat)
        server.register(RequestCode.UNREGISTER_CLIENT, self.unregister_client)
        server.register(RequestCode.GET_CONSUMER_LIST_BY_GROUP, self.consumer_list)
        server.register(RequestCode.GET_CONSUMER_CONNECTION_LIST, self.consumer_connections)
        server.register(RequestCode.GET_PRODUCER_CONNECTION_LIST, self.producer_connections)
        server.register(RequestCode.LOCK_BATCH_MQ, self.lock_batch)
        server.register(RequestCode.UNLOCK_BATCH_MQ, self.unlock_batch)
        server.register(RequestCode.CHECK_CLIENT_CONFIG, self.check_client_config)

    async def heartbeat(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        data = _json_object(cmd.body, "heartbeat")
        client_id = str(data.get("clientID") or conn.remote_addr)
        # The whole body is parsed before anything is registered or created: a refused heartbeat
        # must not leave a subscription group, a retry topic or half of its consumers behind.
        consumers = [(cd, _subscriptions(cd)) for cd in _json_array(data, "consumerDataSet", "heartbeat")]
        producers = [pd["groupName"] for pd in _json_array(data, "producerDataSet", "heartbeat")
                     if isinstance(pd, dict) and isinstance(pd.get("groupName"), str)]
        now = time.monotonic()
        ctx = self.ctx
        for cd, subs in consumers:
            group = cd["groupName"]
            group_cfg = ctx.groups.find(group)
            if group_cfg is not None and not ctx.is_slave:
                ctx.topics.create_retry_topic(retry_topic(group), group_cfg.retry_queue_nums,
                                              PERM_WRITE | PERM_READ, persist=False)
            channel = ClientChannel(client_id, conn, cmd.language, cmd.version, now)
            ctx.clients.register_consumer(group, channel, cd.get("consumeType"), cd.get("messageModel"),
                                          cd.get("consumeFromWhere"), subs)
        for group in producers:
            ctx.clients.register_producer(group, ClientChannel(client_id, conn, cmd.language, cmd.version, now))
        return cmd.make_response(ResponseCode.SUCCESS)

    async def check_client_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """What a Java consumer with a non-TAG subscription asks before it starts (CheckClientRequestBody),
        answered as RocketMQ does: refused without ``enablePropertyFilter``, and an SQL92 selector
        that does not compile is refused with the reason, so the consumer fails to start with it
        instead of waiting for messages that never match."""
        sd = _json_object(cmd.body, "check client config").get("subscriptionData") if cmd.body else None
        if not isinstance(sd, dict):
            return cmd.make_response(ResponseCode.SUCCESS)
        expression_type = sd.get("expressionType")
        expression_type = expression_type if isinstance(expression_type, str) else None
        why = unsupported_filter(expression_type, property_filter=self.ctx.settings.enablePropertyFilter)
        if why is not None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, why)
        if expression_type == SQL92_TYPE:
            sub_string = sd.get("subString")
            try:
                build_subscription(str(sd.get("topic") or ""), sub_string if isinstance(sub_string, str) else None,
                                   0, expression_type)
            except SubscriptionParseError as exc:
                return cmd.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
        return cmd.make_response(ResponseCode.SUCCESS)

    async def unregister_client(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = Header(cmd.ext_fields)
        self.ctx.clients.unregister(conn, h.opt_str(wire.PRODUCER_GROUP) or None,
                                    h.opt_str(wire.CONSUMER_GROUP) or None)
        return cmd.make_response(ResponseCode.SUCCESS)

    async def consumer_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = Header(cmd.ext_fields).req_str(wire.CONSUMER_GROUP)
        ids = self.ctx.clients.consumer_ids(group)
        if not ids:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return cmd.make_response(ResponseCode.SUCCESS,
                                 body=json.dumps({"consumerIdList": ids}, separators=(",", ":")).encode())

    async def consumer_connections(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """ConsumerConnection: the group's connected clients, subscriptions and consume settings."""
        group = Header(cmd.ext_fields).req_str(wire.CONSUMER_GROUP)
        info = self.ctx.clients.consumers.get(group)
        if info is None or not info.channels:
            return cmd.make_response(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        body = {
            "connectionSet": _connection_set(info.channels.values()),
            "subscriptionTable": {topic: subscription_json(sd) for topic, sd in sorted(info.subscriptions.items())},
            "consumeType": _name(CONSUME_TYPES, info.consume_type),
            "messageModel": _name(MESSAGE_MODELS, info.message_model),
            "consumeFromWhere": _name(CONSUME_FROM, info.consume_from_where),
        }
        return cmd.make_response(ResponseCode.SUCCESS, body=json.dumps(body, separators=(",", ":")).encode())

    async def producer_connections(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """ProducerConnection: the group's connected clients."""
        group = Header(cmd.ext_fields).req_str(wire.PRODUCER_GROUP)
        channels = self.ctx.clients.producers.get(group)
        if not channels:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        body = {"connectionSet": _connection_set(channels.values())}
        return cmd.make_response(ResponseCode.SUCCESS, body=json.dumps(body, separators=(",", ":")).encode())

    async def lock_batch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        req = _json_object(cmd.body, "lock")
        group = str(req.get("consumerGroup") or "")
        client_id = str(req.get("clientId") or "")
        if not group or not client_id:
            raise BadRequestError(ResponseCode.SYSTEM_ERROR, "lock request needs consumerGroup and clientId")
        locked = self.ctx.clients.try_lock(group, client_id, _mq_list(req, "lock"))
        name = self.ctx.settings.brokerName
        body = {"lockOKMQSet": [{"brokerName": name, "queueId": q, "topic": t} for t, q in locked]}
        return cmd.make_response(ResponseCode.SUCCESS, body=json.dumps(body, separators=(",", ":")).encode())

    async def unlock_batch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        req = _json_object(cmd.body, "unlock")
        self.ctx.clients.unlock(str(req.get("consumerGroup") or ""), str(req.get("clientId") or ""),
                                _mq_list(req, "unlock"))
        return cmd.make_response(ResponseCode.SUCCESS)
