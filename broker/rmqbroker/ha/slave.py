"""HA slave side (reference §7.2-§7.4): follows a master's commitlog stream.

Reports its max offset on connect, after every append and every heartbeat interval; appends
through the store (so consume queues are built here too); refuses a stream that does not
continue its own log; reconnects with back-off when the master is silent or unreachable. The
master address can change at runtime (:meth:`HAClient.set_master`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable

from rmqbroker.ha.epoch import EpochError, EpochStore, divergence_offset, parse_history
from rmqbroker.ha.master import EPOCH_QUERY, REPORT, TRANSFER_HEADER
from rmqbroker.remoting.client import split_addr
from rmqbroker.store.errors import StoreError
from rmqbroker.store.message_store import MessageStore

log = logging.getLogger(__name__)

READ_BUFFER = 4 * 1024 * 1024


class StreamMismatchError(Exception):
    """The master's stream does not continue this slave's log."""


class HAClient:
    """Slave-side replication task; one master at a time."""

    def __init__(self, store: MessageStore, master_addr: str | None, *, heartbeat_interval: float = 5.0,
                 housekeeping_interval: float = 20.0, epochs: EpochStore | None = None,
                 truncate: Callable[[int], None] | None = None) -> None:
        self.store = store
        self.epochs = epochs
        self._truncate = truncate
        self.truncated_bytes = 0
        self.master_addr = master_addr
        self.heartbeat_interval = heartbeat_interval
        self.housekeeping_interval = housekeeping_interval
        self.connected = False
        self.last_read_time = 0.0
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
            except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError) as exc:
                log.warning("HA connection to %s failed: %s", addr, exc)
            except StreamMismatchError as exc:
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
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=READ_BUFFER), 3.0)
        self.connected = True
        log.info("HA following master %s from offset %d", addr, self.store.max_phy_offset())
        store = self.store
        hdr_size = TRANSFER_HEADER.size
        try:
            if self.epochs is not None:
                await self._reconcile_epochs(reader, writer, addr)
            writer.write(REPORT.pack(store.max_phy_offset()))
            await writer.drain()
            self.last_read_time = time.monotonic()
            while not self._changed.is_set():
                try:
                    header = await asyncio.wait_for(reader.readexactly(hdr_size), self.heartbeat_interval)
                except TimeoutError:
                    if time.monotonic() - self.last_read_time > self.housekeeping_interval:
                        raise ConnectionError(f"master silent for {self.housekeeping_interval:.0f}s") from None
                    writer.write(REPORT.pack(store.max_phy_offset()))
                    await writer.drain()
                    continue
                offset, size = TRANSFER_HEADER.unpack(header)
                if size < 0:
                    raise StreamMismatchError(f"negative body size {size}")
                body = await asyncio.wait_for(reader.readexactly(size), self.housekeeping_interval) if size else b""
                self.last_read_time = time.monotonic()
                current = store.max_phy_offset()
                if current not in (0, offset):
                    raise StreamMismatchError(f"master sent offset {offset}, this log ends at {current}")
                if size:
                    try:
                        store.append_raw(offset, body)
                    except StoreError as exc:
                        raise StreamMismatchError(str(exc)) from exc
                    self.bytes_received += size
                # Report after every append: SYNC_MASTER sends wait for it.
                writer.write(REPORT.pack(store.max_phy_offset()))
                await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _reconcile_epochs(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, addr: str) -> None:
        """Ask the master's epoch history; cut any tail of ours the master never had; adopt it."""
        assert self.epochs is not None
        writer.write(REPORT.pack(EPOCH_QUERY))
        await writer.drain()
        header = await asyncio.wait_for(reader.readexactly(TRANSFER_HEADER.size), self.housekeeping_interval)
        offset, size = TRANSFER_HEADER.unpack(header)
        if offset != EPOCH_QUERY or not 0 <= size <= 1 << 20:
            raise StreamMismatchError(f"master {addr} did not answer the epoch query")
        body = await asyncio.wait_for(reader.readexactly(size), self.housekeeping_interval)
        try:
            obj = json.loads(body)
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
