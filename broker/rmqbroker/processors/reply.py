"""SEND_REPLY_MESSAGE (324) and SEND_REPLY_MESSAGE_V2 (325): request-reply's replies.

A requester (Java ``DefaultMQProducer.request``, 4.6+) sends a message carrying its client id
(``REPLY_TO_CLIENT``) and a ``CORRELATION_ID``; the responder sends its reply, both properties
copied, to the cluster's ``<cluster>_REPLY_TOPIC`` with these codes. This module owns what the
broker does with a reply: it pushes it to the requester's connection (PUSH_REPLY_MESSAGE_TO_CLIENT,
326) and waits for the requester's answer, which decides the reply's response, then stores it in
its topic too unless ``storeReplyMessageEnable`` is off. The header, its checks and the topic's
auto-creation are the send path's (processors/send.py).
"""

from __future__ import annotations

import logging
import random
import time

from rmqbroker.processors.context import BrokerContext
from rmqbroker.processors.send import MSG_REGION_DEFAULT, SendMessageProcessor, SendRejected, decode_send_header
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import Connection, PeerRequestError, RemotingServer
from rmqbroker.remoting.wire import Header
from rmqbroker.store import record as rec
from rmqbroker.store.message_store import MessageInner, PutMessageStatus

log = logging.getLogger(__name__)

# How long the requester has to answer a push: RocketMQ's broker-to-client call timeout.
PUSH_TIMEOUT_SECONDS = 10.0

# Put outcomes after which the reply is stored (RocketMQ answers these sends with their ids).
_STORED = frozenset({PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT,
                     PutMessageStatus.FLUSH_SLAVE_TIMEOUT, PutMessageStatus.SLAVE_NOT_AVAILABLE})


class ReplyMessageProcessor:
    """Pushes replies to their requesters and stores them."""

    def __init__(self, ctx: BrokerContext, send: SendMessageProcessor) -> None:
        self.ctx = ctx
        self.send = send
        settings = ctx.settings
        self._store_host = f"{settings.host_ip}:{settings.listenPort}"
        self.pushed = 0  # replies the requester took
        self.not_pushed = 0  # replies no requester took (not connected, refused, no answer)

    def register(self, server: RemotingServer) -> None:
        server.register(RequestCode.SEND_REPLY_MESSAGE, self.reply)
        server.register(RequestCode.SEND_REPLY_MESSAGE_V2, self.reply)

    async def reply(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        ctx = self.ctx
        v2 = cmd.code == RequestCode.SEND_REPLY_MESSAGE_V2
        # The whole header first, as for a send: a malformed one is refused (HeaderError) before
        # anything happens. The producer group is required by RocketMQ's send header and is part
        # of the pushed one, which the requester's client decodes strictly.
        (topic, queue_id, sys_flag, default_topic, default_nums, born_ts, flag, reconsume_times, _max_reconsume,
         _batch, props_raw) = decode_send_header(cmd.ext_fields, v2)
        h = Header(wire.normalize_send_v2(cmd.ext_fields) if v2 else cmd.ext_fields)
        producer_group = h.req_str(wire.PRODUCER_GROUP)
        unit_mode = h.opt_bool(wire.UNIT_MODE)
        body = bytes(cmd.body)
        props = rec.decode_properties(props_raw)
        try:
            # Refused as a send would be (a slave, no write permission, a bad topic or queue, an
            # oversized message): before anything reaches the requester.
            tc = self.send.check_single(topic, queue_id, default_topic, default_nums, body, sys_flag, props_raw,
                                        props, conn.remote_addr)
        except SendRejected as exc:
            ctx.stats.rejected(exc.code)
            return cmd.make_response(exc.code, exc.remark)
        store_qid = queue_id if queue_id >= 0 else random.randrange(max(tc.write_queue_nums, 1))

        push_ext = {
            wire.PRODUCER_GROUP: producer_group,
            wire.TOPIC: topic,
            wire.DEFAULT_TOPIC: default_topic,
            wire.DEFAULT_TOPIC_QUEUE_NUMS: str(default_nums),
            # The queue the responder asked for, as RocketMQ passes it on (not the one stored in).
            wire.QUEUE_ID: str(queue_id),
            wire.SYS_FLAG: str(sys_flag),
            wire.BORN_TIMESTAMP: str(born_ts),
            wire.FLAG: str(flag),
            wire.RECONSUME_TIMES: str(reconsume_times),
            wire.UNIT_MODE: "true" if unit_mode else "false",
            wire.BORN_HOST: conn.remote_addr,
            wire.STORE_HOST: self._store_host,
        }
        error = await self._push(props, push_ext, body)

        ext = {wire.MSG_REGION: MSG_REGION_DEFAULT, wire.TRACE_ON: "true"}
        if error is None:
            # RocketMQ's placeholders: a Java responder decodes the send result from them.
            ext.update({wire.MSG_ID: "0", wire.QUEUE_ID: str(store_qid), wire.QUEUE_OFFSET: "0"})
        if self.ctx.settings.storeReplyMessageEnable:  # read per reply: UPDATE_BROKER_CONFIG may change it
            # Stored whether or not the requester took it, as RocketMQ does; the reply's response
            # says whether it was delivered, and carries its id once stored.
            await self._store(conn, topic, store_qid, flag, body, props, sys_flag, born_ts, reconsume_times, ext)
        if error is None:
            return cmd.make_response(ResponseCode.SUCCESS, None, ext)
        return cmd.make_response(ResponseCode.SYSTEM_ERROR, error, ext)

    async def _push(self, props: dict[str, str], ext: dict[str, str], body: bytes) -> str | None:
        """Push the reply to its requester and wait for its answer: None once it took it, else the
        remark the responder is answered with (RocketMQ's)."""
        client_id = props.get(rec.REPLY_TO_CLIENT)
        if client_id is None:
            self.not_pushed += 1
            log.warning("a reply to %s has no %s: nobody to push it to", ext[wire.TOPIC], rec.REPLY_TO_CLIENT)
            return f"reply message properties[{rec.REPLY_TO_CLIENT}] is null"
        channel = self.ctx.clients.find_client(client_id)
        if channel is None:
            self.not_pushed += 1
            log.warning("reply for client %s: it is not connected", client_id)
            return f"push reply message fail, channel of <{client_id}> not found."
        now_ms = int(time.time() * 1000)
        # The requester sees when the broker pushed the reply (the stored copy keeps the
        # responder's properties, as RocketMQ's does).
        ext[wire.PROPERTIES] = rec.encode_properties({**props, rec.PUSH_REPLY_TIME: str(now_ms)})
        ext[wire.STORE_TIMESTAMP] = str(now_ms)
        request = RemotingCommand(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, ext_fields=ext, body=body)
        try:
            answer = await channel.conn.invoke(request, PUSH_TIMEOUT_SECONDS)
        except PeerRequestError as exc:
            self.not_pushed += 1
            log.warning("push of a reply to %s (%s) failed: %s", client_id, channel.conn.remote_addr, exc)
            return f"push reply message to {client_id} fail."
        if answer.code != ResponseCode.SUCCESS:
            self.not_pushed += 1
            log.warning("client %s refused a reply: code %d, %s", client_id, answer.code, answer.remark)
            return f"push reply message to {client_id} fail."
        self.pushed += 1
        return None

    async def _store(self, conn: Connection, topic: str, queue_id: int, flag: int, body: bytes,
                     props: dict[str, str], sys_flag: int, born_ts: int, reconsume_times: int,
                     ext: dict[str, str]) -> None:
        """Store the reply; its id and offset go into ``ext`` once stored. A failed put only logs:
        the response is the push's."""
        ctx = self.ctx
        msg = MessageInner(topic, queue_id, flag, body, props, sys_flag=sys_flag, born_timestamp=born_ts,
                           born_host=(conn.remote_host, conn.remote_port), reconsume_times=reconsume_times)
        result = await ctx.store.put_message(msg)
        if result.status not in _STORED:
            log.warning("reply to %s not stored: %s", topic, result.status.name)
            return
        ctx.stats.msgs_in += result.msg_num
        ctx.stats.bytes_in += len(body)
        ext.update({wire.MSG_ID: result.msg_id, wire.QUEUE_ID: str(queue_id),
                    wire.QUEUE_OFFSET: str(result.queue_offset)})
