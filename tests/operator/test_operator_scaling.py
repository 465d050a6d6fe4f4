"""Scaling and failover together (real kopf, emulated API, fake broker pods): a scale-down refused or
deferred is carried out once the reason is gone, former masters to demote are tracked truthfully,
and the status shows the address a broker really listens on while a port change rolls."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rmqoperator import controller
from tests.operator.conftest import example, pods_on
from tests.operator.emulator import OperatorHarness, condition, wait_for
from tests.operator.podrunner import FakeBackend, FakeBroker, PodRunner

NAME = "broker-a"


def status(h: OperatorHarness) -> dict[str, Any]:
    return dict((h.client.group(NAME) or {}).get("status") or {})


def sts_replicas(h: OperatorHarness) -> int:
    return int(h.client.get("apps/v1", "statefulsets", NAME)["spec"]["replicas"])  # type: ignore[index]


def degraded(h: OperatorHarness) -> dict[str, Any]:
    return dict(condition(h.client.group(NAME), "Degraded"))


def wait_in_sync(h: OperatorHarness, n: int) -> dict[str, Any]:
    return wait_for(lambda: status(h).get("inSyncReplicas") == n and status(h).get("readyReplicas") == n
                    and condition(h.client.group(NAME), "Ready").get("status") == "True" and status(h),
                    25, f"{n} in sync")


def master_at_ordinal_2(h: OperatorHarness, runner: PodRunner) -> None:
    """An ASYNC group of 3 whose pods 0 and 1 died together: broker-a-2 was promoted, both are back."""
    h.client.apply_group(example(replicas=3, replication="ASYNC", failover={"masterLostSeconds": 1}))
    wait_in_sync(h, 3)
    runner.kill("broker-a-0")
    runner.kill("broker-a-1")
    wait_for(lambda: status(h).get("master") == "broker-a-2", 20, "broker-a-2 promoted")
    runner.restart("broker-a-0")
    runner.restart("broker-a-1")
    assert wait_in_sync(h, 3)["pendingDemotion"] == []


def test_a_refused_scale_down_is_carried_out_once_the_master_moved(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    h, (runner, _) = harness, fake_pods
    master_at_ordinal_2(h, runner)
    h.client.patch_group(NAME, {"spec": {"replicas": 2}})
    wait_for(lambda: degraded(h).get("reason") == "ScaleDownRefused", 15, "ScaleDownRefused")
    assert sts_replicas(h) == 3
    runner.kill("broker-a-2")  # the master fails over to a lower ordinal: nothing holds the scale-down now
    wait_for(lambda: status(h).get("master") in ("broker-a-0", "broker-a-1"), 20, "failover off ordinal 2")
    wait_for(lambda: sts_replicas(h) == 2 and "broker-a-2" not in status(h).get("brokerIds", {}), 15,
             "the scale-down carried out")
    wait_in_sync(h, 2)
    assert degraded(h).get("status") == "False" and status(h)["pendingDemotion"] == []


def test_a_dead_former_master_stays_pending_demotion_until_it_follows(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    """broker-a-2 followed broker-a-0 at epoch 0, was master at epoch 1 and died; broker-a-0 is
    promoted again. That it once followed broker-a-0 does not settle its demotion."""
    h, (runner, _) = harness, fake_pods
    master_at_ordinal_2(h, runner)
    runner.kill("broker-a-1")  # so that broker-a-0 is the one promoted
    time.sleep(1.0)
    runner.kill("broker-a-2")
    wait_for(lambda: status(h).get("master") == "broker-a-0", 20, "broker-a-0 promoted")
    for _ in range(15):
        assert status(h).get("pendingDemotion") == ["broker-a-2"]
        time.sleep(0.2)
    runner.restart("broker-a-1")
    runner.restart("broker-a-2")
    assert wait_in_sync(h, 3)["pendingDemotion"] == []


def test_a_former_master_scaled_away_is_no_longer_pending_demotion(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    h, (runner, _) = harness, fake_pods
    master_at_ordinal_2(h, runner)
    runner.kill("broker-a-0")  # so that broker-a-1 is the one promoted
    time.sleep(1.0)
    runner.kill("broker-a-2")
    wait_for(lambda: status(h).get("master") == "broker-a-1", 20, "broker-a-1 promoted")
    runner.restart("broker-a-0")
    wait_for(lambda: status(h).get("pendingDemotion") == ["broker-a-2"], 10, "broker-a-2 pending demotion")
    h.client.patch_group(NAME, {"spec": {"replicas": 2}})  # the user gives up on the dead pod
    wait_for(lambda: sts_replicas(h) == 2 and "broker-a-2" not in status(h).get("brokerIds", {}), 15, "scaled to 2")
    st = wait_in_sync(h, 2)
    assert st["pendingDemotion"] == [] and degraded(h).get("status") == "False" and st["phase"] == "Running"


def test_a_scale_down_while_the_master_is_lost_waits_for_the_failover(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    """Removing a slave that followed the lost master would block the SYNC election for good."""
    h, (runner, _) = harness, fake_pods
    h.client.apply_group(example(replicas=3, failover={"masterLostSeconds": 4}))
    wait_in_sync(h, 3)
    runner.kill("broker-a-0")
    time.sleep(1)
    h.client.patch_group(NAME, {"spec": {"replicas": 2}})
    wait_for(lambda: "deferred" in degraded(h).get("message", ""), 10, "scale-down deferred")
    assert sts_replicas(h) == 3
    st = wait_for(lambda: status(h).get("master") in ("broker-a-1", "broker-a-2") and status(h), 20, "promotion")
    assert st["epoch"] == 1
    # Then carried out (the master ordinal decides whether the scale-down is refused instead).
    if st["master"] == "broker-a-1":
        wait_for(lambda: sts_replicas(h) == 2, 15, "the deferred scale-down carried out")


def test_the_status_shows_the_port_a_broker_listens_on_while_a_port_change_rolls(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    h, (runner, fakes) = harness, fake_pods
    h.client.apply_group(example(replicas=3))
    wait_in_sync(h, 3)
    runner.kill("broker-a-1")  # two slaves down: the roll waits, the master keeps its old port meanwhile
    runner.kill("broker-a-2")
    time.sleep(1)
    h.client.patch_group(NAME, {"spec": {"ports": {"listen": 10931}}})
    wait_for(lambda: status(h).get("observedGeneration") == (h.client.group(NAME) or {})["metadata"]["generation"], 10,
             "the port change applied")
    time.sleep(2)
    listening = fakes.brokers["broker-a-0"].status()["brokerAddr"]
    assert listening.endswith(":10911")
    assert status(h).get("masterAddress") == listening


class _CrashLoop:
    """A container that exits at once (an image that cannot run)."""


class BadImageBackend(FakeBackend):
    """Fake brokers, except for pods whose image names "bad": their container never runs. The fakes
    start empty (offset 0), as a new group's brokers do."""

    def start(self, runner: PodRunner, pod: dict[str, Any], ip: str, files: dict[str, Path],
              env: dict[str, str], args: list[str]) -> Any:
        if "bad" in pod["spec"]["containers"][0].get("image", ""):
            return _CrashLoop()
        handle = super().start(runner, pod, ip, files, env, args)
        if isinstance(handle, FakeBroker):
            handle.max_offset = 0
        return handle

    def stop(self, handle: Any, kill: bool = False) -> None:
        if not isinstance(handle, _CrashLoop):
            super().stop(handle, kill)

    def alive(self, handle: Any) -> bool:
        return not isinstance(handle, _CrashLoop)


@pytest.fixture
def bad_image_pods(harness: OperatorHarness, tmp_path: Path) -> Iterator[tuple[PodRunner, BadImageBackend]]:
    with pods_on(harness, tmp_path, BadImageBackend()) as pods:
        yield pods


def pod_images(h: OperatorHarness) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["containers"][0]["image"] for p in h.client.items("v1", "pods")
            if "namesrv" not in p["metadata"]["name"]}


def test_reverting_a_bad_image_replaces_the_pod_it_broke(
        harness: OperatorHarness, bad_image_pods: tuple[PodRunner, BadImageBackend],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The roll stops at the first pod the bad image broke; the revert replaces that pod (an OnDelete
    StatefulSet never would) and touches no healthy one."""
    h, (runner, _) = harness, bad_image_pods
    # An outdated pod down this long is replaced ahead of the roll's order: 4 s here, not 15 s.
    monkeypatch.setattr(controller, "STUCK_SECONDS", 4.0)
    h.client.apply_group(example(replicas=3, image="rmq:good"))
    wait_in_sync(h, 3)
    runner.deleted.clear()
    h.client.patch_group(NAME, {"spec": {"image": "rmq:bad"}})
    wait_for(lambda: pod_images(h).get("broker-a-2") == "rmq:bad", 20, "broker-a-2 recreated with the bad image")
    time.sleep(3)
    assert runner.deleted == ["broker-a-2"]  # the roll stopped there
    h.client.patch_group(NAME, {"spec": {"image": "rmq:good"}})
    wait_for(lambda: pod_images(h).get("broker-a-2") == "rmq:good", 40, "broker-a-2 replaced")
    wait_in_sync(h, 3)
    assert runner.deleted == ["broker-a-2", "broker-a-2"]


def test_a_new_group_created_with_a_bad_image_starts_once_the_image_is_fixed(
        harness: OperatorHarness, bad_image_pods: tuple[PodRunner, BadImageBackend]) -> None:
    h, _ = harness, bad_image_pods
    h.client.apply_group(example(replicas=3, image="rmq:bad-typo"))
    wait_for(lambda: len(pod_images(h)) == 3, 20, "3 pods")
    time.sleep(2)
    h.client.patch_group(NAME, {"spec": {"image": "rmq:good"}})
    wait_for(lambda: set(pod_images(h).values()) == {"rmq:good"}, 30, "every pod on the fixed image")
    wait_in_sync(h, 3)
