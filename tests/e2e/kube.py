"""kubectl wrapper and pure manifest builders for the kind e2e test (tests/e2e/test_kind_failover.py).

Builders are plain functions (checked offline by tests/chart/test_e2e_manifests.py); ``Kubectl`` shells
out to a real kubectl against the current context.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
GROUP = "rmq.brokergroup.dev"
CLIENT_LABEL = f"{GROUP}/client"  # the chart's default NetworkPolicy clients selector
E2E_LABEL = f"{GROUP}/e2e"

Obj = dict[str, Any]
T = TypeVar("T")


def find_kubectl() -> str:
    """$KUBECTL, else kubectl on PATH, else .tools/bin/kubectl (make tools)."""
    explicit = os.environ.get("KUBECTL")
    if explicit:
        return explicit
    on_path = shutil.which("kubectl")
    if on_path:
        return on_path
    local = REPO / ".tools" / "bin" / "kubectl"
    if local.exists():
        return str(local)
    raise RuntimeError("kubectl not found: set $KUBECTL, put it on PATH, or run `make tools`")


def client_job(name: str, namespace: str, image: str, args: list[str], *, pull_policy: str = "IfNotPresent",
               deadline_seconds: int = 600) -> Obj:
    """A Job running the stock-client script (tests/e2e/client) once, hardened like the chart's pods."""
    labels = {CLIENT_LABEL: "true", E2E_LABEL: name}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline_seconds,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "client",
                        "image": image,
                        "imagePullPolicy": pull_policy,
                        "args": args,
                        "env": [{"name": "HOME", "value": "/tmp"}],
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}},
                        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                                      "limits": {"memory": "256Mi"}},
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def produce_args(namesrv: str, topic: str, prefix: str, *, count: int = 0, duration: float = 0.0,
                 interval: float = 0.0) -> list[str]:
    args = ["produce", "--namesrv", namesrv, "--topic", topic, "--prefix", prefix]
    if duration:
        args += ["--duration", str(duration)]
    else:
        args += ["--count", str(count)]
    if interval:
        args += ["--interval", str(interval)]
    return args


def consume_args(namesrv: str, topic: str, group: str) -> list[str]:
    return ["consume", "--namesrv", namesrv, "--topic", topic, "--group", group]


def acked_keys(events: list[Obj]) -> set[str]:
    """Keys of the sends a client Job's events show acknowledged."""
    return {e["key"] for e in events if e.get("event") == "ack"}


def parse_events(log_text: str) -> list[Obj]:
    """The JSON lines the client script printed (the C++ client's own output is skipped)."""
    events: list[Obj] = []
    for raw in log_text.splitlines():
        line = raw.strip()
        if line.startswith("{") and '"event"' in line:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def condition(obj: Obj, ctype: str) -> Obj | None:
    for cond in obj.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == ctype:
            result: Obj = cond
            return result
    return None


def is_ready(group: Obj) -> bool:
    cond = condition(group, "Ready")
    return cond is not None and cond.get("status") == "True"


def namesrv_address(group: Obj) -> str:
    """Nameserver address(es) for clients: the managed client Service, or the external addresses."""
    spec = group.get("spec", {})
    name_server = spec.get("nameServer") or {}
    if name_server.get("addresses"):
        return ";".join(name_server["addresses"])
    port = (spec.get("ports") or {}).get("nameServer", 9876)
    ns = group["metadata"]["namespace"]
    return f"{group['metadata']['name']}-namesrv.{ns}.svc:{port}"


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 2.0) -> T:
    """Call ``probe`` until it returns something other than None/False; AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


@dataclass
class Kubectl:
    binary: str
    namespace: str

    def run(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120,
            namespaced: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [self.binary, *(["--namespace", self.namespace] if namespaced else []), *args]
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def get(self, kind: str, name: str) -> Obj:
        result: Obj = json.loads(self.run("get", kind, name, "-o", "json").stdout)
        return result

    def apply(self, obj: Obj) -> None:
        self.run("apply", "-f", "-", stdin=json.dumps(obj))

    def delete(self, kind: str, name: str, *extra: str) -> None:
        self.run("delete", kind, name, "--ignore-not-found", *extra)

    def job_logs(self, name: str) -> str:
        return self.run("logs", f"job/{name}", "--tail=-1", check=False).stdout

    def job_state(self, name: str) -> str | None:
        """"Complete", "Failed" or None while the Job runs."""
        job = self.get("job", name)
        for cond in job.get("status", {}).get("conditions", []) or []:
            if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
                state: str = cond["type"]
                return state
        return None

    def run_job(self, job: Obj, timeout: float) -> list[Obj]:
        """Apply ``job`` (replacing an old one of that name), wait for it to finish, return its events."""
        name = job["metadata"]["name"]
        self.delete("job", name, "--wait=true")
        self.apply(job)
        state = wait_for(f"job {name}", lambda: self.job_state(name), timeout)
        logs = self.job_logs(name)
        assert state == "Complete", f"job {name} {state}:\n{logs[-4000:]}"
        return parse_events(logs)

    def nodes(self) -> list[str]:
        out = self.run("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}", namespaced=False).stdout
        return out.split()

    def diagnostics(self, group: str) -> str:
        """Describe output and logs worth printing when the test fails."""
        parts = []
        for args in (("get", "brokergroup", group, "-o", "yaml"), ("get", "pods,sts,svc,jobs,pvc", "-o", "wide"),
                     ("describe", "pods"), ("get", "events", "--sort-by=.lastTimestamp")):
            proc = self.run(*args, check=False)
            parts.append(f"$ kubectl {' '.join(args)}\n{proc.stdout}{proc.stderr}")
        return "\n".join(parts)
