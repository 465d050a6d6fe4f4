"""Offline checks of what the kind e2e run uses: the client Job manifests and the workflows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from tests.chart.conftest import KUBE_VERSIONS
from tests.chart.tooling import REPO_ROOT
from tests.e2e.kube import client_job, consume_args, namesrv_address, parse_events, produce_args

WORKFLOWS = REPO_ROOT / ".github" / "workflows"


def test_client_jobs_are_valid() -> None:
    jobs = [
        client_job("e2e-before-1", "default", "rmq-e2e-client:e2e",
                   produce_args("broker-a-namesrv.default.svc:9876", "T", "p", count=10)),
        client_job("e2e-during-1", "default", "rmq-e2e-client:e2e",
                   produce_args("a:9876", "T", "p", duration=60, interval=0.1), pull_policy="Never"),
        client_job("e2e-consume-1", "default", "rmq-e2e-client:e2e", consume_args("a:9876", "T", "CG")),
    ]
    for job in jobs:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(job, version, strict=True)
        pod = job["spec"]["template"]
        assert pod["metadata"]["labels"]["rmq.brokergroup.dev/client"] == "true", "allowed by the NetworkPolicy"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_event_parsing_and_addresses() -> None:
    log = 'I1122 noise from the C++ client\n{"event": "ack", "key": "k1"}\n{broken\n{"event": "done", "acked": 1}\n'
    assert parse_events(log) == [{"event": "ack", "key": "k1"}, {"event": "done", "acked": 1}]
    group: dict[str, Any] = {"metadata": {"name": "broker-a", "namespace": "apps"}, "spec": {}}
    assert namesrv_address(group) == "broker-a-namesrv.apps.svc:9876"
    group["spec"] = {"nameServer": {"addresses": ["ns-0:9876", "ns-1:9876"]}}
    assert namesrv_address(group) == "ns-0:9876;ns-1:9876"


def load_workflow(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((WORKFLOWS / name).read_text())
    return data


def steps_text(workflow: dict[str, Any]) -> str:
    return "\n".join(str(step.get("run", "")) + str(step.get("uses", ""))
                     for job in workflow["jobs"].values() for step in job["steps"])


def test_ci_workflow_runs_make_test() -> None:
    workflow = load_workflow("ci.yaml")
    assert "make test" in steps_text(workflow)


def test_e2e_workflow_covers_the_scenario() -> None:
    workflow = load_workflow("e2e-kind.yaml")
    text = steps_text(workflow)
    for needle in ("kind-action", "kind load docker-image", "helm install", "examples/brokergroup.yaml",
                   "kubectl wait --for=condition=Ready brokergroup/broker-a", "make e2e"):
        assert needle in text, needle
    (job,) = workflow["jobs"].values()
    assert any(step.get("if") == "failure()" for step in job["steps"]), "logs are collected on failure"


def test_workflow_files_are_yaml() -> None:
    for path in sorted(Path(WORKFLOWS).glob("*.y*ml")):
        assert isinstance(yaml.safe_load(path.read_text()), dict), path
