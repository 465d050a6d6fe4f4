"""Consumer offsets and queue offset queries: codes 14, 15, 29, 30, 31, 32, 33 (reference §2.8, §2.9, §2.12)."""

from __future__ import annotations

import logging
import os

from rmqbroker.processors.context import BrokerContext
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import Connection, RemotingServer
from rmqbroker.remoting.wire import Header

log = logging.getLogger(__name__)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * 1024**3


# RocketMQ's accessMessageInMemoryMaxRatio: data within 40 % of RAM behind the head counts as cached.
IN_MEMORY_WINDOW = _physical_memory() * 40 // 100


class OffsetProcessor:
    """Offset commits and offset lookups."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def register(self, server: RemotingServer) -> None:
        server.register(RequestCode.QUERY_CONSUMER_OFFSET, self.query_consumer_offset)
        server.register(RequestCode.UPDATE_CONSUMER_OFFSET, self.update_consumer_offset)
        server.register(RequestCode.GET_MAX_OFFSET, self.get_max_offset)
        server.register(RequestCode.GET_MIN_OFFSET, self.get_min_offset)
        server.register(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, self.search_offset_by_timestamp)
        server.register(RequestCode.GET_EARLIEST_MSG_STORETIME, self.get_earliest_msg_storetime)
        server.register(RequestCode.VIEW_MESSAGE_BY_ID, self.view_message_by_id)

    async def query_consumer_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = Header(cmd.ext_fields)
        group, topic, qid = h.req_str(wire.CONSUMER_GROUP), h.req_str(wire.TOPIC), h.req_int(wire.QUEUE_ID)
        offset = self.ctx.offsets.query(group, topic, qid)
        if offset >= 0:
            return cmd.make_response(ResponseCode.SUCCESS, ext_fields={wire.OFFSET: str(offset)})
        store = self.ctx.store
        if store.get_min_offset_in_queue(topic, qid) <= 0 and not self._first_unit_in_disk(topic, qid):
            return cmd.make_response(ResponseCode.SUCCESS, ext_fields={wire.OFFSET: "0"})
        return cmd.make_response(ResponseCode.QUERY_NOT_FOUND,
                                 "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")

    def _first_unit_in_disk(self, topic: str, qid: int) -> bool:
        units = self.ctx.store.get_consume_queue_units(topic, qid, 0, 1)
        if not units:
            return False
        phy = units[0][0]
        return self.ctx.store.max_phy_offset() - phy > IN_MEMORY_WINDOW

    async def update_consumer_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = Header(cmd.ext_fields)
        self.ctx.offsets.commit(h.req_str(wire.CONSUMER_GROUP), h.req_str(wire.TOPIC), h.req_int(wire.QUEUE_ID),
                                h.req_int(wire.COMMIT_OFFSET), conn.remote_addr, on_slave=self.ctx.is_slave)
        return cmd.make_response(ResponseCode.SUCCESS)

    async def get_max_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = Header(cmd.ext_fields)
        offset = self.ctx.store.get_max_offset_in_queue(h.req_str(wire.TOPIC), h.req_int(wire.QUEUE_ID))
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields={wire.OFFSET: str(offset)})

    async def get_min_offset(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = Header(cmd.ext_fields)
        offset = self.ctx.store.get_min_offset_in_queue(h.req_str(wire.TOPIC), h.req_int(wire.QUEUE_ID))
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields={wire.OFFSET: str(max(offset, 0))})

    async def search_offset_by_timestamp(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = Header(cmd.ext_fields)
        offset = self.ctx.store.get_offset_in_queue_by_time(
            h.req_str(wire.TOPIC), h.req_int(wire.QUEUE_ID), h.req_int(wire.TIMESTAMP))
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields={wire.OFFSET: str(offset)})

    async def get_earliest_msg_storetime(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = Header(cmd.ext_fields)
        ts = self.ctx.store.get_earliest_message_time(h.req_str(wire.TOPIC), h.req_int(wire.QUEUE_ID))
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields={wire.TIMESTAMP: str(ts)})

    async def view_message_by_id(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        offset = Header(cmd.ext_fields).req_int(wire.OFFSET)
        data = self.ctx.store.look_message_by_offset(offset)
        if data is None:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return cmd.make_response(ResponseCode.SUCCESS, body=data)
