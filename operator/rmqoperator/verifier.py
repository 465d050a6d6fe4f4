"""Per-group orchestration of replica verification: start the ``rmq-verify`` Job, collect its result.

A :class:`Verifier` belongs to one :class:`~rmqoperator.controller.GroupController` and runs inside
its polling round (under the controller's lock). Each round it

1. follows the running Job, if any: once it has finished, reads the report summary from its
   pod's termination message (else from the report ConfigMap), turns it into
   ``status.lastVerification``, the ``ReplicasVerified`` condition and an Event, and prunes old
   Jobs;
2. starts a Job when the schedule is due or a new ``verify-now`` value is set, unless one runs
   already (the Jobs are listed first: a Job whose start was not yet recorded in the status, e.g.
   across an operator restart, is adopted instead of starting a second one) or the group is paused.

Decisions are in :mod:`rmqoperator.verification`, the Job in :func:`rmqoperator.builders.verification_job`,
API calls go through :mod:`rmqoperator.k8s`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from rmqoperator import builders, verification
from rmqoperator.k8s import ApiError, KubeApi
from rmqoperator.spec import GroupSpec, SpecError
from rmqoperator.status import Cond
from rmqoperator.verification import VerifyState

log = logging.getLogger(__name__)

Obj = dict[str, Any]
EventSink = Callable[[str, str, str], Awaitable[None]]


class Verifier:
    """Verification state and actions of one BrokerGroup."""

    def __init__(self, api: KubeApi, namespace: str, name: str, event: EventSink) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.event = event
        self.state = VerifyState()
        self.last: Obj | None = None  # status.lastVerification
        self.condition: Cond | None = None  # ReplicasVerified
        self.tracked = False  # whether status.verification is written at all

    def load(self, status: Mapping[str, Any] | None) -> None:
        """From the status as last written (once, when the controller starts following the group)."""
        status = status or {}
        self.state = VerifyState.from_status(status)
        self.tracked = isinstance(status.get("verification"), Mapping)
        last = status.get("lastVerification")
        self.last = dict(last) if isinstance(last, Mapping) else None
        self.condition = verification.condition_from_status(status)

    # ------------------------------------------------------------ status
    def status_fields(self) -> Obj:
        """``status.verification`` (once written, always: a cleared field must reach the status) and
        ``status.lastVerification``."""
        out: Obj = {}
        if self.tracked or self.state != VerifyState():
            self.tracked = True
            out["verification"] = self.state.to_status()
        if self.last is not None:
            out["lastVerification"] = self.last
        return out

    def conditions(self) -> list[Cond]:
        return [self.condition] if self.condition is not None else []

    # ------------------------------------------------------------ the polling round
    async def round(self, spec: GroupSpec, ordinals: Iterable[int], annotations: Mapping[str, Any],
                    paused: bool) -> None:
        now = verification.utcnow()
        if self.state.active_job is not None:
            await self._follow(spec, self.state.active_job)
        try:
            vspec = verification.verification_of(spec)
        except SpecError as exc:  # refused by problems() before it is applied; be safe anyway
            log.warning("%s/%s: verification not run: %s", self.namespace, self.name, exc)
            return
        self.state = verification.track_schedule(self.state, vspec.schedule, now)
        request = annotations.get(verification.VERIFY_NOW_ANNOTATION)
        trigger = verification.pending_trigger(self.state, str(request) if request is not None else None, now)
        if trigger is None or paused or self.state.active_job is not None:
            return
        jobs = await self._jobs(spec)
        running = verification.running_jobs(jobs)
        if running:
            # Started by an earlier operator run that could not record it: follow it, start none.
            self.state = dataclasses.replace(self.state, active_job=running[-1])
            log.info("%s/%s: verification job %s is running already", self.namespace, self.name, running[-1])
            return
        if trigger.request is not None and trigger.request in verification.answered_requests(jobs):
            # Answered by a Job whose start was not recorded in the status: not again.
            self.state = dataclasses.replace(self.state, last_request=trigger.request)
            trigger = dataclasses.replace(trigger, request=None)
            if trigger.scheduled is None:
                return
        name = verification.job_name(spec.name, trigger, now)
        job = builders.verification_job(spec, vspec, name, ordinals, trigger.annotations())
        try:
            await self.api.create(job)
        except ApiError as exc:
            if exc.status != 409:
                raise
            log.info("%s/%s: verification job %s exists already: following it", self.namespace, self.name, name)
        self.state = verification.started(self.state, trigger, name, now)
        await self.event("Normal", "VerificationStarted", f"job {name} verifies the replicas ({trigger.describe()})")

    async def _jobs(self, spec: GroupSpec) -> list[Obj]:
        return await self.api.list_objects("batch/v1", "Job", spec.namespace,
                                           builders.selector(spec, "verification"))

    async def _follow(self, spec: GroupSpec, name: str) -> None:
        job = await self.api.get("batch/v1", "Job", spec.namespace, name)
        if job is not None and verification.job_finished(job) is None:
            return  # still running
        pods = await self.api.list_pods(spec.namespace, {**builders.selector(spec, "verification"),
                                                         builders.VERIFY_JOB_LABEL: name})
        summary = verification.termination_summary(pods)
        if summary is None:
            cm = await self.api.get("v1", "ConfigMap", spec.namespace, builders.verification_configmap_name(spec))
            summary = verification.configmap_summary(cm, job)
        why = None
        if summary is None:
            why = (verification.job_failure(job) or verification.pod_failure(pods)
                   or ("the job was deleted before it finished" if job is None else None))
        result = verification.verdict(name, summary, why, verification.utcnow(), job)
        self.last = result.last
        self.condition = result.condition
        self.state = dataclasses.replace(self.state, active_job=None)
        log.info("%s/%s: verification job %s: %s", self.namespace, self.name, name, result.last.get("result"))
        await self.event(*result.event)
        await self._prune(spec)

    async def _prune(self, spec: GroupSpec) -> None:
        try:
            for name in verification.jobs_to_prune(await self._jobs(spec)):
                await self.api.delete("batch/v1", "Job", spec.namespace, name)
        except ApiError as exc:
            log.warning("%s/%s: old verification jobs not pruned: %s", self.namespace, self.name, exc)

    async def cleanup(self, spec: GroupSpec) -> None:
        """Group deleted: its Jobs (with their pods) and the report ConfigMap go too."""
        for job in await self._jobs(spec):
            await self.api.delete("batch/v1", "Job", spec.namespace, str(job["metadata"]["name"]))
        await self.api.delete("v1", "ConfigMap", spec.namespace, builders.verification_configmap_name(spec))
