"""Consumer group administration against real broker processes: UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
(200) and DELETE_SUBSCRIPTIONGROUP (207), as mqadmin's updateSubGroup / deleteSubGroup send them.
With autoCreateSubscriptionGroup off these are the only way a group comes to exist; a slave picks
the changes up through its metadata sync, and bad requests are answered with a remark and counted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import create_topic, metric_delta, poll, rpc, send_raw
from tests.support.procs import BrokerProc

SEG = 2 * 1024 * 1024
TOPIC = "GroupAdminTopic"


def pull(broker: BrokerProc, group: str) -> int:
    return rpc(broker.addr, RequestCode.PULL_MESSAGE, {
        "consumerGroup": group, "topic": TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
        "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*",
        "subVersion": "0"}).code


def file_groups(broker: BrokerProc) -> dict[str, Any]:
    path = broker.store_dir / "config" / "subscriptionGroup.json"
    try:
        table: dict[str, Any] = json.loads(path.read_text())["subscriptionGroupTable"]
    except (OSError, ValueError, KeyError):
        return {}
    return table


def offsets_text(broker: BrokerProc) -> str:
    path: Path = broker.store_dir / "config" / "consumerOffset.json"
    return path.read_text() if path.exists() else ""


def start_pair(cluster: Cluster) -> tuple[BrokerProc, BrokerProc]:
    """A master that does not auto-create groups, and a slave syncing its metadata every 0.5 s (it
    learns the master's address from the nameserver, as RocketMQ's slave does)."""
    ns = cluster.namesrv()
    conf: dict[str, Any] = {"maxMessageSize": 1024 * 1024, "autoCreateSubscriptionGroup": "false",
                            "slaveSyncInitialDelay": 200, "slaveSyncInterval": 500}
    master = cluster.broker(ns.addr, name="broker-g", mappedFileSizeCommitLog=SEG, **conf)
    slave = cluster.broker(ns.addr, name="broker-g", broker_id=1, role="SLAVE", mappedFileSizeCommitLog=SEG,
                           haMasterAddress=f"127.0.0.1:{master.port + 1}", **conf)
    create_topic(master.addr, TOPIC, queues=1)
    assert send_raw(master.addr, TOPIC, b"one").code == ResponseCode.SUCCESS
    return master, slave


@pytest.fixture
def pair(cluster: Cluster) -> tuple[BrokerProc, BrokerProc]:
    return start_pair(cluster)


@pytest.fixture(scope="module")
def module_pair(module_cluster: Cluster) -> tuple[BrokerProc, BrokerProc]:
    return start_pair(module_cluster)


@pytest.fixture
def refusing_pair(module_pair: tuple[BrokerProc, BrokerProc], shared_cluster: Cluster) -> tuple[BrokerProc, BrokerProc]:
    """One pair for the tests of requests refused: a refusal changes nothing (each test checks
    that), and each counts its own refusal (metric deltas)."""
    return module_pair


def test_created_group_consumes_and_reaches_the_slave(pair: tuple[BrokerProc, BrokerProc]) -> None:
    master, slave = pair
    assert pull(master, "CG_ADMIN") == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    body = {"groupName": "CG_ADMIN", "retryMaxTimes": 3, "consumeBroadcastEnable": False, "brokerId": 0,
            "whichBrokerWhenConsumeSlowly": 1, "groupSysFlag": 0}
    resp = rpc(master.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=json.dumps(body).encode())
    assert resp.code == ResponseCode.SUCCESS, resp
    assert pull(master, "CG_ADMIN") == ResponseCode.SUCCESS
    stored = file_groups(master)["CG_ADMIN"]
    assert stored["retryMaxTimes"] == 3 and stored["consumeBroadcastEnable"] is False
    assert stored["groupSysFlag"] == 0  # a field this broker does not interpret is kept
    synced = poll(lambda: file_groups(slave).get("CG_ADMIN"), 10, what="group on the slave")
    assert synced["retryMaxTimes"] == 3

    # Replacing it moves the DataVersion again, so the slave takes the new settings too.
    body["retryMaxTimes"] = 5
    assert rpc(master.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
               body=json.dumps(body).encode()).code == ResponseCode.SUCCESS
    poll(lambda: file_groups(slave).get("CG_ADMIN", {}).get("retryMaxTimes") == 5, 10, what="update on the slave")


def test_delete_group_with_and_without_its_offsets(pair: tuple[BrokerProc, BrokerProc]) -> None:
    master, slave = pair
    for group in ("CG_KEEP", "CG_DROP"):
        assert rpc(master.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                   body=json.dumps({"groupName": group}).encode()).code == ResponseCode.SUCCESS
        assert rpc(master.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": group, "topic": TOPIC, "queueId": "0", "commitOffset": "1"}).code == ResponseCode.SUCCESS
    poll(lambda: {"CG_KEEP", "CG_DROP"} <= set(file_groups(slave)), 10, what="groups on the slave")

    assert rpc(master.addr, RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "CG_KEEP"}).code == ResponseCode.SUCCESS
    assert rpc(master.addr, RequestCode.DELETE_SUBSCRIPTIONGROUP,
               {"groupName": "CG_DROP", "removeOffset": "true"}).code == ResponseCode.SUCCESS
    groups = file_groups(master)
    assert "CG_KEEP" not in groups and "CG_DROP" not in groups
    assert pull(master, "CG_DROP") == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    offsets = offsets_text(master)
    assert f"{TOPIC}@CG_KEEP" in offsets and f"{TOPIC}@CG_DROP" not in offsets

    def committed(group: str) -> str:
        resp = rpc(master.addr, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": TOPIC,
                                                                    "queueId": "0"})
        assert resp.code == ResponseCode.SUCCESS, resp
        return resp.ext_fields["offset"]

    # The kept offset is served; the removed one falls back to the queue's start (nothing stored).
    assert (committed("CG_KEEP"), committed("CG_DROP")) == ("1", "0")
    poll(lambda: not {"CG_KEEP", "CG_DROP"} & set(file_groups(slave)), 10, what="deletions on the slave")
    # Deleting a group that does not exist is not an error (RocketMQ answers SUCCESS too).
    assert rpc(master.addr, RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "CG_NEVER"}).code == 0


@pytest.mark.parametrize(("code", "ext", "body", "remark"), [
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b"", "SubscriptionGroupConfig"),
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b"{not json", "bad SubscriptionGroupConfig"),
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b"[1, 2]", "bad SubscriptionGroupConfig"),
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b"null", "bad SubscriptionGroupConfig"),
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b"\xff\xfe", "UTF-8"),
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b'{"retryMaxTimes": 3}', "groupName"),
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b'{"groupName": "bad group"}', "illegal characters"),
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b'{"groupName": "   "}', "blank"),
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, json.dumps({"groupName": "G" * 256}).encode(), "longer"),
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b'{"groupName": "CG_NEG", "retryQueueNums": -1}',
     "retryQueueNums"),
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b'{"groupName": "CG_NUM", "brokerId": "one"}', "brokerId"),
])
def test_unusable_group_request_is_refused_and_counted(refusing_pair: tuple[BrokerProc, BrokerProc], code: int,
                                                       ext: dict[str, str], body: bytes, remark: str) -> None:
    master, _ = refusing_pair
    before_groups = file_groups(master)
    metrics = master.metrics()
    resp = rpc(master.addr, code, ext, body=body)
    assert resp.code == ResponseCode.SYSTEM_ERROR and remark in (resp.remark or ""), resp
    assert metric_delta(metrics, master.metrics(), "rmq_remoting_bad_requests_total", code=str(int(code))) == 1
    assert file_groups(master) == before_groups


def test_delete_without_group_name_is_a_header_error(refusing_pair: tuple[BrokerProc, BrokerProc]) -> None:
    master, _ = refusing_pair
    metrics = master.metrics()
    resp = rpc(master.addr, RequestCode.DELETE_SUBSCRIPTIONGROUP, {"removeOffset": "true"})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "groupName" in (resp.remark or ""), resp
    assert metric_delta(metrics, master.metrics(), "rmq_remoting_header_errors_total") == 1


def test_slave_refuses_group_changes(pair: tuple[BrokerProc, BrokerProc]) -> None:
    master, slave = pair
    assert rpc(master.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
               body=b'{"groupName": "CG_ON_MASTER"}').code == ResponseCode.SUCCESS
    poll(lambda: "CG_ON_MASTER" in file_groups(slave), 10, what="group on the slave")
    for code, ext, body in ((RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b'{"groupName": "CG_SLAVE"}'),
                            (RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "CG_ON_MASTER"}, b"")):
        resp = rpc(slave.addr, code, ext, body=body)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "slave" in (resp.remark or ""), resp
    groups = file_groups(slave)
    assert "CG_SLAVE" not in groups and "CG_ON_MASTER" in groups
