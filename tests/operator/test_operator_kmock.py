"""The real kopf operator against the emulated API server, with fake broker pods where pods are needed."""

from __future__ import annotations

import time
from typing import Any

import pytest

from rmqbroker.properties import parse_properties
from rmqoperator import controller
from rmqoperator.builders import CONFIG_HASH_ANNOTATION
from tests.operator.conftest import example
from tests.operator.emulator import GROUP, NS, OperatorHarness, condition, wait_for
from tests.operator.podrunner import FakeBackend, PodRunner

NAME = "broker-a"
CHILDREN = [("apps/v1", "statefulsets", "broker-a"), ("apps/v1", "statefulsets", "broker-a-namesrv"),
            ("v1", "services", "broker-a-headless"), ("v1", "services", "broker-a-namesrv"),
            ("v1", "services", "broker-a-namesrv-headless"), ("v1", "configmaps", "broker-a-config"),
            ("v1", "secrets", "broker-a-admin-token"), ("policy/v1", "poddisruptionbudgets", "broker-a"),
            ("policy/v1", "poddisruptionbudgets", "broker-a-namesrv")]


def status(h: OperatorHarness) -> dict[str, Any]:
    return dict((h.client.group(NAME) or {}).get("status") or {})


def confs(h: OperatorHarness) -> dict[str, dict[str, str]]:
    cm = h.client.get("v1", "configmaps", "broker-a-config") or {}
    return {k: parse_properties(v) for k, v in (cm.get("data") or {}).items()}


def wait_ready(h: OperatorHarness, in_sync: int, timeout: float = 20) -> dict[str, Any]:
    def ok() -> dict[str, Any] | None:
        g = h.client.group(NAME)
        st = (g or {}).get("status") or {}
        good = (condition(g, "Ready").get("status") == "True" and st.get("inSyncReplicas") == in_sync
                and st.get("readyReplicas") == in_sync and condition(g, "Degraded").get("status") == "False")
        return st if good else None

    return wait_for(ok, timeout, f"Ready with {in_sync} in sync")


def test_example_creates_every_child_with_roles(harness: OperatorHarness) -> None:
    h = harness
    doc = example()  # examples/brokergroup.yaml as is
    n = int(doc["spec"]["replicas"])
    master_role = "SYNC_MASTER" if doc["spec"]["replication"] == "SYNC" else "ASYNC_MASTER"
    h.client.apply_group(doc)
    for api_version, plural, name in CHILDREN:
        wait_for(lambda a=api_version, p=plural, n=name: h.client.get(a, p, n), 10,  # type: ignore[misc]
                 f"{plural}/{name}")
    group = h.client.group(NAME)
    assert group is not None
    assert f"{GROUP}/finalizer" in group["metadata"]["finalizers"]
    st = wait_for(lambda: status(h).get("observedGeneration") == 1 and status(h), 10, "status")
    assert st["brokerIds"] == {f"broker-a-{i}": i for i in range(n)}
    assert st["master"] == "broker-a-0" and st["epoch"] == 0
    assert condition(h.client.group(NAME), "Ready")["reason"] == "Creating"  # no pods: nothing runs them here
    c = confs(h)
    assert sorted(c) == [f"broker-{i}.conf" for i in range(n)]
    assert c["broker-0.conf"]["brokerRole"] == master_role and "haMasterAddress" not in c["broker-0.conf"]
    for i in range(1, n):
        assert c[f"broker-{i}.conf"]["brokerRole"] == "SLAVE"
        assert c[f"broker-{i}.conf"]["brokerId"] == str(i)
        if doc["spec"].get("masterDiscovery", "Direct") == "Direct":
            assert c[f"broker-{i}.conf"]["haMasterAddress"] == "broker-a-0.broker-a-headless.rmq-test.svc:10912"
    sts = h.client.get("apps/v1", "statefulsets", NAME)
    assert sts is not None and sts["spec"]["updateStrategy"] == {"type": "OnDelete"} and sts["spec"]["replicas"] == n
    uid = group["metadata"]["uid"]
    for api_version, plural, name in CHILDREN:
        obj = h.client.get(api_version, plural, name)
        assert obj is not None and obj["metadata"]["ownerReferences"][0]["uid"] == uid


def test_three_replicas_roles_ready_and_delete_cleans_up(harness: OperatorHarness,
                                                         fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    h, (runner, _) = harness, fake_pods
    h.client.apply_group(example(replicas=3))
    st = wait_ready(h, in_sync=3)
    c = confs(h)
    assert [c[f"broker-{i}.conf"]["brokerRole"] for i in range(3)] == ["SYNC_MASTER", "SLAVE", "SLAVE"]
    for i in (1, 2):
        assert c[f"broker-{i}.conf"]["haMasterAddress"] == "broker-a-0.broker-a-headless.rmq-test.svc:10912"
    assert [(r["pod"], r["brokerId"], r["role"], r["inSync"]) for r in st["replicas"]] == [
        ("broker-a-0", 0, "SYNC_MASTER", True), ("broker-a-1", 1, "SLAVE", True), ("broker-a-2", 2, "SLAVE", True)]
    assert st["phase"] == "Running" and st["masterAddress"] == f"{runner.ip_of('broker-a-0')}:10911"
    assert {c["type"]: c["status"] for c in st["conditions"]} == {
        "Ready": "True", "Replicating": "True", "Degraded": "False", "FailingOver": "False"}
    # The scale subresource's selector picks exactly the group's broker pods.
    wanted = dict(term.split("=", 1) for term in st["selector"].split(","))
    selected = [p["metadata"]["name"] for p in h.client.items("v1", "pods")
                if wanted.items() <= (p["metadata"].get("labels") or {}).items()]
    assert sorted(selected) == ["broker-a-0", "broker-a-1", "broker-a-2"] and st["readyReplicas"] == 3

    h.client.delete_group(NAME)
    wait_for(lambda: h.client.group(NAME) is None, 15, "BrokerGroup gone (finalizer released)")
    for api_version, plural, name in CHILDREN:
        assert h.client.get(api_version, plural, name) is None, f"{plural}/{name} left behind"
    wait_for(lambda: not [p for p in h.client.items("v1", "pods") if p["metadata"]["name"].startswith(NAME)], 10,
             "pods gone with their StatefulSets")


def test_spec_change_rolls_slaves_first_master_last(harness: OperatorHarness,
                                                    fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    h, (runner, backend) = harness, fake_pods
    h.client.apply_group(example(replicas=3))
    wait_ready(h, in_sync=3)
    sts = h.client.get("apps/v1", "statefulsets", NAME)
    assert sts is not None
    old_hash = sts["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
    runner.deleted.clear()
    h.client.patch_group(NAME, {"spec": {"brokerConfig": {"maxMessageSize": "1048576"}}})

    def rolled() -> bool:
        pods = {p["metadata"]["name"]: p for p in h.client.items("v1", "pods")
                if "namesrv" not in p["metadata"]["name"]}
        hashes = {p["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] for p in pods.values()}
        return len(pods) == 3 and old_hash not in hashes and len(runner.deleted) == 3

    wait_for(rolled, 30, "all three pods restarted with the new config")
    assert runner.deleted == ["broker-a-2", "broker-a-1", "broker-a-0"]
    assert confs(h)["broker-1.conf"]["maxMessageSize"] == "1048576"
    st = wait_ready(h, in_sync=3)
    assert len(h.client.events("RollingRestart")) == 3
    # The master's turn came last: it handed over to the in-sync slave first (drained demotion,
    # promotion with a last metadata round at a new epoch), then restarted as that slave's slave.
    assert st["master"] == "broker-a-1" and st["epoch"] == 1 and st["brokerIds"]["broker-a-0"] == 1
    assert [e["message"].split(" handed")[0] for e in h.client.events("MasterHandedOver")] == ["broker-a-0"]
    assert not h.client.events("Promoted") and not h.client.events("MasterLost")
    c = confs(h)
    assert c["broker-1.conf"]["brokerRole"] == "SYNC_MASTER" and c["broker-0.conf"]["brokerRole"] == "SLAVE"
    promotion = next(c[1] for c in backend.brokers["broker-a-1"].calls if c[0] == "role")
    source = promotion.pop("metadataSource")  # the old master's address then (its pod has an IP anew since)
    assert promotion.pop("notAfterMillis") > time.time() * 1000 - 60_000
    assert promotion == {"role": "SYNC_MASTER", "brokerId": 0, "epoch": 1, "syncMetadata": True}
    assert source.endswith(":10911") and not source.startswith(f"{runner.ip_of('broker-a-1')}:")

    # A manual roll: a new restart-at annotation value; replicas only (no restart) for a replicas change.
    runner.deleted.clear()
    h.client.patch_group(NAME, {"metadata": {"annotations": {f"{GROUP}/restart-at": "2026-11-22T10:00:00Z"}}})
    wait_for(lambda: len(runner.deleted) == 3, 30, "manual roll")
    # Slaves first (highest ordinal first), the master (now broker-a-1) last, after handing over to broker-a-0.
    assert runner.deleted == ["broker-a-2", "broker-a-0", "broker-a-1"]
    st = wait_ready(h, in_sync=3)
    assert st["master"] == "broker-a-0" and st["epoch"] == 2
    # Removing the annotation again (a manifest cleaned up) asks for no roll.
    wait_ready(h, in_sync=3)
    runner.deleted.clear()
    h.client.patch_group(NAME, {"metadata": {"annotations": {f"{GROUP}/restart-at": None}}})
    time.sleep(4)  # a roll would have begun within a polling round or two
    assert runner.deleted == []


def test_a_hand_over_that_cannot_complete_restarts_the_master_in_place(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    """The drained master ends beyond what its in-sync slaves show (they never get its last
    bytes): no slave is promoted; the master is restarted in place, as its ConfigMap says."""
    h, (runner, fakes) = harness, fake_pods
    h.client.apply_group(example(replicas=3))
    wait_ready(h, in_sync=3)
    fakes.brokers["broker-a-0"].max_offset = 5000  # its slaves stay at 1000: in sync, but short of it
    runner.deleted.clear()
    h.client.patch_group(NAME, {"metadata": {"annotations": {f"{GROUP}/restart-at": "2026-11-28T09:00:00Z"}}})
    wait_for(lambda: len(runner.deleted) == 3, 40, "roll")
    assert runner.deleted == ["broker-a-2", "broker-a-1", "broker-a-0"]
    st = wait_ready(h, in_sync=3)
    assert st["master"] == "broker-a-0" and st["epoch"] == 0
    failed = h.client.events("HandOverFailed")
    assert len(failed) == 1 and "did not reach broker-a-0's last offset 5000" in failed[0]["message"], failed
    assert not h.client.events("MasterHandedOver")
    assert not any(c[0] == "role" for c in fakes.brokers["broker-a-1"].calls + fakes.brokers["broker-a-2"].calls)
    assert confs(h)["broker-0.conf"]["brokerRole"] == "SYNC_MASTER"


def test_a_hand_over_whose_promotion_answer_is_lost_still_completes(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend], monkeypatch: pytest.MonkeyPatch) -> None:
    """The slave was promoted but its answer lost: the operator asks it and carries on, rather than
    restarting the old master as a second master."""
    h, (runner, fakes) = harness, fake_pods
    # The operator reads the outcome once the promotion's deadline and the clock skew have passed
    # (10 s + 5 s); the fake brokers share this machine's clock, so 2 s + 1 s do here.
    monkeypatch.setattr(controller, "HANDOVER_PROMOTE_MILLIS", 2000)
    monkeypatch.setattr(controller, "CLOCK_SKEW_SECONDS", 1.0)
    fakes.lost_promotion_answers.add("broker-a-1")
    h.client.apply_group(example(replicas=3))
    wait_ready(h, in_sync=3)
    runner.deleted.clear()
    h.client.patch_group(NAME, {"metadata": {"annotations": {f"{GROUP}/restart-at": "2026-11-28T09:30:00Z"}}})
    wait_for(lambda: len(runner.deleted) == 3, 40, "roll")
    st = wait_ready(h, in_sync=3)
    assert st["master"] == "broker-a-1" and st["epoch"] == 1
    assert len(h.client.events("MasterHandedOver")) == 1 and not h.client.events("HandOverFailed")
    assert confs(h)["broker-0.conf"]["brokerRole"] == "SLAVE"
    assert not h.client.events("MasterAdopted")  # never two masters to choose between


def test_switchover_annotation_moves_the_master_once_per_request(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    h, (runner, fakes) = harness, fake_pods
    h.client.apply_group(example(replicas=3))
    wait_ready(h, in_sync=3)
    runner.deleted.clear()

    def request(pod: str) -> None:
        h.client.patch_group(NAME, {"metadata": {"annotations": {f"{GROUP}/switchover-to": pod}}})

    def outcome(pod: str, result: str) -> dict[str, Any]:
        return wait_for(lambda: (so := status(h).get("switchover") or {}).get("request") == pod
                        and so.get("result") == result and status(h), 15, f"switchover to {pod}: {result}")

    # A slave not in sync (8 MiB behind) is waited for, then switched to.
    fakes.brokers["broker-a-0"].max_offset = 8 << 20
    request("broker-a-2")
    st = outcome("broker-a-2", "Waiting")
    assert st["master"] == "broker-a-0" and "not a ready slave in sync" in st["switchover"]["message"]
    time.sleep(1.0)
    assert status(h)["switchover"]["result"] == "Waiting" and not h.client.events("MasterHandedOver")
    fakes.brokers["broker-a-0"].max_offset = 1000
    st = outcome("broker-a-2", "Completed")
    assert st["master"] == "broker-a-2" and st["epoch"] == 1 and st["brokerIds"]["broker-a-0"] == 2
    assert st["lastHandOver"]["trigger"] == "Switchover" and st["lastHandOver"]["from"] == "broker-a-0"
    assert next(c[1].get("drainMillis") or 0 for c in fakes.brokers["broker-a-0"].calls if c[0] == "role") > 0
    st = wait_ready(h, in_sync=3)
    assert runner.deleted == []  # no restart: the old master follows the new one
    assert confs(h)["broker-2.conf"]["brokerRole"] == "SYNC_MASTER"
    # The same value again asks for nothing, even once the master moves on.
    time.sleep(1.5)
    assert status(h)["master"] == "broker-a-2" and len(h.client.events("MasterHandedOver")) == 1
    # A pod that is not a broker of the group is refused; the master itself is done at once.
    request("broker-a-9")
    st = outcome("broker-a-9", "Refused")
    assert "not a broker of this group" in st["switchover"]["message"]
    request("broker-a-2")
    outcome("broker-a-2", "Completed")
    request("broker-a-1")
    st = outcome("broker-a-1", "Completed")
    assert st["master"] == "broker-a-1" and st["epoch"] == 2
    assert len(h.client.events("MasterHandedOver")) == 2 and h.client.events("SwitchoverRefused")


def test_a_failed_switchover_leaves_the_master_serving_without_a_restart(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    """The target never shows the drained master's last offset: not promoted; the demoted master
    resumes in the same round (the status never shows it serving while it refuses sends), and no
    pod is restarted."""
    h, (runner, fakes) = harness, fake_pods
    h.client.apply_group(example(replicas=3, failover={"masterLostSeconds": 120}))
    wait_ready(h, in_sync=3)
    runner.deleted.clear()
    fakes.brokers["broker-a-0"].max_offset = 5000  # in sync (4000 bytes behind), never reaching it
    h.client.patch_group(NAME, {"metadata": {"annotations": {f"{GROUP}/switchover-to": "broker-a-1"}}})
    st = wait_for(lambda: (status(h).get("switchover") or {}).get("result") == "Failed" and status(h), 20,
                  "switchover failed")
    assert st["switchover"]["request"] == "broker-a-1"
    # The first status that tells of the failure already shows the master resumed.
    assert st["epoch"] == 1 and st["master"] == "broker-a-0" and h.client.events("MasterResumed")
    failed = h.client.events("HandOverFailed")
    assert len(failed) == 1 and "broker-a-0 stays master" in failed[0]["message"], failed
    wait_for(lambda: h.client.events("MasterResumed"), 10, "the demoted master resumed")
    st = wait_ready(h, in_sync=3)
    assert st["master"] == "broker-a-0" and st["epoch"] == 1 and runner.deleted == []
    assert not h.client.events("MasterHandedOver") and not h.client.events("Promoted")


def test_a_master_left_demoted_by_a_cut_short_hand_over_resumes_at_once(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    """The master serves as a slave of nobody (a hand-over whose operator died between demotion and
    promotion): it is made master again at a new epoch, not failed over from after masterLostSeconds."""
    h, (_, fakes) = harness, fake_pods
    h.client.apply_group(example(replicas=3, failover={"masterLostSeconds": 120}))
    wait_ready(h, in_sync=3)
    old = fakes.brokers["broker-a-0"]
    old.role, old.broker_id = "SLAVE", 1
    resumed = wait_for(lambda: h.client.events("MasterResumed"), 10, "MasterResumed")
    assert "broker-a-0" in resumed[0]["message"]
    st = wait_ready(h, in_sync=3)
    assert st["master"] == "broker-a-0" and st["epoch"] == 1
    assert (old.role, old.broker_id, old.epoch) == ("SYNC_MASTER", 0, 1)
    assert not h.client.events("Promoted") and not any(c[0] == "role" for c in fakes.brokers["broker-a-1"].calls)


def test_scheduling_change_moves_brokers_one_at_a_time(harness: OperatorHarness,
                                                       fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    """spec.scheduling: pods of the group prefer distinct nodes from the start; a new node selector
    recreates the brokers from the new template, slaves first and the master last."""
    h, (runner, _) = harness, fake_pods
    h.client.apply_group(example(replicas=3))
    wait_ready(h, in_sync=3)
    for p in h.client.items("v1", "pods"):
        anti = p["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname", p["metadata"]["name"]
    runner.deleted.clear()
    h.client.patch_group(NAME, {"spec": {"scheduling": {"nodeSelector": {"pool": "mq"},
                                                        "tolerations": [{"key": "mq", "operator": "Exists"}]}}})

    def moved() -> bool:
        brokers = [p for p in h.client.items("v1", "pods") if "namesrv" not in p["metadata"]["name"]]
        return len(brokers) == 3 and all(p["spec"].get("nodeSelector") == {"pool": "mq"} for p in brokers)

    wait_for(moved, 30, "every broker recreated with the node selector")
    assert runner.deleted == ["broker-a-2", "broker-a-1", "broker-a-0"]
    sts = h.client.get("apps/v1", "statefulsets", f"{NAME}-namesrv")
    assert sts is not None and sts["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "mq"}
    wait_ready(h, in_sync=3)

    # Fields the spec no longer sets leave the live templates too (a merge patch alone keeps them):
    # the node selector and tolerations go, and Required anti-affinity replaces Preferred.
    h.client.patch_group(NAME, {"spec": {"scheduling": {"podAntiAffinity": "Required", "nodeSelector": None,
                                                        "tolerations": None}}})

    def templates_follow() -> bool:
        for name in (NAME, f"{NAME}-namesrv"):
            sts = h.client.get("apps/v1", "statefulsets", name)
            pod = (sts or {}).get("spec", {}).get("template", {}).get("spec", {})
            if "nodeSelector" in pod or "tolerations" in pod:
                return False
            anti = pod.get("affinity", {}).get("podAntiAffinity", {})
            if list(anti) != ["requiredDuringSchedulingIgnoredDuringExecution"]:
                return False
        return True

    wait_for(templates_follow, 30, "scheduling fields dropped from both StatefulSet templates")
    wait_ready(h, in_sync=3)

    # Pod labels and annotations the spec stops setting leave the templates as well.
    h.client.patch_group(NAME, {"spec": {"podLabels": {"team": "mq"}, "podAnnotations": {"owner": "mq-team"}}})

    def template_meta() -> list[dict[str, Any]]:
        return [((h.client.get("apps/v1", "statefulsets", n) or {}).get("spec", {}).get("template", {})
                 .get("metadata", {})) for n in (NAME, f"{NAME}-namesrv")]

    wait_for(lambda: all(m.get("labels", {}).get("team") == "mq" and m.get("annotations", {}).get("owner")
                         for m in template_meta()), 30, "pod labels and annotations set")
    wait_ready(h, in_sync=3)
    h.client.patch_group(NAME, {"spec": {"podLabels": None, "podAnnotations": None}})
    wait_for(lambda: all("team" not in m.get("labels", {}) and "owner" not in m.get("annotations", {})
                         for m in template_meta()), 30, "pod labels and annotations removed")
    wait_ready(h, in_sync=3)


def test_invalid_specs_reported_without_touching_children(harness: OperatorHarness,
                                                          fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    h, (runner, _) = harness, fake_pods
    h.client.apply_group(example(replicas=2))
    wait_ready(h, in_sync=2)
    before = {n: h.client.get(a, p, n)["metadata"]["resourceVersion"] for a, p, n in CHILDREN}  # type: ignore[index]
    runner.deleted.clear()
    h.client.patch_group(NAME, {"spec": {"image": "other:2", "brokerConfig": {"brokerRole": "ASYNC_MASTER"}}})

    def reported() -> dict[str, Any] | None:
        c = condition(h.client.group(NAME), "Ready")
        return c if c.get("reason") == "InvalidSpec" else None

    cond = wait_for(reported, 10, "InvalidSpec condition")
    assert "brokerRole" in cond["message"] and cond["status"] == "False"
    g = h.client.group(NAME)
    assert g is not None and g["status"]["observedGeneration"] == g["metadata"]["generation"] == 2
    assert g["status"]["phase"] == "Invalid"
    assert h.client.events("InvalidSpec")
    import time

    time.sleep(1.5)  # several polling rounds
    after = {n: h.client.get(a, p, n)["metadata"]["resourceVersion"] for a, p, n in CHILDREN}  # type: ignore[index]
    assert after == before and runner.deleted == []
    # The brokers keep being watched: the replica rows stay current.
    assert [r["role"] for r in status(h)["replicas"]] == ["SYNC_MASTER", "SLAVE"]

    h.client.patch_group(NAME, {"spec": {"image": None, "brokerConfig": {"brokerRole": None}}})
    wait_ready(h, in_sync=2)

    # What only the API server refuses (here a resource quantity): reported as InvalidSpec with the
    # server's reason at this generation, not retried as an outage nor shown as applied.
    sts_before = h.client.get("apps/v1", "statefulsets", NAME)
    assert sts_before is not None
    h.client.patch_group(NAME, {"spec": {"resources": {"requests": {"cpu": "lots"}}}})
    cond = wait_for(reported, 10, "InvalidSpec condition for a child the API server refused")
    assert "API server refused" in cond["message"] and "lots" in cond["message"]
    g = h.client.group(NAME)
    assert g is not None and g["status"]["observedGeneration"] == g["metadata"]["generation"]
    assert condition(g, "Available").get("reason") != "Available" or g["status"]["phase"] == "Invalid"
    sts = h.client.get("apps/v1", "statefulsets", NAME)
    assert sts is not None and sts["spec"]["template"] == sts_before["spec"]["template"]
    h.client.patch_group(NAME, {"spec": {"resources": {"requests": {"cpu": "250m"}}}})
    wait_ready(h, in_sync=2)

    # The HA and admin ports stay what the brokers run with (the operator would lose them).
    h.client.patch_group(NAME, {"spec": {"ports": {"ha": 10920}}})
    cond = wait_for(lambda: (c := condition(h.client.group(NAME), "Ready")).get("reason") == "InvalidSpec"
                    and "ports.ha" in c.get("message", "") and c, 10, "HA port change refused")
    assert "spec.ports.ha cannot change on a running group (10912 -> 10920)" in cond["message"]
    assert {c.get("haListenPort") for c in confs(h).values()} == {"10912"}  # nothing re-rendered
    h.client.patch_group(NAME, {"spec": {"ports": {"ha": 10912}}})
    wait_ready(h, in_sync=2)


def test_invalid_from_the_start_creates_nothing(harness: OperatorHarness) -> None:
    h = harness
    doc = example(brokerConfig={"defaultTopicQueueNums": "many"})
    h.client.apply_group(doc)
    cond = wait_for(lambda: condition(h.client.group(NAME), "Ready").get("reason") == "InvalidSpec"
                    and condition(h.client.group(NAME), "Ready"), 10, "InvalidSpec")
    assert "defaultTopicQueueNums" in cond["message"]
    assert h.client.items("apps/v1", "statefulsets") == [] and h.client.items("v1", "configmaps") == []


def test_bad_name_server_address_is_reported_against_its_field(harness: OperatorHarness) -> None:
    h = harness  # the emulator applies no schema: the operator's own check must name the field
    h.client.apply_group(example(nameServer={"addresses": ["10.0.0.1:9876", "999.1.1.1:9876"]}))
    cond = wait_for(lambda: condition(h.client.group(NAME), "Ready").get("reason") == "InvalidSpec"
                    and condition(h.client.group(NAME), "Ready"), 10, "InvalidSpec")
    assert cond["message"].startswith("spec.nameServer.addresses[1]: '999.1.1.1:9876'"), cond
    assert "brokerConfig" not in cond["message"] and "namesrvAddr" not in cond["message"]
    g = h.client.group(NAME)
    assert g is not None and cond.get("observedGeneration") == g["metadata"]["generation"]
    assert h.client.items("apps/v1", "statefulsets") == [] and h.client.items("v1", "configmaps") == []


def test_pause_annotation_and_scaling(harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    h = harness
    h.client.apply_group(example(replicas=2))
    wait_ready(h, in_sync=2)
    h.client.patch_group(NAME, {"metadata": {"annotations": {f"{GROUP}/paused": "true"}}})
    wait_for(lambda: status(h).get("phase") == "Paused", 10, "Paused phase")
    h.client.patch_group(NAME, {"spec": {"replicas": 4}})
    import time

    time.sleep(1.0)
    assert h.client.get("apps/v1", "statefulsets", NAME)["spec"]["replicas"] == 2  # type: ignore[index]
    h.client.patch_group(NAME, {"metadata": {"annotations": {f"{GROUP}/paused": None}}})
    st = wait_ready(h, in_sync=4)
    assert st["brokerIds"] == {f"broker-a-{i}": i for i in range(4)}
    assert sorted(confs(h)) == [f"broker-{i}.conf" for i in range(4)]
    # Scale down removes the highest ordinals (the StatefulSet does) and their conf files.
    h.client.patch_group(NAME, {"spec": {"replicas": 2}})
    st = wait_ready(h, in_sync=2)
    assert st["brokerIds"] == {"broker-a-0": 0, "broker-a-1": 1}
    assert sorted(confs(h)) == ["broker-0.conf", "broker-1.conf"]


def test_failover_repoint_demotion_and_refused_scale_down(harness: OperatorHarness,
                                                          fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    h, (runner, fakes) = harness, fake_pods
    h.client.apply_group(example(replicas=3, failover={"masterLostSeconds": 1}))
    wait_ready(h, in_sync=3)
    runner.kill("broker-a-0")
    st = wait_for(lambda: status(h).get("master") == "broker-a-1" and status(h), 15, "promotion of broker-a-1")
    assert st["epoch"] == 1 and st["brokerIds"] == {"broker-a-0": 1, "broker-a-1": 0, "broker-a-2": 2}
    # Both slaves were fenced at the new epoch before the promotion (the old master may only hang).
    assert fakes.brokers["broker-a-1"].calls[:2] == [("fence", {"epoch": 1}),
                                                      ("role", {"role": "SYNC_MASTER", "brokerId": 0, "epoch": 1})]
    assert fakes.brokers["broker-a-2"].calls[0] == ("fence", {"epoch": 1})
    new_ha = f"{runner.ip_of('broker-a-1')}:10912"
    wait_for(lambda: ("repoint", {"haAddress": new_ha, "brokerAddress": f"{runner.ip_of('broker-a-1')}:10911",
                                  "epoch": 1}) in fakes.brokers["broker-a-2"].calls, 10, "broker-a-2 re-pointed")
    c = confs(h)
    assert c["broker-1.conf"]["brokerRole"] == "SYNC_MASTER" and c["broker-0.conf"]["brokerRole"] == "SLAVE"
    assert c["broker-0.conf"]["haMasterAddress"] == "broker-a-1.broker-a-headless.rmq-test.svc:10912"
    assert h.client.events("Promoted")
    from rmqoperator.metrics import REGISTRY

    labels = {"namespace": "rmq-test", "group": NAME}
    assert (REGISTRY.get_sample_value("rmq_operator_failovers_total", {**labels, "result": "ok"}) or 0) >= 1
    assert REGISTRY.get_sample_value("rmq_operator_group_epoch", labels) == 1
    # The old master comes back as a slave (the kubelet restarts it with the current ConfigMap).
    runner.restart("broker-a-0")
    st = wait_ready(h, in_sync=3)
    assert st["pendingDemotion"] == [] and st["lastFailover"]["to"] == "broker-a-1"
    # Scale down to 1 would remove the master (ordinal 1): refused, the StatefulSet keeps 2 pods.
    h.client.patch_group(NAME, {"spec": {"replicas": 1}})
    cond = wait_for(lambda: condition(h.client.group(NAME), "Degraded").get("reason") == "ScaleDownRefused"
                    and condition(h.client.group(NAME), "Degraded"), 10, "ScaleDownRefused")
    assert "ordinal 1" in cond["message"]
    assert h.client.get("apps/v1", "statefulsets", NAME)["spec"]["replicas"] == 2  # type: ignore[index]
    assert sorted(confs(h)) == ["broker-0.conf", "broker-1.conf"]


def test_sync_promotion_waits_while_a_slave_cannot_be_fenced(harness: OperatorHarness,
                                                            fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    """Under SYNC a slave that followed the master but cannot be fenced might still acknowledge it:
    no promotion (one PromotionFailed event, not one per round) until the fence succeeds."""
    h, (runner, fakes) = harness, fake_pods
    h.client.apply_group(example(replicas=3, failover={"masterLostSeconds": 1}))
    wait_ready(h, in_sync=3)
    fakes.brokers["broker-a-2"].fence_fails = True
    runner.kill("broker-a-0")
    wait_for(lambda: h.client.events("PromotionFailed"), 15, "a refused promotion")
    import time

    time.sleep(3.0)  # several more polling rounds
    assert status(h).get("master") == "broker-a-0" and status(h).get("epoch", 0) == 0
    refused = h.client.events("PromotionFailed")
    assert len(refused) == 1 and "broker-a-2" in refused[0]["message"], refused
    assert not any(c[0] == "role" for c in fakes.brokers["broker-a-1"].calls)
    fakes.brokers["broker-a-2"].fence_fails = False
    st = wait_for(lambda: status(h).get("master") in ("broker-a-1", "broker-a-2") and status(h), 15, "promotion")
    assert st["epoch"] == 1


def test_failover_with_brokers_of_an_image_without_fencing(harness: OperatorHarness,
                                                         fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    """An operator upgraded before its brokers still fails over (on the slaves' status offsets)."""
    h, (runner, fakes) = harness, fake_pods
    fakes.fence = False
    h.client.apply_group(example(replicas=3, failover={"masterLostSeconds": 1}))
    wait_ready(h, in_sync=3)
    runner.kill("broker-a-0")
    st = wait_for(lambda: status(h).get("master") == "broker-a-1" and status(h), 15, "promotion of broker-a-1")
    assert st["epoch"] == 1
    assert fakes.brokers["broker-a-1"].calls[0] == ("role", {"role": "SYNC_MASTER", "brokerId": 0, "epoch": 1})


def test_raising_the_storage_size_grows_the_claims_and_never_shrinks_them(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    h = harness
    h.client.apply_group(example(replicas=2, storage={"size": "10Gi"}))
    wait_ready(h, in_sync=2)
    # What the StatefulSet controller makes from the claim template (the emulator runs none).
    for ordinal in (0, 1):
        h.client.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "metadata": {"name": f"data-{NAME}-{ordinal}", "namespace": NS},
                         "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "standard",
                                  "resources": {"requests": {"storage": "10Gi"}}}},
                        "persistentvolumeclaims")

    def requested() -> list[str]:
        return [str(((h.client.get("v1", "persistentvolumeclaims", f"data-{NAME}-{o}") or {}).get("spec") or {})
                    ["resources"]["requests"]["storage"]) for o in (0, 1)]

    runner = fake_pods[0]
    runner.deleted.clear()
    h.client.patch_group(NAME, {"spec": {"storage": {"size": "1.5Ti"}}})
    wait_for(lambda: requested() == ["1.5Ti", "1.5Ti"], 20, "claims grown")
    assert len(h.client.events("VolumeExpansion")) == 2
    assert runner.deleted == []  # growing a volume restarts no broker
    wait_ready(h, in_sync=2)

    h.client.patch_group(NAME, {"spec": {"storage": {"size": "5Gi"}}})
    degraded = wait_for(lambda: (c := condition(h.client.group(NAME), "Degraded")).get("reason") == "VolumeNotResized"
                        and c, 20, "shrink refused")
    assert "never shrink" in degraded["message"] and f"data-{NAME}-0 (1.5Ti)" in degraded["message"]
    assert requested() == ["1.5Ti", "1.5Ti"]
    assert h.client.events("VolumeNotResized")

    # A claim's class cannot change (nor the StatefulSet's claim template): said, not ignored.
    h.client.patch_group(NAME, {"spec": {"storage": {"size": "1.5Ti", "storageClassName": "fast-ssd"}}})
    degraded = wait_for(lambda: (c := condition(h.client.group(NAME), "Degraded")).get("reason") == "VolumeNotResized"
                        and "fast-ssd" in c.get("message", "") and c, 20, "class change reported")
    assert f"data-{NAME}-0 (standard)" in degraded["message"] and "never shrink" not in degraded["message"]


def test_a_missing_or_incomplete_secret_is_reported_until_it_is_there(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend], monkeypatch: pytest.MonkeyPatch) -> None:
    """spec.tls / spec.acl name Secrets the pods mount: while one is missing or lacks a key the pods
    need, Degraded says which (and an event), and it clears once the Secret is complete."""
    h = harness
    # Looked at again every 1 s instead of 5 s while one is missing (every 60 s otherwise).
    monkeypatch.setattr(controller, "SECRET_RECHECK_SECONDS", 1.0)
    h.client.apply_group(example(replicas=2, tls={"secretName": "later-tls"}))

    def degraded(reason: str) -> dict[str, Any] | None:
        c = dict(condition(h.client.group(NAME), "Degraded"))
        return c if c.get("reason") == reason else None

    cond = wait_for(lambda: degraded("SecretMissing"), 20, "missing Secret reported")
    assert "Secret later-tls (spec.tls.secretName) not found" in cond["message"], cond
    assert h.client.events("SecretMissing")
    # Created without the key: still reported, naming the key.
    h.client.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "later-tls", "namespace": NS},
                     "data": {"tls.crt": "Y2VydA==", "ca.crt": "Y2E="}}, "secrets")
    cond = wait_for(lambda: (c := degraded("SecretMissing")) and "has no tls.key" in c["message"] and c, 20,
                    "incomplete Secret reported")
    h.client.patch("v1", "secrets", "later-tls", {"data": {"tls.key": "a2V5"}})
    wait_for(lambda: condition(h.client.group(NAME), "Degraded").get("reason") != "SecretMissing", 20,
             "complete Secret no longer reported")
