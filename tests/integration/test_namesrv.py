"""The nameserver's view of brokers: routes, cluster info, topic list, dead and stalled brokers."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import PY, create_topic, poll, route, rpc, wait_route
from tests.support.procs import BrokerProc


def cluster_info(namesrv: str) -> dict[str, Any]:
    resp = rpc(namesrv, RequestCode.GET_BROKER_CLUSTER_INFO)
    assert resp.code == ResponseCode.SUCCESS, resp
    info: dict[str, Any] = json.loads(bytes(resp.body))
    return info


def broker_names(namesrv: str) -> set[str]:
    info = cluster_info(namesrv)
    return set(info["brokerAddrTable"]) | {n for names in info["clusterAddrTable"].values() for n in names}


def route_brokers(namesrv: str, topic: str) -> set[str]:
    r = route(namesrv, topic)
    if r is None:
        return set()
    assert {q["brokerName"] for q in r["queueDatas"]} == {b["brokerName"] for b in r["brokerDatas"]}
    return {b["brokerName"] for b in r["brokerDatas"]}


def two_brokers(cluster: Cluster, ns_kw: dict[str, Any] | None = None,
                **broker_conf: Any) -> tuple[str, BrokerProc, BrokerProc]:
    ns = cluster.namesrv(**(ns_kw or {}))
    a = cluster.broker(ns.addr, name="broker-a", **broker_conf)
    b = cluster.broker(ns.addr, name="broker-b", **broker_conf)
    for broker in (a, b):
        create_topic(broker.addr, "SharedTopic", queues=2)
    create_topic(b.addr, "OnlyOnB", queues=3)
    poll(lambda: route_brokers(ns.addr, "SharedTopic") == {"broker-a", "broker-b"}, timeout=10,
         what="both brokers in the route")
    wait_route(ns.addr, "OnlyOnB")
    return ns.addr, a, b


def test_routes_and_cluster_info(cluster: Cluster) -> None:
    ns, a, b = two_brokers(cluster)
    r = route(ns, "SharedTopic")
    assert r is not None
    addrs = {bd["brokerName"]: bd["brokerAddrs"] for bd in r["brokerDatas"]}
    assert addrs == {"broker-a": {"0": a.addr}, "broker-b": {"0": b.addr}}
    assert {(q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in r["queueDatas"]} == \
        {("broker-a", 2, 2, 6), ("broker-b", 2, 2, 6)}
    info = cluster_info(ns)
    assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a", "broker-b"]}
    assert info["brokerAddrTable"]["broker-b"]["brokerAddrs"] == {"0": b.addr}
    assert route(ns, "NoSuchTopic") is None


def test_topic_list(cluster: Cluster) -> None:
    ns, a, _ = two_brokers(cluster)
    create_topic(a.addr, "ListedTopic")

    def topics() -> set[str] | None:
        resp = rpc(ns, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        assert resp.code == ResponseCode.SUCCESS, resp
        listed = set(json.loads(bytes(resp.body))["topicList"])
        return listed if "ListedTopic" in listed else None

    listed = poll(topics, timeout=10, what="ListedTopic in the topic list")
    assert {"SharedTopic", "OnlyOnB", "TBW102", "broker-a", "broker-b"} <= listed
    assert "NoSuchTopic" not in listed


def test_unknown_request_code(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    resp = rpc(ns.addr, 7777)
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert "7777" in (resp.remark or "")
    # still serving
    assert rpc(ns.addr, RequestCode.GET_BROKER_CLUSTER_INFO).code == ResponseCode.SUCCESS


def test_killed_broker_disappears(cluster: Cluster) -> None:
    ns, _, b = two_brokers(cluster)
    b.kill9()
    # the dropped connection removes broker-b at once: no waiting for the 120 s expiry
    poll(lambda: "broker-b" not in broker_names(ns), timeout=5, what="broker-b gone from cluster info")
    assert broker_names(ns) == {"broker-a"}
    assert route_brokers(ns, "SharedTopic") == {"broker-a"}
    assert route(ns, "OnlyOnB") is None
    resp = rpc(ns, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    assert "OnlyOnB" not in json.loads(bytes(resp.body))["topicList"]


def test_stalled_broker_expires(cluster: Cluster) -> None:
    # Brokers re-register every 10 s here (the shortest period there is); an expiry a little above
    # that keeps a live broker listed while a stalled one is dropped.
    expiry = 11.5
    ns, _, b = two_brokers(cluster, {"expiry": expiry, "scan_interval": 0.5}, registerNameServerPeriod=10000)
    assert b.popen is not None
    b.signal(signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        # its connection stays open, so only the expiry can remove it
        time.sleep(2)
        assert broker_names(ns) == {"broker-a", "broker-b"}
        poll(lambda: "broker-b" not in broker_names(ns), timeout=expiry + 5, interval=0.25,
             what="stalled broker-b expired")
        assert time.monotonic() - stopped_at < expiry + 5
        assert route_brokers(ns, "SharedTopic") == {"broker-a"}
        assert route(ns, "OnlyOnB") is None
        # broker-a kept registering and is still there
        assert broker_names(ns) == {"broker-a"}
    finally:
        b.signal(signal.SIGCONT)
    # once it runs again it registers again
    poll(lambda: route_brokers(ns, "SharedTopic") == {"broker-a", "broker-b"}, timeout=15,
         what="broker-b back after SIGCONT")
    wait_route(ns, "OnlyOnB")


@pytest.mark.parametrize("kind", ["namesrv", "broker"])
def test_port_in_use_is_one_line_naming_the_address(kind: str, tmp_path: Path) -> None:
    """A port another process listens on stops the start with exit status 1 and one line naming
    the address: the nameserver printed a traceback, the broker an address-less "[Errno 98]"."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        if kind == "namesrv":
            cmd = [PY, "-m", "rmqbroker.namesrv.main", "--listen", f"127.0.0.1:{port}",
                   "--kv-config-path", str(tmp_path / "kvConfig.json")]
        else:
            cmd = [PY, "-m", "rmqbroker.main", "--set", f"storePathRootDir={tmp_path / 'store'}", "--set",
                   "brokerName=broker-x", "--set", "listenHost=127.0.0.1", "--set", f"listenPort={port}",
                   "--set", "fastListenPort=0"]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"cannot start: [Errno 98] cannot listen on 127.0.0.1:{port}: Address already in use" in proc.stderr


def test_a_restarted_nameserver_routes_the_brokers_again_within_seconds(cluster: Cluster) -> None:
    """A nameserver that restarts (a pod rescheduled, a roll) knows no broker until each registers
    again; a broker whose connection to it closed registers as soon as it answers, not a whole
    registerNameServerPeriod (30 s) later: clients of that nameserver get routes back in seconds."""
    ns = cluster.namesrv()
    b = cluster.broker(ns.addr)
    create_topic(b.addr, "AfterNamesrvRestart")
    wait_route(ns.addr, "AfterNamesrvRestart")
    ns.kill9()
    time.sleep(1.5)  # down across the broker's first attempt
    ns2 = cluster.namesrv(port=ns.port)
    restarted = time.monotonic()
    wait_route(ns2.addr, "AfterNamesrvRestart", timeout=20)
    took = time.monotonic() - restarted
    assert took < 8, f"routes back {took:.1f}s after the nameserver restarted"
