"""Replication seen by monitoring: the brokers' Prometheus metrics (/metrics: role, slaves and their
lag on the master, the stream and the metadata sync on the slave) and RocketMQ's runtime info
(GET_BROKER_RUNTIME_INFO) on a master and its slave; real processes and the stock client."""

from __future__ import annotations

import json
import re
import signal
import time

from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import message, poll, produce, pull_all, rpc, send_raw, wait_caught_up
from tests.integration.test_replication_extra import group
from tests.support.procs import BrokerProc, metric_value


def metric(broker: BrokerProc, name: str, **labels: str) -> float:
    return metric_value(broker.metrics(), name, **labels)


def test_replication_metrics_on_master_and_slave(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    master, slave = group(cluster, ns.addr, 2, slaveSyncInitialDelay=300, slaveSyncInterval=1000)
    produce(ns.addr, [message("MetricsTopic", f"m{i}") for i in range(20)])
    end = wait_caught_up(master, [slave])
    poll(lambda: master.status()["ha"]["slaves"][0]["ackedOffset"] == end, 10, what="master saw the ack")
    addr = master.status()["ha"]["slaves"][0]["address"]

    # The master: its role, one slave with nothing left to acknowledge, what it pushed.
    m = master.metrics()
    assert metric_value(m, "rmq_broker_role", role="ASYNC_MASTER", role_broker_id="0") == 1
    assert metric_value(m, "rmq_ha_slaves_connected") == 1
    assert metric_value(m, "rmq_ha_slave_acked_offset", slave=addr) == end
    assert metric_value(m, "rmq_ha_slave_lag_bytes", slave=addr) == 0
    assert metric_value(m, "rmq_ha_slave_in_sync", slave=addr) == 1
    assert abs(metric_value(m, "rmq_ha_slave_last_ack_timestamp_seconds", slave=addr) - time.time()) < 30
    assert metric_value(m, "rmq_ha_bytes_sent_total") == end
    assert metric_value(m, "rmq_ha_pushes_total") + metric_value(m, "rmq_ha_bulk_transfers_total") >= 1
    assert metric_value(m, "rmq_ha_reports_total") >= 2  # the first report, then acks
    lag_p99 = metric_value(m, "rmq_ha_replication_lag_seconds", quantile="0.99")
    assert 0 <= lag_p99 <= metric_value(m, "rmq_ha_replication_lag_seconds", quantile="1") < 30
    assert metric_value(m, "rmq_ha_master_connected") == 0
    assert metric_value(m, "rmq_metadata_sync_last_success_timestamp_seconds") == 0
    assert metric_value(m, "rmq_ha_epoch") == master.status()["epoch"]

    # The slave: its role, its master connection, every byte received, its metadata sync.
    poll(lambda: metric(slave, "rmq_metadata_sync_rounds_total") >= 1, 15, what="a metadata sync round")
    s = slave.metrics()
    assert metric_value(s, "rmq_broker_role", role="SLAVE", role_broker_id="1") == 1
    assert metric_value(s, "rmq_ha_master_connected") == 1
    assert metric_value(s, "rmq_ha_master_connects_total") == 1
    assert metric_value(s, "rmq_ha_bytes_received_total") == end
    assert metric_value(s, "rmq_ha_refused_streams_total") == 0
    assert metric_value(s, "rmq_metadata_sync_failures_total") == 0
    assert abs(metric_value(s, "rmq_metadata_sync_last_success_timestamp_seconds") - time.time()) < 30
    assert metric_value(s, "rmq_ha_slaves_connected") == 0

    # A stopped slave: the master's lag gauge shows what it has not acknowledged, then drains.
    slave.signal(signal.SIGSTOP)
    try:
        for i in range(5):
            assert send_raw(master.addr, "MetricsTopic", f"late{i}".encode()).code == 0
        behind = master.status()["maxPhyOffset"] - end
        assert behind > 0
        poll(lambda: metric(master, "rmq_ha_slave_lag_bytes", slave=addr) == behind, 10,
             what="lag of the stopped slave")
    finally:
        slave.signal(signal.SIGCONT)
    poll(lambda: metric(master, "rmq_ha_slave_lag_bytes", slave=addr) == 0, 15, what="lag drained")
    assert metric(slave, "rmq_ha_bytes_received_total") == master.status()["maxPhyOffset"]

    # The slave gone: no per-slave series left on the master, nothing connected.
    slave.stop()
    poll(lambda: metric(master, "rmq_ha_slaves_connected") == 0, 10, what="slave connection closed")
    try:
        metric(master, "rmq_ha_slave_lag_bytes", slave=addr)
        raise AssertionError("a closed slave connection still has a lag series")
    except KeyError:
        pass


def runtime_info(broker: BrokerProc) -> dict[str, str]:
    resp = rpc(broker.addr, RequestCode.GET_BROKER_RUNTIME_INFO)
    assert resp.code == ResponseCode.SUCCESS, resp
    table: dict[str, str] = json.loads(bytes(resp.body))["table"]
    return table


def test_runtime_info_has_what_rocketmq_tools_read(cluster: Cluster) -> None:
    """GET_BROKER_RUNTIME_INFO carries the keys ``mqadmin clusterList``/``brokerStatus`` and the
    Dashboard read without checking: TPS over 10 s / 1 min / 10 min from per-second samples, the
    day's totals, disk ratios and capacity, the oldest message's time; and on the master and its
    slave, each delay level's delivered and stored offsets (the slave's synced from the master)."""
    ns = cluster.namesrv()
    master, slave = group(cluster, ns.addr, 2, slaveSyncInitialDelay=300, slaveSyncInterval=1000)
    before = int(time.time() * 1000)
    produce(ns.addr, [message("InfoTopic", f"m{i}") for i in range(30)])
    got = pull_all(ns.addr, "InfoTopic", group="CG_INFO")
    assert len(got) == 30
    assert send_raw(master.addr, "InfoTopic", b"later", properties="WAIT\x01true\x02DELAY\x011\x02").code == 0

    # Once ten per-second samples followed the sends, the 10 s figure counts them all.
    def tps_ready() -> dict[str, str] | None:
        t = runtime_info(master)
        return t if t["putTps"].split(" ")[0] not in ("", "0.0") else None

    info = poll(tps_ready, 20, what="a 10 s put TPS figure")
    assert len(info["putTps"].split(" ")) == 3 and 0 < float(info["putTps"].split(" ")[0]) <= 31
    assert len(info["getTransferedTps"].split(" ")) == 3
    assert len(info["getTotalTps"].split(" ")) == 3
    assert info["msgPutTotalTodayNow"] == "31" and info["msgGetTotalTodayNow"] == "30"
    assert info["msgPutTotalTodayMorning"] == "0" and info["msgPutTotalYesterdayMorning"] == "0"
    assert before - 1000 <= int(info["earliestMessageTimeStamp"]) <= int(time.time() * 1000)
    assert 0 < float(info["commitLogDiskRatio"]) < 1 and 0 < float(info["consumeQueueDiskRatio"]) < 1
    assert re.fullmatch(r"Total : \d+\.\d [KMGTPE]iB, Free : \d+(\.\d [KMGTPE]i)?B\.", info["commitLogDirCapacity"])
    assert info["remainHowManyDataToFlush"].endswith("B")
    for key in ("sendThreadPoolQueueSize", "pullThreadPoolQueueSize", "pageCacheLockTimeMills"):
        assert info[key] == "0"
    # Delay level 1 (queue 0 of SCHEDULE_TOPIC_XXXX): "delivered up to,stored up to" once delivered.
    poll(lambda: runtime_info(master).get("scheduleMessageOffset_1") == "1,1", 15, what="delay level 1 delivered")
    # The slave shows the delay offsets it synced, against the queue it replicated.
    poll(lambda: runtime_info(slave).get("scheduleMessageOffset_1") == "1,1", 15, what="slave's delay offsets")
    sinfo = runtime_info(slave)
    assert sinfo["brokerRole"] == "SLAVE" and sinfo["msgPutTotalTodayNow"] == "0"  # a slave stores no sends
