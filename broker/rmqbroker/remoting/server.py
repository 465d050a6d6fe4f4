"""asyncio remoting server: frame parsing, dispatch by request code, responses matched by opaque.

Malformed frames (bad length, undecodable header) close that connection and are counted; a
request the client got wrong (bad header field, undecodable body) is answered with its error code
and counted; any other handler error becomes a SYSTEM_ERROR response with a remark. Nothing a peer sends can stop the
server from serving other connections.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from rmqbroker.remoting.codes import FLAG_ONEWAY, ResponseCode
from rmqbroker.remoting.frame import (
    MAX_FRAME_BYTES,
    FrameError,
    RemotingCommand,
    decode_frame,
    encode_header,
)
from rmqbroker.remoting.latency import RequestLatency
from rmqbroker.remoting.tls import HANDSHAKE_RECORD, SNIFF_TIMEOUT, SniffingListener, TlsSettings
from rmqbroker.remoting.wire import BadRequestError, HeaderError

log = logging.getLogger(__name__)

# Java's serverChannelMaxIdleTimeSeconds: a connection with no frame either way this long is closed.
IDLE_SECONDS = 120.0

# A handler answers at once (a command, a complete pre-encoded response frame as ``bytes``, or
# None for no answer now) or returns an awaitable that produces the answer; only the latter
# costs a task.
Response = RemotingCommand | bytes | None


class Deferred:
    """An answer a callback will give later (e.g. on a slave's ack): resolving it hands the response
    to the connection at once, without the loop pass an asyncio future's callbacks take.

    The server attaches the connection and request it answers (:meth:`attach`) instead of a
    callback object, so that a deferred answer costs no allocation beyond itself. Compiled code
    may subclass it to carry what the answer is built from.
    """

    def __init__(self) -> None:
        self._conn: Connection | None = None
        self._cmd: RemotingCommand | None = None
        self._started = 0.0
        self._done = False
        self._response: Response = None

    def resolve(self, response: Response) -> None:
        if self._done:
            return
        self._done = True
        conn = self._conn
        if conn is None:
            self._response = response
        else:
            cmd = self._cmd
            self._conn = self._cmd = None
            assert cmd is not None
            conn._finish(cmd, response, started=self._started)

    def attach(self, conn: Connection, cmd: RemotingCommand, started: float) -> None:
        """Server: the answer goes to ``conn`` for ``cmd`` (at once if it is already known)."""
        if self._done:
            response = self._response
            self._response = None
            conn._finish(cmd, response, started=started)
        else:
            self._conn = conn
            self._cmd = cmd
            self._started = started


# A coroutine may answer with a Deferred too (a send that first waited for its new topic's route,
# then waits for a slave's ack).
Handler = Callable[["Connection", RemotingCommand], Response | Deferred | Awaitable[Response | Deferred]]

_conn_ids = itertools.count(1)
# Opaques of requests this server sends to its peers (their responses come back with them).
_request_ids = itertools.count(1)


class PeerRequestError(Exception):
    """A request sent to a connected peer got no response (timeout, or the connection closed)."""

# The frame's leading length field: int at offset 0, bytes that follow it.
_LENGTH = struct.Struct(">i")


@dataclass
class RemotingStats:
    """Counters the admin endpoint exports; plain ints so the hot path stays cheap."""

    connections_total: int = 0
    connections_open: int = 0
    requests_total: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    malformed_frames: dict[str, int] = field(default_factory=dict)
    unsupported_codes: int = 0
    handler_errors: int = 0
    header_errors: int = 0
    bad_requests: dict[int, int] = field(default_factory=dict)  # other BadRequestErrors, by request code
    tls_connections: int = 0
    # Connections closed for carrying no frame either way for the idle timeout (none pending).
    idle_closed: int = 0
    # Connections refused before any frame: plain ones in enforcing mode, failed TLS handshakes.
    tls_refused: dict[str, int] = field(default_factory=dict)

    def malformed(self, reason: str) -> None:
        self.malformed_frames[reason] = self.malformed_frames.get(reason, 0) + 1

    def tls_refused_one(self, reason: str) -> None:
        self.tls_refused[reason] = self.tls_refused.get(reason, 0) + 1

    def tls_connection(self) -> None:
        self.tls_connections += 1

    def idle_one(self) -> None:
        self.idle_closed += 1

    def bad_request(self, code: int) -> None:
        self.bad_requests[code] = self.bad_requests.get(code, 0) + 1


class Connection(asyncio.Protocol):
    """One accepted TCP connection."""

    def __init__(self, server: RemotingServer) -> None:
        self.server = server
        self.id = next(_conn_ids)
        self.transport: asyncio.Transport | None = None
        self.remote_addr = "?"
        self.remote_host = "0.0.0.0"
        self.remote_port = 0
        self.closed = False
        self._buf = bytearray()
        self._out: list[bytes | bytearray | memoryview] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._close_callbacks: list[Callable[[Connection], None]] = []
        # Requests sent to the peer that wait for its response, by opaque.
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        # Frames read and bursts written: the idle sweep closes a connection on which it stays put.
        self.activity = 0
        self._seen_activity = 0
        self._quiet_since = 0.0

    # -- asyncio.Protocol --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.remote_host, self.remote_port = str(peer[0]), int(peer[1])
            self.remote_addr = f"{self.remote_host}:{self.remote_port}"
        stats = self.server.stats
        stats.connections_total += 1
        stats.connections_open += 1
        self._quiet_since = time.monotonic()
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._buf and not self.closed:
            # The peer went away in the middle of a frame.
            self.server.stats.malformed("truncated")
            log.warning("%s closed the connection inside a frame (%d bytes pending)", self.remote_addr,
                        len(self._buf))
            self._buf.clear()
        self.closed = True
        self.server.stats.connections_open -= 1
        self.server.connections.discard(self)
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(PeerRequestError(f"{self.remote_addr} closed the connection"))
        for cb in self._close_callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("close callback failed for %s", self.remote_addr)
        self._close_callbacks.clear()

    def data_received(self, data: bytes) -> None:
        self.server.stats.bytes_in += len(data)
        buf = self._buf
        if buf:
            # Continue a frame that straddled reads. Frames are parsed from immutable bytes (no
            # views of the mutable buffer to create and release per frame), so the buffer is
            # turned into bytes once its first frame is complete, not on every partial read,
            # which keeps large frames arriving in many chunks linear.
            buf += data
            if len(buf) < 4:
                return
            (length,) = _LENGTH.unpack_from(buf, 0)
            if length >= 4 and length + 4 <= MAX_FRAME_BYTES and len(buf) < 4 + length:
                return
            data = bytes(buf)
            buf.clear()
        pos = 0
        end = len(data)
        while end - pos >= 4:
            # The big-endian length field from four byte reads: compiled, no tuple per frame.
            length = (data[pos] << 24) | (data[pos + 1] << 16) | (data[pos + 2] << 8) | data[pos + 3]
            if length < 4 or length + 4 > MAX_FRAME_BYTES:  # a negative int32 is >= 2**31 here
                if data[pos] == HANDSHAKE_RECORD and data[pos + 1] == 3:
                    # A TLS record (type 22, version 3.x): a TLS client on a port without TLS.
                    self._malformed("tls_not_enabled", "a TLS handshake on a port whose tlsServerMode is disabled")
                else:
                    self._malformed("bad_length", f"frame length {length}")
                return
            frame_end = pos + 4 + length
            if frame_end > end:
                break
            try:
                cmd = decode_frame(data, pos + 4, frame_end)
            except FrameError as exc:
                self._malformed("bad_header", str(exc))
                return
            pos = frame_end
            self._dispatch(cmd)
            if self.closed:
                return
        if pos < end:
            buf += memoryview(data)[pos:]

    def _malformed(self, reason: str, detail: str) -> None:
        self.server.stats.malformed(reason)
        log.warning("closing %s: malformed frame (%s: %s)", self.remote_addr, reason, detail)
        self._buf.clear()
        self.close()

    # -- dispatch --
    def _dispatch(self, cmd: RemotingCommand) -> None:
        self.activity += 1
        if cmd.is_response:
            # The answer to a request this server sent the peer (see invoke); others are ignored.
            fut = self._pending.pop(cmd.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(cmd)
            return
        self.server.stats.requests_total += 1
        handler = self.server.handlers.get(cmd.code)
        if handler is None:
            self.server.stats.unsupported_codes += 1
            if not cmd.flag & FLAG_ONEWAY:
                self.send_response(cmd.make_response(
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    f" request type {cmd.code} not supported"))
            return
        started = time.perf_counter()
        try:
            result = handler(self, cmd)
        except Exception as exc:
            self._finish(cmd, self._error_response(cmd, exc), started=started)
            return
        if result is None or isinstance(result, (RemotingCommand, bytes)):
            self._finish(cmd, result, started=started)
            return
        if isinstance(result, Deferred):
            result.attach(self, cmd, started)
            return
        if isinstance(result, asyncio.Future):
            # An answer that a callback will provide (e.g. a slave ack): no task needed.
            result.add_done_callback(functools.partial(self._future_done, cmd, started))
            return
        task = asyncio.get_running_loop().create_task(self._run(result, cmd, started))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, pending: Awaitable[Response | Deferred], cmd: RemotingCommand, started: float) -> None:
        try:
            response = await pending
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            response = self._error_response(cmd, exc)
        if isinstance(response, Deferred):
            response.attach(self, cmd, started)
            return
        self._finish(cmd, response, started=started)

    def _future_done(self, cmd: RemotingCommand, started: float, fut: asyncio.Future[Response]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is None:
            self._finish(cmd, fut.result(), started=started)
        elif isinstance(exc, Exception):
            self._finish(cmd, self._error_response(cmd, exc), started=started)

    def _error_response(self, cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
        if isinstance(exc, BadRequestError):
            # The client's mistake, not the broker's: counted and answered, no traceback logged.
            if isinstance(exc, HeaderError):
                self.server.stats.header_errors += 1
            else:
                self.server.stats.bad_request(cmd.code)
            log.debug("request code %d from %s refused: %s", cmd.code, self.remote_addr, exc.remark)
            return cmd.make_response(exc.code, exc.remark)
        self.server.stats.handler_errors += 1
        log.error("request code %d from %s failed", cmd.code, self.remote_addr, exc_info=exc)
        return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")

    def _finish(self, cmd: RemotingCommand, response: Response, *, started: float) -> None:
        self.server.latency.observe(cmd.code, time.perf_counter() - started)
        if response is None or cmd.flag & FLAG_ONEWAY:
            return
        if isinstance(response, bytes):
            self._send_frame(response)
        else:
            self.send_response(response)

    # -- output --
    def send_response(self, cmd: RemotingCommand) -> None:
        """Queue a command (a response, or a server-initiated request) unless closed.

        Everything queued during one pass of the event loop goes out in one write: pipelined
        requests cost one syscall per burst instead of one per response.
        """
        transport = self.transport
        if transport is None or self.closed or transport.is_closing():
            return
        head = encode_header(cmd)
        out = self._out
        out.append(head)
        n = len(head)
        body = cmd.body
        if body:
            out.append(body)
            n += len(body)
        self.server.stats.bytes_out += n
        if len(out) <= 2:
            self.server.schedule_flush(self)

    def _send_frame(self, frame: bytes) -> None:
        """Queue a complete encoded frame, like :meth:`send_response`."""
        transport = self.transport
        if transport is None or self.closed or transport.is_closing():
            return
        out = self._out
        out.append(frame)
        self.server.stats.bytes_out += len(frame)
        if len(out) == 1:
            self.server.schedule_flush(self)

    def _flush_out(self) -> None:
        out = self._out
        if not out:
            return
        self._out = []
        self.activity += 1
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if len(out) == 1:
                transport.write(out[0])
            else:
                transport.writelines(out)

    def send_oneway(self, cmd: RemotingCommand) -> None:
        cmd.flag |= FLAG_ONEWAY
        self.send_response(cmd)

    async def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request to the peer (e.g. ask a client about itself) and wait for its response.

        Raises :class:`PeerRequestError` after ``timeout`` seconds or when the connection closes.
        """
        if self.closed:
            raise PeerRequestError(f"{self.remote_addr} is closed")
        opaque = next(_request_ids)
        cmd.opaque = opaque
        fut: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._pending[opaque] = fut
        self.send_response(cmd)
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError as exc:
            raise PeerRequestError(f"{self.remote_addr} did not answer request {cmd.code} within {timeout}s") \
                from exc
        finally:
            self._pending.pop(opaque, None)

    def on_close(self, cb: Callable[[Connection], None]) -> None:
        if self.closed:
            cb(self)
        else:
            self._close_callbacks.append(cb)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def close_if_idle(self, now: float, idle_seconds: float) -> None:
        """Close the connection when no frame went either way for ``idle_seconds`` (Java's
        serverChannelMaxIdleTimeSeconds): clients send a heartbeat every 30 s, so only a dead or
        stalled peer is that quiet, one half way through a frame holding up to 16 MiB buffered."""
        if self.activity != self._seen_activity:
            self._seen_activity = self.activity
            self._quiet_since = now
            return
        if now - self._quiet_since < idle_seconds or self.closed:
            return
        if self._buf:
            self._malformed("stalled", f"no complete frame for {idle_seconds:g}s, {len(self._buf)} bytes of "
                                       "one pending")
            return
        self.server.stats.idle_one()
        log.info("closing %s: no frame either way for %gs", self.remote_addr, idle_seconds)
        self.close()


class RemotingServer:
    """A listener whose requests are dispatched to handlers registered per request code."""

    def __init__(self, host: str, port: int, *, name: str = "remoting",
                 stats: RemotingStats | None = None, tls: TlsSettings | None = None,
                 idle_seconds: float = IDLE_SECONDS) -> None:
        self.host = host
        # 0: connections are never closed for being idle.
        self.idle_seconds = idle_seconds
        self._sweeper: asyncio.TimerHandle | None = None
        self.port = port
        self.name = name
        # None or mode "disabled": plain connections only, accepted by the loop itself.
        self.tls = tls
        self._listener: SniffingListener | None = None
        self.stats = stats if stats is not None else RemotingStats()
        self.handlers: dict[int, Handler] = {}
        self.connections: set[Connection] = set()
        self.latency = RequestLatency()
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Connections with queued output, written by one callback at the end of the loop pass.
        self._dirty: list[Connection] = []

    def register(self, code: int, handler: Handler) -> None:
        self.handlers[int(code)] = handler

    def schedule_flush(self, conn: Connection) -> None:
        """Have ``conn``'s queued output written at the end of this loop pass: one callback per
        pass for every connection answered in it (not one per connection), and the loop is
        cached, since ``asyncio.get_running_loop()`` makes a ``getpid`` system call each time."""
        dirty = self._dirty
        dirty.append(conn)
        if len(dirty) == 1:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._flush_dirty)

    def _flush_dirty(self) -> None:
        dirty = self._dirty
        self._dirty = []
        for conn in dirty:
            conn._flush_out()

    def _sweep(self) -> None:
        """Close the connections that were idle for ``idle_seconds``; again a quarter of it later."""
        now = time.monotonic()
        for conn in list(self.connections):
            conn.close_if_idle(now, self.idle_seconds)
        if self._loop is not None:
            self._sweeper = self._loop.call_later(self.idle_seconds / 4, self._sweep)

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        if self.idle_seconds > 0:
            self._sweeper = loop.call_later(self.idle_seconds / 4, self._sweep)
        tls = self.tls
        if tls is not None and tls.server_mode != "disabled":
            stats = self.stats
            listener = SniffingListener(tls, lambda: Connection(self), self.name, stats.tls_refused_one,
                                        stats.tls_connection, self.idle_seconds or SNIFF_TIMEOUT, stats.idle_one)
            self.port = await listener.start(self.host, self.port)
            self._listener = listener
            log.info("%s listening on %s:%d (TLS %s)", self.name, self.host, self.port, tls.server_mode)
            return
        self._server = await loop.create_server(lambda: Connection(self), self.host, self.port,
                                                reuse_address=True, backlog=1024)
        # A list under uvloop where typeshed declares a tuple: read it untyped, or mypyc's
        # compiled check of the declared type would reject it.
        server: Any = self._server
        self.port = int(server.sockets[0].getsockname()[1])
        log.info("%s listening on %s:%d", self.name, self.host, self.port)

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        listener = self._listener
        if listener is not None:
            self._listener = None
            listener.close()
            for conn in list(self.connections):
                conn.close()
            await listener.wait_closed()
            return
        if self._server is None:
            return
        self._server.close()
        for conn in list(self.connections):
            conn.close()
        await self._server.wait_closed()
        self._server = None
