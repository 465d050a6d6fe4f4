"""Pure rolling-restart decisions: which broker pod to restart next, if any.

The broker StatefulSet uses updateStrategy OnDelete, so a changed pod template (image,
resources, brokerConfig, a manual ``restart-at`` annotation) restarts nothing by itself. Pods
carry the template's config-hash annotation; a pod whose hash differs is outdated. The operator
deletes outdated pods one at a time -- slaves first (highest ordinal first), the master last --
and only when every pod is back, Ready, reachable and every slave is in sync again, so a restart
never overlaps another and a slave is never restarted while the only up-to-date copy is elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from rmqoperator.failover import PodView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RollStep:
    pod: str | None  # the pod to delete now, or None
    reason: str
    pending: tuple[str, ...] = ()  # outdated pods, in the order they will be restarted


def restart_order(outdated: list[PodView], master_pod: str | None) -> list[PodView]:
    slaves = sorted((p for p in outdated if p.name != master_pod), key=lambda p: -p.ordinal)
    master = [p for p in outdated if p.name == master_pod]
    return slaves + master


def next_restart(pods: Mapping[str, PodView], desired_hash: str, master_pod: str | None, expected_pods: int,
                 in_sync: frozenset[str]) -> RollStep:
    outdated = [p for p in pods.values() if p.config_hash != desired_hash]
    order = restart_order(outdated, master_pod)
    pending = tuple(p.name for p in order)
    if not order:
        return RollStep(None, "UpToDate")
    if any(p.deleting for p in pods.values()) or len(pods) < expected_pods:
        return RollStep(None, "WaitingForPod", pending)
    not_ready = sorted(p.name for p in pods.values() if not p.ready or not p.reachable)
    if not_ready:
        return RollStep(None, "WaitingForReady", pending)
    lagging = sorted(n for n in pods if n != master_pod and n not in in_sync)
    if lagging:
        return RollStep(None, "WaitingForCatchUp", pending)
    return RollStep(order[0].name, "Restarting", pending)
