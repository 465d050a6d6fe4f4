"""End to end on a real cluster (kind in CI): stock-client traffic, master pod deleted, failover, no loss.

Expects the chart installed and the BrokerGroup applied (replicas 3, SYNC, failover enabled), as the
workflow .github/workflows/e2e-kind.yaml does. Steps:
  1. wait for Ready; note the master pod and the epoch;
  2. a Job sends N messages with send_sync: every one must be acknowledged;
  3. a second Job keeps sending (one message every 100 ms) while
  4. every node is cordoned (so the deleted pod cannot come straight back and the operator must fail
     over; RMQ_E2E_CORDON=0 skips this) and the master pod is deleted;
  5. the operator promotes a slave: status.master changes and the epoch grows; nodes are uncordoned;
  6. the group turns Ready again with every replica ready (the old master back as a slave);
  7. a Job reads every queue from offset 0: every acknowledged message of 2 and 3 is there, and a
     new send to the promoted master is acknowledged.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e.conftest import E2EConfig
from tests.e2e.kube import (
    Kubectl,
    acked_keys,
    client_job,
    consume_args,
    is_ready,
    namesrv_address,
    parse_events,
    produce_args,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

MESSAGES_BEFORE = 200
FAILOVER_TRAFFIC_SECONDS = 120


def test_failover_loses_no_acknowledged_message(kubectl: Kubectl, e2e_config: E2EConfig) -> None:
    name = e2e_config.group
    ns = e2e_config.namespace
    run_id = time.strftime("%H%M%S")
    topic = f"E2E_{run_id}"
    cordoned: list[str] = []

    def job(job_name: str, args: list[str]) -> dict[str, Any]:
        return client_job(f"e2e-{job_name}-{run_id}", ns, e2e_config.client_image, args,
                          pull_policy=e2e_config.client_pull_policy)

    try:
        def ready() -> dict[str, Any] | None:
            g = kubectl.get("brokergroup", name)
            return g if is_ready(g) and g.get("status", {}).get("master") else None

        group = wait_for(f"BrokerGroup {name} Ready", ready, timeout=600)
        replicas = int(group["spec"]["replicas"])
        assert replicas >= 2, "failover needs at least one slave"
        assert group["spec"].get("failover", {}).get("enabled", True), "spec.failover.enabled must be true"
        old_master = group["status"]["master"]
        old_epoch = int(group["status"].get("epoch", 0))
        namesrv = namesrv_address(group)
        print(f"master {old_master} epoch {old_epoch} nameserver {namesrv}")

        # 2. traffic on a healthy group: every send acknowledged.
        before = kubectl.run_job(job("before", produce_args(namesrv, topic, f"before-{run_id}",
                                                            count=MESSAGES_BEFORE)), timeout=300)
        acked_before = acked_keys(before)
        assert len(acked_before) == MESSAGES_BEFORE, [e for e in before if e.get("event") == "fail"][:5]

        # 3. traffic across the failover.
        during_job = job("during", produce_args(namesrv, topic, f"during-{run_id}",
                                                duration=FAILOVER_TRAFFIC_SECONDS, interval=0.1))
        during_name = during_job["metadata"]["name"]
        kubectl.delete("job", during_name, "--wait=true")
        kubectl.apply(during_job)
        wait_for("traffic before the kill", lambda: acked_keys(parse_events(kubectl.job_logs(during_name))),
                 timeout=180)

        # 4. kill the master where it cannot be rescheduled.
        if e2e_config.cordon:
            for node in kubectl.nodes():
                kubectl.run("cordon", node, namespaced=False)
                cordoned.append(node)
        killed_at = time.monotonic()
        kubectl.run("delete", "pod", old_master, "--wait=false")

        # 5. promotion.
        def promoted() -> dict[str, Any] | None:
            g = kubectl.get("brokergroup", name)
            st = g.get("status", {})
            if st.get("master") not in (None, "", old_master) and int(st.get("epoch", 0)) > old_epoch:
                return g
            return None

        group = wait_for("a slave promoted", promoted, timeout=300)
        print(f"failover {old_master} -> {group['status']['master']} epoch {group['status']['epoch']} "
              f"after {time.monotonic() - killed_at:.1f} s; lastFailover={group['status'].get('lastFailover')}")
        for node in cordoned:
            kubectl.run("uncordon", node, namespaced=False)
        cordoned.clear()

        during_state = wait_for(f"job {during_name}", lambda: kubectl.job_state(during_name),
                                timeout=FAILOVER_TRAFFIC_SECONDS + 300)
        during = parse_events(kubectl.job_logs(during_name))
        assert during_state == "Complete", during[-5:]
        acked_during = acked_keys(during)
        failed_during = [e for e in during if e.get("event") == "fail"]
        print(f"during failover: {len(acked_during)} acknowledged, {len(failed_during)} failed")

        # 6. whole again: Ready, every replica ready.
        def healthy() -> dict[str, Any] | None:
            g = kubectl.get("brokergroup", name)
            st = g.get("status", {})
            ok = is_ready(g) and int(st.get("readyReplicas", 0)) == replicas
            return g if ok else None

        group = wait_for("the group Ready with every replica", healthy, timeout=600)
        roles = {r.get("pod"): r.get("role") for r in group["status"].get("replicas", [])}
        print(f"roles after failover: {roles}")
        assert group["status"]["master"] != old_master or int(group["status"]["epoch"]) > old_epoch

        # 7. nothing acknowledged is lost, and the new master takes writes.
        after = kubectl.run_job(job("after", produce_args(namesrv, topic, f"after-{run_id}", count=20)),
                                timeout=300)
        acked_after = acked_keys(after)
        assert len(acked_after) == 20
        consumed = kubectl.run_job(job("consume", consume_args(namesrv, topic, f"CG_E2E_{run_id}")), timeout=300)
        seen = {e["key"] for e in consumed if e.get("event") == "msg"}
        lost = (acked_before | acked_during | acked_after) - seen
        assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:10]}"
        print(f"consumed {len(seen)} messages; acknowledged {len(acked_before | acked_during | acked_after)}")
    except BaseException:
        print(kubectl.diagnostics(name))
        raise
    finally:
        for node in cordoned:
            kubectl.run("uncordon", node, namespaced=False, check=False)
