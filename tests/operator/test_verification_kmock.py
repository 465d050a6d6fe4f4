"""Replica verification with the real kopf operator against the emulated API server.

Nothing runs Jobs here: the test plays the job controller and the kubelet. It creates the Job's
pod (with the pod template's labels) whose terminated container carries, as its termination
message, a summary made by the verify package itself, and writes the Job's status. The operator's
clock (``rmqoperator.verification.utcnow``) is the test's, so a schedule falls due in seconds.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rmqbroker.verify.model import BODY_CRC, Mismatch
from rmqbroker.verify.report import summary, write_configmap
from rmqoperator import builders, verification
from rmqoperator.spec import DEFAULT_IMAGE
from tests.operator.conftest import example
from tests.operator.emulator import GROUP, NS, OperatorHarness, condition, wait_for
from tests.operator.test_verification import make_report

NAME = "broker-a"
UTC = datetime.UTC
VERIFY_NOW = f"{GROUP}/verify-now"


class Clock:
    """The operator's schedule clock: real time shifted to wherever the test sets it."""

    def __init__(self, start: datetime.datetime) -> None:
        self.offset = start - datetime.datetime.now(tz=UTC)

    def __call__(self) -> datetime.datetime:
        return datetime.datetime.now(tz=UTC) + self.offset

    def advance(self, delta: datetime.timedelta) -> None:
        self.offset += delta

    def set(self, when: datetime.datetime) -> None:
        self.offset = when - datetime.datetime.now(tz=UTC)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    c = Clock(datetime.datetime(2026, 5, 1, 2, 50, tzinfo=UTC))
    monkeypatch.setattr(verification, "utcnow", c)
    yield c


def group(h: OperatorHarness) -> dict[str, Any]:
    return h.client.group(NAME) or {}


def status(h: OperatorHarness) -> dict[str, Any]:
    return dict(group(h).get("status") or {})


def jobs(h: OperatorHarness) -> list[dict[str, Any]]:
    return sorted((j for j in h.client.items("batch/v1", "jobs")
                   if (j["metadata"].get("labels") or {}).get(builders.GROUP_LABEL) == NAME),
                  key=lambda j: str(j["metadata"]["name"]))


def start_group(h: OperatorHarness, **spec: Any) -> None:
    h.client.apply_group(example(**spec))
    wait_for(lambda: status(h).get("observedGeneration") == 1, 10, "group applied")


def wait_jobs(h: OperatorHarness, n: int, timeout: float = 10) -> list[dict[str, Any]]:
    return wait_for(lambda: len(jobs(h)) == n and jobs(h), timeout, f"{n} verification job(s)")


def stays(h: OperatorHarness, n: int, seconds: float = 1.2) -> None:
    """No other Job appears for a few polling rounds."""
    time.sleep(seconds)
    assert len(jobs(h)) == n, [j["metadata"]["name"] for j in jobs(h)]


def replicas_of(job: dict[str, Any]) -> list[str]:
    args: list[str] = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--replicas") + 1].split(",")


def finish(h: OperatorHarness, job: dict[str, Any], report: dict[str, Any] | None, *, succeeded: bool,
           reason: str | None = None) -> None:
    """Play the job controller and kubelet: the Job's pod terminated with ``report``'s summary, the Job done."""
    name = job["metadata"]["name"]
    now = datetime.datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    tpl = job["spec"]["template"]
    pod = h.client.create({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": f"{name}-x7k2p", "labels": tpl["metadata"]["labels"]},
                           "spec": tpl["spec"]}, "pods")
    term: dict[str, Any] = {"exitCode": report["exitCode"] if report else 137, "finishedAt": now,
                            "reason": "Completed" if succeeded else "Error"}
    if report is not None:
        term["message"] = summary(report)  # what `rmq-verify --termination-log` writes
    h.client.patch("v1", "pods", pod["metadata"]["name"], sub="status", patch={"status": {
        "phase": "Succeeded" if succeeded else "Failed",
        "containerStatuses": [{"name": "verify", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
                               "state": {"terminated": term}}]}})
    cond = {"type": "Complete" if succeeded else "Failed", "status": "True", "lastTransitionTime": now}
    if reason:
        cond["reason"] = reason
    h.client.patch("batch/v1", "jobs", name, sub="status", patch={"status": {
        "startTime": now, "completionTime": now if succeeded else None,
        "succeeded": 1 if succeeded else 0, "failed": 0 if succeeded else 1, "conditions": [cond]}})


def last_verification(h: OperatorHarness, job: str) -> dict[str, Any]:
    return wait_for(lambda: (status(h).get("lastVerification") or {}).get("job") == job
                    and status(h)["lastVerification"], 10, f"lastVerification of {job}")


def test_verify_now_creates_the_job_and_a_clean_report_reaches_the_status(harness: OperatorHarness) -> None:
    h = harness
    start_group(h, replicas=3, verification={"resources": {"limits": {"cpu": "2", "memory": "2Gi"}}})
    assert jobs(h) == []
    h.client.patch_group(NAME, {"metadata": {"annotations": {VERIFY_NOW: "2026-05-01T10:00"}}})
    (job,) = wait_jobs(h, 1)
    g = group(h)
    name = job["metadata"]["name"]
    assert name.startswith(f"{NAME}-verify-")
    assert job["metadata"]["ownerReferences"][0]["uid"] == g["metadata"]["uid"]
    assert job["metadata"]["annotations"][verification.REQUEST_ANNOTATION] == "2026-05-01T10:00"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] > 0
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert "image" not in g["spec"] and c["image"] == DEFAULT_IMAGE  # the group's (default) image
    assert c["command"] == ["rmq-verify"] and c["resources"] == {"limits": {"cpu": "2", "memory": "2Gi"}}
    urls = [f"http://{NAME}-{i}.{NAME}-headless.{NS}.svc:10916" for i in range(3)]
    assert replicas_of(job) == urls
    assert c["args"][c["args"].index("--token-file") + 1] == "/etc/rmq/admin/token"
    assert c["args"][c["args"].index("--termination-log") + 1] == "/dev/termination-log"
    st = wait_for(lambda: (status(h).get("verification") or {}).get("activeJob") == name and status(h), 10,
                  "activeJob in the status")
    assert st["verification"]["lastRequest"] == "2026-05-01T10:00"
    assert h.client.events("VerificationStarted")

    report = make_report(urls, size=48 << 20, lag={2: 8192})
    finish(h, job, report, succeeded=True)
    last = last_verification(h, name)
    assert last["result"] == "Passed" and last["bytesVerified"] == 48 << 20 and last["mismatches"] == 0
    assert last["lagBytes"] == 8192 and last["time"] == report["startedAt"].replace("+00:00", "Z")
    g = group(h)
    cond = condition(g, "ReplicasVerified")
    assert cond["status"] == "True" and cond["reason"] == "Verified"
    assert cond["observedGeneration"] == g["metadata"]["generation"]
    assert "activeJob" not in g["status"]["verification"]
    assert condition(g, "Ready")["reason"] == "Creating"  # the other conditions are untouched

    stays(h, 1)  # the same annotation value does not run again
    h.client.patch_group(NAME, {"metadata": {"annotations": {VERIFY_NOW: "again"}}})
    second = wait_jobs(h, 2)
    assert {j["metadata"]["name"] for j in second} - {name}


def test_mismatch_report_sets_the_condition_false_and_posts_a_warning(harness: OperatorHarness) -> None:
    h = harness
    start_group(h, replicas=3)
    h.client.patch_group(NAME, {"metadata": {"annotations": {VERIFY_NOW: "1"}}})
    (job,) = wait_jobs(h, 1)
    urls = replicas_of(job)
    found = [Mismatch(urls[1], BODY_CRC, offset=1_048_576, size=230, topic="OrderTopic", queue_id=1,
                      queue_offset=42, detail="stored body CRC does not match the body")]
    report = make_report(urls, mismatches={1: found})
    assert report["exitCode"] == 1
    finish(h, job, report, succeeded=False, reason="BackoffLimitExceeded")
    last = last_verification(h, job["metadata"]["name"])
    assert last["result"] == "Failed" and last["mismatches"] == 1
    cond = wait_for(lambda: condition(group(h), "ReplicasVerified").get("status") == "False"
                    and condition(group(h), "ReplicasVerified"), 10, "ReplicasVerified False")
    assert cond["reason"] == "MismatchFound"
    assert "body_crc on broker-a-1 at offset 1048576 topic OrderTopic queue 1" in cond["message"]
    (event,) = wait_for(lambda: h.client.events("ReplicaMismatch"), 10, "ReplicaMismatch event")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == NAME
    assert "offset 1048576" in event["message"]


def test_due_schedule_creates_one_job_at_a_time(harness: OperatorHarness, clock: Clock) -> None:
    h = harness
    start_group(h, replicas=2, verification={"schedule": "0 3 * * *"})
    st = wait_for(lambda: (status(h).get("verification") or {}).get("nextScheduleTime") and status(h), 10,
                  "schedule tracked")
    assert st["verification"]["nextScheduleTime"] == "2026-05-01T03:00:00Z"
    stays(h, 0, 0.6)  # 02:50: not due yet
    clock.set(datetime.datetime(2026, 5, 1, 2, 59, 59, tzinfo=UTC))
    (first,) = wait_jobs(h, 1)  # due at 03:00:00
    assert first["metadata"]["name"] == f"{NAME}-verify-{int(datetime.datetime(2026, 5, 1, 3, tzinfo=UTC).timestamp())}"
    assert first["metadata"]["annotations"][verification.SCHEDULED_TIME_ANNOTATION] == "2026-05-01T03:00:00Z"
    wait_for(lambda: status(h)["verification"].get("nextScheduleTime") == "2026-05-02T03:00:00Z", 10, "next fire")
    assert status(h)["verification"]["lastScheduleTime"] == "2026-05-01T03:00:00Z"

    # A day later the schedule is due again, but the first Job still runs: no second one.
    clock.advance(datetime.timedelta(days=1))
    stays(h, 1)
    finish(h, first, make_report(replicas_of(first)), succeeded=True)
    assert last_verification(h, first["metadata"]["name"])["result"] == "Passed"
    jobs2 = wait_jobs(h, 2)  # the missed fire time runs once the first Job is done
    second = next(j for j in jobs2 if j["metadata"]["name"] != first["metadata"]["name"])
    assert second["metadata"]["annotations"][verification.SCHEDULED_TIME_ANNOTATION] == "2026-05-02T03:00:00Z"
    finish(h, second, make_report(replicas_of(second)), succeeded=True)
    last_verification(h, second["metadata"]["name"])
    stays(h, 2)  # not again before the next fire time
    assert status(h)["verification"]["nextScheduleTime"] == "2026-05-03T03:00:00Z"


def test_report_from_the_configmap_and_cleanup_on_delete(harness: OperatorHarness) -> None:
    h = harness
    start_group(h, replicas=2, verification={"serviceAccountName": "rmq-verify"})
    h.client.patch_group(NAME, {"metadata": {"annotations": {VERIFY_NOW: "1"}}})
    (job,) = wait_jobs(h, 1)
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "rmq-verify"
    args = pod["containers"][0]["args"]
    target = args[args.index("--configmap") + 1]
    assert target == f"{NS}/{NAME}-verification"
    # The job wrote its report with the verify package's own writer, then was killed before exiting
    # cleanly: no termination message, the ConfigMap has the result.
    report = make_report(replicas_of(job), size=1 << 20)
    write_configmap(report, target, api_url=h.url, token="test")
    finish(h, job, None, succeeded=False, reason="DeadlineExceeded")
    last = last_verification(h, job["metadata"]["name"])
    assert last["result"] == "Passed" and last["bytesVerified"] == 1 << 20
    assert json.loads((h.client.get("v1", "configmaps", f"{NAME}-verification") or {})["data"]["summary.json"])

    h.client.delete_group(NAME)
    wait_for(lambda: h.client.group(NAME) is None, 15, "group gone")
    assert jobs(h) == [] and h.client.get("v1", "configmaps", f"{NAME}-verification") is None


def test_job_without_any_report_is_an_error(harness: OperatorHarness) -> None:
    h = harness
    start_group(h, replicas=2)
    h.client.patch_group(NAME, {"metadata": {"annotations": {VERIFY_NOW: "1"}}})
    (job,) = wait_jobs(h, 1)
    finish(h, job, None, succeeded=False, reason="DeadlineExceeded")
    last = last_verification(h, job["metadata"]["name"])
    assert last["result"] == "Error" and "DeadlineExceeded" in last["message"]
    cond = condition(group(h), "ReplicasVerified")
    assert cond["status"] == "Unknown" and cond["reason"] == "VerificationError"
    assert wait_for(lambda: h.client.events("VerificationError"), 10, "VerificationError event")
