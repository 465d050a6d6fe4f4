"""HA master side (reference §7.1-§7.5): streams commitlog bytes to slaves, tracks their acks.

Each slave connection is a callback :class:`asyncio.Protocol`: 8-byte max-offset reports are
handled in ``data_received`` (an ack releases waiting SYNC_MASTER sends in the same loop pass), and
``[long offset][int size][bytes]`` frames are pushed from the append notification itself, once per
loop pass, as views of the mapped segment; while no SYNC_MASTER send waits, a push waits for the
ack of the one before it (``haPushAfterAck``). A slave far behind (a catch-up) is served by a worker
thread that ``sendfile``\\ s whole frames from the segment files: no GIL, no page faults on the
mapping, no copy in user space. SYNC_MASTER sends wait in :class:`GroupTransferService` until a
slave has acknowledged their end offset.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from rmqbroker.ha.epoch import EpochStore
from rmqbroker.ha.transfer import GroupTransferService
from rmqbroker.store.message_store import MessageStore

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

# Bytes handed to the transport per push, and its high-water mark: large enough for throughput,
# small enough that a slow slave doesn't make us buffer much beyond the kernel's socket buffer.
WRITE_CHUNK = 4 * 1024 * 1024
# A slave at least this far behind is served by the sendfile thread, in plans of at most
# BULK_PLAN bytes (one loop round trip per plan keeps the frame list current).
BULK_MIN = 4 * 1024 * 1024
BULK_PLAN = 64 * 1024 * 1024
# How often the sendfile thread looks at the stop flag while the socket is full (ms).
BULK_POLL_MS = 100
# Housekeeping / heartbeat timer period per connection.
TICK_SECONDS = 0.5
# How often a demotion's drain looks at the slaves' acks (a rare, operator-driven wait).
DRAIN_POLL_SECONDS = 0.005

# (commitlog offset, segment fd, position in the segment, length): one frame for the sendfile thread.
Frame = tuple[int, int, int, int]


@dataclass(frozen=True)
class HAConfig:
    listen_host: str
    listen_port: int
    transfer_batch_size: int = 32768
    heartbeat_interval: float = 5.0
    housekeeping_interval: float = 20.0
    slave_fallbehind_max: int = 268435456
    sync_timeout: float = 5.0
    # Without SYNC_MASTER sends waiting, at most one loop push unacknowledged per slave.
    push_after_ack: bool = True


@dataclass(frozen=True)
class SlaveState:
    """A slave connection as /status and /metrics show it."""

    address: str
    acked_offset: int
    lag_bytes: int
    last_ack_millis: int
    in_sync: bool


class _Stopped(Exception):
    """The connection closed while the sendfile thread was waiting for socket space."""


def _wait_writable(poller: select.poll, stop: threading.Event) -> None:
    while not poller.poll(BULK_POLL_MS):
        if stop.is_set():
            raise _Stopped


def _send_frames(sock_fd: int, frames: list[Frame], stop: threading.Event) -> None:
    """Worker thread: header + ``sendfile`` body per frame, on a non-blocking socket.

    ``sock_fd`` and the segment descriptors in ``frames`` are duplicates owned (and closed) here,
    so closing the transport or a segment on the loop can never make this thread use a reused
    descriptor number.
    """
    poller = select.poll()
    poller.register(sock_fd, select.POLLOUT)
    try:
        for offset, file_fd, pos, n in frames:
            head = TRANSFER_HEADER.pack(offset, n)
            done = 0
            while done < len(head):
                try:
                    done += os.write(sock_fd, head[done:])
                except BlockingIOError:
                    _wait_writable(poller, stop)
            sent = 0
            while sent < n:
                try:
                    k = os.sendfile(sock_fd, file_fd, pos + sent, n - sent)
                except BlockingIOError:
                    _wait_writable(poller, stop)
                    continue
                if k == 0:
                    raise ConnectionError(f"sendfile made no progress at commitlog offset {offset + sent}")
                sent += k
            if stop.is_set():
                raise _Stopped
    finally:
        os.close(sock_fd)
        for fd in {frame[1] for frame in frames}:
            os.close(fd)


class HAConnection(asyncio.Protocol):
    """One slave's connection on the master."""

    def __init__(self, service: HAService) -> None:
        self.service = service
        self.transport: asyncio.Transport | None = None
        self.address = "?"
        self.host = "?"
        self.request_offset = -1  # first report: where to start streaming
        self.acked_offset = 0
        self.last_ack_time = time.time()
        self.transfer_from = -1
        self.closed = False
        self._buf = b""
        self._paused = False
        self._bulk: asyncio.Future[None] | None = None
        self._bulk_stop = threading.Event()
        self._last_write = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        # A push from the loop that the slave has not acknowledged in full yet.
        self._unacked = False

    @property
    def last_ack_millis(self) -> int:
        return int(self.last_ack_time * 1000)

    # -- asyncio.Protocol --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = tr = cast(asyncio.Transport, transport)
        peer = tr.get_extra_info("peername")
        self.address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.host = str(peer[0]) if isinstance(peer, tuple) else self.address
        tr.set_write_buffer_limits(high=WRITE_CHUNK)
        sock = tr.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        log.info("HA slave connected from %s", self.address)
        self.service.connections.add(self)
        self._timer = asyncio.get_running_loop().call_later(TICK_SECONDS, self._tick)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._buf and not self.closed:
            # A report cut short is malformed input, not a clean disconnect.
            self.service.rejected_reports += 1
            log.warning("HA slave %s closed mid-report (%d stray bytes %r)", self.address, len(self._buf),
                        self._buf[:8])
        if exc is not None:
            log.warning("HA connection %s closed: %s", self.address, exc)
        else:
            log.info("HA slave %s disconnected", self.address)
        self._closed()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self.push()

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        whole = len(buf) - len(buf) % 8
        self._buf = buf[whole:]
        if whole == 0:
            return
        # Only the newest complete report matters.
        (offset,) = REPORT.unpack_from(buf, whole - 8)
        self.service.reports += whole >> 3
        self._on_report(offset)

    # -- reports --
    def _on_report(self, offset: int) -> None:
        svc = self.service
        store = svc.store
        tr = self.transport
        if tr is None or self.closed:
            return
        if offset == EPOCH_QUERY and self.request_offset < 0:
            # Streaming has not started, so the answer cannot interleave with a frame. The role
            # tells this project's slaves not to follow a slave (they would ack bytes no master
            # counts); Java slaves never ask.
            answer: dict[str, Any] = {**svc.epoch_history(), "maxOffset": store.max_phy_offset(),
                                      "role": svc.role()}
            if svc.broker_addr:
                answer["brokerAddr"] = svc.broker_addr
            if svc.group is not None:
                answer["brokerName"], answer["brokerClusterName"] = svc.group
            body = json.dumps(answer).encode()
            tr.write(TRANSFER_HEADER.pack(EPOCH_QUERY, len(body)) + body)
            return
        max_offset = store.max_phy_offset()
        if offset < 0:
            svc.rejected_reports += 1
            log.warning("HA slave %s sent a malformed report (offset %d); dropping it", self.address, offset)
            self.close()
            return
        if offset > max_offset:
            svc.rejected_reports += 1
            log.warning("HA slave %s reported offset %d beyond this master's log end %d; dropping it",
                        self.address, offset, max_offset)
            self.close()
            return
        if self.request_offset < 0 and 0 < offset < store.min_phy_offset():
            # Retention deleted what this slave needs next: no stream can continue its log.
            svc.rejected_reports += 1
            svc.behind_retention += 1
            log.error("HA slave %s needs commitlog offset %d but this master's log starts at %d (older "
                      "segments were deleted by retention); it cannot catch up: empty its store to "
                      "replicate from %d", self.address, offset, store.min_phy_offset(), store.min_phy_offset())
            self.close()
            return
        if self.request_offset < 0 and not svc.serving():
            # Only a master streams: a slave's log is its master's to extend and cut, and a
            # follower's acks here would count for no master's SYNC sends.
            svc.refused_followers += 1
            log.warning("HA peer %s asked to follow this broker, which is %s; refusing it", self.address,
                        svc.role())
            self.close()
            return
        self.last_ack_time = time.time()
        self.acked_offset = offset
        if self.request_offset < 0:
            self.request_offset = offset
            svc.group_transfer.live_slaves += 1
            # A new slave catches up from the very beginning of what this master still has.
            self.transfer_from = offset if offset else store.min_phy_offset()
            self._last_write = time.monotonic()
            self.push()
        svc.on_ack(offset)
        if self._unacked and offset >= self.transfer_from:
            self._unacked = False
            if max_offset > offset:
                svc.schedule_push()

    # -- pushing --
    def push(self) -> None:
        """Send what the slave doesn't have yet: from the loop when close behind, else by thread."""
        tr = self.transport
        if tr is None or self.closed or self._paused or self._bulk is not None or self.request_offset < 0:
            return
        store = self.service.store
        max_offset = store.max_phy_offset()
        pos = self.transfer_from
        if pos >= max_offset:
            return
        if max_offset - pos >= BULK_MIN and not tr.get_write_buffer_size() and self._start_bulk(max_offset):
            return
        if self._unacked and self.service.config.push_after_ack and not len(self.service.group_transfer):
            # No send waits for this slave (none is queued on a SYNC_MASTER): the bytes go out
            # when the push in flight is acknowledged, so a stream of sends costs master and slave
            # one push, wake-up and ack per round trip instead of one per loop pass.
            return
        batch = self.service.config.transfer_batch_size
        parts: list[bytes | memoryview] = []
        total = 0
        while pos < max_offset and total < WRITE_CHUNK:
            view = store.read_commitlog(pos, min(batch, max_offset - pos))
            if view is None:
                log.error("HA slave %s: commitlog offset %d is not readable; closing", self.address, pos)
                self.close()
                return
            parts.append(TRANSFER_HEADER.pack(pos, len(view)))
            parts.append(view)
            pos += len(view)
            total += len(view)
        self.transfer_from = pos
        self._unacked = True
        svc = self.service
        svc.pushes += 1
        svc.bytes_pushed += total
        tr.writelines(parts)
        self._last_write = time.monotonic()
        if pos < max_offset and not self._paused:
            asyncio.get_running_loop().call_soon(self.push)

    def _start_bulk(self, max_offset: int) -> bool:
        """Hand the next frames to the sendfile thread; False when that is not possible."""
        tr = self.transport
        assert tr is not None
        sock = tr.get_extra_info("socket")
        if sock is None:
            return False
        frames = self._plan(max_offset)
        if not frames:
            return False
        sock_fd = os.dup(sock.fileno())
        self.transfer_from = frames[-1][0] + frames[-1][3]
        svc = self.service
        svc.bulk_transfers += 1
        svc.bytes_pushed += self.transfer_from - frames[0][0]
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self.service.executor, _send_frames, sock_fd, frames, self._bulk_stop)
        self._bulk = fut
        fut.add_done_callback(self._bulk_done)
        return True

    def _plan(self, max_offset: int) -> list[Frame]:
        """Frames from ``transfer_from`` within written bytes, never crossing a segment (§7.3), on
        duplicated segment descriptors (closed by :func:`_send_frames`)."""
        mfq = self.service.store.commitlog.mfq
        batch = self.service.config.transfer_batch_size
        pos = self.transfer_from
        limit = min(max_offset, pos + BULK_PLAN)
        frames: list[Frame] = []
        dups: dict[int, int] = {}
        while pos < limit:
            mf = mfq.find_file(pos)
            if mf is None:
                break
            rel = pos - mf.file_from_offset
            n = min(batch, limit - pos, mf.wrote_position - rel)
            if n <= 0:
                break
            fd = dups.get(mf.fd)
            if fd is None:
                fd = dups[mf.fd] = os.dup(mf.fd)
            frames.append((pos, fd, rel, n))
            pos += n
        return frames

    def _bulk_done(self, fut: asyncio.Future[None]) -> None:
        self._bulk = None
        exc = fut.exception() if not fut.cancelled() else None
        if self.closed:
            return
        if exc is not None:
            log.warning("HA slave %s: transfer failed: %s", self.address, exc)
            self.close()
            return
        self._last_write = time.monotonic()
        self.push()

    # -- housekeeping --
    def _tick(self) -> None:
        tr = self.transport
        if self.closed or tr is None:
            return
        cfg = self.service.config
        if time.time() - self.last_ack_time > cfg.housekeeping_interval:
            log.warning("HA slave %s silent for %.0fs; closing", self.address, cfg.housekeeping_interval)
            self.close()
            return
        if self.request_offset >= 0 and self._bulk is None:
            # Appends that notify no arrival listener (transaction half and rollback messages
            # get no consume-queue unit) are pushed from here, as Java's writer polls.
            self.push()
        now = time.monotonic()
        if (self.request_offset >= 0 and self._bulk is None and now - self._last_write >= cfg.heartbeat_interval
                and not tr.get_write_buffer_size()):
            tr.write(TRANSFER_HEADER.pack(self.transfer_from, 0))
            self._last_write = now
        self._timer = asyncio.get_running_loop().call_later(TICK_SECONDS, self._tick)

    def close(self, *, drop_pending: bool = False) -> None:
        """Close the connection; with ``drop_pending`` bytes not yet written are discarded too
        (they may be views of a range that is about to be truncated)."""
        if self.transport is not None:
            if drop_pending:
                self.transport.abort()
            else:
                self.transport.close()
        self._closed()

    def _closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.request_offset >= 0:
            self.service.group_transfer.live_slaves -= 1
        self._bulk_stop.set()
        if self._timer is not None:
            self._timer.cancel()
        self.service.connections.discard(self)

    async def wait_idle(self) -> None:
        """Until the sendfile thread (if any) has let go of the socket."""
        fut = self._bulk
        if fut is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await asyncio.shield(fut)


class HAService:
    """Master-side HA listener and per-slave connections."""

    def __init__(self, store: MessageStore, config: HAConfig, epochs: EpochStore | None = None,
                 role: Callable[[], str] | None = None) -> None:
        self.store = store
        self.config = config
        self.epochs = epochs
        # The broker's current role (it changes at runtime); without one this listener is a master's.
        self.role: Callable[[], str] = role or (lambda: "ASYNC_MASTER")
        # This broker's client address (host:port), told to slaves in the epoch answer: the address
        # a slave relays clients' writes to (processors/relay.py). None: not told.
        self.broker_addr: str | None = None
        # The broker group this listener's broker belongs to, told in the epoch answer so that a
        # slave of another group (a wrong haMasterAddress, a port reused by another group's master)
        # refuses to follow: it would take a foreign log and its acks would release SYNC sends
        # this group never replicated. None: not told (older masters did not).
        self.group: tuple[str, str] | None = None
        # Peers that asked to follow while this broker was a slave (each connection closed).
        self.refused_followers = 0
        self.connections: set[HAConnection] = set()
        self._pending_acks: collections.deque[tuple[int, float]] = collections.deque()
        self.lag_samples: collections.deque[float] = collections.deque(maxlen=LAG_WINDOW)
        self.rejected_reports = 0
        # Counters for /metrics: frames pushed from the loop, sendfile transfers handed to a thread,
        # commitlog bytes handed to slaves by either, and report frames read (every batch of them).
        self.pushes = 0
        self.bulk_transfers = 0
        self.bytes_pushed = 0
        self.reports = 0
        # Slaves refused because their log ends before this master's oldest retained byte.
        self.behind_retention = 0
        self.group_transfer = GroupTransferService(config.sync_timeout, config.slave_fallbehind_max)
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._push_scheduled = False
        # sendfile threads for catching-up slaves (one busy thread per such slave).
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="ha-send")
        self.port = config.listen_port

    def epoch_history(self) -> dict[str, object]:
        return self.epochs.to_json_obj() if self.epochs is not None else {"epoch": 0, "history": []}

    # -- store hooks --
    def notify_data(self, *_: object) -> None:
        """Arrival listener: new bytes were appended; they go out once per loop pass."""
        if self.connections:
            self.schedule_push()
            # Remember when each append ended so the first slave ack covering it gives its lag.
            pending = self._pending_acks
            if len(pending) < LAG_TRACK_MAX:
                pending.append((self.store.max_phy_offset(), time.monotonic()))

    def schedule_push(self) -> None:
        """Push to every slave at the end of this loop pass (once, however many ask)."""
        if not self._push_scheduled and self._loop is not None:
            self._push_scheduled = True
            self._loop.call_soon(self._push_all)

    def _push_all(self) -> None:
        self._push_scheduled = False
        for conn in list(self.connections):
            conn.push()

    def drop_slaves(self, reason: str) -> None:
        """Close every slave connection at once, discarding queued bytes: this log is about to
        change under them (truncation, demotion); they reconnect and re-handshake (epochs)."""
        conns = list(self.connections)
        if conns:
            log.warning("closing %d HA slave connection(s): %s", len(conns), reason)
        for conn in conns:
            conn.close(drop_pending=True)

    async def drain(self, timeout: float, only: frozenset[str] = frozenset()) -> bool:
        """Until every streaming slave has acknowledged this log's end, or ``timeout`` seconds
        pass; whether they all did. The caller stopped the appends (a demotion hands over).

        ``only``: the connections (slave addresses as ``ha.slaves[].address`` shows them) that
        must acknowledge; the others may lag, and the drain waits until one of these streams.
        """
        end = self.store.max_phy_offset()
        try:
            async with asyncio.timeout(timeout):
                while True:
                    streaming = [c for c in self.connections if c.request_offset >= 0 and not c.closed]
                    if only:
                        streaming = [c for c in streaming if c.address in only]
                    if (streaming or not only) and all(c.acked_offset >= end for c in streaming):
                        return True
                    self.schedule_push()
                    await asyncio.sleep(DRAIN_POLL_SECONDS)
        except TimeoutError:
            return False

    def on_ack(self, offset: int) -> None:
        if offset > self.group_transfer.acked:
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

    def streams_to(self, host: str) -> bool:
        """Whether a slave on ``host`` follows this master now (it reported where it is)."""
        return any(c.host == host and c.request_offset >= 0 and not c.closed for c in self.connections)

    def serving(self) -> bool:
        """Whether slaves may follow this broker now (it is a master)."""
        return self.role() != "SLAVE"

    def slave_ok(self, master_put_where: int) -> bool:
        return self.group_transfer.slave_ok(master_put_where)

    # -- lifecycle --
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._server = await loop.create_server(lambda: HAConnection(self), self.config.listen_host,
                                                self.config.listen_port, reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("HA master listening on %s:%d", self.config.listen_host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            conns = list(self.connections)
            for conn in conns:
                conn.close()
            for conn in conns:
                await conn.wait_idle()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._server.wait_closed()
            self._server = None
        self.executor.shutdown(wait=False)
        self.group_transfer.fail_all()

    def slave_states(self) -> list[SlaveState]:
        """Every slave connection that reported where it is, by address."""
        max_offset = self.store.max_phy_offset()
        cfg = self.config
        now = time.time()
        out = []
        for c in sorted(self.connections, key=lambda c: c.address):
            lag = max(0, max_offset - c.acked_offset)
            out.append(SlaveState(c.address, c.acked_offset, lag, c.last_ack_millis,
                                  c.request_offset >= 0 and lag < cfg.slave_fallbehind_max
                                  and now - c.last_ack_time < cfg.housekeeping_interval))
        return out

    def slaves_status(self) -> list[dict[str, object]]:
        return [{"address": s.address, "ackedOffset": s.acked_offset, "lagBytes": s.lag_bytes,
                 "lastAckMillis": s.last_ack_millis, "inSync": s.in_sync} for s in self.slave_states()]
