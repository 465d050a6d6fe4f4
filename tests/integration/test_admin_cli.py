"""``rmq-admin`` against a real nameserver, master and slave: every command does what mqadmin's
namesake does, through the wire, and a failed request exits 1 with the broker's remark."""

from __future__ import annotations

import json

import pytest

from rmqbroker.admin_cli import main
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import (
    PushConsumer,
    StreamProducer,
    create_topic_and_wait,
    message,
    poll,
    produce,
    route,
    rpc,
    send_raw,
    wait_caught_up,
    wait_route,
)
from tests.support.procs import metric_value

TOPIC = "CliTopic"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()[1:] if line.strip() and not line.startswith(("Consume", "Diff"))]


def test_admin_cli_manages_topics_and_groups(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-c")
    slave = cluster.broker(ns.addr, name="broker-c", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}")
    n = ("-n", ns.addr)

    def listed() -> tuple[int, str, str] | None:
        result = run(capsys, "clusterList", *n)
        return result if slave.addr in result[1] else None

    code, out, _ = poll(listed, 10, what="both brokers listed")
    assert code == 0
    assert out.splitlines()[0].split() == ["#Cluster", "Name", "#Broker", "Name", "#BID", "#Addr", "#Version",
                                           "#InTPS(LOAD)", "#OutTPS(LOAD)", "#PCWait(ms)", "#Hour", "#SPACE"]
    by_id = {r[2]: r for r in rows(out)}
    assert by_id["0"][:4] == ["DefaultCluster", "broker-c", "0", master.addr]
    assert by_id["1"][:4] == ["DefaultCluster", "broker-c", "1", slave.addr]
    for r in by_id.values():
        # mqadmin's columns, from each broker's runtime info: nothing sent yet, so no load and no age.
        assert r[4:9] == ["V4_9_8", "0.00(0,0ms)", "0.00(0,0ms)", "0", "0.00"], r
        assert 0 < float(r[9]) < 1, r

    code, out, _ = run(capsys, "updateTopic", *n, "-c", "DefaultCluster", "-t", TOPIC, "-r", "2", "-w", "2")
    assert code == 0 and master.addr in out
    wait_route(ns.addr, TOPIC)
    for i in range(3):
        assert send_raw(master.addr, TOPIC, f"m{i}".encode()).code == ResponseCode.SUCCESS  # queue 0
    code, out, _ = run(capsys, "topicStatus", *n, "-t", TOPIC)
    assert code == 0
    status = {r[1]: r for r in rows(out)}
    assert set(status) == {"0", "1"} and status["0"][2:4] == ["0", "3"] and status["1"][2:4] == ["0", "0"]

    code, out, _ = run(capsys, "updateSubGroup", *n, "-c", "DefaultCluster", "-g", "CG_CLI", "-r", "5")
    assert code == 0
    groups = json.loads(master.admin("/metadata")[1])["subscriptionGroups"]["subscriptionGroupTable"]
    assert groups["CG_CLI"]["retryMaxTimes"] == 5

    assert rpc(master.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "CG_CLI", "topic": TOPIC, "queueId": "0", "commitOffset": "1"}).code == 0
    for extra in ((), ("-t", TOPIC)):
        code, out, _ = run(capsys, "consumerProgress", *n, "-g", "CG_CLI", *extra)
        assert code == 0, out
        progress = {r[2]: r for r in rows(out)}
        assert progress["0"][:2] == [TOPIC, "broker-c"] and progress["0"][3:6] == ["3", "1", "2"]
        assert progress["1"][3:6] == ["0", "0", "0"]
        assert "Diff Total: 2" in out
    # The same backlog on /metrics, for dashboards and alerts.
    metrics = master.metrics()
    assert metric_value(metrics, "rmq_consumer_lag_messages", group="CG_CLI", topic=TOPIC) == 2
    assert metric_value(metrics, "rmq_topic_max_offset", topic=TOPIC) == 3

    code, _, _ = run(capsys, "deleteSubGroup", *n, "-c", "DefaultCluster", "-g", "CG_CLI", "-r", "true")
    assert code == 0
    metadata = json.loads(master.admin("/metadata")[1])
    assert "CG_CLI" not in metadata["subscriptionGroups"]["subscriptionGroupTable"]
    assert f"{TOPIC}@CG_CLI" not in json.dumps(metadata["consumerOffsets"])

    code, out, _ = run(capsys, "deleteTopic", *n, "-c", "DefaultCluster", "-t", TOPIC)
    assert code == 0 and ns.addr in out
    assert route(ns.addr, TOPIC) is None
    assert TOPIC not in json.loads(master.admin("/metadata")[1])["topics"]["topicConfigTable"]


def test_admin_cli_reports_failures(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-e")
    slave = cluster.broker(ns.addr, name="broker-e", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}")
    code, _, err = run(capsys, "topicStatus", "-n", ns.addr, "-t", "NoSuchTopic")
    assert code == 1 and "no route" in err
    code, _, err = run(capsys, "updateTopic", "-n", ns.addr, "-b", slave.addr, "-t", "T1")
    assert code == 1 and "slave" in err
    code, _, err = run(capsys, "updateSubGroup", "-n", ns.addr, "-b", master.addr, "-g", "bad group")
    assert code == 1 and "illegal characters" in err
    code, _, err = run(capsys, "deleteTopic", "-n", ns.addr, "-c", "NoSuchCluster", "-t", "T1")
    assert code == 1 and "NoSuchCluster" in err
    code, _, err = run(capsys, "clusterList", "-n", "")
    assert code == 1 and "no nameserver" in err


def test_admin_cli_reads_status_config_topics_and_routes(cluster: Cluster,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-s", fileReservedTime=48, aclSecretKey="very-secret-key",
                            aclAccessKey="sync-user")
    slave = cluster.broker(ns.addr, name="broker-s", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}")
    n = ("-n", ns.addr)
    code, _, _ = run(capsys, "updateTopic", *n, "-b", master.addr, "-t", TOPIC, "-r", "3", "-w", "3")
    assert code == 0
    wait_route(ns.addr, TOPIC)
    assert send_raw(master.addr, TOPIC, b"one").code == ResponseCode.SUCCESS

    poll(lambda: master.status()["retention"]["lastRunMillis"] > 0, 10, what="first retention round")
    code, out, _ = run(capsys, "brokerStatus", *n, "-b", master.addr)
    assert code == 0
    status = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}
    assert status["brokerRole"] == "ASYNC_MASTER" and int(status["commitLogMaxOffset"]) > 0
    assert status["dispatchBehindBytes"] == "0" and 0 < float(status["commitLogDiskRatio"]) < 1
    code, out, _ = run(capsys, "brokerStatus", *n, "-c", "DefaultCluster")
    assert code == 0 and slave.addr in out and "SLAVE" in out

    code, out, _ = run(capsys, "getBrokerConfig", *n, "-b", master.addr)
    assert code == 0
    config = {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in out.splitlines()[1:])}
    assert config["fileReservedTime"] == "48" and config["brokerName"] == "broker-s"
    assert config["aclAccessKey"] == "sync-user"
    # Secrets never leave the broker.
    assert config["aclSecretKey"] == "******" and config["adminToken"] == "******"
    assert "very-secret-key" not in out and master.token not in out

    code, out, _ = run(capsys, "topicList", *n)
    assert code == 0 and TOPIC in out.split() and "TBW102" in out.split()
    code, out, _ = run(capsys, "topicRoute", *n, "-t", TOPIC)
    assert code == 0
    route_doc = json.loads(out)
    assert route_doc["queueDatas"][0]["writeQueueNums"] == 3
    assert route_doc["brokerDatas"][0]["brokerAddrs"] == {"0": master.addr, "1": slave.addr}


def test_admin_cli_lists_consumer_and_producer_connections(cluster: Cluster,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-k")
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=2)
    n = ("-n", ns.addr)
    # Alive (and so listed) until killed below, however slowly the consumer comes up.
    producer = StreamProducer(ns.addr, TOPIC, "conn", cluster.workdir / "conn-producer.jsonl", count=100_000,
                              size=64, seconds=300, pause_ms=20)
    try:
        with PushConsumer(ns.addr, "CG_CONN", TOPIC, expression="TagA || TagB", log_dir=cluster.workdir) as consumer:
            consumer.wait_started()

            def listed() -> str | None:
                code, out, _ = run(capsys, "consumerConnection", *n, "-g", "CG_CONN")
                return out if code == 0 else None

            out = poll(listed, 30, interval=0.5, what="consumer connection listed")
            rows = [line.split() for line in out.splitlines()]
            assert rows[1][2:] and rows[1][2] == "CPP" and rows[1][1].startswith("127.0.0.1:")
            assert [TOPIC, "TagA", "||", "TagB"] in rows
            assert "MessageModel: CLUSTERING" in out and "ConsumeType: CONSUME_PASSIVELY" in out

            def producer_listed() -> str | None:
                code, out, _ = run(capsys, "producerConnection", *n, "-g", "PG_STREAM", "-t", TOPIC)
                return out if code == 0 else None

            out = poll(producer_listed, 30, interval=0.5, what="producer connection listed")
            assert out.splitlines()[1].split()[2] == "CPP"

            # consumerStatus: the broker relays GET_CONSUMER_RUNNING_INFO to the C++ consumer and back.
            def status_listed() -> str | None:
                code, out, _ = run(capsys, "consumerStatus", *n, "-g", "CG_CONN")
                return out if code == 0 and f"{TOPIC}  broker-k" in out else None

            out = poll(status_listed, 30, interval=0.5, what="consumer running info")
            assert "PROP_CONSUME_TYPE" in out and "CONSUME_PASSIVELY" in out
            queue_rows = [r for r in (line.split() for line in out.splitlines()) if r[:2] == [TOPIC, "broker-k"]]
            assert sorted(int(r[2]) for r in queue_rows) == [0, 1]
            assert [TOPIC, "TagA", "||", "TagB"] in [line.split() for line in out.splitlines()]
    finally:
        producer.proc.kill()
        producer.proc.wait(10)
    code, _, err = run(capsys, "consumerConnection", *n, "-g", "CG_NOBODY", "-b", master.addr)
    assert code == 1 and "not online" in err
    code, _, err = run(capsys, "consumerStatus", *n, "-g", "CG_NOBODY", "-b", master.addr, "-i", "nobody@1")
    assert code == 1 and "not online" in err


def test_wipe_and_add_write_perm_steer_the_stock_producer(cluster: Cluster,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    ns = cluster.namesrv()
    x = cluster.broker(ns.addr, name="broker-x")
    y = cluster.broker(ns.addr, name="broker-y")
    n = ("-n", ns.addr)
    code, _, _ = run(capsys, "updateTopic", *n, "-c", "DefaultCluster", "-t", TOPIC, "-r", "2", "-w", "2")
    assert code == 0
    poll(lambda: len((route(ns.addr, TOPIC) or {}).get("queueDatas", [])) == 2, 10, what="both brokers routed")

    def send_and_count() -> tuple[int, int]:
        before = (x.status()["maxPhyOffset"], y.status()["maxPhyOffset"])
        # Only one broker is writable while x is wiped, so the client's start-up race on its
        # transport lock (see producer.py --settle-ms) would leave a send no other broker to try.
        results = produce(ns.addr, [message(TOPIC, f"m{i}") for i in range(12)], settle_ms=300)
        assert all(r is not None and r["status"] == 0 for r in results)
        return x.status()["maxPhyOffset"] - before[0], y.status()["maxPhyOffset"] - before[1]

    code, out, _ = run(capsys, "wipeWritePerm", *n, "-b", "broker-x")
    assert code == 0 and f"wipe write perm of broker[broker-x] in name server[{ns.addr}] OK, " in out
    wiped = int(out.split("OK, ")[1])  # every topic the broker serves, its built-in ones too
    assert wiped > 1
    perms = {q["brokerName"]: q["perm"] for q in (route(ns.addr, TOPIC) or {})["queueDatas"]}
    assert perms == {"broker-x": 4, "broker-y": 6}
    to_x, to_y = send_and_count()
    assert to_x == 0 and to_y > 0  # the C++ producer leaves a broker without write permission alone
    code, out, _ = run(capsys, "addWritePerm", *n, "-b", "broker-x")
    assert code == 0 and int(out.split("OK, ")[1]) == wiped
    to_x, to_y = send_and_count()
    assert to_x > 0 and to_y > 0


def test_admin_cli_reads_a_group_whose_master_is_down_from_its_slave(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """topicStatus and consumerProgress read such a group from a slave, as mqadmin does; a reset
    (which a slave cannot keep) says which group it skipped and exits 1."""
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-h", slaveSyncInitialDelay=100, slaveSyncInterval=200)
    slave = cluster.broker(ns.addr, name="broker-h", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}", slaveSyncInitialDelay=100,
                           slaveSyncInterval=200)
    n = ("-n", ns.addr)
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=2)
    for i in range(3):
        assert send_raw(master.addr, TOPIC, f"m{i}".encode()).code == ResponseCode.SUCCESS  # queue 0
    assert rpc(master.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "CG_DOWN", "topic": TOPIC, "queueId": "0", "commitOffset": "1"}).code == 0
    wait_caught_up(master, [slave])
    poll(lambda: TOPIC in json.loads(slave.admin("/metadata")[1])["topics"]["topicConfigTable"]
         and "CG_DOWN" in json.dumps(json.loads(slave.admin("/metadata")[1])["consumerOffsets"]), 10,
         what="topic and offset synced to the slave")
    master.kill9()
    poll(lambda: "0" not in route(ns.addr, TOPIC)["brokerDatas"][0]["brokerAddrs"], 20,  # type: ignore[index]
         what="the master gone from the route")

    code, out, _ = run(capsys, "topicStatus", *n, "-t", TOPIC)
    assert code == 0, out
    assert {r[1]: r[2:4] for r in rows(out)} == {"0": ["0", "3"], "1": ["0", "0"]}
    for extra in ((), ("-t", TOPIC)):
        code, out, _ = run(capsys, "consumerProgress", *n, "-g", "CG_DOWN", *extra)
        assert code == 0, out
        assert {r[2]: r[3:6] for r in rows(out)}["0"] == ["3", "1", "2"] and "Diff Total: 2" in out
    code, out, err = run(capsys, "resetOffsetByTime", *n, "-g", "CG_DOWN", "-t", TOPIC, "-s", "0")
    assert code == 1 and "not reset on broker-h: no master online" in err
