"""Replication in the brokers' Prometheus metrics (/metrics): role, slaves and their lag on the
master, the stream and the metadata sync on the slave; real processes and the stock client."""

from __future__ import annotations

import signal
import time

from tests.conftest import Cluster
from tests.integration.helpers import message, poll, produce, send_raw, wait_caught_up
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
