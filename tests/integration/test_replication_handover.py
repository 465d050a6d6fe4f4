"""A planned hand-over between real brokers: a master's demotion that drains its slaves, and a
slave's promotion that takes one last metadata round from the master it replaces.

The periodic metadata sync is switched off (first round in 10 minutes), so only the promotion's
last round can bring the consumer offset and topic the master took; a SIGSTOPped slave holds the
demotion's drain open until it resumes.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import create_topic, poll, query_consumer_offset, rpc, send_raw, wait_caught_up
from tests.integration.test_replication import SEG, assert_commitlogs_identical
from tests.integration.test_replication_extra import follows, ha_addr
from tests.support.procs import BrokerProc

TOPIC = "HandOver"
NO_PERIODIC_SYNC: dict[str, Any] = {"slaveSyncInitialDelay": 600000, "slaveSyncInterval": 600000,
                                    "maxMessageSize": 1024 * 1024}


def role(broker: BrokerProc, **body: Any) -> tuple[int, dict[str, Any]]:
    code, raw = broker.admin("/role", "POST", json.dumps(body).encode())
    answer: dict[str, Any] = json.loads(raw)
    return code, answer


def pair(cluster: Cluster, **conf: Any) -> tuple[BrokerProc, BrokerProc]:
    """A SYNC_MASTER and its slave, registered with a nameserver (the slave learns the master's
    broker address, which metadata sync uses, from its registration's answer)."""
    ns = cluster.namesrv().addr
    master = cluster.broker(ns, name="broker-h", broker_id=0, role="SYNC_MASTER", mappedFileSizeCommitLog=SEG,
                            **NO_PERIODIC_SYNC, **conf)
    slave = cluster.broker(ns, name="broker-h", broker_id=1, role="SLAVE", mappedFileSizeCommitLog=SEG,
                           haMasterAddress=ha_addr(master), **NO_PERIODIC_SYNC, **conf)
    poll(lambda: follows(slave, master) and slave.status()["metadataSync"]["masterAddress"] == master.addr, 20,
         what="slave connected, master's broker address known")
    return master, slave


def queue_end(broker: BrokerProc) -> int:
    resp = rpc(broker.addr, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": "0"})
    return int(resp.ext_fields["offset"])


def parked_sends(master: BrokerProc, n: int) -> tuple[list[threading.Thread], list[int]]:
    """``n`` SYNC sends in flight; their answer codes land in the returned list."""
    codes: list[int] = []

    def one(i: int) -> None:
        try:
            codes.append(int(send_raw(master.addr, TOPIC, f"parked-{i}".encode() * 20, timeout=30).code))
        except Exception:
            codes.append(-1)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads, codes


def test_drained_demotion_and_synced_promotion_hand_over_every_message_and_offset(cluster: Cluster) -> None:
    master, slave = pair(cluster, syncFlushTimeout=20000)
    create_topic(master.addr, TOPIC)
    for i in range(20):
        assert send_raw(master.addr, TOPIC, f"before-{i}".encode() * 20).code == ResponseCode.SUCCESS
    # After the slave's last (initial) look at the master's metadata: only a last round brings these.
    create_topic(master.addr, "HandOverLate")
    assert rpc(master.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "CG_HANDOVER", "topic": TOPIC, "queueId": "0", "commitOffset": "7"}).code == 0
    wait_caught_up(master, [slave])

    # Sends the slave has not acknowledged (it is stopped) wait on the SYNC master...
    slave.signal(signal.SIGSTOP)
    threads, codes = parked_sends(master, 8)
    poll(lambda: queue_end(master) == 28, 10, what="8 sends appended")
    assert codes == [], "a send was answered without the slave"
    end = master.status()["maxPhyOffset"]
    # ...the demotion refuses new sends at once and waits for the slave to take them.
    answer: dict[str, Any] = {}

    def demote() -> None:
        answer.update(zip(("code", "body"), role(master, role="SLAVE", brokerId=1, epoch=0, drainMillis=15000),
                          strict=True))

    started = time.monotonic()
    demotion = threading.Thread(target=demote, daemon=True)
    demotion.start()
    poll(lambda: master.status()["role"] == "SLAVE", 10, what="master refuses sends")
    assert send_raw(master.addr, TOPIC, b"refused").code != ResponseCode.SUCCESS
    time.sleep(0.5)
    assert demotion.is_alive(), "the demotion did not wait for the stopped slave"
    slave.signal(signal.SIGCONT)
    demotion.join(20)
    for t in threads:
        t.join(20)
    assert answer["code"] == 200, answer
    body = answer["body"]
    assert body["drained"] is True and body["maxPhyOffset"] == end, body
    assert [s["ackedOffset"] for s in body["slaves"]] == [end]
    assert codes == [ResponseCode.SUCCESS] * 8, "sends acknowledged by the slave during the drain were not answered"
    assert slave.status()["maxPhyOffset"] == end
    assert time.monotonic() - started < 15

    # The slave becomes master with everything the old one had, metadata included.
    code, promoted = role(slave, role="SYNC_MASTER", brokerId=0, epoch=1, syncMetadata=True)
    assert code == 200 and promoted["metadataSynced"] is True and promoted["maxPhyOffset"] == end, promoted
    assert query_consumer_offset(slave.addr, "CG_HANDOVER", TOPIC, 0) == 7
    topics = json.loads(slave.admin("/metadata")[1])["topics"]["topicConfigTable"]
    assert "HandOverLate" in topics
    # The old master follows it without cutting a byte.
    code, raw = master.admin("/ha/master", "POST", json.dumps({"haAddress": ha_addr(slave), "epoch": 1}).encode())
    assert code == 200, raw
    poll(lambda: follows(master, slave) and any(s["inSync"] for s in slave.status()["ha"]["slaves"]), 20,
         what="old master follows the new one, which counts it")
    for i in range(10):
        assert send_raw(slave.addr, TOPIC, f"after-{i}".encode() * 20).code == ResponseCode.SUCCESS
    wait_caught_up(slave, [master])
    assert master.status()["ha"]["truncatedBytes"] == 0
    assert_commitlogs_identical(slave, [master])


def test_a_drain_that_times_out_says_so_and_fails_the_waiting_sends(cluster: Cluster) -> None:
    master, slave = pair(cluster, syncFlushTimeout=20000)
    create_topic(master.addr, TOPIC)
    assert send_raw(master.addr, TOPIC, b"first" * 20).code == ResponseCode.SUCCESS
    acked = wait_caught_up(master, [slave])
    slave.signal(signal.SIGSTOP)
    try:
        threads, codes = parked_sends(master, 3)
        # All three stored and waiting before the demotion begins (a sleep let a send slowed by
        # load arrive after it, refused instead of parked).
        poll(lambda: queue_end(master) == 4, 10, what="3 sends appended")
        started = time.monotonic()
        code, body = role(master, role="SLAVE", brokerId=1, epoch=0, drainMillis=800)
        took = time.monotonic() - started
        for t in threads:
            t.join(20)
    finally:
        slave.signal(signal.SIGCONT)
    assert code == 200 and body["drained"] is False, body
    assert 0.7 <= took < 10
    # Stored on the master, acknowledged by no slave: not replicated. The stopped slave is the
    # only one the master counted, at the offset it had before it stopped (a SUCCESS needs a
    # slave's ack; any other HA peer would show here).
    assert [s["ackedOffset"] for s in body["slaves"]] == [acked], (codes, body["slaves"])
    assert codes == [ResponseCode.FLUSH_SLAVE_TIMEOUT] * 3, (codes, body["slaves"])

    # Bad arguments are refused before anything changes.
    for bad in ({"drainMillis": -1}, {"drainMillis": "1000"}, {"drainMillis": 60001}, {"syncMetadata": "yes"},
                {"drainFor": ["127.0.0.1:1"]}, {"drainMillis": 10, "drainFor": "127.0.0.1:1"},
                {"drainMillis": 10, "drainFor": ["nowhere"]}, {"drainMillis": 10, "drainFor": ["h:1"] * 17}):
        code, body = role(slave, role="SYNC_MASTER", brokerId=0, epoch=1, **bad)
        assert code == 400 and "error" in body, (bad, body)
    assert slave.status()["role"] == "SLAVE"
    # A promotion read after its deadline (a process paused while the request waited) is refused.
    code, body = role(slave, role="SYNC_MASTER", brokerId=0, epoch=1, notAfterMillis=int(time.time() * 1000) - 1)
    assert code == 409 and "expired" in body["error"], body
    assert slave.status()["role"] == "SLAVE" and slave.status()["epoch"] == 0
    # ... also when the deadline passes during the promotion (its last metadata round hangs on a
    # stopped master): checked again just before the new epoch would begin.
    master.signal(signal.SIGSTOP)
    try:
        code, body = role(slave, role="SYNC_MASTER", brokerId=0, epoch=1, syncMetadata=True,
                          metadataSource=master.addr, notAfterMillis=int(time.time() * 1000) + 1000)
    finally:
        master.signal(signal.SIGCONT)
    assert code == 409 and "expired" in body["error"], body
    st = slave.status()
    assert st["role"] == "SLAVE" and st["epoch"] == 0 and st["ownEpoch"] is None


def test_a_promotion_takes_metadata_from_the_named_source_when_it_knows_no_master(cluster: Cluster) -> None:
    """Without a nameserver the slave never learned its master's broker address: a last metadata
    round needs the caller to name it (the operator does); without it the answer says so."""
    master = cluster.broker(None, name="broker-m", broker_id=0, role="ASYNC_MASTER", mappedFileSizeCommitLog=SEG,
                            **NO_PERIODIC_SYNC)
    slave = cluster.broker(None, name="broker-m", broker_id=1, role="SLAVE", mappedFileSizeCommitLog=SEG,
                           haMasterAddress=ha_addr(master), **NO_PERIODIC_SYNC)
    poll(lambda: follows(slave, master), 20, what="slave connected")
    create_topic(master.addr, TOPIC)
    assert rpc(master.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "CG_SOURCE", "topic": TOPIC, "queueId": "1", "commitOffset": "3"}).code == 0
    code, body = role(master, role="SLAVE", brokerId=1, epoch=0, drainMillis=5000)
    assert code == 200 and body["drained"] is True, body
    code, body = role(slave, role="ASYNC_MASTER", brokerId=0, epoch=1, syncMetadata=True)
    assert code == 200 and body["metadataSynced"] is False, body
    assert "no master broker address" in body["metadataSyncError"]
    # Back to a slave (its own epoch: a retry of its promotion is allowed), then promoted with the source.
    code, body = role(slave, role="SLAVE", brokerId=1, epoch=1)
    assert code == 200, body
    code, body = role(slave, role="ASYNC_MASTER", brokerId=0, epoch=2, syncMetadata=True, metadataSource=master.addr)
    assert code == 200 and body["metadataSynced"] is True, body
    assert query_consumer_offset(slave.addr, "CG_SOURCE", TOPIC, 1) == 3
    code, body = role(slave, role="SLAVE", brokerId=1, epoch=2, metadataSource="not-an-address")
    assert code == 400, body


def test_a_drain_for_the_successor_does_not_wait_for_a_stalled_other_slave(cluster: Cluster) -> None:
    """A hand-over names the slave taking over (its ``ha.localAddress``): another slave, stopped,
    neither holds the sends paused until the drain times out nor keeps the successor from taking
    every byte; it catches up from the new master later."""
    master, slave = pair(cluster, syncFlushTimeout=5000)
    other = cluster.broker(master.conf["namesrvAddr"], name="broker-h", broker_id=2, role="SLAVE",
                           mappedFileSizeCommitLog=SEG, haMasterAddress=ha_addr(master), **NO_PERIODIC_SYNC)
    poll(lambda: follows(other, master), 20, what="second slave connected")
    create_topic(master.addr, TOPIC)
    for i in range(5):
        assert send_raw(master.addr, TOPIC, f"before-{i}".encode() * 20).code == ResponseCode.SUCCESS
    wait_caught_up(master, [slave, other])
    other.signal(signal.SIGSTOP)
    try:
        for i in range(10):  # acknowledged by the running slave alone
            assert send_raw(master.addr, TOPIC, f"stalled-{i}".encode() * 20).code == ResponseCode.SUCCESS
        end = master.status()["maxPhyOffset"]
        successor = slave.status()["ha"]["localAddress"]
        listed = {s["address"] for s in master.status()["ha"]["slaves"]}
        assert successor in listed and len(listed) == 2, (successor, listed)
        started = time.monotonic()
        code, body = role(master, role="SLAVE", brokerId=1, epoch=0, drainMillis=8000, drainFor=[successor])
        took = time.monotonic() - started
        assert code == 200 and body["drained"] is True and body["maxPhyOffset"] == end, body
        assert took < 4, f"the drain waited {took:.1f}s for the stopped slave"
        acked = {s["address"]: s["ackedOffset"] for s in body["slaves"]}
        assert acked[successor] == end and min(acked.values()) < end, acked
        assert slave.status()["maxPhyOffset"] == end
        code, body = role(slave, role="SYNC_MASTER", brokerId=0, epoch=1, syncMetadata=True)
        assert code == 200, body
    finally:
        other.signal(signal.SIGCONT)
    # The stopped slave and the old master follow the new master and end up with the same log.
    for follower in (master, other):
        code, raw = follower.admin("/ha/master", "POST", json.dumps({"haAddress": ha_addr(slave), "epoch": 1}).encode())
        assert code == 200, raw
    poll(lambda: follows(master, slave) and follows(other, slave)
         and any(s["inSync"] for s in slave.status()["ha"]["slaves"]), 20,
         what="both follow the new master, which counts one in sync")
    assert send_raw(slave.addr, TOPIC, b"after" * 20).code == ResponseCode.SUCCESS
    wait_caught_up(slave, [master, other])
    assert master.status()["ha"]["truncatedBytes"] == 0 and other.status()["ha"]["truncatedBytes"] == 0
    assert_commitlogs_identical(slave, [master, other])
