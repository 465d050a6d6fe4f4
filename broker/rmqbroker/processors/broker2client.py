"""Requests the broker itself sends to connected consumers (RocketMQ's Broker2Client): the reset-offset
broadcast (RESET_CONSUMER_CLIENT_OFFSET, 220), the gathering of a group's offsets from its members
(GET_CONSUMER_STATUS_FROM_CLIENT, 221), and the relay of an admin request to one member
(GET_CONSUMER_RUNNING_INFO, CONSUME_MESSAGE_DIRECTLY), with Java's codes and remarks."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

from rmqbroker.metadata.jsonfile import MessageQueue, dumps_mq_keyed, loads_mq_keyed, mq_key
from rmqbroker.processors.clients import ClientChannel, ClientManager
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import PeerRequestError

log = logging.getLogger(__name__)

# How long a consumer may take to answer a relayed request (Broker2Client.callClient waits 10 s) and
# a status request (getConsumeStatus waits 5 s).
CALL_CONSUMER_TIMEOUT_S = 10.0
CONSUMER_STATUS_TIMEOUT_S = 5.0
# MQVersion ordinals: a relayed request needs V3_1_8_SNAPSHOT, a status request V3_0_7_SNAPSHOT.
V3_0_7_SNAPSHOT = 28
V3_1_8_SNAPSHOT = 62


@dataclass(slots=True)
class ClientAnswer:
    """What goes back to the admin: a response's code, remark, header and body."""

    code: int
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes | bytearray | memoryview = b""

    def respond_to(self, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.make_response(self.code, self.remark, ext_fields=dict(self.ext_fields), body=self.body)


def _timed_out(exc: PeerRequestError) -> bool:
    # Connection.invoke chains the asyncio timeout; a closed connection has no TimeoutError cause.
    return isinstance(exc.__cause__, TimeoutError)


class Broker2Client:
    """Broker-to-consumer requests over the connections the client registry keeps."""

    def __init__(self, clients: ClientManager) -> None:
        self.clients = clients

    def group_channels(self, group: str) -> list[ClientChannel]:
        """The open connections of a consumer group's members."""
        info = self.clients.consumers.get(group)
        return [ch for ch in (info.channels.values() if info else ()) if not ch.conn.closed]

    def find_consumer(self, group: str, client_id: str | None) -> ClientChannel | None:
        return next((ch for ch in self.group_channels(group) if ch.client_id == client_id), None)

    # -- RESET_CONSUMER_CLIENT_OFFSET --------------------------------------------------------
    def reset_offset(self, group: str, topic: str, broker_name: str, timestamp: int, force: bool,
                     table: dict[int, int]) -> tuple[bytes, int]:
        """Tell every member of ``group`` its new offsets on ``topic`` (oneway, in its own language's
        body); the Java body (a ResetOffsetBody) and how many members were told."""
        java_body = dumps_mq_keyed("offsetTable",
                                   [(broker_name, topic, qid, off) for qid, off in sorted(table.items())])
        cpp_body = json.dumps({"offsetTable": [{"brokerName": broker_name, "queueId": qid, "topic": topic,
                                                "offset": off} for qid, off in table.items()]},
                              separators=(",", ":")).encode()
        ext = {wire.TOPIC: topic, wire.GROUP: group, wire.TIMESTAMP: str(timestamp), wire.IS_FORCE: str(force).lower()}
        channels = self.group_channels(group)
        for channel in channels:
            # The C++ client reads ResetOffsetBodyForC (a list); Java clients a MessageQueue-keyed map.
            channel.conn.send_oneway(RemotingCommand(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, ext_fields=dict(ext),
                                                     body=cpp_body if channel.language == "CPP" else java_body))
        return java_body, len(channels)

    # -- GET_CONSUMER_STATUS_FROM_CLIENT -----------------------------------------------------
    async def get_consume_status(self, topic: str, group: str, origin_client_id: str | None) -> ClientAnswer:
        """Each member's offsets on ``topic`` as it holds them (only ``origin_client_id``'s when given),
        as a GetConsumerStatusBody ``consumerTable``. Members are asked at once, not one after the
        other as in RocketMQ; one that does not answer in time (the C++ client never does) or
        answers something unreadable is left out, as there."""
        channels = self.group_channels(group)
        if not channels:
            return ClientAnswer(ResponseCode.SYSTEM_ERROR, f"No Any Consumer online in the consumer group: [{group}]")
        old = next((ch for ch in channels if ch.version < V3_0_7_SNAPSHOT), None)
        if old is not None:
            return ClientAnswer(ResponseCode.SYSTEM_ERROR,
                                f"the client does not support this feature. version={old.version}")
        asked = [ch for ch in channels if not origin_client_id or ch.client_id == origin_client_id]
        tables = await asyncio.gather(*(self._status_of(ch, topic, group) for ch in asked))
        members = []
        for ch, table in sorted(zip(asked, tables, strict=True), key=lambda pair: pair[0].client_id):
            if table is None:
                continue
            rows = ",".join(f"{mq_key(broker, t, qid)}:{offset}" for (t, broker, qid), offset in sorted(table.items()))
            members.append(f"{json.dumps(ch.client_id)}:{{{rows}}}")
        body = f'{{"consumerTable":{{{",".join(members)}}},"messageQueueTable":{{}}}}'
        return ClientAnswer(ResponseCode.SUCCESS, body=body.encode("utf-8"))

    async def _status_of(self, channel: ClientChannel, topic: str, group: str) -> dict[MessageQueue, int] | None:
        ask = RemotingCommand(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT,
                              ext_fields={wire.TOPIC: topic, wire.GROUP: group})
        try:
            answer = await channel.conn.invoke(ask, CONSUMER_STATUS_TIMEOUT_S)
        except PeerRequestError as exc:
            log.warning("[get-consumer-status] %s of %s did not answer: %s", channel.client_id, group, exc)
            return None
        if answer.code != ResponseCode.SUCCESS or not answer.body:
            return None
        try:
            _doc, table = loads_mq_keyed(bytes(answer.body), "messageQueueTable")
            return {mq: int(offset) for mq, offset in table.items()}
        except (ValueError, TypeError) as exc:
            log.warning("[get-consumer-status] unreadable answer of %s of %s: %s", channel.client_id, group, exc)
            return None

    # -- relayed admin requests (callConsumer) -------------------------------------------------
    async def call_consumer(self, code: int, cmd: RemotingCommand, group: str, client_id: str | None,
                            ext_fields: dict[str, str] | None = None,
                            body: bytes | bytearray | memoryview | None = None) -> ClientAnswer:
        """Relay an admin request to one member of ``group`` (its header and body, unless replaced) and
        pass its answer back as it came."""
        channel = self.find_consumer(group, client_id)
        if channel is None:
            return ClientAnswer(ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online")
        if channel.version < V3_1_8_SNAPSHOT:
            return ClientAnswer(ResponseCode.SYSTEM_ERROR, f"The Consumer <{client_id}> Version <{channel.version}> "
                                                           "too low to finish, please upgrade it to V3_1_8_SNAPSHOT")
        ask = RemotingCommand(code, ext_fields=dict(cmd.ext_fields if ext_fields is None else ext_fields),
                              body=cmd.body if body is None else body)
        try:
            answer = await channel.conn.invoke(ask, CALL_CONSUMER_TIMEOUT_S)
        except PeerRequestError as exc:
            if _timed_out(exc):
                return ClientAnswer(ResponseCode.CONSUME_MSG_TIMEOUT,
                                    f"consumer <{group}> <{client_id}> Timeout: {exc}")
            return ClientAnswer(ResponseCode.SYSTEM_ERROR, f"invoke consumer <{group}> <{client_id}> Exception: {exc}")
        return ClientAnswer(answer.code, answer.remark, dict(answer.ext_fields), answer.body)
