"""Where a broker's log stops agreeing with a master's, from their epoch histories."""

from __future__ import annotations

from rmqbroker.ha.epoch import EpochEntry, divergence_offset

E = EpochEntry


def test_same_history_agrees_up_to_the_masters_end() -> None:
    assert divergence_offset([], [], 5000) == 5000
    assert divergence_offset([E(1, 100)], [E(1, 100)], 5000) == 5000


def test_master_moved_on_to_a_later_epoch() -> None:
    # This broker stayed in epoch 1; the master began epoch 2 at 3000.
    assert divergence_offset([E(1, 100)], [E(1, 100), E(2, 3000)], 9000) == 3000


def test_own_epoch_the_master_never_had_starts_earlier() -> None:
    # This broker was master in epoch 1 from 2000; the master of epoch 2 (from 3000) never saw it.
    # Bytes from 2000 on are epoch 1's, not the master's, though the master's epoch 2 starts later.
    assert divergence_offset([E(1, 2000)], [E(2, 3000)], 9000) == 2000


def test_own_epoch_the_master_never_had_starts_later() -> None:
    assert divergence_offset([E(1, 4000)], [E(2, 3000)], 9000) == 3000
    # ... and still ends at the master's end when the master has nothing after the shared epoch.
    assert divergence_offset([E(1, 100), E(3, 8000)], [E(1, 100)], 6000) == 6000
