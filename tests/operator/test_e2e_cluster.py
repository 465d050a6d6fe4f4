"""Two BrokerGroups form one RocketMQ cluster: examples/cluster.yaml (RocketMQ's 2m-2s layout).

broker-a runs the managed nameservers; broker-b lists broker-a's nameserver pods in
``spec.nameServer.addresses``. Real operator, emulated API, real processes as pods; the stock C++
producer spreads a topic's messages over both groups' masters.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.integration.helpers import create_topic, message, poll, produce, route, rpc
from tests.operator.conftest import EXAMPLE
from tests.operator.emulator import OperatorHarness, condition, wait_for
from tests.operator.podrunner import PodRunner, ProcessBackend

TOPIC = "TwoGroups"
CONFIG = {"mappedFileSizeCommitLog": str(16 << 20), "mappedFileSizeConsumeQueue": "60000",
          "slaveSyncInitialDelay": "500", "slaveSyncInterval": "1000"}


def ready(h: OperatorHarness, name: str) -> dict[str, Any] | None:
    g = h.client.group(name)
    st = (g or {}).get("status") or {}
    ok = st.get("inSyncReplicas") == 2 and st.get("readyReplicas") == 2 and \
        condition(g, "Ready").get("status") == "True"
    return st if ok else None


def queued(broker: str) -> int:
    """Messages of TOPIC stored on ``broker`` (the sum of its queues' max offsets)."""
    total = 0
    for q in range(4):
        resp = rpc(broker, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": str(q)})
        assert resp.code == ResponseCode.SUCCESS, resp
        total += int(resp.ext_fields["offset"])
    return total


def test_second_group_joins_the_first_groups_nameservers(
        harness: OperatorHarness, real_pods: tuple[PodRunner, ProcessBackend]) -> None:
    h, (runner, _) = harness, real_pods
    docs = [d for d in yaml.safe_load_all((EXAMPLE.parent / "cluster.yaml").read_text()) if d]
    for doc in docs:
        doc["spec"]["brokerConfig"] = CONFIG  # small segments: the brokers share this machine's disk
        h.client.apply_group(doc)
    st_a = wait_for(lambda: ready(h, "broker-a"), 90, "broker-a Ready with 2 in sync")
    st_b = wait_for(lambda: ready(h, "broker-b"), 90, "broker-b Ready with 2 in sync")
    assert not any(p.startswith("broker-b-namesrv") for p in runner.ips), "broker-b must not run nameservers"

    # One cluster in each of broker-a's nameservers: both groups, each with its master (0) and slave (1).
    for pod in ("broker-a-namesrv-0", "broker-a-namesrv-1"):
        namesrv = f"{runner.ip_of(pod)}:9876"

        def both_registered() -> dict[str, Any] | None:
            info = json.loads(bytes(rpc(namesrv, RequestCode.GET_BROKER_CLUSTER_INFO).body))  # noqa: B023
            table = info["brokerAddrTable"]
            ok = all(sorted((table.get(n) or {}).get("brokerAddrs", {})) == ["0", "1"]
                     for n in ("broker-a", "broker-b"))
            return info if ok else None

        info = poll(both_registered, 30, 0.3, what=f"both groups' brokers registered with {pod}")
        assert sorted(info["clusterAddrTable"]["DefaultCluster"]) == ["broker-a", "broker-b"]
        assert info["brokerAddrTable"]["broker-a"]["brokerAddrs"]["0"] == st_a["masterAddress"]
        assert info["brokerAddrTable"]["broker-b"]["brokerAddrs"]["0"] == st_b["masterAddress"]

    # A topic on both masters: the stock producer spreads its sends over the two groups.
    for master in (st_a["masterAddress"], st_b["masterAddress"]):
        create_topic(master, TOPIC, 4)
    poll(lambda: len((route(namesrv, TOPIC) or {}).get("brokerDatas", [])) == 2, 30, 0.3,
         what="route of the topic over both groups")
    results = produce(namesrv, [message(TOPIC, f"m{i}") for i in range(40)], settle_ms=300)
    assert all(r is not None and r["status"] == 0 for r in results), results
    on_a, on_b = queued(st_a["masterAddress"]), queued(st_b["masterAddress"])
    assert on_a + on_b == 40 and on_a > 0 and on_b > 0, (on_a, on_b)
