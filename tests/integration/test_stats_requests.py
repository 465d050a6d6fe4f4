"""GET_TOPIC_STATS_INFO (202) and GET_CONSUME_STATS (208) against a real broker: the bodies mqadmin
topicStatus / consumerProgress (and the RocketMQ dashboard) read, in fastjson's form with
MessageQueue objects as map keys, and figures that follow what was sent, committed and pulled."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import create_topic, rpc, send_raw

TOPIC = "StatsTopic"
# fastjson writes a MessageQueue map key as the bare object, fields in name order, no spaces.
MQ_KEY = re.compile(r'\{"brokerName":("[^"]*"),"queueId":(\d+),"topic":("[^"]*")\}:')


def parse(body: bytes) -> dict[str, Any]:
    """The body with each MessageQueue key turned into a "topic|queueId|brokerName" string key; the
    parse fails if any key is not in fastjson's exact form."""
    text = MQ_KEY.sub(lambda m: json.dumps(f"{json.loads(m[3])}|{m[2]}|{json.loads(m[1])}") + ":",
                      body.decode("utf-8"))
    result: dict[str, Any] = json.loads(text)
    return result


def test_topic_stats_and_consumer_progress(cluster: Cluster) -> None:
    broker = cluster.broker(None, name="broker-s")
    create_topic(broker.addr, TOPIC, queues=2)
    t0 = int(time.time() * 1000)
    for i in range(3):
        assert send_raw(broker.addr, TOPIC, f"m{i}".encode()).code == ResponseCode.SUCCESS  # queue 0
    t1 = int(time.time() * 1000)

    stats = rpc(broker.addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC})
    assert stats.code == ResponseCode.SUCCESS, stats
    table = parse(stats.body)["offsetTable"]
    assert set(table) == {f"{TOPIC}|0|broker-s", f"{TOPIC}|1|broker-s"}
    q0, q1 = table[f"{TOPIC}|0|broker-s"], table[f"{TOPIC}|1|broker-s"]
    assert (q0["minOffset"], q0["maxOffset"]) == (0, 3) and t0 <= q0["lastUpdateTimestamp"] <= t1
    assert q1 == {"lastUpdateTimestamp": 0, "maxOffset": 0, "minOffset": 0}
    missing = rpc(broker.addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": "NoSuchTopic"})
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST and "NoSuchTopic" in (missing.remark or "")

    def progress(**ext: str) -> dict[str, Any]:
        resp = rpc(broker.addr, RequestCode.GET_CONSUME_STATS, {"consumerGroup": "CG_STATS", **ext})
        assert resp.code == ResponseCode.SUCCESS, resp
        return parse(resp.body)

    assert progress() == {"consumeTps": 0.0, "offsetTable": {}}  # no offsets committed yet
    assert rpc(broker.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "CG_STATS", "topic": TOPIC, "queueId": "0", "commitOffset": "2"}).code == 0
    pulled = rpc(broker.addr, RequestCode.PULL_MESSAGE, {
        "consumerGroup": "CG_STATS", "topic": TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
        "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"})
    assert pulled.code == ResponseCode.SUCCESS, pulled

    for ext in ({}, {"topic": TOPIC}):
        body = progress(**ext)
        assert body["consumeTps"] == 3 / 60  # three messages pulled within the last minute
        q0, q1 = body["offsetTable"][f"{TOPIC}|0|broker-s"], body["offsetTable"][f"{TOPIC}|1|broker-s"]
        assert (q0["brokerOffset"], q0["consumerOffset"]) == (3, 2)
        assert t0 <= q0["lastTimestamp"] <= t1  # store time of the last consumed message (offset 1)
        assert q1 == {"brokerOffset": 0, "consumerOffset": 0, "lastTimestamp": 0}
    assert progress(topic="NoSuchTopic")["offsetTable"] == {}
    header = rpc(broker.addr, RequestCode.GET_CONSUME_STATS, {"topic": TOPIC})
    assert header.code == ResponseCode.SYSTEM_ERROR and "consumerGroup" in (header.remark or ""), header
