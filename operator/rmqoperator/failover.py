"""Pure failover and role-alignment decisions from one round of observations.

Inputs are what the poller saw (:class:`PodView`: the pod object plus the broker's ``GET
/status``), the persisted :class:`~rmqoperator.reconcile.GroupState` and a small in-memory
:class:`MasterMemory` (when the master was last healthy, which slaves followed it then).
Outputs are decisions and admin-API actions; the controller executes them.

Which slave is safe to promote is :mod:`rmqbroker.ha.election`'s rule (shared with ``rmq-local``):
under SYNC replication without ``allowDataLoss``, only the most advanced slave of the master's epoch,
and only while every slave that followed the master can be seen.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rmqbroker.ha import election
from rmqoperator.builders import Assignment, pod_dns, pod_name
from rmqoperator.reconcile import GroupState
from rmqoperator.spec import GroupSpec

log = logging.getLogger(__name__)

MASTER_ROLES = ("SYNC_MASTER", "ASYNC_MASTER")
# An unreachable slave that has not followed the current master is deleted (restarted from the
# ConfigMap, which names the current master) after this long, once its container has started: one
# still in its startup window (store recovery, image pull) is left to its startup probe.
REPOINT_GRACE_SECONDS = 15.0


@dataclass(frozen=True)
class BrokerView:
    """The parts of a broker's ``GET /status`` the operator uses."""

    role: str
    broker_id: int
    epoch: int
    max_offset: int
    ha_master: str | None = None
    ha_connected: bool = False
    # A slave's end of its HA connection (the address its master lists it under); None: not
    # connected, or an image that does not say.
    ha_local_address: str | None = None
    connected_slaves: int = 0
    broker_addr: str = ""
    # Bytes of the master's current epoch this slave holds beyond the master's end: the master
    # came back without them (an older disk) and the slave refuses to follow rather than cut them.
    ahead_of_master: int = 0
    # The broker's disk (retention's last measurement; -1 unknown) and whether it refuses sends.
    disk_used_ratio: float = -1.0
    disk_full: bool = False
    # Fenced by a failover (POST /ha/fence): it follows no master until re-pointed.
    fenced: bool = False
    # The latest epoch it began as a promoted master; None: none, or an image that does not say.
    own_epoch: int | None = None
    # A master refusing writes: it serves in an epoch another broker began (restarted from a
    # configuration that still named it master).
    term_fenced: bool = False
    # The identity of the log it holds; None: not drawn yet, or an image that does not say.
    log_id: str | None = None

    @property
    def is_master(self) -> bool:
        return self.role in MASTER_ROLES

    @staticmethod
    def from_status(obj: Mapping[str, Any]) -> BrokerView:
        ha = obj.get("ha") or {}
        retention = obj.get("retention") or {}
        return BrokerView(role=str(obj.get("role", "")), broker_id=int(obj.get("brokerId", -1)),
                          epoch=int(obj.get("epoch") or 0), max_offset=int(obj.get("maxPhyOffset") or 0),
                          ha_master=ha.get("masterAddress"), ha_connected=bool(ha.get("connected")),
                          ha_local_address=_str_or_none(ha.get("localAddress")),
                          connected_slaves=len(ha.get("slaves") or []), broker_addr=str(obj.get("brokerAddr", "")),
                          ahead_of_master=int(ha.get("aheadOfMasterBytes") or 0),
                          disk_used_ratio=float(retention.get("diskUsedRatio", -1.0)),
                          disk_full=retention.get("diskFull") is True,
                          fenced=bool(ha.get("fencedBelowEpoch")),
                          own_epoch=_int_or_none(obj.get("ownEpoch")),
                          term_fenced=obj.get("termFenced") is True,
                          log_id=_str_or_none(obj.get("logId")))


@dataclass(frozen=True)
class PodView:
    """A broker pod as seen in one polling round."""

    name: str
    ordinal: int
    ip: str | None
    ready: bool
    deleting: bool = False
    config_hash: str | None = None
    broker: BrokerView | None = None  # None: admin endpoint unreachable
    unschedulable: str | None = None  # the scheduler's reason when it cannot place the pod
    # The broker container passed its startup probe (the kubelet's ``started``): until then it may
    # still be recovering its store, which can take minutes, and is left to the probe.
    started: bool = True

    @property
    def reachable(self) -> bool:
        return self.broker is not None


@dataclass
class MasterMemory:
    """What the poller remembers between rounds (not persisted: rebuilt after an operator restart)."""

    lost_since: float | None = None
    seen_healthy: bool = False
    master: str | None = None
    master_offset: int = 0
    following: dict[str, str] = field(default_factory=dict)  # pod -> master it was seen following
    connected: frozenset[str] = frozenset()  # slaves connected to the master when last seen healthy
    in_sync: frozenset[str] = frozenset()
    unreachable_since: dict[str, float] = field(default_factory=dict)
    master_changed_at: float = 0.0
    # The group has served before (a Ready status or an epoch > 0 when the operator started): a
    # master that is down now was lost, not still starting.
    served_before: bool = False
    # The log identity the master had when last seen healthy: another one later is another log.
    master_log_id: str | None = None


@dataclass(frozen=True)
class Action:
    """One admin-API call (or pod deletion) the controller should make."""

    kind: Literal["promote", "demote", "repoint", "set_mode", "delete_pod"]
    pod: str
    role: str | None = None
    broker_id: int | None = None
    epoch: int | None = None
    ha_address: str | None = None
    broker_address: str | None = None
    reason: str = ""
    # A master's re-registration after a demotion in the same round: pointless if that failed.
    after_demotion: bool = False


@dataclass(frozen=True)
class FailoverDecision:
    action: Literal["none", "wait", "promote", "blocked"]
    reason: str
    message: str = ""
    candidate: str | None = None
    epoch: int = 0
    # The master answers but lost its store (lost_data): it is not asked again before the promotion.
    master_lost_data: bool = False


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def master_healthy(view: PodView | None) -> bool:
    return view is not None and not view.deleting and view.broker is not None and view.broker.is_master


def lost_data(spec: GroupSpec, state: GroupState, pods: Mapping[str, PodView],
              memory: MasterMemory | None = None) -> str | None:
    """Why the recorded master, reachable and serving as a master, no longer holds the group's
    log, or None: it came back on a volume that lost its store (a wiped or replaced claim, an
    older disk). It reports an epoch older than the group's (its epoch record went with the
    store), another log identity than it had when last seen healthy (``memory``), or a slave
    pointed at it holds bytes of its own term beyond its end and refuses to follow. Such a
    master is replaced like a lost one, at once: waiting cannot bring the bytes back, and every
    send it takes meanwhile is on a log the group will not keep."""
    master_pod = state.master_pod(spec)
    mv = pods.get(master_pod) if master_pod else None
    if mv is None or not master_healthy(mv):
        return None
    b = mv.broker
    assert b is not None
    if b.epoch < state.epoch:
        return f"master {mv.name} is at epoch {b.epoch}, older than the group's {state.epoch}: it lost its store"
    if (memory is not None and memory.master == mv.name and memory.master_log_id is not None
            and b.log_id is not None and b.log_id != memory.master_log_id):
        return (f"master {mv.name} serves log {b.log_id}, not the log {memory.master_log_id} it served: "
                "its store was replaced")
    targets = follow_addresses(spec, mv)
    ahead = [f"{name} ({p.broker.ahead_of_master} bytes)" for name, p in sorted(pods.items())
             if name != mv.name and p.broker is not None and p.broker.role == "SLAVE"
             and p.broker.ahead_of_master > 0 and p.broker.ha_master in targets]
    if ahead:
        return f"master {mv.name} lacks bytes of its own epoch that its slave(s) hold: {', '.join(ahead)}"
    return None


def lone_master_restart(spec: GroupSpec, state: GroupState, pods: Mapping[str, PodView],
                        memory: MasterMemory | None = None) -> tuple[int, str] | None:
    """The epoch at which a group of one broker goes on with the empty log its master holds now,
    and why, or None. Such a master came back without its store (:func:`lost_data`) and refuses
    writes (``haGroupEpoch``), but no other broker holds the group's log: there is nobody to
    promote, and refusing writes keeps nothing. So it begins a new epoch on what it has."""
    master_pod = state.master_pod(spec)
    if spec.replicas != 1 or master_pod is None or any(n != master_pod and p.broker is not None
                                                       for n, p in pods.items()):
        return None
    why = lost_data(spec, state, pods, memory)
    if why is None:
        return None
    return election.next_epoch(state.epoch, [p.broker.epoch for p in pods.values() if p.broker is not None]), why


def master_serving(spec: GroupSpec, state: GroupState, pods: Mapping[str, PodView],
                   memory: MasterMemory | None = None) -> bool:
    """The recorded master is reachable, a master, and holds the group's log."""
    master_pod = state.master_pod(spec)
    return (master_healthy(pods.get(master_pod) if master_pod else None)
            and lost_data(spec, state, pods, memory) is None)


def first_term(spec: GroupSpec, state: GroupState, pods: Mapping[str, PodView]) -> bool:
    """Whether the group's master should begin epoch 1 now: the group is at epoch 0, which no
    broker began, so a master back on a replaced volume (at epoch 0 again) cannot be told from
    it by ``haGroupEpoch``. Begun once the master serves, with an image that knows log
    identities (older ones do not read ``haGroupEpoch``)."""
    if state.epoch != 0 or not master_serving(spec, state, pods):
        return False
    b = pods[state.master_pod(spec) or ""].broker
    assert b is not None
    return b.epoch == 0 and b.log_id is not None and not b.term_fenced


def listen_port(spec: GroupSpec, view: PodView) -> int:
    """The remoting port the broker reports it listens on (``brokerAddr``), else the spec's: while a
    ``spec.ports.listen`` change rolls, a broker not restarted yet still listens on the old one."""
    b = view.broker
    if b is not None and b.broker_addr:
        _, _, port = b.broker_addr.rpartition(":")
        if port.isdigit() and 0 < int(port) < 65536:
            return int(port)
    return spec.ports.listen


def follow_addresses(spec: GroupSpec, master: PodView) -> set[str]:
    """HA addresses under which a slave may know the master (pod IP or stable DNS name)."""
    ha = spec.ports.ha
    out = {f"{pod_dns(spec, master.ordinal)}:{ha}", f"{pod_dns(spec, master.ordinal)}.cluster.local:{ha}"}
    if master.ip:
        out.add(f"{master.ip}:{ha}")
    return out


def follows(spec: GroupSpec, slave: PodView, master: PodView) -> bool:
    b = slave.broker
    return b is not None and b.role == "SLAVE" and not b.fenced and b.ha_master in follow_addresses(spec, master)


def lag_bytes(slave: PodView, master: PodView | None) -> int | None:
    if slave.broker is None or master is None or master.broker is None:
        return None
    return max(0, master.broker.max_offset - slave.broker.max_offset)


def in_sync(spec: GroupSpec, slave: PodView, master: PodView | None) -> bool:
    if master is None or not master_healthy(master) or slave.broker is None:
        return False
    lag = lag_bytes(slave, master)
    return lag is not None and election.in_sync(follows(spec, slave, master), slave.broker.ha_connected,
                                                slave.broker.epoch, master.broker.epoch, lag)  # type: ignore[union-attr]


def observe(memory: MasterMemory, spec: GroupSpec, master_pod: str | None, pods: Mapping[str, PodView],
            now: float, lost: bool = False) -> None:
    """Update ``memory`` with one round of observations; ``lost``: the master lost its data
    (:func:`lost_data`), so it counts as lost although it answers."""
    mv = pods.get(master_pod) if master_pod else None
    if memory.master != master_pod:
        memory.master = master_pod
        memory.master_changed_at = now
        memory.lost_since = None
        memory.seen_healthy = False
        memory.master_log_id = None
    for name, p in pods.items():
        if p.reachable:
            memory.unreachable_since.pop(name, None)
        else:
            memory.unreachable_since.setdefault(name, now)
        if p.broker is not None and p.broker.is_master:
            # Whom it followed as a slave says nothing about following a master after its own term.
            memory.following.pop(name, None)
    if mv is not None and master_healthy(mv) and not lost:
        memory.lost_since = None
        memory.seen_healthy = True
        memory.master_offset = mv.broker.max_offset  # type: ignore[union-attr]
        memory.master_log_id = mv.broker.log_id or memory.master_log_id  # type: ignore[union-attr]
        slaves = [p for n, p in pods.items() if n != master_pod]
        memory.connected = frozenset(p.name for p in slaves
                                     if follows(spec, p, mv) and p.broker is not None and p.broker.ha_connected)
        memory.in_sync = frozenset(p.name for p in slaves if in_sync(spec, p, mv))
        for p in slaves:
            if follows(spec, p, mv):
                memory.following[p.name] = mv.name
    elif memory.lost_since is None:
        memory.lost_since = now


def has_served(pods: Mapping[str, PodView]) -> bool:
    """Whether a reachable broker shows the group has served before (data or a failover): its
    master, if down now, was lost and is not still starting, even to an operator that has just
    started and finds no Ready status."""
    return any(p.broker is not None and (p.broker.max_offset > 0 or p.broker.epoch > 0) for p in pods.values())


def reported_master(state: GroupState, pods: Mapping[str, PodView]) -> tuple[str, int] | None:
    """A reachable master of a newer epoch than the persisted state (pod name, epoch), if any.

    Epochs only grow and a broker refuses any older one, so such a master is the group's master:
    a promotion whose status write was lost, then an operator restart, leaves the state naming the
    old master at the old epoch. Acting on that state would restart the old master as a master
    from the ConfigMap beside the real one.
    """
    newer = [(p.broker.epoch, p.broker.max_offset, name) for name, p in pods.items()
             if p.broker is not None and p.broker.is_master and not p.deleting and p.broker.epoch > state.epoch]
    if not newer:
        return None
    epoch, _, name = max(newer)
    return name, epoch


def term_owner(spec: GroupSpec, state: GroupState, pods: Mapping[str, PodView]) -> tuple[str, int] | None:
    """The broker that began the epoch the recorded master serves in, when that is another broker
    (pod name, epoch); else None.

    A master writes in an epoch it began. One serving in an epoch another broker began was made
    master by a ConfigMap that no longer knew the last promotion (the group deleted and created
    again on its kept volumes): the term's owner holds that term's log and refuses to follow a
    master of its own term, so the owner is the group's master.
    """
    master_pod = state.master_pod(spec)
    mv = pods.get(master_pod) if master_pod else None
    if mv is None or mv.broker is None or not mv.broker.is_master:
        return None
    epoch = mv.broker.epoch
    if epoch in (0, mv.broker.own_epoch):
        return None
    for name, p in sorted(pods.items()):
        b = p.broker
        if name != master_pod and b is not None and not p.deleting and b.own_epoch == epoch and b.epoch == epoch:
            return name, epoch
    return None


def choose_candidate(spec: GroupSpec, state: GroupState, master_pod: str, pods: Mapping[str, PodView],
                     memory: MasterMemory) -> tuple[str | None, str]:
    """The slave to promote, or None and why none is safe (the rule is :mod:`rmqbroker.ha.election`)."""
    slaves = [p for n, p in pods.items() if n != master_pod and state.broker_id_of(spec, n) is not None]
    live = [election.Candidate(p.name, p.ordinal, p.broker.epoch, p.broker.max_offset) for p in slaves
            if p.broker is not None and p.broker.role == "SLAVE" and not p.deleting]
    record = election.MasterRecord(memory.seen_healthy, memory.connected, memory.in_sync, memory.master_offset)
    return election.choose(live, [p.name for p in slaves], state.epoch, spec.failover.strict(spec.replication), record)


def _fit_for_hand_over(spec: GroupSpec, state: GroupState, name: str, p: PodView, mv: PodView) -> bool:
    return (name != mv.name and not p.deleting and p.ready and bool(p.ip)
            and state.broker_id_of(spec, name) not in (None, 0) and in_sync(spec, p, mv))


def demoted_master(spec: GroupSpec, state: GroupState, pods: Mapping[str, PodView]) -> int | None:
    """The epoch at which to make the recorded master master again when it serves as a slave of
    nobody: reachable, in the group's epoch, unfenced, and no broker a master or in a later epoch.
    A hand-over cut short between its two steps (the operator restarted after the demotion) leaves
    this; the demoted master holds every byte of its term, which no slave can have beyond it, so
    it resumes at once instead of a failover after masterLostSeconds that could cut its tail."""
    master_pod = state.master_pod(spec)
    mv = pods.get(master_pod) if master_pod else None
    b = mv.broker if mv is not None else None
    if mv is None or b is None or mv.deleting or not mv.ip or b.role != "SLAVE" or b.fenced or b.epoch != state.epoch:
        return None
    if b.ha_connected:
        return None  # it follows a master after all: that is for the other checks to settle
    seen = [p.broker.epoch for p in pods.values() if p.broker is not None]
    if any(p.broker is not None and (p.broker.is_master or p.broker.epoch > state.epoch) for p in pods.values()):
        return None
    return election.next_epoch(state.epoch, seen)


def handover_candidate(spec: GroupSpec, state: GroupState, pods: Mapping[str, PodView]) -> str | None:
    """The slave a planned restart of the master hands over to, or None (restart it in place).

    Only a reachable slave following the healthy master in its epoch, connected and in sync, so
    that the master's drain leaves it holding every byte; the most advanced, the lowest ordinal
    on a tie. None with failover disabled: the user keeps the master where it is.
    """
    master_pod = state.master_pod(spec)
    mv = pods.get(master_pod) if master_pod else None
    if not spec.failover.enabled or mv is None or not master_serving(spec, state, pods):
        return None
    ready = [p for name, p in pods.items() if _fit_for_hand_over(spec, state, name, p, mv)]
    if not ready:
        return None
    return max(ready, key=lambda p: (p.broker.max_offset if p.broker else 0, -p.ordinal)).name


def switchover_check(spec: GroupSpec, state: GroupState, pods: Mapping[str, PodView],
                     target: str) -> tuple[Literal["go", "wait", "refuse", "done"], str]:
    """Whether a requested switchover to ``target`` can be made now, must wait (the target is not
    in sync yet, the master is not healthy), is refused (no such broker) or is done already."""
    master_pod = state.master_pod(spec)
    if target == master_pod:
        return "done", f"{target} is the master"
    if target not in {pod_name(spec, o) for o in state.assignment}:
        return "refuse", f"{target} is not a broker of this group"
    mv = pods.get(master_pod) if master_pod else None
    if mv is None or not master_serving(spec, state, pods):
        return "wait", f"the master {master_pod} is not serving"
    p = pods.get(target)
    if p is None or not _fit_for_hand_over(spec, state, target, p, mv):
        return "wait", f"{target} is not a ready slave in sync with {master_pod}"
    return "go", f"{target} is in sync with {master_pod}"


def after_fencing(views: Mapping[str, PodView], master_pod: str, fenced: Mapping[str, int]) -> dict[str, PodView]:
    """The views a promotion chooses on once the slaves were fenced (POST /ha/fence): a fenced
    slave at the final offset it answered, a slave that could not be fenced as unreachable (it may
    still acknowledge the old master, so under SYNC its presence blocks the promotion)."""
    out = dict(views)
    for name, v in views.items():
        b = v.broker
        if name != master_pod and b is not None and b.role == "SLAVE":
            out[name] = replace(v, broker=replace(b, max_offset=fenced[name]) if name in fenced else None)
    return out


def serves_again(state: GroupState, broker: BrokerView, slave_offsets: Iterable[int] = ()) -> bool:
    """Whether the lost master, asked again just before its replacement is promoted, is a writable
    master in the group's epoch, back (a container the kubelet restarted, a pause that ended) and
    taking sends that a promotion would cut from the log, and holding at least what the fenced
    slaves hold (``slave_offsets``): one back without its tail (a lost page cache) is replaced
    by the slave that has it."""
    return (broker.is_master and not broker.term_fenced and broker.epoch >= state.epoch
            and broker.max_offset >= max(slave_offsets, default=0))


def fence_targets(views: Mapping[str, PodView], master_pod: str) -> list[str]:
    """The reachable slaves a promotion fences first."""
    return sorted(n for n, v in views.items() if n != master_pod and not v.deleting and v.ip is not None
                  and v.broker is not None and v.broker.role == "SLAVE")


def decide_failover(spec: GroupSpec, state: GroupState, pods: Mapping[str, PodView], memory: MasterMemory,
                    now: float) -> FailoverDecision:
    master_pod = state.master_pod(spec)
    if master_pod is None:
        return FailoverDecision("none", "NoMaster")
    mv = pods.get(master_pod)
    gone = lost_data(spec, state, pods, memory)
    if master_healthy(mv) and gone is None:
        return FailoverDecision("none", "MasterHealthy")
    if not memory.seen_healthy and not memory.served_before and not has_served(pods):
        # A new group whose master pod is still being scheduled or pulling its image.
        return FailoverDecision("wait", "MasterStarting", f"waiting for master {master_pod} to start")
    lost_for = now - (memory.lost_since if memory.lost_since is not None else now)
    if not spec.failover.enabled:
        return FailoverDecision("blocked", "FailoverDisabled", f"{gone}; failover is disabled" if gone else
                                f"master {master_pod} unavailable for {lost_for:.0f}s; failover is disabled")
    if gone is None and lost_for < spec.failover.master_lost_seconds:
        return FailoverDecision("wait", "MasterLost",
                                f"master {master_pod} unavailable for {lost_for:.0f}s "
                                f"(failover after {spec.failover.master_lost_seconds}s)")
    candidate, why = choose_candidate(spec, state, master_pod, pods, memory)
    if candidate is None:
        lost = gone or f"master {master_pod} lost"
        return FailoverDecision("blocked", "NoSafeCandidate", f"{lost}; not promoting: {why}")
    epoch = election.next_epoch(state.epoch, [p.broker.epoch for p in pods.values() if p.broker is not None])
    return FailoverDecision("promote", "Promoting", f"promoting {candidate} ({why}) at epoch {epoch}"
                            + (f": {gone}" if gone else ""), candidate=candidate, epoch=epoch,
                            master_lost_data=gone is not None)


def plan_alignment(spec: GroupSpec, state: GroupState, pods: Mapping[str, PodView], memory: MasterMemory,
                   now: float) -> list[Action]:
    """Admin calls that make every reachable broker match the assignment and follow the master."""
    master_pod = state.master_pod(spec)
    mv = pods.get(master_pod) if master_pod else None
    actions: list[Action] = []
    if mv is None or not master_serving(spec, state, pods, memory):
        return actions
    assert mv.broker is not None and mv.ip is not None
    if mv.broker.role != spec.master_role:
        actions.append(Action("set_mode", mv.name, role=spec.master_role, broker_id=0, epoch=state.epoch,
                              reason=f"replication is {spec.replication}"))
    ha_addr = f"{mv.ip}:{spec.ports.ha}"
    broker_addr = f"{mv.ip}:{listen_port(spec, mv)}"
    renudge = False
    for name, p in sorted(pods.items()):
        if name == master_pod or p.deleting:
            continue
        want_id = state.broker_id_of(spec, name)
        if want_id is None or want_id == 0:
            continue
        b = p.broker
        if b is None:
            since = max(memory.unreachable_since.get(name, now), memory.master_changed_at)
            if (p.ip and p.started and memory.following.get(name) != master_pod
                    and now - since >= REPOINT_GRACE_SECONDS):
                actions.append(Action("delete_pod", name, reason="unreachable and not following the current "
                                                                 f"master {master_pod}"))
            continue
        if b.is_master or b.broker_id != want_id:
            if b.is_master:
                renudge = True
            actions.append(Action("demote", name, role="SLAVE", broker_id=want_id, epoch=state.epoch,
                                  reason=f"{name} is {b.role} with brokerId {b.broker_id}; "
                                         f"assigned SLAVE brokerId {want_id}"))
            actions.append(Action("repoint", name, ha_address=ha_addr, broker_address=broker_addr, epoch=state.epoch,
                                  reason=f"follow master {master_pod}"))
        elif not follows(spec, p, mv):
            actions.append(Action("repoint", name, ha_address=ha_addr, broker_address=broker_addr, epoch=state.epoch,
                                  reason=f"following {b.ha_master}, master is {master_pod} at {ha_addr}"))
    if renudge and not any(a.kind == "set_mode" for a in actions):
        # A returning old master registered as brokerId 0; once demoted it re-registers as a slave
        # and the nameservers drop brokerId 0 until the real master's next periodic registration.
        # A same-role POST /role makes the master re-register at once.
        actions.append(Action("set_mode", mv.name, role=mv.broker.role, broker_id=0, epoch=state.epoch,
                              reason="re-register as brokerId 0 after demoting a former master",
                              after_demotion=True))
    return actions


def assignment_by_pod(spec: GroupSpec, assignment: Assignment) -> dict[str, int]:
    return {pod_name(spec, o): b for o, b in assignment.items()}
