"""HA slave side (reference §7.2-§7.4): follows a master's commitlog stream.

Reports its max offset on connect, whenever it has written everything received so far (and at
least every millisecond while a catch-up streams) and every heartbeat interval; refuses a stream
that does not continue its own log; reconnects with back-off when the master is silent or
unreachable. The master can change at runtime (:meth:`HAClient.set_master`).

Before streaming, the slave asks for the master's epoch history (an extension; see
:mod:`rmqbroker.ha.epoch`). An Apache RocketMQ 4.x master takes that query for the slave's offset
and answers, a heartbeat interval later, with a heartbeat at it: the slave then reconnects once
without the query and follows that master as a Java slave would (no divergence checks).

The connection is served by one receiver thread with a blocking socket (:class:`_Receiver`): frame
headers and small bodies are read into a buffer and ``pwrite``\\ n into the commitlog segment;
large bodies are ``splice``\\ d from the socket into the segment file, so a catch-up costs one
kernel copy per byte and a few system calls per MiB, none of which need the GIL or the event
loop. The thread reports to the master itself (an ack never waits for the loop); the loop only
makes written bytes visible (:meth:`MessageStore.commit_raw`) and builds consume queues behind
the stream (:meth:`HAClient._reput`), as RocketMQ's reput service does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import functools
import io
import json
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from rmqbroker.ha.epoch import (
    EpochChangedError,
    EpochEntry,
    EpochError,
    EpochStore,
    divergence_offset,
    last_epoch,
    log_id_of,
    other_logs,
    parse_history,
    same_term,
)
from rmqbroker.ha.master import EPOCH_QUERY, REPORT, TRANSFER_HEADER
from rmqbroker.remoting.client import split_addr
from rmqbroker.store.errors import StoreError, StoreFullError
from rmqbroker.store.mapped_file import MappedFile, io_error
from rmqbroker.store.message_store import MessageStore

log = logging.getLogger(__name__)

MAX_EPOCH_ANSWER = 1 << 20
CONNECT_TIMEOUT = 3.0
# Receive buffer for headers and small bodies; bodies longer than SPLICE_MIN go through a pipe.
RECV_BUFFER = 256 * 1024
SPLICE_MIN = 64 * 1024
# Pieces up to this size are copied through the segment's mapping instead of pwrite().
INLINE_COPY_MAX = 16 * 1024
# Segment blocks are allocated this far ahead of the copy.
ALLOCATE_AHEAD = 64 * 1024 * 1024
PIPE_SIZE = 1024 * 1024
# Dispatch stopped by a full disk is tried again this often (s).
DISPATCH_FULL_RETRY = 1.0
# Linux fcntl command to size a pipe (not in Python's fcntl module before 3.10 on every build).
F_SETPIPE_SZ = 1031
# While bytes keep arriving, a report at most this often (s); always one before waiting for more.
REPORT_EVERY = 0.001
# How long a blocking receive waits before the thread looks at stop, heartbeat and silence (s).
RECV_POLL = 0.25
# Retry back-off after a failed attempt to follow a master: doubled from the first to the last (s).
# A master that cannot be reached is tried every second (Java waits 5 s): a master restarted in
# place (a crash, the kubelet) takes sends at once, and under ASYNC replication each one no slave
# has yet is lost if it fails again; a connection refused costs next to nothing. A master that
# answered but whose stream was refused (another log, an older epoch) is tried less often, since
# each refusal is logged as an error and only a re-point or a change on its side ends them.
RETRY_FIRST = 0.5
RETRY_MAX_UNREACHABLE = 1.0
RETRY_MAX = 5.0
# The retry interval while `retry_soon` says something waits for the master's return (s).
RETRY_SOON = 0.2
# A failed attempt is logged as a warning at most this often; the ones between at debug.
FAILURE_LOG_EVERY = 5.0
# A stopping HA task that takes longer than this is logged with its stack (and again each period).
STOP_SLOW_SECONDS = 2.0
# SO_RCVTIMEO / SO_SNDTIMEO value:
#   0  long  seconds
#   8  long  microseconds
TIMEVAL = struct.Struct("@ll")
# Consume-queue dispatch pacing. Every dispatch slice holds the GIL, which the receiver thread
# needs briefly after each of its system calls (and once the holder runs Python, a waiting thread
# gets it only after the 1 ms switch interval), so slices stay short and are followed by a real
# pause while bytes arrive: during a catch-up (frames larger than SPLICE_MIN) a trickle of
# CATCHUP_DISPATCH_SLICE every DISPATCH_PERIOD; during a live stream half the backlog, within
# [MIN_DISPATCH_SLICE, LIVE_DISPATCH_SLICE (~0.5 ms)], every DISPATCH_PERIOD (room for ~60 MB/s
# of 1 KiB records), with no pause beyond MAX_DISPATCH_LAG; once the stream pauses,
# IDLE_DISPATCH_SLICE steps back to back. Each round also commits what the receiver wrote.
STREAM_BUSY_SECONDS = 0.005
CATCHUP_LINGER_SECONDS = 0.25
DISPATCH_PERIOD = 0.002
CATCHUP_DISPATCH_SLICE = 32 * 1024
LIVE_DISPATCH_SLICE = 128 * 1024
MIN_DISPATCH_SLICE = 16 * 1024
IDLE_DISPATCH_SLICE = 256 * 1024
MAX_DISPATCH_LAG = 512 * 1024 * 1024


class StreamMismatchError(Exception):
    """The master's stream does not continue this slave's log, or is malformed."""


class _Stopped(Exception):
    """The loop asked the receiver thread to stop."""


class LegacyMasterError(Exception):
    """The master answered the epoch query as an Apache RocketMQ 4.x master does: it took the
    query for the slave's offset and sent a heartbeat at it (offset -2, no body)."""


def _connect(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port), CONNECT_TIMEOUT)
    try:
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Blocking calls (recv, splice, send) return EAGAIN after this, so the thread can look
        # at its stop flag; a socket timeout would add a poll() before every call instead.
        tv = TIMEVAL.pack(int(RECV_POLL), int(RECV_POLL % 1 * 1_000_000))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    except BaseException:
        sock.close()
        raise
    return sock


class _Receiver:
    """One HA connection's blocking side, run in the client's receiver thread.

    The loop calls :meth:`stop` and :meth:`commit` (the latter from the reput task's polling
    while a stream flows, else from a ``call_soon_threadsafe`` callback, at most one pending);
    segments come from the loop too (:meth:`_on_loop`, once per segment).
    """

    def __init__(self, client: HAClient, sock: socket.socket, loop: asyncio.AbstractEventLoop,
                 heartbeat: float, housekeeping: float) -> None:
        self.client = client
        self.sock = sock
        self.loop = loop
        self.heartbeat = heartbeat
        self.housekeeping = housekeeping
        self.stopping = False
        self.streaming = False
        self.bulk = False  # the last frame was large
        self.drained = False  # the last receive returned less than asked for
        self.buf = bytearray(RECV_BUFFER)
        self.view = memoryview(self.buf)
        self.start = 0  # first unparsed byte of buf
        self.end = 0  # end of received bytes in buf
        self.written = 0  # end of bytes in the commitlog (0: nothing yet)
        self.reported = -1
        self.last_report = 0.0
        self.last_read = time.monotonic()
        self.segment: MappedFile | None = None
        self.precreated = 0  # the segment starting here was requested ahead of the stream
        self.pipe: tuple[int, int] | None = None
        # Loop-side commit hand-off.
        self.pending_end = 0
        self.commit_scheduled = False
        self.committed_end = 0

    # -- loop side --
    def stop(self) -> None:
        self.stopping = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def commit(self) -> None:
        """Loop: make the bytes the thread has written visible in the store."""
        self.commit_scheduled = False
        end = self.pending_end
        if end > self.committed_end:
            self.committed_end = end
            self.client.committed(end)

    def _precreate(self, start: int) -> None:
        """Loop: create the segment starting at ``start`` ahead of the stream (never the first
        one of an empty log, which :meth:`MessageStore.raw_segment` would start over)."""
        store = self.client.store
        if self.stopping or store.max_phy_offset() == 0:
            return
        try:
            store.raw_segment(start)
        except StoreError as exc:
            log.warning("cannot create the commitlog segment at %d ahead of the stream: %s", start, exc)

    # -- thread side: handshake --
    def epoch_query(self) -> bytes:
        """Ask for the master's epoch history; the answer frame's body."""
        self.sock.sendall(REPORT.pack(EPOCH_QUERY))
        self._fill(TRANSFER_HEADER.size, report=False)
        offset, size = TRANSFER_HEADER.unpack_from(self.buf, self.start)
        if offset != EPOCH_QUERY:
            raise StreamMismatchError("master streamed data before the epoch handshake")
        if size == 0:
            # This project's master always answers with a body; a heartbeat echoing the query is
            # a Java master whose writer now streams from offset -2: this connection is useless.
            raise LegacyMasterError
        if not 0 <= size <= MAX_EPOCH_ANSWER:
            raise StreamMismatchError(f"malformed frame header (offset {offset}, size {size})")
        if TRANSFER_HEADER.size + size > len(self.buf):
            self._grow(TRANSFER_HEADER.size + size)
        self._fill(TRANSFER_HEADER.size + size, report=False)
        body = bytes(self.buf[self.start + TRANSFER_HEADER.size:self.start + TRANSFER_HEADER.size + size])
        self.start += TRANSFER_HEADER.size + size
        return body

    def _grow(self, size: int) -> None:
        data = self.buf[self.start:self.end]
        self.buf = bytearray(max(size, len(self.buf)))
        self.view = memoryview(self.buf)
        self.buf[:len(data)] = data
        self.start, self.end = 0, len(data)

    # -- thread side: streaming --
    def stream(self, start_offset: int) -> None:
        """Follow the stream from ``start_offset`` (this log's end) until stopped or failed."""
        self.written = start_offset
        self.streaming = True
        self._report()
        hdr = TRANSFER_HEADER.size
        try:
            self._open_pipe()
            while True:
                # After a large frame the next one is most likely large too: read just its
                # header, so that its whole body goes through the pipe (one copy, not two).
                self._fill(hdr, exact=self.bulk)
                offset, size = TRANSFER_HEADER.unpack_from(self.buf, self.start)
                self.start += hdr
                if size < 0 or offset < 0:
                    raise StreamMismatchError(f"malformed frame header (offset {offset}, size {size})")
                if self.written not in (0, offset):
                    raise StreamMismatchError(f"master sent offset {offset}, this log ends at {self.written}")
                if not size:
                    continue  # heartbeat
                self.bulk = size > SPLICE_MIN and self.pipe is not None
                self._body(offset, size)
        except _Stopped:
            return
        finally:
            # Written but not yet reported: the loop commits it once this thread is done.
            self.pending_end = max(self.pending_end, self.written)
            if self.pipe is not None:
                for fd in self.pipe:
                    os.close(fd)
                self.pipe = None

    def _open_pipe(self) -> None:
        if not hasattr(os, "splice"):
            return
        r, w = os.pipe()
        self.pipe = (r, w)
        with contextlib.suppress(OSError):
            fcntl.fcntl(w, F_SETPIPE_SZ, PIPE_SIZE)

    def _body(self, offset: int, size: int) -> None:
        pos = offset
        left = size
        while left:
            have = min(self.end - self.start, left)
            if have:
                self._pwrite(pos, self.view[self.start:self.start + have])
                self.start += have
            elif left > SPLICE_MIN and self.pipe is not None:
                have = self._splice(pos, left)
            else:
                self._fill(min(left, len(self.buf)))
                continue
            pos += have
            left -= have
            self._advance(pos)
        if size > SPLICE_MIN:
            # A catch-up: consume-queue dispatch keeps to a trickle and periodic flushes wait,
            # so that the receiver has the CPU.
            until = time.monotonic() + CATCHUP_LINGER_SECONDS
            self.client.catchup_until = until
            self.client.store.defer_periodic_flush(until)

    def _segment_for(self, pos: int) -> tuple[MappedFile, int]:
        """The segment holding ``pos`` and the room left in it from there."""
        mf = self.segment
        if mf is None or not mf.file_from_offset <= pos < mf.file_from_offset + mf.file_size:
            mf = self.segment = self._on_loop(pos)
        end = mf.file_from_offset + mf.file_size
        if self.precreated < end and pos - mf.file_from_offset > mf.file_size // 2:
            # Creating a segment fsyncs the directory: have the loop do it for the next one early,
            # so that the stream does not wait for it at the boundary.
            self.precreated = end
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._precreate, end)
        rel = pos - mf.file_from_offset
        if rel + SPLICE_MIN > mf.reserved:
            # Blocks reserved ahead, always (the loop reserves lazily): a sparse file makes the
            # filesystem allocate per page (ext4 delayed allocation), which halves the page-cache
            # copy rate; and a copy through the mapping into a hole a full disk cannot back would
            # be a SIGBUS, not an error.
            mf.reserve(rel + SPLICE_MIN, ALLOCATE_AHEAD, allocate=True)
        return mf, end - pos

    def _on_loop(self, pos: int) -> MappedFile:
        """Have the loop find or create the segment for ``pos`` (once per segment)."""
        result: concurrent.futures.Future[MappedFile] = concurrent.futures.Future()

        def run() -> None:
            try:
                result.set_result(self.client.store.raw_segment(pos))
            except BaseException as exc:  # handed to the waiting thread, which raises it
                result.set_exception(exc)

        try:
            self.loop.call_soon_threadsafe(run)
        except RuntimeError as exc:  # the loop is closed
            raise _Stopped from exc
        while True:
            try:
                return result.result(RECV_POLL)
            except concurrent.futures.TimeoutError:
                if self.stopping or self.loop.is_closed():
                    raise _Stopped from None

    def _pwrite(self, pos: int, data: memoryview) -> None:
        while data:
            mf, room = self._segment_for(pos)
            k = min(len(data), room)
            rel = pos - mf.file_from_offset
            if k <= INLINE_COPY_MAX:
                # A tail piece: copied into the mapping while holding the GIL, rather than a
                # system call that gives the GIL up and may wait behind the loop to get it back.
                mf.mm[rel:rel + k] = data[:k]
                n = k
            else:
                try:
                    n = os.pwrite(mf.fd, data[:k], rel)
                except OSError as exc:
                    raise io_error(f"commitlog write at {pos} failed", exc) from exc
            pos += n
            data = data[n:]

    def _splice(self, pos: int, left: int) -> int:
        """Move up to ``left`` body bytes from the socket into the segment; how many moved."""
        assert self.pipe is not None
        r, w = self.pipe
        mf, room = self._segment_for(pos)
        while True:
            try:
                n = os.splice(self.sock.fileno(), w, min(left, room, PIPE_SIZE))
                break
            except BlockingIOError:
                self._idle()
        if not n:
            raise ConnectionError("master closed the connection")
        self.last_read = time.monotonic()
        moved = 0
        rel = pos - mf.file_from_offset
        while moved < n:
            try:
                moved += os.splice(r, mf.fd, n - moved, offset_dst=rel + moved)
            except OSError as exc:
                raise io_error(f"commitlog write at {pos + moved} failed", exc) from exc
        return n

    def _advance(self, end: int) -> None:
        self.written = end
        if time.monotonic() - self.last_report >= REPORT_EVERY:
            self._report()

    def _report(self) -> None:
        """Ack ``written`` to the master, then have the loop commit it: the ack needs nothing from
        the loop, and commits (each one wakes the loop, which then holds the GIL) follow the
        report cadence rather than every frame."""
        written = self.written
        try:
            self.sock.sendall(REPORT.pack(written))
        except BlockingIOError as exc:
            raise ConnectionError("master does not read reports") from exc
        self.reported = written
        self.last_report = time.monotonic()
        if written > self.pending_end:
            self.pending_end = written
            client = self.client
            client.last_append = self.last_report
            # While the reput task polls (a stream is flowing) it commits on its own; waking the
            # loop for every ack would only make it take the GIL this thread needs next.
            if not client.polling and not self.commit_scheduled:
                self.commit_scheduled = True
                try:
                    self.loop.call_soon_threadsafe(self.commit)
                except RuntimeError as exc:
                    raise _Stopped from exc

    def _fill(self, need: int, report: bool = True, exact: bool = False) -> None:
        """Receive until at least ``need`` unparsed bytes are buffered (``need`` <= buffer size);
        with ``exact`` not more either."""
        while self.end - self.start < need:
            if self.start == self.end:
                self.start = self.end = 0
            elif len(self.buf) - self.start < need:
                self.buf[:self.end - self.start] = self.buf[self.start:self.end]
                self.start, self.end = 0, self.end - self.start
            space = need - (self.end - self.start) if exact else len(self.buf) - self.end
            n = -1
            if not self.drained:
                with contextlib.suppress(BlockingIOError):
                    n = self.sock.recv_into(self.view[self.end:], space, socket.MSG_DONTWAIT)
            if n < 0:
                # About to wait: the master learns about everything written so far first.
                if report and self.written > self.reported:
                    self._report()
                n = self._recv_blocking(space)
            if not n:
                raise ConnectionError("master closed the connection")
            # A short read emptied the socket: the next receive would wait, so the report goes
            # out before it without probing first (a tailing slave acks after one read + copy).
            self.drained = n < space
            self.last_read = time.monotonic()
            self.end += n

    def _recv_blocking(self, want: int) -> int:
        while True:
            try:
                return self.sock.recv_into(self.view[self.end:], want)
            except BlockingIOError:
                self._idle()

    def _idle(self) -> None:
        """A blocking receive timed out (RECV_POLL): stop, heartbeat, or give up on a silent master."""
        if self.stopping or self.loop.is_closed():
            # A closed loop means nobody will stop us, and interpreter exit joins this thread.
            raise _Stopped
        now = time.monotonic()
        if now - self.last_read > self.housekeeping:
            raise ConnectionError(f"master silent for {self.housekeeping:.0f}s")
        if self.streaming and now - self.last_report >= self.heartbeat:
            self._report()


class HAClient:
    """Slave-side replication task; one master at a time."""

    def __init__(self, store: MessageStore, master_addr: str | None, *, heartbeat_interval: float = 5.0,
                 housekeeping_interval: float = 20.0, epochs: EpochStore | None = None,
                 truncate: Callable[[int], None] | None = None,
                 on_master_lost: Callable[[str], None] | None = None,
                 on_following: Callable[[str], None] | None = None,
                 retry_soon: Callable[[], bool] | None = None,
                 group: tuple[str, str] | None = None) -> None:
        self.store = store
        # (brokerName, brokerClusterName) of this broker: a master that tells another is not
        # followed (see HAService.group). None: not checked.
        self.group = group
        self.master_addr = master_addr
        # Called with the address after each attempt to follow it that failed (unreachable,
        # silent, refused: e.g. a SLAVE now), unless a re-point already names another master.
        self._on_master_lost = on_master_lost
        # Called with the address each time this slave starts streaming from a master (reconnects
        # included): a master that is back after an outage.
        self._on_following = on_following
        # While it says True, a master that cannot be followed is tried again every RETRY_SOON
        # seconds instead of backing off: something waits for its return (consumer
        # offsets committed here during an outage, which a consumer reading the returned master's
        # own would otherwise re-consume from until they are handed over).
        self._retry_soon = retry_soon
        self.heartbeat_interval = heartbeat_interval
        self.housekeeping_interval = housekeeping_interval
        self.epochs = epochs
        self._truncate = truncate
        self.truncated_bytes = 0
        # Bytes of the master's own term this log holds beyond the master's end (0: none).
        self.ahead_bytes = 0
        # Why the last handshake with the current master was refused (None: it was not, or none
        # was made yet). The metadata sync takes nothing from a master whose log is refused.
        self.refusal: str | None = None
        self.connected = False
        # Streaming from a master: the handshake found the peer a master (connected is set at the
        # TCP connect already, before anything is known of the peer).
        self.streaming = False
        # The client address the master streamed from now told in its epoch answer (None: not told).
        self.master_broker_addr: str | None = None
        self.local_address: str | None = None
        self.bytes_received = 0
        self.mismatches = 0
        self.connects = 0  # connections established to a master, reconnects included
        self.failed_attempts = 0  # attempts to follow a master that failed (unreachable, refused, ...)
        self._failure_logged = float("-inf")  # monotonic time of the last failure logged as a warning
        # Whether the current master was followed without the epoch handshake (a RocketMQ 4.x master).
        self.legacy_master = False
        # The next connection to this address skips the epoch query (it was just taken for an offset).
        self._legacy_next: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._reput_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._appended = asyncio.Event()
        # Written by the receiver thread too (float stores, atomic under the GIL).
        self.last_append = 0.0
        self.catchup_until = 0.0
        # Whether the reput task polls the receiver for commits (read by the receiver thread).
        self.polling = False
        self._receiver: _Receiver | None = None
        # The receiver thread: one connection at a time, so one thread.
        self.receiver_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ha-recv")

    def set_master(self, addr: str | None) -> None:
        """Follow a different master (restarts the connection if it changed)."""
        if addr == self.master_addr:
            return
        log.info("HA master address %s -> %s", self.master_addr, addr)
        self.master_addr = addr
        self.refusal = None
        self._changed.set()

    async def switch_master(self, addr: str, *, reconnect: bool = False) -> None:
        """Follow ``addr`` from now on. Returns once the previous connection is closed and its
        writes in flight are complete, so nothing the old master sends afterwards reaches the log
        (an operator re-pointing a slave reads its final offset for that master from the answer).
        ``reconnect`` drops the connection even when the address is the same."""
        changed = addr != self.master_addr
        self.set_master(addr)
        if (changed or reconnect) and self._task is not None:
            await self.restart()

    async def restart(self) -> None:
        """Drop the current connection (its writes in flight complete first) and connect afresh."""
        await self.stop()
        self.start()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._task = loop.create_task(self._run(), name="ha-client")
        if self._reput_task is None:
            self._reput_task = loop.create_task(self._reput(), name="ha-reput")

    async def stop(self) -> None:
        """Stop following. Returns only once a handshake's epoch adoption, which cannot be
        cancelled midway, has finished: a promotion that stops this client first must check its
        epoch against the state that adoption leaves, not have it change underneath."""
        for task in (self._task, self._reput_task):
            if task is not None:
                task.cancel()
                await _wait_stopped(task)
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._task = self._reput_task = None
        self.connected = False
        self.streaming = False
        self.local_address = None

    def committed(self, end: int) -> None:
        """The receiver wrote bytes up to ``end``: visible in the store from now on."""
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
        while True:
            self._commit_received()
            behind = store.dispatch_behind()
            if behind <= 0:
                # Nothing to dispatch: stop polling the receiver, which then wakes us per commit
                # (after one more look, for a commit it skipped while we were still polling).
                self.polling = False
                if self._commit_received():
                    self.polling = True
                    continue
                self._appended.clear()
                await self._appended.wait()
                self.polling = True
                continue
            now = time.monotonic()
            catchup = now < self.catchup_until
            streaming = catchup or now - self.last_append < STREAM_BUSY_SECONDS
            try:
                if not streaming or (behind > MAX_DISPATCH_LAG and not catchup):
                    store.dispatch_some(IDLE_DISPATCH_SLICE)
                    await asyncio.sleep(0)
                else:
                    budget = CATCHUP_DISPATCH_SLICE if catchup else min(LIVE_DISPATCH_SLICE,
                                                                        max(MIN_DISPATCH_SLICE, behind // 2))
                    store.dispatch_some(budget)
                    await asyncio.sleep(DISPATCH_PERIOD)
            except StoreFullError:
                # No room for consume-queue units (logged by the store): the records stay in the
                # commitlog and are dispatched from the first one without a unit once there is.
                await asyncio.sleep(DISPATCH_FULL_RETRY)

    def _commit_received(self) -> bool:
        """Commit what the current receiver has written; whether there was anything."""
        receiver = self._receiver
        if receiver is not None and receiver.pending_end > receiver.committed_end:
            receiver.commit()
            return True
        return False

    # -- connection loop --
    async def _run(self) -> None:
        backoff = RETRY_FIRST
        while True:
            addr = self.master_addr
            self._changed.clear()
            if not addr:
                await self._wait_change(5.0)
                continue
            failed = True
            unreachable = False
            try:
                await self._follow(addr)
                backoff = RETRY_FIRST
                failed = False
            except LegacyMasterError:
                log.warning("HA master %s does not know the epoch handshake (an Apache RocketMQ 4.x master?): "
                            "reconnecting to follow it as a RocketMQ slave does, without epoch checks", addr)
                self._legacy_next = addr
                failed = False
                continue
            except (OSError, ConnectionError, TimeoutError) as exc:
                unreachable = True
                self._log_failure("HA connection to %s failed: %s", addr, exc)
            except StoreFullError as exc:
                # The disk, not the master (no master-lost signal): the stream goes on from here
                # once there is room.
                failed = False
                self.store.note_no_space("the replicated commitlog", exc)
            except EpochChangedError as exc:
                # A role change or re-point overtook the handshake; the next one starts from the
                # epoch state as it is now.
                log.warning("HA handshake with %s overtaken: %s", addr, exc)
            except (StreamMismatchError, StoreError) as exc:
                self.mismatches += 1
                if addr == self.master_addr:
                    self.refusal = str(exc)
                log.error("HA stream from %s refused: %s", addr, exc)
            except Exception:
                # Whatever went wrong with this master (an unusable address included), the task
                # lives on: it retries with back-off and follows the next re-point.
                log.exception("HA connection to %s failed", addr)
            finally:
                self.connected = False
                self.streaming = False
                self.local_address = None
            if self._changed.is_set():
                continue
            if failed:
                self.failed_attempts += 1
                if self._on_master_lost is not None:
                    self._on_master_lost(addr)
            await self._back_off(min(backoff, RETRY_MAX_UNREACHABLE) if unreachable else backoff)
            backoff = min(backoff * 2, RETRY_MAX)

    def _log_failure(self, msg: str, *args: object) -> None:
        """A master down for minutes is tried hundreds of times: a warning now and then is enough."""
        now = time.monotonic()
        if now - self._failure_logged >= FAILURE_LOG_EVERY:
            self._failure_logged = now
            log.warning(msg, *args)
        else:
            log.debug(msg, *args)

    async def _back_off(self, delay: float) -> None:
        """Wait ``delay`` seconds, a re-point, or, while ``retry_soon`` says so, RETRY_SOON at most
        (looked at every RETRY_SOON, so a reason arising during a long back-off shortens it)."""
        deadline = time.monotonic() + delay
        while (remaining := deadline - time.monotonic()) > 0:
            await self._wait_change(min(remaining, RETRY_SOON))
            if self._changed.is_set() or (self._retry_soon is not None and self._retry_soon()):
                return

    async def _wait_change(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()

    async def _follow(self, addr: str) -> None:
        if self._legacy_next == addr and self.epochs is not None and self.epochs.fenced:
            # Without the handshake a master's epoch is unknown: none is followed while fenced.
            self._legacy_next = None
            raise StreamMismatchError(f"fenced below epoch {self.epochs.fence}: not following {addr} "
                                      "without the epoch handshake")
        host, port = split_addr(addr)
        loop = asyncio.get_running_loop()
        connecting = loop.run_in_executor(self.receiver_pool, _connect, host, port)
        try:
            sock = await connecting
        except asyncio.CancelledError:
            # The thread may still hand over a socket nobody would close.
            connecting.add_done_callback(_close_result)
            raise
        self.connected = True
        self.connects += 1
        here = sock.getsockname()
        self.local_address = f"{here[0]}:{here[1]}" if isinstance(here, tuple) else str(here)
        receiver = _Receiver(self, sock, loop, self.heartbeat_interval, self.housekeeping_interval)
        self._receiver = receiver
        # One connection without the query after a master took it for an offset; the one after
        # that asks again, so a master replaced at the same address gets the handshake.
        legacy = self._legacy_next == addr
        self._legacy_next = None
        self.master_broker_addr = None
        self.legacy_master = legacy
        changed = asyncio.ensure_future(self._changed.wait())
        running: asyncio.Future[Any] | None = None
        try:
            if self.epochs is not None and not legacy:
                running = loop.run_in_executor(self.receiver_pool, receiver.epoch_query)
                done, _ = await asyncio.wait({running, changed}, return_when=asyncio.FIRST_COMPLETED)
                if changed in done:
                    return  # re-pointed while waiting: never take data from the old master
                answer: bytes = running.result()
                await self._reconcile(answer, addr)
            start = self.store.max_phy_offset()
            log.info("HA following master %s from offset %d", addr, start)
            self.streaming = True
            self.refusal = None
            self._failure_logged = float("-inf")  # losing this master is news, whenever it comes
            if self._on_following is not None:
                self._on_following(addr)
            running = loop.run_in_executor(self.receiver_pool, receiver.stream, start)
            done, _ = await asyncio.wait({running, changed}, return_when=asyncio.FIRST_COMPLETED)
            if changed in done:
                return
            running.result()
            raise ConnectionError("HA receiver stopped")
        finally:
            changed.cancel()
            receiver.stop()
            try:
                if running is not None:
                    # Writes still in flight complete before anyone (truncation, promotion) looks
                    # at the log; the thread lets go of the socket within RECV_POLL.
                    await asyncio.wait({running})
                    if not running.cancelled():
                        running.exception()  # retrieved: raised above when it mattered
            finally:
                receiver.commit()
                self._receiver = None
                sock.close()

    async def _reconcile(self, answer: bytes, addr: str) -> None:
        """Cut any tail of ours the master never had, then adopt the master's epoch history.

        Raises :class:`EpochChangedError` if the epoch state changed between the checks here and
        the adoption (the next handshake decides afresh).
        """
        epochs = self.epochs
        assert epochs is not None
        # Read before the epoch and history the decision below rests on (see EpochStore).
        seen = epochs.generation
        try:
            obj = json.loads(answer)
            master_epoch = int(obj["epoch"])
            master_history = parse_history(obj["history"])
            master_max = int(obj["maxOffset"])
            # Absent from masters before the field existed: they answered only as masters.
            peer_role = str(obj.get("role", "MASTER"))
            told = obj.get("brokerAddr")
            broker_addr = told if isinstance(told, str) and told else None
            # Absent from masters before the fields existed.
            peer_group = (str(obj["brokerName"]), str(obj["brokerClusterName"])) if "brokerName" in obj else None
            master_log = log_id_of(obj.get("logId"))  # absent from older masters and Java's
        except (ValueError, KeyError, TypeError, AttributeError, EpochError) as exc:
            raise StreamMismatchError(f"bad epoch answer from {addr}: {exc}") from exc
        if peer_role == "SLAVE":
            raise StreamMismatchError(f"{addr} is a SLAVE (epoch {master_epoch}), not a master to follow")
        if self.group is not None and peer_group is not None and peer_group != self.group:
            raise StreamMismatchError(
                f"{addr} is the master of broker {peer_group[0]!r} in cluster {peer_group[1]!r}, not of this "
                f"broker's group ({self.group[0]!r} in {self.group[1]!r}); not following it")
        self.master_broker_addr = broker_addr
        if master_epoch < epochs.epoch:
            raise StreamMismatchError(
                f"master {addr} is at epoch {master_epoch}, older than ours ({epochs.epoch})")
        if master_epoch < epochs.fence:
            raise StreamMismatchError(
                f"master {addr} is at epoch {master_epoch}; fenced below epoch {epochs.fence} while a newer "
                "master is promoted")
        own_max = self.store.max_phy_offset()
        if own_max > 0 and other_logs(master_log, epochs.log_id):
            assert master_log is not None
            self._other_log(addr, master_epoch, master_history, master_log, own_max)
        point = divergence_offset(epochs.history, master_history, master_max)
        own_max = self.store.max_phy_offset()
        if own_max > point and master_epoch == epochs.epoch and same_term(epochs.history, master_history):
            # The master came back with less of its own term than it replicated here (an older
            # disk): these bytes may be acknowledged sends. Like a Java slave, keep them and do
            # not follow; promoting this broker (a newer epoch) or restoring the master resolves it.
            self.ahead_bytes = own_max - point
            raise StreamMismatchError(
                f"log holds {own_max - point} bytes of epoch {master_epoch} beyond master {addr}'s end {point}; "
                "not truncating what the master itself replicated")
        self.ahead_bytes = 0
        if own_max > point:
            if self._truncate is None:
                raise StreamMismatchError(f"log holds {own_max - point} bytes beyond the master's epoch end")
            log.warning("truncating %d divergent bytes [%d, %d) before following %s (epoch %d)",
                        own_max - point, point, own_max, addr, master_epoch)
            self._truncate(point)
            self.truncated_bytes += own_max - point
        adopting = asyncio.get_running_loop().run_in_executor(
            None, functools.partial(epochs.adopt, master_epoch, master_history, seen=seen, log_id=master_log))
        try:
            await asyncio.shield(adopting)
        except EpochChangedError:
            raise
        except EpochError as exc:
            # E.g. a master at the epoch this broker began (a second writer of one term): refused
            # like any stream that cannot continue this log.
            raise StreamMismatchError(f"not following {addr}: {exc}") from exc
        except asyncio.CancelledError:
            # The thread goes on regardless; whoever cancelled us (stop() before a promotion)
            # waits for it, so its next step sees the epoch store as the adoption leaves it.
            await asyncio.wait({adopting})
            if not adopting.cancelled() and (refused := adopting.exception()) is not None:
                log.info("epoch adoption of the stopped handshake with %s not applied: %s", addr, refused)
            raise

    def _other_log(self, addr: str, master_epoch: int, master_history: list[EpochEntry], master_log: str,
                   own_max: int) -> None:
        """The master serves another log than this one (``logId``): not the continuation of ours
        whatever the offsets say. In the term our log is in, it is a master back on a replaced
        volume, and our bytes may be acknowledged sends: kept, reported as ahead of the master,
        not followed (the operator promotes a slave holding them). Begun by a later promotion,
        the group moved on to that log without ours (we are such a master, demoted): ours is
        dropped whole. Older, it is no master to follow."""
        epochs = self.epochs
        assert epochs is not None
        if same_term(epochs.history, master_history):
            self.ahead_bytes = own_max
            raise StreamMismatchError(
                f"master {addr} serves log {master_log}, not this broker's log {epochs.log_id} (a master back "
                f"on a replaced volume?): not following it, keeping the {own_max} bytes held")
        if last_epoch(master_history) < last_epoch(epochs.history):
            raise StreamMismatchError(
                f"master {addr} serves log {master_log}, older than this broker's log {epochs.log_id}")
        if self._truncate is None or self.store.min_phy_offset() > 0:
            raise StreamMismatchError(
                f"master {addr} (epoch {master_epoch}) serves log {master_log}, not this broker's log "
                f"{epochs.log_id}, and this log cannot be dropped whole here")
        log.warning("master %s (epoch %d) serves log %s, which the group kept instead of this broker's log %s: "
                    "dropping its %d bytes before following", addr, master_epoch, master_log, epochs.log_id, own_max)
        self._truncate(0)
        self.truncated_bytes += own_max


async def _wait_stopped(task: asyncio.Task[None]) -> None:
    """Wait for a cancelled task to end; one that takes long (a promotion waits for it) is
    logged with where it waits."""
    began = time.monotonic()
    while not task.done():
        await asyncio.wait({task}, timeout=STOP_SLOW_SECONDS)
        if not task.done():
            where = io.StringIO()
            task.print_stack(file=where)
            log.warning("HA task %s not stopped after %.1f s; waiting at:\n%s", task.get_name(),
                        time.monotonic() - began, where.getvalue().rstrip())


def _close_result(fut: asyncio.Future[socket.socket]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        fut.result().close()
