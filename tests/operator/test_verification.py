"""Replica verification in the operator, pure parts: the Job builder, cron scheduling, reading the report.

Reports are made by the verify package itself (``rmqbroker.verify.report.build_report`` over a
``VerifyOutcome``, then its ``summary`` -- the exact termination message ``rmq-verify`` writes),
so a change of that format shows up here.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Sequence
from typing import Any

import jsonschema
import pytest
import yaml

from rmqbroker.verify.job import ReplicaState, VerifyOutcome
from rmqbroker.verify.model import BODY_CRC, RECORD, UNREACHABLE, Mismatch, ReplicaChunkStats, ReplicaRef, Timings
from rmqbroker.verify.report import build_report, summary
from rmqoperator import builders, verification
from rmqoperator.spec import GroupSpec, parse_spec, problems
from rmqoperator.verification import Trigger, VerifyState
from tests.operator.conftest import example
from tests.operator.emulator import CRD_PATH

UTC = datetime.UTC


def t(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=UTC)


def spec_of(**fields: Any) -> GroupSpec:
    doc = example(**fields)
    doc["metadata"].update(namespace="prod", uid="uid-1")
    return parse_spec(doc)


# ---------------------------------------------------------------- reports from the verify package
def admin_url(group: str, ordinal: int, ns: str = "rmq-test") -> str:
    return f"http://{group}-{ordinal}.{group}-headless.{ns}.svc:10916"


def make_report(urls: Sequence[str], *, size: int = 8 << 20, lag: dict[int, int] | None = None,
                mismatches: dict[int, list[Mismatch]] | None = None, errors: Sequence[str] = (),
                started: float | None = None) -> dict[str, Any]:
    """The full rmq-verify report of a run over ``urls`` (the first is the master)."""
    lag = lag or {}
    mismatches = mismatches or {}

    def state(i: int, url: str) -> ReplicaState:
        end = size - lag.get(i, 0)
        st = ReplicaState(ReplicaRef(url, url, "token", i, 0, end),
                          {"role": "SYNC_MASTER" if i == 0 else "SLAVE", "minPhyOffset": 0, "maxPhyOffset": end},
                          i == 0, ReplicaChunkStats(records=end // 1024, bytes=end), lag_bytes=lag.get(i, 0))
        for m in mismatches.get(i, []):
            st.mismatches.append(m)
            st.mismatch_count += 1
            st.by_kind[m.kind] = st.by_kind.get(m.kind, 0) + 1
        return st

    states = [state(i, u) for i, u in enumerate(urls)]
    outcome = VerifyOutcome(states[0], states[1:], 0, size, 4, 2 << 20, 0, "spark", Timings(), {"discover": 0.1},
                            list(errors))
    return build_report(outcome, time.time() if started is None else started, "local[*]")


def termination_message(report: dict[str, Any]) -> str:
    return summary(report)


def body_crc(url: str, offset: int) -> Mismatch:
    return Mismatch(url, BODY_CRC, offset=offset, size=220, topic="OrderTopic", queue_id=2, queue_offset=17,
                    detail="stored body CRC does not match the body")


# ---------------------------------------------------------------- the Job
def test_job_runs_rmq_verify_over_every_broker_pod() -> None:
    spec = spec_of(replicas=3, image="reg/rmq:1.2", verification={"resources": {"limits": {"cpu": 2}}})
    v = verification.verification_of(spec)
    job = builders.verification_job(spec, v, "broker-a-verify-1780000000", [2, 0, 1],
                                    {verification.REQUEST_ANNOTATION: "now"})
    meta = job["metadata"]
    assert (job["apiVersion"], job["kind"], meta["name"], meta["namespace"]) == (
        "batch/v1", "Job", "broker-a-verify-1780000000", "prod")
    assert meta["ownerReferences"] == [builders.owner_reference(spec)] and meta["ownerReferences"][0]["uid"] == "uid-1"
    assert meta["annotations"] == {verification.REQUEST_ANNOTATION: "now"}
    assert meta["labels"]["app.kubernetes.io/component"] == "verification"
    assert meta["labels"]["app.kubernetes.io/name"] == "rmq-verify"
    assert meta["labels"][builders.VERIFY_JOB_LABEL] == "broker-a-verify-1780000000"
    # Not a broker: the broker selector (Service, PDB, the operator's pod list) does not match it.
    assert not all(meta["labels"].get(k) == val for k, val in builders.selector(spec, "broker").items())
    js = job["spec"]
    assert js["backoffLimit"] == 0
    assert js["activeDeadlineSeconds"] == verification.DEFAULT_ACTIVE_DEADLINE_SECONDS
    assert js["ttlSecondsAfterFinished"] == builders.VERIFY_TTL_SECONDS
    tpl = js["template"]
    assert tpl["metadata"]["labels"] == meta["labels"]
    pod = tpl["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["name"] == "verify" and c["image"] == "reg/rmq:1.2" and c["command"] == ["rmq-verify"]
    urls = [f"http://broker-a-{i}.broker-a-headless.prod.svc:10916" for i in range(3)]
    assert c["args"] == ["--replicas", ",".join(urls), "--token-file", "/etc/rmq/admin/token",
                         "--termination-log", "/dev/termination-log", "--spark-conf", "spark.ui.enabled=false"]
    assert c["terminationMessagePath"] == "/dev/termination-log" and c["terminationMessagePolicy"] == "File"
    assert c["resources"] == {"limits": {"cpu": 2}}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["tmp"]["mountPath"] == "/tmp" and volumes["tmp"] == {"name": "tmp", "emptyDir": {}}
    assert mounts["admin-token"]["readOnly"]
    assert volumes["admin-token"]["secret"]["secretName"] == "broker-a-admin-token"
    assert {"name": "HOME", "value": "/tmp"} in c["env"]


def test_job_image_defaults_to_the_group_image_and_service_account_adds_the_configmap() -> None:
    spec = spec_of(replicas=2, image="reg/rmq:1.2",
                   verification={"image": "reg/verify:2", "serviceAccountName": "rmq-verify",
                                 "activeDeadlineSeconds": 600})
    job = builders.verification_job(spec, verification.verification_of(spec), "j", [0, 1])
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "reg/verify:2" and "resources" not in c
    assert pod["serviceAccountName"] == "rmq-verify" and pod["automountServiceAccountToken"] is True
    assert c["args"][-2:] == ["--configmap", "prod/broker-a-verification"]
    assert job["spec"]["activeDeadlineSeconds"] == 600 and "annotations" not in job["metadata"]
    plain = spec_of(replicas=2, image="reg/rmq:1.2")
    (c,) = builders.verification_job(plain, verification.verification_of(plain), "j", [0, 1])[
        "spec"]["template"]["spec"]["containers"]
    assert c["image"] == "reg/rmq:1.2" and "--configmap" not in c["args"]


@pytest.mark.parametrize("service_account", [None, "rmq-verify"])
def test_job_validates_against_the_kubernetes_schema(service_account: str | None) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    v: dict[str, Any] = {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
    if service_account:
        v["serviceAccountName"] = service_account
    spec = spec_of(replicas=3, verification=v)
    job = builders.verification_job(spec, verification.verification_of(spec), "broker-a-verify-1780000000",
                                    [0, 1, 2], Trigger(scheduled=t("2026-05-01T03:00:00")).annotations())
    kv.validate(job, kv.latest_version(), strict=True)


def test_job_names_fit_the_job_name_label() -> None:
    now = t("2026-05-01T03:00:07")
    name = verification.job_name("g" * 40, Trigger(request="x"), now)
    assert name == f"{'g' * 40}-verify-{int(now.timestamp())}" and len(name) <= 63
    # A schedule's run is named after its fire time: the same run, whenever it starts.
    assert verification.job_name("g", Trigger(scheduled=t("2026-05-01T03:00:00")), now) == "g-verify-1777604400"


# ---------------------------------------------------------------- spec and CRD
@pytest.mark.parametrize(("schedule", "ok"), [
    ("0 3 * * *", True), ("*/15 * * * 1-5", True), ("@daily", True), ("@midnight", True),
    ("61 * * * *", False), ("0 3 * * * *", False), ("H 3 * * *", False), ("@sometimes", False), ("daily", False),
])
def test_schedule_checks(schedule: str, ok: bool) -> None:
    assert (verification.schedule_problem(schedule) is None) == ok
    found = problems(spec_of(verification={"schedule": schedule}))
    assert (found == []) == ok, found
    if not ok:
        assert "spec.verification.schedule" in found[0]


def test_verification_spec_shape_problems() -> None:
    assert "serviceAccountName" in problems(spec_of(verification={"serviceAccountName": 3}))[0]
    assert "activeDeadlineSeconds" in problems(spec_of(verification={"activeDeadlineSeconds": 5}))[0]
    assert verification.verification_of(spec_of()) == verification.VerificationSpec()


def test_crd_accepts_the_verification_fields() -> None:
    crd = yaml.safe_load(CRD_PATH.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft7Validator(schema)
    validator.validate(example(verification={"schedule": "0 3 * * *", "image": "x:1", "serviceAccountName": "sa",
                                             "activeDeadlineSeconds": 3600}))
    assert list(validator.iter_errors(example(verification={"activeDeadlineSeconds": 10})))
    status_props = schema["properties"]["status"]["properties"]
    assert {"time", "result", "bytesVerified", "mismatches", "lagBytes", "job"} <= set(
        status_props["lastVerification"]["properties"])
    assert set(VerifyState().to_status()) == set(status_props["verification"]["properties"])


# ---------------------------------------------------------------- cron scheduling
def test_a_new_schedule_is_due_at_its_next_fire_time_not_at_once() -> None:
    now = t("2026-05-01T10:20:00")
    st = verification.track_schedule(VerifyState(), "0 3 * * *", now)
    assert st.schedule == "0 3 * * *" and st.next_schedule_time == "2026-05-02T03:00:00Z"
    assert verification.pending_trigger(st, None, now) is None
    assert verification.pending_trigger(st, None, t("2026-05-02T02:59:59")) is None
    trig = verification.pending_trigger(st, None, t("2026-05-02T03:00:00"))
    assert trig == Trigger(scheduled=t("2026-05-02T03:00:00"))
    # Tracking the same schedule again changes nothing.
    assert verification.track_schedule(st, "0 3 * * *", t("2026-05-03T00:00:00")) is st


def test_a_started_run_moves_the_next_fire_time_and_missed_ones_collapse() -> None:
    st = verification.track_schedule(VerifyState(), "0 * * * *", t("2026-05-01T10:20:00"))
    assert st.next_schedule_time == "2026-05-01T11:00:00Z"
    # The operator was away (or a Job ran) from 11:00 to 14:10: one run, for the last fire time.
    now = t("2026-05-01T14:10:00")
    trig = verification.pending_trigger(st, None, now)
    assert trig == Trigger(scheduled=t("2026-05-01T14:00:00"))
    st = verification.started(st, trig, "g-verify-1", now)
    assert (st.active_job, st.last_schedule_time, st.next_schedule_time) == (
        "g-verify-1", "2026-05-01T14:00:00Z", "2026-05-01T15:00:00Z")
    assert verification.pending_trigger(st, None, t("2026-05-01T14:59:59")) is None
    assert verification.pending_trigger(st, None, t("2026-05-01T15:00:01")) is not None


def test_a_changed_or_removed_schedule_is_tracked_anew() -> None:
    st = verification.track_schedule(VerifyState(), "0 3 * * *", t("2026-05-01T10:00:00"))
    st = verification.track_schedule(st, "30 12 * * *", t("2026-05-01T10:00:00"))
    assert st.next_schedule_time == "2026-05-01T12:30:00Z"
    gone = verification.track_schedule(st, None, t("2026-05-01T10:00:00"))
    assert (gone.schedule, gone.next_schedule_time) == (None, None)
    assert verification.pending_trigger(gone, None, t("2026-05-09T00:00:00")) is None


def test_verify_now_runs_once_per_value() -> None:
    now = t("2026-05-01T10:00:00")
    st = VerifyState()
    assert verification.pending_trigger(st, None, now) is None
    assert verification.pending_trigger(st, "", now) is None
    trig = verification.pending_trigger(st, "2026-05-01 first", now)
    assert trig == Trigger(request="2026-05-01 first")
    st = verification.started(st, trig, "g-verify-1", now)
    assert st.last_request == "2026-05-01 first" and st.schedule is None
    assert verification.pending_trigger(st, "2026-05-01 first", now) is None
    assert verification.pending_trigger(st, "again", now) == Trigger(request="again")


def test_schedule_and_request_together_start_one_run() -> None:
    st = verification.track_schedule(VerifyState(), "@hourly", t("2026-05-01T10:20:00"))
    now = t("2026-05-01T11:00:05")
    trig = verification.pending_trigger(st, "x", now)
    assert trig == Trigger(scheduled=t("2026-05-01T11:00:00"), request="x")
    assert trig is not None and set(trig.annotations()) == {verification.SCHEDULED_TIME_ANNOTATION,
                                                             verification.REQUEST_ANNOTATION}
    st = verification.started(st, trig, "j", now)
    assert verification.pending_trigger(st, "x", now) is None


def test_state_round_trips_through_the_status() -> None:
    st = VerifyState(schedule="@daily", next_schedule_time="2026-05-02T00:00:00Z", last_request="r",
                     active_job="g-verify-1")
    assert VerifyState.from_status({"verification": st.to_status()}) == st
    cleared = json.loads(json.dumps({"verification": VerifyState(schedule="@daily").to_status()}))
    assert VerifyState.from_status(cleared) == VerifyState(schedule="@daily")
    assert VerifyState.from_status({}) == VerifyState()


# ---------------------------------------------------------------- Jobs and their pods
def job(name: str, created: str = "2026-05-01T03:00:00Z", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created}, "status": status}


def test_job_finished() -> None:
    assert verification.job_finished(job("a")) is None
    assert verification.job_finished(job("a", active=1)) is None
    assert verification.job_finished(job("a", succeeded=1)) == "Complete"
    assert verification.job_finished(job("a", failed=1)) == "Failed"
    assert verification.job_finished(job("a", conditions=[{"type": "Failed", "status": "True",
                                                            "reason": "DeadlineExceeded"}])) == "Failed"
    assert verification.job_finished(job("a", conditions=[{"type": "Complete", "status": "False"}])) is None


def test_old_finished_jobs_are_pruned() -> None:
    jobs = [job(f"j{i}", f"2026-05-0{i}T03:00:00Z", succeeded=1) for i in range(1, 6)] + [job("j9", "2026-05-09")]
    assert verification.jobs_to_prune(jobs) == ["j2", "j1"]
    assert verification.running_jobs(jobs) == ["j9"]


def pod(message: str | None, finished: str = "2026-05-01T03:10:00Z", reason: str = "Completed",
        exit_code: int = 0) -> dict[str, Any]:
    term: dict[str, Any] = {"exitCode": exit_code, "reason": reason, "finishedAt": finished}
    if message is not None:
        term["message"] = message
    return {"status": {"containerStatuses": [{"name": "verify", "state": {"terminated": term}}]}}


def test_termination_summary_of_the_latest_pod() -> None:
    urls = [admin_url("g", i) for i in range(2)]
    old = make_report(urls)
    new = make_report(urls, mismatches={1: [body_crc(urls[1], 4096)]})
    pods = [pod(summary(new), "2026-05-01T03:20:00Z"), pod(summary(old), "2026-05-01T03:10:00Z"),
            pod("not json"), pod(None)]
    assert verification.termination_summary(pods) == json.loads(summary(new))
    assert verification.termination_summary([pod("{}"), pod(None)]) is None
    assert verification.pod_failure([pod(None, reason="OOMKilled", exit_code=137)]) == \
        "container OOMKilled (exit code 137)"


def test_configmap_summary_only_from_this_job() -> None:
    urls = [admin_url("g", i) for i in range(2)]
    created = "2026-05-01T03:00:00Z"
    fresh = {"data": {"summary.json": summary(make_report(urls, started=t("2026-05-01T03:00:04").timestamp()))}}
    stale = {"data": {"summary.json": summary(make_report(urls, started=t("2026-04-30T03:00:04").timestamp()))}}
    assert verification.configmap_summary(fresh, job("j", created)) is not None
    assert verification.configmap_summary(stale, job("j", created)) is None
    assert verification.configmap_summary(None, job("j", created)) is None
    assert verification.configmap_summary(fresh, None) is None


# ---------------------------------------------------------------- the verdict
NOW = t("2026-05-01T03:30:00")


def test_clean_report_passes() -> None:
    urls = [admin_url("broker-a", i) for i in range(3)]
    report = make_report(urls, size=64 << 20, lag={2: 4096}, started=t("2026-05-01T03:00:02").timestamp())
    doc = json.loads(termination_message(report))
    done = job("broker-a-verify-1", succeeded=1, completionTime="2026-05-01T03:01:00Z")
    v = verification.verdict("broker-a-verify-1", doc, None, NOW, done)
    assert v.last == {"job": "broker-a-verify-1", "completionTime": "2026-05-01T03:01:00Z",
                      "time": "2026-05-01T03:00:02Z", "result": "Passed", "bytesVerified": 64 << 20,
                      "mismatches": 0, "lagBytes": 4096, "message": v.last["message"]}
    assert v.condition.type == "ReplicasVerified" and v.condition.status is True
    assert v.condition.reason == "Verified" and "2 slave(s)" in v.condition.message
    assert v.event[:2] == ("Normal", "ReplicasVerified")
    assert "head gap" not in v.condition.message
    # A slave whose oldest segments are gone passes, and the message says what it lacks.
    doc["replicas"][2]["headGapBytes"] = 1 << 20
    gap = verification.verdict("broker-a-verify-1", doc, None, NOW, done)
    assert gap.last["result"] == "Passed"
    assert "head gap: broker-a-2 lacks the first 1048576 bytes" in gap.condition.message, gap.condition.message


def test_mismatch_report_fails_and_locates_the_first_mismatch() -> None:
    urls = [admin_url("broker-a", i) for i in range(3)]
    found = [body_crc(urls[1], 1_048_576), Mismatch(urls[1], RECORD, offset=2_097_152, topic="T", queue_id=0,
                                                    queue_offset=3, field="topic", expected="T", actual="U")]
    doc = json.loads(summary(make_report(urls, mismatches={1: found})))
    v = verification.verdict("broker-a-verify-2", doc, None, NOW)
    assert v.last["result"] == "Failed" and v.last["mismatches"] == 2 and v.last["lagBytes"] == 0
    assert v.condition.status is False and v.condition.reason == "MismatchFound"
    msg = v.condition.message
    assert "2 mismatch(es)" in msg and "broker-a-1: body_crc=1, record=1" in msg
    assert "first: body_crc on broker-a-1 at offset 1048576 topic OrderTopic queue 2 queueOffset 17" in msg
    assert v.event == ("Warning", "ReplicaMismatch", msg) and v.last["message"] == msg


def test_truncated_summary_still_gives_the_counts() -> None:
    urls = [admin_url("broker-a", i) for i in range(2)]
    many = [Mismatch(urls[1], BODY_CRC, offset=i * 1000, topic="T" * 100, queue_id=0, detail="d" * 1000)
            for i in range(300)]
    text = summary(make_report(urls, mismatches={1: many}))
    assert len(text.encode()) <= 4096
    v = verification.verdict("j", json.loads(text), None, NOW)
    assert v.last["mismatches"] == 300 and v.last["result"] == "Failed" and "(summary truncated)" in v.last["message"]


def test_error_report_and_missing_report_are_errors() -> None:
    urls = [admin_url("broker-a", i) for i in range(2)]
    report = make_report(urls, mismatches={1: [Mismatch(urls[1], UNREACHABLE, detail="connection refused")]},
                         errors=["http://broker-a-1...: connection refused"])
    v = verification.verdict("j", json.loads(summary(report)), None, NOW)
    assert v.last["result"] == "Error" and v.condition.status is None
    assert v.condition.reason == "VerificationError" and "connection refused" in v.condition.message
    assert v.event[:2] == ("Warning", "VerificationError")
    failed = job("j", startTime="2026-05-01T03:00:00Z")
    none = verification.verdict("j", None, "DeadlineExceeded: Job was active longer than specified deadline",
                                NOW, failed)
    assert none.last["result"] == "Error" and none.last["time"] == "2026-05-01T03:00:00Z"
    assert none.condition.status is None and "DeadlineExceeded" in none.condition.message


def test_condition_survives_a_restart() -> None:
    verified = {"type": "ReplicasVerified", "status": "False", "reason": "MismatchFound", "message": "m"}
    status = {"conditions": [{"type": "Ready", "status": "True"}, verified]}
    cond = verification.condition_from_status(status)
    assert cond is not None and (cond.status, cond.reason, cond.message) == (False, "MismatchFound", "m")
    assert verification.condition_from_status({}) is None
