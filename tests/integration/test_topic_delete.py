"""Deleting a topic as mqadmin deleteTopic does: DELETE_TOPIC_IN_BROKER (215) on the master, then
DELETE_TOPIC_IN_NAMESRV (216), against real processes. The topic's config, consume queues and
offsets go on the master, its slave follows through metadata sync, the route goes from the
nameserver, and a topic created again under the name starts at queue offset 0 with consume
queues that agree between master and slave."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rmqbroker.metadata.consumer_offsets import OffsetTable, decode_consumer_offsets
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import (
    create_topic,
    create_topic_and_wait,
    metric_delta,
    poll,
    route,
    rpc,
    send_raw,
    wait_caught_up,
)
from tests.support.procs import BrokerProc, Namesrv

SEG = 2 * 1024 * 1024
TOPIC = "DoomedTopic"


def topic_names(broker: BrokerProc) -> set[str]:
    try:
        return set(json.loads((broker.store_dir / "config" / "topics.json").read_text())["topicConfigTable"])
    except (OSError, ValueError, KeyError):
        return set()


def cq_file(broker: BrokerProc, queue_id: int) -> bytes:
    path = broker.store_dir / "consumequeue" / TOPIC / str(queue_id) / f"{0:020d}"
    return path.read_bytes() if path.exists() else b""


def master_and_slave(cluster: Cluster, name: str, sync_interval_ms: int) -> tuple[Namesrv, BrokerProc, BrokerProc]:
    ns = cluster.namesrv()
    conf: dict[str, Any] = {"maxMessageSize": 1024 * 1024, "slaveSyncInitialDelay": 200,
                            "slaveSyncInterval": sync_interval_ms, "mappedFileSizeConsumeQueue": 6000}
    master = cluster.broker(ns.addr, name=name, mappedFileSizeCommitLog=SEG, **conf)
    slave = cluster.broker(ns.addr, name=name, broker_id=1, role="SLAVE", mappedFileSizeCommitLog=SEG,
                           haMasterAddress=f"127.0.0.1:{master.port + 1}", **conf)
    return ns, master, slave


@pytest.fixture
def group(cluster: Cluster) -> tuple[Namesrv, BrokerProc, BrokerProc]:
    return master_and_slave(cluster, "broker-d", 500)


@pytest.fixture(scope="module")
def module_group(module_cluster: Cluster) -> tuple[Namesrv, BrokerProc, BrokerProc]:
    return master_and_slave(module_cluster, "broker-d", 500)


@pytest.fixture
def refusing_group(module_group: tuple[Namesrv, BrokerProc, BrokerProc],
                   shared_cluster: Cluster) -> tuple[Namesrv, BrokerProc, BrokerProc]:
    """One group for the tests of deletions refused: a refusal deletes nothing (each test checks
    that), and each counts its own refusal (metric deltas)."""
    return module_group


def test_delete_topic_on_broker_slave_and_nameserver_then_recreate(
        group: tuple[Namesrv, BrokerProc, BrokerProc]) -> None:
    ns, master, slave = group
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=2)
    for i in range(5):
        assert send_raw(master.addr, TOPIC, f"old-{i}".encode()).code == ResponseCode.SUCCESS
    assert rpc(master.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "CG_DEL", "topic": TOPIC, "queueId": "0", "commitOffset": "4"}).code == 0
    wait_caught_up(master, [slave])
    poll(lambda: TOPIC in topic_names(slave) and len(cq_file(slave, 0).rstrip(b"\0")) > 0, 10,
         what="topic and its queue on the slave")

    resp = rpc(master.addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": TOPIC})
    assert resp.code == ResponseCode.SUCCESS, resp
    assert TOPIC not in topic_names(master)
    assert not (master.store_dir / "consumequeue" / TOPIC).exists()
    max_offset = rpc(master.addr, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": "0"})
    assert max_offset.ext_fields["offset"] == "0"
    assert f"{TOPIC}@CG_DEL" not in (master.store_dir / "config" / "consumerOffset.json").read_text()
    # The broker's registration adds routes and never removes one: the nameserver drops it on 216.
    assert route(ns.addr, TOPIC) is not None
    assert rpc(ns.addr, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": TOPIC}).code == ResponseCode.SUCCESS
    assert route(ns.addr, TOPIC) is None
    poll(lambda: TOPIC not in topic_names(slave) and not (slave.store_dir / "consumequeue" / TOPIC).exists(), 10,
         what="topic and its consume queues gone from the slave")

    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=2)
    offsets = [send_raw(master.addr, TOPIC, f"new-{i}".encode()).ext_fields["queueOffset"] for i in range(2)]
    assert offsets == ["0", "1"]
    wait_caught_up(master, [slave])
    poll(lambda: cq_file(slave, 0).rstrip(b"\0") == cq_file(master, 0).rstrip(b"\0") != b"", 10,
         what="the new topic's consume queue on the slave equal to the master's")
    assert len(cq_file(master, 0).rstrip(b"\0")) <= 2 * 20  # two 20-byte units, nothing of the old topic


@pytest.mark.parametrize(("ext", "remark"), [
    ({"topic": "SCHEDULE_TOPIC_XXXX"}, "system topic"),
    ({"topic": "TBW102"}, "system topic"),
    ({"topic": "bad topic"}, "illegal characters"),
    ({"topic": " "}, "blank"),
])
def test_delete_refuses_system_and_malformed_topics(refusing_group: tuple[Namesrv, BrokerProc, BrokerProc],
                                                    ext: dict[str, str], remark: str) -> None:
    _, master, _ = refusing_group
    before = topic_names(master)
    metrics = master.metrics()
    resp = rpc(master.addr, RequestCode.DELETE_TOPIC_IN_BROKER, ext)
    assert resp.code == ResponseCode.SYSTEM_ERROR and remark in (resp.remark or ""), resp
    assert metric_delta(metrics, master.metrics(), "rmq_remoting_bad_requests_total",
                        code=str(int(RequestCode.DELETE_TOPIC_IN_BROKER))) == 1
    assert topic_names(master) == before


def test_slave_refuses_delete_and_keeps_the_topic(group: tuple[Namesrv, BrokerProc, BrokerProc]) -> None:
    _, master, slave = group
    create_topic(master.addr, TOPIC, queues=1)
    poll(lambda: TOPIC in topic_names(slave), 10, what="topic on the slave")
    resp = rpc(slave.addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": TOPIC})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "slave" in (resp.remark or ""), resp
    assert TOPIC in topic_names(slave) and TOPIC in topic_names(master)
    missing = rpc(master.addr, RequestCode.DELETE_TOPIC_IN_BROKER, {})
    assert missing.code == ResponseCode.SYSTEM_ERROR and "topic" in (missing.remark or ""), missing


def _send_to(broker: BrokerProc, queue_id: int, body: bytes) -> str:
    resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, {
        "producerGroup": "PG_RAW", "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": str(queue_id), "sysFlag": "0", "bornTimestamp": "0", "flag": "0",
        "properties": "WAIT\x01true\x02"}, body)
    assert resp.code == ResponseCode.SUCCESS, resp
    return resp.ext_fields["queueOffset"]


def test_topic_deleted_and_created_again_between_two_sync_rounds(cluster: Cluster) -> None:
    """The slave's metadata sync never sees the topic missing, so it learns the deletion from the
    master's record of it (where the master's log ended then): queues built only from older records
    go, queues the new topic has written to already stay, and both brokers agree queue by queue."""
    ns, master, slave = master_and_slave(cluster, "broker-r", 2000)
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=2)
    for i in range(3):
        for q in (0, 1):
            _send_to(master, q, f"old-{q}-{i}".encode())
    wait_caught_up(master, [slave])
    poll(lambda: TOPIC in topic_names(slave) and cq_file(slave, 1).rstrip(b"\0") == cq_file(master, 1).rstrip(b"\0")
         != b"", 10, what="the old topic's queues on the slave")

    def last_sync() -> int:
        return int(slave.status()["metadataSync"]["lastSuccessMillis"] or 0)

    # Right after a sync round, so that deleting and creating again fall between two rounds.
    seen = last_sync()
    poll(lambda: last_sync() > seen, 10, what="a sync round")
    synced = last_sync()
    assert rpc(master.addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": TOPIC}).code == ResponseCode.SUCCESS
    create_topic(master.addr, TOPIC, queues=2)
    assert _send_to(master, 0, b"new-0") == "0"
    wait_caught_up(master, [slave])
    assert last_sync() == synced, "a sync round ran between the deletion and the new topic: retry the test"

    def agree() -> bool:
        return all(cq_file(slave, q).rstrip(b"\0") == cq_file(master, q).rstrip(b"\0") for q in (0, 1))

    poll(agree, 15, what="the slave's queues equal to the master's after the next sync round")
    assert 0 < len(cq_file(master, 0).rstrip(b"\0")) <= 20 and cq_file(master, 1).rstrip(b"\0") == b""
    for q, expected in ((0, "1"), (1, "0")):
        for b in (master, slave):
            got = rpc(b.addr, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": str(q)}).ext_fields["offset"]
            assert got == expected, (b.addr, q, got)
    # Sends after the round go on at the same queue offsets on both (the slave's queue table agrees).
    assert _send_to(master, 1, b"new-1") == "0"
    wait_caught_up(master, [slave])
    poll(agree, 10, what="queues equal after one more send")


def test_slave_forgets_the_offsets_its_master_removed(group: tuple[Namesrv, BrokerProc, BrokerProc]) -> None:
    """Offsets the master removed (a deleted topic's, a group deleted with removeOffset) go from the
    slave too: promoted, it would otherwise hand the old offsets to a topic or group created again
    under the name, whose queues start at 0 (its consumers would skip what is sent next)."""
    ns, master, slave = group
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=1)
    create_topic(master.addr, "KeptTopic", queues=1)
    for topic, grp in ((TOPIC, "CG_TOPIC_GONE"), ("KeptTopic", "CG_GROUP_GONE"), ("KeptTopic", "CG_KEPT")):
        assert rpc(master.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": grp, "topic": topic, "queueId": "0", "commitOffset": "4"}).code == 0

    def slave_offsets() -> set[str]:
        try:
            text = (slave.store_dir / "config" / "consumerOffset.json").read_text()
            return set(json.loads(text)["offsetTable"])
        except (OSError, ValueError, KeyError):
            return set()

    every = {f"{TOPIC}@CG_TOPIC_GONE", "KeptTopic@CG_GROUP_GONE", "KeptTopic@CG_KEPT"}
    poll(lambda: every <= slave_offsets(), 10, what="offsets on the slave")
    assert rpc(master.addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": TOPIC}).code == ResponseCode.SUCCESS
    assert rpc(master.addr, RequestCode.DELETE_SUBSCRIPTIONGROUP,
               {"groupName": "CG_GROUP_GONE", "removeOffset": "true"}).code == ResponseCode.SUCCESS
    poll(lambda: TOPIC not in topic_names(slave), 10, what="the deletion on the slave")
    rounds = slave.status()["metadataSync"]["rounds"]
    poll(lambda: slave.status()["metadataSync"]["rounds"] >= rounds + 2, 10, what="two more sync rounds")
    assert slave_offsets() == {"KeptTopic@CG_KEPT"}
    resp = rpc(slave.addr, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "CG_TOPIC_GONE", "topic": TOPIC,
                                                               "queueId": "0"})
    assert resp.ext_fields.get("offset") != "4", resp


def _offsets_on(broker: BrokerProc) -> OffsetTable:
    resp = rpc(broker.addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
    assert resp.code == ResponseCode.SUCCESS, resp
    return decode_consumer_offsets(bytes(resp.body))


def test_slave_forgets_offsets_of_a_topic_deleted_and_created_again_between_two_rounds(cluster: Cluster) -> None:
    """The master drops every group's offsets on a topic it deletes. Created again before the
    slave's next round, the topic never leaves the topic table the slave syncs; the offsets the
    slave last received from the master and the master no longer reports go all the same (promoted,
    it would hand them to the new topic's queues, which restart at 0). Offsets committed on the
    slave itself, which the master never reported, stay, as RocketMQ's putAll keeps them."""
    ns, master, slave = master_and_slave(cluster, "broker-r", 2000)
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=2)
    for grp in ("CG_OLD", "CG_HERE"):
        assert rpc(master.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                   body=json.dumps({"groupName": grp}).encode()).code == ResponseCode.SUCCESS
    for q in (0, 1):
        assert rpc(master.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": "CG_OLD", "topic": TOPIC, "queueId": str(q), "commitOffset": "40"}).code == 0
    poll(lambda: _offsets_on(slave).get(f"{TOPIC}@CG_OLD") == {0: 40, 1: 40}, 10, what="CG_OLD's offsets on the slave")

    def last_sync() -> int:
        return int(slave.status()["metadataSync"]["lastSuccessMillis"] or 0)

    # Right after a round, so that what follows falls between two rounds (2 s apart).
    seen = last_sync()
    poll(lambda: last_sync() > seen, 10, what="a sync round")
    synced = last_sync()
    # Committed on the slave (by consumers, while the master was away): never the master's.
    for grp, q in (("CG_OLD", 1), ("CG_HERE", 0)):
        assert rpc(slave.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": grp, "topic": TOPIC, "queueId": str(q), "commitOffset": "7"}).code == 0
    assert rpc(master.addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": TOPIC}).code == ResponseCode.SUCCESS
    create_topic(master.addr, TOPIC, queues=2)
    assert last_sync() == synced, "a sync round ran between the deletion and the new topic: retry the test"
    assert f"{TOPIC}@CG_OLD" not in _offsets_on(master)

    poll(lambda: last_sync() > synced, 10, what="the next sync round")
    offsets = _offsets_on(slave)
    assert offsets.get(f"{TOPIC}@CG_OLD") == {1: 7}, offsets  # queue 0's 40 was the master's, gone there
    assert offsets.get(f"{TOPIC}@CG_HERE") == {0: 7}, offsets
