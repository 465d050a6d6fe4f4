"""Where a broker's log stops agreeing with a master's, from their epoch histories."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmqbroker.ha.epoch import (
    EpochChangedError,
    EpochEntry,
    EpochError,
    EpochStore,
    divergence_offset,
    other_logs,
    same_term,
)

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


def test_same_term_means_the_masters_current_epoch_is_this_brokers_latest() -> None:
    assert same_term([], [])
    assert same_term([E(2, 100)], [E(1, 0), E(2, 100)])
    assert not same_term([E(1, 0)], [E(1, 0), E(2, 100)])
    assert not same_term([], [E(1, 0)])


def test_only_the_broker_promoted_at_an_epoch_may_promote_again_at_it(tmp_path: Path) -> None:
    slave = EpochStore(tmp_path / "slave")
    slave.adopt(3, [E(3, 1000)])  # followed the broker promoted at 3
    with pytest.raises(EpochError, match="another broker's term"):
        slave.begin_epoch(3, 5000)
    assert slave.history == [E(3, 1000)]

    master = EpochStore(tmp_path / "master")
    master.begin_epoch(3, 1000)
    master.begin_epoch(3, 1000)  # a retry (lost answer, restart) is the same promotion
    assert master.history == [E(3, 1000)]
    reloaded = EpochStore(tmp_path / "master")
    assert reloaded.own_epoch == 3
    reloaded.begin_epoch(3, 4000)
    assert reloaded.history == [E(3, 1000)]  # the term began where it began


def test_a_late_adopt_cannot_undo_a_promotion(tmp_path: Path) -> None:
    store = EpochStore(tmp_path)
    store.adopt(1, [E(1, 0)])
    store.begin_epoch(2, 800)
    # The thread of a cancelled handshake with the old master of epoch 1 finishes afterwards.
    with pytest.raises(EpochError):
        store.adopt(1, [E(1, 0)])
    assert (store.epoch, store.history) == (2, [E(1, 0), E(2, 800)])
    # Nor does a second master of our own term get followed.
    with pytest.raises(EpochError, match="own term"):
        store.adopt(2, [E(1, 0), E(2, 900)])
    assert EpochStore(tmp_path).history == [E(1, 0), E(2, 800)]


def test_an_adopt_decided_before_a_promotion_is_refused_even_for_a_newer_master(tmp_path: Path) -> None:
    """A handshake adopts with the generation it read: a promotion that came in between wins, also
    when the master's epoch (3) is newer than the promotion's (2), which check_not_older lets by."""
    store = EpochStore(tmp_path)
    store.adopt(1, [E(1, 0)])
    seen = store.generation  # the handshake with a master of epoch 3 reads the state here
    store.begin_epoch(2, 1000)  # POST /role promotes this broker meanwhile
    with pytest.raises(EpochChangedError):
        store.adopt(3, [E(1, 0), E(3, 1000)], seen=seen)
    assert (store.epoch, store.history, store.own_epoch) == (2, [E(1, 0), E(2, 1000)], 2)
    assert EpochStore(tmp_path).history == [E(1, 0), E(2, 1000)]


def test_generation_moves_with_every_change_and_only_then(tmp_path: Path) -> None:
    """Each real change refuses adopts decided before it; repeating what is already there does not,
    so a slave re-handshaking with the same master is never refused."""
    store = EpochStore(tmp_path)
    seen = store.generation
    store.adopt(1, [E(1, 0)], seen=seen)
    assert store.generation > seen
    seen = store.generation
    store.adopt(1, [E(1, 0)], seen=seen)  # same master, same history
    store.set_epoch(1)
    assert store.generation == seen
    store.set_epoch(2)  # demoted at a newer epoch
    with pytest.raises(EpochChangedError):
        store.adopt(2, [E(1, 0), E(2, 500)], seen=seen)
    assert (store.epoch, store.history) == (2, [E(1, 0)])
    seen = store.generation
    store.adopt(2, [E(1, 0), E(2, 500)], seen=seen)
    store.begin_epoch(3, 900)
    assert store.generation == seen + 2


def test_promotion_of_a_slave_that_never_got_its_masters_last_term(tmp_path: Path) -> None:
    store = EpochStore(tmp_path)
    store.adopt(2, [E(1, 0), E(2, 5000)])  # the log here ends at 3000, before epoch 2 began
    store.begin_epoch(3, 3000)
    assert store.history == [E(1, 0), E(2, 3000), E(3, 3000)]
    assert EpochStore(tmp_path).history == store.history  # still a valid, readable history
    # A broker that followed epoch 2 to 7000 keeps epoch 1's bytes and cuts the rest.
    assert divergence_offset([E(1, 0), E(2, 5000)], store.history, 3500) == 3000


def test_a_fence_survives_a_restart_until_lifted_or_reached(tmp_path: Path) -> None:
    store = EpochStore(tmp_path)
    store.adopt(1, [E(1, 0)])
    store.fence_below(3)
    assert store.fenced
    # A restart before the failover re-points the slave: still fenced (its configured master may
    # be the hung old one).
    again = EpochStore(tmp_path)
    assert (again.epoch, again.fence, again.fenced) == (1, 3, True)
    again.unfence()
    assert not EpochStore(tmp_path).fenced
    # Reaching the fenced epoch (following the new master, or a demotion at it) lifts the fence.
    again.fence_below(2)
    again.adopt(2, [E(1, 0), E(2, 500)])
    reloaded = EpochStore(tmp_path)
    assert (reloaded.epoch, reloaded.fence, reloaded.fenced) == (2, 0, False)
    reloaded.fence_below(4)
    reloaded.set_epoch(3)
    assert EpochStore(tmp_path).fenced, "a demotion below the fence keeps it"
    reloaded.set_epoch(4)
    assert EpochStore(tmp_path).fence == 0
    # A lower fence than one in place changes nothing.
    reloaded.fence_below(6)
    reloaded.fence_below(5)
    assert EpochStore(tmp_path).fence == 6


def test_the_log_identity_is_drawn_once_by_a_master_and_taken_over_by_followers(tmp_path: Path) -> None:
    master = EpochStore(tmp_path / "m")
    assert master.log_id is None and "logId" not in master.to_json_obj()
    drawn = master.ensure_log_id(0)
    assert master.ensure_log_id(0) == drawn and master.to_json_obj()["logId"] == drawn
    assert EpochStore(tmp_path / "m").log_id == drawn  # persisted
    slave = EpochStore(tmp_path / "s")
    slave.adopt(0, [], log_id=drawn)
    assert EpochStore(tmp_path / "s").log_id == drawn
    slave.adopt(0, [])  # a master that does not tell (Java's, an older image) changes nothing
    assert slave.log_id == drawn
    # A promotion keeps the log's identity; a broker promoted without one draws it.
    slave.begin_epoch(1, 500)
    assert slave.log_id == drawn
    fresh = EpochStore(tmp_path / "f")
    fresh.begin_epoch(1, 0)
    assert fresh.log_id not in (None, drawn)
    # Replaced volumes draw another: the identities of two logs begun apart differ.
    replaced = EpochStore(tmp_path / "m2").ensure_log_id(0)
    assert other_logs(replaced, drawn) and not other_logs(drawn, drawn)
    # Drawn for a log that held bytes already (a store from before identities): another broker of
    # that log may have drawn its own, so it proves nothing.
    upgraded = EpochStore(tmp_path / "u").ensure_log_id(4096)
    assert upgraded.endswith("@4096") and not other_logs(upgraded, drawn) and not other_logs(drawn, upgraded)
    assert not other_logs(None, drawn)
    promoted = EpochStore(tmp_path / "p")
    promoted.begin_epoch(2, 800)
    assert promoted.log_id is not None and promoted.log_id.endswith("@800")
