"""PULL_MESSAGE with long polling (reference §2.5).

A pull that finds nothing and carries the SUSPEND flag is parked in :class:`PullHoldService`
and answered when a message arrives on its queue or its suspend timeout passes. The C++ client
re-pulls immediately on every empty answer, so parking is what keeps idle consumers cheap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from rmqbroker.filter.sql92 import Selector
from rmqbroker.metadata.subscription_groups import SubscriptionGroupConfig
from rmqbroker.metadata.topics import RETRY_GROUP_TOPIC_PREFIX, perm_readable
from rmqbroker.processors.clients import (
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
from rmqbroker.remoting.wire import Header
from rmqbroker.store.message_store import GetMessageStatus, RecordFilter
from rmqbroker.store.record import RETRY_TOPIC, decode_properties, record_properties

log = logging.getLogger(__name__)

FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4

_STATUS_CODE: dict[GetMessageStatus, int] = {
    GetMessageStatus.FOUND: ResponseCode.SUCCESS,
    GetMessageStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.NO_MATCHED_LOGIC_QUEUE: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}
# Statuses whose nextBeginOffset a slave must not "correct" (offsetCheckInSlave=false).

def _selecting(selector: Selector) -> RecordFilter:
    """A record filter evaluating an SQL92 selector against the record's properties (system ones,
    such as TAGS and KEYS, included, as in RocketMQ)."""

    def match(view: memoryview) -> bool:
        return selector.matches(decode_properties(record_properties(view, 0)))
    return match


@dataclass(slots=True)
class _HeldPull:
    conn: Connection
    cmd: RemotingCommand
    offset: int
    deadline: float


class PullMessageProcessor:
    """Serves PULL_MESSAGE from the store, parking empty long-polls."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self.holds = PullHoldService(self)
        # Each queue's end when this broker last became master from a slave, and the (group,
        # topic, queue) pulls served at or below it since (see began_term).
        self._term_ends: dict[tuple[str, int], int] = {}
        self._term_seen: set[tuple[str, str, int]] = set()

    def began_term(self, ends: dict[tuple[str, int], int]) -> None:
        """This slave became master with these queue ends. A consumer that read messages of the
        old master's lost term (ASYNC: never replicated here) holds an offset beyond them; new
        sends fill those offsets here, and serving its first pull there would skip them. Its first
        pull of a queue above the end is answered PULL_OFFSET_MOVED to the end instead: it reads
        the new messages (at most some again), never past them. No consumer can have gone beyond
        an end legitimately before pulling from this master once."""
        self._term_ends = ends
        self._term_seen = set()

    def ended_term(self) -> None:
        self._term_ends = {}
        self._term_seen = set()

    def register(self, server: RemotingServer) -> None:
        server.register(RequestCode.PULL_MESSAGE, self.pull)

    def pull(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        """Answered synchronously: a pull never awaits (a parked one is answered later)."""
        return self.process(conn, cmd, allow_suspend=True)

    def process(self, conn: Connection, cmd: RemotingCommand, allow_suspend: bool) -> RemotingCommand | None:
        ctx = self.ctx
        h = Header(cmd.ext_fields)
        group = h.req_str(wire.CONSUMER_GROUP)
        topic = h.req_str(wire.TOPIC)
        queue_id = h.req_int(wire.QUEUE_ID)
        offset = h.req_int(wire.QUEUE_OFFSET)
        max_msgs = h.req_int(wire.MAX_MSG_NUMS)
        sys_flag = h.req_int(wire.SYS_FLAG)
        commit_offset = h.opt_int(wire.COMMIT_OFFSET, -1)
        suspend_ms = h.opt_int(wire.SUSPEND_TIMEOUT_MILLIS, 15000)

        if not perm_readable(ctx.settings.brokerPermission):
            return cmd.make_response(ResponseCode.NO_PERMISSION,
                                     f"the broker[{ctx.settings.host_ip}] pulling message is forbidden")
        group_cfg = ctx.groups.find(group, persist=False)
        if group_cfg is None:
            return cmd.make_response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                     f"subscription group [{group}] does not exist")
        if not group_cfg.consume_enable:
            return cmd.make_response(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
        tc = ctx.topics.select(topic)
        if tc is None:
            return cmd.make_response(ResponseCode.TOPIC_NOT_EXIST,
                                     f"topic[{topic}] not exist, apply first please!")
        if not tc.readable:
            return cmd.make_response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if queue_id < 0 or queue_id >= tc.read_queue_nums:
            return cmd.make_response(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                f"[{tc.read_queue_nums}] consumer:[{conn.remote_addr}]")
        if max_msgs <= 0:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"maxMsgNums[{max_msgs}] must be positive")

        sub: SubscriptionData | None
        if sys_flag & FLAG_SUBSCRIPTION:
            try:
                sub = build_subscription(topic, h.opt_str(wire.SUBSCRIPTION), h.opt_int(wire.SUB_VERSION, 0),
                                         h.opt_str(wire.EXPRESSION_TYPE))
            except SubscriptionParseError as exc:
                return cmd.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
        else:
            sub = ctx.clients.find_subscription(group, topic)
            if sub is None:
                return cmd.make_response(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                         f"the consumer's subscription not exist, group: {group}")
            if sub.sub_version < h.opt_int(wire.SUB_VERSION, 0):
                return cmd.make_response(ResponseCode.SUBSCRIPTION_NOT_LATEST,
                                         "the consumer's subscription not latest")
        record_filter: RecordFilter | None = None
        if not sub.is_tag_type:
            why = unsupported_filter(sub.expression_type, property_filter=ctx.settings.enablePropertyFilter)
            if why is not None:
                return cmd.make_response(ResponseCode.SYSTEM_ERROR, why)
            if sub.selector is None:
                return cmd.make_response(ResponseCode.FILTER_DATA_NOT_EXIST,
                                         "The broker's consumer filter data is not exist!Your expression may be "
                                         f"wrong! ({sub.filter_error})")
            record_filter = _selecting(sub.selector)
        elif ctx.settings.filterSupportRetry and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            record_filter = self._retry_filter(group)

        if self._term_ends and not ctx.is_slave:
            moved = self._behind_lost_term(cmd, group, topic, queue_id, offset)
            if moved is not None:
                return moved
        result = ctx.store.get_message(group, topic, queue_id, offset, max_msgs,
                                       None if sub.matches_all else sub.match_code, record_filter)
        status = result.status
        if status is GetMessageStatus.FOUND:
            ctx.stats.pulls_found += 1
        else:
            ctx.stats.pulls_missed += 1
        next_begin = result.next_begin_offset
        is_slave = ctx.is_slave
        code: int
        if status is GetMessageStatus.NO_MESSAGE_IN_QUEUE:
            code = ResponseCode.PULL_NOT_FOUND if offset == 0 else ResponseCode.PULL_OFFSET_MOVED
        else:
            code = _STATUS_CODE[status]
        # The store already leaves nextBeginOffset alone on a slave (offsetCheckInSlave=false);
        # a would-be PULL_OFFSET_MOVED is answered as "retry" there, as in RocketMQ.
        if is_slave and code == ResponseCode.PULL_OFFSET_MOVED:
            code = ResponseCode.PULL_RETRY_IMMEDIATELY

        if allow_suspend and sys_flag & FLAG_COMMIT_OFFSET and not is_slave and commit_offset >= 0:
            ctx.offsets.commit(group, topic, queue_id, commit_offset, conn.remote_addr)

        if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and sys_flag & FLAG_SUSPEND:
            hold_ms = suspend_ms if ctx.settings.longPollingEnable else ctx.settings.shortPollingTimeMills
            self.holds.hold(topic, queue_id, _HeldPull(conn, cmd, offset, time.monotonic() + hold_ms / 1000))
            ctx.stats.pull_held += 1
            return None

        ext = {
            wire.NEXT_BEGIN_OFFSET: str(next_begin),
            wire.MIN_OFFSET: str(result.min_offset),
            wire.MAX_OFFSET: str(result.max_offset),
            wire.SUGGEST_WHICH_BROKER_ID: str(self._suggest_broker(group_cfg, result.suggest_pulling_from_slave)),
        }
        if code == ResponseCode.SUCCESS:
            body = result.body()
            ctx.stats.msgs_out += result.message_count
            ctx.stats.bytes_out += len(body)
            ctx.stats.got(group, topic, result.message_count, len(body))
            return cmd.make_response(code, "FOUND", ext_fields=ext, body=body)
        return cmd.make_response(code, status.name, ext_fields=ext)

    def _behind_lost_term(self, cmd: RemotingCommand, group: str, topic: str, queue_id: int,
                          offset: int) -> RemotingCommand | None:
        key = (group, topic, queue_id)
        if key in self._term_seen:
            return None
        end = self._term_ends.get((topic, queue_id))
        if end is None or offset <= end:
            self._term_seen.add(key)
            return None
        log.warning("%s pulls %s queue %d at %d, beyond %d where this master's term began (it read "
                    "messages of a term that was lost): moved back to %d", group, topic, queue_id, offset, end, end)
        store = self.ctx.store
        ext = {wire.NEXT_BEGIN_OFFSET: str(end),
               wire.MIN_OFFSET: str(store.get_min_offset_in_queue(topic, queue_id)),
               wire.MAX_OFFSET: str(store.get_max_offset_in_queue(topic, queue_id)),
               wire.SUGGEST_WHICH_BROKER_ID: "0"}
        return cmd.make_response(ResponseCode.PULL_OFFSET_MOVED, "OFFSET_OVERFLOW_BADLY", ext_fields=ext)

    def _retry_filter(self, group: str) -> RecordFilter | None:
        """With filterSupportRetry, a retry message is selected by the group's selector of the topic
        it was first sent to (its RETRY_TOPIC property); one without such a selector always is."""
        clients = self.ctx.clients

        def match(view: memoryview) -> bool:
            props = decode_properties(record_properties(view, 0))
            real_topic = props.get(RETRY_TOPIC)
            sub = clients.find_subscription(group, real_topic) if real_topic else None
            if sub is None or sub.selector is None:
                return True
            return sub.selector.matches(props)
        return match

    def _suggest_broker(self, group_cfg: SubscriptionGroupConfig, slow: bool) -> int:
        """RocketMQ's rule: with slaveReadEnable, a consumer too far behind is sent to the group's
        whichBrokerWhenConsumeSlowly and any other back to its brokerId; otherwise to the master."""
        if not self.ctx.settings.slaveReadEnable:
            return 0
        return group_cfg.which_broker_when_consume_slowly if slow else group_cfg.broker_id


class PullHoldService:
    """Parked pulls per (topic, queueId), woken by message arrival or their deadline."""

    def __init__(self, processor: PullMessageProcessor, check_interval: float = 1.0) -> None:
        self.processor = processor
        self.check_interval = check_interval
        self._held: dict[tuple[str, int], list[_HeldPull]] = {}

    def hold(self, topic: str, queue_id: int, req: _HeldPull) -> None:
        if not self._held:
            # Listen to arrivals only while a pull is parked: sends cost nothing extra otherwise.
            self.processor.ctx.store.add_arrival_listener(self.on_arrival)
        self._held.setdefault((topic, queue_id), []).append(req)

    def _forget(self, key: tuple[str, int]) -> None:
        del self._held[key]
        if not self._held:
            self.processor.ctx.store.remove_arrival_listener(self.on_arrival)

    @property
    def held_count(self) -> int:
        return sum(len(v) for v in self._held.values())

    def on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Store callback after a dispatch; answers parked pulls that now have data."""
        key = (topic, queue_id)
        waiting = self._held.get(key)
        if not waiting:
            return
        ready = [r for r in waiting if max_offset > r.offset]
        if not ready:
            return
        self._held[key] = [r for r in waiting if max_offset <= r.offset]
        if not self._held[key]:
            self._forget(key)
        # Answer after the put that triggered us has returned: the send stays fast.
        asyncio.get_running_loop().call_soon(self._answer, ready)

    def _answer(self, reqs: list[_HeldPull]) -> None:
        for req in reqs:
            if req.conn.closed:
                continue
            try:
                resp = self.processor.process(req.conn, req.cmd, allow_suspend=False)
            except Exception as exc:
                log.exception("re-executing a held pull failed")
                resp = req.cmd.make_response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
            if resp is not None:
                req.conn.send_response(resp)

    async def run(self) -> None:
        """Expire parked pulls whose deadline passed (they are answered with what is there now)."""
        while True:
            await asyncio.sleep(self.check_interval)
            self.check_deadlines()

    def check_deadlines(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        due: list[_HeldPull] = []
        for key in list(self._held):
            keep: list[_HeldPull] = []
            for r in self._held[key]:
                if r.conn.closed:
                    continue
                (due if r.deadline <= now else keep).append(r)
            if keep:
                self._held[key] = keep
            else:
                self._forget(key)
        if due:
            self._answer(due)
