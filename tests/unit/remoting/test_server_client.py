"""The asyncio server and client on loopback: dispatch, unknown codes, malformed frames, oneway."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import pytest

from rmqbroker.remoting.client import RemotingClient, RemotingConnectError, RemotingTimeoutError
from rmqbroker.remoting.codes import ResponseCode
from rmqbroker.remoting.frame import RemotingCommand, encode_frame
from rmqbroker.remoting.server import Connection, RemotingServer
from rmqbroker.remoting.wire import Header


async def _echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.make_response(0, ext_fields={"echo": Header(cmd.ext_fields).req_str("x")}, body=cmd.body)


async def _slow(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    await asyncio.sleep(5)
    return cmd.make_response(0)


async def _boom(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    raise RuntimeError("kaput")


@pytest.fixture
async def server() -> AsyncIterator[RemotingServer]:
    srv = RemotingServer("127.0.0.1", 0)
    srv.register(1, _echo)
    srv.register(2, _slow)
    srv.register(3, _boom)
    await srv.start()
    yield srv
    await srv.stop()


async def test_request_response_and_errors(server: RemotingServer) -> None:
    client = RemotingClient()
    addr = f"127.0.0.1:{server.port}"
    resp = await client.invoke(addr, RemotingCommand(1, ext_fields={"x": "hi"}, body=b"b"), 2)
    assert resp.code == 0 and resp.ext_fields == {"echo": "hi"} and resp.body == b"b"
    missing = await client.invoke(addr, RemotingCommand(1), 2)
    assert missing.code == ResponseCode.SYSTEM_ERROR and "<x>" in (missing.remark or "")
    unknown = await client.invoke(addr, RemotingCommand(999), 2)
    assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "999" in (unknown.remark or "")
    boom = await client.invoke(addr, RemotingCommand(3), 2)
    assert boom.code == ResponseCode.SYSTEM_ERROR and "kaput" in (boom.remark or "")
    with pytest.raises(RemotingTimeoutError):
        await client.invoke(addr, RemotingCommand(2), 0.2)
    # concurrent requests on one connection are matched by opaque
    results = await asyncio.gather(*[
        client.invoke(addr, RemotingCommand(1, ext_fields={"x": str(i)}), 2) for i in range(50)])
    assert [r.ext_fields["echo"] for r in results] == [str(i) for i in range(50)]
    assert server.stats.handler_errors == 1
    await client.close()


@pytest.mark.parametrize("garbage", [
    struct.pack(">i", 17 * 1024 * 1024) + b"x" * 16,     # oversized frame
    struct.pack(">i", 2) + b"zz",                         # shorter than a header word
    struct.pack(">ii", 9, 5) + b"{bad}",                  # undecodable header
    b"GET / HTTP/1.1\r\n\r\n",                             # plain garbage
])
async def test_malformed_frame_closes_only_that_connection(server: RemotingServer, garbage: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(garbage)
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 2) == b""  # closed by the server
    writer.close()
    assert sum(server.stats.malformed_frames.values()) == 1
    client = RemotingClient()
    resp = await client.invoke(f"127.0.0.1:{server.port}", RemotingCommand(1, ext_fields={"x": "ok"}), 2)
    assert resp.ext_fields["echo"] == "ok"
    await client.close()


async def test_frame_split_across_reads(server: RemotingServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    frame = encode_frame(RemotingCommand(1, opaque=42, ext_fields={"x": "split"}))
    for i in range(len(frame)):
        writer.write(frame[i:i + 1])
        await writer.drain()
    (length,) = struct.unpack(">i", await reader.readexactly(4))
    data = await reader.readexactly(length)
    assert b'"echo":"split"' in data and b'"opaque":42' in data
    writer.close()


async def test_oneway_gets_no_response(server: RemotingServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(encode_frame(RemotingCommand(1, flag=2, ext_fields={"x": "1"})))
    writer.write(encode_frame(RemotingCommand(1, opaque=5, ext_fields={"x": "2"})))
    await writer.drain()
    (length,) = struct.unpack(">i", await reader.readexactly(4))
    data = await reader.readexactly(length)
    assert b'"opaque":5' in data  # the first (oneway) produced nothing
    writer.close()


async def test_connect_error() -> None:
    client = RemotingClient(connect_timeout=1)
    with pytest.raises(RemotingConnectError):
        await client.invoke("127.0.0.1:1", RemotingCommand(1), 1)


async def test_server_asks_the_peer_and_gets_its_answer_or_an_error() -> None:
    """Connection.invoke: a request from the server to a connected client (GET_CONSUMER_RUNNING_INFO),
    answered by opaque; no answer times out; a closing peer fails what is still waiting."""
    from rmqbroker.remoting.frame import decode_frame_payload
    from rmqbroker.remoting.server import PeerRequestError

    seen: list[Connection] = []

    async def hello(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(conn)
        return cmd.make_response(0)

    srv = RemotingServer("127.0.0.1", 0)
    srv.register(1, hello)
    await srv.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    try:
        writer.write(encode_frame(RemotingCommand(1, opaque=7)))
        await writer.drain()
        await reader.readexactly(struct.unpack(">i", await reader.readexactly(4))[0])
        conn = seen[0]

        async def peer_answers() -> None:
            length = struct.unpack(">i", await reader.readexactly(4))[0]
            req = decode_frame_payload(await reader.readexactly(length))
            writer.write(encode_frame(req.make_response(0, "it's me", body=b"about me")))
            await writer.drain()

        answering = asyncio.create_task(peer_answers())
        answer = await conn.invoke(RemotingCommand(307, ext_fields={"clientId": "c"}), 2)
        await answering
        assert (answer.code, answer.remark, bytes(answer.body)) == (0, "it's me", b"about me")
        with pytest.raises(PeerRequestError, match=r"within 0\.2s"):
            await conn.invoke(RemotingCommand(307), 0.2)
        waiting = asyncio.create_task(conn.invoke(RemotingCommand(307), 5))
        await asyncio.sleep(0.05)
        writer.close()
        with pytest.raises(PeerRequestError, match="closed"):
            await waiting
    finally:
        writer.close()
        await srv.stop()
