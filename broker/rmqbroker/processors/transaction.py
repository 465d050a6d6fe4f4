"""Transactional messages, as RocketMQ 4.9 keeps them (TransactionalMessageService,
EndTransactionProcessor and TransactionalMessageCheckService).

* **Half message.** A send with ``TRAN_MSG=true`` is stored in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0,
  its topic and queue kept in ``REAL_TOPIC``/``REAL_QID``: no consumer sees it yet. The answer
  carries the half's queue offset and offset message id, which the producer hands back.
* **END_TRANSACTION (37).** A commit stores the message again in its real topic (transaction type
  COMMIT, ``preparedTransactionOffset`` = the half's commitlog offset), where consumers get it; a
  rollback stores nothing. Either way an *op* message (body: the half's queue offset, tag ``d``)
  goes to ``RMQ_SYS_TRANS_OP_HALF_TOPIC``: that half is settled. A half settled already is not
  committed twice (RocketMQ would store a second copy).
* **Check.** Every ``transactionCheckInterval`` the master walks the halves not settled by an op.
  One older than ``transactionTimeOut`` (or its ``CHECK_IMMUNITY_TIME_IN_SECONDS``) is asked about:
  CHECK_TRANSACTION_STATE (39) goes to a connected producer of its group, which answers with
  END_TRANSACTION. After ``transactionCheckMax`` checks a half is given up (logged once the walk's
  progress past it is on disk; one given up behind an older open half is skipped, not asked about
  again, until the walk passes it). How far the
  walk has settled everything is kept as the consumer offset of ``CID_RMQ_SYS_TRANS`` on both
  topics, so a restarted broker, or a promoted slave (which syncs consumer offsets), carries on.
  Unlike RocketMQ, a checked half is not written again at the end of the half queue; its check
  count is kept in memory, so a restart at most checks a half again.
* **RESUME_CHECK_HALF_MESSAGE (323).** An admin names a half by its offset message id; it is stored
  again at the end of the half queue with ``TRANSACTION_CHECK_TIMES`` 0, as RocketMQ does. The copy is
  a new half (new queue offset, store time now), so the check asks about it after
  ``transactionTimeOut`` with a fresh count of ``transactionCheckMax``, and END_TRANSACTION settles
  it. RocketMQ puts back whatever record the id names; here it must be a half the check has given
  up: one the walk has not passed yet is still being checked, and one already committed or rolled
  back would be committed a second time, so both are refused with a remark.

Everything here goes through the commitlog, so slaves replicate halves, ops and commits.
"""

from __future__ import annotations

import logging
import time

from rmqbroker.processors.context import BrokerContext
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import Connection, RemotingServer
from rmqbroker.remoting.wire import BadRequestError, Header
from rmqbroker.store import record as rec
from rmqbroker.store.errors import CorruptRecordError, MessageIdError
from rmqbroker.store.message_store import GetMessageStatus, MessageInner, PutMessageStatus
from rmqbroker.store.record import MessageRecord, decode_offset_msg_id, decode_record, encode_record, offset_msg_id

log = logging.getLogger(__name__)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_GROUP = "CID_RMQ_SYS_TRANS"
REMOVE_TAG = "d"
CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
_READ_BATCH = 32
_PERM_RW = 6
PUT_BACK_FAILED = f"Put message back to {HALF_TOPIC} failed."
# How far before a half's store time its op may have been stored (clocks are not strictly monotonic).
_OP_CLOCK_MARGIN_MS = 1000


def is_half(props: dict[str, str], reconsume_times: int) -> bool:
    """Whether a send is a transactional half message (RocketMQ's test, with its exception for the
    delayed retries of pre-4.6.1 clients)."""
    tran = props.get(rec.TRAN_MSG)
    if tran is None or tran.lower() != "true":
        return False
    try:
        delayed = int(props.get(rec.DELAY) or 0) > 0
    except ValueError:
        delayed = False
    return not (reconsume_times > 0 and delayed)


def _real_target(props: dict[str, str], default_topic: str) -> tuple[str, int]:
    """Take REAL_TOPIC/REAL_QID out of a half message's ``props``: where its message belongs."""
    topic = props.pop(rec.REAL_TOPIC, default_topic)
    try:
        queue_id = int(props.pop(rec.REAL_QID, "0") or 0)
    except ValueError:
        queue_id = 0
    return topic, queue_id


def _op_half_offset(op: MessageRecord) -> int | None:
    """The half queue offset an op message settles (None: not an op body)."""
    try:
        return int(op.body.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None


class TransactionService:
    """Half messages, their commit or rollback, and the check of those left open."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        # Half queue offset -> checks sent (this process's life).
        self._checks: dict[int, int] = {}
        # Half queue offsets settled by an op (from END_TRANSACTION here, or read by a check round).
        self._settled_set: set[int] = set()
        # Halves given up above the walk's progress (an older half is still open): skipped until
        # the progress passes them, not asked about afresh. A restart forgets them (asked again).
        self._given_up_set: set[int] = set()
        self.committed = 0
        self.rolled_back = 0
        self.checks_sent = 0
        self.given_up = 0

    # Read when used: UPDATE_BROKER_CONFIG may change them.
    @property
    def timeout_ms(self) -> int:
        return self.ctx.settings.transactionTimeOut

    @property
    def check_max(self) -> int:
        return self.ctx.settings.transactionCheckMax

    def register(self, server: RemotingServer) -> None:
        server.register(RequestCode.END_TRANSACTION, self.end_transaction)
        server.register(RequestCode.RESUME_CHECK_HALF_MESSAGE, self.resume_check_half_message)

    # -- the half message ---------------------------------------------------------------------
    def to_half(self, topic: str, queue_id: int, props: dict[str, str]) -> tuple[str, int]:
        """Where a half message of ``topic``/``queue_id`` is stored (``props`` gains the real ones)."""
        props[rec.REAL_TOPIC] = topic
        props[rec.REAL_QID] = str(queue_id)
        props.pop(rec.DELAY, None)  # a delay applies to the committed message, which has none
        self._system_topic(HALF_TOPIC)
        return HALF_TOPIC, 0

    def _system_topic(self, name: str) -> None:
        if self.ctx.topics.select(name) is None:
            self.ctx.topics.create_retry_topic(name, 1, _PERM_RW, persist=False)

    # -- END_TRANSACTION ----------------------------------------------------------------------
    async def end_transaction(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        """Commit or roll back a half message (mostly oneway: the answer then goes nowhere)."""
        if self.ctx.role == "SLAVE" and self.ctx.relay is not None:
            relayed = self.ctx.relay.forward(cmd, conn.remote_addr)
            if relayed is not None:
                return await relayed
        h = Header(cmd.ext_fields)
        group = h.req_str(wire.PRODUCER_GROUP)
        table_offset = h.req_int(wire.TRAN_STATE_TABLE_OFFSET)
        phy = h.req_int(wire.COMMIT_LOG_OFFSET)
        kind = h.req_int32(wire.COMMIT_OR_ROLLBACK)
        from_check = h.opt_bool(wire.FROM_TRANSACTION_CHECK)
        ctx = self.ctx
        if ctx.is_slave:
            return cmd.make_response(ResponseCode.SLAVE_NOT_AVAILABLE,
                                     "Store in slave mode, not allowed end transaction")
        if kind not in (rec.TRANSACTION_COMMIT_TYPE, rec.TRANSACTION_ROLLBACK_TYPE):
            log.info("transaction of %s at commitlog offset %d left open (state %d, from check: %s)", group, phy,
                     kind, from_check)
            return None  # unknown: the check asks again later
        half = self._half_at_phy(phy)
        if half is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
        if half.properties.get(rec.PGROUP) != group:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        if half.queue_offset != table_offset:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong")
        if self._is_settled(half):
            # A repeated end (e.g. a late check answer). The op queue is read, not only the
            # in-memory set: a check round drops halves below its progress from that set, and a
            # restart empties it.
            return cmd.make_response(ResponseCode.SUCCESS)
        if kind == rec.TRANSACTION_COMMIT_TYPE:
            status = self._commit(half)
            if status is not PutMessageStatus.PUT_OK:
                return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"storing the committed message failed: {status}")
            self.committed += 1
        else:
            self.rolled_back += 1
        status = self._settle(half)
        if status is not PutMessageStatus.PUT_OK:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"storing the transaction's op failed: {status}")
        return cmd.make_response(ResponseCode.SUCCESS)

    def _half_at_phy(self, phy: int) -> MessageRecord | None:
        raw = self.ctx.store.look_message_by_offset(phy)
        if raw is None:
            return None
        try:
            half = decode_record(raw)
        except CorruptRecordError:
            return None
        return half if half.topic == HALF_TOPIC and half.physical_offset == phy else None

    def _commit(self, half: MessageRecord) -> PutMessageStatus:
        props = dict(half.properties)
        topic, queue_id = _real_target(props, "")
        props.pop(rec.TRAN_MSG, None)
        props.pop(rec.TRANSACTION_CHECK_TIMES, None)
        msg = MessageInner(topic, queue_id, half.flag, half.body, props,
                           (half.sys_flag & ~rec.TRANSACTION_TYPE_MASK) | rec.TRANSACTION_COMMIT_TYPE,
                           half.born_timestamp, half.born_host, half.reconsume_times, None, None,
                           half.physical_offset)
        return self.ctx.store.append_message(msg).status

    def _settle(self, half: MessageRecord) -> PutMessageStatus:
        """Record that ``half`` is committed or rolled back (RocketMQ's op message)."""
        self._system_topic(OP_TOPIC)
        op = MessageInner(OP_TOPIC, 0, 0, str(half.queue_offset).encode("ascii"), {rec.TAGS: REMOVE_TAG},
                          0, int(time.time() * 1000), self.ctx.store.config.store_host)
        self._checks.pop(half.queue_offset, None)
        status = self.ctx.store.append_message(op).status
        if status is PutMessageStatus.PUT_OK:
            self._settled_set.add(half.queue_offset)
        return status

    # -- RESUME_CHECK_HALF_MESSAGE ------------------------------------------------------------
    async def resume_check_half_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """Put a given-up half back at the end of the half queue, so the check asks about it again
        (see the module docstring for how this maps RocketMQ's re-put)."""
        msg_id = Header(cmd.ext_fields).req_str(wire.MSG_ID)
        try:
            _ip, _port, phy = decode_offset_msg_id(msg_id)
        except MessageIdError as exc:
            raise BadRequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from exc
        if self.ctx.is_slave:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, PUT_BACK_FAILED)
        raw = self.ctx.store.look_message_by_offset(phy)
        if raw is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset msg id {msg_id}")
        half = self._half_at_phy(phy)
        if half is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"the message {msg_id} is not a half message of "
                                                                f"{HALF_TOPIC}")
        if half.queue_offset >= self._unsettled_from(HALF_TOPIC) and half.queue_offset not in self._given_up_set:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"the half message {msg_id} is still being checked")
        if self._is_settled(half):
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"the transaction of half message {msg_id} is "
                                                                "already committed or rolled back")
        props = dict(half.properties)
        props[rec.TRANSACTION_CHECK_TIMES] = "0"
        copy = MessageInner(HALF_TOPIC, 0, half.flag, half.body, props, half.sys_flag, half.born_timestamp,
                            half.born_host, half.reconsume_times)
        result = self.ctx.store.append_message(copy)
        if result.status is not PutMessageStatus.PUT_OK:
            log.error("Put message back to %s failed: %s", HALF_TOPIC, result.status)
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, PUT_BACK_FAILED)
        log.info("Put message back to %s. real topic=%s (half %s at queue offset %d, now at %d)", HALF_TOPIC,
                 half.properties.get(rec.REAL_TOPIC), msg_id, half.queue_offset, result.queue_offset)
        return cmd.make_response(ResponseCode.SUCCESS)

    def _is_settled(self, half: MessageRecord) -> bool:
        """Whether an op settles ``half``: ops are stored after their half, so the op queue is read
        from the half's store time on."""
        if half.queue_offset in self._settled_set:
            return True
        store = self.ctx.store
        end = store.get_max_offset_in_queue(OP_TOPIC, 0)
        near = store.get_offset_in_queue_by_time(OP_TOPIC, 0, half.store_timestamp - _OP_CLOCK_MARGIN_MS)
        start = max(store.get_min_offset_in_queue(OP_TOPIC, 0), near - 1)
        return any(_op_half_offset(op) == half.queue_offset for op in self._read(OP_TOPIC, start, end))

    # -- reading the two queues ---------------------------------------------------------------
    def _read(self, topic: str, start: int, end: int) -> list[MessageRecord]:
        """The records of ``topic`` queue 0 from logical ``start`` up to ``end``."""
        out: list[MessageRecord] = []
        offset = start
        store = self.ctx.store
        while offset < end:
            result = store.get_message(CHECK_GROUP, topic, 0, offset, min(_READ_BATCH, end - offset))
            if result.status is not GetMessageStatus.FOUND or not result.buffers:
                if result.next_begin_offset <= offset:
                    break
                offset = result.next_begin_offset  # e.g. a gap left by retention
                continue
            for buf in result.buffers:
                try:
                    out.append(decode_record(buf))
                except CorruptRecordError:
                    log.error("unreadable record in %s at queue offset %d", topic, offset)
            offset = result.next_begin_offset
        return out

    def _unsettled_from(self, topic: str) -> int:
        """Where the check's walk of ``topic`` queue 0 starts: its committed progress, or the
        oldest unit retention left."""
        return max(self.ctx.offsets.query(CHECK_GROUP, topic, 0), self.ctx.store.get_min_offset_in_queue(topic, 0))

    def correct_progress(self) -> None:
        """Take the check's progress on the half and op queues back to the queue's end where it is
        beyond it.

        A promoted slave's progress is its master's, copied by the metadata sync with the consumer
        offsets; when its log had not caught up, the progress is beyond its half queue, and the
        halves sent to the new master (stored from the queue's end on) would never be checked: a
        half whose producer never ends it would stay undelivered, never given up. Called when the
        broker becomes a master (at start too), before it serves a send in that role.

        What this process remembers of an earlier term as master goes too, as a restart forgets
        it: its log may have been cut back since (it lost that term), and a half now at a queue
        offset it settled then is another one, which a remembered "settled" would answer SUCCESS
        without committing.
        """
        self._checks.clear()
        self._settled_set.clear()
        self._given_up_set.clear()
        for topic in (HALF_TOPIC, OP_TOPIC):
            progress = self.ctx.offsets.query(CHECK_GROUP, topic, 0)
            end = self.ctx.store.get_max_offset_in_queue(topic, 0)
            if progress > end:
                log.warning("transaction check progress %d on %s is beyond its queue's end %d; checking from there",
                            progress, topic, end)
                self.ctx.offsets.commit(CHECK_GROUP, topic, 0, end)

    # -- the check ----------------------------------------------------------------------------
    async def check_round(self, now_ms: int | None = None) -> int:
        """One walk over the open halves (on the loop: reads are page-cache reads); checks sent.
        Progress is persisted at once, so that a crash does not ask about settled halves again."""
        ctx = self.ctx
        if ctx.is_slave:
            return 0
        store = ctx.store
        half_end = store.get_max_offset_in_queue(HALF_TOPIC, 0)
        start = self._unsettled_from(HALF_TOPIC)
        if start >= half_end:
            return 0
        now = int(time.time() * 1000) if now_ms is None else now_ms
        op_start = self._unsettled_from(OP_TOPIC)
        ops = [(op.queue_offset, _op_half_offset(op))
               for op in self._read(OP_TOPIC, op_start, store.get_max_offset_in_queue(OP_TOPIC, 0))]
        settled = {h for _, h in ops if h is not None and start <= h < half_end} | self._settled_set
        first_open: int | None = None
        sent = 0
        given_up: list[tuple[MessageRecord, int]] = []
        for half in self._read(HALF_TOPIC, start, half_end):
            offset = half.queue_offset
            if offset in settled or offset in self._given_up_set:
                continue
            immunity = self._immunity_ms(half)
            if now - half.store_timestamp < immunity:
                if first_open is None:
                    first_open = offset
                break  # the rest are younger still
            checks = self._checks.get(offset, 0)
            if checks >= self.check_max:
                self._checks.pop(offset, None)
                self._given_up_set.add(offset)
                given_up.append((half, checks))
                continue
            if first_open is None:
                first_open = offset
            if self._ask(half):
                self._checks[offset] = checks + 1
                sent += 1
        progress = half_end if first_open is None else first_open
        self._settled_set = {o for o in settled if o >= progress}
        self._given_up_set = {o for o in self._given_up_set if o >= progress}
        if progress > start:
            ctx.offsets.commit(CHECK_GROUP, HALF_TOPIC, 0, progress)
            # The op queue's progress moves over the ops of halves below the new progress.
            op_progress = op_start
            for op_offset, half_offset in ops:
                if half_offset is not None and half_offset >= progress:
                    break
                op_progress = op_offset + 1
            if op_progress > op_start:
                ctx.offsets.commit(CHECK_GROUP, OP_TOPIC, 0, op_progress)
            await ctx.offsets.persist_async()
        # Reported once the progress past them is on disk: a crash after the report cannot bring
        # a given-up half back to be checked (and delivered) again.
        for half, checks in given_up:
            self.given_up += 1
            log.warning("transaction of %s (half at queue offset %d, id %s) unresolved after %d checks: "
                        "given up, its message is not delivered", half.properties.get(rec.PGROUP),
                        half.queue_offset, half.properties.get(rec.UNIQ_KEY), checks)
        return sent

    def _immunity_ms(self, half: MessageRecord) -> int:
        try:
            seconds = int(half.properties.get(CHECK_IMMUNITY) or 0)
        except ValueError:
            seconds = 0
        return seconds * 1000 if seconds > 0 else self.timeout_ms

    def _ask(self, half: MessageRecord) -> bool:
        """Send CHECK_TRANSACTION_STATE for ``half`` to one producer of its group; False if none is
        connected (asked again next round)."""
        group = half.properties.get(rec.PGROUP) or ""
        channel = self.ctx.clients.any_producer(group)
        if channel is None:
            log.info("transaction check of %s (half at %d): no producer of the group is connected", group,
                     half.queue_offset)
            return False
        props = dict(half.properties)
        topic, queue_id = _real_target(props, half.topic)
        props[rec.TRANSACTION_CHECK_TIMES] = str(self._checks.get(half.queue_offset, 0) + 1)
        store_host = half.store_host
        body = encode_record(
            topic=topic, body=half.body, properties=props, queue_id=queue_id, flag=half.flag,
            queue_offset=half.queue_offset, physical_offset=half.physical_offset, sys_flag=half.sys_flag,
            born_timestamp=half.born_timestamp, born_host=half.born_host, store_timestamp=half.store_timestamp,
            store_host=store_host, reconsume_times=half.reconsume_times,
            prepared_transaction_offset=half.physical_offset)
        uniq = half.properties.get(rec.UNIQ_KEY) or ""
        ext = {
            wire.TRAN_STATE_TABLE_OFFSET: str(half.queue_offset),
            wire.COMMIT_LOG_OFFSET: str(half.physical_offset),
            wire.MSG_ID: uniq,
            wire.TRANSACTION_ID: uniq,
            wire.OFFSET_MSG_ID: offset_msg_id(store_host[0], store_host[1], half.physical_offset),
        }
        channel.conn.send_oneway(RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE, ext_fields=ext, body=body))
        self.checks_sent += 1
        return True
