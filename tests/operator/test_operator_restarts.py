"""Restarts the operator must ride out (real kopf, emulated API, fake broker pods): its own while its
recorded state is behind the brokers (the master died before, a promotion's status write was lost),
and a broker's that takes longer than the re-point grace to answer (store recovery)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rmqbroker.properties import parse_properties
from rmqoperator import failover, k8s
from tests.operator.conftest import example, pods_on
from tests.operator.emulator import OperatorHarness, condition, wait_for
from tests.operator.podrunner import FakeBackend, PodRunner

NAME = "broker-a"
MASTERS = ("SYNC_MASTER", "ASYNC_MASTER")


def status(h: OperatorHarness) -> dict[str, Any]:
    return dict((h.client.group(NAME) or {}).get("status") or {})


def roles_in_config(h: OperatorHarness) -> dict[str, str]:
    cm = h.client.get("v1", "configmaps", "broker-a-config") or {}
    return {k: parse_properties(v)["brokerRole"] for k, v in (cm.get("data") or {}).items()}


def wait_in_sync(h: OperatorHarness, n: int) -> None:
    wait_for(lambda: status(h).get("inSyncReplicas") == n
             and condition(h.client.group(NAME), "Ready").get("status") == "True", 25, f"{n} in sync")


def test_an_operator_restarted_while_the_master_is_down_still_fails_over(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    """The first operator wrote Ready=False when the master died; the restarted one must not take
    the group for a new one whose master is still starting (it never promoted before)."""
    h, (runner, _) = harness, fake_pods
    h.client.apply_group(example(replicas=3, failover={"masterLostSeconds": 3}))
    wait_in_sync(h, 3)
    assert status(h).get("established") is True
    runner.kill("broker-a-0")
    wait_for(lambda: condition(h.client.group(NAME), "Ready").get("status") == "False", 10, "Ready=False")
    h.stop_operator()
    h.start_operator()
    st = wait_for(lambda: status(h).get("master") not in (None, "broker-a-0") and status(h), 30,
                  "a promotion by the restarted operator")
    assert st["epoch"] == 1 and len(h.client.events("Promoted")) == 1


def test_a_hung_master_is_replaced_once_master_lost_seconds_have_passed(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    """A master whose status call hangs (a partitioned node: the call takes its whole 2 s timeout)
    is promoted away from when masterLostSeconds have passed since the first round that could not
    reach it, not a status round later (4.4 s for 2 s here before)."""
    h, (_, fakes) = harness, fake_pods
    h.client.apply_group(example(replicas=3, failover={"masterLostSeconds": 2}))
    wait_in_sync(h, 3)
    fakes.brokers["broker-a-0"].status_hangs = True
    try:
        wait_for(lambda: h.client.events("Promoted"), 30, "a promotion")
    finally:
        fakes.brokers["broker-a-0"].status_hangs = False
    message = h.client.events("Promoted")[0]["message"]
    took = float(re.search(r"unavailable for ([0-9.]+)s", message).group(1))  # type: ignore[union-attr]
    # A round later: at least masterLostSeconds + the 2 s timeout + the 0.3 s poll interval.
    assert 2.0 <= took < 4.0, message


def test_a_master_back_before_the_promotion_stays_master(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    """The master's container is restarted by the kubelet while a failover fences the slaves: the
    operator asks the master again before promoting, finds it serving and keeps it (event
    MasterReturned); the fenced slaves follow it again. Promoting then cut what the returned
    master had taken since (bench/operator_chaos.py: 1,430 acknowledged ASYNC sends)."""
    h, (runner, fakes) = harness, fake_pods
    h.client.apply_group(example(replicas=3, replication="ASYNC", failover={"masterLostSeconds": 1}))
    wait_in_sync(h, 3)
    slaves = ("broker-a-1", "broker-a-2")
    for pod in slaves:
        fakes.brokers[pod].fence_seconds = 2.0
    runner.kill("broker-a-0")
    wait_for(lambda: any(call == "fence" for pod in slaves for call, _ in list(fakes.brokers[pod].calls)),
             20, "a failover fencing the slaves")
    runner.restart("broker-a-0")
    wait_for(lambda: h.client.events("MasterReturned"), 20, "the failover dropped")
    st = wait_for(lambda: (s := status(h)).get("inSyncReplicas") == 3 and s, 20, "the slaves following it again")
    assert st["master"] == "broker-a-0" and st["epoch"] == 0
    assert not h.client.events("Promoted")
    assert all(fakes.brokers[pod].role == "SLAVE" and fakes.brokers[pod].fence == 0 for pod in slaves)


def test_a_stopping_operator_finishes_the_round_under_way(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend], caplog: pytest.LogCaptureFixture) -> None:
    """An operator stopped (its pod replaced: SIGTERM) while a failover's promotion is in flight
    lets that round finish: when it has exited, the promotion is in the status and its event is
    posted, and nothing was logged as failed. Before, kopf cancelled the round mid-call at once,
    and the poller's next call met the clients the shutdown had closed."""
    h, (runner, fakes) = harness, fake_pods
    h.client.apply_group(example(replicas=3, failover={"masterLostSeconds": 1}))
    wait_in_sync(h, 3)
    slaves = ("broker-a-1", "broker-a-2")
    for pod in slaves:
        fakes.brokers[pod].promotion_seconds = 3.0
    runner.kill("broker-a-0")
    wait_for(lambda: any(call == "role" and body["role"] != "SLAVE"
                         for pod in slaves for call, body in list(fakes.brokers[pod].calls)),
             20, "a promotion under way")
    caplog.set_level(logging.WARNING)
    h.stop_operator()
    st = status(h)
    assert st.get("master") in slaves and st.get("epoch") == 1, st
    assert len(h.client.events("Promoted")) == 1
    noise = [f"{r.name}: {r.getMessage()}" for r in caplog.records
             if r.levelno >= logging.ERROR or "cancelled" in r.getMessage()]
    assert not noise, noise


def test_a_promotion_whose_status_was_lost_is_adopted_after_a_restart(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend], monkeypatch: pytest.MonkeyPatch) -> None:
    """The promotion reached the broker, the status write did not, and the operator restarted: the
    new operator follows the broker's newer epoch instead of restoring the old master from the
    recorded state (which made the old master a second master when it came back)."""
    h, (runner, fakes) = harness, fake_pods
    h.client.apply_group(example(replicas=3, failover={"masterLostSeconds": 1}))
    wait_in_sync(h, 3)
    failing = True
    real_patch = k8s.KubeApi.patch_group_status

    async def flaky(self: k8s.KubeApi, namespace: str, name: str, st: dict[str, Any]) -> Any:
        if failing:
            raise k8s.ApiError(503, "ServiceUnavailable", "etcd leader change")
        return await real_patch(self, namespace, name, st)

    monkeypatch.setattr(k8s.KubeApi, "patch_group_status", flaky)
    runner.kill("broker-a-0")
    wait_for(lambda: fakes.brokers["broker-a-1"].role in MASTERS, 20, "broker-a-1 promoted at the broker")
    assert status(h).get("master") == "broker-a-0" and status(h).get("epoch") == 0  # never written
    h.stop_operator()
    failing = False
    h.start_operator()
    st = wait_for(lambda: status(h).get("master") == "broker-a-1" and status(h), 15, "the promotion adopted")
    assert st["epoch"] == 1 and st["pendingDemotion"] == ["broker-a-0"]
    assert h.client.events("MasterAdopted")
    config = wait_for(lambda: (c := roles_in_config(h))["broker-1.conf"] in MASTERS and c, 10, "ConfigMap")
    assert config["broker-0.conf"] == "SLAVE"
    runner.restart("broker-a-0")  # the old master comes back from the ConfigMap
    wait_in_sync(h, 3)
    time.sleep(2)
    masters = [n for n, b in fakes.brokers.items() if "namesrv" not in n and b.role in MASTERS]
    assert masters == ["broker-a-1"]
    assert status(h)["pendingDemotion"] == []


# The grace after which an unreachable slave not following the master is deleted, shortened here
# from failover.REPOINT_GRACE_SECONDS (15 s); a restarted broker answers on its admin port only
# SLOW_SECONDS after its container starts (as while it recovers a large store), well past that grace.
GRACE_SECONDS = 3.0
SLOW_SECONDS = GRACE_SECONDS + 5


class _Starting:
    def __init__(self) -> None:
        self.real: Any = None
        self.cancelled = False


class SlowStartBackend(FakeBackend):
    """Fake brokers; those named in ``slow`` start serving SLOW_SECONDS after their container starts."""

    def __init__(self) -> None:
        super().__init__()
        self.slow: set[str] = set()

    def start(self, runner: PodRunner, pod: dict[str, Any], ip: str, files: dict[str, Path],
              env: dict[str, str], args: list[str]) -> Any:
        if pod["metadata"]["name"] not in self.slow:
            return super().start(runner, pod, ip, files, env, args)
        handle = _Starting()

        def serve_later() -> None:
            time.sleep(SLOW_SECONDS)
            if not handle.cancelled:
                handle.real = FakeBackend.start(self, runner, pod, ip, files, env, args)

        threading.Thread(target=serve_later, daemon=True).start()
        return handle

    def stop(self, handle: Any, kill: bool = False) -> None:
        if isinstance(handle, _Starting):
            handle.cancelled = True
            if handle.real is not None:
                super().stop(handle.real, kill)
            return
        super().stop(handle, kill)


@pytest.fixture
def slow_pods(harness: OperatorHarness, tmp_path: Path) -> Iterator[tuple[PodRunner, SlowStartBackend]]:
    with pods_on(harness, tmp_path, SlowStartBackend()) as pods:
        yield pods


def test_an_old_master_recovering_its_store_is_not_deleted_while_it_starts(
        harness: OperatorHarness, slow_pods: tuple[PodRunner, SlowStartBackend],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Unreachable and not following the new master for longer than the grace, but its container has
    not passed its startup probe yet: left to start (it was deleted every 15 s, for ever)."""
    h, (runner, backend) = harness, slow_pods
    monkeypatch.setattr(failover, "REPOINT_GRACE_SECONDS", GRACE_SECONDS)
    h.client.apply_group(example(replicas=3, failover={"masterLostSeconds": 1}))
    wait_in_sync(h, 3)
    runner.kill("broker-a-0")
    wait_for(lambda: status(h).get("master") not in (None, "broker-a-0"), 20, "promotion")
    backend.slow.add("broker-a-0")
    runner.restart("broker-a-0")
    wait_for(lambda: status(h).get("inSyncReplicas") == 3 and status(h).get("pendingDemotion") == [],
             SLOW_SECONDS + 20, "the old master started, demoted and in sync")
    assert not h.client.events("PodDeleted")


def test_the_broker_that_began_the_epoch_is_master_again_in_a_group_created_again(
        harness: OperatorHarness, fake_pods: tuple[PodRunner, FakeBackend]) -> None:
    """The group was deleted after broker-a-1 had been promoted at epoch 1, and created again on its
    volumes: the fresh ConfigMap made broker-a-0 master, serving in epoch 1 that broker-a-1 began
    (and broker-a-1, a slave by that ConfigMap, refuses to follow a master of its own term). The
    operator makes broker-a-1, which holds the term's log, master again and broker-a-0 follows it."""
    h, (_, fakes) = harness, fake_pods
    h.client.apply_group(example(replicas=3, failover={"masterLostSeconds": 30}))
    wait_in_sync(h, 3)
    owner = fakes.brokers["broker-a-1"]
    owner.epoch, owner.own_epoch = 1, 1
    fakes.brokers["broker-a-0"].epoch = 1
    st = wait_for(lambda: status(h).get("master") == "broker-a-1" and status(h), 15, "broker-a-1 master again")
    assert st["epoch"] == 1
    assert owner.role in MASTERS and ("role", {"role": owner.role, "brokerId": 0, "epoch": 1}) in owner.calls
    assert h.client.events("MasterRestored")
    wait_for(lambda: fakes.brokers["broker-a-0"].role == "SLAVE", 10, "broker-a-0 demoted")
    wait_in_sync(h, 3)
    assert roles_in_config(h)["broker-1.conf"] in MASTERS
