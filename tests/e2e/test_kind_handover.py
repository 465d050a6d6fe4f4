"""End to end on a real cluster (kind in CI): a rolling restart and a requested switchover under
stock-client traffic move the master by hand-over, never by failover, and lose nothing acknowledged.

Runs after test_kind_failover.py on the same BrokerGroup (replicas >= 2, failover enabled). Steps:
  1. wait for Ready with every replica; note the master, the epoch and the last failover;
  2. a Job keeps sending (one message every 100 ms) while
  3. the restart-at annotation rolls every broker: the master hands over before its own restart
     (status.lastHandOver from the old master, trigger RollingRestart, a newer epoch);
  4. the switchover-to annotation moves the master to another in-sync slave (status.switchover
     Completed) without restarting anything;
  5. no failover happened (status.lastFailover unchanged), and a Job reading every queue from
     offset 0 finds every acknowledged message.
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

TRAFFIC_SECONDS = 300
GROUP = "rmq.brokergroup.dev"


def test_roll_and_switchover_hand_over_without_failover_or_loss(kubectl: Kubectl, e2e_config: E2EConfig) -> None:
    name = e2e_config.group
    ns = e2e_config.namespace
    run_id = time.strftime("%H%M%S")
    topic = f"E2E_HO_{run_id}"

    def job(job_name: str, args: list[str]) -> dict[str, Any]:
        return client_job(f"e2e-{job_name}-{run_id}", ns, e2e_config.client_image, args,
                          pull_policy=e2e_config.client_pull_policy)

    def healthy() -> dict[str, Any] | None:
        g = kubectl.get("brokergroup", name)
        st = g.get("status", {})
        ok = (is_ready(g) and int(st.get("readyReplicas", 0)) == int(g["spec"]["replicas"])
              and int(st.get("inSyncReplicas", 0)) == int(g["spec"]["replicas"]) and st.get("master"))
        return g if ok else None

    def annotate(key: str, value: str) -> None:
        kubectl.run("annotate", "brokergroup", name, f"{GROUP}/{key}={value}", "--overwrite")

    try:
        # 1.
        group = wait_for("the group Ready with every replica in sync", healthy, timeout=900)
        replicas = int(group["spec"]["replicas"])
        assert replicas >= 2, "a hand-over needs at least one slave"
        assert group["spec"].get("failover", {}).get("enabled", True), "spec.failover.enabled must be true"
        st = group["status"]
        old_master, old_epoch, last_failover = st["master"], int(st.get("epoch", 0)), st.get("lastFailover")
        namesrv = namesrv_address(group)
        print(f"master {old_master} epoch {old_epoch} nameserver {namesrv}")

        # 2.
        traffic = job("handover", produce_args(namesrv, topic, f"ho-{run_id}", duration=TRAFFIC_SECONDS, interval=0.1))
        traffic_name = traffic["metadata"]["name"]
        kubectl.delete("job", traffic_name, "--wait=true")
        kubectl.apply(traffic)
        wait_for("traffic before the roll", lambda: acked_keys(parse_events(kubectl.job_logs(traffic_name))),
                 timeout=180)

        # 3.
        rolled_at = time.monotonic()
        annotate("restart-at", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

        def rolled() -> dict[str, Any] | None:
            g = healthy()
            if g is None:
                return None
            st = g["status"]
            ho = st.get("lastHandOver") or {}
            done = (ho.get("from") == old_master and ho.get("trigger") == "RollingRestart"
                    and not (st.get("rolling") or {}).get("pending"))
            return g if done else None

        group = wait_for("every broker restarted, the master handed over first", rolled, timeout=900)
        st = group["status"]
        print(f"roll took {time.monotonic() - rolled_at:.0f} s; lastHandOver={st['lastHandOver']}")
        assert st["master"] != old_master and int(st["epoch"]) > old_epoch

        # 4.
        target = sorted(r["pod"] for r in st["replicas"] if r.get("role") == "SLAVE" and r.get("inSync"))[0]
        annotate("switchover-to", target)

        def switched() -> dict[str, Any] | None:
            g = healthy()
            so = (g or {}).get("status", {}).get("switchover") or {}
            if so.get("request") == target and so.get("result") in ("Refused", "Failed"):
                raise AssertionError(f"switchover to {target}: {so}")
            return g if g is not None and so.get("request") == target and so.get("result") == "Completed" else None

        group = wait_for(f"switchover to {target}", switched, timeout=300)
        st = group["status"]
        print(f"switchover: lastHandOver={st['lastHandOver']}")
        assert st["master"] == target and st["lastHandOver"]["trigger"] == "Switchover"

        # 5.
        assert st.get("lastFailover") == last_failover, f"a failover happened: {st.get('lastFailover')}"
        state = wait_for(f"job {traffic_name}", lambda: kubectl.job_state(traffic_name), timeout=TRAFFIC_SECONDS + 300)
        during = parse_events(kubectl.job_logs(traffic_name))
        assert state == "Complete", during[-5:]
        acked = acked_keys(during)
        print(f"during roll and switchover: {len(acked)} acknowledged, "
              f"{sum(1 for e in during if e.get('event') == 'fail')} failed")
        after = kubectl.run_job(job("ho-after", produce_args(namesrv, topic, f"ho-after-{run_id}", count=20)),
                                timeout=300)
        assert len(acked_keys(after)) == 20
        acked |= acked_keys(after)
        consumed = kubectl.run_job(job("ho-consume", consume_args(namesrv, topic, f"CG_HO_{run_id}")), timeout=300)
        seen = {e["key"] for e in consumed if e.get("event") == "msg"}
        lost = acked - seen
        assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:10]}"
    except BaseException:
        print(kubectl.diagnostics(name))
        raise
