"""A rolling restart of a SYNC group of real brokers under load: the master hands over before its
own restart (no failover); then a requested switchover; every send answered SEND_OK is consumed
afterwards."""

from __future__ import annotations

import itertools
import os
import signal
import time
from typing import Any

import pytest

from rmqbroker.remoting.codes import ResponseCode
from rmqoperator.builders import CONFIG_HASH_ANNOTATION
from tests.integration.helpers import pull_all
from tests.operator.emulator import GROUP, OperatorHarness, wait_for
from tests.operator.podrunner import PodRunner, ProcessBackend
from tests.operator.test_e2e_failover import (
    NAME,
    TOPIC,
    MasterLookup,
    Sender,
    converged,
    group_of_three,
    group_status,
    send,
)


class TimedSender(Sender):
    """A :class:`Sender` that also notes when each acknowledgement came."""

    def __init__(self, lookup: MasterLookup, prefix: str) -> None:
        super().__init__(self._send_addr, prefix)
        self.lookup = lookup
        self.ack_times: list[float] = []
        self._count = 0

    def _send_addr(self) -> str | None:
        # Called once per send, before it: an ack since the last call is timed now (to ~1 send).
        if len(self.acked) != self._count:
            self._count = len(self.acked)
            self.ack_times.append(time.monotonic())
        return self.lookup()


def longest_gap(times: list[float], start: float, end: float) -> float:
    points = sorted(t for t in times if start <= t <= end)
    edges = [start, *points, end]
    return max(b - a for a, b in itertools.pairwise(edges))


@pytest.mark.parametrize("replication", ["SYNC", "ASYNC"])
def test_rolling_restart_and_switchover_hand_the_master_over_without_losing_a_send(
        harness: OperatorHarness, real_pods: tuple[PodRunner, ProcessBackend], replication: str) -> None:
    """Under ASYNC the drain is what keeps acknowledged sends: they were answered before any
    slave had them."""
    h, (runner, _) = harness, real_pods
    # The roll leaves the old master relaying clients' sends this long before restarting it.
    h.stop_operator()
    h.handover_settle = 3.0
    h.start_operator()
    # masterLostSeconds far above a pod restart here: a failover would mean the hand-over failed.
    group_of_three(h, 60, replication=replication)
    lookup = MasterLookup(h)
    senders = [TimedSender(lookup, prefix=f"r{n}-") for n in range(3)]
    for s in senders:
        s.start()
    wait_for(lambda: sum(len(s.acked) for s in senders) >= 100, 30, "100 acknowledged sends")
    runner.deleted.clear()
    rolled_at = time.monotonic()
    h.client.patch_group(NAME, {"metadata": {"annotations": {f"{GROUP}/restart-at": "2026-11-28T08:00:00Z"}}})

    def rolled() -> bool:
        pods = [p for p in h.client.items("v1", "pods") if "namesrv" not in p["metadata"]["name"]]
        hashes = {p["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] for p in pods}
        master = group_status(h).get("master")
        return (len(runner.deleted) == 3 and len(hashes) == 1 and master in ("broker-a-1", "broker-a-2")
                and converged(h, master) is not None)

    wait_for(lambda: h.client.events("MasterHandedOver"), 60, "the master handed over", interval=0.05)
    handed_at = time.monotonic()
    wait_for(lambda: "broker-a-0" in runner.deleted, 60, "the old master restarted", interval=0.05)
    assert time.monotonic() - handed_at >= 2.5, "the old master was restarted before clients could re-read routes"
    wait_for(rolled, 120, "every broker restarted, the master handed over to a slave", interval=0.3)
    # The most advanced in-sync slave was chosen: either, by how far each got since its restart.
    new_master = group_status(h)["master"]
    other = ({"broker-a-1", "broker-a-2"} - {new_master}).pop()
    done_at = time.monotonic()
    acked_before = sum(len(s.acked) for s in senders)
    wait_for(lambda: sum(len(s.acked) for s in senders) >= acked_before + 50, 30, "sends to the new master")
    resumed_at = time.monotonic()

    roles = {"broker-a-0": "SLAVE", new_master: f"{replication}_MASTER", other: "SLAVE"}
    # The old master's restart may still be under way when the status first converged.
    def settled() -> dict[str, Any] | None:
        s = converged(h, new_master)
        return s if s is not None and {r["pod"]: r["role"] for r in s["replicas"]} == roles else None

    st = wait_for(settled, 60, "broker-a-0 back as a slave, 3 in sync")
    assert runner.deleted == ["broker-a-2", "broker-a-1", "broker-a-0"]
    assert st["epoch"] == 2 and st["brokerIds"]["broker-a-0"] == int(new_master[-1])
    handed = h.client.events("MasterHandedOver")
    assert len(handed) == 1 and handed[0]["message"].startswith(f"broker-a-0 handed the master over to {new_master}")
    gap = longest_gap([t for s in senders for t in s.ack_times], rolled_at, resumed_at)
    failed = sum(s.failed for s in senders)
    print(f"\nroll of 3 under 3 {replication} senders: {done_at - rolled_at:.1f}s, "
          f"longest time without an ack {gap:.2f}s, "
          f"{failed} failed sends (retried), {handed[0]['message']}")

    # A requested switchover, still under the senders: no restart at all. The third broker hangs
    # meanwhile (SIGSTOP): the drain waits for the broker taking over only, not for it.
    container = runner.container("broker-a-0")
    assert container is not None
    pid = container.handle.popen.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        asked_at = time.monotonic()
        h.client.patch_group(NAME, {"metadata": {"annotations": {f"{GROUP}/switchover-to": other}}})
        wait_for(lambda: (group_status(h).get("switchover") or {}).get("result") == "Completed", 40,
                 f"switchover to {other}")
    finally:
        os.kill(pid, signal.SIGCONT)
    st = wait_for(lambda: converged(h, other), 40, "the hung broker follows the new master")
    acked_before = sum(len(s.acked) for s in senders)
    wait_for(lambda: sum(len(s.acked) for s in senders) >= acked_before + 50, 30, f"sends to {other}")
    gap = longest_gap([t for s in senders for t in s.ack_times], asked_at, time.monotonic())
    for s in senders:
        s.stop.set()
    for s in senders:
        s.join(10)
    assert st["epoch"] == 3 and st["lastHandOver"]["trigger"] == "Switchover" and len(runner.deleted) == 3
    # The demotion's drain waits up to 8 s for the slaves it names: the hung one was not named.
    assert st["lastHandOver"]["sendsPausedSeconds"] < 4, st["lastHandOver"]
    print(f"switchover: longest time without an ack {gap:.2f}s, {st['lastHandOver']}")
    for reason in ("Promoted", "MasterLost", "HandOverFailed", "MetadataNotSynced"):
        assert not h.client.events(reason), f"unexpected {reason}: {h.client.events(reason)}"

    # Every acknowledged message can be consumed (stock C++ client, through the nameserver).
    acked = {k for s in senders for k in s.acked}
    assert send(st["masterAddress"], "after-roll") == ResponseCode.SUCCESS
    namesrv = f"{runner.ip_of('broker-a-namesrv-0')}:9876"
    consumed = {m["keys"] for m in pull_all(namesrv, TOPIC, group="CG_ROLL")}
    missing = acked - consumed
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged sends lost: {sorted(missing)[:10]}"
    assert "after-roll" in consumed
