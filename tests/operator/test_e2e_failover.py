"""End to end without a cluster: the real operator, the emulated API, real broker processes as pods.

A SYNC group of three brokers (each its own loopback address) takes sends; the master's process
is SIGKILLed; the operator promotes the in-sync slave, re-points the other and reports it in the
status; every send acknowledged before the kill is consumed afterwards with the stock client.
The old master then comes back with its stale (master) config and is demoted by the operator.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.integration.helpers import pull_all, rpc, send_raw
from tests.operator.conftest import example
from tests.operator.emulator import OperatorHarness, condition, wait_for
from tests.operator.podrunner import PodRunner, ProcessBackend

NAME = "broker-a"
TOPIC = "E2EFailover"
MASTER_LOST_SECONDS = 5


def send(addr: str, key: str, timeout: float = 5.0) -> int:
    resp = rpc(addr, RequestCode.SEND_MESSAGE, {
        "producerGroup": "PG_E2E", "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": str(hash(key) % 4), "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
        "properties": f"WAIT\x01true\x02KEYS\x01{key}\x02"}, f"body-{key}".encode(), timeout=timeout)
    return int(resp.code)


class Sender(threading.Thread):
    """Sends one message after another to one broker (or to whichever ``addr()`` names at each
    send); records which were acknowledged."""

    def __init__(self, addr: str | Callable[[], str | None], prefix: str = "m") -> None:
        super().__init__(name="sender", daemon=True)
        self.addr = addr
        self.prefix = prefix
        self.acked: list[str] = []
        self.failed = 0
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set() and i < 100_000:
            key = f"{self.prefix}{i}"
            i += 1
            try:
                # A lookup that fails (the API busy on a loaded machine) is one more failed send.
                addr = self.addr if isinstance(self.addr, str) else self.addr()
                if addr is None:
                    raise ConnectionError("no master address")
                if send(addr, key, timeout=2.0) == ResponseCode.SUCCESS:
                    self.acked.append(key)
                else:
                    self.failed += 1
            except Exception:
                self.failed += 1
                time.sleep(0.05)


def group_status(h: OperatorHarness) -> dict[str, Any]:
    return dict((h.client.group(NAME) or {}).get("status") or {})


class MasterLookup:
    """The status's master address for senders, read from the API at most every ``ttl`` seconds
    (one GET per send from every sender would load the API server more than the brokers)."""

    def __init__(self, h: OperatorHarness, ttl: float = 0.2) -> None:
        self.h = h
        self.ttl = ttl
        self._lock = threading.Lock()
        self._at = 0.0
        self._addr: str | None = None

    def __call__(self) -> str | None:
        with self._lock:
            if time.monotonic() - self._at >= self.ttl:
                self._addr = group_status(self.h).get("masterAddress")
                self._at = time.monotonic()
            return self._addr


def converged(h: OperatorHarness, master: str) -> dict[str, Any] | None:
    g = h.client.group(NAME)
    st = (g or {}).get("status") or {}
    ok = (st.get("master") == master and st.get("inSyncReplicas") == 3 and st.get("readyReplicas") == 3
          and condition(g, "Ready").get("status") == "True" and condition(g, "FailingOver").get("status") == "False")
    return st if ok else None


def group_of_three(h: OperatorHarness, master_lost_seconds: int, replication: str = "SYNC",
                   discovery: str = "Direct") -> None:
    """A group of three real brokers (SYNC unless said) with small files, Ready with every slave in sync."""
    failover = {"masterLostSeconds": master_lost_seconds}
    h.client.apply_group(example(replicas=3, replication=replication, failover=failover, masterDiscovery=discovery,
                                 brokerConfig={"mappedFileSizeCommitLog": str(16 << 20),
                                               "mappedFileSizeConsumeQueue": "60000",
                                               "autoCreateTopicEnable": "true", "defaultTopicQueueNums": "4"}))
    # The master begins epoch 1 once it serves (the operator's first term), before Ready.
    wait_for(lambda: converged(h, "broker-a-0") and group_status(h).get("epoch") == 1, 60,
             "group Ready at epoch 1 with 3 in sync")


def senders_following_the_master(h: OperatorHarness, prefix: str, n: int, acked: int = 200) -> list[Sender]:
    """``n`` senders to whichever broker the status names master, once ``acked`` sends were acknowledged."""
    lookup = MasterLookup(h)
    senders = [Sender(lookup, prefix=f"{prefix}{i}-") for i in range(n)]
    for s in senders:
        s.start()
    wait_for(lambda: sum(len(s.acked) for s in senders) >= acked, 30, f"{acked} acknowledged sends")
    return senders


def stop_and_check_every_acked_send(runner: PodRunner, senders: list[Sender], group: str) -> None:
    """Stop the senders; every send they had acknowledged is read back with the stock client."""
    for s in senders:
        s.stop.set()
    for s in senders:
        s.join(10)
    acked = {k for s in senders for k in s.acked}
    namesrv = f"{runner.ip_of('broker-a-namesrv-0')}:9876"
    consumed = {m["keys"] for m in pull_all(namesrv, TOPIC, group=group)}
    missing = acked - consumed
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged sends lost: {sorted(missing)[:10]}"


def test_master_killed_slave_promoted_no_acknowledged_message_lost(
        harness: OperatorHarness, real_pods: tuple[PodRunner, ProcessBackend]) -> None:
    h, (runner, _) = harness, real_pods
    group_of_three(h, MASTER_LOST_SECONDS)
    old_master_addr = group_status(h)["masterAddress"]

    sender = Sender(old_master_addr)
    sender.start()
    wait_for(lambda: len(sender.acked) >= 100, 30, "100 acknowledged sends")
    runner.kill("broker-a-0")  # SIGKILL mid-stream
    t_kill = time.monotonic()
    sender.stop.set()
    sender.join(10)
    acked = set(sender.acked)

    def writable() -> str | None:
        s = group_status(h)
        addr = s.get("masterAddress")
        if s.get("master") in (None, "broker-a-0") or not addr:
            return None
        try:
            return addr if send(addr, "after-failover", timeout=2.0) == ResponseCode.SUCCESS else None
        except Exception:
            return None

    new_addr = wait_for(writable, 40, "a writable new master", interval=0.1)
    kill_to_writable = time.monotonic() - t_kill
    st = group_status(h)
    new_master = st["master"]
    print(f"\nfailover: masterLostSeconds={MASTER_LOST_SECONDS}, kill -> writable {kill_to_writable:.2f}s, "
          f"operator detection -> promotion {st['lastFailover']['detectionToPromotionSeconds']:.2f}s, "
          f"{len(acked)} sends acknowledged before the kill")
    assert kill_to_writable <= 15.0
    assert new_master in ("broker-a-1", "broker-a-2") and new_addr != old_master_addr
    assert st["epoch"] == 2 and st["brokerIds"][new_master] == 0 and st["brokerIds"]["broker-a-0"] > 0
    assert st["lastFailover"]["from"] == "broker-a-0" and st["lastFailover"]["to"] == new_master
    other = ({"broker-a-1", "broker-a-2"} - {new_master}).pop()

    # The other slave follows the new master; the status and conditions say so.
    def other_follows() -> dict[str, Any] | None:
        s = group_status(h)
        rows = {r["pod"]: r for r in s.get("replicas", [])}
        return s if rows.get(other, {}).get("inSync") and rows[new_master]["role"] == "SYNC_MASTER" else None

    st = wait_for(other_follows, 20, f"{other} in sync with {new_master}")
    g = h.client.group(NAME)
    assert condition(g, "FailingOver")["status"] == "False"
    assert condition(g, "Ready")["status"] == "True"
    assert condition(g, "Degraded")["status"] == "True" and "broker-a-0" in condition(g, "Degraded")["message"]
    assert st["pendingDemotion"] == ["broker-a-0"]
    reasons = [e["reason"] for e in h.client.events()]
    assert "Promoted" in reasons and "Repointed" in reasons

    # The old master returns with the config it had (still SYNC_MASTER, epoch 1): demoted and re-pointed.
    runner.restart("broker-a-0", stale_config=True)
    st = wait_for(lambda: converged(h, new_master), 40, "old master demoted, 3 in sync")
    rows = {r["pod"]: r for r in st["replicas"]}
    assert rows["broker-a-0"]["role"] == "SLAVE" and rows["broker-a-0"]["epoch"] == 2
    assert st["pendingDemotion"] == []
    demotions = [e["message"] for e in h.client.events("RoleChanged") if e["message"].startswith("broker-a-0 -> SLAVE")]
    assert demotions, "the returning master was not demoted through POST /role"

    # Every acknowledged message can be consumed (stock C++ client, through the nameserver).
    namesrv = f"{runner.ip_of('broker-a-namesrv-0')}:9876"
    consumed = {m["keys"] for m in pull_all(namesrv, TOPIC, group="CG_E2E")}
    missing = acked - consumed
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages lost: {sorted(missing)[:10]}"
    assert "after-failover" in consumed


def test_hung_master_resumes_after_failover_without_losing_an_acknowledged_send(
        harness: OperatorHarness, real_pods: tuple[PodRunner, ProcessBackend]) -> None:
    """A master that hangs (SIGSTOP) rather than dies, under senders that follow the status's
    master: after the promotion it resumes and reads the sends still queued for it. Every slave was
    fenced before the choice, so none of them can acknowledge those: no send answered SEND_OK is
    missing afterwards, and the old master is demoted and follows."""
    h, (runner, _) = harness, real_pods
    group_of_three(h, 2)
    senders = senders_following_the_master(h, "s", 4)
    container = runner.container("broker-a-0")
    assert container is not None
    pid = container.handle.popen.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: group_status(h).get("master") not in (None, "broker-a-0"), 40, "a slave promoted")
    finally:
        os.kill(pid, signal.SIGCONT)
    new_master = group_status(h)["master"]
    wait_for(lambda: sum(len(s.acked) for s in senders) >= 400, 30, "sends acknowledged by the new master")
    for s in senders:
        s.stop.set()
    st = wait_for(lambda: converged(h, new_master), 40, "old master demoted, 3 in sync")
    assert {r["pod"]: r["role"] for r in st["replicas"]}["broker-a-0"] == "SLAVE"
    assert h.client.events("Promoted"), "no promotion event"
    stop_and_check_every_acked_send(runner, senders, "CG_HANG")


def test_a_group_of_one_whose_volume_was_replaced_goes_on_with_an_empty_log(
        harness: OperatorHarness, real_pods: tuple[PodRunner, ProcessBackend]) -> None:
    """The only broker back on an emptied volume is at epoch 0, below the group's epoch, and
    refuses writes; with no other broker to hold the log or take over, the operator has it begin a
    new epoch on its empty log (event StoreLost) and the group takes sends again."""
    h, (runner, _) = harness, real_pods
    h.client.apply_group(example(replicas=1, replication="ASYNC", failover={"masterLostSeconds": 60},
                                 brokerConfig={"mappedFileSizeCommitLog": str(16 << 20),
                                               "autoCreateTopicEnable": "true"}))

    def ready(epoch: int) -> dict[str, Any] | None:
        g = h.client.group(NAME)
        st = (g or {}).get("status") or {}
        ok = st.get("epoch") == epoch and condition(g, "Ready").get("status") == "True" and st.get("masterAddress")
        return st if ok else None

    st = wait_for(lambda: ready(1), 60, "group of one Ready at epoch 1")
    assert send_raw(st["masterAddress"], TOPIC, b"before").code == ResponseCode.SUCCESS
    runner.kill("broker-a-0")
    runner.wipe("broker-a-0")
    runner.restart("broker-a-0")
    st = wait_for(lambda: ready(2), 30, "a new epoch on the empty log")
    lost = [e["message"] for e in h.client.events("StoreLost")]
    assert len(lost) == 1 and "the group's only broker" in lost[0], lost
    resp = wait_for(lambda: (r := send_raw(st["masterAddress"], TOPIC, b"after")).code == ResponseCode.SUCCESS and r,
                    10, "a send acknowledged")
    assert resp.code == ResponseCode.SUCCESS
    assert not h.client.events("Promoted")


def test_a_master_back_on_an_empty_volume_is_replaced_at_once(
        harness: OperatorHarness, real_pods: tuple[PodRunner, ProcessBackend]) -> None:
    """The master's volume is replaced while its container is down (a node lost with its local
    disk), and it is back within masterLostSeconds: a SYNC_MASTER at epoch 0 with an empty log and
    a new log identity, below the group's epoch 1 (``haGroupEpoch``), so it takes no writes. The
    operator promotes the most advanced slave at once, without waiting masterLostSeconds (60 s
    here), and demotes the empty broker, which then copies the group's log. No acknowledged send
    is lost."""
    h, (runner, _) = harness, real_pods
    group_of_three(h, 60)
    senders = senders_following_the_master(h, "w", 2)
    runner.kill("broker-a-0")
    runner.wipe("broker-a-0")
    runner.restart("broker-a-0")
    t_back = time.monotonic()
    try:
        wait_for(lambda: group_status(h).get("master") not in (None, "broker-a-0"), 30, "a slave promoted")
    except TimeoutError:
        print("status:", json.dumps(group_status(h).get("conditions")))
        raise
    replaced_after = time.monotonic() - t_back
    new_master = group_status(h)["master"]
    before = sum(len(s.acked) for s in senders)
    wait_for(lambda: sum(len(s.acked) for s in senders) >= before + 100, 30, "sends acknowledged by the new master")
    for s in senders:
        s.stop.set()
    st = wait_for(lambda: converged(h, new_master), 60, "the emptied broker following, 3 in sync")
    print(f"\nmaster back on an empty volume: replaced {replaced_after:.1f}s after its restart")
    assert replaced_after < 20  # masterLostSeconds is 60
    assert {r["pod"]: r["role"] for r in st["replicas"]}["broker-a-0"] == "SLAVE"
    promoted = [e["message"] for e in h.client.events("Promoted")]
    assert len(promoted) == 1 and new_master in promoted[0], promoted
    stop_and_check_every_acked_send(runner, senders, "CG_WIPED")
