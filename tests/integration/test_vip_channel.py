"""RocketMQ's VIP channel (the "fast" remoting server on listenPort - 2) against a real broker: Java
clients up to 4.4 send there by default and Java slaves sync metadata there. Sends, offsets and
metadata work on it; PULL_MESSAGE is answered REQUEST_CODE_NOT_SUPPORTED as Java's broker does; it
can be moved or turned off; a taken port stops the broker with a message naming the key."""

from __future__ import annotations

import socket

from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import create_topic, rpc, send_raw
from tests.support.procs import free_port

TOPIC = "VipTopic"


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def max_offset(addr: str) -> int:
    resp = rpc(addr, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": "0"})
    assert resp.code == ResponseCode.SUCCESS
    return int(resp.ext_fields["offset"])


def test_the_vip_channel_serves_everything_but_pulls(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr, name="broker-vip")
    assert broker.fast_port == broker.port - 2
    vip = f"127.0.0.1:{broker.fast_port}"
    create_topic(vip, TOPIC, queues=1)
    assert max_offset(broker.addr) == 0
    for i in range(3):
        resp = send_raw(vip, TOPIC, f"via vip {i}".encode())
        assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["queueOffset"] == str(i)
    assert max_offset(broker.addr) == max_offset(vip) == 3

    pull = {"consumerGroup": "CG_VIP", "topic": TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "8",
            "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*",
            "subVersion": "0"}
    resp = rpc(vip, RequestCode.PULL_MESSAGE, pull)
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "11" in (resp.remark or "")
    resp = rpc(broker.addr, RequestCode.PULL_MESSAGE, pull)
    assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["nextBeginOffset"] == "3"

    # What a Java slave asks the master's VIP port for.
    resp = rpc(vip, RequestCode.GET_ALL_TOPIC_CONFIG)
    assert resp.code == ResponseCode.SUCCESS and TOPIC.encode() in resp.body
    commit = {"consumerGroup": "CG_VIP", "topic": TOPIC, "queueId": "0", "commitOffset": "2"}
    assert rpc(vip, RequestCode.UPDATE_CONSUMER_OFFSET, commit).code == ResponseCode.SUCCESS
    resp = rpc(broker.addr, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "CG_VIP", "topic": TOPIC,
                                                                "queueId": "0"})
    assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["offset"] == "2"


def test_the_vip_channel_moves_turns_off_and_a_taken_port_is_named(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    moved_to = free_port()
    moved = cluster.broker(ns.addr, name="broker-moved", fastListenPort=moved_to)
    assert port_open(moved_to) and not port_open(moved.port - 2)
    assert send_raw(f"127.0.0.1:{moved_to}", TOPIC, b"moved").code == ResponseCode.SUCCESS

    off = cluster.broker(ns.addr, name="broker-off", fastListenPort=0)
    assert not port_open(off.port - 2)
    assert send_raw(off.addr, TOPIC, b"main port").code == ResponseCode.SUCCESS

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        blocked = cluster.broker(ns.addr, name="broker-blocked", start=False, fastListenPort=busy)
        blocked.start(wait_ready=False)
        assert blocked.popen is not None and blocked.popen.wait(30) == 1
        assert f"fastListenPort {busy}" in blocked.log_text()
