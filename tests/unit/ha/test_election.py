"""The promotion rule the operator and rmq-local share (rmqbroker.ha.election)."""

from __future__ import annotations

from rmqbroker.ha.election import IN_SYNC_MAX_LAG, Candidate, FailoverSpec, MasterRecord, choose, in_sync, next_epoch

SLAVES = ["s1", "s2"]


def record(connected: tuple[str, ...] = ("s1", "s2"), synced: tuple[str, ...] = ("s1", "s2"),
           offset: int = 1000) -> MasterRecord:
    return MasterRecord(True, frozenset(connected), frozenset(synced), offset)


def test_strict_picks_the_most_advanced_slave_of_the_epoch_lowest_rank_on_ties() -> None:
    live = [Candidate("s1", 1, 3, 900), Candidate("s2", 2, 3, 1000)]
    assert choose(live, SLAVES, 3, True, record()) == ("s2", "highest offset among in-sync slaves")
    tie = [Candidate("s2", 2, 3, 1000), Candidate("s1", 1, 3, 1000)]
    assert choose(tie, SLAVES, 3, True, record())[0] == "s1"


def test_strict_refuses_while_a_slave_that_followed_the_master_is_hidden() -> None:
    live = [Candidate("s1", 1, 3, 1000)]
    assert choose(live, SLAVES, 3, True, record()) == (
        None, "slave(s) s2 that followed the master cannot be reached")
    # A slave that was not connected to the master could not have acknowledged anything.
    assert choose(live, SLAVES, 3, True, record(connected=("s1",)))[0] == "s1"


def test_strict_refuses_a_lagging_best_slave_and_other_epochs() -> None:
    live = [Candidate("s1", 1, 3, 500), Candidate("s2", 2, 3, 400)]
    assert choose(live, SLAVES, 3, True, record(synced=())) == (
        None, "s1 (the most advanced slave) was lagging behind the master")
    old = [Candidate("s1", 1, 2, 1000), Candidate("s2", 2, 2, 1000)]
    assert choose(old, SLAVES, 3, True, record()) == (
        None, "no reachable slave is in the master's epoch 3 (spec.failover.allowDataLoss: true promotes the most "
              "advanced one anyway)")
    assert choose([], SLAVES, 3, True, record()) == (None, "no reachable slave")


def test_without_strictness_in_sync_slaves_come_first_then_any() -> None:
    live = [Candidate("s1", 1, 3, 1000), Candidate("s2", 2, 3, 2000)]
    assert choose(live, SLAVES, 3, False, record(synced=("s1",))) == ("s1", "highest offset among in-sync slaves")
    assert choose(live, SLAVES, 3, False, record(synced=())) == ("s2", "highest offset (no slave was in sync)")


def test_in_sync_next_epoch_and_strictness() -> None:
    assert in_sync(True, True, 3, 3, IN_SYNC_MAX_LAG)
    assert not in_sync(True, True, 3, 3, IN_SYNC_MAX_LAG + 1)
    assert not in_sync(False, True, 3, 3, 0) and not in_sync(True, False, 3, 3, 0) and not in_sync(True, True, 2, 3, 0)
    assert next_epoch(3, [1, 5, 2]) == 6 and next_epoch(3, []) == 4
    assert FailoverSpec().strict("SYNC") and not FailoverSpec(allow_data_loss=True).strict("SYNC")
    assert not FailoverSpec().strict("ASYNC")
