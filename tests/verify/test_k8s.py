"""The Kubernetes side of verification against the emulated API server (tests/operator/emulator.py):
``spark-submit --master k8s://`` creates the driver pod for the job, and the job's report reaches
a ConfigMap the operator can read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from kmock._internal import enums as kmock_enums
from kmock._internal import rendering as kmock_rendering

from rmqbroker.verify.report import summary, write_configmap
from rmqbroker.verify.submit import IMAGE_MAIN, k8s_submit_args
from tests.operator.emulator import NS, Client, Emulator, LoopThread

# kmock 0.8 loads its bundled resource list with a deprecated importlib.resources call.
pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


class ApplyingEmulator(Emulator):
    """The operator tests' emulator plus server-side apply of a missing object (= create), which
    spark-submit uses for the driver's Service after creating the Pod."""

    async def _handle(self, request: kmock_rendering.Request) -> Any:
        content_type = {k.lower(): v for k, v in request.headers.items()}.get("content-type", "")
        if (request.action == kmock_enums.action.UPDATE and "apply-patch" in content_type
                and request.resource is not None and request.name is not None and isinstance(request.data, dict)):
            key = (request.resource, request.namespace, request.name)
            if key not in self.objects or self.objects[key].deleted:
                obj = dict(request.data)
                obj.setdefault("metadata", {}).setdefault("namespace", request.namespace)
                self.objects[key] = obj
        return await super()._handle(request)


@pytest.fixture
def api() -> Iterator[Client]:
    thread = LoopThread("k8s-emulator")
    emu = ApplyingEmulator()
    emu.resources.load_bundled()
    server = kmock.Server(emu)

    async def start() -> str:
        await emu.__aenter__()
        await server.__aenter__()
        return str(server.url)

    async def stop() -> None:
        await server.__aexit__(None, None, None)
        await emu.__aexit__(None, None, None)

    url = thread.call(start())
    try:
        yield Client(url)
    finally:
        try:
            thread.call(stop(), timeout=10)
        finally:
            thread.stop()


def test_spark_submit_k8s_creates_the_driver_pod(api: Client, tmp_path: Path) -> None:
    replicas = ["http://broker-a-0.rmq:10915", "http://broker-a-1.rmq:10915"]
    args = k8s_submit_args(api_server=api.url, image="localhost/rmq-brokergroup:dev", namespace=NS,
                           replicas=replicas, token_file="/etc/rmq/admin-token", executors=3, wait=False,
                           job_args=["--configmap", f"{NS}/rmq-verify-broker-a"])
    submit = Path(sys.executable).with_name("spark-submit")
    import pyspark

    # spark-submit looks for Spark with `python3` from PATH unless told where it is.
    env = {**os.environ, "SPARK_HOME": str(Path(pyspark.__file__).parent), "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run([str(submit), *args], capture_output=True, text=True, timeout=180, env=env, check=False)
    assert proc.returncode == 0, "\n".join(ln for ln in proc.stderr.splitlines() if not ln.startswith("\tat "))[-4000:]
    pods = api.items("v1", "pods")
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    pod = pods[0]
    assert pod["metadata"]["labels"]["spark-role"] == "driver"
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "localhost/rmq-brokergroup:dev"
    cargs = container["args"]
    assert IMAGE_MAIN in cargs
    tail = cargs[cargs.index(IMAGE_MAIN) + 1:]
    assert tail == ["--replicas", ",".join(replicas), "--token-file", "/etc/rmq/admin-token",
                    "--configmap", f"{NS}/rmq-verify-broker-a"]
    assert pod["spec"]["serviceAccountName"] == "rmq-verify" or pod["spec"].get("serviceAccount") == "rmq-verify"
    # spark-submit's own configuration for the driver (executor count travels in it).
    conf_maps = api.items("v1", "configmaps")
    props = "".join(v for cm in conf_maps for v in (cm.get("data") or {}).values())
    assert "spark.executor.instances=3" in props


def _report(result: str, mismatches: int) -> dict[str, Any]:
    return {"version": 1, "result": result, "exitCode": 0 if result == "clean" else 1,
            "startedAt": "2026-11-22T00:00:00", "bytesVerified": 123, "mismatchCount": mismatches,
            "range": {"start": 0, "end": 123}, "errors": [],
            "replicas": [{"name": "http://b-1", "role": "slave", "lagBytes": 0, "mismatchCount": mismatches,
                          "mismatchesByKind": {}, "mismatches": []}]}


def test_report_configmap_created_then_replaced(api: Client) -> None:
    write_configmap(_report("clean", 0), f"{NS}/rmq-verify-broker-a", api_url=api.url, token="test")
    write_configmap(_report("mismatch", 2), f"{NS}/rmq-verify-broker-a", api_url=api.url, token="test")
    cm = api.get("v1", "configmaps", "rmq-verify-broker-a")
    assert cm is not None
    assert json.loads(cm["data"]["report.json"])["mismatchCount"] == 2
    assert json.loads(cm["data"]["summary.json"]) == json.loads(summary(_report("mismatch", 2)))
