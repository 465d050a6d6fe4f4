"""Stopping the slave's HA client and metadata sync right after they were re-pointed.

On Python 3.11 ``asyncio.wait_for`` returns normally when the task running it is cancelled in the
same loop passes as the awaited event fires, so the cancellation is lost: a task that waited for
its "master changed" event that way ran on after ``stop()`` cancelled it, and ``stop()`` (inside a
promotion or re-point, under the controller's lock) waited for it forever.
"""

from __future__ import annotations

import asyncio

import pytest

from rmqbroker.ha.metadata_sync import SlaveMetadataSync
from rmqbroker.ha.slave import HAClient

# Nothing listens here: connections are refused at once.
NOWHERE = "127.0.0.1:1"


class _Store:
    """The part of MessageStore an idle HA client reads."""

    def max_phy_offset(self) -> int:
        return 0

    def dispatch_behind(self) -> int:
        return 0


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _stops_after_repoint(subject: HAClient | SlaveMetadataSync, passes: int) -> bool:
    """Start ``subject``, re-point it and ``stop()`` it ``passes`` loop passes later: whether the stop
    returned (its tasks are cancelled again if not, so the test ends either way)."""
    subject.start()
    await _settle()
    tasks = [t for t in (getattr(subject, "_task", None), getattr(subject, "_reput_task", None)) if t is not None]
    subject.set_master(NOWHERE)
    for _ in range(passes):
        await asyncio.sleep(0)
    stopping = asyncio.ensure_future(subject.stop())
    done, _ = await asyncio.wait({stopping}, timeout=3)
    if not done:
        for task in tasks:
            task.cancel()
        await asyncio.wait({stopping}, timeout=3)
    return bool(done)


@pytest.mark.parametrize("passes", [0, 1, 2, 3])
async def test_ha_client_stops_when_cancelled_as_its_master_changes(passes: int) -> None:
    client = HAClient(_Store(), None)  # type: ignore[arg-type]
    stopped = await _stops_after_repoint(client, passes)
    client.receiver_pool.shutdown(wait=False)
    assert stopped, "stop() did not return: the client's task ran on after its cancellation"


@pytest.mark.parametrize("passes", [0, 1, 2, 3])
async def test_metadata_sync_stops_when_cancelled_as_its_master_changes(passes: int) -> None:
    sync = SlaveMetadataSync(None, "127.0.0.1:2", None, None, None, None,  # type: ignore[arg-type]
                             initial_delay=60, interval=60)
    assert await _stops_after_repoint(sync, passes), "stop() did not return: the task ran on after its cancellation"
