"""HA slave side (reference §7.2-§7.4): follows a master's commitlog stream.

Reports its max offset on connect, after every burst of appended data and every heartbeat
interval; appends through the store (consume queues are built from the appended records); refuses
a stream that does not continue its own log; reconnects with back-off when the master is silent
or unreachable. The master can change at runtime (:meth:`HAClient.set_master`).

Frames are parsed by an :class:`asyncio.BufferedProtocol` from a reused receive buffer: one copy
into the commitlog per byte and one offset report per socket read, whatever the frame size.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import socket
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
RECV_BUFFER = 2 * 1024 * 1024
RING_BUFFERS = 4
WRITE_BATCH = 1024 * 1024
INLINE_WRITE_MAX = 64 * 1024
_IOV_MAX = 512
REPORT_EVERY = 0.001
# Consume-queue dispatch pacing: while the stream flows, BUSY_DISPATCH_SLICE every
# BUSY_DISPATCH_PERIOD (ample for steady traffic); all of it once the stream pauses or the
# backlog passes MAX_DISPATCH_LAG.
STREAM_BUSY_SECONDS = 0.002
BUSY_DISPATCH_PERIOD = 0.005
BUSY_DISPATCH_SLICE = 64 * 1024
IDLE_DISPATCH_SLICE = 1024 * 1024
MAX_DISPATCH_LAG = 512 * 1024 * 1024


class StreamMismatchError(Exception):
    """The master's stream does not continue this slave's log, or is malformed."""


def _pwrite_all(pieces: list[tuple[int, memoryview, int]]) -> None:
    """Worker thread: write (fd, data, position) pieces in order.

    Contiguous pieces of one segment go out in a single ``pwritev``: each syscall releases the
    GIL, and every reacquisition can wait behind the event loop thread, so fewer is faster.
    """
    i = 0
    while i < len(pieces):
        fd, first, pos = pieces[i]
        group = [first]
        end = pos + len(first)
        j = i + 1
        while j < len(pieces) and pieces[j][0] == fd and pieces[j][2] == end and len(group) < _IOV_MAX:
            group.append(pieces[j][1])
            end += len(pieces[j][1])
            j += 1
        total = end - pos
        done = os.pwritev(fd, group, pos)
        while done < total:  # short write: finish the rest piece by piece
            rest = b"".join(bytes(g) for g in group)[done:]
            done += os.pwrite(fd, rest, pos + done)
        i = j


class _RecvBuffer:
    """One receive buffer of the ring; reusable once every write from it has completed."""

    __slots__ = ("data", "end", "pending", "start", "view")

    def __init__(self, size: int) -> None:
        self.data = bytearray(size)
        self.view = memoryview(self.data)
        self.start = 0  # first unparsed byte
        self.end = 0  # end of received bytes
        self.pending = 0  # writes still reading from this buffer


class _StreamProtocol(asyncio.BufferedProtocol):
    """Parses transfer frames from a ring of receive buffers; bodies are written by a worker thread.

    The socket reads straight into a buffer of the ring; body bytes are handed to a single writer
    thread as they arrive (``os.pwrite`` into the commitlog segment, in order) and committed to
    the store on completion, so receiving and the page-cache copy run on two cores. Reading
    pauses when every buffer still has writes outstanding.
    """

    def __init__(self, client: HAClient) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.ring = [_RecvBuffer(RECV_BUFFER) for _ in range(RING_BUFFERS)]
        self.cur = 0
        self.body_left = 0  # bytes of the current frame's body still to come
        self.body_offset = 0  # commitlog offset of the next body byte
        self.epoch_body: bytearray | None = None  # collecting the epoch answer
        self.streaming = False
        self.paused = False
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.epoch_answer: asyncio.Future[bytes] = loop.create_future()
        # Nobody awaits the answer once the handshake is over or abandoned: keep it quiet.
        self.epoch_answer.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.closed: asyncio.Future[BaseException | None] = loop.create_future()
        self.last_read = time.monotonic()
        self.last_report = 0.0
        # Writes collected for the writer thread, and how many hand-offs are in flight.
        self.batch: list[tuple[int, memoryview, int]] = []
        self.batch_buffers: list[_RecvBuffer] = []
        self.batch_bytes = 0
        self.batch_end = 0
        self.inflight = 0
        self.inline_appended = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER)

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

    def get_buffer(self, sizehint: int) -> memoryview:
        b = self.ring[self.cur]
        if b.start == b.end and not b.pending:
            b.start = b.end = 0
        if b.end == len(b.data):
            # Move on to the next buffer, carrying a partial header (< 12 bytes) over.
            nxt = self.ring[(self.cur + 1) % len(self.ring)]
            if nxt.pending or nxt.start != nxt.end:
                # The transport read once more before the pause took effect: grow the ring.
                nxt = _RecvBuffer(RECV_BUFFER)
                self.ring.insert(self.cur + 1, nxt)
            left = b.end - b.start
            nxt.data[:left] = b.data[b.start:b.end]
            nxt.start, nxt.end = 0, left
            b.start = b.end
            self.cur = (self.cur + 1) % len(self.ring)
            b = nxt
        return b.view[b.end:]

    def buffer_updated(self, nbytes: int) -> None:
        self.last_read = time.monotonic()
        b = self.ring[self.cur]
        b.end += nbytes
        self.inline_appended = False
        try:
            self._consume(b)
        except (StreamMismatchError, StoreError) as exc:
            self.fail(exc)
            return
        self._submit()
        if self.inline_appended and not self.inflight:
            self.last_report = self.last_read
            self.report()
        if b.end == len(b.data) and self.ring[(self.cur + 1) % len(self.ring)].pending and not self.paused:
            # Every buffer is in flight: let the writer catch up before reading more.
            self.paused = True
            if self.transport is not None:
                self.transport.pause_reading()

    def _consume(self, b: _RecvBuffer) -> None:
        hdr = TRANSFER_HEADER.size
        while True:
            avail = b.end - b.start
            if self.body_left:
                if not avail:
                    return
                n = min(avail, self.body_left)
                chunk = b.view[b.start:b.start + n]
                if self.epoch_body is not None:
                    self.epoch_body += chunk
                else:
                    self._write(b, self.body_offset, chunk)
                    self.body_offset += n
                b.start += n
                self.body_left -= n
                if not self.body_left and self.epoch_body is not None:
                    if not self.epoch_answer.done():
                        self.epoch_answer.set_result(bytes(self.epoch_body))
                    self.epoch_body = None
                continue
            if avail < hdr:
                return
            offset, size = TRANSFER_HEADER.unpack_from(b.data, b.start)
            b.start += hdr
            if size < 0 or (offset == EPOCH_QUERY and size > MAX_EPOCH_ANSWER):
                raise StreamMismatchError(f"malformed frame header (offset {offset}, size {size})")
            if offset == EPOCH_QUERY:
                self.epoch_body = bytearray()
                self.body_left = size
                if not size and not self.epoch_answer.done():
                    self.epoch_answer.set_result(b"")
                continue
            if not self.streaming:
                raise StreamMismatchError("master streamed data before the epoch handshake")
            self.client.check_continuity(offset)
            self.body_offset = offset
            self.body_left = size

    def _write(self, b: _RecvBuffer, offset: int, chunk: memoryview) -> None:
        if not self.inflight and not self.batch and len(chunk) <= INLINE_WRITE_MAX:
            # Tailing a live master: small pieces are copied in place at once; a thread hand-off
            # would only add latency to the ack that SYNC_MASTER sends wait for.
            self.client.store.append_raw(offset, chunk, dispatch=False)
            self.client.reserved_end = offset + len(chunk)
            self.client.appended_inline(len(chunk))
            self.inline_appended = True
            return
        pos = 0
        for mf, rel, k in self.client.store.reserve_raw(offset, len(chunk)):
            self.batch.append((mf.fd, chunk[pos:pos + k], rel))
            pos += k
        self.batch_bytes += len(chunk)
        self.batch_end = offset + len(chunk)
        self.client.reserved_end = self.batch_end
        b.pending += 1
        self.batch_buffers.append(b)

    def _submit(self) -> None:
        """Hand the collected writes to the writer thread: at once when it is idle (low latency when
        tailing), otherwise once a batch is big enough (fewer thread hand-offs when catching up)."""
        if not self.batch or (self.inflight and self.batch_bytes < WRITE_BATCH):
            return
        jobs, buffers, end = self.batch, self.batch_buffers, self.batch_end
        self.batch, self.batch_buffers, self.batch_bytes = [], [], 0
        self.inflight += 1
        fut = self.loop.run_in_executor(self.client.writer, _pwrite_all, jobs)
        fut.add_done_callback(lambda f: self._written(f, buffers, end))

    def _written(self, fut: asyncio.Future[None], buffers: list[_RecvBuffer], end: int) -> None:
        self.inflight -= 1
        for b in buffers:
            b.pending -= 1
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is not None:
            self.fail(StoreError(f"commitlog write failed: {exc}"))
            return
        self.client.committed(end)
        if self.paused and not self.closed.done():
            self.paused = False
            if self.transport is not None:
                self.transport.resume_reading()
        self._submit()
        # SYNC_MASTER sends wait for reports: report at once when the stream is tailing (nothing
        # else in flight); during a bulk catch-up at most every REPORT_EVERY.
        now = time.monotonic()
        if not self.inflight or now - self.last_report >= REPORT_EVERY:
            self.last_report = now
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
        self._reput_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._appended = asyncio.Event()
        self.last_append = 0.0
        # One writer thread keeps replicated writes in order.
        self.writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ha-write")
        self.reserved_end = -1  # end of bytes handed to the writer on the current connection

    def set_master(self, addr: str | None) -> None:
        """Follow a different master (restarts the connection if it changed)."""
        if addr == self.master_addr:
            return
        log.info("HA master address %s -> %s", self.master_addr, addr)
        self.master_addr = addr
        self._changed.set()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._task = loop.create_task(self._run(), name="ha-client")
        if self._reput_task is None:
            self._reput_task = loop.create_task(self._reput(), name="ha-reput")

    async def stop(self) -> None:
        for task in (self._task, self._reput_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._task = self._reput_task = None
        self.connected = False

    # -- called by the protocol --
    def check_continuity(self, offset: int) -> None:
        current = self.reserved_end if self.reserved_end >= 0 else self.store.max_phy_offset()
        if current not in (0, offset):
            raise StreamMismatchError(f"master sent offset {offset}, this log ends at {current}")

    def appended_inline(self, n: int) -> None:
        self.bytes_received += n
        self.last_append = time.monotonic()
        self._appended.set()

    def committed(self, end: int) -> None:
        """Writer thread finished bytes up to ``end``: visible in the store from now on."""
        self.bytes_received += end - self.store.max_phy_offset()
        self.store.commit_raw(end)
        self.last_append = time.monotonic()
        self._appended.set()

    async def _reput(self) -> None:
        """Build consume queues behind the stream (RocketMQ's reput service also trails the log).

        Dispatch costs several microseconds per record in Python, so while bytes keep arriving
        it runs only in small periodic slices (or when it falls too far behind) and the commitlog
        keeps up with the master; once the stream pauses it catches up in large slices.
        """
        store = self.store
        last_slice = 0.0
        while True:
            behind = store.dispatch_behind()
            if behind <= 0:
                self._appended.clear()
                await self._appended.wait()
                continue
            now = time.monotonic()
            streaming = now - self.last_append < STREAM_BUSY_SECONDS
            if not streaming or behind > MAX_DISPATCH_LAG:
                store.dispatch_some(IDLE_DISPATCH_SLICE)
                await asyncio.sleep(0)
            elif now - last_slice >= BUSY_DISPATCH_PERIOD:
                store.dispatch_some(BUSY_DISPATCH_SLICE)
                last_slice = now
                await asyncio.sleep(0)
            else:
                await asyncio.sleep(STREAM_BUSY_SECONDS)

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
            # Writes still in flight complete before anyone (truncation, promotion) looks at the log.
            await self.loop_drain_writer()
            self.reserved_end = -1

    async def loop_drain_writer(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self.writer, lambda: None)
        await asyncio.sleep(0)  # let the completion callbacks commit

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
