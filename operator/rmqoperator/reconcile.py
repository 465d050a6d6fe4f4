"""Pure reconcile decisions: the group's persisted role state and what the children should be.

``GroupState`` is what the operator keeps in the BrokerGroup's status between runs: which pod
holds which brokerId (the master has 0), the replication epoch and former masters still to be
demoted. Everything here is a function of its arguments.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rmqoperator.builders import Assignment, pod_name, pod_ordinal
from rmqoperator.spec import GroupSpec, quantity_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupState:
    """Role assignment and epoch, as persisted in ``status.brokerIds`` / ``status.epoch``."""

    assignment: Assignment = field(default_factory=dict)  # ordinal -> brokerId
    epoch: int = 0
    pending_demotion: tuple[str, ...] = ()

    @property
    def master_ordinal(self) -> int | None:
        return next((o for o, b in self.assignment.items() if b == 0), None)

    def master_pod(self, spec: GroupSpec) -> str | None:
        o = self.master_ordinal
        return None if o is None else pod_name(spec, o)

    def broker_id_of(self, spec: GroupSpec, pod: str) -> int | None:
        o = pod_ordinal(pod)
        return None if o is None else self.assignment.get(o)

    @staticmethod
    def from_status(status: Mapping[str, Any] | None) -> GroupState:
        status = status or {}
        ids: Assignment = {}
        for pod, bid in (status.get("brokerIds") or {}).items():
            o = pod_ordinal(str(pod))
            if o is not None and isinstance(bid, int):
                ids[o] = bid
        return GroupState(assignment=ids, epoch=int(status.get("epoch") or 0),
                          pending_demotion=tuple(status.get("pendingDemotion") or ()))

    def to_status(self, spec: GroupSpec) -> dict[str, Any]:
        master = self.master_pod(spec)
        return {"brokerIds": {pod_name(spec, o): b for o, b in sorted(self.assignment.items())},
                "epoch": self.epoch, "master": master, "pendingDemotion": list(self.pending_demotion)}

    def promoted(self, spec: GroupSpec, new_master_ordinal: int, epoch: int) -> GroupState:
        """The state after promoting ``new_master_ordinal``: it takes brokerId 0, the old master its id."""
        old = self.master_ordinal
        ids = dict(self.assignment)
        freed = ids.get(new_master_ordinal, 0)
        ids[new_master_ordinal] = 0
        pending = [p for p in self.pending_demotion if p != pod_name(spec, new_master_ordinal)]
        if old is not None and old != new_master_ordinal:
            ids[old] = freed if freed > 0 else _free_id(ids)
            pending.append(pod_name(spec, old))
        return replace(self, assignment=ids, epoch=epoch, pending_demotion=tuple(sorted(set(pending))))

    def demoted(self, pod: str) -> GroupState:
        """``pod`` (a former master) now follows the current master."""
        return replace(self, pending_demotion=tuple(p for p in self.pending_demotion if p != pod))


def _free_id(ids: Mapping[int, int]) -> int:
    used = set(ids.values())
    return next(i for i in range(1, 1000) if i not in used)


def complete_assignment(current: Assignment, replicas: int) -> Assignment:
    """Assignment for ``replicas`` pods: existing ids kept, new ordinals get the smallest free ids.

    Ordinals at or beyond ``replicas`` are dropped unless they hold the master (scale-down never
    removes the master: :func:`statefulset_replicas` keeps that pod).
    """
    out = {o: b for o, b in current.items() if o < replicas or b == 0}
    if not any(b == 0 for b in out.values()):
        # First reconcile (or a corrupted status): pod 0 is the master unless it already holds an id.
        if 0 not in out:
            out[0] = 0
        else:
            free_ordinal = min(o for o in range(replicas + 1) if o not in out) if len(out) < replicas else None
            if free_ordinal is not None:
                out[free_ordinal] = 0
    for o in range(replicas):
        if o not in out:
            out[o] = _free_id(out)
    return dict(sorted(out.items()))


def statefulset_replicas(replicas: int, state: GroupState) -> tuple[int, str | None]:
    """How many broker pods to run, and why that is not ``replicas`` (scale-down refused)."""
    m = state.master_ordinal
    if m is not None and m >= replicas:
        return m + 1, (f"scale-down to {replicas} refused: the master is pod ordinal {m}; it is kept "
                       f"until another pod is master")
    return replicas, None


def volume_resizes(claims: Mapping[str, str | None], size: str) -> tuple[dict[str, str], list[str]]:
    """Claims to grow to ``size`` (name -> size), and claims already larger, which are left alone
    (volumes never shrink). ``claims`` maps each claim to its requested storage (None: not there)."""
    want = quantity_bytes(size)
    grow: dict[str, str] = {}
    larger: list[str] = []
    if want is None:
        return grow, larger
    for name, have in sorted(claims.items()):
        if have is None:
            continue
        current = quantity_bytes(have)
        if current is None or current < want:
            grow[name] = size
        elif current > want:
            larger.append(f"{name} ({have})")
    return grow, larger
