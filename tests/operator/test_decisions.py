"""Pure decision logic: role assignment, failover candidate choice, alignment actions, rolling order, status."""

from __future__ import annotations

import dataclasses
from typing import Any

from rmqbroker.ha.election import FailoverSpec
from rmqoperator.failover import (
    REPOINT_GRACE_SECONDS,
    BrokerView,
    MasterMemory,
    PodView,
    after_fencing,
    choose_candidate,
    decide_failover,
    demoted_master,
    fence_targets,
    first_term,
    handover_candidate,
    lone_master_restart,
    lost_data,
    observe,
    plan_alignment,
    reported_master,
    serves_again,
    switchover_check,
    term_owner,
)
from rmqoperator.reconcile import GroupState, complete_assignment, statefulset_replicas
from rmqoperator.rolling import next_restart
from rmqoperator.spec import GroupSpec
from rmqoperator.status import Health, conditions, merge_conditions, replica_rows, summary

SPEC = GroupSpec(name="g", namespace="ns", uid="u", broker_name="g", replicas=3, replication="SYNC",
                 failover=FailoverSpec(enabled=True, master_lost_seconds=5))
STATE = GroupState(assignment={0: 0, 1: 1, 2: 2}, epoch=3)
DNS0 = "g-0.g-headless.ns.svc:10912"


def master(offset: int = 1000, role: str = "SYNC_MASTER", epoch: int = 3, ip: str = "10.0.0.10",
           slaves: int = 2, name: str = "g-0", hash_: str = "h") -> PodView:
    return PodView(name, int(name[-1]), ip, True, config_hash=hash_,
                   broker=BrokerView(role, 0, epoch, offset, connected_slaves=slaves))


def slave(ordinal: int, offset: int = 1000, follows: str | None = DNS0, connected: bool = True, epoch: int = 3,
          broker_id: int | None = None, ready: bool = True, hash_: str = "h") -> PodView:
    return PodView(f"g-{ordinal}", ordinal, f"10.0.0.{10 + ordinal}", ready, config_hash=hash_,
                   broker=BrokerView("SLAVE", ordinal if broker_id is None else broker_id, epoch, offset,
                                     ha_master=follows, ha_connected=connected))


def with_broker(p: PodView, **changes: Any) -> PodView:
    """``p`` with its broker's status changed."""
    assert p.broker is not None
    return dataclasses.replace(p, broker=dataclasses.replace(p.broker, **changes))


def down(p: PodView) -> PodView:
    return dataclasses.replace(p, broker=None, ready=False)


def healthy_then_lost(spec: GroupSpec, before: dict[str, PodView], after: dict[str, PodView],
                      lost_for: float) -> Any:
    mem = MasterMemory()
    observe(mem, spec, "g-0", before, 100.0)
    observe(mem, spec, "g-0", after, 101.0)
    return decide_failover(spec, STATE, after, mem, 101.0 + lost_for), mem


def pods(*views: PodView) -> dict[str, PodView]:
    return {v.name: v for v in views}


# ---------------------------------------------------------------- assignment
def test_assignment_fills_new_ordinals_and_keeps_runtime_ids() -> None:
    assert complete_assignment({}, 3) == {0: 0, 1: 1, 2: 2}
    assert complete_assignment({0: 1, 1: 0, 2: 2}, 5) == {0: 1, 1: 0, 2: 2, 3: 3, 4: 4}
    assert complete_assignment({0: 0, 1: 1, 2: 2}, 2) == {0: 0, 1: 1}
    assert complete_assignment({0: 2, 1: 1, 2: 0}, 3) == {0: 2, 1: 1, 2: 0}


def test_scale_down_never_removes_the_master() -> None:
    state = GroupState(assignment={0: 1, 1: 2, 2: 0})
    n, note = statefulset_replicas(1, state)
    assert n == 3 and note and "ordinal 2" in note
    assert statefulset_replicas(2, GroupState(assignment={0: 1, 1: 0, 2: 2})) == (2, None)


def test_promotion_swaps_ids_and_queues_the_old_master() -> None:
    after = STATE.promoted(SPEC, 2, 4)
    assert after.assignment == {0: 2, 1: 1, 2: 0} and after.epoch == 4
    assert after.pending_demotion == ("g-0",) and after.master_pod(SPEC) == "g-2"
    assert GroupState.from_status(after.to_status(SPEC)) == after
    assert after.demoted("g-0").pending_demotion == ()


# ---------------------------------------------------------------- failover
def test_no_failover_while_master_healthy_or_not_yet_lost_long_enough() -> None:
    before = pods(master(), slave(1), slave(2))
    mem = MasterMemory()
    observe(mem, SPEC, "g-0", before, 1.0)
    assert decide_failover(SPEC, STATE, before, mem, 1.0).action == "none"
    d, _ = healthy_then_lost(SPEC, before, pods(down(master()), slave(1), slave(2)), lost_for=4.0)
    assert (d.action, d.reason) == ("wait", "MasterLost")


def test_promotes_the_in_sync_slave_with_the_highest_offset() -> None:
    before = pods(master(2000), slave(1, 1990), slave(2, 2000))
    d, _ = healthy_then_lost(SPEC, before, pods(down(master()), slave(1, 1990, connected=False),
                                                slave(2, 2000, connected=False)), lost_for=5.0)
    assert (d.action, d.candidate, d.epoch) == ("promote", "g-2", 4)


def test_the_choice_after_fencing_uses_the_final_offsets_and_refuses_an_unfenced_slave() -> None:
    before = pods(master(2000), slave(1, 2000), slave(2, 1990))
    after = pods(down(master()), slave(1, 2000, connected=False), slave(2, 1990, connected=False))
    d, mem = healthy_then_lost(SPEC, before, after, lost_for=5.0)
    assert (d.action, d.candidate) == ("promote", "g-1")
    assert fence_targets(after, "g-0") == ["g-1", "g-2"]
    # The hung master got one more ack from g-2 before the fence: g-2 now holds the most.
    fenced = after_fencing(after, "g-0", {"g-1": 2000, "g-2": 2100})
    assert choose_candidate(SPEC, STATE, "g-0", fenced, mem) == ("g-2", "highest offset among in-sync slaves")
    # A slave that could not be fenced may still acknowledge the old master: no SYNC promotion.
    unfenced = after_fencing(after, "g-0", {"g-1": 2000})
    assert unfenced["g-2"].broker is None
    candidate, why = choose_candidate(SPEC, STATE, "g-0", unfenced, mem)
    assert candidate is None and "g-2" in why


def test_a_fenced_slave_is_re_pointed_when_the_master_stays() -> None:
    fenced = dataclasses.replace(slave(1), broker=dataclasses.replace(slave(1).broker, fenced=True))  # type: ignore[type-var]
    actions = plan_alignment(SPEC, STATE, pods(master(), fenced, slave(2)), MasterMemory(), 100.0)
    assert [(a.kind, a.pod) for a in actions] == [("repoint", "g-1")]


def test_sync_refuses_when_a_slave_that_followed_the_master_is_unreachable() -> None:
    before = pods(master(2000), slave(1, 2000), slave(2, 1500))
    d, _ = healthy_then_lost(SPEC, before, pods(down(master()), down(slave(1)), slave(2, 1500)), lost_for=6)
    assert (d.action, d.reason) == ("blocked", "NoSafeCandidate")
    assert "g-1" in d.message


def test_sync_never_promotes_a_lagging_slave_unless_data_loss_is_allowed() -> None:
    before = pods(master(50_000_000), slave(1, 100, connected=False, follows=None), slave(2, 90))
    after = pods(down(master()), slave(1, 100, connected=False, follows=None), slave(2, 90))
    d, _ = healthy_then_lost(SPEC, before, after, lost_for=6)
    assert d.action == "blocked" and "lagging" in d.message
    lossy = dataclasses.replace(SPEC, failover=FailoverSpec(True, 5, allow_data_loss=True))
    d, _ = healthy_then_lost(lossy, before, after, lost_for=6)
    assert (d.action, d.candidate) == ("promote", "g-1")


def test_async_prefers_in_sync_slaves_then_highest_offset() -> None:
    spec = dataclasses.replace(SPEC, replication="ASYNC")
    before = pods(master(50_000_000, role="ASYNC_MASTER"), slave(1, 100, follows=None), slave(2, 49_000_000))
    after = pods(down(master()), slave(1, 100, follows=None), slave(2, 49_000_000))
    d, _ = healthy_then_lost(spec, before, after, lost_for=6)
    assert (d.action, d.candidate) == ("promote", "g-2")


def test_failover_disabled_and_new_group_starting() -> None:
    off = dataclasses.replace(SPEC, failover=FailoverSpec(enabled=False))
    d, _ = healthy_then_lost(off, pods(master(), slave(1)), pods(down(master()), slave(1)), lost_for=100)
    assert (d.action, d.reason) == ("blocked", "FailoverDisabled")
    mem = MasterMemory()
    never = pods(down(master()), slave(1, offset=0, epoch=0))  # a new group: no data, no failover yet
    observe(mem, SPEC, "g-0", never, 0.0)
    assert decide_failover(SPEC, STATE, never, mem, 1000.0).reason == "MasterStarting"
    mem.served_before = True  # an operator restarted while the master was down
    assert decide_failover(SPEC, STATE, never, mem, 1000.0).action in ("promote", "blocked")


# ---------------------------------------------------------------- alignment
def test_returning_old_master_is_demoted_repointed_and_master_re_registers() -> None:
    state = STATE.promoted(SPEC, 1, 4)  # g-1 is master now, g-0 holds brokerId 1
    views = pods(master(role="SYNC_MASTER", epoch=3, ip="10.0.0.10", name="g-0"),
                 PodView("g-1", 1, "10.0.0.11", True, broker=BrokerView("SYNC_MASTER", 0, 4, 5000)),
                 slave(2, follows="10.0.0.11:10912", epoch=4))
    mem = MasterMemory()
    observe(mem, SPEC, "g-1", views, 1.0)
    actions = plan_alignment(SPEC, state, views, mem, 1.0)
    kinds = [(a.kind, a.pod) for a in actions]
    assert kinds == [("demote", "g-0"), ("repoint", "g-0"), ("set_mode", "g-1")]
    demote, repoint = actions[0], actions[1]
    assert (demote.role, demote.broker_id, demote.epoch) == ("SLAVE", 1, 4)
    assert (repoint.ha_address, repoint.broker_address) == ("10.0.0.11:10912", "10.0.0.11:10911")


def test_repoint_only_slaves_not_following_the_current_master() -> None:
    views = pods(master(ip="10.0.0.99"), slave(1, follows=DNS0), slave(2, follows="10.0.0.10:10912"))
    mem = MasterMemory()
    observe(mem, SPEC, "g-0", views, 1.0)
    actions = plan_alignment(SPEC, STATE, views, mem, 1.0)
    assert [(a.kind, a.pod, a.ha_address) for a in actions] == [("repoint", "g-2", "10.0.0.99:10912")]


def test_master_mode_follows_spec_replication() -> None:
    views = pods(master(role="ASYNC_MASTER"), slave(1), slave(2))
    mem = MasterMemory()
    observe(mem, SPEC, "g-0", views, 1.0)
    [action] = plan_alignment(SPEC, STATE, views, mem, 1.0)
    assert (action.kind, action.role, action.epoch) == ("set_mode", "SYNC_MASTER", 3)


def test_unreachable_slave_is_deleted_only_after_the_grace_and_when_not_following() -> None:
    state = STATE.promoted(SPEC, 1, 4)
    new_master = PodView("g-1", 1, "10.0.0.11", True, broker=BrokerView("SYNC_MASTER", 0, 4, 5000))
    views = pods(down(master()), new_master, dataclasses.replace(down(slave(2)), ready=True))
    mem = MasterMemory()
    observe(mem, SPEC, "g-1", views, 10.0)
    assert plan_alignment(SPEC, state, views, mem, 10.0 + REPOINT_GRACE_SECONDS - 1) == []
    actions = plan_alignment(SPEC, state, views, mem, 10.0 + REPOINT_GRACE_SECONDS)
    assert sorted(a.pod for a in actions if a.kind == "delete_pod") == ["g-0", "g-2"]
    mem.following["g-2"] = "g-1"  # it did follow the new master before going away: leave it to the kubelet
    actions = plan_alignment(SPEC, state, views, mem, 10.0 + REPOINT_GRACE_SECONDS)
    assert [a.pod for a in actions if a.kind == "delete_pod"] == ["g-0"]
    # A container still in its startup window (recovering its store) is left to its startup probe.
    starting = {**views, "g-0": dataclasses.replace(views["g-0"], started=False)}
    actions = plan_alignment(SPEC, state, starting, mem, 10.0 + REPOINT_GRACE_SECONDS)
    assert [a.pod for a in actions if a.kind == "delete_pod"] == []


# ---------------------------------------------------------------- rolling
def test_rolling_order_slaves_highest_first_master_last_one_at_a_time() -> None:
    views = pods(master(hash_="old"), slave(1, hash_="old"), slave(2, hash_="old"))
    in_sync = frozenset({"g-1", "g-2"})
    step = next_restart(views, "new", "g-0", 3, in_sync)
    assert (step.pod, step.pending) == ("g-2", ("g-2", "g-1", "g-0"))
    views["g-2"] = slave(2, hash_="new", ready=False)
    assert next_restart(views, "new", "g-0", 3, in_sync).reason == "WaitingForReady"
    views["g-2"] = slave(2, hash_="new")
    assert next_restart(views, "new", "g-0", 3, frozenset({"g-1"})).reason == "WaitingForCatchUp"
    assert next_restart(views, "new", "g-0", 3, in_sync).pod == "g-1"
    views["g-1"] = slave(1, hash_="new")
    assert next_restart(views, "new", "g-0", 3, in_sync).pod == "g-0"
    # Handed over moments ago, the old master relays clients' sends until their routes are re-read.
    every = frozenset({"g-0", "g-1", "g-2"})
    assert next_restart(views, "new", "g-1", 3, every, settling=frozenset({"g-0"})).reason == "WaitingForClientRoutes"
    assert next_restart(views, "new", "g-1", 3, every, settling=frozenset({"g-2"})).pod == "g-0"
    views["g-0"] = master(hash_="new")
    assert next_restart(views, "new", "g-0", 3, in_sync).reason == "UpToDate"
    del views["g-1"]
    views["g-0"] = master(hash_="old")
    assert next_restart(views, "new", "g-0", 3, in_sync).reason == "WaitingForPod"


def test_a_planned_master_restart_hands_over_to_the_most_advanced_in_sync_slave() -> None:
    views = pods(master(offset=5000), slave(1, offset=4900), slave(2, offset=5000))
    assert handover_candidate(SPEC, STATE, views) == "g-2"
    views["g-2"] = slave(2, offset=4900)
    assert handover_candidate(SPEC, STATE, views) == "g-1"  # a tie: the lowest ordinal
    # Only a slave the master's drain can complete: following it, connected, in its epoch, in sync.
    for unfit in (slave(1, offset=5000 - 5 * 1024 * 1024), slave(1, follows="10.9.9.9:10912"),
                  slave(1, connected=False), slave(1, epoch=2), slave(1, ready=False),
                  down(slave(1)), dataclasses.replace(slave(1), deleting=True)):
        views = pods(master(offset=5000), unfit, slave(2, offset=4000))
        assert handover_candidate(SPEC, STATE, views) == "g-2", unfit
        views = pods(master(offset=5000), unfit)
        assert handover_candidate(SPEC, STATE, views) is None, unfit
    views = pods(master(), slave(1), slave(2))
    # No hand-over with failover disabled (the master stays where the user keeps it) or no master.
    no_failover = dataclasses.replace(SPEC, failover=FailoverSpec(enabled=False))
    assert handover_candidate(no_failover, STATE, views) is None
    assert handover_candidate(SPEC, STATE, {**views, "g-0": down(master())}) is None
    # A slave outside the assignment (scaled away) is not a candidate.
    assert handover_candidate(SPEC, GroupState(assignment={0: 0, 1: 1}, epoch=3), pods(master(), slave(2))) is None


def test_a_master_left_a_slave_of_nobody_resumes_only_when_nothing_else_serves() -> None:
    demoted = slave(0, 5000, follows=None, connected=False, broker_id=1)
    views = pods(demoted, slave(1, 5000, connected=False), slave(2, 4000, connected=False))
    assert demoted_master(SPEC, STATE, views) == 4
    for unfit in (with_broker(demoted, fenced=True), with_broker(demoted, ha_connected=True),
                  with_broker(demoted, epoch=2), down(demoted), dataclasses.replace(demoted, deleting=True)):
        assert demoted_master(SPEC, STATE, {**views, "g-0": unfit}) is None, unfit
    assert demoted_master(SPEC, STATE, {**views, "g-1": master(name="g-1")}) is None  # another master serves
    assert demoted_master(SPEC, STATE, {**views, "g-2": slave(2, epoch=5)}) is None  # a later term exists
    assert demoted_master(SPEC, STATE, pods(master(), slave(1), slave(2))) is None  # it is master


def test_a_requested_switchover_goes_only_to_an_in_sync_slave_of_the_group() -> None:
    views = pods(master(offset=5000), slave(1, offset=5000), slave(2, offset=5000, connected=False))
    assert switchover_check(SPEC, STATE, views, "g-1")[0] == "go"
    assert switchover_check(SPEC, STATE, views, "g-0") == ("done", "g-0 is the master")
    assert switchover_check(SPEC, STATE, views, "g-7")[0] == "refuse"
    assert switchover_check(SPEC, STATE, views, "other-1")[0] == "refuse"
    assert switchover_check(SPEC, STATE, views, "g-2")[0] == "wait"  # not connected: not in sync
    assert switchover_check(SPEC, STATE, {**views, "g-0": down(master())}, "g-1")[0] == "wait"


def test_an_outdated_pod_that_is_down_anyway_is_replaced_first() -> None:
    in_sync = frozenset({"g-1", "g-2"})
    broken = pods(master(hash_="old"), slave(1, hash_="old"), down(slave(2, hash_="bad")))
    assert next_restart(broken, "new", "g-0", 3, in_sync).reason == "WaitingForReady"  # a blip, maybe
    step = next_restart(broken, "new", "g-0", 3, in_sync, stuck=frozenset({"g-2"}))
    assert (step.pod, step.reason) == ("g-2", "ReplacingUnavailable")
    # Another pod down too: nothing is restarted (that would take a second one away) ...
    two_down = {**broken, "g-1": down(slave(1, hash_="new"))}
    assert next_restart(two_down, "new", "g-0", 3, in_sync, stuck=frozenset({"g-1", "g-2"})).reason == \
        "WaitingForReady"
    # ... unless the group never served: then every outdated pod that is down is replaced in turn.
    all_down = pods(down(master(hash_="bad")), down(slave(1, hash_="bad")), down(slave(2, hash_="bad")))
    assert next_restart(all_down, "new", "g-0", 3, in_sync).reason == "WaitingForReady"
    assert next_restart(all_down, "new", "g-0", 3, in_sync, new_group=True).pod == "g-2"
    # A pod down that is already up to date (restarting) is waited for.
    starting = pods(master(hash_="old"), slave(1, hash_="old"), down(slave(2, hash_="new")))
    assert next_restart(starting, "new", "g-0", 3, in_sync, stuck=frozenset({"g-2"})).reason == "WaitingForReady"


# ---------------------------------------------------------------- status
def test_conditions_and_rows() -> None:
    views = pods(master(2000, ip="10.0.0.10"), slave(1, 2000), slave(2, 1000, connected=False))
    rows = replica_rows(SPEC, STATE, views)
    assert [(r["pod"], r["brokerId"], r["role"], r.get("lagBytes"), r["inSync"]) for r in rows] == [
        ("g-0", 0, "SYNC_MASTER", 0, True), ("g-1", 1, "SLAVE", 0, True), ("g-2", 2, "SLAVE", 1000, False)]
    assert summary(rows, "g-0") == {"readyReplicas": 3, "inSyncReplicas": 2, "maxLagBytes": 1000}
    conds = {c.type: c for c in conditions(SPEC, STATE, rows, Health())}
    assert (conds["Ready"].status, conds["Ready"].reason) == (True, "Available")
    assert (conds["Replicating"].status, conds["Replicating"].reason) == (False, "SlavesLagging")
    assert conds["Degraded"].status is True and conds["FailingOver"].status is False
    invalid = {c.type: c for c in conditions(SPEC, STATE, rows, Health(invalid="bad"))}
    assert (invalid["Ready"].status, invalid["Ready"].reason) == (False, "InvalidSpec")


def test_a_slave_holding_what_the_master_lost_degrades_the_group() -> None:
    behind = with_broker(slave(1, 5000, connected=False), ha_connected=False, ahead_of_master=3000)
    views = pods(master(2000), behind, slave(2, 2000))
    rows = replica_rows(SPEC, STATE, views)
    assert rows[1]["aheadOfMasterBytes"] == 3000 and "aheadOfMasterBytes" not in rows[2]
    conds = {c.type: c for c in conditions(SPEC, STATE, rows, Health())}
    assert (conds["Degraded"].status, conds["Degraded"].reason) == (True, "MasterBehindSlave")
    assert "g-1 (3000 bytes)" in conds["Degraded"].message
    assert BrokerView.from_status({"role": "SLAVE", "ha": {"aheadOfMasterBytes": 7}}).ahead_of_master == 7


def test_a_master_back_without_its_store_is_replaced_at_once() -> None:
    before = pods(master(5000), slave(1, 5000), slave(2, 4000))
    mem = MasterMemory()
    observe(mem, SPEC, "g-0", before, 100.0)
    assert lost_data(SPEC, STATE, before) is None
    # Its volume was replaced while it was down: back as master within masterLostSeconds, at
    # epoch 0 with an empty log, and the slaves (not yet aware) still point at it.
    wiped = pods(master(0, epoch=0), slave(1, 5000), slave(2, 4000))
    why = lost_data(SPEC, STATE, wiped)
    assert why is not None and "epoch 0, older than the group's 3" in why
    observe(mem, SPEC, "g-0", wiped, 101.0, lost=True)
    assert mem.lost_since == 101.0 and mem.in_sync == frozenset({"g-1", "g-2"})  # what it was seen with
    d = decide_failover(SPEC, STATE, wiped, mem, 101.0)  # not masterLostSeconds (5) later: now
    assert (d.action, d.candidate, d.epoch, d.master_lost_data) == ("promote", "g-1", 4, True)
    assert "lost its store" in d.message
    # No slave is re-pointed to it meanwhile, and no hand-over or switchover goes to it.
    assert plan_alignment(SPEC, STATE, wiped, mem, 101.0) == []
    assert handover_candidate(SPEC, STATE, wiped) is None
    assert switchover_check(SPEC, STATE, wiped, "g-1")[0] == "wait"
    # In the group's epoch but short of what a slave pointed at it holds (an older disk, a group
    # that never failed over): the same, once a slave reports the bytes it refuses to drop.
    short = pods(master(1000), with_broker(slave(1, 5000), ha_connected=False, ahead_of_master=4000),
                 slave(2, 1000))
    why = lost_data(SPEC, STATE, short)
    assert why is not None and "g-1 (4000 bytes)" in why
    assert decide_failover(SPEC, STATE, short, mem, 101.0).candidate == "g-1"
    # A slave's report about another master (it has not handshaken with this one yet) says nothing.
    elsewhere = pods(master(1000), with_broker(slave(1, 5000), ha_master="10.9.9.9:10912", ahead_of_master=4000),
                     slave(2, 1000))
    assert lost_data(SPEC, STATE, elsewhere) is None
    # With failover disabled it is reported, not replaced.
    off = dataclasses.replace(SPEC, failover=FailoverSpec(enabled=False))
    d = decide_failover(off, STATE, wiped, mem, 101.0)
    assert (d.action, d.reason) == ("blocked", "FailoverDisabled") and "lost its store" in d.message
    # An unchanged master is not touched.
    assert decide_failover(SPEC, STATE, before, MasterMemory(), 101.0).action == "none"


def test_every_store_lost_blocks_a_sync_failover_until_data_loss_is_allowed() -> None:
    """Every broker back on an empty volume: no slave holds what the master acknowledged, so the
    SYNC rule refuses and says how to start over; with allowDataLoss the most advanced is promoted."""
    before = pods(master(5000), slave(1, 5000), slave(2, 5000))
    mem = MasterMemory()
    observe(mem, SPEC, "g-0", before, 100.0)
    wiped = pods(master(0, epoch=0), slave(1, 0, epoch=0), slave(2, 300, epoch=0, connected=False))
    observe(mem, SPEC, "g-0", wiped, 101.0, lost=True)
    d = decide_failover(SPEC, STATE, wiped, mem, 101.0)
    assert (d.action, d.reason) == ("blocked", "NoSafeCandidate"), d
    assert "no reachable slave is in the master's epoch 3" in d.message
    assert "spec.failover.allowDataLoss: true" in d.message
    lossy = dataclasses.replace(SPEC, failover=FailoverSpec(enabled=True, master_lost_seconds=5, allow_data_loss=True))
    d = decide_failover(lossy, STATE, wiped, mem, 101.0)
    assert (d.action, d.candidate, d.epoch) == ("promote", "g-2", 4), d


def test_a_group_of_one_goes_on_with_an_empty_log_when_its_broker_lost_its_store() -> None:
    """Nobody holds the log of a group of one whose broker lost its store, and nobody can replace
    it: it begins a new epoch on what it has instead of refusing writes for ever."""
    one = dataclasses.replace(SPEC, replicas=1, replication="ASYNC")
    state = GroupState(assignment={0: 0}, epoch=3)
    assert lone_master_restart(one, state, pods(master(5000, role="ASYNC_MASTER", slaves=0))) is None
    wiped = pods(with_broker(master(0, role="ASYNC_MASTER", epoch=0, slaves=0), term_fenced=True))
    found = lone_master_restart(one, state, wiped)
    assert found is not None and found[0] == 4 and "epoch 0, older than the group's 3" in found[1]
    # Any other broker of the group still answering (a scale-down to one under way) may hold the log.
    assert lone_master_restart(one, state, {**wiped, **pods(slave(1, 5000))}) is None
    # A group with slaves replaces such a master by the election instead.
    assert lone_master_restart(SPEC, state, {**wiped, **pods(slave(1, 5000), slave(2, 5000))}) is None


def test_a_master_serving_another_log_than_it_did_is_replaced_before_its_slaves_notice() -> None:
    """A group that never failed over (epoch 0): a master back on a replaced volume is in the
    group's epoch, and its slaves say nothing until their next handshake, while it takes sends
    (stored even when they fail for want of a slave) and could grow past them. Its new log
    identity gives it away on the first poll, before what was seen of it changes."""
    state0 = GroupState(assignment={0: 0, 1: 1, 2: 2}, epoch=0)
    before = pods(with_broker(master(5000, epoch=0), log_id="L1"), slave(1, 5000, epoch=0), slave(2, 5000, epoch=0))
    mem = MasterMemory()
    observe(mem, SPEC, "g-0", before, 100.0)
    assert mem.master_log_id == "L1" and lost_data(SPEC, state0, before, mem) is None
    replaced = pods(with_broker(master(9000, epoch=0), log_id="L2"), slave(1, 5000, epoch=0), slave(2, 5000, epoch=0))
    why = lost_data(SPEC, state0, replaced, mem)
    assert why is not None and "serves log L2, not the log L1" in why
    observe(mem, SPEC, "g-0", replaced, 101.0, lost=True)
    assert (mem.master_offset, mem.master_log_id, mem.in_sync) == (5000, "L1", frozenset({"g-1", "g-2"}))
    d = decide_failover(SPEC, state0, replaced, mem, 101.0)
    assert (d.action, d.candidate, d.master_lost_data) == ("promote", "g-1", True), d
    assert plan_alignment(SPEC, state0, replaced, mem, 101.0) == []
    # A master that had no identity before (an image from before them) and draws one is the same log.
    old_image = MasterMemory()
    observe(old_image, SPEC, "g-0", pods(master(5000, epoch=0), slave(1, 5000, epoch=0)), 100.0)
    assert lost_data(SPEC, state0, replaced, old_image) is None
    assert BrokerView.from_status({"role": "SYNC_MASTER", "logId": "L9"}).log_id == "L9"


def test_a_new_groups_master_begins_epoch_1_once_it_serves() -> None:
    state0 = GroupState(assignment={0: 0, 1: 1, 2: 2}, epoch=0)
    serving = pods(with_broker(master(0, epoch=0), log_id="L1"), slave(1, 0, epoch=0), slave(2, 0, epoch=0))
    assert first_term(SPEC, state0, serving)
    assert not first_term(SPEC, STATE, serving)  # the group has an epoch already
    old_image = pods(master(0, epoch=0), slave(1, 0, epoch=0))  # no logId: it would not read haGroupEpoch
    assert not first_term(SPEC, state0, old_image)
    assert not first_term(SPEC, state0, pods(down(master(0, epoch=0)), slave(1, 0, epoch=0)))
    fenced = pods(with_broker(master(0, epoch=0), log_id="L1", term_fenced=True), slave(1, 0, epoch=0))
    assert not first_term(SPEC, state0, fenced)
    behind = pods(with_broker(master(0, epoch=0), log_id="L1"),
                  with_broker(slave(1, 900, epoch=0), ahead_of_master=900))
    assert not first_term(SPEC, state0, behind)  # replaced, not confirmed in an epoch of its own


def test_a_full_disk_is_reported_and_a_full_master_makes_the_group_unready() -> None:
    def full(p: PodView, ratio: float) -> PodView:
        assert p.broker is not None
        return dataclasses.replace(p, broker=dataclasses.replace(p.broker, disk_used_ratio=ratio, disk_full=True))

    views = pods(dataclasses.replace(master(2000), broker=BrokerView.from_status(
        {"role": "SYNC_MASTER", "brokerId": 0, "epoch": 3, "maxPhyOffset": 2000, "ha": {"slaves": [{}, {}]},
         "retention": {"diskUsedRatio": 0.42, "diskFull": False}})), full(slave(1, 2000), 0.934), slave(2, 2000))
    rows = replica_rows(SPEC, STATE, views)
    assert rows[0]["diskUsedPercent"] == 42.0 and "diskFull" not in rows[0]
    assert rows[1]["diskUsedPercent"] == 93.4 and rows[1]["diskFull"] is True
    assert "diskUsedPercent" not in rows[2]  # a broker that reports no measurement
    conds = {c.type: c for c in conditions(SPEC, STATE, rows, Health())}
    assert (conds["Ready"].status, conds["Ready"].reason) == (True, "Available")
    assert (conds["Degraded"].status, conds["Degraded"].reason) == (True, "DiskFull")
    assert "g-1 (93.4% used)" in conds["Degraded"].message

    views = pods(full(master(2000), 0.95), slave(1, 2000), slave(2, 2000))
    conds = {c.type: c for c in conditions(SPEC, STATE, replica_rows(SPEC, STATE, views), Health())}
    assert (conds["Ready"].status, conds["Ready"].reason) == (False, "DiskFull")
    assert (conds["Degraded"].status, conds["Degraded"].reason) == (True, "DiskFull")


def test_a_pod_the_scheduler_cannot_place_is_reported_with_its_reason() -> None:
    from rmqoperator.controller import pod_view

    reason = "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."
    pending = {"metadata": {"name": "g-2"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": reason}]}}
    view = pod_view(pending, None)
    assert (view.unschedulable, view.ready, view.ip) == (reason, False, None)
    scheduled = {"metadata": {"name": "g-2"}, "status": {"conditions": [
        {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}]}}
    assert pod_view(scheduled, None).unschedulable is None

    rows = replica_rows(SPEC, STATE, pods(master(2000), slave(1, 2000), view))
    assert rows[2]["unschedulable"] == reason and "unschedulable" not in rows[1]
    conds = {c.type: c for c in conditions(SPEC, STATE, rows, Health())}
    assert (conds["Degraded"].status, conds["Degraded"].reason) == (True, "Unschedulable")
    assert f"not ready: g-2 (unschedulable: {reason})" in conds["Degraded"].message
    # Merely not ready (e.g. starting) stays ReplicasNotReady.
    rows = replica_rows(SPEC, STATE, pods(master(2000), slave(1, 2000), down(slave(2, 2000))))
    conds = {c.type: c for c in conditions(SPEC, STATE, rows, Health())}
    assert conds["Degraded"].reason == "ReplicasNotReady" and "unschedulable" not in conds["Degraded"].message


def test_last_transition_time_kept_while_status_unchanged() -> None:
    from rmqoperator.status import Cond

    first = merge_conditions(None, [Cond("Ready", True, "Available")], 1, "t1")
    again = merge_conditions([*first, {"type": "ReplicasVerified", "status": "True"}],
                             [Cond("Ready", True, "Available", "other message")], 2, "t2")
    assert again[0]["lastTransitionTime"] == "t1" and again[0]["observedGeneration"] == 2
    assert again[1] == {"type": "ReplicasVerified", "status": "True"}
    flipped = merge_conditions(again, [Cond("Ready", False, "MasterUnavailable")], 2, "t3")
    assert flipped[0]["lastTransitionTime"] == "t3"


# ---------------------------------------------------------------- storage
def test_storage_quantities_and_which_claims_grow() -> None:
    from rmqoperator.reconcile import volume_resizes
    from rmqoperator.spec import problems, quantity_bytes

    assert quantity_bytes("10Gi") == 10 * 2**30 and quantity_bytes("1.5Ti") == 3 * 2**39
    assert quantity_bytes("500M") == 500 * 10**6 and quantity_bytes("1024") == 1024
    assert quantity_bytes("0.5k") == 500
    for bad in ("10GB", "ten", "", "1e9", "-1Gi"):
        assert quantity_bytes(bad) is None, bad
    claims = {"data-g-0": "10Gi", "data-g-1": "20Gi", "data-g-2": None, "data-g-3": "10737418240"}
    assert volume_resizes(claims, "20Gi") == ({"data-g-0": "20Gi", "data-g-3": "20Gi"}, [])
    assert volume_resizes(claims, "10Gi") == ({}, ["data-g-1 (20Gi)"])
    assert volume_resizes(claims, "nonsense") == ({}, [])
    assert any("spec.storage.size" in p for p in problems(dataclasses.replace(SPEC, storage_size="lots")))
    assert not any("storage" in p for p in problems(SPEC))


def test_a_volume_that_was_not_resized_degrades_the_group() -> None:
    views = pods(master(2000), slave(1, 2000), slave(2, 2000))
    rows = replica_rows(SPEC, STATE, views)
    conds = {c.type: c for c in conditions(SPEC, STATE, rows, Health(storage_note="volumes not resized: x"))}
    assert (conds["Degraded"].status, conds["Degraded"].reason) == (True, "VolumeNotResized")
    assert conds["Ready"].status is True


# ---------------------------------------------------------------- state behind the brokers
def test_a_master_down_at_operator_start_is_lost_when_the_brokers_show_the_group_served() -> None:
    """No Ready status and no memory (a restarted operator): slaves holding data or a later epoch
    mean the master was lost; empty slaves mean a new group still starting."""
    fresh = GroupState(assignment={0: 0, 1: 1, 2: 2}, epoch=0)
    empty = pods(down(master()), slave(1, offset=0, epoch=0), slave(2, offset=0, epoch=0))
    assert decide_failover(SPEC, fresh, empty, MasterMemory(), 0.0).reason == "MasterStarting"
    served = pods(down(master()), slave(1, offset=4096, epoch=0), slave(2, offset=0, epoch=0))
    assert decide_failover(SPEC, fresh, served, MasterMemory(), 0.0).reason == "MasterLost"


def test_a_reachable_master_of_a_newer_epoch_is_reported() -> None:
    newer = master(name="g-1", epoch=4)
    assert reported_master(STATE, pods(down(master()), newer, slave(2, epoch=4))) == ("g-1", 4)
    assert reported_master(STATE, pods(master(), slave(1), slave(2))) is None  # same epoch: nothing new
    # A slave of a newer epoch is not a master; the highest epoch wins among masters.
    assert reported_master(STATE, pods(master(), slave(1, epoch=5), master(name="g-2", epoch=4))) == ("g-2", 4)


def test_the_broker_that_began_the_masters_epoch_is_its_owner() -> None:
    """g-0 serves as master in epoch 4, which g-1 began (g-1 is a slave by a configuration that
    forgot the promotion): g-1 is returned. Nothing when the master began its epoch itself, serves
    in epoch 0, or no reachable broker began it."""
    state = GroupState(assignment={0: 0, 1: 1, 2: 2}, epoch=4)
    owner = with_broker(slave(1, epoch=4), own_epoch=4)
    assert term_owner(SPEC, state, pods(master(epoch=4), owner, slave(2, epoch=4))) == ("g-1", 4)
    own = with_broker(master(epoch=4), own_epoch=4)
    assert term_owner(SPEC, state, pods(own, slave(1, epoch=4), slave(2, epoch=4))) is None
    assert term_owner(SPEC, state, pods(master(epoch=4), slave(1, epoch=4), slave(2, epoch=4))) is None
    assert term_owner(SPEC, GroupState(assignment={0: 0, 1: 1}, epoch=0), pods(master(epoch=0), slave(1, epoch=0))) \
        is None


def test_a_master_in_another_brokers_epoch_is_shown_and_degrades_the_group() -> None:
    stale = dataclasses.replace(slave(2, 2000), broker=BrokerView.from_status(
        {"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 3, "ownEpoch": 2, "maxPhyOffset": 2000, "termFenced": True}))
    assert stale.broker is not None and stale.broker.term_fenced
    assert not BrokerView.from_status({"role": "SLAVE"}).term_fenced
    rows = replica_rows(SPEC, STATE, pods(master(2000), slave(1, 2000), stale))
    assert rows[2]["termFenced"] is True and "termFenced" not in rows[0]
    conds = {c.type: c for c in conditions(SPEC, STATE, rows, Health())}
    assert (conds["Degraded"].status, conds["Degraded"].reason) == (True, "TermFenced")
    assert "refusing writes: g-2" in conds["Degraded"].message


def test_a_lost_master_serves_again_only_as_a_writable_master_in_the_groups_epoch() -> None:
    def view(**status: object) -> BrokerView:
        return BrokerView.from_status({"brokerId": 0, "maxPhyOffset": 100, **status})

    assert serves_again(STATE, view(role="ASYNC_MASTER", epoch=3))
    assert serves_again(STATE, view(role="SYNC_MASTER", epoch=4))
    assert not serves_again(STATE, view(role="SYNC_MASTER", epoch=3, termFenced=True))  # refuses writes
    assert not serves_again(STATE, view(role="SYNC_MASTER", epoch=2))  # a term the group has left
    assert not serves_again(STATE, view(role="SLAVE", epoch=3))
    assert serves_again(STATE, view(role="ASYNC_MASTER", epoch=3), [100, 90])
    assert not serves_again(STATE, view(role="ASYNC_MASTER", epoch=3), [100, 120])  # back without its tail
