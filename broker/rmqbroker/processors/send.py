"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320) and CONSUMER_SEND_MSG_BACK (36).

Reference §2.4, §2.10, §3.7, §6.2. Every check that can reject a request runs before the store
is touched, so a rejected send never leaves bytes behind.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable
from typing import Final

from rmqbroker.inflate import InflateError, inflate, looks_like_zlib
from rmqbroker.metadata.topics import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    TopicConfig,
    dlq_topic,
    is_not_allowed_send_topic,
    perm_inherited,
    retry_topic,
    validate_topic,
)
from rmqbroker.processors.context import BrokerContext
from rmqbroker.processors.transaction import TransactionService, is_half
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import SERIALIZE_JSON, RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand, encode_json_response
from rmqbroker.remoting.server import Connection, Deferred, RemotingServer
from rmqbroker.remoting.wire import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, Header, normalize_send_v2
from rmqbroker.store import record as rec
from rmqbroker.store.errors import CorruptRecordError
from rmqbroker.store.message_store import MessageBatchInner, MessageInner, PutMessageStatus, PutResult
from rmqbroker.store.record import (
    CLUSTER,
    MAX_PROPERTIES_LENGTH,
    MULTI_TAGS,
    PROPERTY_SEPARATOR,
    WAIT,
    decode_properties,
    encode_properties,
    join_properties,
)

# Request and response codes as plain module constants: compiled, an IntEnum member access is a
# generic attribute lookup on every message.
_SEND_MESSAGE: Final = int(RequestCode.SEND_MESSAGE)
_SEND_BATCH_MESSAGE: Final = int(RequestCode.SEND_BATCH_MESSAGE)
_SUCCESS: Final = int(ResponseCode.SUCCESS)
_MESSAGE_ILLEGAL: Final = int(ResponseCode.MESSAGE_ILLEGAL)

# Properties strings up to this many characters are within the store's byte limit whatever their
# characters (UTF-8 takes at most 4 bytes per character): one length comparison per message, and
# only longer strings are encoded to be measured.
_PROPS_SAFE_CHARS: Final = MAX_PROPERTIES_LENGTH // 4

# What a send answers with: a response command, or (JSON success) the encoded frame itself.
Answer = RemotingCommand | bytes
_PUT_OK = PutMessageStatus.PUT_OK

log = logging.getLogger(__name__)

MSG_REGION_DEFAULT = "DefaultRegion"

# PutMessageStatus -> (response code, remark, header filled)
_PUT_STATUS: dict[PutMessageStatus, tuple[int, str | None, bool]] = {
    PutMessageStatus.PUT_OK: (ResponseCode.SUCCESS, None, True),
    PutMessageStatus.FLUSH_DISK_TIMEOUT: (ResponseCode.FLUSH_DISK_TIMEOUT, None, True),
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: (ResponseCode.FLUSH_SLAVE_TIMEOUT, None, True),
    PutMessageStatus.SLAVE_NOT_AVAILABLE: (ResponseCode.SLAVE_NOT_AVAILABLE, None, True),
    PutMessageStatus.CREATE_MAPEDFILE_FAILED: (ResponseCode.SYSTEM_ERROR, "create mapped file failed, server is busy "
                                               "or broken.", False),
    PutMessageStatus.MESSAGE_ILLEGAL: (ResponseCode.MESSAGE_ILLEGAL, "the message is illegal, maybe msg body or "
                                       "properties length not matched. msg body length limit 128k, msg "
                                       "properties length limit 32k.", False),
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: (ResponseCode.MESSAGE_ILLEGAL, "the message is illegal, maybe msg "
                                                "properties length limit 32k.", False),
    PutMessageStatus.SERVICE_NOT_AVAILABLE: (ResponseCode.SERVICE_NOT_AVAILABLE, "service not available now. It "
                                             "may be caused by one of the following reasons: the broker's disk is "
                                             "full, messages are put to the slave, message store has been shut "
                                             "down, etc.", False),
    PutMessageStatus.OS_PAGECACHE_BUSY: (ResponseCode.SYSTEM_ERROR, "[PC_SYNCHRONIZED]broker busy, start flow "
                                         "control for a while", False),
    PutMessageStatus.UNKNOWN_ERROR: (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR", False),
}


# Bound of SendMessageProcessor._sendable_names.
_SENDABLE_NAMES_MAX = 4096

# The constant members of every send response's extFields, as JSON (see _response).
_RESPONSE_EXT_CONST = f',"{wire.MSG_REGION}":"{MSG_REGION_DEFAULT}","{wire.TRACE_ON}":"true"'


class SendRejected(Exception):
    """A send refused before it reached the store."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


def _illegal_queue(topic: str, queue_id: int, write_nums: int, read_nums: int, remote: str) -> SendRejected:
    return SendRejected(ResponseCode.SYSTEM_ERROR,
                        f"request queueId[{queue_id}] is illegal, topic:[{topic}] "
                        f"topicConfig.writeQueueNums:[{write_nums}] "
                        f"topicConfig.readQueueNums:[{read_nums}] producer:[{remote}]")


_SendHeader = tuple[str, int, int, str, int, int, int, int, int, str | None, str]


def _send_header_checked(ext: dict[str, str]) -> _SendHeader:
    """The send header through :class:`Header`: a missing or malformed field raises HeaderError
    naming the V1 field, as Java's decodeCommandCustomHeader does."""
    h = Header(ext)
    # Java's SendMessageRequestHeader: bornTimestamp is a Long, the other numbers Integers (and the
    # record stores them as int32/int64: a wider value must be refused here, not fail the append).
    return (h.req_str(wire.TOPIC), h.req_int32(wire.QUEUE_ID), h.req_int32(wire.SYS_FLAG),
            h.req_str(wire.DEFAULT_TOPIC), h.req_int32(wire.DEFAULT_TOPIC_QUEUE_NUMS),
            h.req_int(wire.BORN_TIMESTAMP), h.req_int32(wire.FLAG), h.opt_int32(wire.RECONSUME_TIMES, 0),
            h.opt_int32(wire.MAX_RECONSUME_TIMES, -1), h.opt_str(wire.BATCH), h.opt_str(wire.PROPERTIES) or "")


def _send_header(cmd: RemotingCommand) -> _SendHeader:
    """``(topic, queueId, sysFlag, defaultTopic, defaultTopicQueueNums, bornTimestamp, flag,
    reconsumeTimes, maxReconsumeTimes, batch, properties)`` of a send request.

    SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE letters are read directly (no renamed copy of the header,
    no Header object: about 4 µs less per message). Anything missing, malformed or out of range
    falls back to the validating V1 path, which gives the same values or the HeaderError remark.
    """
    ext = cmd.ext_fields
    if cmd.code == _SEND_MESSAGE:
        return _send_header_checked(ext)
    try:
        # Same semantics as Header: int() of the string; optional ints default when absent or "".
        topic = ext["b"]
        default_topic = ext["c"]
        recon_s = ext.get("j")
        max_recon_s = ext.get("l")
        queue_id = int(ext["e"])
        sys_flag = int(ext["f"])
        nums = int(ext["d"])
        born_ts = int(ext["g"])
        flag = int(ext["h"])
        recon = int(recon_s) if recon_s else 0
        max_recon = int(max_recon_s) if max_recon_s else -1
    except (KeyError, ValueError):
        return _send_header_checked(normalize_send_v2(ext))
    # Integer comparisons only; the V1 path names the field that is out of range.
    if (INT32_MIN <= queue_id <= INT32_MAX and INT32_MIN <= sys_flag <= INT32_MAX and INT32_MIN <= nums <= INT32_MAX
            and INT32_MIN <= flag <= INT32_MAX and INT32_MIN <= recon <= INT32_MAX
            and INT32_MIN <= max_recon <= INT32_MAX and INT64_MIN <= born_ts <= INT64_MAX):
        return (topic, queue_id, sys_flag, default_topic, nums, born_ts, flag, recon, max_recon, ext.get("m"),
                ext.get("i") or "")
    return _send_header_checked(normalize_send_v2(ext))


def decode_send_header(ext: dict[str, str], v2: bool) -> _SendHeader:
    """A send header by its V1 names or (``v2``) its V2 letters, through the validating path: what
    another processor taking the send header (SEND_REPLY_MESSAGE) decodes it with."""
    return _send_header_checked(normalize_send_v2(ext) if v2 else ext)


def _too_long(props: str) -> bool:
    """Whether the store would refuse ``props`` as longer than its UTF-8 properties limit."""
    n = len(props)
    if n <= _PROPS_SAFE_CHARS:
        return False
    return n > MAX_PROPERTIES_LENGTH or len(props.encode("utf-8", "surrogatepass")) > MAX_PROPERTIES_LENGTH


class SendMessageProcessor:
    """Stores messages sent by producers and failed messages sent back by consumers."""

    def __init__(self, ctx: BrokerContext, transactions: TransactionService | None = None) -> None:
        self.ctx = ctx
        settings = ctx.settings
        self._store_host = (settings.host_ip, settings.listenPort)
        # The store's own limit, checked here too so that an oversized send is refused before its
        # topic is auto-created.
        self._max_message_size = ctx.store.config.max_message_size
        self._cluster = settings.brokerClusterName
        # Topic names that passed the (pure, name-only) validity and not-allowed checks: the regex
        # check per message showed up at 1.5 % of the broker's CPU.
        self._sendable_names: set[str] = set()
        # Appended to a producer's properties string that can be stored as it is (see send).
        self._cluster_suffix = f"{rec.PROPERTY_SEPARATOR}{rec.CLUSTER}{rec.NAME_VALUE_SEPARATOR}{self._cluster}"
        # Half messages go to the transaction service; without one (rejectTransactionMessage) they
        # are refused, as RocketMQ refuses them.
        self.transactions = transactions
        self._transaction_remark = f"the broker[{settings.host_ip}] sending transaction message is forbidden"
        # Set by _topic_config when it auto-created the topic, read (and cleared) by its caller before
        # any await: such a send is answered once the nameservers route the topic (see send).
        self._created_topic = False

    def register(self, server: RemotingServer) -> None:
        server.register(RequestCode.SEND_MESSAGE, self.send)
        server.register(RequestCode.SEND_MESSAGE_V2, self.send)
        server.register(RequestCode.SEND_BATCH_MESSAGE, self.send)
        server.register(RequestCode.CONSUMER_SEND_MSG_BACK, self.send_back)

    # -- checks shared by single and batch sends --
    def _check_sendable(self, topic: str) -> None:
        """The broker takes sends and ``topic`` is a name one may send to (no side effects)."""
        ctx = self.ctx
        if ctx.role == "SLAVE":  # ctx.is_slave without the property call, once per message
            raise SendRejected(ResponseCode.SERVICE_NOT_AVAILABLE,
                               "service not available now: this broker is a SLAVE and does not accept sends")
        if not ctx.settings.brokerPermission & PERM_WRITE:
            raise SendRejected(ResponseCode.NO_PERMISSION,
                               f"the broker[{ctx.settings.host_ip}] sending message is forbidden")
        if ctx.store.term_fenced:
            raise SendRejected(ResponseCode.NO_PERMISSION,
                               f"the broker[{ctx.settings.host_ip}] sending message is forbidden: it is a master "
                               "in an epoch another broker began, or older than its group's (promote it at a new "
                               "epoch, or make it a slave)")
        if topic not in self._sendable_names:
            problem = validate_topic(topic)
            if problem is not None:
                raise SendRejected(ResponseCode.SYSTEM_ERROR, problem)
            if is_not_allowed_send_topic(topic):
                raise SendRejected(ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden.")
            if len(self._sendable_names) >= _SENDABLE_NAMES_MAX:
                self._sendable_names.clear()  # bound the memory a stream of distinct names can take
            self._sendable_names.add(topic)

    def _topic_config(self, topic: str, queue_id: int, default_topic: str, default_nums: int,
                      remote: str) -> TopicConfig:
        """``topic``'s config, auto-created if absent: call it last, once nothing else can refuse the
        send, so that a refused send leaves no topic behind."""
        ctx = self.ctx
        tc = ctx.topics.select(topic)
        if tc is None:
            self._check_new_topic_queue(topic, queue_id, default_topic, default_nums, remote)
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                tc = ctx.topics.create_retry_topic(topic, 1, PERM_WRITE | PERM_READ, persist=False)
            else:
                tc = ctx.topics.create_topic_in_send_message_method(topic, default_topic, remote, default_nums,
                                                                    0, persist=False)
            if tc is None:
                raise SendRejected(ResponseCode.TOPIC_NOT_EXIST,
                                   f"topic[{topic}] not exist, apply first please!")
            ctx.register_now()
            self._created_topic = True
        if queue_id >= max(tc.write_queue_nums, tc.read_queue_nums):
            raise _illegal_queue(topic, queue_id, tc.write_queue_nums, tc.read_queue_nums, remote)
        return tc

    def _check_new_topic_queue(self, topic: str, queue_id: int, default_topic: str, default_nums: int,
                               remote: str) -> None:
        """Refuse, before the topic is created, a queueId beyond the queues the auto-created topic
        would get (Java creates the topic first and refuses after, leaving it behind). The queue
        counts mirror create_retry_topic / create_topic_in_send_message_method; when the creation
        itself would be refused, that refusal (TOPIC_NOT_EXIST) is left to come first."""
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            nums = 1
        else:
            topics = self.ctx.topics
            default = topics.select(default_topic)
            if default is None or not perm_inherited(default.perm) or (
                    default_topic == AUTO_CREATE_TOPIC_KEY_TOPIC and not topics.auto_create_topic_enable):
                return
            nums = max(0, min(default_nums, default.write_queue_nums))
        if queue_id >= nums:
            raise _illegal_queue(topic, queue_id, nums, nums, remote)

    def _check_body(self, body: bytes, sys_flag: int) -> None:
        max_size = self._max_message_size
        if len(body) > max_size:
            raise SendRejected(_MESSAGE_ILLEGAL, f"the message body size {len(body)} exceeds the maximum "
                                                 f"{max_size}")
        if (sys_flag & rec.COMPRESSED and (sys_flag & rec.COMPRESSION_TYPE_MASK) in (0, rec.COMPRESSION_TYPE_ZLIB)
                and not looks_like_zlib(body)):
            # A consumer given a body that does not inflate stalls on its queue (the stock C++ one
            # does). Only the header is checked: inflating every compressed body (4 KiB and up)
            # cost a 16 KiB send half as much again; Java checks nothing.
            raise SendRejected(_MESSAGE_ILLEGAL, "the message is flagged compressed, but its body is not a zlib stream")

    def _check_properties(self, topic: str, props_raw: str, props: dict[str, str], props_string: str | None) -> None:
        """Refuse a single message whose properties the store would refuse as too long; the common
        case costs one length comparison."""
        if props_string is not None:
            too_long = _too_long(props_string)
        else:
            # The store encodes the properties plus CLUSTER: no longer than the producer's string
            # plus the CLUSTER suffix, so only a long string is encoded here to be measured.
            too_long = len(props_raw) + len(self._cluster_suffix) > _PROPS_SAFE_CHARS and _too_long(
                encode_properties({**props, CLUSTER: self._cluster}))
        if too_long:
            raise SendRejected(_MESSAGE_ILLEGAL, f"the message properties of topic {topic} are longer than "
                                                 f"{MAX_PROPERTIES_LENGTH} bytes")

    def check_single(self, topic: str, queue_id: int, default_topic: str, default_nums: int, body: bytes,
                     sys_flag: int, props_raw: str, props: dict[str, str], remote: str) -> TopicConfig:
        """The checks of a single message's send (SendRejected), then its topic's config (auto-created
        if absent): what another processor storing a producer's message (SEND_REPLY_MESSAGE) shares."""
        self._check_sendable(topic)
        self._check_body(body, sys_flag)
        self._check_properties(topic, props_raw, props, None)
        tc = self._topic_config(topic, queue_id, default_topic, default_nums, remote)
        self._created_topic = False  # registered soon (register_now); a reply is not held back for it
        return tc

    def _relayed_born_host(self, peer_host: str, client: str, own: tuple[str, int]) -> tuple[str, int]:
        """The client address a relaying slave names (host:port), when that slave is one this
        master streams to; else ``own``, the connection's address: a client cannot pick its born host."""
        if not self.ctx.relays_from(peer_host):
            return own
        host, sep, port_s = client.rpartition(":")
        try:
            rec.ip_to_bytes(host)
            port = int(port_s)
        except ValueError:
            return own
        if not sep or not 0 <= port <= 65535:
            return own
        return (host, port)

    def send(self, conn: Connection, cmd: RemotingCommand) -> Answer | Deferred | Awaitable[Answer | Deferred | None]:
        """Store the message now; answer at once unless the put must wait (SYNC_FLUSH, SYNC_MASTER).

        Returning the response directly (no coroutine, no task) is what keeps the common
        ASYNC_FLUSH / ASYNC_MASTER send cheap. A slave relays it to its master (processors/relay.py).
        """
        ctx = self.ctx
        if ctx.role == "SLAVE" and ctx.relay is not None:
            relayed = ctx.relay.forward(cmd, conn.remote_addr)
            if relayed is not None:
                return relayed
        # Decode the whole header before acting on any of it (as Java's decodeCommandCustomHeader does):
        # a missing or malformed field must not leave side effects such as an auto-created topic.
        (topic, queue_id, sys_flag, default_topic, default_queue_nums, born_ts, flag, reconsume_times,
         max_reconsume_times, batch_raw, props_raw) = _send_header(cmd)
        # The C++ client marks batches with "1", which Java's parseBoolean reads as false (storing the
        # whole batch as one message, rocketmq-client-cpp #189); unpacking is what its users expect.
        is_batch = cmd.code == _SEND_BATCH_MESSAGE or (
            batch_raw is not None and batch_raw.lower() in ("true", "1"))
        try:
            # Everything that can refuse the send runs before _topic_config, which may auto-create
            # the topic: a refused send must leave neither a topic nor bytes behind.
            self._check_sendable(topic)
            props = decode_properties(props_raw)
            # The stored properties are encode_properties(props + CLUSTER). When the producer's
            # string already is what re-encoding would give (every segment kept, no duplicate
            # names; Java and C++ clients add one trailing separator) and has no CLUSTER, that is
            # the string plus CLUSTER appended: store it as it is instead of encoding the dict.
            props_string: str | None = None
            body_str = props_raw[:-1] if props_raw.endswith(PROPERTY_SEPARATOR) else props_raw
            if len(props) == body_str.count(PROPERTY_SEPARATOR) + 1 and CLUSTER not in props:
                props_string = f"{body_str}{self._cluster_suffix}"
            body = bytes(cmd.body)
            dlq: str | None = None
            half = False
            entries: list[rec.BatchEntry] | None = None
            if is_batch:
                body, sys_flag, entries = self._decode_batch(topic, body, sys_flag, props_raw, props)
            else:
                self._check_body(body, sys_flag)
                # Before the retry lookup, which may auto-create the subscription group: going to
                # the DLQ only drops a property, so what passes here still passes then.
                self._check_properties(topic, props_raw, props, props_string)
                if rec.TRAN_MSG in props and is_half(props, reconsume_times):
                    if self.transactions is None:
                        raise SendRejected(ResponseCode.NO_PERMISSION, self._transaction_remark)
                    half = True
                if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                    dlq = self._dlq_if_exhausted(topic, reconsume_times, max_reconsume_times, cmd.version, props)
                    props_string = None  # the properties may have changed (DELAY dropped for the DLQ)
            # Cleared first: a send that failed after creating a topic (an error other than
            # SendRejected) must not hold back the next one.
            self._created_topic = False
            tc = self._topic_config(topic, queue_id, default_topic, default_queue_nums, conn.remote_addr)
            if queue_id < 0:
                queue_id = random.randrange(max(tc.write_queue_nums, 1))
            if dlq is not None:
                self.ctx.topics.create_retry_topic(dlq, 1, PERM_WRITE | PERM_READ, persist=False)
                log.info("message for %s reached %d reconsumes: to %s", topic, reconsume_times, dlq)
                topic, queue_id = dlq, 0
            if tc.topic_filter_type == "MULTI_TAG":
                sys_flag |= MULTI_TAGS
            answer_qid = queue_id  # a half message is answered with the queue it was sent to, as in RocketMQ
            if half and self.transactions is not None:
                topic, queue_id = self.transactions.to_half(topic, queue_id, props)
                sys_flag &= ~rec.TRANSACTION_TYPE_MASK
                props_string = None
            props[CLUSTER] = self._cluster
            born_host = (conn.remote_host, conn.remote_port)
            relayed_for = cmd.ext_fields.get(wire.RELAYED_FOR)
            if relayed_for is not None:
                born_host = self._relayed_born_host(conn.remote_host, relayed_for, born_host)
            store = self.ctx.store
            if entries is not None:
                result = store.append_messages(MessageBatchInner(
                    topic=topic, queue_id=queue_id, body=body, properties=props, sys_flag=sys_flag,
                    born_timestamp=born_ts, born_host=born_host, entries=entries))
            else:
                # Positional (in field order: ..., tags_code, store_host, prepared_transaction_offset,
                # properties_string): once per message, and cheaper than keywords.
                msg = MessageInner(topic, queue_id, flag, body, props, sys_flag, born_ts, born_host,
                                   reconsume_times, None, None, 0, props_string)
                result = store.append_message(msg)
        except SendRejected as exc:
            self._created_topic = False
            self.ctx.stats.rejected(exc.code)
            return cmd.make_response(exc.code, exc.remark)
        wait = props.get(WAIT) != "false"
        if self._created_topic:
            # As Java's broker, which registers a topic it auto-creates before it answers the send:
            # a consumer started as soon as the first send returns finds the route, instead of
            # waiting for its next route poll (the stock C++ client's comes 10 s later). Stored
            # first, so later sends of the same producer cannot be stored ahead of this one.
            self._created_topic = False
            return self._answer_once_routed(self._answer(cmd, result, answer_qid, wait))
        return self._answer(cmd, result, answer_qid, wait)

    def _answer(self, cmd: RemotingCommand, result: PutResult, answer_qid: int,
                wait: bool) -> Answer | Deferred | Awaitable[Answer]:
        """The answer to a stored send: at once, unless the put must wait (SYNC_FLUSH, SYNC_MASTER)."""
        store = self.ctx.store
        if store.replication_callback is not None:
            # SYNC_MASTER with ASYNC_FLUSH: answered from the slave ack itself (no task per send,
            # no loop pass between the ack and the answer).
            answer = _ReplicatedAnswer(self, cmd, result, answer_qid)
            if store.replicate_then(result, wait, answer.replicated):
                return answer
        pending = store.durability_wait(result, wait)
        if pending is None:
            return self._response(cmd, result, answer_qid, len(cmd.body))
        return self._respond_after(pending, cmd, result, answer_qid)

    async def _answer_once_routed(self, answer: Answer | Deferred | Awaitable[Answer]) -> Answer | Deferred:
        await self.ctx.register_and_wait()
        if isinstance(answer, (RemotingCommand, bytes, Deferred)):
            return answer  # a Deferred that resolved meanwhile is answered when the server attaches it
        return await answer

    async def _respond_after(self, pending: Awaitable[None], cmd: RemotingCommand, result: PutResult,
                             queue_id: int) -> Answer:
        await pending
        return self._response(cmd, result, queue_id, len(cmd.body))

    def _dlq_if_exhausted(self, topic: str, reconsume_times: int, max_reconsume: int, version: int,
                          props: dict[str, str]) -> str | None:
        """The DLQ a send to a %RETRY% topic goes to once its reconsumes are used up (its DELAY
        dropped from ``props``), else None. Creating the DLQ topic is left to the caller."""
        group = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
        cfg = self.ctx.groups.find(group, persist=False)
        if cfg is None:
            raise SendRejected(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                               f"subscription group not exist, {group}")
        limit = max_reconsume if version >= 121 and max_reconsume >= 0 else cfg.retry_max_times
        if reconsume_times < limit:
            return None
        props.pop(rec.DELAY, None)
        return dlq_topic(group)

    def _decode_batch(self, topic: str, body: bytes, sys_flag: int, props_raw: str,
                      props: dict[str, str]) -> tuple[bytes, int, list[rec.BatchEntry]]:
        """``(body, sys_flag, entries)`` of a batch the store will take (the body decompressed),
        or SendRejected for anything in it the store would refuse."""
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, "batch request does not support retry group")
        max_size = self._max_message_size
        if sys_flag & rec.COMPRESSED:
            # C++ compresses a whole batch body of 4 KiB or more; its entries are plain. Its
            # producer checked the batch's size before compressing it.
            try:
                body = inflate(body, max_size)
            except InflateError as exc:
                raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"compressed batch body is unusable: {exc}") from exc
            sys_flag &= ~rec.COMPRESSED
        elif len(body) > max_size:
            # Java's checkMessages: "PutMessages body length too long".
            raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"the batch body size {len(body)} exceeds the maximum "
                                                             f"{max_size}")
        try:
            entries = rec.decode_batch_body(body)
        except CorruptRecordError as exc:
            raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"batch body is malformed: {exc}") from exc
        if not entries:
            raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, "batch body has no messages")
        if rec.DELAY in props or any(rec.get_property(e.properties, rec.DELAY) for e in entries):
            raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, "batch messages cannot carry a delay level")
        if sys_flag & rec.TRANSACTION_TYPE_MASK:
            raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, "batch messages cannot be transactional")
        # Each entry is stored with the batch's properties (plus CLUSTER) joined to its own; the
        # joined text is no longer than the two strings and the CLUSTER suffix with a separator.
        batch_chars = len(props_raw) + len(self._cluster_suffix) + 1
        batch_props: str | None = None
        for i, entry in enumerate(entries):
            if len(entry.body) > max_size:
                raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"batch message {i}: body size {len(entry.body)} "
                                                                 f"exceeds the maximum {max_size}")
            if len(entry.properties) + batch_chars > _PROPS_SAFE_CHARS:
                if batch_props is None:
                    batch_props = encode_properties({**props, CLUSTER: self._cluster})
                if _too_long(join_properties(entry.properties, batch_props)):
                    raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"batch message {i}: properties longer than "
                                                                     f"{MAX_PROPERTIES_LENGTH} bytes")
        return body, sys_flag, entries

    def _response(self, cmd: RemotingCommand, result: PutResult, queue_id: int, nbytes: int) -> Answer:
        status = result.status
        code: int
        remark: str | None
        if status is _PUT_OK:
            code, remark, filled = _SUCCESS, None, True
        else:
            code, remark, filled = _PUT_STATUS[status]
        if not filled:
            self.ctx.stats.rejected(code)
            return cmd.make_response(code, remark)
        stats = self.ctx.stats
        stats.msgs_in += result.msg_num
        stats.bytes_in += nbytes
        msg_id = result.msg_id
        queue_id_s = str(queue_id)
        queue_offset_s = str(result.queue_offset)
        # Message ids are hex (comma-joined for a batch) and the rest are integers or constants,
        # so these members need no escaping.
        ext_json = (f'"msgId":"{msg_id}","queueId":"{queue_id_s}","queueOffset":"{queue_offset_s}"'
                    f"{_RESPONSE_EXT_CONST}")
        if cmd.serialize_type == SERIALIZE_JSON:
            # The whole frame at once: no response command, ext dict or header encoder per message.
            return encode_json_response(code, cmd.opaque, ext_json)
        resp = cmd.make_response(code, remark, ext_fields={
            wire.MSG_ID: msg_id,
            wire.QUEUE_ID: queue_id_s,
            wire.QUEUE_OFFSET: queue_offset_s,
            wire.MSG_REGION: MSG_REGION_DEFAULT,
            wire.TRACE_ON: "true",
        })
        resp.ext_json = ext_json
        return resp

    # -- CONSUMER_SEND_MSG_BACK --
    async def send_back(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        ctx = self.ctx
        if ctx.role == "SLAVE" and ctx.relay is not None:
            relayed = ctx.relay.forward(cmd, conn.remote_addr)
            if relayed is not None:
                return await relayed
        h = Header(cmd.ext_fields)
        group = h.req_str(wire.GROUP)
        offset = h.req_int(wire.OFFSET)
        delay_level = h.opt_int(wire.DELAY_LEVEL, 0)
        cfg = ctx.groups.find(group, persist=False)
        if cfg is None:
            return cmd.make_response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                     f"subscription group not exist, {group}")
        if not ctx.writable:
            return cmd.make_response(ResponseCode.NO_PERMISSION,
                                     f"the broker[{ctx.settings.host_ip}] sending message is forbidden")
        if cfg.retry_queue_nums <= 0:
            return cmd.make_response(ResponseCode.SUCCESS)
        raw = ctx.store.look_message_by_offset(offset)
        if raw is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        try:
            orig = rec.decode_record(raw, 0)
        except CorruptRecordError as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}: {exc}")
        props = dict(orig.properties)
        props.setdefault(rec.RETRY_TOPIC, orig.topic)
        props[rec.WAIT] = "false"
        max_times = cfg.retry_max_times
        if cmd.version >= 121:
            max_times = h.opt_int(wire.MAX_RECONSUME_TIMES, max_times)
        if orig.reconsume_times >= max_times or delay_level < 0:
            topic = dlq_topic(group)
            ctx.topics.create_retry_topic(topic, 1, PERM_WRITE | PERM_READ, persist=False)
            queue_id = 0
            props.pop(rec.DELAY, None)
        else:
            topic = retry_topic(group)
            tc = ctx.topics.create_retry_topic(topic, cfg.retry_queue_nums, PERM_WRITE | PERM_READ, persist=False)
            queue_id = random.randrange(max(tc.write_queue_nums, 1))
            props[rec.DELAY] = str(delay_level if delay_level > 0 else 3 + orig.reconsume_times)
        props.setdefault(rec.ORIGIN_MESSAGE_ID, h.opt_str(wire.ORIGIN_MSG_ID) or orig.msg_id)
        msg = MessageInner(topic=topic, queue_id=queue_id, flag=orig.flag, body=orig.body, properties=props,
                           sys_flag=orig.sys_flag, born_timestamp=orig.born_timestamp, born_host=orig.born_host,
                           reconsume_times=orig.reconsume_times + 1)
        result = await ctx.store.put_message(msg)
        if result.status is PutMessageStatus.PUT_OK:
            ctx.stats.msgs_in += 1
            return cmd.make_response(ResponseCode.SUCCESS)
        return cmd.make_response(ResponseCode.SYSTEM_ERROR, result.status.name)


class _ReplicatedAnswer(Deferred):
    """A SYNC_MASTER send's answer: built and handed to the connection when the replication
    outcome is known (the slave ack that covers it, its timeout, or shutdown). One object per
    send carries what the response needs, rather than callback partials."""

    def __init__(self, processor: SendMessageProcessor, cmd: RemotingCommand, result: PutResult,
                 queue_id: int) -> None:
        super().__init__()
        self.processor = processor
        self.cmd = cmd
        self.result = result
        self.queue_id = queue_id

    def replicated(self, status: PutMessageStatus) -> None:
        result = self.result
        if status is not _PUT_OK:
            result.status = status
        cmd = self.cmd
        self.resolve(self.processor._response(cmd, result, self.queue_id, len(cmd.body)))
