"""HA master side (reference §7.1-§7.5): streams commitlog bytes to slaves, tracks their acks.

Per slave connection a reader consumes 8-byte max-offset reports and a writer pushes
``[long offset][int size][bytes]`` frames from wherever the slave is. The writer is woken on
every append, so replication has no polling delay; frames are views of the mapped segment, so
the kernel copies straight from the page cache. SYNC_MASTER sends wait in
:class:`GroupTransferService` until a slave has acknowledged their end offset.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import socket
import struct
import time
from dataclasses import dataclass

from rmqbroker.ha.epoch import EpochStore
from rmqbroker.store.message_store import MessageStore, PutMessageStatus

log = logging.getLogger(__name__)

# Slave -> master report:
#   0  long  slave max commitlog offset
REPORT = struct.Struct(">q")
# Master -> slave transfer header:
#   0  long  master physical offset of the first byte of the body
#   8  int   body size (0 = heartbeat)
TRANSFER_HEADER = struct.Struct(">qi")

# Project extension: a slave that sends this instead of an offset asks for the master's epoch
# history, answered by one frame with this offset and a JSON body. Java slaves never send it.
EPOCH_QUERY = -2

# Replication lag tracking: appends awaiting a slave ack (bounded), and recent lag samples kept.
LAG_TRACK_MAX = 100_000
LAG_WINDOW = 20_000

# Upper bound of bytes handed to the socket per wake-up: large enough for throughput,
# small enough that a slow slave doesn't make us buffer much beyond the kernel's socket buffer.
WRITE_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class HAConfig:
    listen_host: str
    listen_port: int
    transfer_batch_size: int = 32768
    heartbeat_interval: float = 5.0
    housekeeping_interval: float = 20.0
    slave_fallbehind_max: int = 268435456
    sync_timeout: float = 5.0


class HAConnection:
    """One slave's connection on the master."""

    def __init__(self, service: HAService, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.service = service
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.request_offset = -1  # first report: where to start streaming
        self.acked_offset = 0
        self.last_ack_time = time.time()
        self.transfer_from = -1
        self._first_report = asyncio.Event()
        self.closed = False

    @property
    def last_ack_millis(self) -> int:
        return int(self.last_ack_time * 1000)

    async def run(self) -> None:
        reader_task = asyncio.create_task(self._read_reports())
        writer_task = asyncio.create_task(self._write_frames())
        try:
            done, _ = await asyncio.wait({reader_task, writer_task}, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    exc = t.exception()
                    log.warning("HA connection %s closed: %s", self.address, exc)
        finally:
            self.closed = True
            for t in (reader_task, writer_task):
                t.cancel()
            for t in (reader_task, writer_task):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    async def _read_reports(self) -> None:
        svc = self.service
        buf = b""
        while True:
            try:
                chunk = await asyncio.wait_for(self.reader.read(4096), svc.config.housekeeping_interval)
            except TimeoutError:
                log.warning("HA slave %s silent for %.0fs; closing", self.address, svc.config.housekeeping_interval)
                return
            if not chunk:
                log.info("HA slave %s disconnected", self.address)
                return
            buf += chunk
            whole = len(buf) - len(buf) % 8
            if whole == 0:
                continue
            # Only the newest complete report matters.
            (offset,) = REPORT.unpack_from(buf, whole - 8)
            buf = buf[whole:]
            if offset == EPOCH_QUERY and self.request_offset < 0:
                # Answered by the reader: the writer has not started streaming yet.
                body = json.dumps({**svc.epoch_history(), "maxOffset": svc.store.max_phy_offset()}).encode()
                self.writer.write(TRANSFER_HEADER.pack(EPOCH_QUERY, len(body)) + body)
                await self.writer.drain()
                continue
            max_offset = svc.store.max_phy_offset()
            if offset < 0 or offset > max_offset:
                svc.rejected_reports += 1
                log.warning("HA slave %s reported offset %d beyond this master's log end %d; dropping it",
                            self.address, offset, max_offset)
                return
            self.last_ack_time = time.time()
            if self.request_offset < 0:
                self.request_offset = offset
                self._first_report.set()
            self.acked_offset = offset
            svc.on_ack(offset)

    async def _write_frames(self) -> None:
        svc = self.service
        store = svc.store
        await self._first_report.wait()
        start = self.request_offset
        if start == 0:
            # A new slave catches up from the very beginning of what this master still has.
            start = store.min_phy_offset()
        self.transfer_from = start
        batch = svc.config.transfer_batch_size
        last_write = time.monotonic()
        while True:
            max_offset = store.max_phy_offset()
            if self.transfer_from < max_offset:
                parts: list[bytes | memoryview] = []
                total = 0
                while self.transfer_from < max_offset and total < WRITE_CHUNK:
                    view = store.read_commitlog(self.transfer_from, min(batch, max_offset - self.transfer_from))
                    if view is None:
                        raise ConnectionError(f"commitlog offset {self.transfer_from} is not readable")
                    parts.append(TRANSFER_HEADER.pack(self.transfer_from, len(view)))
                    parts.append(view)
                    self.transfer_from += len(view)
                    total += len(view)
                self.writer.writelines(parts)
                await self.writer.drain()
                last_write = time.monotonic()
                continue
            idle = time.monotonic() - last_write
            if idle >= svc.config.heartbeat_interval:
                self.writer.write(TRANSFER_HEADER.pack(self.transfer_from, 0))
                await self.writer.drain()
                last_write = time.monotonic()
                continue
            await svc.wait_for_data(svc.config.heartbeat_interval - idle)


class GroupTransferService:
    """SYNC_MASTER waits: one slave ack releases every send up to its offset.

    Waits are plain futures resolved by acks or by a timer handle, so a waiting send costs no
    task or coroutine.
    """

    def __init__(self, service: HAService) -> None:
        self.service = service
        self._waiters: collections.deque[
            tuple[int, asyncio.Future[PutMessageStatus], asyncio.TimerHandle]] = collections.deque()

    def release(self, acked: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= acked:
            _, fut, timer = waiters.popleft()
            timer.cancel()
            if not fut.done():
                fut.set_result(PutMessageStatus.PUT_OK)

    def wait(self, end_offset: int) -> asyncio.Future[PutMessageStatus]:
        """A future of the replication outcome of an append ending at ``end_offset`` (§7.5)."""
        svc = self.service
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[PutMessageStatus] = loop.create_future()
        if not svc.slave_ok(end_offset):
            fut.set_result(PutMessageStatus.SLAVE_NOT_AVAILABLE)
        elif svc.push_to_slave_max_offset >= end_offset:
            fut.set_result(PutMessageStatus.PUT_OK)
        else:
            timer = loop.call_later(svc.config.sync_timeout, _expire, fut)
            # Appends are ordered, so the deque stays sorted by end offset.
            self._waiters.append((end_offset, fut, timer))
        return fut


def _expire(fut: asyncio.Future[PutMessageStatus]) -> None:
    if not fut.done():
        fut.set_result(PutMessageStatus.FLUSH_SLAVE_TIMEOUT)


class HAService:
    """Master-side HA listener and per-slave connections."""

    def __init__(self, store: MessageStore, config: HAConfig, epochs: EpochStore | None = None) -> None:
        self.store = store
        self.config = config
        self.epochs = epochs
        self.connections: set[HAConnection] = set()
        self.push_to_slave_max_offset = 0
        self._pending_acks: collections.deque[tuple[int, float]] = collections.deque()
        self.lag_samples: collections.deque[float] = collections.deque(maxlen=LAG_WINDOW)
        self.rejected_reports = 0
        self.group_transfer = GroupTransferService(self)
        self._data = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = config.listen_port

    def epoch_history(self) -> dict[str, object]:
        return self.epochs.to_json_obj() if self.epochs is not None else {"epoch": 0, "history": []}

    # -- store hooks --
    def notify_data(self, *_: object) -> None:
        """Arrival listener: new bytes were appended."""
        self._data.set()
        if self.connections:
            # Remember when each append ended so the first slave ack covering it gives its lag.
            pending = self._pending_acks
            if len(pending) < LAG_TRACK_MAX:
                pending.append((self.store.max_phy_offset(), time.monotonic()))

    async def wait_for_data(self, timeout: float) -> None:
        self._data.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._data.wait(), max(timeout, 0.001))

    def on_ack(self, offset: int) -> None:
        if offset > self.push_to_slave_max_offset:
            self.push_to_slave_max_offset = offset
            self.group_transfer.release(offset)
            pending = self._pending_acks
            if pending and pending[0][0] <= offset:
                now = time.monotonic()
                lags = self.lag_samples
                while pending and pending[0][0] <= offset:
                    lags.append(now - pending.popleft()[1])

    def replication_lag_ms(self) -> dict[str, float | int | None]:
        """Append-to-first-slave-ack time over the recent window (p50/p99/max in ms)."""
        samples = sorted(self.lag_samples)
        if not samples:
            return {"samples": 0, "p50": None, "p99": None, "max": None}
        n = len(samples)
        return {"samples": n, "p50": round(samples[n // 2] * 1000, 3),
                "p99": round(samples[min(n - 1, (n * 99) // 100)] * 1000, 3),
                "max": round(samples[-1] * 1000, 3)}

    def slave_ok(self, master_put_where: int) -> bool:
        live = [c for c in self.connections if not c.closed and c.request_offset >= 0]
        return bool(live) and master_put_where - self.push_to_slave_max_offset < self.config.slave_fallbehind_max

    # -- lifecycle --
    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.config.listen_host, self.config.listen_port,
                                                  reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("HA master listening on %s:%d", self.config.listen_host, self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, WRITE_CHUNK)
        conn = HAConnection(self, reader, writer)
        log.info("HA slave connected from %s", conn.address)
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self.connections):
                conn.writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None
        self.group_transfer.release(1 << 62)

    def slaves_status(self) -> list[dict[str, object]]:
        max_offset = self.store.max_phy_offset()
        out = []
        for c in sorted(self.connections, key=lambda c: c.address):
            lag = max(0, max_offset - c.acked_offset)
            out.append({
                "address": c.address,
                "ackedOffset": c.acked_offset,
                "lagBytes": lag,
                "lastAckMillis": c.last_ack_millis,
                "inSync": c.request_offset >= 0 and lag < self.config.slave_fallbehind_max
                          and time.time() - c.last_ack_time < self.config.housekeeping_interval,
            })
        return out
