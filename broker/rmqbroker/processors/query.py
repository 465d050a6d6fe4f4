"""Message queries: QUERY_MESSAGE (12), by key or by the client's message id (RocketMQ's
QueryMessageProcessor, reference §4.5)."""

from __future__ import annotations

from rmqbroker.processors.context import BrokerContext
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import Connection, RemotingServer
from rmqbroker.remoting.wire import BadRequestError, Header

# RocketMQ's defaultQueryMaxNum: what a query by unique key (message id) asks for.
DEFAULT_QUERY_MAX_NUM = 32
NOT_FOUND_REMARK = "can not find message, maybe time range not correct"


class QueryMessageProcessor:
    """Looks messages up in the store's index files."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def register(self, server: RemotingServer) -> None:
        server.register(RequestCode.QUERY_MESSAGE, self.query_message)

    async def query_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = Header(cmd.ext_fields)
        topic = h.req_str(wire.TOPIC)
        key = h.req_str(wire.KEY)
        max_num = h.req_int32(wire.MAX_NUM)
        begin = h.req_int(wire.BEGIN_TIMESTAMP)
        end = h.req_int(wire.END_TIMESTAMP)
        if cmd.ext_fields.get(wire.UNIQUE_KEY_QUERY) == "true":
            max_num = DEFAULT_QUERY_MAX_NUM
        if not key:
            raise BadRequestError(ResponseCode.SYSTEM_ERROR, "the query key is empty")
        result = self.ctx.store.query_message(topic, key, max_num, begin, end)
        fields = {wire.INDEX_LAST_UPDATE_TIMESTAMP: str(result.index_last_update_timestamp),
                  wire.INDEX_LAST_UPDATE_PHYOFFSET: str(result.index_last_update_phy_offset)}
        if not result.records:
            return cmd.make_response(ResponseCode.QUERY_NOT_FOUND, NOT_FOUND_REMARK, ext_fields=fields)
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields=fields, body=b"".join(result.records))
