"""Pure status rendering: per-replica rows and the Ready/Replicating/Degraded/FailingOver conditions.

Conditions follow the Kubernetes/Strimzi convention: ``type``, ``status`` ("True"/"False"/
"Unknown"), a CamelCase ``reason``, a human ``message``, ``lastTransitionTime`` (kept while the
status stays the same) and ``observedGeneration``.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rmqoperator.failover import FailoverDecision, PodView, in_sync, lag_bytes, listen_port, master_healthy
from rmqoperator.reconcile import GroupState
from rmqoperator.spec import GroupSpec

log = logging.getLogger(__name__)

CONDITION_TYPES = ("Ready", "Replicating", "Degraded", "FailingOver")


def now_iso() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Cond:
    type: str
    status: bool | None  # None = Unknown
    reason: str
    message: str = ""

    @property
    def status_str(self) -> str:
        return "Unknown" if self.status is None else ("True" if self.status else "False")


def merge_conditions(old: Sequence[Mapping[str, Any]] | None, new: Sequence[Cond], generation: int | None,
                     now: str) -> list[dict[str, Any]]:
    """New conditions, keeping lastTransitionTime where a condition's status did not change.

    Conditions of other types already present (e.g. ReplicasVerified) are kept as they are.
    """
    by_type = {c.get("type"): c for c in (old or [])}
    out: list[dict[str, Any]] = []
    new_types = {c.type for c in new}
    for c in new:
        prev = by_type.get(c.type)
        changed = prev is None or prev.get("status") != c.status_str
        entry: dict[str, Any] = {"type": c.type, "status": c.status_str, "reason": c.reason, "message": c.message,
                                 "lastTransitionTime": now if changed else prev.get("lastTransitionTime", now)}  # type: ignore[union-attr]
        if generation is not None:
            entry["observedGeneration"] = generation
        out.append(entry)
    out.extend(dict(c) for c in (old or []) if c.get("type") not in new_types)
    return out


def condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def replica_rows(spec: GroupSpec, state: GroupState, pods: Mapping[str, PodView]) -> list[dict[str, Any]]:
    master_pod = state.master_pod(spec)
    mv = pods.get(master_pod) if master_pod else None
    rows = []
    for o, bid in sorted(state.assignment.items()):
        from rmqoperator.builders import pod_name

        name = pod_name(spec, o)
        p = pods.get(name)
        row: dict[str, Any] = {"pod": name, "brokerId": bid, "ready": bool(p and p.ready and p.reachable)}
        if p is not None and p.ip:
            row["address"] = f"{p.ip}:{listen_port(spec, p)}"
        if p is not None and p.unschedulable:
            row["unschedulable"] = p.unschedulable
        if p is not None and p.broker is not None:
            row["role"] = p.broker.role
            row["maxPhyOffset"] = p.broker.max_offset
            row["epoch"] = p.broker.epoch
            if p.broker.disk_used_ratio >= 0:
                row["diskUsedPercent"] = round(p.broker.disk_used_ratio * 100, 1)
            if p.broker.disk_full:
                row["diskFull"] = True
            if p.broker.term_fenced:
                row["termFenced"] = True
            if name != master_pod:
                lag = lag_bytes(p, mv)
                if lag is not None:
                    row["lagBytes"] = lag
                if p.broker.ahead_of_master:
                    row["aheadOfMasterBytes"] = p.broker.ahead_of_master
                row["inSync"] = in_sync(spec, p, mv)
            else:
                row["lagBytes"] = 0
                row["inSync"] = master_healthy(p)
        else:
            row["role"] = "Unknown"
            row["inSync"] = False
        rows.append(row)
    return rows


@dataclass(frozen=True)
class Health:
    """Inputs of the conditions besides the replica rows."""

    invalid: str | None = None  # message when the current spec is unusable
    paused: bool = False
    failover: FailoverDecision | None = None
    scale_note: str | None = None
    storage_note: str | None = None  # volumes that could not be resized to spec.storage.size
    secret_note: str | None = None  # Secrets the pods mount that are missing or lack keys
    roll_reason: str | None = None
    roll_pending: tuple[str, ...] = ()


def conditions(spec: GroupSpec, state: GroupState, rows: Sequence[Mapping[str, Any]], health: Health) -> list[Cond]:
    master_pod = state.master_pod(spec)
    master_row = next((r for r in rows if r["pod"] == master_pod), None)
    master_ok = bool(master_row and master_row.get("inSync") and master_row.get("ready"))
    slaves = [r for r in rows if r["pod"] != master_pod]
    synced = [r for r in slaves if r.get("inSync")]
    not_ready = [f"{r['pod']} (unschedulable: {r['unschedulable']})" if r.get("unschedulable") else r["pod"]
                 for r in rows if not r.get("ready")]
    unschedulable = any(r.get("unschedulable") for r in rows)
    lagging = [r["pod"] for r in slaves if not r.get("inSync")]
    ahead = [f"{r['pod']} ({r['aheadOfMasterBytes']} bytes)" for r in slaves if r.get("aheadOfMasterBytes")]
    full = [f"{r['pod']} ({r.get('diskUsedPercent', '?')}% used)" for r in rows if r.get("diskFull")]
    master_full = bool(master_row and master_row.get("diskFull"))
    term_fenced = [r["pod"] for r in rows if r.get("termFenced")]
    out: list[Cond] = []

    # Ready: is the group serving as specified?
    if health.invalid:
        out.append(Cond("Ready", False, "InvalidSpec", health.invalid))
    elif not any(r.get("address") for r in rows):
        out.append(Cond("Ready", False, "Creating", "no broker pod is running yet"))
    elif not master_ok:
        out.append(Cond("Ready", False, "MasterUnavailable", f"master {master_pod} is not serving"))
    elif master_full:
        out.append(Cond("Ready", False, "DiskFull", f"master {master_pod}'s disk is over diskSpaceWarningLevelRatio: "
                                                    "sends are refused until retention frees space"))
    elif spec.replication == "SYNC" and slaves and not synced:
        out.append(Cond("Ready", False, "NoSyncSlave", "SYNC_MASTER has no in-sync slave: sends fail"))
    elif health.paused:
        out.append(Cond("Ready", True, "ReconciliationPaused", f"master {master_pod} serving; reconciliation paused"))
    else:
        out.append(Cond("Ready", True, "Available", f"master {master_pod} serving, "
                                                   f"{len(synced)}/{len(slaves)} slave(s) in sync"))

    # Replicating: are all slaves following the master closely?
    if not slaves:
        out.append(Cond("Replicating", False, "NoSlaves", "single broker: nothing replicates"))
    elif not master_ok:
        out.append(Cond("Replicating", False, "MasterUnavailable", f"master {master_pod} is not serving"))
    elif lagging:
        out.append(Cond("Replicating", False, "SlavesLagging", f"not in sync: {', '.join(lagging)}"))
    else:
        out.append(Cond("Replicating", True, "InSync", f"{len(synced)} slave(s) in sync"))

    # Degraded: anything short of full health the user should know about.
    issues: list[str] = []
    if not_ready:
        issues.append(f"not ready: {', '.join(not_ready)}")
    if lagging and master_ok:
        issues.append(f"lagging: {', '.join(lagging)}")
    if ahead:
        # The failover replaces such a master (failover.lost_data); with failover disabled it stays.
        issues.append(f"master {master_pod} lost data its slave(s) still hold: {', '.join(ahead)}; "
                      "they refuse to follow it: the most advanced one is promoted (unless failover is disabled)")
    if full:
        issues.append(f"disk full, sends refused: {', '.join(full)}; free space or grow the volume "
                      "(retention deletes the oldest files first)")
    if term_fenced:
        issues.append(f"master(s) in another broker's epoch, refusing writes: {', '.join(term_fenced)}")
    if state.pending_demotion:
        issues.append(f"former master(s) to demote when back: {', '.join(state.pending_demotion)}")
    if health.scale_note:
        issues.append(health.scale_note)
    if health.storage_note:
        issues.append(health.storage_note)
    if health.secret_note:
        issues.append(health.secret_note)
    if health.invalid:
        issues.append("spec invalid: running brokers left as they are")
    if issues:
        reason = ("SecretMissing" if health.secret_note else
                  "ScaleDownRefused" if health.scale_note else
                  "VolumeNotResized" if health.storage_note else
                  "InvalidSpec" if health.invalid else
                  "MasterBehindSlave" if ahead else
                  "DiskFull" if full else
                  "TermFenced" if term_fenced else
                  "Unschedulable" if unschedulable else
                  "ReplicasNotReady" if not_ready else "Lagging" if lagging else "DemotionPending")
        out.append(Cond("Degraded", True, reason, "; ".join(issues)))
    else:
        out.append(Cond("Degraded", False, "Healthy", "all replicas ready and in sync"))

    # FailingOver: is a master change in progress (or blocked)?
    fo = health.failover
    if fo is None or fo.action == "none":
        out.append(Cond("FailingOver", False, "NoFailover", ""))
    elif fo.reason == "MasterStarting":
        out.append(Cond("FailingOver", False, fo.reason, fo.message))
    elif fo.action == "promote":
        out.append(Cond("FailingOver", True, "Promoting", fo.message))
    else:
        out.append(Cond("FailingOver", fo.action == "wait" or fo.reason == "NoSafeCandidate", fo.reason, fo.message))
    return out


def phase(conds: Sequence[Cond], health: Health) -> str:
    by = {c.type: c for c in conds}
    if health.invalid:
        return "Invalid"
    if health.paused:
        return "Paused"
    if by["FailingOver"].status:
        return "FailingOver"
    if health.roll_pending:
        return "Rolling"
    if by["Ready"].reason == "Creating":
        return "Creating"
    if not by["Ready"].status:
        return "NotReady"
    if by["Degraded"].status:
        return "Degraded"
    return "Running"


def summary(rows: Sequence[Mapping[str, Any]], master_pod: str | None) -> dict[str, Any]:
    lags = [int(r.get("lagBytes", 0)) for r in rows if r["pod"] != master_pod and "lagBytes" in r]
    return {
        "readyReplicas": sum(1 for r in rows if r.get("ready")),
        # The serving master counts (its row is inSync): "3" of 3 replicas hold the master's data.
        "inSyncReplicas": sum(1 for r in rows if r.get("inSync")),
        "maxLagBytes": max(lags) if lags else 0,
    }
