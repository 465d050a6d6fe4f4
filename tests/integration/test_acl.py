"""The plain ACL (aclEnable) against a real broker and the stock C++ client signing with its session
credentials: permitted sends and pulls work, a wrong secret, a topic without PUB and an unsigned
or non-admin admin request are refused with RocketMQ's remark and counted, and rmq-admin signs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rmqbroker.acl import sign
from rmqbroker.admin_cli import main as rmq_admin
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import message, metric_delta, poll, produce, pull_all, rpc, wait_route
from tests.support.procs import BrokerProc, Namesrv, metric_value

TOPIC = "AclTopic"
ADMIN = ("rocketmq-admin", "admin-secret-1")
PRODUCER = ("producer1", "producer-secret")
CONSUMER = ("consumer1", "consumer-secret")
ACL = f"""
accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
  - accessKey: {PRODUCER[0]}
    secretKey: {PRODUCER[1]}
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - {TOPIC}=PUB
  - accessKey: {CONSUMER[0]}
    secretKey: {CONSUMER[1]}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - {TOPIC}=SUB
    groupPerms:
      - CG_ACL=SUB
"""


@pytest.fixture
def secured(cluster: Cluster, tmp_path: Path) -> tuple[Namesrv, BrokerProc]:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr, name="broker-acl", aclEnable="true", aclFile=str(acl))
    assert rmq_admin(["updateTopic", "-n", ns.addr, "-b", broker.addr, "-t", TOPIC, "-r", "2", "-w", "2",
                      "--accessKey", ADMIN[0], "--secretKey", ADMIN[1]]) == 0
    wait_route(ns.addr, TOPIC)
    return ns, broker


def denied(broker: BrokerProc, before: str) -> float:
    return metric_delta(before, broker.metrics(), "rmq_acl_denied_total")


def test_stock_client_signs_and_is_held_to_its_permissions(secured: tuple[Namesrv, BrokerProc]) -> None:
    ns, broker = secured
    sent = produce(ns.addr, [message(TOPIC, f"m{i}") for i in range(3)], credentials=PRODUCER)
    assert [r["status"] for r in sent if r is not None] == [0, 0, 0]

    before = broker.metrics()
    wrong = produce(ns.addr, [message(TOPIC, "x")], credentials=(PRODUCER[0], "not-the-secret"), keep_going=True)
    other = produce(ns.addr, [message("OtherTopic", "x")], credentials=PRODUCER, keep_going=True)
    assert wrong[0] is not None and "error" in wrong[0], wrong
    assert other[0] is not None and "error" in other[0], other
    assert denied(broker, before) >= 2

    got = pull_all(ns.addr, TOPIC, group="CG_ACL", credentials=CONSUMER)
    assert sorted(m["body"] for m in got) == ["m0", "m1", "m2"]  # the refused sends stored nothing


def test_requests_are_refused_with_rocketmqs_remarks(secured: tuple[Namesrv, BrokerProc]) -> None:
    _, broker = secured
    create = {"topic": "NewTopic", "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"}
    pull = {"consumerGroup": "CG_ACL", "topic": TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "8",
            "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*",
            "subVersion": "0"}

    def call(code: int, ext: dict[str, str], creds: tuple[str, str] | None) -> tuple[int, str]:
        fields = dict(ext)
        if creds:
            sign(fields, b"", *creds)
        resp = rpc(broker.addr, code, fields)
        return resp.code, resp.remark or ""

    before = broker.metrics()
    assert call(RequestCode.UPDATE_AND_CREATE_TOPIC, create, None) == (ResponseCode.SYSTEM_ERROR,
                                                                       "No accessKey is configured")
    code, remark = call(RequestCode.UPDATE_AND_CREATE_TOPIC, create, PRODUCER)
    assert code == ResponseCode.SYSTEM_ERROR and "Need admin permission for request code=17" in remark
    code, remark = call(RequestCode.PULL_MESSAGE, pull, PRODUCER)
    assert code == ResponseCode.SYSTEM_ERROR and remark == f"No default permission for topic={TOPIC}"
    # Admin-only here, unlike RocketMQ 4.9: replaying a message to a consumer, resuming a half's check.
    for code_, ext in ((RequestCode.CONSUME_MESSAGE_DIRECTLY, {"consumerGroup": "CG_ACL", "clientId": "c",
                                                               "msgId": "0" * 32}),
                       (RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": "0" * 32})):
        code, remark = call(code_, ext, PRODUCER)
        assert code == ResponseCode.SYSTEM_ERROR and f"Need admin permission for request code={code_}" in remark
    assert denied(broker, before) == 5
    # The VIP channel is guarded alike.
    resp = rpc(f"127.0.0.1:{broker.fast_port}", RequestCode.UPDATE_AND_CREATE_TOPIC, create)
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "No accessKey is configured")
    assert denied(broker, before) == 6
    assert call(RequestCode.PULL_MESSAGE, pull, CONSUMER)[0] in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND)
    assert call(RequestCode.UPDATE_AND_CREATE_TOPIC, create, ADMIN)[0] == ResponseCode.SUCCESS


def test_broker_refuses_to_start_with_an_unusable_acl_file(cluster: Cluster, tmp_path: Path) -> None:
    bad = tmp_path / "plain_acl.yml"
    bad.write_text("accounts:\n  - accessKey: ab\n    secretKey: cd\n")
    broker = cluster.broker(None, name="broker-badacl", start=False, aclEnable="true", aclFile=str(bad))
    with pytest.raises(RuntimeError, match=r"at least 6"):
        broker.start()
    assert broker.popen is not None and broker.popen.wait(10) == 2


def acl_pair(cluster: Cluster, tmp_path: Path, name: str) -> tuple[Namesrv, BrokerProc, BrokerProc, dict[str, Any]]:
    """A nameserver, an ACL-protected master and its slave signing its metadata sync with the
    CONSUMER account; the brokers' shared ACL settings."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    ns = cluster.namesrv()
    conf: dict[str, Any] = {"aclEnable": "true", "aclFile": str(acl), "slaveSyncInitialDelay": 200,
                            "slaveSyncInterval": 300}
    master = cluster.broker(ns.addr, name=name, **conf)
    slave = cluster.broker(ns.addr, name=name, broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}", aclAccessKey=CONSUMER[0],
                           aclSecretKey=CONSUMER[1], **conf)
    return ns, master, slave, conf


def test_slave_metadata_sync_signs_with_the_configured_account(cluster: Cluster, tmp_path: Path) -> None:
    """A slave's GET_ALL_* requests to an ACL-protected master carry aclAccessKey/aclSecretKey;
    without them the master refuses every round (the slave counts the failures)."""
    ns, master, signed, conf = acl_pair(cluster, tmp_path, "broker-aclha")
    unsigned = cluster.broker(ns.addr, name="broker-aclha", broker_id=2, role="SLAVE",
                              haMasterAddress=f"127.0.0.1:{master.port + 1}", **conf)
    assert rmq_admin(["updateTopic", "-n", ns.addr, "-b", master.addr, "-t", "SyncedTopic",
                      "--accessKey", ADMIN[0], "--secretKey", ADMIN[1]]) == 0

    def synced(slave: BrokerProc) -> bool:
        return "SyncedTopic" in (slave.store_dir / "config" / "topics.json").read_text(errors="replace") \
            if (slave.store_dir / "config" / "topics.json").exists() else False

    poll(lambda: synced(signed), 10, what="the signed slave synced the topic")
    poll(lambda: unsigned.status()["metadataSync"]["failures"] >= 2, 10, what="the unsigned slave's refused rounds")
    assert not synced(unsigned)
    assert "No accessKey is configured" in (unsigned.status()["metadataSync"]["lastError"] or "")


def test_a_changed_acl_file_is_put_in_force_and_a_broken_one_is_not(cluster: Cluster, tmp_path: Path) -> None:
    """Like RocketMQ, the broker follows edits of plain_acl.yml (a mounted Secret changes this way);
    a file that no longer loads leaves the previous rules in force and is counted."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    broker = cluster.broker(None, name="broker-aclreload", aclEnable="true", aclFile=str(acl))
    create = {"topic": "ReloadTopic", "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"}

    def create_as_producer() -> int:
        fields = dict(create)
        sign(fields, b"", *PRODUCER)
        return rpc(broker.addr, RequestCode.UPDATE_AND_CREATE_TOPIC, fields).code

    assert create_as_producer() == ResponseCode.SYSTEM_ERROR  # not an admin
    acl.write_text(ACL.replace(f"accessKey: {PRODUCER[0]}\n", f"accessKey: {PRODUCER[0]}\n    admin: true\n", 1))
    poll(lambda: create_as_producer() == ResponseCode.SUCCESS, 10, what="the edited file in force")
    before = broker.metrics()
    acl.write_text("accounts: [")
    poll(lambda: metric_delta(before, broker.metrics(), "rmq_acl_reload_failures_total") == 1, 10,
         what="the broken file noticed")
    assert create_as_producer() == ResponseCode.SUCCESS  # the last good rules stay


def test_mqadmin_acl_commands_change_the_rules_at_once(secured: tuple[Namesrv, BrokerProc], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """updateAclConfig, deleteAccessConfig, updateGlobalWhiteAddr, clusterAclConfigVersion and
    getAclConfig (codes 50-54): the file is rewritten in RocketMQ's format and the next request is
    checked against it; only an admin account may change it; bad rules change nothing."""
    ns, broker = secured
    acl_file = tmp_path / "plain_acl.yml"
    newbie = ("newproducer", "newbie-secret")
    as_admin = ["-n", ns.addr, "-b", broker.addr, "--accessKey", ADMIN[0], "--secretKey", ADMIN[1]]

    def send_as(creds: tuple[str, str] | None) -> tuple[int, str]:
        ext = {"producerGroup": "PG_ACL", "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
               "queueId": "0", "sysFlag": "0", "bornTimestamp": "1", "flag": "0", "properties": ""}
        if creds:
            sign(ext, b"body", *creds)
        resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, ext, b"body")
        return resp.code, resp.remark or ""

    assert send_as(newbie) == (ResponseCode.SYSTEM_ERROR, f"No acl config for {newbie[0]}")
    assert rmq_admin(["updateAclConfig", *as_admin, "-a", newbie[0], "-s", newbie[1], "-t", f"{TOPIC}=PUB"]) == 0
    assert send_as(newbie)[0] == ResponseCode.SUCCESS  # at once: no wait for the file watcher
    sent = produce(ns.addr, [message(TOPIC, "stock")], credentials=newbie)
    assert sent[0] is not None and sent[0]["status"] == 0
    doc = yaml.safe_load(acl_file.read_text())
    account = next(a for a in doc["accounts"] if a["accessKey"] == newbie[0])
    assert account == {"accessKey": newbie[0], "secretKey": newbie[1], "admin": False, "topicPerms": [f"{TOPIC}=PUB"]}
    assert doc["dataVersion"][0]["counter"] == 1 and len(doc["accounts"]) == 4
    capsys.readouterr()

    # Changing only some fields keeps the others; the version counts every change.
    assert rmq_admin(["updateAclConfig", *as_admin, "-a", newbie[0], "-i", "SUB"]) == 0
    account = next(a for a in yaml.safe_load(acl_file.read_text())["accounts"] if a["accessKey"] == newbie[0])
    assert account["secretKey"] == newbie[1] and account["defaultTopicPerm"] == "SUB"
    capsys.readouterr()
    assert rmq_admin(["clusterAclConfigVersion", *as_admin]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:4] == ["DefaultCluster", "broker-acl", broker.addr, "2"]
    assert rmq_admin(["getAclConfig", *as_admin]) == 0
    shown = capsys.readouterr().out
    assert newbie[0] in shown and newbie[1] not in shown and ADMIN[1] not in shown and "******" in shown

    # Refused: a non-admin account, rules that do not parse, a new account without a secret.
    before = acl_file.read_bytes()
    as_producer = ["-n", ns.addr, "-b", broker.addr, "--accessKey", PRODUCER[0], "--secretKey", PRODUCER[1]]
    assert rmq_admin(["updateAclConfig", *as_producer, "-a", "intruder", "-s", "intruder-secret", "-m", "true"]) == 1
    assert "Need admin permission for request code=50" in capsys.readouterr().err
    assert rmq_admin(["getAclConfig", *as_producer]) == 1
    assert rmq_admin(["updateAclConfig", *as_admin, "-a", newbie[0], "-t", f"{TOPIC}=WRITE"]) == 1
    assert "code 209" in capsys.readouterr().err
    assert rmq_admin(["updateAclConfig", *as_admin, "-a", "nosecret1"]) == 1
    assert "needs a secretKey" in capsys.readouterr().err
    assert acl_file.read_bytes() == before
    assert rmq_admin(["clusterAclConfigVersion", "-n", ns.addr, "-b", broker.addr, "--accessKey", PRODUCER[0],
                      "--secretKey", PRODUCER[1]]) == 0  # the version is not secret

    # The global white-list: unsigned requests from there pass.
    assert send_as(None)[0] == ResponseCode.SYSTEM_ERROR
    assert rmq_admin(["updateGlobalWhiteAddr", *as_admin, "-g", "10.1.1.*,127.0.0.1"]) == 0
    assert send_as(None)[0] == ResponseCode.SUCCESS
    assert yaml.safe_load(acl_file.read_text())["globalWhiteRemoteAddresses"] == ["10.1.1.*", "127.0.0.1"]
    assert rmq_admin(["updateGlobalWhiteAddr", *as_admin, "-g", "10.1.1.*"]) == 0
    assert send_as(None)[0] == ResponseCode.SYSTEM_ERROR

    assert rmq_admin(["deleteAccessConfig", *as_admin, "-a", newbie[0]]) == 0
    assert send_as(newbie) == (ResponseCode.SYSTEM_ERROR, f"No acl config for {newbie[0]}")
    capsys.readouterr()
    assert rmq_admin(["deleteAccessConfig", *as_admin, "-a", newbie[0]]) == 1
    err = capsys.readouterr().err
    assert "code 210" in err and f"Accesskey: {newbie[0]} not existed" in err


def test_acl_admin_requests_on_a_broker_without_the_acl_say_so(cluster: Cluster) -> None:
    broker = cluster.broker(None, name="broker-noacl")
    for code in (RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, RequestCode.GET_BROKER_CLUSTER_ACL_INFO):
        resp = rpc(broker.addr, code, {"accessKey": "someone1", "secretKey": "secret-1"})
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "the plain ACL is off on this broker "
                                                                       "(aclEnable=false)")
    assert not (broker.store_dir / "config" / "plain_acl.yml").exists()


def test_only_an_admin_account_changes_broker_settings(secured: tuple[Namesrv, BrokerProc],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """UPDATE_BROKER_CONFIG (25) is an admin code, as in RocketMQ: a signed non-admin request and an
    unsigned one are refused and change nothing."""
    ns, broker = secured
    body = b"brokerPermission=4\n"

    def update(creds: tuple[str, str] | None) -> tuple[int, str]:
        fields: dict[str, str] = {}
        if creds:
            sign(fields, body, *creds)
        resp = rpc(broker.addr, RequestCode.UPDATE_BROKER_CONFIG, fields, body)
        return resp.code, resp.remark or ""

    def permission() -> str:
        fields: dict[str, str] = {}
        sign(fields, b"", *ADMIN)
        text = bytes(rpc(broker.addr, RequestCode.GET_BROKER_CONFIG, fields).body).decode()
        return next(line for line in text.splitlines() if line.startswith("brokerPermission="))

    conf = broker.conf_path.read_text()
    assert update(None) == (ResponseCode.SYSTEM_ERROR, "No accessKey is configured")
    code, remark = update(PRODUCER)
    assert code == ResponseCode.SYSTEM_ERROR and "Need admin permission for request code=25" in remark
    assert permission() == "brokerPermission=6" and broker.conf_path.read_text() == conf
    assert rmq_admin(["updateBrokerConfig", "-n", ns.addr, "-b", broker.addr, "-k", "brokerPermission", "-v", "4",
                      "--accessKey", CONSUMER[0], "--secretKey", CONSUMER[1]]) == 1
    assert "Need admin permission for request code=25" in capsys.readouterr().err
    assert rmq_admin(["updateBrokerConfig", "-n", ns.addr, "-b", broker.addr, "-k", "brokerPermission", "-v", "4",
                      "--accessKey", ADMIN[0], "--secretKey", ADMIN[1]]) == 0
    assert f"update broker config success, {broker.addr}" in capsys.readouterr().out
    assert permission() == "brokerPermission=4" and "brokerPermission=4\n" in broker.conf_path.read_text()


@pytest.mark.parametrize("letters_first", [True, False])
def test_a_send_v2_header_naming_its_topic_twice_cannot_pass_the_acl_for_another_topic(
        secured: tuple[Namesrv, BrokerProc], letters_first: bool) -> None:
    """SEND_MESSAGE_V2 names its topic with the letter ``b``; the broker also reads RocketMQ's V1
    name ``topic`` when the short header is incomplete. The ACL must check the topic the message
    is stored in: a producer with PUB on one topic only cannot put ``b`` = that topic and
    ``topic`` = another (nor leave ``b`` out) and have the message stored in the other one."""
    _, broker = secured
    secret = "AclSecret"
    admin: dict[str, str] = {"topic": secret, "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"}
    sign(admin, b"", *ADMIN)
    assert rpc(broker.addr, RequestCode.UPDATE_AND_CREATE_TOPIC, admin).code == ResponseCode.SUCCESS
    v2 = {"a": "PG_ACL", "c": "TBW102", "d": "4", "f": "0", "g": "1700000000000", "h": "0", "i": ""}
    # No "e" (queueId): the V2 fast path gives up and the V1 names are read too.
    tails = {"topic": secret, "queueId": "0"}
    headers = [{"b": TOPIC, **v2, **tails} if letters_first else {**tails, "b": TOPIC, **v2},
               {**v2, **tails}]  # and no "b" at all
    for ext in headers:
        sign(ext, b"payload", *PRODUCER)
        resp = rpc(broker.addr, RequestCode.SEND_MESSAGE_V2, ext, b"payload")
        assert resp.code != ResponseCode.SUCCESS or ext.get("b") == TOPIC, (ext, resp.code, resp.remark)

    def stored(topic: str) -> int:
        fields = {"topic": topic, "queueId": "0"}
        sign(fields, b"", *ADMIN)
        return int(rpc(broker.addr, RequestCode.GET_MAX_OFFSET, fields).ext_fields["offset"])

    assert stored(secret) == 0, "a message reached a topic the producer has no PUB on"


def test_a_refused_offset_hand_over_does_not_hold_back_other_groups(cluster: Cluster, tmp_path: Path) -> None:
    """A slave hands the offsets groups committed to it while the master was away to the master with
    its aclAccessKey. An account without SUB on one of those groups gets that one refused: the
    others are handed over all the same, the refused one stays kept on the slave, and the round
    reports it."""
    ns, master, slave, _ = acl_pair(cluster, tmp_path, "broker-aclho")
    assert rmq_admin(["updateTopic", "-n", ns.addr, "-b", master.addr, "-t", TOPIC, "-r", "1", "-w", "1",
                      "--accessKey", ADMIN[0], "--secretKey", ADMIN[1]]) == 0

    def as_admin(addr: str, code: int, fields: dict[str, str]) -> Any:
        fields = dict(fields)
        sign(fields, b"", *ADMIN)
        return rpc(addr, code, fields)

    def offset(broker: BrokerProc, group: str) -> int | None:
        resp = as_admin(broker.addr, RequestCode.QUERY_CONSUMER_OFFSET,
                        {"consumerGroup": group, "topic": TOPIC, "queueId": "0"})
        return int(resp.ext_fields["offset"]) if resp.code == ResponseCode.SUCCESS else None

    poll(lambda: slave.status()["metadataSync"]["rounds"] >= 1 and (slave.store_dir / "config" / "topics.json")
         .read_text().count(TOPIC) > 0, 10, what="the slave synced the topic")
    master.kill9()
    # First the group the slave's account may not commit for: before, its refusal ended the hand-over.
    for group, value in (("CG_OTHER", 7), ("CG_ACL", 9)):
        assert as_admin(slave.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": group, "topic": TOPIC, "queueId": "0", "commitOffset": str(value)}).code == 0
    assert slave.status()["metadataSync"]["offsetsToHandOver"] == 2
    master.start()
    poll(lambda: offset(master, "CG_ACL") == 9, 10, what="the permitted group's offset handed over")
    poll(lambda: "CG_OTHER" in (slave.status()["metadataSync"]["lastError"] or ""), 10,
         what="the refused hand-over reported")
    assert offset(master, "CG_OTHER") != 7  # 0: never committed there (QUERY_CONSUMER_OFFSET, as Java)
    assert offset(slave, "CG_OTHER") == 7
    assert slave.status()["metadataSync"]["offsetsToHandOver"] == 1
    assert metric_value(slave.metrics(), "rmq_metadata_sync_offsets_to_hand_over") == 1
