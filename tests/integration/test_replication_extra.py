"""Master/slave replication seen through the nameserver and the stock client: slaves follow a master
that changed in the nameserver, metadata sync of delay offsets and subscription groups, and
consumers reading from the slave while the master is down."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from rmqbroker.metadata.jsonfile import fastjson_loads
from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from tests.conftest import Cluster
from tests.integration.helpers import (
    PushConsumer,
    create_topic_and_wait,
    message,
    poll,
    produce,
    pull_all,
    route,
    rpc,
    send_raw,
    wait_caught_up,
)
from tests.integration.test_replication import SEG, assert_commitlogs_identical
from tests.support.nsrelay import NamesrvRelay
from tests.support.procs import BrokerProc


def group(cluster: Cluster, ns: str | None, replicas: int, direct: bool = True, **conf: Any) -> list[BrokerProc]:
    """An ASYNC_MASTER (brokerId 0) and ``replicas - 1`` slaves of broker-r; ``direct`` pins the
    slaves' haMasterAddress, otherwise they learn it from the nameserver."""
    conf.setdefault("maxMessageSize", 1024 * 1024)
    master = cluster.broker(ns, name="broker-r", broker_id=0, mappedFileSizeCommitLog=SEG, **conf)
    slaves = []
    for i in range(1, replicas):
        extra = dict(conf)
        if direct:
            extra["haMasterAddress"] = ha_addr(master)
        slaves.append(cluster.broker(ns, name="broker-r", broker_id=i, role="SLAVE",
                                     mappedFileSizeCommitLog=SEG, **extra))
    return [master, *slaves]


def ha_addr(broker: BrokerProc) -> str:
    return f"127.0.0.1:{broker.port + 1}"


def broker_addrs(ns: str, topic: str) -> dict[str, str] | None:
    """brokerId -> address of broker-r in the nameserver's route for ``topic``."""
    r = route(ns, topic)
    if r is None:
        return None
    for data in r["brokerDatas"]:
        if data["brokerName"] == "broker-r":
            addrs: dict[str, str] = data["brokerAddrs"]
            return addrs
    return None


def follows(slave: BrokerProc, master: BrokerProc) -> bool:
    """Whether ``slave``'s HA client is connected to ``master``'s HA port."""
    ha = slave.status()["ha"]
    return bool(ha["masterAddress"] == ha_addr(master) and ha["connected"])


def set_role(broker: BrokerProc, role: str, broker_id: int, epoch: int) -> None:
    code, body = broker.admin("/role", "POST", json.dumps(
        {"role": role, "brokerId": broker_id, "epoch": epoch}).encode())
    assert code == 200, body


def test_slave_follows_master_changed_in_nameserver(cluster: Cluster) -> None:
    """A slave without haMasterAddress re-points itself at whichever broker the nameserver lists as
    brokerId 0, as RocketMQ's updateHaMasterAddress from REGISTER_BROKER answers does."""
    ns = cluster.namesrv()  # expiry 120 s: only a closed connection can drop the dead master in time
    # Java clamps registerNameServerPeriod to [10 s, 60 s]; 10 s is the fastest re-registration.
    # No metadata sync before the failover: S1 is promoted without FollowTopic in its topic table
    # (as for a topic created after the last sync), which must not remove the topic's route.
    a, s1, s2 = group(cluster, ns.addr, 3, direct=False, registerNameServerPeriod=10000,
                      slaveSyncInitialDelay=600000)
    create_topic_and_wait(a.addr, ns.addr, "FollowTopic")
    for i in range(30):
        assert send_raw(a.addr, "FollowTopic", f"before-{i}".encode() * 10).code == ResponseCode.SUCCESS
    poll(lambda: follows(s1, a) and follows(s2, a), 20, what="slaves learned A's HA address")
    wait_caught_up(a, [s1, s2])

    a.kill9()
    # Java's RouteInfoManager.onChannelDestroy: the dead master's entry goes when its channel
    # closes; the route keeps the slaves (and the queue data, since the broker name survives).
    poll(lambda: broker_addrs(ns.addr, "FollowTopic") == {"1": s1.addr, "2": s2.addr}, 10,
         what="nameserver dropped the killed master")

    set_role(s1, "ASYNC_MASTER", 0, 1)
    poll(lambda: broker_addrs(ns.addr, "FollowTopic") == {"0": s1.addr, "2": s2.addr}, 10,
         what="nameserver lists S1 as brokerId 0 (and still routes FollowTopic)")
    # S2 is not re-pointed by hand: its next registration (<= 10 s) names S1's HA address.
    poll(lambda: follows(s2, s1), 30, what="S2 follows S1")
    assert s2.status()["metadataSync"]["masterAddress"] == s1.addr
    for i in range(30):
        assert send_raw(s1.addr, "FollowTopic", f"after-{i}".encode() * 10).code == ResponseCode.SUCCESS
    assert_commitlogs_identical(s1, [s2])


def test_slaves_follow_a_hand_over_well_before_the_registration_period(cluster: Cluster) -> None:
    """A hand-over by hand (POST /role: demote A, promote S1) with nameserver discovery and the
    default registerNameServerPeriod (30 s): S2's master (A) refuses it as a SLAVE, and S2 asks
    the nameserver again at once instead of at its next periodic registration; so does A."""
    ns = cluster.namesrv()
    a, s1, s2 = group(cluster, ns.addr, 3, direct=False)
    create_topic_and_wait(a.addr, ns.addr, "HandTopic")
    poll(lambda: follows(s1, a) and follows(s2, a), 30, what="slaves learned A's HA address")
    # Registered up to 3 s ago: the next periodic registration is >= 25 s away.
    set_role(a, "SLAVE", 1, 1)
    set_role(s1, "ASYNC_MASTER", 0, 1)
    started = time.monotonic()
    poll(lambda: follows(s2, s1) and follows(a, s1), 15, what="S2 and the demoted A follow S1")
    assert time.monotonic() - started < 15
    assert s2.status()["metadataSync"]["masterAddress"] == s1.addr
    for i in range(20):
        assert send_raw(s1.addr, "HandTopic", f"after-{i}".encode()).code == ResponseCode.SUCCESS
    wait_caught_up(s1, [a, s2])


def test_promoted_then_demoted_slave_asks_the_nameserver_again(cluster: Cluster) -> None:
    """A re-point (POST /ha/master, as rmq-local and the operator send after a failover) names the
    master a slave follows, over the nameserver's answers. Once that slave is promoted the re-point
    is spent: demoted again later, it follows the master the nameserver names, not the broker it
    was re-pointed at long ago (a slave by then, which refuses it)."""
    ns = cluster.namesrv()
    a, s1, s2 = group(cluster, ns.addr, 3, direct=False)
    create_topic_and_wait(a.addr, ns.addr, "PinTopic")
    poll(lambda: follows(s1, a) and follows(s2, a), 30, what="slaves learned A's HA address")
    code, body = s1.admin("/ha/master", "POST", json.dumps({"haAddress": ha_addr(a), "brokerAddress": a.addr}).encode())
    assert code == 200, body
    set_role(a, "SLAVE", 1, 1)
    set_role(s1, "ASYNC_MASTER", 0, 1)
    poll(lambda: follows(a, s1) and follows(s2, s1), 15, what="A and S2 follow S1")
    set_role(s1, "SLAVE", 3, 2)
    set_role(s2, "ASYNC_MASTER", 0, 2)
    poll(lambda: follows(s1, s2) and follows(a, s2), 15, what="S1 and A follow S2")
    assert s1.status()["metadataSync"]["masterAddress"] == s2.addr


def _create_topics(broker: str, names: list[str]) -> None:
    """UPDATE_AND_CREATE_TOPIC for each name, on one connection."""

    async def run() -> None:
        client = RemotingClient()
        try:
            for name in names:
                resp = await client.invoke(broker, RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields={
                    "topic": name, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4",
                    "perm": "6", "topicFilterType": "SINGLE_TAG"}), 5.0)
                assert resp.code == ResponseCode.SUCCESS, resp
        finally:
            await client.close()

    asyncio.run(run())


def test_slave_asks_for_its_lost_master_without_its_topic_table(cluster: Cluster) -> None:
    """A slave that cannot follow its master asks the nameservers again every 3 s for as long as
    the master is gone; those registrations carry the dataVersion but not the topic table, which
    no nameserver takes from a slave (brokerId != 0). What the nameserver receives is read off a
    relay in front of it. Routes stay as they were, and the slave still finds the new master at
    its next question."""
    ns = cluster.namesrv()
    relay = NamesrvRelay(ns.addr).start()
    try:
        a = cluster.broker(ns.addr, name="broker-r", broker_id=0)
        topics = [f"LeanTopic{i}" for i in range(200)]
        _create_topics(a.addr, topics)
        s1 = cluster.broker(relay.addr, name="broker-r", broker_id=1, role="SLAVE", slaveSyncInitialDelay=100)
        s2 = cluster.broker(ns.addr, name="broker-r", broker_id=2, role="SLAVE")
        poll(lambda: s1.status()["topics"] > len(topics) and follows(s1, a) and follows(s2, a), 15,
             what="S1 synced A's topics; both slaves follow A")
        held = s1.status()["topics"]
        # Its table's version while it asks (the metadata round taken once it follows S2 moves it).
        version = s1.status()["dataVersions"]["topics"]
        first = relay.registrations(s1.addr)[0]
        assert first.topics > 0, first  # a registration other than a question for the master: the table

        a.kill9()
        killed = time.monotonic()
        # S1's HA connection ends: it asks at once (nothing names a master while A's entry is gone).
        poll(lambda: relay.registrations(s1.addr, since=killed), 5, what="S1 asked the nameserver again")
        set_role(s2, "ASYNC_MASTER", 0, 1)
        poll(lambda: follows(s1, s2), 6, what="S1 follows the promoted S2 (its next question, <= 3 s)")
        asked = relay.registrations(s1.addr, since=killed)
        assert asked and all(r.topics == 0 and r.body_bytes < 500 and r.data_version == version
                             for r in asked), (held, asked)

        # Routes unaffected: every topic still routed to broker-r, whose brokerId 0 is S2 now.
        poll(lambda: broker_addrs(ns.addr, topics[-1]) == {"0": s2.addr, "1": s1.addr}, 10,
             what="route lists S2 as brokerId 0 and S1 as 1")
        listed = json.loads(bytes(rpc(ns.addr, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).body))["topicList"]
        assert set(topics) <= set(listed)
        for topic in (topics[0], topics[-1]):
            r = route(ns.addr, topic)
            assert r is not None and [(q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q["perm"])
                                      for q in r["queueDatas"]] == [("broker-r", 4, 4, 6)], r
    finally:
        relay.stop()


def _messages_on(broker: BrokerProc, topic: str, queues: int = 4) -> int:
    return sum(int(rpc(broker.addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(q)})
                   .ext_fields["offset"]) for q in range(queues))


def test_resumed_old_master_does_not_take_broker_id_0_back(cluster: Cluster) -> None:
    """A master hung (SIGSTOP) through a failover registers as brokerId 0 again the moment it resumes
    (its registration was due meanwhile), before anything demotes it. The nameserver keeps the
    master promoted at the newer epoch at brokerId 0: a client reading routes then must not be sent
    to the old master, whose SEND_OKs are truncated away once it is demoted and follows the new
    one; and the demotion must not leave the route without a brokerId 0."""
    ns = cluster.namesrv()
    a, s1, s2 = group(cluster, ns.addr, 3, direct=False, registerNameServerPeriod=10000)
    create_topic_and_wait(a.addr, ns.addr, "StaleTopic")
    poll(lambda: follows(s1, a) and follows(s2, a), 30, what="slaves learned A's HA address")
    for i in range(10):
        assert send_raw(a.addr, "StaleTopic", f"before-{i}".encode()).code == ResponseCode.SUCCESS
    wait_caught_up(a, [s1, s2])

    a.signal(signal.SIGSTOP)
    try:
        for s in (s1, s2):
            code, body = s.admin("/ha/fence", "POST", json.dumps({"epoch": 1}).encode())
            assert code == 200, body
        set_role(s1, "ASYNC_MASTER", 0, 1)
        poll(lambda: (broker_addrs(ns.addr, "StaleTopic") or {}).get("0") == s1.addr, 10,
             what="nameserver lists S1 as brokerId 0")
        time.sleep(11)  # A's next registration falls due while it is stopped
    finally:
        a.signal(signal.SIGCONT)
    # A re-registers (as brokerId 0, at epoch 0) as soon as it runs again.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert (broker_addrs(ns.addr, "StaleTopic") or {}).get("0") == s1.addr, "the resumed old master took brokerId 0"
        time.sleep(0.1)
    results = produce(ns.addr, [message("StaleTopic", f"after-{i}") for i in range(10)])
    assert all(r is not None and r["status"] == 0 for r in results), results  # SEND_OK
    set_role(a, "SLAVE", 1, 1)
    poll(lambda: broker_addrs(ns.addr, "StaleTopic") == {"0": s1.addr, "1": a.addr, "2": s2.addr}, 5,
         what="route lists S1 as brokerId 0 and the demoted A as brokerId 1")
    poll(lambda: follows(a, s1) and follows(s2, s1), 15, what="A and S2 follow S1")
    assert _messages_on(s1, "StaleTopic") == 20  # every SEND_OK is on the master
    wait_caught_up(s1, [a, s2])


def _json_file(path: Path) -> Any:
    try:
        return fastjson_loads(path.read_text())
    except (OSError, ValueError):
        return None  # not written yet, or caught between truncate and write


def _delay_offset(config_dir: Path, level: int) -> int | None:
    obj = _json_file(config_dir / "delayOffset.json")
    if not isinstance(obj, dict):
        return None
    table = obj.get("offsetTable") or {}
    value = table.get(str(level), table.get(level))
    return None if value is None else int(value)


def _groups(config_dir: Path) -> dict[str, Any]:
    obj = _json_file(config_dir / "subscriptionGroup.json")
    table = obj.get("subscriptionGroupTable") if isinstance(obj, dict) else None
    return table if isinstance(table, dict) else {}


def _file_id(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns


def test_metadata_sync_delay_offsets_and_groups_rewritten_only_on_change(cluster: Cluster) -> None:
    """The slave's sync copies the master's delay offsets, and rewrites subscriptionGroup.json only
    when the master's group DataVersion changed (SlaveSynchronize.syncSubscriptionGroupConfig)."""
    ns = cluster.namesrv()
    # flushDelayOffsetInterval: the master's delayOffset.json shows delivery within half a second
    master, slave = group(cluster, ns.addr, 2, slaveSyncInitialDelay=300, slaveSyncInterval=1000,
                          flushDelayOffsetInterval=500)
    master_cfg, slave_cfg = master.store_dir / "config", slave.store_dir / "config"

    # Delay level 1 is 1 s by default; once delivered, the level's next offset is 1.
    resp = send_raw(master.addr, "DelaySyncTopic", b"later",
                    properties="DELAY\x011\x02WAIT\x01true\x02KEYS\x01delayed\x02")
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    poll(lambda: _delay_offset(master_cfg, 1) == 1, 15, what="master delivered level 1 and persisted its offset")
    poll(lambda: _delay_offset(slave_cfg, 1) == 1, 10, what="slave synced the delay offset of level 1")

    # Subscription groups: written once for the master's version, then left alone while unchanged.
    def sync() -> dict[str, Any]:
        st: dict[str, Any] = slave.status()["metadataSync"]
        return st

    master_version = master.status()["dataVersions"]["subscriptionGroups"]
    poll(lambda: sync()["subscriptionVersion"] == master_version, 10, what="slave has the master's group version")
    # The version is installed before the file is written; a completed round has written it.
    rounds = sync()["rounds"]
    poll(lambda: sync()["rounds"] >= rounds + 1, 10, what="one more sync round")
    path = slave_cfg / "subscriptionGroup.json"
    before = _file_id(path)
    assert "CG_EXTRA" not in _groups(slave_cfg)
    rounds = sync()["rounds"]
    poll(lambda: sync()["rounds"] >= rounds + 2, 10, what="two more sync rounds")
    assert master.status()["dataVersions"]["subscriptionGroups"] == master_version  # nothing changed
    assert _file_id(path) == before, "unchanged subscription groups were rewritten"

    # A new group on the master (a consumer's heartbeat auto-creates it) is synced and written.
    resp = rpc(master.addr, RequestCode.HEART_BEAT, body=json.dumps(
        {"clientID": "c-extra", "consumerDataSet": [{"groupName": "CG_EXTRA", "consumeType": 1, "messageModel": 1,
                                                     "consumeFromWhere": 0, "subscriptionDataSet": []}]}).encode())
    assert resp.code == ResponseCode.SUCCESS
    assert master.status()["dataVersions"]["subscriptionGroups"] != master_version
    poll(lambda: "CG_EXTRA" in _groups(slave_cfg), 10, what="new group synced to the slave's file")
    assert _file_id(path) != before


def _slave_serves(master: BrokerProc, slave: BrokerProc, topic: str, queues: int) -> bool:
    """Whether the slave has every queue's messages in its consume queues and answers pulls for them."""
    for q in range(queues):
        ext = {"topic": topic, "queueId": str(q)}
        want = int(rpc(master.addr, RequestCode.GET_MAX_OFFSET, ext).ext_fields["offset"])
        if int(rpc(slave.addr, RequestCode.GET_MAX_OFFSET, ext).ext_fields["offset"]) != want:
            return False
        if want == 0:
            continue
        resp = rpc(slave.addr, RequestCode.PULL_MESSAGE, {
            "consumerGroup": "CG_PROBE", "topic": topic, "queueId": str(q), "queueOffset": "0",
            "maxMsgNums": "1", "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
            "subscription": "*", "subVersion": "0"})  # sysFlag 4: subscription from this request
        if resp.code != ResponseCode.SUCCESS:
            return False  # e.g. TOPIC_NOT_EXIST until the metadata sync brought the topic
    return True


def test_consumer_reads_from_slave_while_master_is_down(cluster: Cluster) -> None:
    """With the master gone the nameserver routes only brokerId 1; the stock C++ client's
    findBrokerAddressInSubscribe falls back to it and gets every message."""
    ns = cluster.namesrv()
    master, slave = group(cluster, ns.addr, 2, slaveReadEnable="true", slaveSyncInitialDelay=300,
                          slaveSyncInterval=1000)
    topic, queues, n = "FallbackTopic", 4, 50
    create_topic_and_wait(master.addr, ns.addr, topic, queues)
    bodies = [f"fb-{i}" for i in range(n)]
    results = produce(ns.addr, [message(topic, b, keys=b) for b in bodies])
    assert all(r is not None and r["status"] == 0 for r in results), results
    wait_caught_up(master, [slave])
    poll(lambda: _slave_serves(master, slave, topic, queues), 20, what="slave serves every queue")

    master.kill9()
    poll(lambda: broker_addrs(ns.addr, topic) == {"1": slave.addr}, 10, what="route lists only the slave")
    # A hang here (pull_consumer.py retries a failing pull forever) means the client still picked
    # the dead master, e.g. because the nameserver kept its entry.
    msgs = pull_all(ns.addr, topic, group="CG_FALLBACK", timeout=40)
    assert sorted(m["body"] for m in msgs) == sorted(bodies)
    assert {m["keys"] for m in msgs} == set(bodies)
    # The push consumer heartbeats the slave, rebalances with it and starts at offset 0 (the
    # slave's QUERY_CONSUMER_OFFSET answer for a new group whose first message is in memory).
    with PushConsumer(ns.addr, "CG_FALLBACK_PUSH", topic, log_dir=cluster.workdir) as consumer:
        consumer.wait_started()
        pushed = consumer.wait_count(n, timeout=30)
    assert {m["body"] for m in pushed} == set(bodies)
