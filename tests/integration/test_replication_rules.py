"""Replication rules with real broker processes (reference §7.5, §7.6): a SYNC_MASTER stops waiting
for a slave that fell too far behind, a slave refuses sends, and a failed metadata-sync round is
retried without taking the slave down."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import create_topic, poll, rpc, send_raw, wait_caught_up
from tests.support.procs import BrokerProc, free_port

SEG = 2 * 1024 * 1024


def pair(cluster: Cluster, role: str = "ASYNC_MASTER", **conf: Any) -> tuple[BrokerProc, BrokerProc]:
    """A master and one slave pinned to it, without a nameserver."""
    conf.setdefault("maxMessageSize", 1024 * 1024)  # below the small segment size
    master = cluster.broker(None, name="broker-q", role=role, mappedFileSizeCommitLog=SEG, **conf)
    slave = cluster.broker(None, name="broker-q", broker_id=1, role="SLAVE", mappedFileSizeCommitLog=SEG,
                           haMasterAddress=f"127.0.0.1:{master.port + 1}", **conf)
    return master, slave


def all_threads_stopped(proc: BrokerProc) -> bool:
    """Whether every thread of a SIGSTOPped process has actually stopped (state T)."""
    assert proc.popen is not None
    tasks = Path(f"/proc/{proc.popen.pid}/task")
    return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for t in tasks.iterdir())


def timed_send(broker: str, topic: str, body: bytes) -> tuple[int, float, dict[str, str]]:
    started = time.monotonic()
    resp = send_raw(broker, topic, body)
    return resp.code, time.monotonic() - started, resp.ext_fields


def topic_names(broker: str) -> set[str]:
    resp = rpc(broker, RequestCode.GET_ALL_TOPIC_CONFIG)
    assert resp.code == ResponseCode.SUCCESS, resp
    return set(json.loads(bytes(resp.body))["topicConfigTable"])


def test_sync_master_gives_up_on_a_slave_beyond_fallbehind_max(cluster: Cluster) -> None:
    """While the slave's ack is within haSlaveFallbehindMax of the append, a send waits for it and
    times out (FLUSH_SLAVE_TIMEOUT after syncFlushTimeout); once the master is further ahead, it is
    answered SLAVE_NOT_AVAILABLE at once. A slave that catches up makes sends succeed again."""
    timeout_ms, fallbehind = 2000, 2900
    master, slave = pair(cluster, role="SYNC_MASTER", syncFlushTimeout=timeout_ms,
                         haSlaveFallbehindMax=fallbehind)
    create_topic(master.addr, "RuleSync")
    body = b"x" * 1000  # records of ~1.1 KB: two fit within haSlaveFallbehindMax, three do not
    poll(lambda: send_raw(master.addr, "RuleSync", body).code == ResponseCode.SUCCESS, 20,
         what="SYNC send acknowledged by the slave")
    acked = master.status()["maxPhyOffset"]
    assert send_raw(master.addr, "RuleSync", body).code == ResponseCode.SUCCESS
    record = master.status()["maxPhyOffset"] - acked
    # Sends whose end stays within haSlaveFallbehindMax of the slave's last ack wait for it.
    waiting = -(-fallbehind // record) - 1
    assert waiting >= 1, record
    slave.signal(signal.SIGSTOP)
    try:
        poll(lambda: all_threads_stopped(slave), 5, interval=0.005, what="slave stopped")
        answers = []
        for _ in range(waiting + 2):
            code, took, ext = timed_send(master.addr, "RuleSync", body)
            answers.append((code, took))
            if code != ResponseCode.FLUSH_SLAVE_TIMEOUT:
                break
        codes = [code for code, _ in answers]
        assert codes == [ResponseCode.FLUSH_SLAVE_TIMEOUT] * waiting + [ResponseCode.SLAVE_NOT_AVAILABLE], answers
        assert all(took >= timeout_ms / 1000 - 0.1 for _, took in answers[:-1]), answers
        assert answers[-1][1] < 0.5, f"SLAVE_NOT_AVAILABLE took {answers[-1][1]:.2f}s, not at once"
        assert ext.get("msgId")  # stored on the master all the same (§7.5)
        # Still connected (not dropped by housekeeping): it is the lag that makes it unavailable.
        slaves = master.status()["ha"]["slaves"]
        assert len(slaves) == 1 and slaves[0]["inSync"] is False, slaves
        code, took, _ = timed_send(master.addr, "RuleSync", body)
        assert (code, took < 0.5) == (ResponseCode.SLAVE_NOT_AVAILABLE, True), (code, took)
    finally:
        slave.signal(signal.SIGCONT)
    wait_caught_up(master, [slave], timeout=15)
    poll(lambda: send_raw(master.addr, "RuleSync", body).code == ResponseCode.SUCCESS, 10,
         what="SYNC send acknowledged after the slave caught up")
    assert master.status()["ha"]["slaves"][0]["inSync"] is True


def test_slave_rejects_sends_and_keeps_its_store(cluster: Cluster) -> None:
    """With relaySendsToMaster off, a send to a SLAVE is refused with SERVICE_NOT_AVAILABLE (14) and
    a remark, as RocketMQ does; nothing is written to its log and no topic is auto-created there.
    With it on, a slave that knows no master broker address (no nameserver here) refuses the same way."""
    master, slave = pair(cluster, relaySendsToMaster="false")
    create_topic(master.addr, "RuleSlave")
    for i in range(5):
        assert send_raw(master.addr, "RuleSlave", f"m{i}".encode()).code == ResponseCode.SUCCESS
    end = wait_caught_up(master, [slave], timeout=15)
    before = slave.status()
    for topic in ("RuleSlave", "RuleSlaveNew"):
        resp = send_raw(slave.addr, topic, b"to the slave")
        assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, (resp.code, resp.remark)
        assert resp.remark and "SLAVE" in resp.remark
        assert not resp.ext_fields.get("msgId")
    # V2 headers (what the stock producers send) take the same path.
    resp = rpc(slave.addr, RequestCode.SEND_MESSAGE_V2, {
        "a": "PG_RAW", "b": "RuleSlave", "c": "TBW102", "d": "4", "e": "0", "f": "0",
        "g": str(int(time.time() * 1000)), "h": "0", "i": "WAIT\x01true\x02"}, b"v2 to the slave")
    assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, (resp.code, resp.remark)
    after = slave.status()
    assert after["maxPhyOffset"] == before["maxPhyOffset"] == end
    assert after["role"] == "SLAVE"
    assert "RuleSlaveNew" not in topic_names(slave.addr)
    assert rpc(slave.addr, RequestCode.GET_MAX_OFFSET, {"topic": "RuleSlave", "queueId": "0"}).ext_fields[
        "offset"] == "5"
    assert master.status()["maxPhyOffset"] == end  # nor forwarded to the master


def test_failed_metadata_sync_rounds_are_retried_not_fatal(cluster: Cluster) -> None:
    """Pointed at a dead metadata master, every round fails and is counted with its error, the next
    one is tried an interval later, and the slave goes on replicating and serving; pointed back
    at the live master, rounds succeed again and the metadata arrives."""
    master, slave = pair(cluster, slaveSyncInitialDelay=200, slaveSyncInterval=500)
    ha = f"127.0.0.1:{master.port + 1}"
    dead = f"127.0.0.1:{free_port()}"
    code, body = slave.admin("/ha/master", "POST", json.dumps({"haAddress": ha, "brokerAddress": dead}).encode())
    assert code == 200, body
    st = poll(lambda: (s := slave.status()["metadataSync"])["failures"] >= 1 and s, 10, what="a failed round")
    assert st["masterAddress"] == dead and st["lastError"] and dead in st["lastError"], st
    assert st["rounds"] == 0
    # The failure is retried: more failures follow, one per interval, while the slave serves.
    create_topic(master.addr, "RuleMeta")
    for i in range(3):
        assert send_raw(master.addr, "RuleMeta", f"m{i}".encode()).code == ResponseCode.SUCCESS
    poll(lambda: slave.status()["metadataSync"]["failures"] >= st["failures"] + 2, 10, what="retried rounds")
    assert slave.alive
    wait_caught_up(master, [slave], timeout=15)
    assert slave.status()["ha"]["connected"] is True
    assert rpc(slave.addr, RequestCode.GET_MAX_OFFSET, {"topic": "RuleMeta", "queueId": "0"}).code == 0
    assert "RuleMeta" not in topic_names(slave.addr)  # the topic config did not sync

    code, body = slave.admin("/ha/master", "POST", json.dumps(
        {"haAddress": ha, "brokerAddress": master.addr}).encode())
    assert code == 200, body
    poll(lambda: "RuleMeta" in topic_names(slave.addr), 10, what="topic config synced from the live master")
    st = poll(lambda: (s := slave.status()["metadataSync"])["rounds"] >= 2 and s, 10, what="rounds resumed")
    assert st["masterAddress"] == master.addr and st["lastError"] is None and st["lastSuccessMillis"] > 0


def test_metadata_sync_refuses_a_master_of_another_broker_group(cluster: Cluster) -> None:
    """A slave re-pointed (by mistake) at the master of another broker name or cluster must not
    adopt that broker's tables: its own topics, their consume queues and offsets stay, and each
    round fails naming the reason until it is pointed back at its own master."""
    master, slave = pair(cluster, slaveSyncInitialDelay=200, slaveSyncInterval=500)
    ha = f"127.0.0.1:{master.port + 1}"
    code, body = slave.admin("/ha/master", "POST", json.dumps({"haAddress": ha, "brokerAddress": master.addr}).encode())
    assert code == 200, body
    create_topic(master.addr, "RuleOwn", queues=1)
    for i in range(3):
        assert send_raw(master.addr, "RuleOwn", f"m{i}".encode()).code == ResponseCode.SUCCESS
    assert rpc(master.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "CG_OWN", "topic": "RuleOwn", "queueId": "0", "commitOffset": "2"}).code == 0
    wait_caught_up(master, [slave], timeout=15)
    poll(lambda: "RuleOwn" in topic_names(slave.addr), 10, what="topic synced to the slave")

    def served() -> tuple[str, str]:
        max_offset = rpc(slave.addr, RequestCode.GET_MAX_OFFSET, {"topic": "RuleOwn", "queueId": "0"})
        committed = rpc(slave.addr, RequestCode.QUERY_CONSUMER_OFFSET, {
            "consumerGroup": "CG_OWN", "topic": "RuleOwn", "queueId": "0"})
        return max_offset.ext_fields.get("offset", ""), committed.ext_fields.get("offset", "")

    poll(lambda: served() == ("3", "2"), 10, what="queue and offset on the slave")
    other_dir = cluster.workdir / "other-cluster"
    other_dir.mkdir()
    same_name = BrokerProc(other_dir, None, name="broker-q", brokerClusterName="OtherCluster",
                           maxMessageSize=1024 * 1024, mappedFileSizeCommitLog=SEG)
    cluster.procs.append(same_name)
    others = (cluster.broker(None, name="broker-other", maxMessageSize=1024 * 1024, mappedFileSizeCommitLog=SEG),
              same_name.start())
    for other in others:
        create_topic(other.addr, "ForeignTopic", queues=1)
        before = slave.status()["metadataSync"]
        done = before["rounds"] + before["failures"] + 2
        repoint = {"haAddress": ha, "brokerAddress": other.addr}
        code, body = slave.admin("/ha/master", "POST", json.dumps(repoint).encode())
        assert code == 200, body

        def rounds_done(target: int = done) -> dict[str, Any] | None:
            st: dict[str, Any] = slave.status()["metadataSync"]
            return st if st["rounds"] + st["failures"] >= target else None

        st = poll(rounds_done, 10, what="two rounds against the other master")
        assert served() == ("3", "2")
        assert "RuleOwn" in topic_names(slave.addr) and "ForeignTopic" not in topic_names(slave.addr)
        assert st["failures"] >= before["failures"] + 2 and "broker-q" in st["lastError"], st

    code, body = slave.admin("/ha/master", "POST", json.dumps({"haAddress": ha, "brokerAddress": master.addr}).encode())
    assert code == 200, body
    rounds = slave.status()["metadataSync"]["rounds"]
    st = poll(lambda: (s := slave.status()["metadataSync"])["rounds"] > rounds and s, 10, what="a round again")
    assert st["lastError"] is None
    assert served() == ("3", "2")
