"""The nameserver's admin requests against real processes: GET_TOPICS_BY_CLUSTER (224),
GET_SYSTEM_TOPIC_LIST_FROM_NS (304), the unit topic lists (311-313), GET_NAMESRV_CONFIG (319) and the
refused UPDATE_NAMESRV_CONFIG (318); rmq-admin ``topicList -c`` and ``getNamesrvConfig``."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import cast

import pytest

from rmqbroker.admin_cli import main as admin_main
from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from tests.conftest import Cluster
from tests.integration.helpers import poll, route, rpc, wait_route
from tests.support.procs import BrokerProc, Namesrv

# Java's TopicSysFlag bits
UNIT = 0x1
UNIT_SUB = 0x2


@dataclass
class TwoClusters:
    ns: Namesrv
    a: BrokerProc  # broker-a of ClusterA
    b: BrokerProc  # broker-b of ClusterB


def create_topic(broker: str, topic: str, sys_flag: int = 0) -> None:
    resp = rpc(broker, RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": "2", "writeQueueNums": "2", "perm": "6",
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": str(sys_flag)})
    assert resp.code == ResponseCode.SUCCESS, resp


def two_clusters(cluster: Cluster, **ns_kw: object) -> TwoClusters:
    ns = cluster.namesrv(**ns_kw)
    a = cluster.broker(ns.addr, name="broker-a", brokerClusterName="ClusterA")
    b = cluster.broker(ns.addr, name="broker-b", brokerClusterName="ClusterB")
    create_topic(a.addr, "OnA")
    create_topic(b.addr, "OnB")
    create_topic(a.addr, "Shared")
    create_topic(b.addr, "Shared")
    create_topic(a.addr, "UnitTopic", UNIT)
    create_topic(b.addr, "UnitSubTopic", UNIT_SUB)
    create_topic(a.addr, "UnitAndSub", UNIT | UNIT_SUB)
    for topic in ("OnA", "OnB", "UnitTopic", "UnitSubTopic", "UnitAndSub"):
        wait_route(ns.addr, topic)

    def shared_on_both() -> bool:
        r = route(ns.addr, "Shared")
        return r is not None and len(r["brokerDatas"]) == 2

    poll(shared_on_both, timeout=10, what="Shared routed to both brokers")
    return TwoClusters(ns, a, b)


def topic_list(ns: str, code: int, ext: dict[str, str] | None = None) -> dict[str, object]:
    resp = rpc(ns, code, ext)
    assert resp.code == ResponseCode.SUCCESS, resp
    body: dict[str, object] = json.loads(bytes(resp.body))
    return body


def topics(ns: str, code: int, ext: dict[str, str] | None = None) -> set[str]:
    body = topic_list(ns, code, ext)
    assert set(body) == {"topicList"}, body  # TopicList without brokerAddr, which fastjson leaves out
    listed = body["topicList"]
    assert isinstance(listed, list) and len(listed) == len(set(listed))
    return set(listed)


def test_topics_by_cluster(cluster: Cluster) -> None:
    c = two_clusters(cluster)
    on_a = topics(c.ns.addr, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "ClusterA"})
    on_b = topics(c.ns.addr, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "ClusterB"})
    assert {"OnA", "Shared", "UnitTopic", "UnitAndSub", "broker-a", "ClusterA_REPLY_TOPIC"} <= on_a
    assert {"OnB", "Shared", "UnitSubTopic", "broker-b", "ClusterB_REPLY_TOPIC"} <= on_b
    assert not {"OnB", "UnitSubTopic", "broker-b", "ClusterB_REPLY_TOPIC"} & on_a
    assert not {"OnA", "UnitTopic", "UnitAndSub", "broker-a", "ClusterA_REPLY_TOPIC"} & on_b
    # every topic of the nameserver is on one of the two clusters
    assert on_a | on_b == topics(c.ns.addr, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    # an unknown cluster has no topics (Java answers an empty list too)
    assert topics(c.ns.addr, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "NoSuchCluster"}) == set()


def test_system_topic_list(cluster: Cluster) -> None:
    c = two_clusters(cluster)
    body = topic_list(c.ns.addr, RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS)
    assert set(body) == {"topicList", "brokerAddr"}
    # the cluster and broker names, as Java; the address of the first broker, to ask it for its own
    assert sorted(cast(list[str], body["topicList"])) == ["ClusterA", "ClusterB", "broker-a", "broker-b"]
    assert body["brokerAddr"] == c.a.addr
    # ... which a Java admin client then asks (GET_SYSTEM_TOPIC_LIST_FROM_BROKER), failing if it cannot
    from_broker = topics(str(body["brokerAddr"]), RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER)
    assert {"TBW102", "SCHEDULE_TOPIC_XXXX", "OFFSET_MOVED_EVENT", "RMQ_SYS_TRANS_HALF_TOPIC", "ClusterA",
            "broker-a", "ClusterA_REPLY_TOPIC"} <= from_broker
    assert not {"OnA", "Shared", "broker-b"} & from_broker


def test_system_topic_list_without_brokers(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    # Java's TopicList with a null brokerAddr: left out
    assert topic_list(ns.addr, RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS) == {"topicList": []}


def test_unit_topic_lists(cluster: Cluster) -> None:
    c = two_clusters(cluster)
    assert topics(c.ns.addr, RequestCode.GET_UNIT_TOPIC_LIST) == {"UnitTopic", "UnitAndSub"}
    assert topics(c.ns.addr, RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST) == {"UnitSubTopic", "UnitAndSub"}
    assert topics(c.ns.addr, RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST) == {"UnitSubTopic"}


def test_unit_flags_from_a_raw_registration(cluster: Cluster) -> None:
    """A Java broker's registration body (not this broker's) carries the flag the lists follow."""
    ns = cluster.namesrv()
    table = {name: {"topicName": name, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicSysFlag": flag}
             for name, flag in (("RawPlain", 0), ("RawUnit", UNIT), ("RawSub", UNIT_SUB))}
    body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": table,
                                                       "dataVersion": {"timestamp": 1, "counter": 1}}}).encode()
    header = {"brokerName": "broker-x", "brokerAddr": "127.0.0.1:1", "clusterName": "ClusterX", "brokerId": "0",
              "haServerAddr": "127.0.0.1:2"}

    async def registered() -> list[RemotingCommand]:
        # One connection: the broker's routes go when the connection it registered on closes.
        client = RemotingClient()
        try:
            answers = [await client.invoke(ns.addr, RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=header,
                                                                    body=body), 5)]
            for code in (RequestCode.GET_UNIT_TOPIC_LIST, RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST,
                         RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST):
                answers.append(await client.invoke(ns.addr, RemotingCommand(code), 5))
            return answers
        finally:
            await client.close()

    reg, unit, sub, sub_ununit = asyncio.run(registered())
    assert reg.code == ResponseCode.SUCCESS
    assert set(json.loads(bytes(unit.body))["topicList"]) == {"RawUnit"}
    assert set(json.loads(bytes(sub.body))["topicList"]) == {"RawSub"}
    assert set(json.loads(bytes(sub_ununit.body))["topicList"]) == {"RawSub"}


def properties(text: str) -> dict[str, str]:
    """Java's properties text (as MixAll.string2Properties reads a nameserver's answer)."""
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith(("#", "!")):
            key, sep, value = line.partition("=")
            assert sep, line
            out[key] = value
    return out


def test_namesrv_config(cluster: Cluster) -> None:
    ns = cluster.namesrv(order_message_enable=True, expiry=90.0)
    resp = rpc(ns.addr, RequestCode.GET_NAMESRV_CONFIG)
    assert resp.code == ResponseCode.SUCCESS, resp
    text = bytes(resp.body).decode("utf-8")
    assert text.endswith("\n")
    config = properties(text)
    # Java's names where Java has the option
    assert config["listenPort"] == str(ns.port)
    assert config["kvConfigPath"] == str(ns.kv_config_path)
    assert config["orderMessageEnable"] == "true"
    assert config["listenHost"] == "127.0.0.1"
    assert config["brokerExpirySeconds"] == "90"

    plain = cluster.namesrv()
    config = properties(bytes(rpc(plain.addr, RequestCode.GET_NAMESRV_CONFIG).body).decode("utf-8"))
    assert config["orderMessageEnable"] == "false"
    assert config["listenPort"] == str(plain.port)


def test_update_namesrv_config_is_refused_and_the_connection_serves_on(cluster: Cluster) -> None:
    ns = cluster.namesrv()

    async def exchange() -> list[RemotingCommand]:
        client = RemotingClient()
        try:
            answers = []
            for cmd in (RemotingCommand(RequestCode.UPDATE_NAMESRV_CONFIG, body=b"orderMessageEnable=true\n"),
                        RemotingCommand(RequestCode.GET_TOPICS_BY_CLUSTER),  # no cluster field
                        RemotingCommand(RequestCode.GET_TOPICS_BY_CLUSTER, ext_fields={"clusterName": "C"}),
                        RemotingCommand(RequestCode.GET_NAMESRV_CONFIG),
                        RemotingCommand(RequestCode.GET_TOPICS_BY_CLUSTER, ext_fields={"cluster": "C"})):
                answers.append(await client.invoke(ns.addr, cmd, 5))
            return answers
        finally:
            await client.close()

    update, missing, wrong_name, config, ok = asyncio.run(exchange())
    assert update.code == ResponseCode.NO_PERMISSION
    assert "cannot be changed at run time" in (update.remark or "")
    assert "restart" in (update.remark or "") and "--order-message-enable" in (update.remark or "")
    for resp in (missing, wrong_name):
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert "<cluster>" in (resp.remark or "")
    # nothing changed, and the same connection still serves
    assert config.code == ResponseCode.SUCCESS
    assert properties(bytes(config.body).decode("utf-8"))["orderMessageEnable"] == "false"
    assert ok.code == ResponseCode.SUCCESS and json.loads(bytes(ok.body)) == {"topicList": []}


def run_admin(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = admin_main(list(argv))
    out, err = capsys.readouterr()
    return code, out.strip(), err.strip()


def commit_offset(broker: str, group: str, topic: str) -> None:
    resp = rpc(broker, RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": "0",
                                                            "commitOffset": "0"})
    assert resp.code == ResponseCode.SUCCESS, resp


def test_admin_topic_list_cluster_model(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    c = two_clusters(cluster)
    commit_offset(c.a.addr, "CG_A", "OnA")
    commit_offset(c.a.addr, "CG_A2", "OnA")
    commit_offset(c.b.addr, "CG_SHARED", "Shared")  # on broker-b only: every broker of the route is asked
    create_topic(c.a.addr, "%RETRY%CG_A")
    create_topic(c.a.addr, "%DLQ%CG_A")
    wait_route(c.ns.addr, "%DLQ%CG_A")

    code, out, err = run_admin(capsys, "topicList", "-n", c.ns.addr, "-c")
    assert (code, err) == (0, ""), err
    lines = out.splitlines()
    assert lines[0].split() == ["#Cluster", "Name", "#Topic", "#Consumer", "Group"]
    rows = [line.split() for line in lines[1:]]
    assert ["ClusterA", "OnA", "CG_A"] in rows and ["ClusterA", "OnA", "CG_A2"] in rows
    assert ["ClusterB", "OnB"] in rows  # no consumer group: an empty column
    assert ["ClusterA", "UnitTopic"] in rows and ["ClusterB", "UnitSubTopic"] in rows
    # a topic on both clusters is shown with its route's first broker's cluster, as mqadmin does
    assert ["ClusterA", "Shared", "CG_SHARED"] in rows
    assert not [r for r in rows if r[1].startswith(("%RETRY%", "%DLQ%"))]
    every = topics(c.ns.addr, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    assert {r[1] for r in rows} == {t for t in every if not t.startswith(("%RETRY%", "%DLQ%"))}

    # without -c: the names only, retry and DLQ topics too
    code, out, _ = run_admin(capsys, "topicList", "-n", c.ns.addr)
    assert code == 0
    assert {"OnA", "OnB", "Shared", "%RETRY%CG_A", "%DLQ%CG_A"} <= set(out.splitlines())
    assert "ClusterA " not in out


def test_admin_get_namesrv_config(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    ns1 = cluster.namesrv(order_message_enable=True)
    ns2 = cluster.namesrv()
    code, out, err = run_admin(capsys, "getNamesrvConfig", "-n", f"{ns1.addr};{ns2.addr}")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"============{ns1.addr}============"
    second = lines.index(f"============{ns2.addr}============")

    def shown(block: list[str]) -> dict[str, str]:
        # mqadmin's layout: the key padded to 50 columns, then "=  " and the value
        out = {}
        for line in block:
            assert line[50:53] == "=  ", line
            out[line[:50].strip()] = line[53:]
        return out

    one, two = shown(lines[1:second]), shown(lines[second + 1:])
    assert one["listenPort"] == str(ns1.port) and two["listenPort"] == str(ns2.port)
    assert one["orderMessageEnable"] == "true" and two["orderMessageEnable"] == "false"
    assert one["kvConfigPath"] == str(ns1.kv_config_path)

    ns2.stop()
    code, _, err = run_admin(capsys, "getNamesrvConfig", "-n", f"{ns1.addr};{ns2.addr}")
    assert code == 1 and ns2.addr in err


def test_a_compressed_registration_is_inflated_no_further_than_its_limit(cluster: Cluster) -> None:
    """A few kilobytes of zlib can inflate to gigabytes: the nameserver stops at MAX_REGISTER_BODY,
    answers SYSTEM_ERROR with the reason and keeps serving."""
    import zlib

    from rmqbroker.namesrv.processor import MAX_REGISTER_BODY

    ns = cluster.namesrv()
    header = {"brokerName": "broker-z", "brokerAddr": "127.0.0.1:1", "clusterName": "ClusterZ", "brokerId": "0",
              "haServerAddr": "127.0.0.1:2", "compressed": "true"}
    bomb = zlib.compress(bytes(MAX_REGISTER_BODY + 1), 9)
    assert len(bomb) < 100_000
    resp = rpc(ns.addr, RequestCode.REGISTER_BROKER, header, body=bomb, timeout=30)
    assert resp.code == ResponseCode.SYSTEM_ERROR and f"more than {MAX_REGISTER_BODY} bytes" in (resp.remark or "")
    resp = rpc(ns.addr, RequestCode.REGISTER_BROKER, header, body=b"not zlib")
    assert resp.code == ResponseCode.SYSTEM_ERROR and "not a zlib stream" in (resp.remark or "")
    assert topic_list(ns.addr, RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS) == {"topicList": []}  # still serving
