"""UPDATE_BROKER_CONFIG (25, mqadmin updateBrokerConfig) against real processes: live keys apply at
once and are saved to the broker's -c file in place, other keys are saved for the next start, bad
or forbidden changes change nothing, and a read-only file keeps live changes until restart only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmqbroker.admin_cli import main as rmq_admin
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from tests.conftest import Cluster
from tests.integration.helpers import create_topic_and_wait, poll, route, rpc, send_raw
from tests.support.procs import BrokerProc

TOPIC = "ConfTopic"
COMMENT = "# maintained by hand: keep this line\n"


def update(broker: BrokerProc, body: str) -> RemotingCommand:
    return rpc(broker.addr, RequestCode.UPDATE_BROKER_CONFIG, body=body.encode())


def shown(broker: BrokerProc) -> dict[str, str]:
    """GET_BROKER_CONFIG's answer as key -> value."""
    resp = rpc(broker.addr, RequestCode.GET_BROKER_CONFIG)
    assert resp.code == ResponseCode.SUCCESS, resp
    return dict(line.split("=", 1) for line in bytes(resp.body).decode().splitlines() if line)


def route_perms(namesrv: str, topic: str) -> set[int]:
    r = route(namesrv, topic)
    assert r is not None
    return {int(q["perm"]) for q in r["queueDatas"]}


def restart(broker: BrokerProc) -> None:
    broker.stop()
    broker.start()


def commented_broker(cluster: Cluster, namesrv: str | None, env: dict[str, str] | None = None,
                     ) -> tuple[BrokerProc, str]:
    """A broker whose broker.conf starts with a comment; the file's text as started."""
    broker = cluster.broker(namesrv, start=False)
    broker.env.update(env or {})
    broker.conf_path.write_text(COMMENT + broker.conf_path.read_text())
    broker.start()
    return broker, broker.conf_path.read_text()


def test_broker_permission_stops_writes_at_once_and_is_kept(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    broker, original = commented_broker(cluster, ns.addr)
    create_topic_and_wait(broker.addr, ns.addr, TOPIC)
    assert send_raw(broker.addr, TOPIC, b"before").code == ResponseCode.SUCCESS
    broker.conf_path.chmod(0o640)
    original_mode = broker.conf_path.stat().st_mode & 0o777

    resp = update(broker, "brokerPermission=4\n")
    assert resp.code == ResponseCode.SUCCESS, resp
    assert "applied now: brokerPermission=4" in (resp.remark or "") and str(broker.conf_path) in (resp.remark or "")
    # At once: the answer came after the nameserver took the new registration.
    assert route_perms(ns.addr, TOPIC) == {4}
    refused = send_raw(broker.addr, TOPIC, b"during")
    assert (refused.code, refused.remark) == (ResponseCode.NO_PERMISSION,
                                              "the broker[127.0.0.1] sending message is forbidden")
    assert shown(broker)["brokerPermission"] == "4"
    assert broker.status()["brokerPermission"] == 4
    # Saved in place: the comment and every other line as they were, the new key appended.
    assert broker.conf_path.read_text() == original + "brokerPermission=4\n"
    assert broker.conf_path.stat().st_mode & 0o777 == original_mode

    restart(broker)
    assert shown(broker)["brokerPermission"] == "4"
    assert send_raw(broker.addr, TOPIC, b"after restart").code == ResponseCode.NO_PERMISSION
    poll(lambda: route_perms(ns.addr, TOPIC) == {4}, 10, what="route perm 4 after restart")

    resp = update(broker, "brokerPermission=6")
    assert resp.code == ResponseCode.SUCCESS, resp
    assert route_perms(ns.addr, TOPIC) == {6}
    assert send_raw(broker.addr, TOPIC, b"again").code == ResponseCode.SUCCESS
    # The line is rewritten where it is, not appended a second time.
    assert broker.conf_path.read_text() == original + "brokerPermission=6\n"


def test_a_key_read_at_start_up_is_saved_for_the_next_start(cluster: Cluster) -> None:
    broker, original = commented_broker(cluster, None, env={"RMQ_BROKER_FILTER_SUPPORT_RETRY": "false"})
    create = {"topic": TOPIC, "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"}
    assert rpc(broker.addr, RequestCode.UPDATE_AND_CREATE_TOPIC, create).code == ResponseCode.SUCCESS
    big = b"x" * 4096

    resp = update(broker, "maxMessageSize=2048\nslaveReadEnable=true\nfilterSupportRetry=true\n")
    assert resp.code == ResponseCode.SUCCESS, resp
    remark = resp.remark or ""
    assert "applied now: slaveReadEnable=true, filterSupportRetry=true" in remark
    assert "applied after a restart: maxMessageSize=2048" in remark
    # A key the environment sets too: the file's value will not be the one used at the next start.
    assert "filterSupportRetry is also set by the environment variable RMQ_BROKER_FILTER_SUPPORT_RETRY" in remark
    now = shown(broker)
    assert now["maxMessageSize"] == "4194304" and now["slaveReadEnable"] == "true"
    assert send_raw(broker.addr, TOPIC, big).code == ResponseCode.SUCCESS  # not applied live
    assert broker.conf_path.read_text() == (original + "maxMessageSize=2048\nslaveReadEnable=true\n"
                                            "filterSupportRetry=true\n")

    restart(broker)
    after = shown(broker)
    assert after["maxMessageSize"] == "2048" and after["slaveReadEnable"] == "true"
    assert after["filterSupportRetry"] == "false"  # the environment still wins
    assert send_raw(broker.addr, TOPIC, big).code == ResponseCode.MESSAGE_ILLEGAL


@pytest.mark.parametrize(("body", "code", "words"), [
    ("noSuchKey=1", ResponseCode.SYSTEM_ERROR, ["noSuchKey", "not a broker setting"]),
    ("brokerPermission=abc", ResponseCode.SYSTEM_ERROR, ["brokerPermission", "expected an integer"]),
    ("brokerPermission=99", ResponseCode.SYSTEM_ERROR, ["brokerPermission", "not a permission"]),
    ("longPollingEnable=yes", ResponseCode.SYSTEM_ERROR, ["longPollingEnable", "true or false"]),
    # A valid key with an invalid one: neither applies.
    ("slaveReadEnable=true\ndiskMaxUsedSpaceRatio=120", ResponseCode.SYSTEM_ERROR, ["diskMaxUsedSpaceRatio"]),
    ("brokerRole=SLAVE", ResponseCode.NO_PERMISSION, ["brokerRole", "POST /role"]),
    ("adminToken=stolen", ResponseCode.NO_PERMISSION, ["adminToken"]),
    ("listenPort=1", ResponseCode.NO_PERMISSION, ["listenPort"]),
    ("tlsServerMode=disabled", ResponseCode.NO_PERMISSION, ["tlsServerMode", "TLS setting"]),
    ("storePathRootDir=/tmp/x\nslaveReadEnable=true", ResponseCode.NO_PERMISSION, ["storePathRootDir"]),
])
def test_a_refused_change_changes_nothing(shared_cluster: Cluster, body: str, code: int, words: list[str]) -> None:
    broker = next((p for p in shared_cluster.procs if isinstance(p, BrokerProc)), None) \
        or shared_cluster.broker(None, name="broker-refuse")
    before_file, before_shown = broker.conf_path.read_text(), shown(broker)
    resp = update(broker, body)
    assert resp.code == code, resp
    assert all(w in (resp.remark or "") for w in words), resp.remark
    assert "nothing changed" in (resp.remark or "")
    assert broker.conf_path.read_text() == before_file
    assert shown(broker) == before_shown


def test_a_read_only_conf_keeps_live_changes_until_restart_only(cluster: Cluster) -> None:
    broker = cluster.broker(None, start=False)
    broker.env["KUBERNETES_SERVICE_HOST"] = "10.96.0.1"
    broker.conf_path.chmod(0o444)  # as a ConfigMap: the operator owns it
    broker.start()
    original = broker.conf_path.read_text()

    resp = update(broker, "shortPollingTimeMills=500")
    assert resp.code == ResponseCode.SUCCESS, resp
    remark = resp.remark or ""
    assert "applied now: shortPollingTimeMills=500" in remark and "not saved" in remark and "read-only" in remark
    assert "spec.brokerConfig" in remark
    assert shown(broker)["shortPollingTimeMills"] == "500"

    resp = update(broker, "autoCreateTopicEnable=false")
    assert resp.code == ResponseCode.SYSTEM_ERROR, resp
    assert "autoCreateTopicEnable=false" in (resp.remark or "") and "read-only" in (resp.remark or "")
    assert shown(broker)["autoCreateTopicEnable"] == "true"
    assert broker.conf_path.read_text() == original

    restart(broker)
    assert shown(broker)["shortPollingTimeMills"] == "1000"


def test_rmq_admin_update_broker_config(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-u")
    slave = cluster.broker(ns.addr, name="broker-u", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}")
    poll(lambda: len(json.loads(bytes(rpc(ns.addr, RequestCode.GET_BROKER_CLUSTER_INFO).body))["brokerAddrTable"]
                     ["broker-u"]["brokerAddrs"]) == 2, 10, what="both brokers registered")
    n = ("-n", ns.addr)

    # -c: every master of the cluster, as mqadmin (slaves are left out).
    assert rmq_admin(["updateBrokerConfig", *n, "-c", "DefaultCluster", "-k", "slaveReadEnable", "-v", "true"]) == 0
    out = capsys.readouterr().out
    assert f"update broker config success, {master.addr}" in out and slave.addr not in out
    assert "applied now: slaveReadEnable=true" in out
    assert shown(master)["slaveReadEnable"] == "true" and shown(slave)["slaveReadEnable"] == "false"

    assert rmq_admin(["updateBrokerConfig", *n, "-b", slave.addr, "-k", "longPollingEnable", "-v", "false"]) == 0
    assert f"update broker config success, {slave.addr}" in capsys.readouterr().out
    assert rmq_admin(["getBrokerConfig", *n, "-b", slave.addr]) == 0
    assert any(line.split() == ["longPollingEnable", "=", "false"] for line in capsys.readouterr().out.splitlines())

    assert rmq_admin(["updateBrokerConfig", *n, "-b", master.addr, "-k", "brokerName", "-v", "x"]) == 1
    err = capsys.readouterr().err
    assert "brokerName" in err and "nothing changed" in err


def test_conf_without_file_refuses_keys_for_the_next_start(tmp_path: Path, cluster: Cluster) -> None:
    """A broker started without -c (every key from --set): live keys until restart, others refused."""
    broker = cluster.broker(None, start=False)
    conf = broker.conf_path.read_text()
    broker.args = [*broker.args[:-2], *(a for line in conf.splitlines() for a in ("--set", line))]
    broker.start()
    resp = update(broker, "slaveReadEnable=true")
    assert resp.code == ResponseCode.SUCCESS and "started without a config file" in (resp.remark or "")
    assert shown(broker)["slaveReadEnable"] == "true"
    resp = update(broker, "autoCreateSubscriptionGroup=false")
    assert resp.code == ResponseCode.SYSTEM_ERROR and "started without a config file" in (resp.remark or "")
