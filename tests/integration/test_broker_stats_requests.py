"""VIEW_BROKER_STATS_DATA (315) and GET_BROKER_CONSUME_STATS (317) against a real broker, and the
rmq-admin commands that read them (statsAll, brokerConsumeStats), as mqadmin and the Dashboard
use them: sampled put/get figures that follow what was sent and pulled, RocketMQ's refusal of an
unknown stats item, and every group's progress in one ConsumeStatsList."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rmqbroker.admin_cli import main
from rmqbroker.metadata.jsonfile import loads_with_mq_keys
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import create_topic, create_topic_and_wait, poll, rpc, send_raw

TOPIC = "BrokerStatsTopic"
GROUP = "CG_BROKER_STATS"
N = 5


def pull(addr: str, topic: str, group: str) -> bytes:
    """One pull of queue 0 from offset 0, without committing: the records' bytes."""
    resp = rpc(addr, RequestCode.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
        "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"})
    assert resp.code == ResponseCode.SUCCESS, resp
    return bytes(resp.body)


def commit(addr: str, topic: str, group: str, offset: int) -> None:
    resp = rpc(addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": topic, "queueId": "0", "commitOffset": str(offset)})
    assert resp.code == ResponseCode.SUCCESS, resp


def stats(addr: str, name: str, key: str) -> dict[str, Any] | None:
    """The BrokerStatsData of one item, or None while the broker answers that it does not exist."""
    resp = rpc(addr, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": name, "statsKey": key})
    if resp.code == ResponseCode.SYSTEM_ERROR and resp.remark == f"The stats <{name}> <{key}> not exist":
        return None
    assert resp.code == ResponseCode.SUCCESS, resp
    data: dict[str, Any] = json.loads(bytes(resp.body))
    return data


def minute_sum(addr: str, name: str, key: str, want: int) -> dict[str, Any] | None:
    data = stats(addr, name, key)
    return data if data is not None and data["statsMinute"]["sum"] == want else None


def consume_stats_list(addr: str, is_order: str = "false") -> dict[str, Any]:
    """A ConsumeStatsList body with its offset tables keyed "topic/broker/qid"; the parse fails
    unless every MessageQueue key is in fastjson's form."""
    resp = rpc(addr, RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": is_order})
    assert resp.code == ResponseCode.SUCCESS, resp
    doc, queues = loads_with_mq_keys(bytes(resp.body))
    for entry in doc["consumeStatsList"]:
        for group_stats in entry.values():
            for cs in group_stats:
                cs["offsetTable"] = {"/".join(map(str, queues[int(k)])): v for k, v in cs["offsetTable"].items()}
    assert isinstance(doc, dict)
    return doc


def test_stats_items_follow_sends_and_pulls(cluster: Cluster) -> None:
    # A 100 ms sampling period: the minute window (6 periods) fills and empties within a second,
    # the hour window takes its first sample every 6 s.
    broker = cluster.broker(None, name="broker-st", statsSamplingInterval=100)
    create_topic(broker.addr, TOPIC, queues=2)
    key = f"{TOPIC}@{GROUP}"
    for name, k in (("TOPIC_PUT_NUMS", TOPIC), ("GROUP_GET_NUMS", key), ("BROKER_PUT_NUMS", "DefaultCluster")):
        assert stats(broker.addr, name, k) is None  # nothing counted yet: Java has no item either

    for i in range(N):
        assert send_raw(broker.addr, TOPIC, f"message {i}".encode()).code == ResponseCode.SUCCESS
    records = pull(broker.addr, TOPIC, GROUP)
    size = len(records)  # the stored records' bytes, as a put counts them too

    puts = poll(lambda: minute_sum(broker.addr, "TOPIC_PUT_NUMS", TOPIC, N), 10, what="TOPIC_PUT_NUMS")
    assert puts["statsMinute"]["tps"] > 0
    assert puts["statsMinute"]["avgpt"] == 1.0  # times count messages (Java: send requests, one each here)
    assert set(puts) == {"statsMinute", "statsHour", "statsDay"}
    assert set(puts["statsDay"]) == {"sum", "tps", "avgpt"}
    gets = poll(lambda: minute_sum(broker.addr, "GROUP_GET_NUMS", key, N), 10, what="GROUP_GET_NUMS")
    assert gets["statsMinute"]["tps"] > 0
    assert gets["statsMinute"]["avgpt"] == float(N)  # messages per pull: one pull brought all N
    put_size = poll(lambda: minute_sum(broker.addr, "TOPIC_PUT_SIZE", TOPIC, size), 10, what="TOPIC_PUT_SIZE")
    assert put_size["statsMinute"]["avgpt"] == size / N
    poll(lambda: minute_sum(broker.addr, "GROUP_GET_SIZE", key, size), 10, what="GROUP_GET_SIZE")
    broker_puts = poll(lambda: minute_sum(broker.addr, "BROKER_PUT_NUMS", "DefaultCluster", N), 10,
                       what="BROKER_PUT_NUMS")
    assert broker_puts["statsMinute"]["avgpt"] == 0.0  # Java never counts times for the broker items
    poll(lambda: minute_sum(broker.addr, "BROKER_GET_NUMS", "DefaultCluster", N), 10, what="BROKER_GET_NUMS")

    # Nothing more happens: the minute window slides past the messages, the hour window (sampled
    # every 60 periods) has taken them in.
    idle = poll(lambda: minute_sum(broker.addr, "TOPIC_PUT_NUMS", TOPIC, 0), 10, what="an empty minute")
    assert idle["statsMinute"]["tps"] == 0.0
    hour = poll(lambda: (d := stats(broker.addr, "TOPIC_PUT_NUMS", TOPIC)) and d["statsHour"]["sum"] == N and d,
                20, what="the hour window")
    assert hour["statsHour"]["tps"] > 0

    # Refusals as Java's: an item nobody counted, an unknown stats name, a missing header field.
    for name, k in (("TOPIC_PUT_NUMS", "NoSuchTopic"), ("GROUP_GET_NUMS", f"{TOPIC}@NoSuchGroup"),
                    ("NO_SUCH_STATS", TOPIC), ("GROUP_GET_NUMS", TOPIC)):
        resp = rpc(broker.addr, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": name, "statsKey": k})
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{k}> not exist")
    resp = rpc(broker.addr, RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS"})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "statsKey" in (resp.remark or ""), resp

    # A deleted topic's items go with it (Java's onTopicDeleted).
    assert rpc(broker.addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": TOPIC}).code == ResponseCode.SUCCESS
    assert stats(broker.addr, "TOPIC_PUT_NUMS", TOPIC) is None
    assert stats(broker.addr, "GROUP_GET_NUMS", key) is None


def test_broker_consume_stats_lists_every_group(cluster: Cluster) -> None:
    broker = cluster.broker(None, name="broker-cs")
    create_topic(broker.addr, TOPIC, queues=2)
    t0 = int(time.time() * 1000)
    for i in range(N):
        assert send_raw(broker.addr, TOPIC, f"message {i}".encode()).code == ResponseCode.SUCCESS
    pull(broker.addr, TOPIC, GROUP)  # creates the group (autoCreateSubscriptionGroup)
    commit(broker.addr, TOPIC, GROUP, 2)

    doc = consume_stats_list(broker.addr)
    assert doc["brokerAddr"] == broker.addr
    assert doc["totalDiff"] == N - 2
    by_group = {g: v for entry in doc["consumeStatsList"] for g, v in entry.items()}
    assert all(len(entry) == 1 for entry in doc["consumeStatsList"])  # one single-key map per group
    assert "TOOLS_CONSUMER" in by_group and by_group["TOOLS_CONSUMER"] == []  # a group without offsets
    [mine] = by_group[GROUP]
    assert mine["consumeTps"] == N / 60  # the pull, over the last minute (as GET_CONSUME_STATS has it)
    q0, q1 = mine["offsetTable"][f"{TOPIC}/broker-cs/0"], mine["offsetTable"][f"{TOPIC}/broker-cs/1"]
    assert (q0["brokerOffset"], q0["consumerOffset"]) == (N, 2) and q0["lastTimestamp"] >= t0
    assert q1 == {"brokerOffset": 0, "consumerOffset": 0, "lastTimestamp": 0}

    ordered = consume_stats_list(broker.addr, "true")  # only order topics: ours is not one
    assert ordered["totalDiff"] == 0
    assert {g: v for entry in ordered["consumeStatsList"] for g, v in entry.items()}[GROUP] == []
    resp = rpc(broker.addr, RequestCode.GET_BROKER_CONSUME_STATS, {})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "isOrder" in (resp.remark or ""), resp



def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return code, out.splitlines()


def test_rmq_admin_stats_all_and_broker_consume_stats(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    ns = cluster.namesrv()
    # A minute window of 6 s: what the commands read stays in it while the test runs.
    broker = cluster.broker(ns.addr, name="broker-cli", statsSamplingInterval=1000)
    create_topic_and_wait(broker.addr, ns.addr, TOPIC, queues=2)
    create_topic_and_wait(broker.addr, ns.addr, "IdleStatsTopic", queues=1)
    for i in range(N):
        assert send_raw(broker.addr, TOPIC, f"message {i}".encode()).code == ResponseCode.SUCCESS
    pull(broker.addr, TOPIC, GROUP)
    commit(broker.addr, TOPIC, GROUP, 2)
    poll(lambda: minute_sum(broker.addr, "TOPIC_PUT_NUMS", TOPIC, N), 10, what="TOPIC_PUT_NUMS")
    poll(lambda: minute_sum(broker.addr, "GROUP_GET_NUMS", f"{TOPIC}@{GROUP}", N), 10, what="GROUP_GET_NUMS")

    _, lines = run_cli(capsys, "statsAll", "-n", ns.addr)
    assert lines[0].split() == ["#Topic", "#Consumer", "Group", "#Accumulation", "#InTPS", "#OutTPS",
                                "#InMsg24Hour", "#OutMsg24Hour"]
    assert lines[0].index("#Consumer Group") == 66  # mqadmin's columns: 64 wide, two spaces
    rows = {tuple(line.split()[:2]): line.split() for line in lines[1:]}
    backlog, in_tps, out_tps, in_24h, out_24h = rows[(TOPIC, GROUP)][2:]
    assert (backlog, in_24h, out_24h) == (str(N - 2), str(N), str(N))
    assert float(in_tps) > 0 and float(out_tps) > 0
    assert rows[("IdleStatsTopic", "0")] == ["IdleStatsTopic", "0", "0.00", "0", "NO_CONSUMER"]
    assert not any(key[0].startswith(("%RETRY%", "%DLQ%")) for key in rows)
    _, lines = run_cli(capsys, "statsAll", "-n", ns.addr, "-a")  # active topics only
    assert [line.split()[:2] for line in lines[1:]] == [[TOPIC, GROUP]]
    _, lines = run_cli(capsys, "statsAll", "-n", ns.addr, "-t", "IdleStatsTopic")
    assert [line.split()[0] for line in lines[1:]] == ["IdleStatsTopic"]

    _, lines = run_cli(capsys, "brokerConsumeStats", "-n", ns.addr, "-b", broker.addr)
    assert lines[0].split()[:3] == ["#Topic", "#Group", "#Broker"]
    # Queue 1 was never consumed (no last time): mqadmin leaves it out.
    [row] = [line.split() for line in lines[1:] if line.strip() and not line.startswith("Diff")]
    assert row[:7] == [TOPIC, GROUP, "broker-cli", "0", str(N), "2", str(N - 2)]
    assert lines[-1] == f"Diff Total: {N - 2}"
    _, lines = run_cli(capsys, "brokerConsumeStats", "-n", ns.addr, "-b", broker.addr, "-l", str(N))
    assert [line for line in lines[1:] if line.strip()] == [f"Diff Total: {N - 2}"]  # below the level
