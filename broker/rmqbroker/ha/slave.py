"""HA slave side (reference §7.2-§7.4): follows a master's commitlog stream.

Reports its max offset on connect, after every burst of appended data and every heartbeat
interval; appends through the store (consume queues are built from the appended records); refuses
a stream that does not continue its own log; reconnects with back-off when the master is silent
or unreachable. The master can change at runtime (:meth:`HAClient.set_master`).

Frames are parsed by an :class:`asyncio.Protocol` straight from the socket buffer: one copy into
the commitlog per byte and one offset report per socket read, whatever the frame size.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from rmqbroker.ha.epoch import EpochError, EpochStore, divergence_offset, parse_history
from rmqbroker.ha.master import EPOCH_QUERY, REPORT, TRANSFER_HEADER
from rmqbroker.remoting.client import split_addr
from rmqbroker.store.errors import StoreError
from rmqbroker.store.message_store import MessageStore

log = logging.getLogger(__name__)

MAX_EPOCH_ANSWER = 1 << 20


class StreamMismatchError(Exception):
    """The master's stream does not continue this slave's log, or is malformed."""


class _StreamProtocol(asyncio.Protocol):
    """Parses transfer frames; appends them once the epoch handshake is done."""

    def __init__(self, client: HAClient) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.streaming = False
        loop = asyncio.get_running_loop()
        self.epoch_answer: asyncio.Future[bytes] = loop.create_future()
        # Nobody awaits the answer once the handshake is over or abandoned: keep it quiet.
        self.epoch_answer.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.closed: asyncio.Future[BaseException | None] = loop.create_future()
        self.last_read = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc or ConnectionError("master closed the connection"))
        if not self.epoch_answer.done():
            self.epoch_answer.set_exception(ConnectionError("master closed the connection"))

    def fail(self, exc: BaseException) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
        if self.transport is not None:
            self.transport.close()

    def report(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(REPORT.pack(self.client.store.max_phy_offset()))

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        buf = self.buf
        buf += data
        pos = 0
        end = len(buf)
        appended = False
        hdr = TRANSFER_HEADER.size
        try:
            while end - pos >= hdr:
                offset, size = TRANSFER_HEADER.unpack_from(buf, pos)
                if size < 0 or (offset == EPOCH_QUERY and size > MAX_EPOCH_ANSWER):
                    raise StreamMismatchError(f"malformed frame header (offset {offset}, size {size})")
                if end - pos < hdr + size:
                    break
                if offset == EPOCH_QUERY:
                    if not self.epoch_answer.done():
                        self.epoch_answer.set_result(bytes(buf[pos + hdr:pos + hdr + size]))
                elif not self.streaming:
                    raise StreamMismatchError("master streamed data before the epoch handshake")
                elif size:
                    with memoryview(buf) as view:
                        self.client.append(offset, view[pos + hdr:pos + hdr + size])
                    appended = True
                else:
                    self.client.check_continuity(offset)
                pos += hdr + size
        except (StreamMismatchError, StoreError) as exc:
            self.fail(exc)
            return
        if pos:
            del buf[:pos]
        if appended:
            # One report per socket read: SYNC_MASTER sends wait for it.
            self.report()


class HAClient:
    """Slave-side replication task; one master at a time."""

    def __init__(self, store: MessageStore, master_addr: str | None, *, heartbeat_interval: float = 5.0,
                 housekeeping_interval: float = 20.0, epochs: EpochStore | None = None,
                 truncate: Callable[[int], None] | None = None) -> None:
        self.store = store
        self.master_addr = master_addr
        self.heartbeat_interval = heartbeat_interval
        self.housekeeping_interval = housekeeping_interval
        self.epochs = epochs
        self._truncate = truncate
        self.truncated_bytes = 0
        self.connected = False
        self.bytes_received = 0
        self.mismatches = 0
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    def set_master(self, addr: str | None) -> None:
        """Follow a different master (restarts the connection if it changed)."""
        if addr == self.master_addr:
            return
        log.info("HA master address %s -> %s", self.master_addr, addr)
        self.master_addr = addr
        self._changed.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ha-client")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        self.connected = False

    # -- called by the protocol --
    def check_continuity(self, offset: int) -> None:
        current = self.store.max_phy_offset()
        if current not in (0, offset):
            raise StreamMismatchError(f"master sent offset {offset}, this log ends at {current}")

    def append(self, offset: int, data: memoryview) -> None:
        self.check_continuity(offset)
        self.store.append_raw(offset, data)
        self.bytes_received += len(data)

    # -- connection loop --
    async def _run(self) -> None:
        backoff = 0.5
        while True:
            addr = self.master_addr
            self._changed.clear()
            if not addr:
                await self._wait_change(5.0)
                continue
            try:
                await self._follow(addr)
                backoff = 0.5
            except (OSError, ConnectionError, TimeoutError) as exc:
                log.warning("HA connection to %s failed: %s", addr, exc)
            except (StreamMismatchError, StoreError) as exc:
                self.mismatches += 1
                log.error("HA stream from %s refused: %s", addr, exc)
            finally:
                self.connected = False
            if self._changed.is_set():
                continue
            await self._wait_change(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _wait_change(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def _follow(self, addr: str) -> None:
        host, port = split_addr(addr)
        loop = asyncio.get_running_loop()
        transport, proto = await asyncio.wait_for(
            loop.create_connection(lambda: _StreamProtocol(self), host, port), 3.0)
        self.connected = True
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            if self.epochs is not None:
                transport.write(REPORT.pack(EPOCH_QUERY))
                handshake: set[asyncio.Future[Any]] = {proto.epoch_answer, changed, proto.closed}
                done, _ = await asyncio.wait(handshake,
                                             timeout=self.housekeeping_interval,
                                             return_when=asyncio.FIRST_COMPLETED)
                if changed in done:
                    return  # re-pointed while waiting: never take data from the old master
                if proto.epoch_answer not in done:
                    raise ConnectionError(f"master {addr} did not answer the epoch query")
                await self._reconcile(proto.epoch_answer.result(), addr)
            proto.streaming = True
            log.info("HA following master %s from offset %d", addr, self.store.max_phy_offset())
            proto.report()
            watched: set[asyncio.Future[Any]] = {proto.closed, changed}
            while True:
                done, _ = await asyncio.wait(watched, timeout=self.heartbeat_interval,
                                             return_when=asyncio.FIRST_COMPLETED)
                if changed in done:
                    return
                if proto.closed in done:
                    exc = proto.closed.result()
                    if isinstance(exc, StreamMismatchError | StoreError):
                        raise exc
                    raise ConnectionError(str(exc))
                if time.monotonic() - proto.last_read > self.housekeeping_interval:
                    raise ConnectionError(f"master silent for {self.housekeeping_interval:.0f}s")
                proto.report()
        finally:
            changed.cancel()
            transport.close()

    async def _reconcile(self, answer: bytes, addr: str) -> None:
        """Cut any tail of ours the master never had, then adopt the master's epoch history."""
        assert self.epochs is not None
        try:
            obj = json.loads(answer)
            master_epoch = int(obj["epoch"])
            master_history = parse_history(obj["history"])
            master_max = int(obj["maxOffset"])
        except (ValueError, KeyError, TypeError, EpochError) as exc:
            raise StreamMismatchError(f"bad epoch answer from {addr}: {exc}") from exc
        if master_epoch < self.epochs.epoch:
            raise StreamMismatchError(
                f"master {addr} is at epoch {master_epoch}, older than ours ({self.epochs.epoch})")
        point = divergence_offset(self.epochs.history, master_history, master_max)
        own_max = self.store.max_phy_offset()
        if own_max > point:
            if self._truncate is None:
                raise StreamMismatchError(f"log holds {own_max - point} bytes beyond the master's epoch end")
            log.warning("truncating %d divergent bytes [%d, %d) before following %s (epoch %d)",
                        own_max - point, point, own_max, addr, master_epoch)
            self._truncate(point)
            self.truncated_bytes += own_max - point
        await asyncio.to_thread(self.epochs.adopt, master_epoch, master_history)
