"""Per-group orchestration: applies children, polls brokers, executes failover/alignment/rolling.

One :class:`GroupController` per BrokerGroup, shared by the kopf handlers (create/update/resume:
:meth:`GroupController.ensure`, delete: :meth:`GroupController.cleanup`) and the polling daemon
(:meth:`GroupController.tick`). An asyncio lock serializes them, and the controller keeps the
authoritative copy of the role state in memory (loaded once from ``status``, written back on
every change) so a tick never acts on a status the watch stream has not delivered yet.

Decisions come from the pure modules (reconcile, failover, rolling, status); Kubernetes calls go
through :mod:`rmqoperator.k8s`, broker calls through :mod:`rmqoperator.brokerapi`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Any

from rmqbroker.ha import election
from rmqoperator import builders, metrics
from rmqoperator.brokerapi import RECHECK_TIMEOUT, AdminError, BrokerAdmin
from rmqoperator.failover import (
    Action,
    BrokerView,
    FailoverDecision,
    MasterMemory,
    PodView,
    after_fencing,
    choose_candidate,
    decide_failover,
    demoted_master,
    fence_targets,
    first_term,
    follows,
    handover_candidate,
    listen_port,
    lone_master_restart,
    lost_data,
    observe,
    plan_alignment,
    reported_master,
    serves_again,
    switchover_check,
    term_owner,
)
from rmqoperator.k8s import ApiError, KubeApi
from rmqoperator.reconcile import GroupState, complete_assignment, statefulset_replicas, volume_resizes
from rmqoperator.rolling import RollStep, next_restart
from rmqoperator.spec import (
    PAUSED_ANNOTATION,
    SWITCHOVER_ANNOTATION,
    GroupSpec,
    SpecError,
    fixed_port_problems,
    parse_spec,
    problems,
)
from rmqoperator.status import Cond, Health, conditions, merge_conditions, now_iso, phase, replica_rows, summary
from rmqoperator.verifier import Verifier

log = logging.getLogger(__name__)
# How often a polling round looks at the brokers' volume claims besides spec changes (s).
VOLUME_CHECK_SECONDS = 60.0
# How often the Secrets spec.tls / spec.acl name are looked at again while one is missing
# (otherwise every VOLUME_CHECK_SECONDS: one deleted later stops the next pod restart).
SECRET_RECHECK_SECONDS = 5.0
# An outdated broker unreachable this long is replaced ahead of the roll's order (rolling.py).
STUCK_SECONDS = 15.0
# A master handed over before its restart waits this long for its slaves to take its last bytes
# (within the admin call's 15 s), and the chosen slave must show them this soon after.
HANDOVER_DRAIN_MILLIS = 8000
HANDOVER_CATCHUP_SECONDS = 5.0
# The promotion's deadline (notAfterMillis; it may take a last metadata round of up to 5 s), and
# how far the broker's clock may be behind the operator's when the outcome of a failed call is read.
HANDOVER_PROMOTE_MILLIS = 10_000
CLOCK_SKEW_SECONDS = 5.0
# A handed-over master is restarted by the roll only this long after (RMQ_OPERATOR_HANDOVER_SETTLE_SECONDS):
# clients read routes every 30 s (RocketMQ's pollNameServerInterval) and meanwhile send to it, and it
# relays their sends to the new master (relaySendsToMaster); restarted at once, it would refuse them.
HANDOVER_SETTLE_SECONDS = 35.0

Obj = dict[str, Any]


class TemporaryFailure(Exception):
    """Reconcile could not finish now (API unreachable...); kopf retries the handler."""


def pod_view(pod: Mapping[str, Any], broker: BrokerView | None) -> PodView:
    meta = pod.get("metadata") or {}
    st = pod.get("status") or {}
    conds = st.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
    unschedulable = next((str(c.get("message") or "no node fits") for c in conds
                          if c.get("type") == "PodScheduled" and c.get("status") == "False"
                          and c.get("reason") == "Unschedulable"), None)
    name = str(meta.get("name", ""))
    # "started" is set by every kubelet since Kubernetes 1.16; a running container without it counts.
    started = any(c.get("started") is True or ("started" not in c and "running" in (c.get("state") or {}))
                  for c in st.get("containerStatuses") or [])
    return PodView(name=name, ordinal=builders.pod_ordinal(name) or 0, ip=st.get("podIP") or None, ready=ready,
                   deleting=bool(meta.get("deletionTimestamp")),
                   config_hash=(meta.get("annotations") or {}).get(builders.CONFIG_HASH_ANNOTATION),
                   broker=broker, unschedulable=unschedulable, started=started)


class GroupController:
    """State and actions of one BrokerGroup."""

    def __init__(self, api: KubeApi, admin: BrokerAdmin, namespace: str, name: str,
                 poll_interval: float = 1.0, handover_settle: float = HANDOVER_SETTLE_SECONDS) -> None:
        self.api = api
        self.admin = admin
        self.namespace = namespace
        self.name = name
        self.poll_interval = poll_interval
        self.handover_settle = handover_settle
        self.lock = asyncio.Lock()
        self.state: GroupState | None = None
        self.spec: GroupSpec | None = None  # last applied (valid) spec
        self.memory = MasterMemory()
        self.token: str | None = None
        self.involved: Obj = {"metadata": {"name": name, "namespace": namespace}}
        self.invalid: str | None = None
        self.paused = False
        self.scale_note: str | None = None
        self.storage_note: str | None = None
        self.secret_note: str | None = None  # Secrets the pods mount that are missing or incomplete
        self._secrets_checked = -1e9
        self._full_disks: set[str] = set()  # pods last seen refusing sends for a full disk
        self._volumes_checked = -1e9  # time.monotonic() of the last look at the claims
        self.generation: int | None = None
        self.rows: list[dict[str, Any]] = []
        self.failover: FailoverDecision | None = None
        self.roll: RollStep | None = None
        self.last_failover: Obj | None = None
        self.last_status: Obj | None = None
        self._announced: set[str] = set()  # one-shot events (keys) not to repeat every tick
        self.planned_restart: str | None = None  # master pod deleted by a rolling restart
        self.last_handover: Obj | None = None
        # (old master, monotonic time) of the last hand-over this process made.
        self.handed_over: tuple[str, float] | None = None
        self.switchover: Obj | None = None  # the last switchover-to request and its outcome
        self.verifier = Verifier(api, namespace, name, self._event)

    # ------------------------------------------------------------ handlers' entry points
    def _load(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        self.involved = {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                                      "uid": meta.get("uid")}}
        if self.state is None:
            status = body.get("status") or {}
            self.state = GroupState.from_status(status)
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
            self.memory.served_before = ready or self.state.epoch > 0 or status.get("established") is True
            self.last_status = dict(body.get("status") or {}) or None
            lf = (body.get("status") or {}).get("lastFailover")
            self.last_failover = dict(lf) if isinstance(lf, Mapping) else None
            lh, so = status.get("lastHandOver"), status.get("switchover")
            self.last_handover = dict(lh) if isinstance(lh, Mapping) else None
            self.switchover = dict(so) if isinstance(so, Mapping) else None
            self.verifier.load(status)

    async def ensure(self, body: Mapping[str, Any]) -> None:
        """create/update/resume: validate the spec and create-or-patch every child."""
        async with self.lock:
            self._load(body)
            meta = body.get("metadata") or {}
            self.generation = meta.get("generation")
            self.paused = (meta.get("annotations") or {}).get(PAUSED_ANNOTATION) == "true"
            try:
                spec = parse_spec(body)
                found = problems(spec)
            except SpecError as exc:
                spec, found = None, [str(exc)]
            if spec is not None and not found:
                try:
                    found = fixed_port_problems(await self._applied_spec(), spec)
                except ApiError as exc:
                    raise TemporaryFailure(str(exc)) from exc
            if found:
                message = "; ".join(found)
                if self.invalid != message:
                    await self._event("Warning", "InvalidSpec", f"spec not applied, children left as they are: "
                                                                f"{message}")
                self.invalid = message
                metrics.RECONCILES.labels(self.namespace, self.name, "invalid").inc()
                # Rows and conditions keep describing what runs: the last applied spec, if any.
                await self._write_status(self.spec or spec)
                return
            assert spec is not None
            if not spec.restart_at and self.spec is not None and self.spec.restart_at:
                # The restart-at annotation removed (a GitOps tool dropping it): a roll is asked for
                # by a new value, not by its absence, so the last value stays in force.
                spec = dataclasses.replace(spec, restart_at=self.spec.restart_at)
            self.invalid = None
            if self.paused:
                if "paused" not in self._announced:
                    await self._event("Normal", "Paused", f"{PAUSED_ANNOTATION} is set: children are not changed")
                    self._announced.add("paused")
                await self._write_status(self.spec or spec)
                return
            self._announced.discard("paused")
            try:
                await self._apply(spec)
            except ApiError as exc:
                if exc.status in (400, 422):
                    # The API server refused a child built from this spec (a quantity, a class name
                    # or a scheduling term it validates): reported like an invalid spec, not
                    # retried as if the server were away, and never shown as applied.
                    message = f"the API server refused a child of this spec: {exc.message}"
                    if self.invalid != message:
                        await self._event("Warning", "InvalidSpec", message)
                    self.invalid = message
                    metrics.RECONCILES.labels(self.namespace, self.name, "invalid").inc()
                    await self._write_status(self.spec or spec)
                    return
                metrics.RECONCILES.labels(self.namespace, self.name, "error").inc()
                raise TemporaryFailure(str(exc)) from exc
            metrics.RECONCILES.labels(self.namespace, self.name, "ok").inc()
            await self._write_status(spec)

    async def _apply(self, spec: GroupSpec) -> None:
        assert self.state is not None
        sts_replicas, note = statefulset_replicas(spec.replicas, self.state)
        running = len(self.state.assignment)
        if sts_replicas < running and self.failover is not None and self.failover.action != "none":
            # The election counts the slaves that followed the lost master; removing one now would
            # block a SYNC failover for good. The scale-down is carried out once the group settles.
            sts_replicas, note = running, (f"scale-down to {spec.replicas} deferred while the master is "
                                           f"unavailable ({self.failover.reason})")
        if note and note != self.scale_note:
            await self._event("Warning", "ScaleDownRefused", note)
        self.scale_note = note
        assignment = complete_assignment(self.state.assignment, sts_replicas)
        kept = {builders.pod_name(spec, o) for o in assignment}
        # A former master scaled away has nothing left to demote.
        self.state = dataclasses.replace(self.state, assignment=assignment, pending_demotion=tuple(
            p for p in self.state.pending_demotion if p in kept))
        await self._ensure_token(spec)
        changed = []
        prev = self.spec
        dropped = {"labels": set(prev.pod_labels) - set(spec.pod_labels),
                   "annotations": set(prev.pod_annotations) - set(spec.pod_annotations)} if prev else None
        for obj in builders.children(spec, self.state.assignment, sts_replicas, self.state.epoch):
            result = await self.api.apply(obj, dropped)
            if result != "unchanged":
                changed.append(f"{obj['kind']}/{obj['metadata']['name']} {result}")
        # Children of a managed nameserver that is now external are removed.
        if not spec.name_server.managed:
            for api_version, kind, name in builders.child_refs(spec):
                if "namesrv" in name and await self.api.delete(api_version, kind, spec.namespace, name):
                    changed.append(f"{kind}/{name} deleted")
        if changed:
            log.info("%s/%s: %s", self.namespace, self.name, ", ".join(changed))
        self.spec = spec
        await self._resize_volumes(spec)
        await self._check_secrets(spec)

    async def _check_secrets(self, spec: GroupSpec) -> None:
        """Whether the Secrets spec.tls and spec.acl name exist with the keys the pods mount:
        without them the pods never start, and the condition says why (the Secret may come later)."""
        self._secrets_checked = time.monotonic()
        notes = []
        for field_name, name, keys in builders.secret_refs(spec):
            try:
                secret = await self.api.get("v1", "Secret", spec.namespace, name)
            except ApiError as exc:
                notes.append(f"Secret {name} ({field_name}) could not be read: {exc.message or exc.reason}")
                continue
            if secret is None:
                notes.append(f"Secret {name} ({field_name}) not found: the pods that mount it cannot start")
                continue
            present = {**(secret.get("data") or {}), **(secret.get("stringData") or {})}
            missing = [k for k in keys if not present.get(k)]
            if missing:
                notes.append(f"Secret {name} ({field_name}) has no {', '.join(missing)}: the pods that mount it "
                             "cannot start")
        note = "; ".join(notes) or None
        if note and note != self.secret_note:
            await self._event("Warning", "SecretMissing", note)
        self.secret_note = note

    async def _resize_volumes(self, spec: GroupSpec) -> None:
        """Grow every broker's PersistentVolumeClaim to ``spec.storage.size``.

        A StatefulSet's claim template cannot change, so its claims are patched one by one; the
        StorageClass must allow expansion. Claims made later from the old template (scale-up) are
        grown on a later round. Claims larger than the spec stay: volumes never shrink.
        """
        assert self.state is not None
        self._volumes_checked = time.monotonic()
        names = [builders.claim_name(spec, o) for o in sorted(self.state.assignment)]
        claims: dict[str, str | None] = {}
        failed: list[str] = []
        other_class: list[str] = []
        for name in names:
            try:
                pvc = await self.api.get("v1", "PersistentVolumeClaim", spec.namespace, name)
            except ApiError as exc:
                failed.append(f"{name}: {exc.message or exc.reason}")
                continue
            claims[name] = None if pvc is None else \
                str((((pvc.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage", ""))
            have = ((pvc or {}).get("spec") or {}).get("storageClassName")
            if pvc is not None and spec.storage_class and have and have != spec.storage_class:
                other_class.append(f"{name} ({have})")
        grow, larger = volume_resizes(claims, spec.storage_size)
        for name, size in grow.items():
            try:
                await self.api.patch("v1", "PersistentVolumeClaim", spec.namespace, name,
                                     {"spec": {"resources": {"requests": {"storage": size}}}})
            except ApiError as exc:
                failed.append(f"{name}: {exc.message or exc.reason}")
                continue
            await self._event("Normal", "VolumeExpansion", f"{name}: storage request {claims[name]} -> {size}")
        notes = []
        if failed:
            notes.append(f"volumes not resized to {spec.storage_size} (does the StorageClass allow expansion?): "
                         + "; ".join(failed))
        if larger:
            notes.append(f"spec.storage.size {spec.storage_size} is below existing volumes, which never shrink: "
                         + ", ".join(larger))
        if other_class:
            # Neither a claim's class nor the StatefulSet's claim template can change.
            notes.append(f"spec.storage.storageClassName {spec.storage_class} is not the class of existing volumes, "
                         "which keep theirs (moving the data is a new group's job): " + ", ".join(other_class))
        note = "; ".join(notes) or None
        if note and note != self.storage_note:
            await self._event("Warning", "VolumeNotResized", note)
        self.storage_note = note

    async def _ensure_token(self, spec: GroupSpec) -> str:
        secret = await self.api.ensure_created(builders.admin_secret(spec, secrets.token_hex(24)))
        raw = (secret.get("data") or {}).get(builders.TOKEN_KEY, "")
        self.token = base64.b64decode(raw).decode().strip() if raw else ""
        return self.token

    async def cleanup(self, body: Mapping[str, Any]) -> None:
        """delete: remove every child (PVCs are kept: the StatefulSet retains claims)."""
        async with self.lock:
            self._load(body)
            try:
                spec = self.spec or parse_spec(body)
            except SpecError:
                spec = dataclasses.replace(GroupSpec(name=self.name, namespace=self.namespace, uid=""))
            try:
                for api_version, kind, name in builders.child_refs(spec):
                    await self.api.delete(api_version, kind, spec.namespace, name)
                await self.verifier.cleanup(spec)
                # Pods go with their StatefulSet through garbage collection on a real cluster.
            except ApiError as exc:
                raise TemporaryFailure(str(exc)) from exc
            metrics.forget_group(self.namespace, self.name)

    # ------------------------------------------------------------ polling
    async def _applied_spec(self) -> GroupSpec | None:
        """The last applied spec: in memory, else from the ConfigMap (operator restarted)."""
        if self.spec is not None:
            return self.spec
        cm = await self.api.get("v1", "ConfigMap", self.namespace, f"{self.name}-config")
        text = ((cm or {}).get("metadata", {}).get("annotations") or {}).get(builders.APPLIED_SPEC_ANNOTATION)
        if text:
            try:
                self.spec = GroupSpec.from_json(text)
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("%s/%s: unreadable applied spec on the ConfigMap: %s", self.namespace, self.name, exc)
        return self.spec

    async def _observe(self, spec: GroupSpec) -> dict[str, PodView]:
        assert self.state is not None
        pods = await self.api.list_pods(spec.namespace, builders.selector(spec, "broker"))
        by_name = {str(p["metadata"]["name"]): p for p in pods}
        wanted = {builders.pod_name(spec, o) for o in self.state.assignment}
        names = sorted(n for n in by_name if n in wanted)
        token = self.token or await self._ensure_token(spec)

        async def status_of(pod: Mapping[str, Any]) -> BrokerView | None:
            ip = (pod.get("status") or {}).get("podIP")
            if not ip or (pod.get("metadata") or {}).get("deletionTimestamp"):
                return None
            try:
                return BrokerView.from_status(await self.admin.status(ip, spec.ports.admin, token))
            except (AdminError, ValueError, TypeError) as exc:
                log.debug("%s: status unavailable: %s", pod["metadata"]["name"], exc)
                return None

        views = await asyncio.gather(*(status_of(by_name[n]) for n in names))
        return {n: pod_view(by_name[n], v) for n, v in zip(names, views, strict=True)}

    async def _reobserve(self, spec: GroupSpec) -> tuple[dict[str, PodView], float]:
        """Look at the brokers again after a role change in this round, and remember what is seen."""
        assert self.state is not None
        views = await self._observe(spec)
        now = time.monotonic()
        observe(self.memory, spec, self.state.master_pod(spec), views, now,
                lost=lost_data(spec, self.state, views, self.memory) is not None)
        return views, now

    async def tick(self, body: Mapping[str, Any]) -> None:
        """One polling round: observe, fail over if needed, align roles, roll, write status."""
        async with self.lock:
            self._load(body)
            spec = await self._applied_spec()
            if spec is None or self.state is None or not self.state.assignment:
                return
            now = time.monotonic()
            views = await self._observe(spec)
            if not self.paused:
                await self._adopt_reported_master(spec, views)
                if (await self._restore_term_owner(spec, views) or await self._resume_demoted_master(spec, views)
                        or await self._restart_lone_master(spec, views)):
                    views = await self._observe(spec)
            observe(self.memory, spec, self.state.master_pod(spec), views, now,
                    lost=lost_data(spec, self.state, views, self.memory) is not None)
            if self.memory.seen_healthy:
                self.memory.served_before = True
            # How long the master has been lost is read now, with this round's answers in: a hung
            # master's status call takes its whole timeout, and lost_since is when the first round
            # that failed to reach it began. Read at this round's start, a hung master was promoted
            # away from one round later than masterLostSeconds says.
            decision = decide_failover(spec, self.state, views, self.memory, time.monotonic())
            await self._announce_failover(spec, decision)
            if not self.paused and decision.action == "none" and first_term(spec, self.state, views) \
                    and await self._begin_first_term(spec, views):
                # Its slaves re-handshake into the new epoch: until then none is in sync.
                views, now = await self._reobserve(spec)
            if not self.paused:
                if decision.action == "promote" and await self._promote(spec, decision, views, now):
                    views, now = await self._reobserve(spec)
                    decision = FailoverDecision("none", "FailoverCompleted")
                await self._align(spec, views, now)
                self._settle_demotions(spec, views)
                # A new group whose master never started may be waiting on a pod the spec has fixed since.
                starting = decision.reason == "MasterStarting"
                switched = await self._switchover(spec, views, (body.get("metadata") or {}).get("annotations") or {}) \
                    if decision.action == "none" else None
                if switched == "HandOverFailed":
                    # The master may be a demoted slave now: it resumes in this round, and the
                    # status shows what serves rather than what was seen before the attempt.
                    views, now = await self._reobserve(spec)
                    if await self._resume_demoted_master(spec, views):
                        views, now = await self._reobserve(spec)
                elif switched:
                    # One change a round: the roll looks again at the next one.
                    self.roll = RollStep(None, switched, self.roll.pending if self.roll else ())
                else:
                    self.roll = await self._roll(spec, views, now, new_group=starting) \
                        if decision.action == "none" or starting else None
                if self.roll is not None and self.roll.reason == "HandedOver":
                    # The others follow the new master now (a SYNC master takes no send without one).
                    views, now = await self._reobserve(spec)
                    await self._align(spec, views, now)
                if now - self._secrets_checked >= (SECRET_RECHECK_SECONDS if self.secret_note else
                                                    VOLUME_CHECK_SECONDS):
                    await self._check_secrets(spec)
                if now - self._volumes_checked >= VOLUME_CHECK_SECONDS:
                    # Claims a scale-up made from the old template, or a resize that failed before.
                    try:
                        await self._resize_volumes(spec)
                    except ApiError as exc:
                        log.warning("%s/%s: volume check failed: %s", self.namespace, self.name, exc)
            self.failover = decision
            if (self.scale_note and decision.action == "none" and not self.paused and self.invalid is None
                    and statefulset_replicas(spec.replicas, self.state)[1] is None):
                # A scale-down refused (the master was among the removed ordinals) or deferred
                # (failing over) is carried out once that no longer holds.
                try:
                    await self._apply(spec)
                except ApiError as exc:
                    log.warning("%s/%s: scale-down not applied: %s", self.namespace, self.name, exc)
            self.rows = replica_rows(spec, self.state, views)
            await self._announce_disks()
            await self._verify(spec, body)
            await self._write_status(spec)

    async def _announce_disks(self) -> None:
        """One event when a broker's disk fills up (it refuses sends) and one when it has room again."""
        full = {str(r["pod"]): r.get("diskUsedPercent") for r in self.rows if r.get("diskFull")}
        for pod in sorted(set(full) - self._full_disks):
            await self._event("Warning", "DiskFull", f"{pod}: disk {full[pod]}% used, over diskSpaceWarningLevelRatio; "
                                                     "it refuses sends until retention frees space or the volume "
                                                     "grows (spec.storage.size)")
        for pod in sorted(self._full_disks - set(full)):
            await self._event("Normal", "DiskOK", f"{pod}: disk has room again, sends are taken")
        self._full_disks = set(full)

    async def _verify(self, spec: GroupSpec, body: Mapping[str, Any]) -> None:
        """Replica verification's part of the round; its failures never hold up the rest."""
        assert self.state is not None
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        try:
            await self.verifier.round(spec, self.state.assignment, annotations, self.paused)
        except ApiError as exc:
            log.warning("%s/%s: verification round failed: %s", self.namespace, self.name, exc)
        except Exception:
            log.exception("%s/%s: verification round failed", self.namespace, self.name)

    async def _announce_failover(self, spec: GroupSpec, decision: FailoverDecision) -> None:
        key = f"failover:{decision.reason}"
        planned = decision.reason == "MasterLost" and self.planned_restart == self.memory.master
        if decision.action == "none":
            self.planned_restart = None
        if decision.action in ("wait", "blocked") and decision.reason != "MasterStarting" and not planned \
                and key not in self._announced:
            self._announced = {k for k in self._announced if not k.startswith("failover:")} | {key}
            await self._event("Warning", decision.reason, decision.message)
        elif decision.action == "none":
            self._announced = {k for k in self._announced if not k.startswith("failover:")}

    async def _promote(self, spec: GroupSpec, decision: FailoverDecision, views: Mapping[str, PodView],
                       now: float) -> bool:
        assert self.state is not None and decision.candidate is not None
        old_master = self.state.master_pod(spec)
        lost_since = self.memory.lost_since if self.memory.lost_since is not None else now
        assert old_master is not None and self.token is not None
        # Fence every slave first: a master that is only hung could otherwise still get an ack (and
        # answer SEND_OK) after the choice. Choose again on the final offsets the slaves answer.
        fenced: dict[str, int] = {}
        for pod in fence_targets(views, old_master):
            ip = views[pod].ip
            assert ip is not None
            try:
                answer = await self.admin.fence(ip, spec.ports.admin, self.token, decision.epoch)
                fenced[pod] = int(answer.get("maxPhyOffset") or 0)
            except AdminError as exc:
                broker = views[pod].broker
                if exc.status == 404 and broker is not None:
                    # An older broker image without the fence (an upgrade in progress): chosen on the
                    # offset its status showed, as before fencing existed.
                    log.warning("%s/%s: %s cannot be fenced (no POST /ha/fence: an older image)",
                                self.namespace, self.name, pod)
                    fenced[pod] = broker.max_offset
                else:
                    log.warning("%s/%s: fencing %s failed: %s", self.namespace, self.name, pod, exc)
        candidate, why = choose_candidate(spec, self.state, old_master, after_fencing(views, old_master, fenced),
                                          self.memory)
        if candidate is None:
            key = f"failover:fenced:{why}"  # said once per reason, like the decision's own refusals
            if key not in self._announced:
                self._announced.add(key)
                metrics.FAILOVERS.labels(self.namespace, self.name, "error").inc()
                await self._event("Warning", "PromotionFailed", f"not promoting after fencing the slaves: {why}")
            return False
        cand = views[candidate]
        assert cand.ip is not None
        if not decision.master_lost_data and await self._lost_master_serves(spec, views, old_master,
                                                                             fenced.values()):
            # Seen lost when this round began, back by now (the kubelet restarted its container):
            # a promotion would cut what it has taken since, acknowledged sends under ASYNC. The
            # slaves just fenced are re-pointed to it by the alignment. Should it be lost again
            # before the next round sees it, masterLostSeconds counts afresh.
            self.memory.lost_since = None
            await self._event("Normal", "MasterReturned",
                              f"master {old_master} serves again: not promoting {candidate}")
            return False
        try:
            result = await self.admin.set_role(cand.ip, spec.ports.admin, self.token, spec.master_role, 0,
                                               decision.epoch)
        except AdminError as exc:
            metrics.FAILOVERS.labels(self.namespace, self.name, "error").inc()
            await self._event("Warning", "PromotionFailed", f"POST /role to {cand.name} failed: {exc}")
            return False
        took = time.monotonic() - lost_since
        self.state = self.state.promoted(spec, cand.ordinal, decision.epoch)
        self.last_failover = {"time": now_iso(), "from": old_master or "", "to": cand.name, "epoch": decision.epoch,
                              "detectionToPromotionSeconds": round(took, 3)}
        metrics.FAILOVERS.labels(self.namespace, self.name, "ok").inc()
        log.warning("%s/%s: promoted %s to %s at epoch %d (offset %s), %.1fs after the master was lost",
                    self.namespace, self.name, cand.name, spec.master_role, decision.epoch,
                    result.get("maxPhyOffset"), took)
        await self._event("Warning", "Promoted",
                          f"{cand.name} promoted to {spec.master_role} (epoch {decision.epoch}); master {old_master} "
                          f"was unavailable for {took:.1f}s")
        # Persist the new assignment before anything else: restarted pods read the ConfigMap and a
        # restarted operator reads the status.
        await self._apply_config_map(spec, "promotion")
        self.failover = FailoverDecision("none", "FailoverCompleted")
        await self._write_status(spec)
        return True

    async def _lost_master_serves(self, spec: GroupSpec, views: Mapping[str, PodView], master: str,
                                  slave_offsets: Iterable[int]) -> bool:
        assert self.state is not None and self.token is not None
        view = views.get(master)
        if view is None or view.ip is None:
            return False
        try:
            broker = BrokerView.from_status(await self.admin.status(view.ip, spec.ports.admin, self.token,
                                                                    RECHECK_TIMEOUT))
        except (AdminError, ValueError, TypeError):
            return False
        return serves_again(self.state, broker, slave_offsets)

    async def _adopt_reported_master(self, spec: GroupSpec, views: Mapping[str, PodView]) -> None:
        """Follow a master of a newer epoch than the status records (a promotion whose status write
        was lost before an operator restart): the assignment, ConfigMap and status catch up with it."""
        assert self.state is not None
        found = reported_master(self.state, views)
        if found is None:
            return
        pod, epoch = found
        ordinal = builders.pod_ordinal(pod)
        assert ordinal is not None
        recorded, recorded_epoch = self.state.master_pod(spec), self.state.epoch
        if pod == recorded:
            self.state = dataclasses.replace(self.state, epoch=epoch)
        else:
            self.state = self.state.promoted(spec, ordinal, epoch)
        log.warning("%s/%s: %s is master at epoch %d, newer than the recorded master %s at epoch %d; following it",
                    self.namespace, self.name, pod, epoch, recorded, recorded_epoch)
        await self._event("Warning", "MasterAdopted",
                          f"{pod} is master at epoch {epoch}, newer than the recorded master {recorded} at epoch "
                          f"{recorded_epoch} (a promotion whose status was not written): the group follows it")
        await self._apply_config_map(spec, f"adopting {pod}")
        await self._write_status(spec)

    async def _master_at(self, spec: GroupSpec, pod: str, view: PodView, epoch: int, failed: str) -> bool:
        """POST /role making ``pod`` the group's master at ``epoch``. Whether it did; a refusal is
        logged (``failed`` says what did not happen) and left to the next round."""
        assert view.ip is not None
        try:
            await self.admin.set_role(view.ip, spec.ports.admin, self.token or "", spec.master_role, 0, epoch)
        except AdminError as exc:
            log.warning("%s/%s: %s %s: %s", self.namespace, self.name, pod, failed, exc)
            return False
        return True

    async def _announce_epoch(self, spec: GroupSpec, kind: str, reason: str, message: str, after: str,
                              write_status: bool = True) -> None:
        """After a role change at a new epoch: the event, the ConfigMap (``haGroupEpoch`` and
        roles for restarts) and, unless the round writes it anyway, the status."""
        await self._event(kind, reason, message)
        await self._apply_config_map(spec, after)
        if write_status:
            await self._write_status(spec)

    async def _restore_term_owner(self, spec: GroupSpec, views: Mapping[str, PodView]) -> bool:
        """Make the broker that began the current epoch master again when the recorded master serves
        in that epoch without having begun it (the group re-created on its kept volumes after a
        failover: its fresh ConfigMap named pod 0). Whether it did."""
        assert self.state is not None
        found = term_owner(spec, self.state, views)
        if found is None:
            return False
        pod, epoch = found
        view = views[pod]
        recorded = self.state.master_pod(spec)
        if not await self._master_at(spec, pod, view, epoch, f"began epoch {epoch} but could not be made master again"):
            return False
        self.state = self.state.promoted(spec, view.ordinal, epoch)
        await self._announce_epoch(
            spec, "Warning", "MasterRestored",
            f"{recorded} was master in epoch {epoch}, which {pod} began (the group was created again on its "
            f"volumes?): {pod}, which holds that term's log, is master again and {recorded} follows it",
            f"restoring {pod}")
        return True

    async def _resume_demoted_master(self, spec: GroupSpec, views: Mapping[str, PodView]) -> bool:
        """Make the recorded master master again when it serves as a slave of nobody (a hand-over
        cut short after its demotion); see :func:`rmqoperator.failover.demoted_master`. Whether it did."""
        assert self.state is not None
        epoch = demoted_master(spec, self.state, views)
        pod = self.state.master_pod(spec)
        if epoch is None or pod is None:
            return False
        if not await self._master_at(spec, pod, views[pod], epoch,
                                     "the master, is a slave of nobody and could not resume"):
            return False
        self.state = dataclasses.replace(self.state, epoch=epoch)
        await self._announce_epoch(
            spec, "Warning", "MasterResumed",
            f"{pod}, the master, was a slave following no master (a hand-over cut short?): it is master again "
            f"at epoch {epoch}", f"resuming {pod}")
        return True

    async def _restart_lone_master(self, spec: GroupSpec, views: Mapping[str, PodView]) -> bool:
        """Let the only broker of a group go on with an empty log at a new epoch after it lost its
        store; see :func:`rmqoperator.failover.lone_master_restart`. Whether it did."""
        assert self.state is not None
        found = lone_master_restart(spec, self.state, views, self.memory)
        pod = self.state.master_pod(spec)
        view = views.get(pod) if pod else None
        if found is None or pod is None or view is None or view.ip is None:
            return False
        epoch, why = found
        if not await self._master_at(spec, pod, view, epoch, f"lost its store and could not begin epoch {epoch}"):
            return False
        self.state = dataclasses.replace(self.state, epoch=epoch)
        self.memory.master_log_id = None  # its new log is the group's now
        await self._announce_epoch(
            spec, "Warning", "StoreLost",
            f"{why}; {pod} is the group's only broker, so nothing holds the messages it had: it goes on with an "
            f"empty log at epoch {epoch}", f"{pod} starting over")
        return True

    async def _begin_first_term(self, spec: GroupSpec, views: Mapping[str, PodView]) -> bool:
        """The master begins epoch 1 (a same-role POST /role), and every broker.conf says so
        (``haGroupEpoch``): a master back on a replaced volume starts at epoch 0, below it, and
        refuses writes instead of acknowledging sends on a log the group will not keep. Whether
        it did (the round's status, written at its end, then shows the new epoch)."""
        assert self.state is not None
        pod = self.state.master_pod(spec)
        view = views.get(pod) if pod else None
        if pod is None or view is None or view.ip is None:
            return False
        if not await self._master_at(spec, pod, view, 1, "did not begin epoch 1"):
            return False
        self.state = dataclasses.replace(self.state, epoch=1)
        await self._announce_epoch(spec, "Normal", "EpochBegun",
                                   f"{pod}, the master, began epoch 1: brokers are told the group's epoch, so one "
                                   "back on a replaced volume takes no writes", "epoch 1", write_status=False)
        return True

    async def _apply_config_map(self, spec: GroupSpec, after: str) -> None:
        """The assignment into the ConfigMap (restarted pods read it); a failure is logged and the
        next ensure or change writes it again."""
        assert self.state is not None
        try:
            await self.api.apply(builders.config_map(spec, self.state.assignment, self.state.epoch))
        except ApiError as exc:
            log.error("%s/%s: ConfigMap not updated after %s: %s", self.namespace, self.name, after, exc)

    async def _align(self, spec: GroupSpec, views: Mapping[str, PodView], now: float) -> None:
        assert self.state is not None
        token = self.token or ""
        failed: set[str] = set()
        for action in plan_alignment(spec, self.state, views, self.memory, now):
            if action.pod in failed or (action.after_demotion and failed):
                continue
            view = views[action.pod]
            try:
                await self._execute(spec, action, view, token)
            except AdminError as exc:
                failed.add(action.pod)
                if action.kind == "repoint":
                    metrics.REPOINTS.labels(self.namespace, self.name, "error").inc()
                log.warning("%s/%s: %s %s failed: %s", self.namespace, self.name, action.kind, action.pod, exc)
            except ApiError as exc:
                failed.add(action.pod)
                log.warning("%s/%s: %s %s failed: %s", self.namespace, self.name, action.kind, action.pod, exc)

    async def _execute(self, spec: GroupSpec, action: Action, view: PodView, token: str) -> None:
        port = spec.ports.admin
        if action.kind == "delete_pod":
            await self.api.delete_pod(spec.namespace, action.pod)
            self.memory.unreachable_since.pop(action.pod, None)
            metrics.RESTARTS.labels(self.namespace, self.name, "unreachable").inc()
            await self._event("Warning", "PodDeleted", f"{action.pod} deleted: {action.reason}")
            return
        assert view.ip is not None
        if action.kind in ("set_mode", "demote"):
            assert action.role is not None and action.broker_id is not None and action.epoch is not None
            await self.admin.set_role(view.ip, port, token, action.role, action.broker_id, action.epoch)
            await self._event("Normal", "RoleChanged", f"{action.pod} -> {action.role} brokerId {action.broker_id} "
                                                       f"({action.reason})")
        elif action.kind == "repoint":
            assert action.ha_address is not None
            await self.admin.repoint(view.ip, port, token, action.ha_address, action.broker_address, action.epoch)
            metrics.REPOINTS.labels(self.namespace, self.name, "ok").inc()
            if self.memory.master:
                self.memory.following[action.pod] = self.memory.master
            await self._event("Normal", "Repointed", f"{action.pod} now follows master {self.memory.master} at "
                                                     f"{action.ha_address}")

    def _settle_demotions(self, spec: GroupSpec, views: Mapping[str, PodView]) -> None:
        assert self.state is not None
        master = views.get(self.state.master_pod(spec) or "")
        if master is None:
            return
        for pod in self.state.pending_demotion:
            v = views.get(pod)
            if v is not None and (follows(spec, v, master) or self.memory.following.get(pod) == master.name):
                self.state = self.state.demoted(pod)

    async def _roll(self, spec: GroupSpec, views: Mapping[str, PodView], now: float,
                    new_group: bool = False) -> RollStep:
        assert self.state is not None
        stuck = frozenset(n for n, since in self.memory.unreachable_since.items() if now - since >= STUCK_SECONDS)
        settling = frozenset({self.handed_over[0]}) if self.handed_over is not None and \
            time.monotonic() - self.handed_over[1] < self.handover_settle else frozenset()
        step = next_restart(views, builders.config_hash(spec), self.state.master_pod(spec),
                            len(self.state.assignment), self.memory.in_sync, stuck=stuck, new_group=new_group,
                            settling=settling)
        if step.pod is not None:
            if step.pod == self.state.master_pod(spec):
                if step.reason == "Restarting" and await self._hand_over(spec, views):
                    # The old master is an outdated slave now: the roll restarts it once it follows.
                    return RollStep(None, "HandedOver", step.pending)
                self.planned_restart = step.pod
            await self.api.delete_pod(spec.namespace, step.pod)
            metrics.RESTARTS.labels(self.namespace, self.name, "rolling").inc()
            why = "it is unavailable with an outdated configuration" if step.reason == "ReplacingUnavailable" \
                else "for a changed configuration"
            await self._event("Normal", "RollingRestart", f"restarting {step.pod}: {why} "
                                                          f"(order: {', '.join(step.pending)})")
        return step

    async def _hand_over(self, spec: GroupSpec, views: Mapping[str, PodView], target: str | None = None) -> bool:
        """Move the master to an in-sync slave: before its planned restart (``target`` None: the
        most advanced in-sync slave), so that writes pause for a drain instead of a pod restart and
        a slow restart cannot turn into a failover; or to ``target`` on request (switchover-to).
        Whether it did; if not, the caller restarts the old master in place (it may be demoted).

        The master is demoted first with a drain (it refuses sends, its slaves take its last
        bytes), the slave is promoted at a new epoch only once it holds every one of them, and it
        takes a last metadata round from the old master: nothing acknowledged is left behind.
        """
        assert self.state is not None
        old = self.state.master_pod(spec)
        cand = target or handover_candidate(spec, self.state, views)
        cand_id = self.state.broker_id_of(spec, cand) if cand else None
        if old is None or cand is None or cand_id is None:
            return False
        trigger = "Switchover" if target else "RollingRestart"
        mv, cv = views[old], views[cand]
        assert mv.ip is not None and cv.ip is not None and mv.broker is not None
        token, port = self.token or "", spec.ports.admin
        epoch = election.next_epoch(self.state.epoch, [p.broker.epoch for p in views.values() if p.broker is not None])
        # The drain waits for the candidate's connection only: another slave stalled cannot keep
        # sends paused. Read now, since a reconnect since the round's look changes it.
        drain_for = cv.broker.ha_local_address if cv.broker else None
        with contextlib.suppress(AdminError, ValueError, TypeError):
            drain_for = BrokerView.from_status(await self.admin.status(cv.ip, port, token)).ha_local_address
        started = time.monotonic()
        try:
            answer = await self.admin.set_role(mv.ip, port, token, "SLAVE", cand_id, self.state.epoch,
                                               drain_millis=HANDOVER_DRAIN_MILLIS, drain_for=drain_for)
        except AdminError as exc:
            return await self._hand_over_failed(old, cand, f"demoting {old} failed: {exc}", bool(target))
        final = answer.get("maxPhyOffset")
        final = final if isinstance(final, int) else mv.broker.max_offset
        if not await self._holds(spec, cv, final):
            return await self._hand_over_failed(old, cand, f"{cand} did not reach {old}'s last offset {final}",
                                                bool(target))
        # The broker refuses the promotion once this has passed: a request it reads late (a paused
        # process) cannot make a second master after the old one was given its role back.
        not_after = int(time.time() * 1000) + HANDOVER_PROMOTE_MILLIS
        try:
            result = await self.admin.set_role(cv.ip, port, token, spec.master_role, 0, epoch,
                                               metadata_from=f"{mv.ip}:{listen_port(spec, mv)}", not_after_ms=not_after)
        except AdminError as exc:
            # The outcome is known only once the deadline (and some clock skew) has passed: then the
            # slave either is master of the new epoch (the answer was lost) or never will be.
            await asyncio.sleep(max(0.0, not_after / 1000 + CLOCK_SKEW_SECONDS - time.time()))
            try:
                now_is = BrokerView.from_status(await self.admin.status(cv.ip, port, token))
            except (AdminError, ValueError, TypeError):
                now_is = None
            if now_is is None or not now_is.is_master or now_is.epoch != epoch:
                return await self._hand_over_failed(old, cand, f"promoting {cand} failed: {exc}", bool(target))
            result = {}
        paused = time.monotonic() - started
        self.handed_over = (old, time.monotonic())
        self.state = self.state.promoted(spec, cv.ordinal, epoch)
        self.last_handover = {"time": now_iso(), "from": old, "to": cand, "epoch": epoch, "trigger": trigger,
                              "sendsPausedSeconds": round(paused, 3)}
        metrics.HANDOVERS.labels(self.namespace, self.name, "ok").inc()
        why = "as requested (switchover-to)" if target else "before its restart"
        await self._event("Normal", "MasterHandedOver",
                          f"{old} handed the master over to {cand} (epoch {epoch}) {why}: sends paused "
                          f"{paused:.2f}s, {cand} holds all {final} bytes of the log")
        if result.get("metadataSynced") is False:
            await self._event("Warning", "MetadataNotSynced",
                              f"{cand} could not take {old}'s metadata before its promotion "
                              f"({result.get('metadataSyncError')}): consumer offsets committed since its last "
                              "periodic sync may be delivered again")
        await self._apply_config_map(spec, "hand-over")
        await self._write_status(spec)
        return True

    async def _holds(self, spec: GroupSpec, view: PodView, offset: int) -> bool:
        """Whether ``view``'s broker holds the log up to ``offset`` as a slave, within a few seconds."""
        assert view.ip is not None
        deadline = time.monotonic() + HANDOVER_CATCHUP_SECONDS
        while True:
            try:
                st = BrokerView.from_status(await self.admin.status(view.ip, spec.ports.admin, self.token or ""))
                if st.role == "SLAVE" and st.max_offset >= offset:
                    return True
            except (AdminError, ValueError, TypeError) as exc:
                log.debug("%s: status unavailable: %s", view.name, exc)
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)

    async def _hand_over_failed(self, old: str, cand: str, why: str, requested: bool) -> bool:
        metrics.HANDOVERS.labels(self.namespace, self.name, "error").inc()
        then = (f"{old} stays master (resumed if it was demoted)" if requested else
                f"restarting {old} in place (its configuration keeps it master)")
        await self._event("Warning", "HandOverFailed", f"master {old} not handed over to {cand}: {why}; {then}")
        return False

    async def _switchover(self, spec: GroupSpec, views: Mapping[str, PodView],
                          annotations: Mapping[str, Any]) -> str | None:
        """The switchover-to annotation: each new value is one request to hand the master over to
        that pod, carried out once it is in sync; its outcome goes to ``status.switchover``.
        "HandedOver" when the master moved this round, "HandOverFailed" when an attempt failed
        (the master may be demoted: the caller resumes it), else None."""
        assert self.state is not None
        request = str(annotations.get(SWITCHOVER_ANNOTATION) or "")
        done = self.switchover or {}
        if not request or (done.get("request") == request and done.get("result") != "Waiting"):
            return None
        verdict, message = switchover_check(spec, self.state, views, request)
        if verdict == "go":
            old = self.state.master_pod(spec)
            if await self._hand_over(spec, views, target=request):
                self._switched(request, "Completed", f"{old} handed the master over to {request}")
                return "HandedOver"
            self._switched(request, "Failed", f"the hand-over to {request} failed (see the HandOverFailed event)")
            return "HandOverFailed"
        result = {"done": "Completed", "refuse": "Refused", "wait": "Waiting"}[verdict]
        if done.get("request") != request or done.get("message") != message:
            await self._event("Warning" if verdict == "refuse" else "Normal", f"Switchover{result}",
                              f"switchover to {request}: {message}")
        self._switched(request, result, message)
        return None

    def _switched(self, request: str, result: str, message: str) -> None:
        now = {"request": request, "result": result, "message": message}
        if any((self.switchover or {}).get(k) != v for k, v in now.items()):
            # Stamped when it changes: a request waiting for its pod writes no status every round.
            self.switchover = {**now, "time": now_iso()}

    # ------------------------------------------------------------ status and events
    async def _write_status(self, spec: GroupSpec | None) -> None:
        assert self.state is not None
        now = now_iso()
        old = self.last_status or {}
        status: Obj = {}
        if self.generation is not None:
            status["observedGeneration"] = self.generation
        health = Health(invalid=self.invalid, paused=self.paused, failover=self.failover,
                        scale_note=self.scale_note, storage_note=self.storage_note, secret_note=self.secret_note,
                        roll_reason=self.roll.reason if self.roll else None,
                        roll_pending=self.roll.pending if self.roll else ())
        if spec is not None:
            status.update(self.state.to_status(spec))
            conds = conditions(spec, self.state, self.rows, health) + self.verifier.conditions()
            status.update(summary(self.rows, self.state.master_pod(spec)))
            status["selector"] = builders.selector_text(spec, "broker")
            status["replicas"] = self.rows
            master_row = next((r for r in self.rows if r["pod"] == status.get("master")), None)
            if master_row and master_row.get("address"):
                status["masterAddress"] = master_row["address"]
        else:
            conds = [Cond("Ready", False, "InvalidSpec", self.invalid or ""),
                     Cond("Degraded", True, "InvalidSpec", self.invalid or ""), *self.verifier.conditions()]
        status["conditions"] = merge_conditions(old.get("conditions"), conds, self.generation, now)
        status["phase"] = phase(conds, health) if spec is not None else "Invalid"
        if self.last_failover:
            status["lastFailover"] = self.last_failover
        if self.last_handover:
            status["lastHandOver"] = self.last_handover
        if self.switchover:
            status["switchover"] = self.switchover
        if self.memory.served_before:
            status["established"] = True
        if self.roll is not None:
            status["rolling"] = {"pending": list(self.roll.pending)}
        status.update(self.verifier.status_fields())
        # Merge patches merge maps: pods gone from the assignment are removed explicitly.
        patch = dict(status)
        if "brokerIds" in status:
            gone = {k: None for k in (old.get("brokerIds") or {}) if k not in status["brokerIds"]}
            patch["brokerIds"] = {**status["brokerIds"], **gone}
        if all(old.get(k) == v for k, v in status.items()) and not any(
                v is None for v in patch.get("brokerIds", {}).values()):
            return
        try:
            await self.api.patch_group_status(self.namespace, self.name, patch)
        except ApiError as exc:
            if exc.status == 404:
                return  # deleted meanwhile
            log.warning("%s/%s: status not written: %s", self.namespace, self.name, exc)
            return
        self.last_status = status
        if spec is not None:
            self._export(status)

    def _export(self, status: Mapping[str, Any]) -> None:
        ns, name = self.namespace, self.name
        metrics.MAX_LAG.labels(ns, name).set(status.get("maxLagBytes", 0))
        metrics.IN_SYNC.labels(ns, name).set(status.get("inSyncReplicas", 0))
        ready: Mapping[str, Any] = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
        metrics.READY.labels(ns, name).set(1 if ready.get("status") == "True" else 0)
        metrics.EPOCH.labels(ns, name).set(status.get("epoch", 0))

    async def _event(self, type_: str, reason: str, message: str) -> None:
        log.info("%s/%s event %s: %s", self.namespace, self.name, reason, message)
        await self.api.post_event(self.involved, type_, reason, message)


class Runtime:
    """Process-wide operator state kept in kopf's memo: API clients and the group controllers."""

    def __init__(self, poll_interval: float = 1.0, handover_settle: float = HANDOVER_SETTLE_SECONDS) -> None:
        self.api: KubeApi | None = None
        self.admin = BrokerAdmin()
        self.poll_interval = poll_interval
        self.handover_settle = handover_settle
        self.controllers: dict[tuple[str, str], GroupController] = {}

    def set_credentials(self, info: Any) -> None:
        if self.api is None:
            self.api = KubeApi.from_connection_info(info)
        else:
            self.api.set_credentials(info)

    def controller(self, namespace: str, name: str) -> GroupController:
        key = (namespace, name)
        ctl = self.controllers.get(key)
        if ctl is None:
            if self.api is None:
                raise TemporaryFailure("not logged in to the API server yet")
            ctl = GroupController(self.api, self.admin, namespace, name, self.poll_interval, self.handover_settle)
            self.controllers[key] = ctl
        return ctl

    def forget(self, namespace: str, name: str) -> None:
        self.controllers.pop((namespace, name), None)

    async def close(self) -> None:
        await self.admin.close()
        if self.api is not None:
            await self.api.close()
