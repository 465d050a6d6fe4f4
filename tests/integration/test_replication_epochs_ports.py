"""Replication with real processes: a configured haListenPort, and epochs across restarts and masters.

- A non-default ``haListenPort`` (not listenPort+1) is where the master serves HA, where a
  Direct slave connects, and what the nameserver hands a slave to follow (haServerAddr).
- An epoch taken by a promotion survives a restart (``config/epoch.json``) and older epochs are
  refused; a slave never streams from a master of an older epoch than its own, and follows the
  same master once it is at a newer one.
"""

from __future__ import annotations

import functools
import json
import shutil
import signal
import socket
import struct
import threading
import time
from typing import Any

from rmqbroker.remoting.client import RemotingConnectError
from rmqbroker.remoting.codes import ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import poll, send_raw, wait_caught_up
from tests.integration.test_replication import commitlog_bytes
from tests.integration.test_replication_extra import follows
from tests.support.procs import BrokerProc, free_port, metric_value


def post(broker: BrokerProc, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    code, raw = broker.admin(path, "POST", json.dumps(body).encode())
    try:
        obj: dict[str, Any] = json.loads(raw)
    except ValueError:
        obj = {"raw": raw.decode(errors="replace")}
    return code, obj


def separate_ha_port(broker_port: int) -> int:
    """A free port that is not ``broker_port + 1`` (the default HA port)."""
    while (port := free_port()) in (broker_port, broker_port + 1):
        pass
    return port


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def assert_same_log(master: BrokerProc, slave: BrokerProc) -> int:
    end = wait_caught_up(master, [slave], timeout=15)
    assert end > 0
    assert commitlog_bytes(slave.store_dir, end) == commitlog_bytes(master.store_dir, end)
    return end


def send_some(broker: BrokerProc, topic: str, n: int, tag: str) -> None:
    for i in range(n):
        resp = send_raw(broker.addr, topic, f"{tag}-{i}".encode() * 20)
        assert resp.code == 0, resp.remark


# ---------------------------------------------------------------- haListenPort
def test_configured_ha_listen_port_direct(cluster: Cluster) -> None:
    master = cluster.broker(None, name="broker-p", start=False)
    ha_port = separate_ha_port(master.port)
    master.conf["haListenPort"] = ha_port
    master.write_conf()
    master.start()
    st = master.status()
    assert st["ha"]["listenPort"] == ha_port and st["haServerAddr"] == f"127.0.0.1:{ha_port}"
    assert port_open(ha_port) and not port_open(master.port + 1)  # listenPort+1 is not used
    slave = cluster.broker(None, name="broker-p", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{ha_port}")
    send_some(master, "PortTopic", 50, "direct")
    assert_same_log(master, slave)
    sst = slave.status()
    assert sst["ha"]["masterAddress"] == f"127.0.0.1:{ha_port}" and sst["ha"]["connected"] is True
    assert len(master.status()["ha"]["slaves"]) == 1


def test_configured_ha_listen_port_learned_from_nameserver(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-q", start=False)
    ha_port = separate_ha_port(master.port)
    master.conf["haListenPort"] = ha_port
    master.write_conf()
    master.start()
    # No haMasterAddress: the slave follows the HA address the nameserver returns on registration.
    slave = cluster.broker(ns.addr, name="broker-q", broker_id=1, role="SLAVE")
    assert "haMasterAddress" not in slave.conf
    poll(lambda: slave.status()["ha"]["masterAddress"] == f"127.0.0.1:{ha_port}", 15,
         what="slave learned the configured HA port from the nameserver")
    send_some(master, "PortNsTopic", 50, "ns")
    assert_same_log(master, slave)
    assert slave.status()["ha"]["connected"] is True
    assert slave.status()["metadataSync"]["masterAddress"] == master.addr


# ---------------------------------------------------------------- epochs
def test_promotion_epoch_persists_across_restart_and_older_epochs_are_refused(cluster: Cluster) -> None:
    b = cluster.broker(None, name="broker-e", broker_id=1, role="SLAVE")
    assert b.status()["epoch"] == 0
    code, body = post(b, "/role", {"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 2})
    assert code == 200, body
    assert body["epoch"] == 2
    send_some(b, "EpochTopic", 10, "e2")
    st = b.status()
    assert (st["role"], st["brokerId"], st["epoch"]) == ("ASYNC_MASTER", 0, 2)
    end = st["maxPhyOffset"]
    saved = json.loads((b.store_dir / "config" / "epoch.json").read_text())
    assert saved["epoch"] == 2 and saved["ownEpoch"] == 2
    assert saved["history"] == [{"epoch": 2, "startOffset": 0}]
    # Restarted as the master it now is (as the operator rewrites its configuration).
    b.stop()
    b.conf.update(brokerRole="ASYNC_MASTER", brokerId=0)
    b.write_conf()
    b.start()
    st = b.status()
    assert (st["role"], st["epoch"], st["maxPhyOffset"]) == ("ASYNC_MASTER", 2, end)
    code, body = post(b, "/role", {"role": "SLAVE", "brokerId": 1, "epoch": 1})
    assert code == 409, body
    assert "older" in body["error"]
    code, body = post(b, "/role", {"role": "SYNC_MASTER", "brokerId": 0, "epoch": 1})
    assert code == 409, body
    st = b.status()
    assert (st["role"], st["epoch"]) == ("ASYNC_MASTER", 2)  # nothing changed
    # The same epoch is still this broker's own term: re-asserting it is allowed ...
    code, body = post(b, "/role", {"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 2})
    assert code == 200, body
    # ... and a restart as SLAVE keeps the epoch too, so it still refuses epoch 1 and masters of it.
    b.stop()
    b.conf.update(brokerRole="SLAVE", brokerId=1)
    b.write_conf()
    b.start()
    st = b.status()
    assert (st["role"], st["epoch"]) == ("SLAVE", 2)
    code, body = post(b, "/ha/master", {"haAddress": "127.0.0.1:1", "epoch": 1})
    assert code == 409, body
    code, body = post(b, "/role", {"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 1})
    assert code == 409, body
    assert (b.status()["epoch"], b.status()["ownEpoch"]) == (2, 2)
    # The term's owner, a slave by a configuration that forgot its promotion (a group created again
    # on its volumes), is made master at its own epoch again: the operator's restoration.
    code, body = post(b, "/role", {"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 2})
    assert code == 200, body
    st = b.status()
    assert (st["role"], st["epoch"], st["ownEpoch"], st["maxPhyOffset"]) == ("ASYNC_MASTER", 2, 2, end)


def test_slave_does_not_stream_from_a_master_of_an_older_epoch(cluster: Cluster) -> None:
    master = cluster.broker(None, name="broker-f")
    send_some(master, "OldEpochTopic", 30, "old")
    assert master.status()["epoch"] == 0
    s = cluster.broker(None, name="broker-f", broker_id=1, role="SLAVE")
    # The slave belongs to a group that has moved on to epoch 2 (it was demoted at it).
    code, body = post(s, "/role", {"role": "SLAVE", "brokerId": 1, "epoch": 2})
    assert code == 200, body
    assert s.status()["epoch"] == 2
    ha_addr = f"127.0.0.1:{master.port + 1}"
    # Re-pointing at a master announced with an older epoch is refused outright.
    code, body = post(s, "/ha/master", {"haAddress": ha_addr, "brokerAddress": master.addr, "epoch": 1})
    assert code == 409, body
    assert s.status()["ha"]["masterAddress"] is None
    # Re-pointed without an epoch: the HA handshake finds the master at epoch 0 and refuses to stream.
    code, body = post(s, "/ha/master", {"haAddress": ha_addr, "brokerAddress": master.addr})
    assert code == 200, body
    poll(lambda: s.status()["ha"]["refusedStreams"] >= 1, 10, what="stream from the older master refused")
    st = s.status()
    assert st["maxPhyOffset"] == 0 and st["epoch"] == 2 and st["ha"]["truncatedBytes"] == 0
    assert "at epoch 0, older than ours (2)" in s.log_text()
    # The same master, promoted to a newer epoch, is followed on the slave's next attempt.
    promoted_at = master.status()["maxPhyOffset"]
    code, body = post(master, "/role", {"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 3})
    assert code == 200, body
    send_some(master, "OldEpochTopic", 10, "new")
    assert_same_log(master, s)
    st = s.status()
    assert st["epoch"] == 3 and st["ha"]["connected"] is True and st["ha"]["truncatedBytes"] == 0
    saved = json.loads((s.store_dir / "config" / "epoch.json").read_text())
    assert saved["epoch"] == 3 and saved["history"] == [{"epoch": 3, "startOffset": promoted_at}]
    # Having adopted epoch 3 from its master, the slave may not become a second writer of it.
    code, body = post(s, "/role", {"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 3})
    assert code == 409 and "another broker's term" in body["error"], body
    send_some(master, "OldEpochTopic", 5, "after-refused-promotion")
    assert_same_log(master, s)
    st = s.status()
    assert (st["role"], st["epoch"], st["ha"]["connected"]) == ("SLAVE", 3, True)


# ---------------------------------------------------------------- fencing
def test_fenced_slave_stops_acknowledging_its_master_until_re_pointed(cluster: Cluster) -> None:
    """POST /ha/fence, the first step of a failover: the slave drops its master of an older epoch
    at once (a SYNC_MASTER then gets no ack for a send), reports a final offset, and follows again
    only when re-pointed."""
    master = cluster.broker(None, name="broker-g", role="SYNC_MASTER")
    ha_addr = f"127.0.0.1:{master.port + 1}"
    s = cluster.broker(None, name="broker-g", broker_id=1, role="SLAVE", haMasterAddress=ha_addr)
    # In sync, not only connected: a SYNC send before the slave's first report finds no slave.
    poll(lambda: any(x.get("inSync") for x in master.status()["ha"]["slaves"]), 10, what="slave in sync")
    send_some(master, "FenceTopic", 10, "before")
    end = assert_same_log(master, s)

    code, body = post(master, "/ha/fence", {"epoch": 1})
    assert code == 409 and "only a slave is fenced" in body["error"], body
    code, body = post(s, "/ha/fence", {"epoch": "1"})
    assert code == 400, body
    code, body = post(s, "/ha/fence", {"epoch": 1})
    assert code == 200, body
    assert body == {"epoch": 0, "fencedBelowEpoch": 1, "maxPhyOffset": end}
    poll(lambda: s.status()["ha"]["refusedStreams"] >= 1, 10, what="the master's stream refused while fenced")
    st = s.status()
    assert st["ha"]["fencedBelowEpoch"] == 1 and st["ha"]["connected"] is False
    assert "fenced below epoch 1" in s.log_text()
    # The master, at epoch 0, finds no slave to acknowledge a SYNC send; the slave stays where it was.
    resp = send_raw(master.addr, "FenceTopic", b"after-fence")
    assert resp.code != 0, "a SYNC_MASTER answered SEND_OK with its only slave fenced"
    assert s.status()["maxPhyOffset"] == end
    # Restarted before any re-point, it is still fenced: its configuration names the old master,
    # which may only be hung, and it must not go back to acknowledging it.
    s.stop()
    s.start()
    poll(lambda: s.status()["ha"]["refusedStreams"] >= 1, 10, what="the old master refused after the restart")
    st = s.status()
    assert st["ha"]["fencedBelowEpoch"] == 1 and st["ha"]["connected"] is False and st["maxPhyOffset"] == end
    assert send_raw(master.addr, "FenceTopic", b"after-restart").code != 0
    # A re-point (here: the same master, kept after all) lifts the fence.
    code, body = post(s, "/ha/master", {"haAddress": ha_addr, "brokerAddress": master.addr})
    assert code == 200, body
    poll(lambda: s.status()["ha"]["connected"], 10, what="slave following again")
    assert s.status()["ha"]["fencedBelowEpoch"] == 0
    # The master counts the slave again once its handshake is done and it has acknowledged.
    poll(lambda: any(x.get("inSync") for x in master.status()["ha"]["slaves"]), 10, what="slave in sync again")
    send_some(master, "FenceTopic", 5, "after-repoint")
    assert_same_log(master, s)


def test_a_re_point_answers_once_the_old_master_can_write_nothing_more(cluster: Cluster) -> None:
    """POST /ha/master answers after the previous master's connection is closed and its writes in
    flight are complete: its ``maxPhyOffset`` is final for that master even while it goes on
    appending (an operator re-pointing slaves after a failover reads where each one stopped)."""
    master = cluster.broker(None, name="broker-q")
    s = cluster.broker(None, name="broker-q", broker_id=1, role="SLAVE", haMasterAddress=f"127.0.0.1:{master.port + 1}")
    send_some(master, "RepointTopic", 5, "before")
    assert_same_log(master, s)
    stop = threading.Event()

    def keep_sending() -> None:
        while not stop.is_set():
            assert send_raw(master.addr, "RepointTopic", b"x" * 4000).code == 0

    sender = threading.Thread(target=keep_sending, daemon=True)
    sender.start()
    try:
        poll(lambda: s.status()["maxPhyOffset"] > 100_000, 15, what="the stream flowing")
        code, body = post(s, "/ha/master", {"haAddress": f"127.0.0.1:{free_port()}", "brokerAddress": master.addr})
        assert code == 200, body
        final = body["maxPhyOffset"]
        time.sleep(0.5)
    finally:
        stop.set()
        sender.join(10)
    assert master.status()["maxPhyOffset"] > final  # the master went on appending
    assert s.status()["maxPhyOffset"] == final, "bytes of the old master reached the log after the answer"
    assert commitlog_bytes(s.store_dir, final) == commitlog_bytes(master.store_dir, final)


def test_a_master_restarted_in_another_brokers_term_takes_no_writes(cluster: Cluster) -> None:
    """A master demoted at epoch 1 (its slave was promoted there) and restarted from its unchanged
    broker.conf (still brokerId 0 and a master, as a ConfigMap not yet updated says) would write
    a second log of epoch 1, which its followers could not tell from the first. It refuses sends
    until it is made a slave (it then follows the new master) or promoted at a new epoch."""
    a = cluster.broker(None, name="broker-t")
    b = cluster.broker(None, name="broker-t", broker_id=1, role="SLAVE", haMasterAddress=f"127.0.0.1:{a.port + 1}")
    send_some(a, "TermTopic", 5, "a")
    assert_same_log(a, b)
    assert post(b, "/role", {"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 1})[0] == 200
    assert post(a, "/role", {"role": "SLAVE", "brokerId": 1, "epoch": 1})[0] == 200
    b_ha = f"127.0.0.1:{b.port + 1}"
    assert post(a, "/ha/master", {"haAddress": b_ha, "brokerAddress": b.addr, "epoch": 1})[0] == 200
    send_some(b, "TermTopic", 5, "b")
    end = assert_same_log(b, a)
    assert a.status()["termFenced"] is False

    a.stop()
    a.start()  # its broker.conf says ASYNC_MASTER, brokerId 0
    st = a.status()
    assert (st["role"], st["epoch"], st["ownEpoch"], st["termFenced"]) == ("ASYNC_MASTER", 1, None, True), st
    resp = send_raw(a.addr, "TermTopic", b"a second writer of epoch 1")
    assert resp.code == ResponseCode.NO_PERMISSION and "another broker began" in (resp.remark or ""), resp
    assert "which another broker began" in a.log_text()
    assert a.status()["maxPhyOffset"] == end and b.status()["termFenced"] is False
    # Epoch 1 is b's term: a mode change at it leaves a refusing writes. Made a slave, it follows b.
    assert post(a, "/role", {"role": "SYNC_MASTER", "brokerId": 0, "epoch": 1})[0] == 200
    assert a.status()["termFenced"] is True
    assert post(a, "/role", {"role": "SLAVE", "brokerId": 1, "epoch": 1})[0] == 200
    assert post(a, "/ha/master", {"haAddress": b_ha, "brokerAddress": b.addr, "epoch": 1})[0] == 200
    assert a.status()["termFenced"] is False
    send_some(b, "TermTopic", 3, "b2")
    assert assert_same_log(b, a) > end
    # Promoted at a new epoch (b gone), it writes again.
    b.kill9()
    code, body = post(a, "/role", {"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 2})
    assert code == 200, body
    assert a.status()["termFenced"] is False
    assert send_raw(a.addr, "TermTopic", b"epoch 2").code == ResponseCode.SUCCESS


# ---------------------------------------------------------------- only masters stream
def test_a_slave_serves_no_follower_until_it_is_promoted(cluster: Cluster) -> None:
    """A slave's HA port answers the epoch query with its role and refuses to stream: a broker
    pointed at a slave (a stale address during a failover) never takes bytes or acks for them
    from it, and follows it once it is a master."""
    master = cluster.broker(None, name="broker-h")
    s = cluster.broker(None, name="broker-h", broker_id=1, role="SLAVE",
                       haMasterAddress=f"127.0.0.1:{master.port + 1}")
    send_some(master, "ChainTopic", 20, "before")
    end = assert_same_log(master, s)

    # A raw peer: the query's answer names the role; a report (where to start) closes the connection.
    with socket.create_connection(("127.0.0.1", s.port + 1), timeout=5) as peer:
        peer.sendall(struct.pack(">q", -2))
        offset, size = struct.unpack(">qi", _read_exact(peer, 12))
        answer = json.loads(_read_exact(peer, size))
        assert offset == -2 and answer["role"] == "SLAVE" and answer["maxOffset"] == end, answer
        peer.sendall(struct.pack(">q", 0))
        assert _read_exact(peer, 1, allow_eof=True) == b"", "a slave streamed to a follower"
    poll(lambda: s.status()["ha"]["refusedFollowers"] == 1, 5, what="follower refused on the slave")
    assert "asked to follow this broker, which is SLAVE" in s.log_text()
    assert metric_value(s.metrics(), "rmq_ha_refused_followers_total") == 1

    # A broker of this project pointed at the slave refuses it as a master and holds nothing.
    t = cluster.broker(None, name="broker-h", broker_id=2, role="SLAVE", haMasterAddress=f"127.0.0.1:{s.port + 1}")
    poll(lambda: t.status()["ha"]["refusedStreams"] >= 1, 10, what="the slave refused as a master")
    assert t.status()["maxPhyOffset"] == 0
    assert "is a SLAVE (epoch 0), not a master to follow" in t.log_text()
    assert s.status()["ha"]["slaves"] == []

    # Promoted, the same broker is followed from where it is; the old master is no longer written to.
    code, body = post(s, "/role", {"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 1})
    assert code == 200, body
    send_some(s, "ChainTopic", 10, "after")
    assert assert_same_log(s, t) > end
    assert t.status()["epoch"] == 1


def refused_streams(slave: BrokerProc) -> bool:
    return bool(slave.status()["ha"]["refusedStreams"] >= 1)


def test_a_slave_does_not_follow_the_master_of_another_broker_group(cluster: Cluster) -> None:
    """A slave pointed at another group's master (a wrong haMasterAddress, or a port reused by
    another group) refuses it: it takes none of its log, and none of its acks can release that
    master's SYNC sends."""
    master = cluster.broker(None, name="broker-g", role="SYNC_MASTER")
    ha = f"127.0.0.1:{master.port + 1}"
    other_name = cluster.broker(None, name="broker-x", broker_id=1, role="SLAVE", haMasterAddress=ha)
    other_cluster = cluster.broker(None, name="broker-g", broker_id=1, role="SLAVE", haMasterAddress=ha,
                                   brokerClusterName="OtherCluster")
    refusals = ((other_name, "'broker-x' in 'DefaultCluster'"), (other_cluster, "'broker-g' in 'OtherCluster'"))
    for slave, told in refusals:
        poll(functools.partial(refused_streams, slave), 10, what="the foreign master refused")
        assert f"not of this broker's group ({told}); not following it" in slave.log_text()
    assert master.status()["ha"]["slaves"] == []
    resp = send_raw(master.addr, "GroupTopic", b"no slave of this group" * 5)
    assert resp.code == ResponseCode.SLAVE_NOT_AVAILABLE, (resp.code, resp.remark)
    assert other_name.status()["maxPhyOffset"] == other_cluster.status()["maxPhyOffset"] == 0
    # What the slaves went by: the epoch answer names the master's group.
    with socket.create_connection(("127.0.0.1", master.port + 1), timeout=5) as peer:
        peer.sendall(struct.pack(">q", -2))
        _, size = struct.unpack(">qi", _read_exact(peer, 12))
        answer = json.loads(_read_exact(peer, size))
    assert (answer["brokerName"], answer["brokerClusterName"]) == ("broker-g", "DefaultCluster"), answer

    # Its own group's slave follows it and makes SYNC sends succeed.
    own = cluster.broker(None, name="broker-g", broker_id=2, role="SLAVE", haMasterAddress=ha)
    poll(lambda: follows(own, master), 10, what="own slave following")
    # Connected is not yet counted: the master counts a slave from its first offset report on.
    poll(lambda: any(s["inSync"] for s in master.status()["ha"]["slaves"]), 10, what="own slave's first report")
    send_some(master, "GroupTopic", 3, "own")
    assert_same_log(master, own)


def _read_exact(sock: socket.socket, n: int, *, allow_eof: bool = False) -> bytes:
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            assert allow_eof, f"connection closed after {buf!r}"
            return buf
        buf += chunk
    return buf


def test_a_master_back_on_an_empty_volume_takes_no_writes(cluster: Cluster) -> None:
    """The operator writes the group's epoch into every broker.conf (``haGroupEpoch``). A master
    whose volume was replaced while it was down comes back at epoch 0 with an empty log; a slave
    that lost its volume too would follow it and acknowledge its sends, which are cut once the
    slave holding the group's log is promoted. It refuses sends until it is promoted at a new
    epoch or made a slave."""
    wiped = cluster.broker(None, name="broker-w", haGroupEpoch="2")
    st = wiped.status()
    assert (st["role"], st["epoch"], st["maxPhyOffset"], st["termFenced"]) == ("ASYNC_MASTER", 0, 0, True), st
    resp = send_raw(wiped.addr, "WipedTopic", b"a write on a log the group will not keep")
    assert resp.code == ResponseCode.NO_PERMISSION and "older than its group's" in (resp.remark or ""), resp
    assert "older than its group's epoch 2" in wiped.log_text()
    assert wiped.status()["maxPhyOffset"] == 0
    # A mode change at an epoch below the group's leaves it refusing; a promotion above it ends that.
    assert post(wiped, "/role", {"role": "SYNC_MASTER", "brokerId": 0, "epoch": 1})[0] == 200
    assert wiped.status()["termFenced"] is True
    assert post(wiped, "/role", {"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 3})[0] == 200
    assert wiped.status()["termFenced"] is False
    assert send_raw(wiped.addr, "WipedTopic", b"taken at epoch 3").code == ResponseCode.SUCCESS
    # A group at epoch 0 fences nobody: a broker not told the group's epoch writes at once.
    fresh = cluster.broker(None, name="broker-f", haGroupEpoch="0")
    assert fresh.status()["termFenced"] is False
    assert send_raw(fresh.addr, "FreshTopic", b"first").code == ResponseCode.SUCCESS


def test_a_slave_does_not_take_a_replaced_log_for_the_continuation_of_its_own(cluster: Cluster) -> None:
    """A master whose volume was replaced comes back empty at epoch 0 and takes sends (ASYNC) while
    its slave is away. Once its log is longer than the slave's, offsets and epochs alone would let
    the slave append the new log's bytes after its own: a log of two logs. The log identity
    (``logId``, drawn by the master that began the log) tells them apart: the slave keeps its
    bytes, reports them as ahead of the master and does not follow. Promoted, it serves them;
    the replaced master, demoted, drops its log whole and follows."""
    ns = cluster.namesrv()  # the slave's metadata sync learns the master's address from it
    a = cluster.broker(ns.addr, name="broker-l")
    b = cluster.broker(ns.addr, name="broker-l", broker_id=1, role="SLAVE", haMasterAddress=f"127.0.0.1:{a.port + 1}",
                       slaveSyncInitialDelay="300", slaveSyncInterval="500")
    send_some(a, "LogTopic", 5, "a")
    topics = b.store_dir / "config" / "topics.json"
    poll(lambda: topics.exists() and "LogTopic" in topics.read_text(), 10, what="the topic synced")
    kept = assert_same_log(a, b)
    old_id = a.status()["logId"]
    assert old_id and b.status()["logId"] == old_id
    assert b.popen is not None
    b.popen.send_signal(signal.SIGSTOP)
    try:
        a.kill9()
        shutil.rmtree(a.store_dir)
        a.start()
        assert a.status()["logId"] not in (None, old_id)
        while a.status()["maxPhyOffset"] <= kept + 4096:
            send_some(a, "ReplacedTopic", 5, "replaced")
    finally:
        b.popen.send_signal(signal.SIGCONT)
    poll(lambda: b.status()["ha"]["aheadOfMasterBytes"] == kept, 20, what="the slave reporting its bytes as ahead")
    time.sleep(1)
    assert b.status()["maxPhyOffset"] == kept and b.status()["logId"] == old_id
    assert "not this broker's log" in b.log_text()
    # Nor its metadata: the replaced master's topic table lacks LogTopic, which would delete the
    # slave's topic and consume queues.
    poll(lambda: "HA stream is refused" in (b.status()["metadataSync"].get("lastError") or ""), 10,
         what="the metadata sync refusing the master")
    time.sleep(1.5)  # three sync periods
    assert "LogTopic" in topics.read_text()
    assert (b.store_dir / "consumequeue" / "LogTopic").is_dir()
    # The operator's failover, by hand: promote the slave, demote the replaced master to follow it.
    assert post(b, "/role", {"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 1})[0] == 200
    assert post(a, "/role", {"role": "SLAVE", "brokerId": 1, "epoch": 1})[0] == 200
    b_ha = f"127.0.0.1:{b.port + 1}"
    assert post(a, "/ha/master", {"haAddress": b_ha, "brokerAddress": b.addr, "epoch": 1})[0] == 200
    send_some(b, "LogTopic", 3, "b")
    assert assert_same_log(b, a) > kept
    assert a.status()["logId"] == old_id
    assert "dropping its" in a.log_text()


def test_a_master_that_may_not_write_refuses_the_very_first_send(cluster: Cluster) -> None:
    """Senders waiting for a restarted master connect the moment its port opens. The term check
    runs before the listener opens, so not even the first send lands in a log the group will not
    keep (it once ran with the HA service, a few milliseconds after the port opened)."""
    wiped = cluster.broker(None, start=False, name="broker-v", haGroupEpoch="1")
    first: list[int] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set() and not first:
            try:
                first.append(int(send_raw(wiped.addr, "FirstTopic", b"first", timeout=5).code))
            except RemotingConnectError:
                time.sleep(0.001)

    sender = threading.Thread(target=hammer, daemon=True)
    sender.start()
    try:
        wiped.start()
        poll(lambda: first, 10, what="an answer to the first send")
    finally:
        stop.set()
        sender.join(10)
    assert first == [ResponseCode.NO_PERMISSION]
    assert wiped.status()["maxPhyOffset"] == 0
