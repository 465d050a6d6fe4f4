"""The nameserver's KV config against real processes: PUT/GET/DELETE_KV_CONFIG and
GET_KVLIST_BY_NAMESPACE, ``kvConfig.json`` on disk and across a restart, malformed requests,
``orderTopicConf`` in routes, and rmq-admin's updateKvConfig / deleteKvConfig / updateOrderConf."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rmqbroker.admin_cli import main as admin_main
from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from tests.conftest import Cluster
from tests.integration.helpers import PY, create_topic, message, produce, route, rpc, wait_route
from tests.support.procs import free_port

ORDER_NS = "ORDER_TOPIC_CONFIG"


def put(ns: str, namespace: str, key: str, value: str) -> None:
    resp = rpc(ns, RequestCode.PUT_KV_CONFIG, {"namespace": namespace, "key": key, "value": value})
    assert resp.code == ResponseCode.SUCCESS, resp


def get(ns: str, namespace: str, key: str) -> str | None:
    resp = rpc(ns, RequestCode.GET_KV_CONFIG, {"namespace": namespace, "key": key})
    if resp.code == ResponseCode.QUERY_NOT_FOUND:
        assert resp.remark == f"No config item, Namespace: {namespace} Key: {key}"
        return None
    assert resp.code == ResponseCode.SUCCESS, resp
    return resp.ext_fields["value"]


def delete(ns: str, namespace: str, key: str) -> None:
    resp = rpc(ns, RequestCode.DELETE_KV_CONFIG, {"namespace": namespace, "key": key})
    assert resp.code == ResponseCode.SUCCESS, resp


def kv_list(ns: str, namespace: str) -> dict[str, str] | None:
    resp = rpc(ns, RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": namespace})
    if resp.code == ResponseCode.QUERY_NOT_FOUND:
        assert resp.remark == f"No config item, Namespace: {namespace}"
        return None
    assert resp.code == ResponseCode.SUCCESS, resp
    body = json.loads(bytes(resp.body))
    assert set(body) == {"table"}
    table: dict[str, str] = body["table"]
    return table


def on_disk(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def test_kv_round_trip_and_file(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    path = ns.kv_config_path
    assert not path.exists()  # nothing written before the first change
    assert get(ns.addr, "NS1", "k1") is None
    assert kv_list(ns.addr, "NS1") is None

    put(ns.addr, "NS1", "k1", "v1")
    put(ns.addr, "NS1", "k2", "v2 with spaces; and ünïcode")
    put(ns.addr, "NS2", "k1", "other")
    assert get(ns.addr, "NS1", "k1") == "v1"
    assert get(ns.addr, "NS1", "k2") == "v2 with spaces; and ünïcode"
    assert get(ns.addr, "NS2", "k1") == "other"
    assert get(ns.addr, "NS2", "k2") is None
    assert kv_list(ns.addr, "NS1") == {"k1": "v1", "k2": "v2 with spaces; and ünïcode"}
    assert kv_list(ns.addr, "NS2") == {"k1": "other"}
    assert on_disk(path) == {"configTable": {"NS1": {"k1": "v1", "k2": "v2 with spaces; and ünïcode"},
                                             "NS2": {"k1": "other"}}}

    put(ns.addr, "NS1", "k1", "v1-new")  # replaces
    assert get(ns.addr, "NS1", "k1") == "v1-new"
    assert on_disk(path)["configTable"]["NS1"]["k1"] == "v1-new"

    delete(ns.addr, "NS1", "k1")
    delete(ns.addr, "NS1", "never-there")  # SUCCESS as with Java
    assert get(ns.addr, "NS1", "k1") is None
    assert kv_list(ns.addr, "NS1") == {"k2": "v2 with spaces; and ünïcode"}
    delete(ns.addr, "NS2", "k1")
    assert kv_list(ns.addr, "NS2") is None  # its last entry gone: no such namespace
    assert on_disk(path) == {"configTable": {"NS1": {"k2": "v2 with spaces; and ünïcode"}}}
    # written whole through a temporary file, the previous content kept as .bak
    assert not path.with_name("kvConfig.json.tmp").exists()
    assert on_disk(path.with_name("kvConfig.json.bak"))["configTable"]["NS2"] == {"k1": "other"}


def test_kv_survives_restart_and_reads_java_files(cluster: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "shared" / "kvConfig.json"
    path.parent.mkdir()
    # What a Java nameserver (fastjson) leaves: compact, and not every value a string.
    path.write_text('{"configTable":{"ORDER_TOPIC_CONFIG":{"OldTopic":"broker-a:4;broker-b:4"},'
                    '"JAVA":{"n":8,"flag":true}}}')
    ns = cluster.namesrv(kv_config_path=path)
    assert get(ns.addr, ORDER_NS, "OldTopic") == "broker-a:4;broker-b:4"
    assert kv_list(ns.addr, "JAVA") == {"n": "8", "flag": "true"}
    put(ns.addr, "NS", "k", "v")
    delete(ns.addr, "JAVA", "flag")

    assert ns.stop() == 0
    assert on_disk(path)["configTable"]["NS"] == {"k": "v"}
    ns.start()  # a new process on the same file
    assert get(ns.addr, "NS", "k") == "v"
    assert get(ns.addr, ORDER_NS, "OldTopic") == "broker-a:4;broker-b:4"
    assert kv_list(ns.addr, "JAVA") == {"n": "8"}

    ns.kill9()  # no shutdown step either: every answered change is on disk already
    put_after = path.read_text()
    ns.start()
    assert path.read_text() == put_after
    assert get(ns.addr, "NS", "k") == "v"


def test_corrupt_kv_file_stops_the_start_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    path.write_text('{"configTable":{"NS":{"k":')
    proc = subprocess.run([PY, "-m", "rmqbroker.namesrv.main", "--listen", f"127.0.0.1:{free_port()}",
                           "--kv-config-path", str(path)], check=False, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2, proc
    assert "cannot load the KV config" in proc.stderr and str(path) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert path.read_text() == '{"configTable":{"NS":{"k":'  # left for the operator to repair


def test_kv_requests_missing_fields(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    cases: list[tuple[int, dict[str, str], str]] = [
        (RequestCode.PUT_KV_CONFIG, {"key": "k", "value": "v"}, "namespace"),
        (RequestCode.PUT_KV_CONFIG, {"namespace": "NS", "value": "v"}, "key"),
        (RequestCode.PUT_KV_CONFIG, {"namespace": "NS", "key": "k"}, "value"),
        (RequestCode.GET_KV_CONFIG, {"key": "k"}, "namespace"),
        (RequestCode.GET_KV_CONFIG, {"namespace": "NS"}, "key"),
        (RequestCode.DELETE_KV_CONFIG, {"namespace": "NS"}, "key"),
        (RequestCode.DELETE_KV_CONFIG, {"key": "k"}, "namespace"),
        (RequestCode.GET_KVLIST_BY_NAMESPACE, {}, "namespace"),
    ]

    async def exchange() -> list[RemotingCommand]:
        client = RemotingClient()
        try:
            answers = []
            for code, ext, _ in cases:
                answers.append(await client.invoke(ns.addr, RemotingCommand(code, ext_fields=ext), 5))
            # the same connection still serves
            ok = RemotingCommand(RequestCode.PUT_KV_CONFIG, ext_fields={"namespace": "NS", "key": "k",
                                                                         "value": "v"})
            answers.append(await client.invoke(ns.addr, ok, 5))
            answers.append(await client.invoke(ns.addr, RemotingCommand(
                RequestCode.GET_KV_CONFIG, ext_fields={"namespace": "NS", "key": "k"}), 5))
            return answers
        finally:
            await client.close()

    answers = asyncio.run(exchange())
    for (code, _, field), resp in zip(cases, answers, strict=False):
        assert resp.code == ResponseCode.SYSTEM_ERROR, (code, resp)
        assert f"<{field}>" in (resp.remark or ""), (code, resp.remark)
    assert answers[-2].code == ResponseCode.SUCCESS
    assert answers[-1].code == ResponseCode.SUCCESS and answers[-1].ext_fields["value"] == "v"
    # nothing half-applied by the refused puts
    assert kv_list(ns.addr, "NS") == {"k": "v"}


def test_kv_write_failure_is_answered_and_changes_nothing(cluster: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "kv" / "kvConfig.json"
    path.with_name("kvConfig.json.tmp").mkdir(parents=True)  # where the new content would be written first
    ns = cluster.namesrv(kv_config_path=path)
    resp = rpc(ns.addr, RequestCode.PUT_KV_CONFIG, {"namespace": "NS", "key": "k", "value": "v"})
    assert resp.code == ResponseCode.SYSTEM_ERROR
    assert "KV config not saved" in (resp.remark or "")
    assert get(ns.addr, "NS", "k") is None
    assert not path.exists()


def test_order_topic_conf_in_routes(cluster: Cluster) -> None:
    ordered = cluster.namesrv(order_message_enable=True)
    plain = cluster.namesrv()
    broker = cluster.broker(f"{ordered.addr};{plain.addr}", name="broker-a")
    for topic in ("OrderedTopic", "OtherTopic"):
        create_topic(broker.addr, topic, queues=2)
        for ns in (ordered, plain):
            wait_route(ns.addr, topic)

    r = route(ordered.addr, "OrderedTopic")
    assert r is not None and "orderTopicConf" not in r  # null is left out, as Java does

    put(ordered.addr, ORDER_NS, "OrderedTopic", "broker-a:1")
    put(plain.addr, ORDER_NS, "OrderedTopic", "broker-a:1")
    r = route(ordered.addr, "OrderedTopic")
    assert r is not None and r["orderTopicConf"] == "broker-a:1"
    assert [q["brokerName"] for q in r["queueDatas"]] == ["broker-a"]  # the rest of the route is unchanged
    other = route(ordered.addr, "OtherTopic")
    assert other is not None and "orderTopicConf" not in other
    # without orderMessageEnable the entry stays out of routes
    r = route(plain.addr, "OrderedTopic")
    assert r is not None and "orderTopicConf" not in r

    # The stock C++ producer follows it: one queue of broker-a only, instead of both.
    assert max_offsets(broker.addr, "OrderedTopic") == [0, 0]
    produce(ordered.addr, [message("OrderedTopic", f"o{i}") for i in range(4)])
    assert max_offsets(broker.addr, "OrderedTopic") == [4, 0]
    produce(plain.addr, [message("OrderedTopic", f"p{i}") for i in range(4)])
    assert max_offsets(broker.addr, "OrderedTopic") == [6, 2]

    # A broker's registration is answered with the namespace, as Java's (a Java broker sets its
    # topics' order flag from it).
    reg = rpc(ordered.addr, RequestCode.REGISTER_BROKER,
              {"brokerName": "broker-x", "brokerAddr": "127.0.0.1:1", "clusterName": "C", "brokerId": "0",
               "haServerAddr": "127.0.0.1:2"})
    assert reg.code == ResponseCode.SUCCESS
    assert json.loads(bytes(reg.body)) == {"table": {"OrderedTopic": "broker-a:1"}}

    delete(ordered.addr, ORDER_NS, "OrderedTopic")
    r = route(ordered.addr, "OrderedTopic")
    assert r is not None and "orderTopicConf" not in r


def max_offsets(broker: str, topic: str, queues: int = 2) -> list[int]:
    out = []
    for qid in range(queues):
        resp = rpc(broker, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(qid)})
        assert resp.code == ResponseCode.SUCCESS, resp
        out.append(int(resp.ext_fields["offset"]))
    return out


def run_admin(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = admin_main(list(argv))
    out, err = capsys.readouterr()
    return code, out.strip(), err.strip()


def test_admin_cli_kv_commands(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    ns1 = cluster.namesrv(order_message_enable=True)
    ns2 = cluster.namesrv()
    both = ("-n", f"{ns1.addr};{ns2.addr}")

    assert run_admin(capsys, "updateKvConfig", *both, "-s", "NS", "-k", "k", "-v", " v1 ") == \
        (0, "create or update kv config to namespace success.", "")
    for ns in (ns1, ns2):  # every nameserver keeps its own table
        assert get(ns.addr, "NS", "k") == "v1"
    assert run_admin(capsys, "deleteKvConfig", *both, "--namespace", "NS", "--key", "k") == \
        (0, "delete kv config from namespace success.", "")
    for ns in (ns1, ns2):
        assert get(ns.addr, "NS", "k") is None

    assert run_admin(capsys, "updateOrderConf", *both, "-t", "T1", "-v", "broker-a:4;broker-b:4", "-m", "put") == \
        (0, "update orderConf success. topic=[T1], orderConf=[broker-a:4;broker-b:4]", "")
    for ns in (ns1, ns2):
        assert get(ns.addr, ORDER_NS, "T1") == "broker-a:4;broker-b:4"
    assert run_admin(capsys, "updateOrderConf", *both, "-t", "T1", "-m", "get") == \
        (0, "get orderConf success. topic=[T1], orderConf=[broker-a:4;broker-b:4]", "")
    code, _, err = run_admin(capsys, "updateOrderConf", *both, "-t", "T1", "-m", "put")
    assert code == 1 and "please set orderConf with option -v." in err
    assert run_admin(capsys, "updateOrderConf", *both, "-t", "T1", "-m", "delete") == \
        (0, "delete orderConf success. topic=[T1]", "")
    for ns in (ns1, ns2):
        assert get(ns.addr, ORDER_NS, "T1") is None
    code, _, err = run_admin(capsys, "updateOrderConf", *both, "-t", "T1", "-m", "get")
    assert code == 1 and "No config item, Namespace: ORDER_TOPIC_CONFIG Key: T1" in err

    # mqadmin's required options
    with pytest.raises(SystemExit):
        admin_main(["updateKvConfig", *both, "-s", "NS", "-k", "k"])
    with pytest.raises(SystemExit):
        admin_main(["updateOrderConf", *both, "-t", "T1", "-m", "list"])
    capsys.readouterr()

    # A nameserver down: the others still get the change, and the command fails naming it.
    ns2.stop()
    code, _, err = run_admin(capsys, "updateKvConfig", *both, "-s", "NS", "-k", "k2", "-v", "v2")
    assert code == 1 and ns2.addr in err
    assert get(ns1.addr, "NS", "k2") == "v2"
