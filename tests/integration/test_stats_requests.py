"""GET_TOPIC_STATS_INFO (202) and GET_CONSUME_STATS (208) against a real broker: the bodies mqadmin
topicStatus / consumerProgress (and the RocketMQ dashboard) read, in fastjson's form with
MessageQueue objects as map keys, and figures that follow what was sent, committed and pulled."""

from __future__ import annotations

import time
from typing import Any

from rmqbroker.metadata.jsonfile import MessageQueue, loads_mq_keyed
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import create_topic, rpc, send_raw

TOPIC = "StatsTopic"
Q0: MessageQueue = (TOPIC, "broker-s", 0)
Q1: MessageQueue = (TOPIC, "broker-s", 1)


def parse(body: bytes) -> tuple[dict[str, Any], dict[MessageQueue, Any]]:
    """The document and its offsetTable by queue; the parse fails if any key is not in fastjson's
    exact form (the bare MessageQueue object, fields in name order, no spaces)."""
    return loads_mq_keyed(body, "offsetTable")


def test_topic_stats_and_consumer_progress(cluster: Cluster) -> None:
    broker = cluster.broker(None, name="broker-s")
    create_topic(broker.addr, TOPIC, queues=2)
    t0 = int(time.time() * 1000)
    for i in range(3):
        assert send_raw(broker.addr, TOPIC, f"m{i}".encode()).code == ResponseCode.SUCCESS  # queue 0
    t1 = int(time.time() * 1000)

    stats = rpc(broker.addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC})
    assert stats.code == ResponseCode.SUCCESS, stats
    _, table = parse(bytes(stats.body))
    assert set(table) == {Q0, Q1}
    q0, q1 = table[Q0], table[Q1]
    assert (q0["minOffset"], q0["maxOffset"]) == (0, 3) and t0 <= q0["lastUpdateTimestamp"] <= t1
    assert q1 == {"lastUpdateTimestamp": 0, "maxOffset": 0, "minOffset": 0}
    missing = rpc(broker.addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": "NoSuchTopic"})
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST and "NoSuchTopic" in (missing.remark or "")

    def progress(**ext: str) -> tuple[dict[str, Any], dict[MessageQueue, Any]]:
        resp = rpc(broker.addr, RequestCode.GET_CONSUME_STATS, {"consumerGroup": "CG_STATS", **ext})
        assert resp.code == ResponseCode.SUCCESS, resp
        return parse(bytes(resp.body))

    assert progress() == ({"consumeTps": 0.0, "offsetTable": {}}, {})  # no offsets committed yet
    assert rpc(broker.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "CG_STATS", "topic": TOPIC, "queueId": "0", "commitOffset": "2"}).code == 0
    pulled = rpc(broker.addr, RequestCode.PULL_MESSAGE, {
        "consumerGroup": "CG_STATS", "topic": TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
        "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"})
    assert pulled.code == ResponseCode.SUCCESS, pulled

    for ext in ({}, {"topic": TOPIC}):
        body, table = progress(**ext)
        assert body["consumeTps"] == 3 / 60  # three messages pulled within the last minute
        q0, q1 = table[Q0], table[Q1]
        assert (q0["brokerOffset"], q0["consumerOffset"]) == (3, 2)
        assert t0 <= q0["lastTimestamp"] <= t1  # store time of the last consumed message (offset 1)
        assert q1 == {"brokerOffset": 0, "consumerOffset": 0, "lastTimestamp": 0}
    assert progress(topic="NoSuchTopic")[1] == {}
    header = rpc(broker.addr, RequestCode.GET_CONSUME_STATS, {"topic": TOPIC})
    assert header.code == ResponseCode.SYSTEM_ERROR and "consumerGroup" in (header.remark or ""), header
