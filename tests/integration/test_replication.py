"""Master/slave replication with real broker processes on loopback (issue: HA + metadata sync)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.store.errors import CorruptRecordError
from rmqbroker.store.record import check_record, decode_record
from tests.conftest import Cluster
from tests.integration.helpers import (
    StreamProducer,
    assert_sending,
    create_topic,
    create_topic_and_wait,
    poll,
    rpc,
    send_raw,
    wait_caught_up,
)
from tests.support.procs import BrokerProc

SEG = 2 * 1024 * 1024  # small commitlog segments so streams cross segment boundaries


def commitlog_bytes(store: Path, end: int) -> bytes:
    """The commitlog [0, end) read from the segment files."""
    out = bytearray()
    for f in sorted((store / "commitlog").iterdir()):
        start = int(f.name)
        if start >= end:
            break
        with open(f, "rb") as fh:
            out += fh.read(min(SEG, end - start))
    return bytes(out)


def record_spans(data: bytes) -> Iterator[tuple[int, int]]:
    """``(position, size)`` of each whole record at the start of a segment's bytes (checked with the
    record codec), then ``(position, 0)`` at its end-of-segment marker; stops at an unwritten or
    partial tail."""
    pos = 0
    while pos + 8 <= len(data):
        try:
            size = check_record(data, pos)
        except CorruptRecordError:
            return
        yield pos, size
        if size == 0:
            return
        pos += size


def stored_keys(store: Path) -> set[str]:
    """KEYS of every whole record in a store's commitlog segments."""
    keys: set[str] = set()
    for f in sorted((store / "commitlog").iterdir()):
        data = f.read_bytes()
        for pos, size in record_spans(data):
            if size and (rec := decode_record(data, pos)).keys:
                keys.add(rec.keys)
    return keys


def consume_queues(store: Path) -> dict[str, bytes]:
    """Every consume queue's written units (trailing empty units stripped)."""
    out: dict[str, bytes] = {}
    root = store / "consumequeue"
    if not root.exists():
        return out
    for topic in sorted(root.iterdir()):
        for q in sorted(topic.iterdir()):
            data = b"".join(f.read_bytes() for f in sorted(q.iterdir()))
            end = len(data) - len(data) % 20
            while end >= 20 and data[end - 20:end] == bytes(20):
                end -= 20
            out[f"{topic.name}/{q.name}"] = data[:end]
    return out


def group(cluster: Cluster, ns: str | None, replicas: int, role: str = "ASYNC_MASTER", direct: bool = True,
          **conf: Any) -> list[BrokerProc]:
    conf.setdefault("maxMessageSize", 1024 * 1024)
    master = cluster.broker(ns, name="broker-r", broker_id=0, role=role, mappedFileSizeCommitLog=SEG, **conf)
    slaves = []
    for i in range(1, replicas):
        extra = dict(conf)
        if direct:
            extra["haMasterAddress"] = f"127.0.0.1:{master.port + 1}"
        slaves.append(cluster.broker(ns, name="broker-r", broker_id=i, role="SLAVE",
                                     mappedFileSizeCommitLog=SEG, **extra))
    return [master, *slaves]


def assert_commitlogs_identical(master: BrokerProc, slaves: list[BrokerProc]) -> None:
    """Once the slaves caught up, their commitlogs are byte-identical to the master's."""
    end = wait_caught_up(master, slaves)
    ref = commitlog_bytes(master.store_dir, end)
    assert len(ref) == end
    for s in slaves:
        assert commitlog_bytes(s.store_dir, end) == ref, f"slave {s.conf['brokerId']} commitlog differs"


def assert_replicas_identical(master: BrokerProc, slaves: list[BrokerProc]) -> None:
    """Identical commitlogs, and consume queues that agree."""
    assert_commitlogs_identical(master, slaves)
    ref_cq = poll(lambda: consume_queues(master.store_dir) or None, 5)
    for s in slaves:
        def agree(store_dir: Path = s.store_dir) -> bool:
            return consume_queues(store_dir) == ref_cq

        poll(agree, 15, what="consume queues agree")


def test_two_slaves_replicate_byte_identical_and_late_slave_catches_up(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    master, s1 = group(cluster, ns.addr, 2)
    create_topic_and_wait(master.addr, ns.addr, "RepTopic")
    producers = [StreamProducer(ns.addr, "RepTopic", f"p{i}", cluster.workdir / f"rep-p{i}.jsonl", count=1500,
                                size=700) for i in range(2)]
    # A slave restarted while the producers send resumes where it was (test_replication_resume.py
    # checks the offset it resumes from).
    time.sleep(2)
    s1.stop()
    offset_before = commitlog_bytes(s1.store_dir, 1 << 40)
    s1.start()
    late = cluster.broker(ns.addr, name="broker-r", broker_id=2, role="SLAVE", mappedFileSizeCommitLog=SEG,
                          maxMessageSize=1024 * 1024, haMasterAddress=f"127.0.0.1:{master.port + 1}")
    results = [r for p in producers for r in p.results()]
    ok = [r for r in results if r.get("status") == 0]
    assert len(ok) == 3000, [r for r in results if r.get("status") != 0][:5]
    assert master.status()["maxPhyOffset"] > SEG  # the stream crossed a segment boundary
    assert len(offset_before) > 0
    assert_replicas_identical(master, [s1, late])
    st = master.status()
    assert {s["ackedOffset"] for s in st["ha"]["slaves"]} == {st["maxPhyOffset"]}
    assert all(s["inSync"] for s in st["ha"]["slaves"]) and len(st["ha"]["slaves"]) == 2
    assert s1.status()["ha"]["connected"] is True


def all_threads_stopped(proc: BrokerProc) -> bool:
    """Whether every thread of a SIGSTOPped process has actually stopped (state T)."""
    assert proc.popen is not None
    tasks = Path(f"/proc/{proc.popen.pid}/task")
    return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for t in tasks.iterdir())


def test_sync_master_slave_not_available_and_flush_slave_timeout(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-s", role="SYNC_MASTER", syncFlushTimeout=1500)
    resp = send_raw(master.addr, "SyncTopic", b"no slave yet")
    assert resp.code == ResponseCode.SLAVE_NOT_AVAILABLE
    assert resp.ext_fields.get("msgId")  # stored on the master all the same
    slave = cluster.broker(ns.addr, name="broker-s", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}")
    poll(lambda: send_raw(master.addr, "SyncTopic", b"with slave").code == ResponseCode.SUCCESS, 20,
         what="SYNC send acknowledged by the slave")
    slave.signal(signal.SIGSTOP)
    try:
        # kill() does not wait for the stop: the slave's receiver thread could still ack the next
        # message before the group stop reaches it (the old single-threaded slave never could).
        poll(lambda: all_threads_stopped(slave), 5, interval=0.005, what="slave stopped")
        started = time.monotonic()
        resp = send_raw(master.addr, "SyncTopic", b"slave frozen")
        assert resp.code == ResponseCode.FLUSH_SLAVE_TIMEOUT
        assert time.monotonic() - started >= 1.4
        # the master keeps serving other requests meanwhile
        assert rpc(master.addr, RequestCode.GET_MAX_OFFSET, {"topic": "SyncTopic", "queueId": "0"}).code == 0
    finally:
        slave.signal(signal.SIGCONT)
    poll(lambda: send_raw(master.addr, "SyncTopic", b"thawed").code == ResponseCode.SUCCESS, 20)
    # A transaction half message (no consume-queue unit, so no arrival notification) is
    # replicated too, on an otherwise idle master: acknowledged, not FLUSH_SLAVE_TIMEOUT.
    resp = send_raw(master.addr, "SyncTopic", b"half", sys_flag=4)  # TRANSACTION_PREPARED_TYPE
    assert resp.code == ResponseCode.SUCCESS, resp.remark


def test_sync_master_kill9_loses_no_acknowledged_message(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    master, s1, s2 = group(cluster, ns.addr, 3, role="SYNC_MASTER")
    create_topic_and_wait(master.addr, ns.addr, "SyncKill")
    poll(lambda: len(master.status()["ha"]["slaves"]) == 2, 20, what="both slaves connected")
    producers = [StreamProducer(ns.addr, "SyncKill", f"k{i}", cluster.workdir / f"kill-k{i}.jsonl", count=100000,
                                seconds=10) for i in range(4)]
    time.sleep(4)
    assert_sending(producers)
    master.kill9()
    for p in producers:
        p.stop()  # sends after the kill only fail: no need to wait out their 10 s
    results = [r for p in producers for r in p.results()]
    acked = {r["key"] for r in results if r.get("status") == 0}
    assert len(acked) > 50
    for s in (s1, s2):
        s.stop()  # flushes everything the slave received
    on_slaves = stored_keys(s1.store_dir) | stored_keys(s2.store_dir)
    missing = acked - on_slaves
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages missing on the slaves"


def test_metadata_sync_and_unchanged_version_not_rewritten(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    master, slave = group(cluster, ns.addr, 2, slaveSyncInitialDelay=300, slaveSyncInterval=1000)
    create_topic_and_wait(master.addr, ns.addr, "MetaTopic")
    assert rpc(master.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "CG_META", "topic": "MetaTopic", "queueId": "1", "commitOffset": "7"}).code == 0
    resp = rpc(master.addr, RequestCode.HEART_BEAT, body=json.dumps(
        {"clientID": "c1", "consumerDataSet": [{"groupName": "CG_NEWGROUP", "consumeType": 1, "messageModel": 1,
                                                "consumeFromWhere": 0, "subscriptionDataSet": []}]}).encode())
    assert resp.code == 0
    cfg = slave.store_dir / "config"

    def synced() -> bool:
        try:
            topics = json.loads((cfg / "topics.json").read_text())
            groups = json.loads((cfg / "subscriptionGroup.json").read_text())
            offsets = (cfg / "consumerOffset.json").read_text()
        except (OSError, ValueError):
            return False
        return ("MetaTopic" in topics["topicConfigTable"] and "CG_NEWGROUP" in groups["subscriptionGroupTable"]
                and "MetaTopic@CG_META" in offsets)

    poll(synced, 10, what="slave metadata synced")
    # The files are written as each table is synced, before the round that wrote them ends.
    st = poll(lambda: (ms := slave.status()["metadataSync"])["lastSuccessMillis"] > 0 and ms, 5,
              what="the round that synced them ended")
    assert st["masterAddress"] == master.addr
    assert st["topicVersion"] == master.status()["dataVersions"]["topics"]
    before = (cfg / "topics.json").stat()
    rounds = st["rounds"]
    poll(lambda: slave.status()["metadataSync"]["rounds"] >= rounds + 2, 10, what="two more sync rounds")
    after = (cfg / "topics.json").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_slave_started_before_its_master_syncs_metadata_within_seconds(cluster: Cluster) -> None:
    """A slave that registers before its master learns no master address from that answer: it
    registers again within seconds (not a 30 s period later), so its metadata sync starts."""
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-early", broker_id=0, start=False)
    slave = cluster.broker(ns.addr, name="broker-early", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}", slaveSyncInitialDelay=300,
                           slaveSyncInterval=1000)
    # Ready means registered: with no master yet, the answer named none.
    assert slave.status()["metadataSync"]["masterAddress"] is None
    master.start()
    create_topic(master.addr, "EarlyTopic")
    started = time.monotonic()
    topics = slave.store_dir / "config" / "topics.json"
    poll(lambda: topics.exists() and "EarlyTopic" in topics.read_text(), 15, what="slave synced EarlyTopic")
    assert time.monotonic() - started < 15  # the registration period is 30 s
    assert slave.status()["metadataSync"]["masterAddress"] == master.addr


def test_nameserver_discovery(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    master, slave = group(cluster, ns.addr, 2, direct=False)
    create_topic_and_wait(master.addr, ns.addr, "DiscTopic")
    for i in range(20):
        assert send_raw(master.addr, "DiscTopic", f"d{i}".encode()).code == 0
    poll(lambda: slave.status()["ha"]["masterAddress"] == f"127.0.0.1:{master.port + 1}", 15,
         what="slave learned the master HA address from the nameserver")
    assert_replicas_identical(master, [slave])


def test_promote_repoint_demote_converge(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    a, b, c = group(cluster, ns.addr, 3)
    create_topic_and_wait(a.addr, ns.addr, "FailTopic")
    for i in range(200):
        assert send_raw(a.addr, "FailTopic", f"before-{i}".encode() * 10).code == 0
    wait_caught_up(a, [b, c])
    # partition the old master from its slaves: they lose it; it keeps accepting writes (ASYNC)
    b.stop()
    c.stop()
    for i in range(50):
        assert send_raw(a.addr, "FailTopic", f"divergent-{i}".encode() * 10).code == 0
    divergent_end = a.status()["maxPhyOffset"]
    a.signal(signal.SIGSTOP)
    try:
        b.conf.pop("haMasterAddress")
        b.write_conf()
        b.start()
        c.start()
        code, body = b.admin("/role", "POST", json.dumps({"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 1}).encode())
        assert code == 200, body
        code, body = c.admin("/ha/master", "POST", json.dumps(
            {"haAddress": f"127.0.0.1:{b.port + 1}", "brokerAddress": b.addr}).encode())
        assert code == 200, body
        for i in range(30):
            assert send_raw(b.addr, "FailTopic", f"after-{i}".encode()).code == 0
    finally:
        a.signal(signal.SIGCONT)
    # stale epoch is refused
    code, _ = a.admin("/role", "POST", json.dumps({"role": "SLAVE", "brokerId": 3, "epoch": 0}).encode())
    assert code == 200  # a's own epoch is 0: demotion at 0 is allowed ...
    code, body = b.admin("/role", "POST", json.dumps({"role": "SLAVE", "brokerId": 1, "epoch": 0}).encode())
    assert code == 409, body  # ... but b is at epoch 1 and refuses an older one
    code, body = a.admin("/ha/master", "POST", json.dumps(
        {"haAddress": f"127.0.0.1:{b.port + 1}", "brokerAddress": b.addr, "epoch": 1}).encode())
    assert code == 200, body
    # the demoted master cuts its divergent tail before it follows the new master
    poll(lambda: a.status()["ha"]["truncatedBytes"] > 0 and a.status()["ha"]["connected"], 20,
         what="old master truncated and following")
    poll(lambda: c.status()["ha"]["masterAddress"] == f"127.0.0.1:{b.port + 1}" and c.status()["ha"]["connected"],
         20, what="c follows b")
    assert_replicas_identical(b, [a, c])
    st = a.status()
    assert st["epoch"] == 1 and st["role"] == "SLAVE"
    assert b.status()["maxPhyOffset"] < divergent_end + 30 * 200


def test_slave_keeps_what_a_master_that_lost_its_tail_had_replicated(cluster: Cluster) -> None:
    """A master that comes back with an older disk in the same epoch does not make its slave
    truncate bytes it replicated (they may be acknowledged sends); promoting the slave at a new
    epoch and demoting the old master makes both converge on the slave's longer log."""
    master, slave = group(cluster, None, 2)
    for i in range(20):
        assert send_raw(master.addr, "LostTopic", f"early-{i}".encode() * 10).code == 0
    wait_caught_up(master, [slave])
    master.stop()
    older_disk = cluster.workdir / "older-disk"
    shutil.copytree(master.store_dir, older_disk)
    master.start()
    for i in range(20):
        assert send_raw(master.addr, "LostTopic", f"late-{i}".encode() * 10).code == 0
    full = wait_caught_up(master, [slave])
    master.stop()
    shutil.rmtree(master.store_dir)
    shutil.copytree(older_disk, master.store_dir)
    master.start()
    short = master.status()["maxPhyOffset"]
    assert short < full
    poll(lambda: slave.status()["ha"]["aheadOfMasterBytes"] == full - short, 20,
         what="slave refuses to follow the shorter master of its own epoch")
    st = slave.status()
    assert st["maxPhyOffset"] == full and st["ha"]["truncatedBytes"] == 0 and st["ha"]["refusedStreams"] >= 1
    # The operator's way out: the slave, which has more, becomes master at a newer epoch.
    code, body = slave.admin("/role", "POST", json.dumps({"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 1}).encode())
    assert code == 200, body
    code, body = master.admin("/role", "POST", json.dumps({"role": "SLAVE", "brokerId": 1, "epoch": 1}).encode())
    assert code == 200, body
    code, body = master.admin("/ha/master", "POST", json.dumps(
        {"haAddress": f"127.0.0.1:{slave.port + 1}", "brokerAddress": slave.addr, "epoch": 1}).encode())
    assert code == 200, body
    assert send_raw(slave.addr, "LostTopic", b"after promotion").code == 0
    assert_replicas_identical(slave, [master])
    assert master.status()["ha"]["truncatedBytes"] == 0


def test_demoted_master_drops_its_slave_connections(cluster: Cluster) -> None:
    """A master that is demoted closes the HA connections it serves at once (discarding what was
    queued for them): its log may be truncated next, so no slave may go on streaming from it."""
    master = cluster.broker(None, name="broker-k")
    assert send_raw(master.addr, "KTopic", b"k" * 100).code == 0
    with socket.create_connection(("127.0.0.1", master.port + 1), timeout=5) as s:
        s.sendall(struct.pack(">q", 0))
        s.settimeout(5)
        assert len(s.recv(12)) > 0  # streaming
        poll(lambda: len(master.status()["ha"]["slaves"]) == 1, 10, what="slave connection listed")
        code, body = master.admin("/role", "POST", json.dumps({"role": "SLAVE", "brokerId": 1, "epoch": 0}).encode())
        assert code == 200, body
        deadline = time.monotonic() + 4  # well before the 5 s heartbeat would show it still open
        closed = False
        s.settimeout(0.5)
        while time.monotonic() < deadline and not closed:
            try:
                closed = s.recv(65536) == b""
            except TimeoutError:
                continue
            except ConnectionResetError:
                closed = True
        assert closed
    assert master.status()["ha"]["slaves"] == []


def _pull_suggestion(broker: BrokerProc, topic: str) -> tuple[int, str]:
    resp = rpc(broker.addr, RequestCode.PULL_MESSAGE, {
        "consumerGroup": "SuggestGroup", "topic": topic, "queueId": "0", "queueOffset": "0",
        "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
        "subscription": "*", "subVersion": "0"})  # sysFlag: FLAG_SUBSCRIPTION, the one sent here
    return resp.code, resp.ext_fields.get("suggestWhichBrokerId", "")


def test_pull_suggests_which_broker_as_rocketmq(cluster: Cluster) -> None:
    """suggestWhichBrokerId: with slaveReadEnable a consumer that keeps up is sent to its group's
    brokerId (the master), from the slave too; without it, always to the master."""
    ns = cluster.namesrv()
    master, slave = group(cluster, ns.addr, 2, slaveReadEnable="true", slaveSyncInitialDelay=300,
                          slaveSyncInterval=1000)
    for i in range(5):
        assert send_raw(master.addr, "SuggestTopic", f"s-{i}".encode()).code == 0
    wait_caught_up(master, [slave])
    poll(lambda: _pull_suggestion(slave, "SuggestTopic")[0] == ResponseCode.SUCCESS, 20, what="slave serves pulls")
    assert _pull_suggestion(master, "SuggestTopic") == (ResponseCode.SUCCESS, "0")
    assert _pull_suggestion(slave, "SuggestTopic") == (ResponseCode.SUCCESS, "0")


def test_ha_port_rejects_garbage_and_offsets_beyond_log(cluster: Cluster) -> None:
    master = cluster.broker(None, name="broker-g")
    assert send_raw(master.addr, "GTopic", b"x").code == 0
    for payload in (b"\x7f" * 8, b"garbage!" * 3):
        with socket.create_connection(("127.0.0.1", master.port + 1), timeout=5) as s:
            s.sendall(payload)
            s.settimeout(5)
            assert s.recv(100) == b""  # dropped
    st = master.status()
    assert st["ha"]["slaves"] == []
    assert send_raw(master.addr, "GTopic", b"still serving").code == 0


def test_admin_control_auth_and_bad_json(cluster: Cluster) -> None:
    b = cluster.broker(None, name="broker-h", role="SLAVE", broker_id=1)
    for path, method in (("/ha/master", "POST"), ("/role", "POST"), ("/commitlog?offset=0&length=1", "GET")):
        code, _ = b.admin(path, method, b"{}", token=None)
        assert code == 401
        code, _ = b.admin(path, method, b"{}", token="wrong")
        assert code == 401
    code, body = b.admin("/ha/master", "POST", b"{not json")
    assert code == 400 and b"malformed JSON" in body
    for bad in ("127.0.0.1:abc", "127.0.0.1:", ":10912", "127.0.0.1:70000"):
        code, body = b.admin("/ha/master", "POST", json.dumps({"haAddress": bad}).encode())
        assert code == 400 and b"haAddress" in body, bad
        code, body = b.admin("/ha/master", "POST", json.dumps({"haAddress": "127.0.0.1:1",
                                                              "brokerAddress": bad}).encode())
        assert code == 400 and b"brokerAddress" in body, bad
    code, body = b.admin("/role", "POST", json.dumps({"role": "KING", "brokerId": 0, "epoch": 1}).encode())
    assert code == 409 and b"role must be" in body
    # Beyond what Java's long holds (an epoch there could never be passed again): refused, nothing kept.
    for field, value in (("epoch", 10 ** 30), ("epoch", 1 << 63), ("brokerId", 1 << 63), ("epoch", -1)):
        code, body = b.admin("/role", "POST", json.dumps({"role": "ASYNC_MASTER", "brokerId": 0, "epoch": 1,
                                                         field: value}).encode())
        assert code == 400 and f"{field} must be an integer from 0 to 2^63-1".encode() in body, (field, value, body)
    for path, extra in (("/ha/fence", {}), ("/ha/master", {"haAddress": "127.0.0.1:1"})):
        code, body = b.admin(path, "POST", json.dumps({**extra, "epoch": 10 ** 30}).encode())
        assert code == 400 and b"2^63-1" in body, (path, body)
    assert b.status()["role"] == "SLAVE" and b.status()["epoch"] == 0
    code, body = b.admin("/commitlog?offset=-1&length=5")
    assert code == 400


@pytest.mark.parametrize("length", [1, 1000, 10_000_000])
def test_commitlog_endpoint_streams_committed_bytes(cluster: Cluster, length: int) -> None:
    m = cluster.broker(None, name="broker-c")
    for i in range(50):
        assert send_raw(m.addr, "CTopic", f"c{i}".encode() * 20).code == 0
    end = m.status()["maxPhyOffset"]
    code, body = m.admin(f"/commitlog?offset=0&length={length}")
    assert code == 200
    assert body == commitlog_bytes(m.store_dir, min(length, end))


def _fill_master_store(root: Path, total: int) -> int:
    """Messages over 3 topics x 4 queues written through the store API before the master starts
    (so a slave's catch-up is one large bulk transfer); returns the log end."""
    import asyncio

    from rmqbroker.store.config import StoreConfig
    from rmqbroker.store.message_store import MessageInner, MessageStore

    async def run() -> int:
        store = MessageStore(StoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=SEG,
                                         mapped_file_size_consume_queue=60000, store_host=("127.0.0.1", 10911)))
        await store.start()
        n = 0
        while store.max_phy_offset() < total:
            props = {"KEYS": f"bulk-{n}", "TAGS": f"T{n % 3}"}
            store.append_message(MessageInner(topic=f"Bulk{n % 3}", queue_id=n % 4, flag=0,
                                              body=os.urandom(200 + (n * 7919) % 1800), properties=props,
                                              born_host=("127.0.0.1", 1)))
            n += 1
        end = store.max_phy_offset()
        await store.shutdown()
        return end

    return asyncio.run(run())


def test_bulk_catchup_then_restart_consume_queues_agree(cluster: Cluster) -> None:
    """A slave acks replicated bytes from its receiver thread before the loop commits them and
    builds consume queues behind: after a bulk catch-up (sendfile -> splice path, several segments),
    after kill -9 right at the end of it (consume queues still trailing) and after a clean restart,
    commitlog and consume queues are byte-identical to the master's, and the stream continues."""
    master_root = cluster.workdir / "bulk-master"
    end = _fill_master_store(master_root, 5 * SEG + 12345)
    master = cluster.broker(None, name="broker-b", mappedFileSizeCommitLog=SEG, maxMessageSize=1024 * 1024,
                            storePathRootDir=str(master_root))
    master.store_dir = master_root
    assert master.status()["maxPhyOffset"] == end
    slave = cluster.broker(None, name="broker-b", broker_id=1, role="SLAVE", mappedFileSizeCommitLog=SEG,
                           maxMessageSize=1024 * 1024, haMasterAddress=f"127.0.0.1:{master.port + 1}", start=False)
    slave.start(wait_ready=False)
    slave.wait_ready()
    poll(lambda: slave.status()["maxPhyOffset"] == end, 30, interval=0.01, what="slave caught up")
    slave.kill9()  # consume queues may still trail the commitlog here
    slave.start()
    assert_replicas_identical(master, [slave])
    slave.stop()
    slave.start()
    assert_replicas_identical(master, [slave])
    for i in range(20):
        assert send_raw(master.addr, "Bulk1", f"after-{i}".encode() * 50).code == 0
    assert_replicas_identical(master, [slave])
    st = slave.status()
    assert st["ha"]["connected"] is True and st["maxPhyOffset"] == master.status()["maxPhyOffset"]
    # A slave's periodic flushes wait while a catch-up streams, not beyond it (well within the
    # 10 s thorough interval that bounds any deferral).
    late = cluster.broker(None, name="broker-b", broker_id=2, role="SLAVE", mappedFileSizeCommitLog=SEG,
                          maxMessageSize=1024 * 1024, haMasterAddress=f"127.0.0.1:{master.port + 1}")
    end = master.status()["maxPhyOffset"]
    poll(lambda: late.status()["maxPhyOffset"] == end, 30, interval=0.01, what="late slave caught up")
    poll(lambda: late.status()["flushedPhyOffset"] == end, 5, interval=0.05, what="late slave flushed")
    assert_replicas_identical(master, [slave, late])
