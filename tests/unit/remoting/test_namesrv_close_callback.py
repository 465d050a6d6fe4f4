"""A broker re-registering on one nameserver connection leaves one close callback, not one per
registration (the list used to grow every registerNameServerPeriod for the connection's life)."""

from __future__ import annotations

import asyncio

from rmqbroker.namesrv.processor import NamesrvProcessor
from rmqbroker.namesrv.routeinfo import RouteInfoManager
from rmqbroker.remoting import wire
from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import RemotingServer

BROKER = "127.0.0.1:10911"


def _register() -> RemotingCommand:
    return RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields={
        wire.BROKER_ADDR: BROKER, wire.BROKER_ID: "0", wire.CLUSTER_NAME: "C", wire.BROKER_NAME: "b",
        wire.HA_SERVER_ADDR: "127.0.0.1:10912"})


async def test_repeated_registrations_keep_one_close_callback() -> None:
    routes = RouteInfoManager()
    processor = NamesrvProcessor(routes)
    server = RemotingServer("127.0.0.1", 0, name="namesrv")
    processor.register(server)
    await server.start()
    client = RemotingClient()
    try:
        addr = f"127.0.0.1:{server.port}"
        for _ in range(5):
            resp = await client.invoke(addr, _register(), 2)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        (conn,) = server.connections  # the client reuses one connection
        assert len(conn._close_callbacks) == 1
        assert BROKER in routes.broker_live_table

        # The one callback still does its job: closing the connection drops the broker.
        await client.close()
        for _ in range(100):
            if BROKER not in routes.broker_live_table:
                break
            await asyncio.sleep(0.02)
        assert BROKER not in routes.broker_live_table
        assert not processor._watched

        # A new connection from the same broker is watched again.
        client = RemotingClient()
        assert (await client.invoke(addr, _register(), 2)).code == ResponseCode.SUCCESS
        for _ in range(100):
            if server.connections:
                break
            await asyncio.sleep(0.02)
        (conn2,) = server.connections
        assert conn2.id != conn.id and len(conn2._close_callbacks) == 1
    finally:
        await client.close()
        await server.stop()
