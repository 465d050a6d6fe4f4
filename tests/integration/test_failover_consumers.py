"""What consumers of a broker group keep when its master is lost and a slave promoted, or the
master handed over: delayed messages are delivered once by the new master, halves are ended or
checked there, and delay and check progress carry on from what the slave's metadata sync copied,
even when that progress is ahead of the slave's own log. Real processes on loopback."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import Any

from rmqbroker.processors.transaction import CHECK_GROUP, HALF_TOPIC
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.store.record import MessageRecord, decode_record, iter_records
from tests.conftest import Cluster
from tests.integration.helpers import (
    PushConsumer,
    create_topic,
    create_topic_and_wait,
    poll,
    query_consumer_offset,
    rpc,
    send_raw,
    wait_caught_up,
)
from tests.integration.test_replication import SEG
from tests.integration.test_replication_extra import ha_addr
from tests.integration.test_transactions import COMMIT, ROLLBACK, UNKNOWN, TxProducer
from tests.integration.test_transactions import TOPIC as TX_TOPIC
from tests.integration.test_transactions import delivered as tx_delivered
from tests.support.procs import BrokerProc, free_port

DELAY_LEVELS = "1s 2s 3s 6s"


def queue_records(addr: str, topic: str, queue_id: int = 0) -> list[MessageRecord]:
    """Every message of ``topic``/``queue_id`` from offset 0, read with raw pulls."""
    out: list[MessageRecord] = []
    offset = 0
    while True:
        resp = rpc(addr, RequestCode.PULL_MESSAGE, {
            "consumerGroup": "CG_PROBE", "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
            "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
            "subscription": "*", "subVersion": "0"})
        if resp.code != ResponseCode.SUCCESS:
            return out
        batch = list(iter_records(bytes(resp.body)))
        out += batch
        offset = int(resp.ext_fields["nextBeginOffset"])


def bodies(addr: str, topic: str) -> list[str]:
    return [r.body.decode() for r in queue_records(addr, topic)]


def delay_offsets(broker: BrokerProc) -> dict[int, int]:
    table = json.loads(broker.admin("/metadata")[1])["delayOffsets"]
    return {int(k): int(v) for k, v in (table.get("offsetTable") or {}).items()}


def post(broker: BrokerProc, path: str, **body: Any) -> dict[str, Any]:
    code, raw = broker.admin(path, "POST", json.dumps(body).encode())
    assert code == 200, raw
    answer: dict[str, Any] = json.loads(raw)
    return answer


def fail_over(master: BrokerProc, slave: BrokerProc) -> None:
    """The master is lost for good (kill -9); the slave is fenced and promoted at epoch 1."""
    master.kill9()
    post(slave, "/ha/fence", epoch=1)
    post(slave, "/role", role="ASYNC_MASTER", brokerId=0, epoch=1)


def send_delayed(addr: str, topic: str, body: str, level: int) -> None:
    props = f"WAIT\x01true\x02KEYS\x01{body}\x02DELAY\x01{level}\x02"
    assert send_raw(addr, topic, body.encode(), properties=props).code == ResponseCode.SUCCESS


def pair(cluster: Cluster, role: str = "ASYNC_MASTER", *, lagging: bool = False,
         **conf: Any) -> tuple[BrokerProc, BrokerProc]:
    """A master and its slave, metadata synced every 0.5 s. ``lagging``: the slave syncs its
    metadata but streams none of the log (its HA client points at a port nobody listens on), as a
    slave that fell behind (ASYNC) would lag."""
    ns = cluster.namesrv().addr
    common: dict[str, Any] = {"messageDelayLevel": DELAY_LEVELS, "flushDelayOffsetInterval": 300,
                              "slaveSyncInitialDelay": 300, "slaveSyncInterval": 500,
                              "mappedFileSizeCommitLog": SEG, "maxMessageSize": 1024 * 1024, **conf}
    master = cluster.broker(ns, name="broker-f", broker_id=0, role=role, **common)
    ha_master = f"127.0.0.1:{free_port()}" if lagging else ha_addr(master)
    slave = cluster.broker(ns, name="broker-f", broker_id=1, role="SLAVE", haMasterAddress=ha_master, **common)
    if lagging:
        poll(lambda: slave.status()["metadataSync"]["masterAddress"] == master.addr, 20, what="master address known")
    return master, slave


def test_delayed_messages_due_after_a_failover_are_delivered_once_by_the_promoted_slave(cluster: Cluster) -> None:
    master, slave = pair(cluster)
    topic = "DelayFailover"
    create_topic(master.addr, topic, queues=1)
    for i in range(3):
        send_delayed(master.addr, topic, f"early-{i}", 1)
    poll(lambda: len(bodies(master.addr, topic)) == 3, 10, what="level-1 messages delivered by the master")
    for i in range(3):
        send_delayed(master.addr, topic, f"late-{i}", 4)
    wait_caught_up(master, [slave])
    poll(lambda: delay_offsets(slave).get(1) == 3, 10, what="the slave has the master's delay offsets")
    fail_over(master, slave)
    poll(lambda: len(bodies(slave.addr, topic)) >= 6, 15, what="the late messages delivered by the new master")
    # A moment more: anything delivered twice would show now.
    poll(lambda: delay_offsets(slave).get(4) == 3, 5, what="level 4 done")
    assert sorted(bodies(slave.addr, topic)) == sorted([f"early-{i}" for i in range(3)] +
                                                       [f"late-{i}" for i in range(3)])


NO_PERIODIC_SYNC: dict[str, Any] = {"slaveSyncInitialDelay": 600000, "slaveSyncInterval": 600000}


def test_delayed_messages_due_after_a_hand_over_are_delivered_once_by_the_new_master(cluster: Cluster) -> None:
    master, slave = pair(cluster, role="SYNC_MASTER", **NO_PERIODIC_SYNC)
    poll(lambda: slave.status()["metadataSync"]["masterAddress"] == master.addr, 20, what="master address known")
    topic = "DelayHandOver"
    create_topic(master.addr, topic, queues=1)
    for i in range(3):
        send_delayed(master.addr, topic, f"early-{i}", 1)
    for i in range(3):
        send_delayed(master.addr, topic, f"late-{i}", 4)
    poll(lambda: len(bodies(master.addr, topic)) == 3, 10, what="level-1 messages delivered by the master")
    wait_caught_up(master, [slave])
    assert delay_offsets(slave).get(1) is None  # only the promotion's last round brings them
    post(master, "/role", role="SLAVE", brokerId=1, epoch=0, drainMillis=5000)
    answer = post(slave, "/role", role="SYNC_MASTER", brokerId=0, epoch=1, syncMetadata=True)
    assert answer["metadataSynced"] is True, answer
    post(master, "/ha/master", haAddress=ha_addr(slave), epoch=1)
    poll(lambda: len(bodies(slave.addr, topic)) >= 6, 15, what="the late messages delivered by the new master")
    poll(lambda: delay_offsets(slave).get(4) == 3, 5, what="level 4 done")
    assert sorted(bodies(slave.addr, topic)) == sorted([f"early-{i}" for i in range(3)] +
                                                       [f"late-{i}" for i in range(3)])


def test_a_promoted_slave_behind_its_synced_delay_offsets_delivers_new_delayed_messages(cluster: Cluster) -> None:
    master, slave = pair(cluster, lagging=True)
    topic = "DelayBehind"
    create_topic(master.addr, topic, queues=1)
    for i in range(3):
        send_delayed(master.addr, topic, f"old-{i}", 1)
    poll(lambda: len(bodies(master.addr, topic)) == 3, 10, what="level-1 messages delivered by the master")
    poll(lambda: delay_offsets(slave).get(1) == 3, 10, what="the slave has the master's delay offsets")
    assert slave.status()["maxPhyOffset"] == 0  # ...but none of its log
    # The master is lost for good; the slave is promoted with what it has (allowDataLoss).
    fail_over(master, slave)
    # Acknowledged delayed sends to the new master: their level queue starts again at offset 0.
    for i in range(3):
        send_delayed(slave.addr, topic, f"new-{i}", 1)
    # Level 1 is 1 s: every new message is due within a few seconds.
    poll(lambda: len(bodies(slave.addr, topic)) >= 3, 10, what="the new delayed messages delivered")
    assert sorted(bodies(slave.addr, topic)) == [f"new-{i}" for i in range(3)]


def test_a_promoted_slave_behind_its_synced_check_progress_checks_new_halves(cluster: Cluster) -> None:
    master, slave = pair(cluster, lagging=True, transactionCheckInterval=300, transactionTimeOut=800)
    create_topic(master.addr, TX_TOPIC, queues=1)

    async def settle_on_master() -> None:
        p = TxProducer(master.addr, answer=None)
        await p.heartbeat()
        for i in range(3):
            assert (await p.end(*await p.half(f"old-{i}".encode(), f"TX-OLD-{i}"), COMMIT)).code == 0
        await p.client.close()

    asyncio.run(settle_on_master())
    # The master's check walked past the three halves; the slave copied that progress, not the log.
    poll(lambda: query_consumer_offset(slave.addr, CHECK_GROUP, HALF_TOPIC, 0) == 3, 10,
         what="the check's progress synced to the slave")
    assert slave.status()["maxPhyOffset"] == 0
    fail_over(master, slave)

    async def half_left_open_on_new_master() -> TxProducer:
        # The producer prepared the half and crashed before its commit; a new instance of its
        # group answers the check with COMMIT.
        p = TxProducer(slave.addr, answer=COMMIT)
        await p.heartbeat()
        await p.half(b"new", "TX-NEW")
        for _ in range(100):
            if p.checks:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # the answer's END_TRANSACTION
        await p.client.close()
        return p

    p = asyncio.run(half_left_open_on_new_master())
    assert [decode_record(bytes(c.body)).body for c in p.checks] == [b"new"]
    assert [r.body for r in tx_delivered(slave.addr)] == [b"new"]


def test_halves_prepared_on_the_old_master_are_ended_on_the_new_one(cluster: Cluster) -> None:
    ns = cluster.namesrv().addr
    tx: dict[str, Any] = {"transactionCheckInterval": 300, "transactionTimeOut": 1500, "slaveSyncInitialDelay": 300,
                          "slaveSyncInterval": 500}
    master = cluster.broker(ns, name="broker-f", broker_id=0, role="SYNC_MASTER", **tx)
    slave = cluster.broker(ns, name="broker-f", broker_id=1, role="SLAVE",
                           haMasterAddress=ha_addr(master), **tx)
    poll(lambda: slave.status()["ha"]["connected"], 10, what="slave connected")
    create_topic(master.addr, TX_TOPIC, queues=1)

    async def prepare() -> list[tuple[int, int]]:
        p = TxProducer(master.addr, answer=None)
        await p.heartbeat()
        halves = [await p.half(b"commit me", "TX-C"), await p.half(b"roll me back", "TX-R")]
        await p.client.close()
        return halves

    commit_half, rollback_half = asyncio.run(prepare())
    wait_caught_up(master, [slave])
    poll(lambda: TX_TOPIC in json.loads(slave.admin("/metadata")[1])["topics"]["topicConfigTable"], 10,
         what="the topic synced to the slave")
    fail_over(master, slave)

    async def end_on_new_master() -> TxProducer:
        p = TxProducer(slave.addr, answer=UNKNOWN)
        await p.heartbeat()
        assert (await p.end(*commit_half, COMMIT)).code == ResponseCode.SUCCESS
        assert (await p.end(*rollback_half, ROLLBACK)).code == ResponseCode.SUCCESS
        await asyncio.sleep(2.5)  # past transactionTimeOut: an unsettled half would be checked
        await p.client.close()
        return p

    p = asyncio.run(end_on_new_master())
    assert [r.body for r in tx_delivered(slave.addr)] == [b"commit me"]
    assert p.checks == []


def test_a_topic_created_after_the_last_metadata_round_is_readable_on_the_promoted_slave(
        cluster: Cluster) -> None:
    """The slave has the messages of a topic created on the master after its last metadata round,
    but not the topic's config: at promotion the config is restored from its consume queues, so
    pulls of it are served instead of refused as TOPIC_NOT_EXIST."""
    master, slave = pair(cluster, **NO_PERIODIC_SYNC)
    topic = "CreatedLate"
    create_topic(master.addr, topic, queues=2)
    for i in range(3):
        assert send_raw(master.addr, topic, f"late-topic-{i}".encode()).code == ResponseCode.SUCCESS
    wait_caught_up(master, [slave])
    topics = json.loads(slave.admin("/metadata")[1])["topics"]["topicConfigTable"]
    assert topic not in topics, "the slave synced the topic: this test needs it missing"
    fail_over(master, slave)
    assert bodies(slave.addr, topic) == [f"late-topic-{i}" for i in range(3)]
    restored = json.loads(slave.admin("/metadata")[1])["topics"]["topicConfigTable"][topic]
    assert (restored["readQueueNums"], restored["writeQueueNums"], restored["perm"]) == (1, 1, 6)


def test_a_master_promoted_again_forgets_what_it_settled_in_a_term_it_lost(cluster: Cluster) -> None:
    """A master settles a half, loses that term (its slave is promoted without it; it truncates and
    follows), and is promoted again: the half now at that queue offset is another one, and ending it
    must commit it, not be taken for a repeat of the settled one."""
    master, slave = pair(cluster)
    create_topic(master.addr, TX_TOPIC, queues=1)
    wait_caught_up(master, [slave])

    async def prepare(addr: str, body: bytes, key: str, commit: bool) -> tuple[int, int]:
        p = TxProducer(addr, None)
        try:
            await p.heartbeat()
            table, phy = await p.half(body, key)
            if commit:
                assert (await p.end(table, phy, COMMIT)).code == ResponseCode.SUCCESS
            return table, phy
        finally:
            await p.client.close()

    # The slave streams from nowhere from now on: it never gets the first term's transaction.
    post(slave, "/ha/master", haAddress=f"127.0.0.1:{free_port()}", brokerAddress=master.addr)
    lost, _ = asyncio.run(prepare(master.addr, b"lost with its term", "TX-LOST", commit=True))
    master.signal(signal.SIGSTOP)
    post(slave, "/ha/fence", epoch=1)
    post(slave, "/role", role="ASYNC_MASTER", brokerId=0, epoch=1)
    kept, phy = asyncio.run(prepare(slave.addr, b"kept", "TX-KEPT", commit=False))
    assert kept == lost, "the new term's half must sit where the lost one was"
    master.signal(signal.SIGCONT)
    post(master, "/role", role="SLAVE", brokerId=1, epoch=1)
    post(master, "/ha/master", haAddress=ha_addr(slave), brokerAddress=slave.addr, epoch=1)
    wait_caught_up(slave, [master])
    assert master.status()["ha"]["truncatedBytes"] > 0
    # Back to the first broker, which settled queue offset `lost` in the term it lost.
    post(slave, "/role", role="SLAVE", brokerId=1, epoch=1, drainMillis=5000)
    post(master, "/role", role="ASYNC_MASTER", brokerId=0, epoch=2)

    async def end() -> int:
        p = TxProducer(master.addr, None)
        try:
            return int((await p.end(kept, phy, COMMIT)).code)
        finally:
            await p.client.close()

    assert asyncio.run(end()) == ResponseCode.SUCCESS
    assert [bytes(r.body) for r in tx_delivered(master.addr)] == [b"kept"]


def test_a_consumer_past_the_lost_term_is_moved_back_to_the_new_terms_messages(cluster: Cluster) -> None:
    """ASYNC: a consumer read messages the slave never got; after the failover new sends fill those
    queue offsets on the promoted slave. The consumer's first pull beyond where the new term began is
    moved back there (PULL_OFFSET_MOVED), so it reads the new messages instead of skipping them."""
    master, slave = pair(cluster)
    topic = "LostTerm"
    create_topic(master.addr, topic, queues=1)
    for i in range(5):
        assert send_raw(master.addr, topic, f"kept-{i}".encode()).code == ResponseCode.SUCCESS
    wait_caught_up(master, [slave])
    post(slave, "/ha/master", haAddress=f"127.0.0.1:{free_port()}", brokerAddress=master.addr)
    for i in range(5):
        assert send_raw(master.addr, topic, f"lost-{i}".encode()).code == ResponseCode.SUCCESS
    assert len(bodies(master.addr, topic)) == 10  # the consumer got to offset 10 on the old master
    fail_over(master, slave)
    for i in range(5):
        assert send_raw(slave.addr, topic, f"new-{i}".encode()).code == ResponseCode.SUCCESS

    def pull(offset: int, commit: int = 0) -> Any:
        return rpc(slave.addr, RequestCode.PULL_MESSAGE, {
            "consumerGroup": "CG_LOST", "topic": topic, "queueId": "0", "queueOffset": str(offset),
            "maxMsgNums": "32", "sysFlag": "5" if commit else "4", "commitOffset": str(commit),
            "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"})

    first = pull(10, commit=10)
    assert (first.code, first.ext_fields["nextBeginOffset"]) == (ResponseCode.PULL_OFFSET_MOVED, "5"), first
    assert query_consumer_offset(slave.addr, "CG_LOST", topic, 0) != 10, "the stale commit was stored"
    got = pull(5)
    assert got.code == ResponseCode.SUCCESS
    assert [r.body.decode() for r in iter_records(bytes(got.body))] == [f"new-{i}" for i in range(5)]
    # Once served within the term, the group's pulls are served as asked.
    again = pull(10)
    assert again.code != ResponseCode.PULL_OFFSET_MOVED, again


def test_a_stock_consumer_past_the_lost_term_reads_the_new_masters_messages(cluster: Cluster) -> None:
    """The same with the stock C++ push consumer: it consumed the lost term's messages, the new
    master got new sends at those offsets before the consumer found it (its routes are re-read
    every 30 s), and it still receives every one of them."""
    master, slave = pair(cluster)
    ns = master.conf["namesrvAddr"]
    topic = "LostTermStock"
    create_topic_and_wait(master.addr, ns, topic, queues=1)
    for i in range(5):
        assert send_raw(master.addr, topic, f"kept-{i}".encode()).code == ResponseCode.SUCCESS
    wait_caught_up(master, [slave])
    post(slave, "/ha/master", haAddress=f"127.0.0.1:{free_port()}", brokerAddress=master.addr)
    with PushConsumer(ns, "CG_LOST_STOCK", topic, log_dir=cluster.workdir) as consumer:
        consumer.wait_started()
        for i in range(5):
            assert send_raw(master.addr, topic, f"lost-{i}".encode()).code == ResponseCode.SUCCESS
        consumer.wait_count(10, 30)
        fail_over(master, slave)
        for i in range(5):
            assert send_raw(slave.addr, topic, f"new-{i}".encode()).code == ResponseCode.SUCCESS
        got = consumer.wait_for(lambda m: {f"new-{i}" for i in range(5)} <= {e["body"] for e in m}, 60,
                                what="the new master's messages")
    assert sorted(e["body"] for e in got if e["body"].startswith("new-")) == [f"new-{i}" for i in range(5)]


def commit_offset(addr: str, group: str, topic: str, queue_id: int, offset: int) -> None:
    assert rpc(addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": topic, "queueId": str(queue_id), "commitOffset": str(offset)}).code == 0


def test_offsets_committed_to_the_slave_while_the_master_was_away_survive_its_return(cluster: Cluster) -> None:
    """While the master is down a stock consumer commits to the slave (the only broker of the group
    in its route). The master comes back with older offsets than the slave had from it (a kill -9
    loses up to flushConsumerOffsetInterval of commits): the slave's sync keeps the commits it has
    nothing newer than and hands them to the master, so neither a consumer restarted against the
    master nor a later promotion re-delivers what the group consumed during the outage; an offset
    the master moved since (here a reset back) still wins."""
    master, slave = pair(cluster, slaveSyncInterval=1000)
    group, topic = "CG_AWAY", "OffsetsAway"
    create_topic(master.addr, topic, queues=2)
    # The group as a consumer's heartbeat creates it (persisted at once, unlike its offsets).
    assert rpc(master.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
               body=json.dumps({"groupName": group}).encode()).code == ResponseCode.SUCCESS

    def offsets(broker: BrokerProc) -> list[int | None]:
        return [query_consumer_offset(broker.addr, group, topic, q) for q in (0, 1)]

    def rounds() -> int:
        return int(slave.status()["metadataSync"]["rounds"])

    for q in (0, 1):
        commit_offset(master.addr, group, topic, q, 5)
    poll(lambda: offsets(slave) == [5, 5], 10, what="the master's offsets synced")
    master.kill9()
    for q in (0, 1):
        commit_offset(slave.addr, group, topic, q, 9)
    # A group whose first consumer started during the outage: the master has neither the group nor
    # its offsets; its commits on the slave are handed over all the same, not dropped as removed.
    commit_offset(slave.addr, "CG_NEW", topic, 0, 7)
    # Its file as a kill -9 leaves it when the last flush was before the group's last commit.
    (master.store_dir / "config" / "consumerOffset.json").write_text(
        json.dumps({"offsetTable": {f"{topic}@{group}": {"0": 4, "1": 4}}}))
    master.start()
    # (It starts at [4, 4]; the slave's round taken as soon as it streams again may have run already.)
    # Kept, and handed to the master, where a restarted consumer reads its offsets.
    poll(lambda: offsets(master) == [9, 9], 10, what="the slave's commits handed to the master")
    assert offsets(slave) == [9, 9]
    poll(lambda: query_consumer_offset(master.addr, "CG_NEW", topic, 0) == 7, 10,
         what="the new group's commit handed to the master")
    assert query_consumer_offset(slave.addr, "CG_NEW", topic, 0) == 7
    # Before the next round (1 s): the consumer's route does not show the master yet, so it goes on
    # committing here; on the master the group's offset of queue 1 is reset back.
    commit_offset(slave.addr, group, topic, 0, 11)
    commit_offset(master.addr, group, topic, 1, 3)
    after = rounds()
    poll(lambda: rounds() >= after + 2, 10, what="two more sync rounds")
    assert (offsets(slave), offsets(master)) == ([11, 3], [11, 3])
    fail_over(master, slave)
    assert offsets(slave) == [11, 3]


def committed_during_an_outage(cluster: Cluster, group: str, topic: str,
                               **conf: Any) -> tuple[BrokerProc, BrokerProc]:
    """A pair whose slave synced ``group``'s offset 5 on ``topic`` queue 0 from the master; then the
    master was killed (-9) and the group committed 9 to the slave."""
    master, slave = pair(cluster, slaveSyncInterval=1000, **conf)
    create_topic(master.addr, topic, queues=1)
    # The group as a consumer's heartbeat creates it (persisted at once, unlike its offsets).
    assert rpc(master.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
               body=json.dumps({"groupName": group}).encode()).code == ResponseCode.SUCCESS
    commit_offset(master.addr, group, topic, 0, 5)
    poll(lambda: query_consumer_offset(slave.addr, group, topic, 0) == 5, 10, what="the master's offset synced")
    master.kill9()
    commit_offset(slave.addr, group, topic, 0, 9)
    return master, slave


def test_outage_commits_survive_a_master_back_with_an_offset_newer_than_the_slave_synced(cluster: Cluster) -> None:
    """The master's file can be newer than the slave's last round before the outage (a commit
    flushed after that round and before a kill -9; a hung master applies the commits queued while it
    was stopped): its offset is then between what the slave synced and what the group committed to
    the slave during the outage, and still older than the latter. Taking it would re-deliver what the
    group consumed from the slave (measured with a stock consumer across a 60 s SIGSTOP: 1200 of
    6080 messages consumed twice after the group restarted)."""
    group, topic = "CG_AWAY2", "OffsetsAway2"
    master, slave = committed_during_an_outage(cluster, group, topic)
    # The master had 7 on disk: committed and flushed after the slave's last round.
    (master.store_dir / "config" / "consumerOffset.json").write_text(
        json.dumps({"offsetTable": {f"{topic}@{group}": {"0": 7}}}))
    master.start()
    rounds = int(slave.status()["metadataSync"]["rounds"])
    poll(lambda: int(slave.status()["metadataSync"]["rounds"]) >= rounds + 2, 10, what="two rounds with the master")
    assert [query_consumer_offset(b.addr, group, topic, 0) for b in (slave, master)] == [9, 9]


def test_outage_commits_survive_a_slave_restart_before_the_master_returns(cluster: Cluster) -> None:
    """The slave is killed and restarted while its master is still away (a pod rescheduled in the
    same incident): what the group committed to it is still kept over the master's older table and
    handed over when the master returns (before, a restarted slave took the master's offsets and
    the group re-consumed everything it had consumed from the slave)."""
    group, topic = "CG_AWAY3", "OffsetsAway3"
    master, slave = committed_during_an_outage(cluster, group, topic, flushConsumerOffsetInterval=300)
    offsets_file = slave.store_dir / "config" / "consumerOffset.json"
    poll(lambda: json.loads(offsets_file.read_text())["offsetTable"].get(f"{topic}@{group}") == {"0": 9}, 10,
         what="the slave's periodic offset flush")
    slave.kill9()
    slave.start()
    assert query_consumer_offset(slave.addr, group, topic, 0) == 9
    # The master's file as a kill -9 left it: older than what the slave had synced from it.
    (master.store_dir / "config" / "consumerOffset.json").write_text(
        json.dumps({"offsetTable": {f"{topic}@{group}": {"0": 4}}}))
    master.start()
    poll(lambda: query_consumer_offset(master.addr, group, topic, 0) == 9, 10,
         what="the restarted slave's outage commit handed to the master")
    rounds = int(slave.status()["metadataSync"]["rounds"])
    poll(lambda: int(slave.status()["metadataSync"]["rounds"]) >= rounds + 2, 10, what="two more rounds")
    assert [query_consumer_offset(b.addr, group, topic, 0) for b in (slave, master)] == [9, 9]


def test_a_slave_hands_its_outage_commits_to_its_master_as_soon_as_it_streams_from_it_again(
        cluster: Cluster) -> None:
    """A consumer that starts (or takes over a queue) once the master is back reads its offset from
    the master. Until the slave's next metadata round hands over what the group committed to the
    slave during the outage, that is the master's stale offset, and it re-consumes everything it
    consumed from the slave (measured: 1040 of 1080 messages when the group restarted as the master
    came back). The round runs when the HA link streams again, not at the end of the period."""
    master, slave = pair(cluster, slaveSyncInterval=60000)
    group, topic = "CG_SOON", "OffsetsSoon"
    create_topic(master.addr, topic, queues=1)
    assert rpc(master.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
               body=json.dumps({"groupName": group}).encode()).code == ResponseCode.SUCCESS
    poll(lambda: slave.status()["ha"]["connected"], 10, what="slave connected")
    poll(lambda: slave.status()["metadataSync"]["rounds"] >= 1, 10, what="the first metadata round")
    master.kill9()
    commit_offset(slave.addr, group, topic, 0, 9)
    master.start()
    poll(lambda: query_consumer_offset(master.addr, group, topic, 0) == 9, 5,
         what="the outage's commit handed to the returned master")


def test_a_slave_holding_outage_commits_tries_its_master_again_every_fifth_of_a_second(cluster: Cluster) -> None:
    """A slave whose master cannot be reached tries it once a second (Java's HAClient: every 5 s),
    so the hand-over of what a group committed to it during the outage could follow the master's
    return by up to a second, in which a consumer reading the master re-consumes. While it holds
    such commits it tries every 0.2 s; without them, once a second."""
    master, slave = pair(cluster, slaveSyncInterval=60000)
    group, topic = "CG_RETRY", "OffsetsRetry"
    create_topic(master.addr, topic, queues=1)
    assert rpc(master.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
               body=json.dumps({"groupName": group}).encode()).code == ResponseCode.SUCCESS
    poll(lambda: slave.status()["metadataSync"]["rounds"] >= 1, 10, what="the first metadata round")

    def failed_attempts_in(seconds: float) -> int:
        before = int(slave.status()["ha"]["failedAttempts"])
        time.sleep(seconds)
        return int(slave.status()["ha"]["failedAttempts"]) - before

    master.kill9()
    time.sleep(2)  # past the first step of the back-off (0.5 s)
    assert 2 <= failed_attempts_in(4) <= 5
    commit_offset(slave.addr, group, topic, 0, 9)
    assert slave.status()["metadataSync"]["offsetsToHandOver"] == 1
    assert failed_attempts_in(3) >= 9
    master.start()
    poll(lambda: query_consumer_offset(master.addr, group, topic, 0) == 9, 3,
         what="the outage's commit handed to the returned master")
    assert slave.status()["metadataSync"]["offsetsToHandOver"] == 0
    assert failed_attempts_in(1.5) == 0
