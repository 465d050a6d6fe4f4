"""SYNC_MASTER replication waits (reference §7.5): RocketMQ's GroupTransferService.

A send on a SYNC_MASTER is answered once a slave has acknowledged its end offset. One ack
releases every wait up to that offset (group commit), so concurrent producers share the slave
round trip instead of queueing behind each other. Compiled with mypyc (``setup.py``): it runs
once per replicated send and once per slave ack.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable

from rmqbroker.store.message_store import PutMessageStatus

log = logging.getLogger(__name__)

_PUT_OK = PutMessageStatus.PUT_OK
_FLUSH_SLAVE_TIMEOUT = PutMessageStatus.FLUSH_SLAVE_TIMEOUT
_SLAVE_NOT_AVAILABLE = PutMessageStatus.SLAVE_NOT_AVAILABLE


class Waiter:
    """One waiting put, resolved exactly once: by an ack, at its deadline, or at shutdown."""

    def __init__(self, end_offset: int, on_done: Callable[[PutMessageStatus], None], deadline: float) -> None:
        self.end_offset = end_offset
        self.on_done = on_done
        self.deadline = deadline

    def resolve(self, status: PutMessageStatus) -> None:
        try:
            self.on_done(status)
        except Exception:
            log.exception("replication wait callback failed")


class GroupTransferService:
    """Waits ordered by end offset; ``acked`` is the highest offset any slave has acknowledged.

    Every wait has the same timeout and waits arrive in append order, so the queue is ordered by
    deadline as well: one timer, armed for the oldest wait, times them all out (a timer handle
    per send cost more than the rest of the wait).
    """

    def __init__(self, sync_timeout: float, fallbehind_max: int) -> None:
        self.sync_timeout = sync_timeout
        self.fallbehind_max = fallbehind_max
        self.acked = 0
        # Slave connections that have reported where they are (kept by the HA service).
        self.live_slaves = 0
        self._waiters: collections.deque[Waiter] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._waiters)

    def slave_ok(self, master_put_where: int) -> bool:
        """Whether a slave can take an append ending at ``master_put_where`` (Java's
        HAService.isSlaveOK): one is connected and the best is within ``fallbehind_max``."""
        return self.live_slaves > 0 and master_put_where - self.acked < self.fallbehind_max

    def wait_then(self, end_offset: int, on_done: Callable[[PutMessageStatus], None]) -> None:
        """``on_done(status)`` with the replication outcome of an append ending at ``end_offset``:
        PUT_OK once acknowledged, SLAVE_NOT_AVAILABLE at once when no slave can take it,
        FLUSH_SLAVE_TIMEOUT when no ack covers it within the timeout."""
        if not self.slave_ok(end_offset):
            on_done(_SLAVE_NOT_AVAILABLE)
            return
        if self.acked >= end_offset:
            on_done(_PUT_OK)
            return
        loop = self._loop
        if loop is None:
            # Cached: asyncio.get_running_loop() makes a getpid() system call each time.
            loop = self._loop = asyncio.get_running_loop()
        waiter = Waiter(end_offset, on_done, loop.time() + self.sync_timeout)
        # Appends are ordered, so the deque stays sorted by end offset (and by deadline). A put
        # that registers late by a few microseconds is released by the next ack that covers the
        # one ahead of it, which acks of a growing log always do.
        self._waiters.append(waiter)
        if self._timer is None:
            self._timer = loop.call_at(waiter.deadline, self._expire)

    def release(self, acked: int) -> None:
        """A slave acknowledged ``acked``: answer every wait up to it."""
        if acked <= self.acked:
            return
        self.acked = acked
        waiters = self._waiters
        while waiters and waiters[0].end_offset <= acked:
            waiters.popleft().resolve(_PUT_OK)

    def _expire(self) -> None:
        """Time out every wait whose deadline has passed, then re-arm for the oldest one left."""
        self._timer = None
        waiters = self._waiters
        loop = self._loop
        if not waiters or loop is None:
            return
        now = loop.time()
        while waiters and waiters[0].deadline <= now:
            waiters.popleft().resolve(_FLUSH_SLAVE_TIMEOUT)
        if waiters:
            self._timer = loop.call_at(waiters[0].deadline, self._expire)

    def reset(self) -> None:
        """Forget what slaves acknowledged (a role change): acks of an earlier term may cover
        offsets this log has since truncated and rewritten, which no slave of the new term holds.
        Waits still queued end as not replicated."""
        self.fail_all()
        self.acked = 0

    def fail_all(self) -> None:
        """Shutdown: no ack will come any more, so every wait ends now as not replicated (stored
        on this master, FLUSH_SLAVE_TIMEOUT, as when its deadline passes)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiters = self._waiters
        while waiters:
            waiters.popleft().resolve(_FLUSH_SLAVE_TIMEOUT)
