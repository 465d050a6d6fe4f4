"""Process runtime shared by the entry points: logging, event loop, signals, supervised tasks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


# A soft limit set to "unlimited" would make some libraries size tables by it: take this instead.
FD_LIMIT_CAP = 1 << 20
# Below this many descriptors even a modest broker can run out: warn at start.
FD_LIMIT_ADVISED = 4096


def raise_fd_limit() -> None:
    """Raise this process's soft open-files limit to its hard limit.

    A broker holds descriptors for every store file (consume queues, commitlog segments, index
    files) and every connection, far beyond the 1024 many shells start with; running out makes
    file creation and accept() fail. The hard limit is the administrator's decision, so only the
    soft one moves."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = FD_LIMIT_CAP if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
        else:
            log.info("open-files limit raised from %d to %d", soft, target)
            soft = target
    if soft != resource.RLIM_INFINITY and soft < FD_LIMIT_ADVISED:
        log.warning("open-files limit is %d (hard limit %s); store files and connections each take one: "
                    "raise the hard limit (ulimit -Hn, or the container runtime's nofile) to at least %d",
                    soft, "unlimited" if hard == resource.RLIM_INFINITY else hard, FD_LIMIT_ADVISED)


class Supervisor:
    """Owns a process's background tasks: failures are logged, never fatal; stop cancels all."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self.stopping = False

    def spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._guard(name, coro), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _guard(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background task %s died", name)

    def every(self, name: str, interval: float, fn: Callable[[], Awaitable[None]],
              initial_delay: float | None = None) -> asyncio.Task[None]:
        """Run ``fn`` periodically; an exception is logged and the next period runs anyway."""

        async def loop() -> None:
            await asyncio.sleep(interval if initial_delay is None else initial_delay)
            while not self.stopping:
                try:
                    await fn()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("periodic task %s failed; retrying next period", name)
                await asyncio.sleep(interval)

        return self.spawn(name, loop())

    async def stop(self) -> None:
        self.stopping = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def run_until_signal(main: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> None:
    """Run ``main(stop_event)`` on uvloop when available; SIGTERM/SIGINT set the event."""

    # Worker threads (fsync, metadata persistence, HA writes) hold the GIL in slices; a shorter
    # slice bounds how long the event loop waits for it, i.e. the tail of request latency.
    sys.setswitchinterval(0.001)

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await main(stop)

    try:
        import uvloop

        uvloop.run(runner())
    except ImportError:
        asyncio.run(runner())
