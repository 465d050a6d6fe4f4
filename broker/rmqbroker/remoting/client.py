"""asyncio remoting client: one reused connection per address, requests matched by opaque.

The broker uses it to register with nameservers and (on slaves) to pull metadata from the master.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import struct
from collections.abc import Callable
from typing import cast

from rmqbroker.remoting.codes import FLAG_ONEWAY
from rmqbroker.remoting.frame import (
    MAX_FRAME_BYTES,
    FrameError,
    RemotingCommand,
    decode_frame_payload,
    encode_header,
)

log = logging.getLogger(__name__)

# The frame's leading length field: int at offset 0, bytes that follow it.
_LENGTH = struct.Struct(">i")


class RemotingError(Exception):
    """Base class of client-side failures."""


class RemotingConnectError(RemotingError):
    """The peer could not be reached or the connection dropped."""


class RemotingClosedError(RemotingConnectError):
    """The peer closed the connection before answering (it may, e.g., serve TLS only)."""


class RemotingTimeoutError(RemotingError):
    """No response within the timeout."""


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {addr!r} is not host:port")
    return host.strip("[]"), int(port)


class _ClientConnection(asyncio.Protocol):
    def __init__(self, owner: RemotingClient, addr: str) -> None:
        self.owner = owner
        self.addr = addr
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self.closed = False
        self._buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        by_peer = not self.closed  # close() marks ours first
        self.closed = True
        self.owner._forget(self)
        if by_peer and self.owner.on_close is not None:
            self.owner.on_close(self.addr)
        err = RemotingClosedError(f"connection to {self.addr} closed")
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(err)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (length,) = _LENGTH.unpack_from(buf, pos)
            if length < 4 or length + 4 > MAX_FRAME_BYTES:
                log.warning("closing connection to %s: bad frame length %d", self.addr, length)
                self.close()
                return
            if end - pos < 4 + length:
                break
            try:
                cmd = decode_frame_payload(bytes(buf[pos + 4:pos + 4 + length]))
            except FrameError as exc:
                log.warning("closing connection to %s: %s", self.addr, exc)
                self.close()
                return
            pos += 4 + length
            if cmd.is_response:
                fut = self.pending.pop(cmd.opaque, None)
                if fut is not None and not fut.done():
                    fut.set_result(cmd)
            elif self.owner.on_request is not None:
                self.owner.on_request(self.addr, cmd)
        if pos:
            del buf[:pos]

    def write(self, cmd: RemotingCommand) -> None:
        if self.transport is None or self.closed:
            raise RemotingConnectError(f"connection to {self.addr} is closed")
        self.transport.write(encode_header(cmd) + bytes(cmd.body))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class RemotingClient:
    """Request/response client with per-address connection reuse."""

    def __init__(self, connect_timeout: float = 3.0,
                 on_request: Callable[[str, RemotingCommand], None] | None = None,
                 ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext | None] | None = None,
                 on_close: Callable[[str], None] | None = None) -> None:
        self.connect_timeout = connect_timeout
        # TLS for every connection (RocketMQ's tls.enable), or a source asked for each new
        # connection (tls.ClientContexts: renewed certificates); see remoting/tls.py.
        self.ssl_context = ssl_context
        # Requests a server sends on our connections (e.g. CHECK_TRANSACTION_STATE), with its address.
        self.on_request = on_request
        # Called with the address when a peer closes a connection (or it breaks), not when we do.
        self.on_close = on_close
        self._conns: dict[str, _ClientConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._opaque = itertools.count(1)

    def _forget(self, conn: _ClientConnection) -> None:
        if self._conns.get(conn.addr) is conn:
            del self._conns[conn.addr]

    async def _connection(self, addr: str) -> _ClientConnection:
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is not None and not conn.closed:
                return conn
            host, port = split_addr(addr)
            loop = asyncio.get_running_loop()
            ctx = self.ssl_context() if callable(self.ssl_context) else self.ssl_context
            try:
                async with asyncio.timeout(self.connect_timeout):
                    _, proto = await loop.create_connection(lambda: _ClientConnection(self, addr), host, port,
                                                            ssl=ctx)
            except (OSError, TimeoutError) as exc:
                raise RemotingConnectError(f"cannot connect to {addr}: {exc}") from exc
            self._conns[addr] = proto
            return proto

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request and wait for its response."""
        conn = await self._connection(addr)
        cmd.opaque = next(self._opaque) & 0x7FFFFFFF
        fut: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        conn.pending[cmd.opaque] = fut
        try:
            conn.write(cmd)
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError as exc:
            raise RemotingTimeoutError(
                f"request code {cmd.code} to {addr} timed out after {timeout:.1f}s") from exc
        finally:
            conn.pending.pop(cmd.opaque, None)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        conn = await self._connection(addr)
        cmd.opaque = next(self._opaque) & 0x7FFFFFFF
        cmd.flag |= FLAG_ONEWAY
        conn.write(cmd)

    def respond(self, addr: str, response: RemotingCommand) -> None:
        """Answer a request the server at ``addr`` sent on our connection (see ``on_request``)."""
        conn = self._conns.get(addr)
        if conn is None or conn.closed:
            raise RemotingConnectError(f"connection to {addr} is closed")
        conn.write(response)

    def close_address(self, addr: str) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.close()

    async def close(self) -> None:
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()
        await asyncio.sleep(0)
