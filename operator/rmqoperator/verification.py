"""Pure decisions of replica verification: when to run the ``rmq-verify`` Job, and what its report means.

A BrokerGroup asks for verification runs two ways:

* ``spec.verification.schedule``: a 5-field cron expression (or ``@daily``...) evaluated in UTC by
  the group's polling daemon. The operator remembers, in ``status.verification``, the schedule it
  tracks and its ``nextScheduleTime``: a schedule seen for the first time (or changed) is due at its
  next fire time, not at once; a fire time missed while a Job was running or the operator was down
  is run once, as soon as possible (missed fire times collapse into one run, like a CronJob's).
* the annotation ``rmq.brokergroup.dev/verify-now: <any new value>``: one run per new value (the
  value handled last is ``status.verification.lastRequest``).

At most one verification Job runs per group; a trigger arriving meanwhile waits for it to end. No
Job is started while the group is paused (a pending trigger runs once it is resumed).

The Job (``builders.verification_job``) writes a compact JSON summary of its report as its
termination message (``rmqbroker.verify.report.summary``, at most 4096 bytes) and, when it runs
under a service account allowed to write it, the full report to the ConfigMap
``<group>-verification``. :func:`verdict` turns that summary (or the lack of one) into
``status.lastVerification``, the ``ReplicasVerified`` condition and the Event to post.

Everything here is a function of its arguments, except :func:`utcnow` (the clock, one place).
"""

from __future__ import annotations

import datetime
import json
import logging
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from croniter import croniter

from rmqoperator.builders import VERIFY_CONTAINER
from rmqoperator.spec import GROUP, GroupSpec, SpecError
from rmqoperator.status import Cond

log = logging.getLogger(__name__)

Obj = dict[str, Any]

VERIFY_NOW_ANNOTATION = f"{GROUP}/verify-now"
# On the Job: what it answers (the schedule's fire time, the verify-now value).
SCHEDULED_TIME_ANNOTATION = f"{GROUP}/scheduled-time"
REQUEST_ANNOTATION = f"{GROUP}/verify-request"
CONDITION = "ReplicasVerified"

DEFAULT_ACTIVE_DEADLINE_SECONDS = 6 * 3600
# Finished Jobs kept (with their pods, for `kubectl logs`) besides the Job's own TTL.
JOB_HISTORY = 3
# The job's own clock vs the Job's creation time: a ConfigMap summary older than the Job by more
# than this is a previous run's.
CLOCK_SKEW_SECONDS = 120

# rmq-verify's ``result`` -> status.lastVerification.result
RESULTS = {"clean": "Passed", "mismatch": "Failed", "error": "Error"}
MACROS = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})


def utcnow() -> datetime.datetime:
    """The operator's clock for schedules (tests replace it)."""
    return datetime.datetime.now(tz=datetime.UTC)


def iso(t: datetime.datetime) -> str:
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> datetime.datetime | None:
    """An ISO-8601 time (``Z``, an offset, or naive = UTC); None when it is not one."""
    if not isinstance(text, str) or not text:
        return None
    try:
        t = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=datetime.UTC)


# ---------------------------------------------------------------- spec.verification
@dataclass(frozen=True)
class VerificationSpec:
    schedule: str | None = None
    image: str | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    service_account: str | None = None
    active_deadline_seconds: int = DEFAULT_ACTIVE_DEADLINE_SECONDS


def _field(obj: Mapping[str, Any], key: str, typ: type, default: Any) -> Any:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise SpecError(f"spec.verification.{key} must be of type {typ.__name__}")
    return value


def verification_of(spec: GroupSpec) -> VerificationSpec:
    """``spec.verification`` as a value; SpecError on a field of the wrong type."""
    v = spec.verification
    resources = v.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise SpecError("spec.verification.resources must be an object")
    return VerificationSpec(
        schedule=(_field(v, "schedule", str, "") or "").strip() or None,
        image=_field(v, "image", str, None) or None,
        resources=dict(resources),
        service_account=_field(v, "serviceAccountName", str, None) or None,
        active_deadline_seconds=_field(v, "activeDeadlineSeconds", int, DEFAULT_ACTIVE_DEADLINE_SECONDS))


def schedule_problem(expr: str) -> str | None:
    """Why ``expr`` is not a usable schedule (None when it is)."""
    text = expr.strip()
    if text.startswith("@"):
        return None if text in MACROS else f"unknown schedule macro {text!r}"
    if len(text.split()) != 5:
        return f"schedule {expr!r} must have 5 fields (minute hour day-of-month month day-of-week)"
    return None if croniter.is_valid(text) else f"schedule {expr!r} is not a valid cron expression"


def problems(spec: GroupSpec) -> list[str]:
    try:
        v = verification_of(spec)
    except SpecError as exc:
        return [str(exc)]
    out = []
    if v.schedule is not None:
        problem = schedule_problem(v.schedule)
        if problem:
            out.append(f"spec.verification.schedule: {problem}")
    if v.active_deadline_seconds < 60:
        out.append("spec.verification.activeDeadlineSeconds must be at least 60")
    return out


# ---------------------------------------------------------------- cron
def latest_fire(expr: str, now: datetime.datetime) -> datetime.datetime:
    """The last time ``expr`` fired at or before ``now`` (UTC)."""
    start = now.astimezone(datetime.UTC).replace(microsecond=0) + datetime.timedelta(seconds=1)
    prev: datetime.datetime = croniter(expr.strip(), start).get_prev(datetime.datetime)
    return prev


def next_fire(expr: str, after: datetime.datetime) -> datetime.datetime:
    """The first time ``expr`` fires strictly after ``after`` (UTC)."""
    nxt: datetime.datetime = croniter(expr.strip(), after.astimezone(datetime.UTC)).get_next(datetime.datetime)
    return nxt


# ---------------------------------------------------------------- scheduling state
@dataclass(frozen=True)
class VerifyState:
    """What ``status.verification`` persists between polling rounds and operator restarts."""

    schedule: str | None = None  # the schedule next_schedule_time was computed for
    next_schedule_time: str | None = None
    last_schedule_time: str | None = None
    last_request: str | None = None  # the verify-now value answered last
    active_job: str | None = None

    @staticmethod
    def from_status(status: Mapping[str, Any] | None) -> VerifyState:
        v = (status or {}).get("verification")
        if not isinstance(v, Mapping):
            return VerifyState()

        def s(key: str) -> str | None:
            value = v.get(key)
            return value if isinstance(value, str) and value else None

        return VerifyState(schedule=s("schedule"), next_schedule_time=s("nextScheduleTime"),
                           last_schedule_time=s("lastScheduleTime"), last_request=s("lastRequest"),
                           active_job=s("activeJob"))

    def to_status(self) -> dict[str, Any]:
        """Every key, None for the unset ones (a merge patch removes them)."""
        return {"schedule": self.schedule, "nextScheduleTime": self.next_schedule_time,
                "lastScheduleTime": self.last_schedule_time, "lastRequest": self.last_request,
                "activeJob": self.active_job}


@dataclass(frozen=True)
class Trigger:
    """Why a run starts: a schedule fire time, a verify-now value, or both."""

    scheduled: datetime.datetime | None = None
    request: str | None = None

    def describe(self) -> str:
        parts = []
        if self.scheduled is not None:
            parts.append(f"scheduled for {iso(self.scheduled)}")
        if self.request is not None:
            parts.append(f"requested by {VERIFY_NOW_ANNOTATION}={self.request!r}")
        return " and ".join(parts)

    def annotations(self) -> dict[str, str]:
        out = {}
        if self.scheduled is not None:
            out[SCHEDULED_TIME_ANNOTATION] = iso(self.scheduled)
        if self.request is not None:
            out[REQUEST_ANNOTATION] = self.request
        return out


def track_schedule(state: VerifyState, schedule: str | None, now: datetime.datetime) -> VerifyState:
    """Start tracking a new or changed schedule: its next fire time after ``now`` (not due at once)."""
    if schedule == state.schedule and (schedule is None or state.next_schedule_time):
        return state
    if schedule is None or schedule_problem(schedule):
        return replace(state, schedule=None, next_schedule_time=None)
    return replace(state, schedule=schedule, next_schedule_time=iso(next_fire(schedule, now)))


def pending_trigger(state: VerifyState, request: str | None, now: datetime.datetime) -> Trigger | None:
    """What a run started now would answer: a due fire time of the tracked schedule, a new request."""
    scheduled = None
    nxt = parse_time(state.next_schedule_time)
    if state.schedule is not None and nxt is not None and now >= nxt:
        scheduled = latest_fire(state.schedule, now)
    req = request if request and request != state.last_request else None
    if scheduled is None and req is None:
        return None
    return Trigger(scheduled=scheduled, request=req)


def started(state: VerifyState, trigger: Trigger, job: str, now: datetime.datetime) -> VerifyState:
    """The state once ``job`` runs for ``trigger``: both triggers answered, the next fire time ahead."""
    st = replace(state, active_job=job)
    if trigger.scheduled is not None and state.schedule is not None:
        st = replace(st, last_schedule_time=iso(trigger.scheduled),
                     next_schedule_time=iso(next_fire(state.schedule, now)))
    if trigger.request is not None:
        st = replace(st, last_request=trigger.request)
    return st


def job_name(group: str, trigger: Trigger, now: datetime.datetime) -> str:
    """``<group>-verify-<unix seconds>`` of the fire time (so a schedule's run has one name) or of now.

    At most 40 + 8 + 10 characters: fits the 63 of the ``job-name`` label on the Job's pods.
    """
    t = trigger.scheduled if trigger.scheduled is not None else now
    return f"{group}-verify-{int(t.timestamp())}"


# ---------------------------------------------------------------- Jobs
def job_finished(job: Mapping[str, Any]) -> str | None:
    """"Complete", "Failed", or None while the Job runs."""
    st = job.get("status") or {}
    for c in st.get("conditions") or []:
        if c.get("status") == "True" and c.get("type") in ("Complete", "Failed"):
            return str(c["type"])
    if int(st.get("succeeded") or 0) > 0:
        return "Complete"
    if int(st.get("failed") or 0) > 0:
        return "Failed"  # backoffLimit 0: the one pod failed
    return None


def running_jobs(jobs: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted(str(j["metadata"]["name"]) for j in jobs if job_finished(j) is None)


def answered_requests(jobs: Iterable[Mapping[str, Any]]) -> set[str]:
    return {str(a[REQUEST_ANNOTATION]) for j in jobs
            if REQUEST_ANNOTATION in (a := (j.get("metadata") or {}).get("annotations") or {})}


def jobs_to_prune(jobs: Sequence[Mapping[str, Any]], keep: int = JOB_HISTORY) -> list[str]:
    """Finished Jobs beyond the ``keep`` newest (by creation time, then name)."""
    done = [j for j in jobs if job_finished(j) is not None]
    done.sort(key=lambda j: (str((j.get("metadata") or {}).get("creationTimestamp") or ""),
                             str(j["metadata"]["name"])), reverse=True)
    return [str(j["metadata"]["name"]) for j in done[keep:]]


def _summary_of(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("result") in RESULTS else None


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for cs in sorted(statuses, key=lambda c: c.get("name") != VERIFY_CONTAINER):
        for where in ("state", "lastState"):
            term = (cs.get(where) or {}).get("terminated")
            if isinstance(term, Mapping):
                return term
    return None


def termination_summary(pods: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The report summary in the termination message of the Job's (latest finished) pod."""
    found: list[tuple[str, dict[str, Any]]] = []
    for pod in pods:
        term = _terminated(pod)
        doc = _summary_of(term.get("message")) if term else None
        if term is not None and doc is not None:
            found.append((str(term.get("finishedAt") or ""), doc))
    return max(found, key=lambda f: f[0])[1] if found else None


def pod_failure(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """How the Job's container ended when it left no report (``OOMKilled``, exit code...)."""
    for pod in pods:
        term = _terminated(pod)
        if term is not None:
            reason = term.get("reason") or "Terminated"
            return f"container {reason} (exit code {term.get('exitCode')})"
    return None


def configmap_summary(cm: Mapping[str, Any] | None, job: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``summary.json`` of the report ConfigMap, when it was written by ``job`` (not by an earlier run)."""
    doc = _summary_of(((cm or {}).get("data") or {}).get("summary.json"))
    if doc is None:
        return None
    created = parse_time(((job or {}).get("metadata") or {}).get("creationTimestamp"))
    started_at = parse_time(doc.get("startedAt"))
    if created is None or started_at is None:
        return None
    return doc if started_at >= created - datetime.timedelta(seconds=CLOCK_SKEW_SECONDS) else None


def job_failure(job: Mapping[str, Any] | None) -> str | None:
    """The Job's Failed condition (``DeadlineExceeded``, ``BackoffLimitExceeded``...), if any."""
    for c in ((job or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "Failed" and c.get("status") == "True":
            return f"{c.get('reason') or 'Failed'}: {c.get('message') or ''}".rstrip(": ")
    return None


# ---------------------------------------------------------------- the verdict
@dataclass(frozen=True)
class Verdict:
    last: dict[str, Any]  # status.lastVerification
    condition: Cond
    event: tuple[str, str, str]  # (type, reason, message)


def replica_label(name: str) -> str:
    """A replica as named in the report (its admin URL) -> the pod name (the host's first label)."""
    host = urllib.parse.urlsplit(name).hostname if "://" in name else None
    return host.split(".", 1)[0] if host else name


def _mismatch_text(m: Mapping[str, Any]) -> str:
    where = [f"{m.get('kind')} on {replica_label(str(m.get('replica', '?')))}"]
    if m.get("offset") is not None:
        where.append(f"at offset {m['offset']}")
    if m.get("topic") is not None:
        where.append(f"topic {m['topic']} queue {m.get('queueId')}")
    if m.get("queueOffset") is not None:
        where.append(f"queueOffset {m['queueOffset']}")
    if m.get("field"):
        where.append(f"field {m['field']}")
    return " ".join(where)


def verdict(job_name_: str, summary: Mapping[str, Any] | None, why_no_report: str | None,
            now: datetime.datetime, job: Mapping[str, Any] | None = None) -> Verdict:
    """status.lastVerification, the ReplicasVerified condition and the Event for a finished Job.

    ``summary`` is rmq-verify's report summary (termination message or ConfigMap); without one the
    run is an Error, explained by ``why_no_report``. Mapping (see ``rmqbroker.verify``): time =
    ``startedAt``, result = ``result`` (clean/mismatch/error -> Passed/Failed/Error), bytesVerified,
    mismatches = ``mismatchCount``, lagBytes = the largest slave lag at the snapshot.
    """
    jst = (job or {}).get("status") or {}
    finished = parse_time(jst.get("completionTime")) or now
    last: dict[str, Any] = {"job": job_name_, "completionTime": iso(finished)}
    if summary is None:
        started_at = parse_time(jst.get("startTime"))
        message = f"job {job_name_} left no report: {why_no_report or 'no termination message'}"
        last.update(time=iso(started_at or finished), result="Error", bytesVerified=0, mismatches=0,
                    message=message[:1000])
        return Verdict(last, Cond(CONDITION, None, "VerificationError", message),
                       ("Warning", "VerificationError", message))
    result = RESULTS[str(summary["result"])]
    started_at = parse_time(summary.get("startedAt"))
    replicas = [r for r in summary.get("replicas") or [] if isinstance(r, Mapping)]
    lags = [int(r.get("lagBytes") or 0) for r in replicas if r.get("role") == "slave"]
    mismatches = int(summary.get("mismatchCount") or 0)
    bytes_verified = int(summary.get("bytesVerified") or 0)
    last.update(time=iso(started_at or finished), result=result, bytesVerified=bytes_verified, mismatches=mismatches)
    if lags:
        last["lagBytes"] = max(lags)
    rng = summary.get("range") or {}
    span = f"[{rng.get('start')}, {rng.get('end')})" if isinstance(rng, Mapping) and rng else ""
    n_slaves = sum(1 for r in replicas if r.get("role") == "slave")
    trunc = " (summary truncated)" if summary.get("truncated") else ""
    if result == "Passed":
        gaps = [f"{replica_label(str(r.get('name')))} lacks the first {int(r.get('headGapBytes') or 0)} bytes"
                for r in replicas if r.get("role") == "slave" and int(r.get("headGapBytes") or 0) > 0]
        head = f"; head gap: {', '.join(gaps)}" if gaps else ""
        message = (f"{bytes_verified} bytes of the master's commitlog {span} verified on {n_slaves} slave(s), "
                   f"no mismatch{head} (job {job_name_})").replace("  ", " ")
        last["message"] = message
        return Verdict(last, Cond(CONDITION, True, "Verified", message), ("Normal", "ReplicasVerified", message))
    if result == "Failed":
        bad = [f"{replica_label(str(r.get('name')))}: " + ", ".join(f"{k}={v}" for k, v in
                                                                    (r.get("byKind") or {}).items())
               for r in replicas if int(r.get("mismatchCount") or 0) > 0]
        first = [m for m in summary.get("firstMismatches") or [] if isinstance(m, Mapping)]
        message = f"{mismatches} mismatch(es) in {span or 'the verified range'}"
        if bad:
            message += f" ({'; '.join(bad)})"
        if first:
            message += f"; first: {_mismatch_text(first[0])}"
        message += f" (job {job_name_}){trunc}"
        last["message"] = message[:1000]
        return Verdict(last, Cond(CONDITION, False, "MismatchFound", message), ("Warning", "ReplicaMismatch", message))
    errors = [str(e) for e in summary.get("errors") or []]
    message = f"verification could not complete: {'; '.join(errors) or 'a replica could not be verified'}"
    if mismatches:
        message += f"; {mismatches} mismatch(es) found meanwhile"
    message += f" (job {job_name_}){trunc}"
    last["message"] = message[:1000]
    return Verdict(last, Cond(CONDITION, None, "VerificationError", message), ("Warning", "VerificationError", message))


def condition_from_status(status: Mapping[str, Any] | None) -> Cond | None:
    """The ReplicasVerified condition as last written (an operator restart keeps it)."""
    for c in (status or {}).get("conditions") or []:
        if c.get("type") == CONDITION:
            s = c.get("status")
            return Cond(CONDITION, True if s == "True" else False if s == "False" else None,
                        str(c.get("reason") or ""), str(c.get("message") or ""))
    return None
