"""A full disk end to end without a cluster: the real operator, the emulated API and real broker
processes as pods. The brokers are told their disk is full (a warning ratio below what this
machine's disk uses), refuse sends, and the operator reports it: the replicas' rows, the
conditions (not Ready, Degraded DiskFull) and one DiskFull event per broker, without failing over."""

from __future__ import annotations

from typing import Any

from rmqbroker.remoting.codes import ResponseCode
from rmqbroker.store.retention import disk_used_ratio
from tests.integration.helpers import send_raw
from tests.operator.conftest import example
from tests.operator.emulator import OperatorHarness, condition, wait_for
from tests.operator.podrunner import PodRunner, ProcessBackend

NAME = "broker-a"


def test_a_full_disk_is_reported_by_the_operator(harness: OperatorHarness,
                                                 real_pods: tuple[PodRunner, ProcessBackend]) -> None:
    h, (runner, _) = harness, real_pods
    used = disk_used_ratio(runner.workdir)
    assert used > 0.01, f"this test needs a disk more than 1 % used (it is {used:.2%})"
    h.client.apply_group(example(replicas=2, replication="ASYNC", brokerConfig={
        "diskSpaceWarningLevelRatio": "1", "diskSpaceCleanForciblyRatio": "1", "cleanResourceInterval": "300"}))

    def reported() -> dict[str, Any] | None:
        g = h.client.group(NAME)
        rows = ((g or {}).get("status") or {}).get("replicas") or []
        ready, degraded = condition(g, "Ready"), condition(g, "Degraded")
        ok = (len(rows) == 2 and all(r.get("diskFull") is True and r.get("diskUsedPercent", 0) > 1 for r in rows)
              and ready.get("reason") == "DiskFull" and degraded.get("reason") == "DiskFull")
        return g if ok else None

    g = wait_for(reported, 60, "the full disks reported")
    assert condition(g, "Ready")["status"] == "False"
    assert "broker-a-0" in condition(g, "Degraded")["message"]
    assert condition(g, "FailingOver")["status"] == "False"  # a full disk is no reason to fail over
    wait_for(lambda: len(h.client.events("DiskFull")) == 2 or None, 20, "one DiskFull event per broker")
    master_addr = (h.client.group(NAME) or {})["status"]["masterAddress"]
    resp = send_raw(master_addr, "DiskTopic", b"no room")
    assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE and "disk is full" in (resp.remark or "")
    assert (h.client.group(NAME) or {})["status"].get("master") == "broker-a-0"
