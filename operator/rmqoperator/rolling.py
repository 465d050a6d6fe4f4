"""Pure rolling-restart decisions: which broker pod to restart next, if any.

The broker StatefulSet uses updateStrategy OnDelete, so a changed pod template (image,
resources, brokerConfig, a manual ``restart-at`` annotation) restarts nothing by itself. Pods
carry the template's config-hash annotation; a pod whose hash differs is outdated. The operator
deletes outdated pods one at a time -- slaves first (highest ordinal first), the master last --
and only when every pod is back, Ready, reachable and every slave is in sync again, so a restart
never overlaps another and a slave is never restarted while the only up-to-date copy is elsewhere.
The exception is an outdated pod that is down already (the last change broke it and was reverted):
it is replaced at once, as the only way out of a crash loop on an ``OnDelete`` StatefulSet.
When the master's turn comes the controller first tries to hand the master over to an in-sync
slave (:func:`rmqoperator.failover.handover_candidate`); the old master is then an outdated slave
and is restarted as one.
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
                 in_sync: frozenset[str], *, stuck: frozenset[str] = frozenset(), new_group: bool = False,
                 settling: frozenset[str] = frozenset()) -> RollStep:
    """The next outdated pod to delete. ``stuck``: pods unreachable for a while (not a probe's blip);
    ``new_group``: the group has never served (no data); ``settling``: a master handed over
    moments ago, which clients with old routes still send to (it relays their sends)."""
    outdated = [p for p in pods.values() if p.config_hash != desired_hash]
    order = restart_order(outdated, master_pod)
    pending = tuple(p.name for p in order)
    if not order:
        return RollStep(None, "UpToDate")
    if any(p.deleting for p in pods.values()) or len(pods) < expected_pods:
        return RollStep(None, "WaitingForPod", pending)
    not_ready = {p.name for p in pods.values() if not p.ready or not p.reachable}
    if not_ready:
        # An outdated pod that has been down for a while anyway (a bad image or setting the user
        # has since reverted, a pod that cannot be scheduled) is replaced first: that costs no
        # availability. Only when it is the one pod down -- or in a group that never served, where
        # there is none to lose.
        down = [p for p in order if p.name in not_ready and (new_group or p.name in stuck)]
        if down and (new_group or not_ready == {down[0].name}):
            return RollStep(down[0].name, "ReplacingUnavailable", pending)
        return RollStep(None, "WaitingForReady", pending)
    lagging = sorted(n for n in pods if n != master_pod and n not in in_sync)
    if lagging:
        return RollStep(None, "WaitingForCatchUp", pending)
    if order[0].name in settling:
        return RollStep(None, "WaitingForClientRoutes", pending)
    return RollStep(order[0].name, "Restarting", pending)
