"""A slave relays clients' writes to its master (relaySendsToMaster): a stock C++ producer whose
route still names the old master goes on sending through a hand-over without a failed send; a
relayed request is never relayed again, and a signed one still verifies at the master."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from rmqbroker.acl import sign
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand, decode_frame_payload, encode_frame
from rmqbroker.store.record import decode_offset_msg_id, decode_record
from tests.conftest import Cluster
from tests.integration.helpers import (
    StreamProducer,
    create_topic_and_wait,
    poll,
    pull_all,
    rpc,
    send_raw,
    wait_caught_up,
)
from tests.integration.test_replication_extra import follows, ha_addr
from tests.integration.test_replication_handover import role
from tests.support.procs import BrokerProc, metric_value

TOPIC = "RelayTopic"


def hand_over(master: BrokerProc, slave: BrokerProc, mode: str) -> None:
    """What the operator's hand-over does: drain to the slave, promote it, re-point the old master."""
    code, body = role(master, role="SLAVE", brokerId=1, epoch=0, drainMillis=5000,
                      drainFor=[slave.status()["ha"]["localAddress"]])
    assert code == 200 and body["drained"] is True, body
    code, body = role(slave, role=mode, brokerId=0, epoch=1, syncMetadata=True, metadataSource=master.addr)
    assert code == 200, body
    code, raw = master.admin("/ha/master", "POST", json.dumps(
        {"haAddress": ha_addr(slave), "brokerAddress": slave.addr, "epoch": 1}).encode())
    assert code == 200, raw


def test_a_stock_producer_with_a_stale_route_sends_through_a_hand_over_without_a_failure(
        cluster: Cluster) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-r", role="SYNC_MASTER")
    slave = cluster.broker(ns.addr, name="broker-r", broker_id=1, role="SLAVE",
                           haMasterAddress=ha_addr(master))
    poll(lambda: follows(slave, master), 20, what="slave connected")
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=2)
    producer = StreamProducer(ns.addr, TOPIC, "relay", cluster.workdir / "relay.jsonl", count=100_000, size=64,
                              seconds=120, pause_ms=10)
    try:
        # The C++ client reads routes 3 s after its start and then every 30 s: the hand-over and
        # the sends after it fall between two reads, so the client goes on sending to the old master.
        poll(lambda: producer.sent() >= 30, 20, what="30 sends to the master")
        sent_before = producer.sent()
        hand_over(master, slave, "SYNC_MASTER")
        poll(lambda: producer.sent() >= sent_before + 200, 20, what="200 more sends after the hand-over")
    finally:
        producer.proc.kill()
        producer.proc.wait(10)
    results = [json.loads(line) for line in producer.out.read_text().splitlines() if line.startswith("{")]
    failed = [r for r in results if r.get("status") != 0]
    assert not failed, f"{len(failed)} of {len(results)} sends failed: {failed[:3]}"
    relay = master.status()["relay"]
    assert relay["relayed"] >= 100 and relay["failed"] == 0 and relay["target"] == slave.addr, relay
    # Every acknowledged send is on the new master (and followed back to the old one).
    acked = {r["key"] for r in results}
    wait_caught_up(slave, [master])
    consumed = {m["keys"] for m in pull_all(ns.addr, TOPIC, group="CG_RELAY")}
    missing = acked - consumed
    assert not missing, f"{len(missing)} acknowledged sends not consumed: {sorted(missing)[:5]}"


def test_a_relayed_write_is_not_relayed_again_and_a_signed_one_verifies_at_the_master(
        cluster: Cluster, tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: producer1\n    secretKey: producer-secret\n"
                   "    defaultTopicPerm: PUB\n  - accessKey: rocketmq-admin\n    secretKey: admin-secret-1\n"
                   "    admin: true\n")
    conf: dict[str, Any] = {"aclEnable": "true", "aclFile": str(acl)}
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-s", **conf)
    slave = cluster.broker(ns.addr, name="broker-s", broker_id=1, role="SLAVE", haMasterAddress=ha_addr(master),
                           aclAccessKey="rocketmq-admin", aclSecretKey="admin-secret-1", **conf)
    poll(lambda: follows(slave, master) and slave.status()["relay"]["target"] == master.addr, 20,
         what="slave follows, relay target known")

    def send(broker: BrokerProc, key: str, *, secret: str = "producer-secret", **extra: str) -> int:
        ext = {"producerGroup": "PG_RELAY", "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
               "queueId": "0", "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
               "properties": f"WAIT\x01true\x02KEYS\x01{key}\x02"}
        sign(ext, b"body", "producer1", secret)
        ext.update(extra)  # after signing: the relay marker is not signed
        return int(rpc(broker.addr, RequestCode.SEND_MESSAGE, ext, b"body").code)

    before = master.status()["maxPhyOffset"]
    assert send(slave, "via-slave") == ResponseCode.SUCCESS
    assert master.status()["maxPhyOffset"] > before, "the slave did not relay the send to the master"
    # A wrong signature is refused by the slave's own ACL check, before any relay.
    assert send(slave, "bad-secret", secret="wrong-secret") == ResponseCode.SYSTEM_ERROR
    # A request another broker relayed is refused, not relayed on (no loops).
    assert send(slave, "relayed-twice", **{wire.RELAYED_BY: "127.0.0.1:1"}) == ResponseCode.SERVICE_NOT_AVAILABLE
    assert slave.status()["relay"]["relayed"] == 1
    assert metric_value(slave.metrics(), "rmq_relayed_writes_total", cluster="DefaultCluster", broker="broker-s",
                        broker_id="1") == 1
    # Without a master to follow, a slave refuses at once (it was not demoted: no wait).
    master.stop()
    poll(lambda: slave.status()["relay"]["target"] is None, 30, what="the slave lost its master")
    started = time.monotonic()
    assert send(slave, "nowhere") == ResponseCode.SERVICE_NOT_AVAILABLE
    assert time.monotonic() - started < 1.5


def test_a_consumer_sending_back_to_a_slave_reaches_the_master(cluster: Cluster) -> None:
    """CONSUMER_SEND_MSG_BACK names a commitlog offset, the same on the master: relayed, the
    message goes to the group's DLQ on the master (delayLevel -1)."""
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-b")
    slave = cluster.broker(ns.addr, name="broker-b", broker_id=1, role="SLAVE", haMasterAddress=ha_addr(master))
    poll(lambda: slave.status()["relay"]["target"] == master.addr, 20, what="slave follows, relay target known")
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=1)
    resp = send_raw(master.addr, TOPIC, b"to be sent back")
    assert resp.code == ResponseCode.SUCCESS
    wait_caught_up(master, [slave])
    phy = int(resp.ext_fields["msgId"][-16:], 16)  # the offset message id's last 8 bytes
    back = rpc(slave.addr, RequestCode.CONSUMER_SEND_MSG_BACK,
               {"group": "CG_BACK", "offset": str(phy), "delayLevel": "-1", "originMsgId": resp.ext_fields["msgId"],
                "originTopic": TOPIC})
    assert back.code == ResponseCode.SUCCESS, back
    dlq = rpc(master.addr, RequestCode.GET_MAX_OFFSET, {"topic": "%DLQ%CG_BACK", "queueId": "0"})
    assert dlq.code == ResponseCode.SUCCESS and dlq.ext_fields["offset"] == "1", dlq
    assert slave.status()["relay"]["relayed"] == 1


def test_a_demoted_master_relays_only_to_a_master_it_completed_the_handshake_with(cluster: Cluster) -> None:
    """Demoted again, a broker's HA client reconnects to the master it followed in an earlier term
    (here a slave that does not answer). A TCP connection alone proves nothing about that peer: it
    is no relay target until the handshake found it a master, so sends wait and are refused as
    "following no master" instead of going to a broker that is no master."""
    ns = cluster.namesrv()
    a = cluster.broker(ns.addr, name="broker-p", role="SYNC_MASTER")
    b = cluster.broker(ns.addr, name="broker-p", broker_id=1, role="SLAVE", haMasterAddress=ha_addr(a))
    poll(lambda: follows(b, a), 20, what="b follows a")
    create_topic_and_wait(a.addr, ns.addr, TOPIC, queues=1)
    hand_over(a, b, "SYNC_MASTER")
    poll(lambda: a.status()["relay"]["target"] == b.addr, 20, what="a follows b")
    assert a.popen is not None
    a.popen.send_signal(signal.SIGSTOP)  # its HA port still accepts connections (the kernel's backlog)
    try:
        code, body = role(b, role="SLAVE", brokerId=1, epoch=1)
        assert code == 200, body
        poll(lambda: b.status()["ha"]["connects"] >= 2, 10, what="b connected to a's HA port again")
        time.sleep(0.3)
        assert b.status()["relay"]["target"] is None, b.status()["relay"]
        resp = send_raw(b.addr, TOPIC, b"during the hand-over")
        assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE and "following no master" in (resp.remark or ""), resp
        assert b.status()["relay"]["failed"] == 0
    finally:
        a.popen.send_signal(signal.SIGCONT)


def test_a_relay_after_waiting_for_the_new_master_still_answers_within_the_send_timeout(cluster: Cluster) -> None:
    """The wait for a new master after a demotion and the relay share one budget, under the
    clients' 3 s send timeout: a client that timed out sends again a message the master may have
    stored meanwhile. Here the master is found after 1.5 s and its broker address never answers."""
    ns = cluster.namesrv()
    # The master tells the address 127.0.0.2:port (brokerIP1) but listens on 127.0.0.1 only;
    # what listens there accepts connections and never answers.
    a = cluster.broker(ns.addr, name="broker-q", brokerIP1="127.0.0.2")
    silent = socket.socket()
    silent.bind(("127.0.0.2", a.port))
    silent.listen(16)
    # Of a's group (a slave follows only its own group's master), in its own directory, and
    # registered nowhere: only the re-point below names it a master.
    other = cluster.workdir / "b"
    other.mkdir()
    b = BrokerProc(other, None, name="broker-q")
    cluster.procs.append(b)
    b.start()
    code, body = role(b, role="SLAVE", brokerId=1, epoch=0)
    assert code == 200, body
    try:
        answer: list[tuple[int, float]] = []

        def send() -> None:
            started = time.monotonic()
            resp = send_raw(b.addr, TOPIC, b"slow master", timeout=10)
            answer.append((int(resp.code), time.monotonic() - started))

        sender = threading.Thread(target=send)
        sender.start()
        time.sleep(1.5)
        code, raw = b.admin("/ha/master", "POST", json.dumps({"haAddress": ha_addr(a), "epoch": 0}).encode())
        assert code == 200, raw
        sender.join(15)
        assert answer and b.status()["relay"] == {"enabled": True, "target": f"127.0.0.2:{a.port}", "relayed": 0,
                                                  "failed": 1}, (answer, b.status()["relay"])
        code_, elapsed = answer[0]
        assert code_ == ResponseCode.SERVICE_NOT_AVAILABLE and elapsed < 2.9, answer
    finally:
        silent.close()


def test_a_slave_relays_to_the_master_it_streams_from_not_to_a_stale_metadata_master(cluster: Cluster) -> None:
    """Re-pointed with the HA address only (POST /ha/master without brokerAddress), a slave's
    metadata sync still names the old master, now a slave: the relay goes where the slave streams
    from, whose broker address the master tells in the HA handshake."""
    ns = cluster.namesrv()
    a = cluster.broker(ns.addr, name="broker-m", role="SYNC_MASTER")
    b = cluster.broker(ns.addr, name="broker-m", broker_id=1, role="SLAVE", haMasterAddress=ha_addr(a))
    c = cluster.broker(ns.addr, name="broker-m", broker_id=2, role="SLAVE", haMasterAddress=ha_addr(a))
    poll(lambda: follows(b, a) and follows(c, a), 20, what="b and c follow a")
    create_topic_and_wait(a.addr, ns.addr, TOPIC, queues=1)
    hand_over(a, b, "SYNC_MASTER")
    code, raw = c.admin("/ha/master", "POST", json.dumps({"haAddress": ha_addr(b), "epoch": 1}).encode())
    assert code == 200, raw
    poll(lambda: c.status()["ha"]["masterAddress"] == ha_addr(b) and c.status()["relay"]["target"] is not None, 20,
         what="c streams from b")
    assert c.status()["relay"]["target"] == b.addr, c.status()["relay"]
    resp = send_raw(c.addr, TOPIC, b"via c")
    assert resp.code == ResponseCode.SUCCESS, resp


def _send_from(local_host: str, broker: BrokerProc, ext: dict[str, str], body: bytes) -> tuple[RemotingCommand, int]:
    """SEND_MESSAGE on a connection bound to ``local_host``: the answer and the client's port."""
    host, port = broker.addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10, source_address=(local_host, 0)) as s:
        s.sendall(encode_frame(RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields=ext, body=body)))
        data = b""
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            chunk = s.recv(65536)
            assert chunk, "the broker closed the connection"
            data += chunk
        return decode_frame_payload(data[4:]), s.getsockname()[1]


def _born_host(broker: BrokerProc, offset_msg_id: str) -> tuple[str, int]:
    resp = rpc(broker.addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(decode_offset_msg_id(offset_msg_id)[2])})
    assert resp.code == ResponseCode.SUCCESS, resp
    return decode_record(bytes(resp.body), 0).born_host


def test_a_relayed_message_keeps_the_client_as_its_born_host(cluster: Cluster) -> None:
    """The master stores the client's address a relaying slave names (not the slave's own
    connection), and ignores that claim from anyone but a slave it streams to."""
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-h")
    slave = cluster.broker(ns.addr, name="broker-h", broker_id=1, role="SLAVE", haMasterAddress=ha_addr(master))
    poll(lambda: slave.status()["relay"]["target"] == master.addr, 20, what="slave follows, relay target known")
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=1)
    ext = {"producerGroup": "PG_BORN", "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
           "queueId": "0", "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
           "properties": "WAIT\x01true\x02"}
    # From 127.0.0.2: neither the slave (127.0.0.1) nor any HA peer of the master.
    resp, client_port = _send_from("127.0.0.2", slave, ext, b"relayed")
    assert resp.code == ResponseCode.SUCCESS, resp
    assert slave.status()["relay"]["relayed"] == 1
    assert _born_host(master, resp.ext_fields["msgId"]) == ("127.0.0.2", client_port)
    # A client naming another address itself is not believed.
    resp, client_port = _send_from("127.0.0.2", master, {**ext, wire.RELAYED_FOR: "10.9.8.7:1234"}, b"direct")
    assert resp.code == ResponseCode.SUCCESS, resp
    assert _born_host(master, resp.ext_fields["msgId"]) == ("127.0.0.2", client_port)
