"""HAClient's epoch handshake against a concurrent promotion (POST /role).

The handshake adopts the master's epoch history in a thread, which a cancellation cannot stop.
ReplicationController._promote stops the client and then begins its own epoch; these tests drive
the real HAClient._reconcile and EpochStore through the interleavings that allows, with the
adopt thread held at its start.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmqbroker.ha.epoch import EpochChangedError, EpochEntry, EpochError, EpochStore
from rmqbroker.ha.slave import HAClient

E = EpochEntry

# Master X was promoted at epoch 3 at offset 1000 (the operator promoting this broker is stale).
ANSWER = json.dumps({"epoch": 3, "history": [{"epoch": 1, "startOffset": 0}, {"epoch": 3, "startOffset": 1000}],
                     "maxOffset": 1500}).encode()
MASTER = "127.0.0.1:1"


class _Store:
    """The part of MessageStore the handshake reads: a log that ends at the master's epoch 3 start."""

    def max_phy_offset(self) -> int:
        return 1000


class _HeldAdopt:
    """Wraps EpochStore.adopt so that its thread waits at the start until released."""

    def __init__(self, epochs: EpochStore) -> None:
        self.real = epochs.adopt
        self.entered = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def __call__(self, epoch: int, history: list[EpochEntry], *, seen: int | None = None,
                 log_id: str | None = None) -> None:
        self.entered.set()
        self.release.wait(10)
        try:
            self.real(epoch, history, seen=seen, log_id=log_id)
        finally:
            self.finished.set()

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 10), "adopt never started"


@pytest.fixture
def epochs(tmp_path: Path) -> EpochStore:
    store = EpochStore(tmp_path)
    store.adopt(1, [E(1, 0)])  # a slave that followed the epoch-1 master up to offset 1000
    return store


@pytest.fixture
def held(epochs: EpochStore) -> Iterator[_HeldAdopt]:
    hold = _HeldAdopt(epochs)
    epochs.adopt = hold  # type: ignore[method-assign]
    yield hold
    hold.release.set()


def _client(epochs: EpochStore) -> HAClient:
    return HAClient(_Store(), MASTER, epochs=epochs)  # type: ignore[arg-type]


async def test_stop_returns_only_after_the_adoption_in_flight(epochs: EpochStore, held: _HeldAdopt,
                                                               tmp_path: Path) -> None:
    """stop() during the adopt waits for its thread, so the promotion that follows is checked against
    the adopted epoch 3 and refused, as if the handshake had completed before POST /role."""
    client = _client(epochs)
    client._task = asyncio.get_running_loop().create_task(client._reconcile(ANSWER, MASTER))
    await held.wait_entered()
    stopping = asyncio.get_running_loop().create_task(client.stop())
    await asyncio.sleep(0.3)
    assert not stopping.done(), "stop() returned while the adopt thread was still running"
    held.release.set()
    await asyncio.wait_for(stopping, 10)
    assert held.finished.is_set()
    assert (epochs.epoch, epochs.history) == (3, [E(1, 0), E(3, 1000)])
    with pytest.raises(EpochError, match="must be newer"):
        await asyncio.to_thread(epochs.begin_epoch, 2, 1000)
    assert EpochStore(tmp_path).epoch == 3
    client.receiver_pool.shutdown(wait=False)


async def test_an_adoption_overtaken_by_a_promotion_is_refused(epochs: EpochStore, held: _HeldAdopt,
                                                               tmp_path: Path) -> None:
    """begin_epoch getting the epoch lock before the handshake's adopt: the adopt, decided on the
    state before the promotion, must not replace the promotion's history with the old master's
    (which check_not_older alone allows, the master's epoch 3 being newer than 2)."""
    client = _client(epochs)
    task = asyncio.get_running_loop().create_task(client._reconcile(ANSWER, MASTER))
    await held.wait_entered()
    await asyncio.to_thread(epochs.begin_epoch, 2, 1000)
    held.release.set()
    with pytest.raises(EpochChangedError):
        await asyncio.wait_for(task, 10)
    assert (epochs.epoch, epochs.own_epoch, epochs.history) == (2, 2, [E(1, 0), E(2, 1000)])
    reloaded = EpochStore(tmp_path)
    assert (reloaded.epoch, reloaded.history) == (2, [E(1, 0), E(2, 1000)])
    client.receiver_pool.shutdown(wait=False)
