"""A second client implementation against a broker group: ali-ons, a pure-JavaScript port of
RocketMQ 4.x's Java client (npm), written independently of the C++ client the other tests use.
SEND_MESSAGE_V2 from a SYNC_MASTER, tag and SQL92 subscriptions, keys and user properties, delay
levels, ACTION_RETRY through CONSUMER_SEND_MSG_BACK and the group's retry topic, offsets committed
and read back by a restarted consumer, the fallback to the slave when the master is gone, and the
slave handing the offsets committed to it then to the returned master. Real nameserver and broker
processes on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rmqbroker.remoting.codes import RequestCode
from tests.conftest import Cluster
from tests.integration.helpers import create_topic_and_wait, poll, query_consumer_offset, rpc, wait_caught_up
from tests.integration.test_replication_extra import _slave_serves, broker_addrs, group, ha_addr
from tests.support import node_client
from tests.support.procs import BrokerProc, Namesrv

DELAY_LEVELS = "1s 2s 3s 4s"  # a retry is sent back at level 3 + reconsumeTimes


@pytest.fixture(scope="session")
def ons() -> Path:
    """node_modules holding ali-ons (installed from npm once)."""
    return node_client.install()


def produce(ons: Path, ns: str, messages: list[dict[str, Any]], group_name: str = "PG_ONS") -> list[dict[str, Any]]:
    code, out, log = node_client.run(ons, "produce", {"namesrv": ns, "group": group_name, "messages": messages})
    assert code == 0 and out is not None, log
    result: list[dict[str, Any]] = out
    return result


def consume(ons: Path, ns: str, group_name: str, topic: str, count: int, expression: Any = "*",
            timeout_ms: int = 30000, settle_ms: int = 1500, retry_once: list[str] | None = None,
            ) -> tuple[bool, list[dict[str, Any]], str]:
    code, out, log = node_client.run(ons, "consume", {
        "namesrv": ns, "group": group_name, "topic": topic, "expression": expression, "count": count,
        "timeoutMs": timeout_ms, "settleMs": settle_ms, "retryOnce": retry_once or []},
        timeout=timeout_ms / 1000 + 60)
    assert out is not None, log
    return code == 0, out, log


def max_offsets(broker: BrokerProc, topic: str, queues: int) -> list[int]:
    return [int(rpc(broker.addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(q)})
                .ext_fields["offset"]) for q in range(queues)]


def test_ali_ons_sends_to_a_sync_master_and_consumes_by_tag_with_keys_and_properties(
        cluster: Cluster, ons: Path) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-r", role="SYNC_MASTER")
    slave = cluster.broker(ns.addr, name="broker-r", broker_id=1, role="SLAVE", haMasterAddress=ha_addr(master),
                           slaveSyncInitialDelay=300, slaveSyncInterval=1000)
    topic, queues = "OnsTagTopic", 4
    create_topic_and_wait(master.addr, ns.addr, topic, queues)
    messages = [{"topic": topic, "tags": "TagA" if i % 2 == 0 else "TagB", "body": f"ons-{i}",
                 "keys": [f"k{i}", f"order-{i}"], "props": {"shop": f"s{i % 3}"}} for i in range(24)]
    sent = produce(ons, ns.addr, messages)
    assert [r["status"] for r in sent] == ["SEND_OK"] * 24
    # Every send was acknowledged by the slave before SEND_OK (SYNC_MASTER): it holds all of them.
    assert master.status()["ha"]["slaves"], master.status()
    wait_caught_up(master, [slave], timeout=5)

    ok, got, log = consume(ons, ns.addr, "CG_ONS_TAG", topic, 12, expression="TagA || TagC")
    assert ok, log
    assert sorted(d["body"] for d in got) == sorted(f"ons-{i}" for i in range(0, 24, 2))
    by_body = {d["body"]: d for d in got}
    for i in range(0, 24, 2):
        d = by_body[f"ons-{i}"]
        assert d["tags"] == "TagA" and d["keys"] == f"k{i} order-{i}" and d["props"]["shop"] == f"s{i % 3}"
        assert d["topic"] == topic
        want = next(r for r in sent if r["queueOffset"] == d["queueOffset"] and r["queueId"] == d["queueId"])
        assert want is sent[i], (d, want)

    # The consumer committed its offsets to the master (UPDATE_CONSUMER_OFFSET): every queue's end.
    ends = max_offsets(master, topic, queues)
    assert [query_consumer_offset(master.addr, "CG_ONS_TAG", topic, q) for q in range(queues)] == ends
    # ... the slave's metadata sync copies them ...
    poll(lambda: [query_consumer_offset(slave.addr, "CG_ONS_TAG", topic, q) for q in range(queues)] == ends, 10,
         what="the slave synced the consumer's offsets")
    # ... and a restarted consumer of the group gets nothing again.
    ok, again, log = consume(ons, ns.addr, "CG_ONS_TAG", topic, 1, expression="TagA", timeout_ms=4000)
    assert not ok and again == [], log


def test_ali_ons_delay_levels_and_retry_through_the_groups_retry_topic(cluster: Cluster, ons: Path) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, messageDelayLevel=DELAY_LEVELS)
    topic = "OnsRetryTopic"
    create_topic_and_wait(master.addr, ns.addr, topic, 2)
    sent = produce(ons, ns.addr, [
        {"topic": topic, "tags": "T", "body": "plain"},
        {"topic": topic, "tags": "T", "body": "delayed", "delayLevel": 2},
        {"topic": topic, "tags": "T", "body": "fails-once"},
    ])
    assert [r["status"] for r in sent] == ["SEND_OK"] * 3
    # "fails-once" is answered ACTION_RETRY: ali-ons sends it back (CONSUMER_SEND_MSG_BACK, delay level
    # 0 = the broker's choice: 3 + reconsumeTimes = 3 s here) and gets it again from %RETRY%CG_ONS_RETRY.
    ok, got, log = consume(ons, ns.addr, "CG_ONS_RETRY", topic, 4, retry_once=["fails-once"], timeout_ms=40000)
    assert ok, log
    bodies = sorted(d["body"] for d in got)
    assert bodies == ["delayed", "fails-once", "fails-once", "plain"], got
    delayed = next(d for d in got if d["body"] == "delayed")
    assert delayed["receivedAt"] - delayed["bornTimestamp"] >= 1900, delayed  # level 2 = 2 s
    first, second = (d for d in got if d["body"] == "fails-once")
    assert first["reconsumeTimes"] == 0 and second["reconsumeTimes"] == 1, (first, second)
    assert second["receivedAt"] - first["receivedAt"] >= 2900, (first, second)  # level 3 = 3 s
    assert second["topic"] == topic  # the client restores the original topic (RETRY_TOPIC property)
    assert second["props"].get("RETRY_TOPIC") == topic, second
    # The retry went through the group's retry topic on the broker, not a re-send to the topic.
    retry_topic = "%RETRY%CG_ONS_RETRY"
    assert max_offsets(master, retry_topic, 1) == [1]
    assert sum(max_offsets(master, topic, 2)) == 3


def sent_then_master_down(cluster: Cluster, ons: Path, topic: str, queues: int,
                          bodies: list[str]) -> tuple[Namesrv, BrokerProc, BrokerProc]:
    """A master and a slave (slaveReadEnable) holding ``bodies`` sent with ali-ons; then the master
    is killed (-9) and the nameserver routes only the slave."""
    ns = cluster.namesrv()
    master, slave = group(cluster, ns.addr, 2, slaveReadEnable="true", slaveSyncInitialDelay=300,
                          slaveSyncInterval=1000)
    create_topic_and_wait(master.addr, ns.addr, topic, queues)
    sent = produce(ons, ns.addr, [{"topic": topic, "body": b} for b in bodies])
    assert all(r["status"] == "SEND_OK" for r in sent)
    wait_caught_up(master, [slave])
    # The slave has every message in its consume queues and knows the topic (its metadata sync) before
    # the master goes: a topic the slave never synced is TOPIC_NOT_EXIST there, as in Java.
    poll(lambda: _slave_serves(master, slave, topic, queues), 20, what="slave serves every queue")
    master.kill9()
    poll(lambda: broker_addrs(ns.addr, topic) == {"1": slave.addr}, 10, what="route lists only the slave")
    return ns, master, slave


def test_ali_ons_reads_from_the_slave_while_the_master_is_down(cluster: Cluster, ons: Path) -> None:
    topic, queues = "OnsFallbackTopic", 4
    bodies = [f"fb-{i}" for i in range(30)]
    ns, _, slave = sent_then_master_down(cluster, ons, topic, queues, bodies)
    ok, got, log = consume(ons, ns.addr, "CG_ONS_FALLBACK", topic, len(bodies))
    assert ok, log
    assert sorted(d["body"] for d in got) == sorted(bodies)
    # Offsets were committed to the slave (the only broker of the group left).
    assert [query_consumer_offset(slave.addr, "CG_ONS_FALLBACK", topic, q) for q in range(queues)] == \
        max_offsets(slave, topic, queues)


def test_ali_ons_sql92_subscription(cluster: Cluster, ons: Path) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, enablePropertyFilter="true")
    topic = "OnsSqlTopic"
    create_topic_and_wait(master.addr, ns.addr, topic, 2)
    produce(ons, ns.addr, [{"topic": topic, "tags": "T", "body": f"sql-{i}", "props": {"n": str(i)}}
                           for i in range(10)])
    expr = {"expressionType": "SQL92", "subString": "n IS NOT NULL AND n >= 7"}
    ok, got, log = consume(ons, ns.addr, "CG_ONS_SQL", topic, 3, expression=expr)
    assert ok, log
    assert sorted(d["body"] for d in got) == ["sql-7", "sql-8", "sql-9"]


def test_ali_ons_commits_to_the_slave_during_an_outage_reach_the_returned_master(
        cluster: Cluster, ons: Path) -> None:
    """The group consumes from the slave while the master is down, committing there (ali-ons, like
    the Java client, commits to the lowest brokerId in its route). The master comes back without
    them; the slave hands them over, so the group restarted against the master does not consume
    the outage's messages again."""
    topic, queues = "OnsOutageTopic", 2
    bodies = [f"out-{i}" for i in range(20)]
    ns, master, slave = sent_then_master_down(cluster, ons, topic, queues, bodies)
    ok, got, log = consume(ons, ns.addr, "CG_ONS_OUTAGE", topic, len(bodies))
    assert ok and sorted(d["body"] for d in got) == sorted(bodies), log
    ends = max_offsets(slave, topic, queues)
    assert [query_consumer_offset(slave.addr, "CG_ONS_OUTAGE", topic, q) for q in range(queues)] == ends

    master.start()
    poll(lambda: broker_addrs(ns.addr, topic) == {"0": master.addr, "1": slave.addr}, 20,
         what="the master routed again")
    poll(lambda: [query_consumer_offset(master.addr, "CG_ONS_OUTAGE", topic, q) for q in range(queues)] == ends,
         15, what="the slave handed the group's offsets to the master")
    ok, again, log = consume(ons, ns.addr, "CG_ONS_OUTAGE", topic, 1, timeout_ms=4000)
    assert not ok and again == [], log
