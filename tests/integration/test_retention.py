"""File retention and disk-full protection on real processes with the stock C++ client.

Expired commitlog segments are deleted on mqadmin's deleteExpiredCommitLog (329) through
``rmq-admin``; a C++ push consumer whose committed offset points into deleted data is moved to
the queue's new start by the broker and receives exactly the retained messages; a slave keeps
its own files; an empty slave that joins later replicates from the master's new start; and a
broker whose disk is over diskSpaceWarningLevelRatio refuses sends with SERVICE_NOT_AVAILABLE.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from rmqbroker.admin_cli import main as rmq_admin
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.store.retention import disk_used_ratio
from tests.conftest import Cluster
from tests.integration.helpers import (
    PushConsumer,
    StreamProducer,
    create_topic_and_wait,
    metric_delta,
    poll,
    produce,
    rpc,
    send_raw,
    wait_caught_up,
)
from tests.support.procs import BrokerProc

SEG = 256 * 1024
TOPIC = "RetentionTopic"
GROUP = "CG_RETENTION"


def off_hours() -> str:
    return f"{(time.localtime().tm_hour + 12) % 24:02d}"


def segment_paths(broker: BrokerProc) -> list[str]:
    d = broker.store_dir / "commitlog"
    return sorted(str(d / n) for n in os.listdir(d) if n.isdigit())


def test_expired_segments_go_on_request_and_consumers_and_slaves_follow(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    ns = cluster.namesrv()
    conf: dict[str, Any] = {"mappedFileSizeCommitLog": SEG, "maxMessageSize": 65536,
            "mappedFileSizeConsumeQueue": 20 * 50,
            "deleteWhen": off_hours(), "cleanResourceInterval": 1000, "diskMaxUsedSpaceRatio": 95}
    master = cluster.broker(ns.addr, name="broker-r", **conf)
    slave = cluster.broker(ns.addr, name="broker-r", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}", **conf)
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=2)
    for qid in (0, 1):  # the group consumed nothing yet: its committed offsets are 0
        assert rpc(master.addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": GROUP, "topic": TOPIC, "queueId": str(qid), "commitOffset": "0"}).code == 0

    # A second slave replicates the first messages only, then stays down while retention runs.
    stale = cluster.broker(ns.addr, name="broker-r", broker_id=3, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}", **conf)
    assert all(r is not None and r["status"] == 0
               for r in produce(ns.addr, [{"topic": TOPIC, "body": "x" * 1000}] * 30))
    wait_caught_up(master, [stale])
    stale.stop()

    producer = StreamProducer(ns.addr, TOPIC, "ret", cluster.workdir / "retention-producer.jsonl",
                              count=420, size=4000, settle_ms=300)
    results = producer.results()
    assert len(results) == 420 and all(r.get("status") == 0 for r in results), results[-1]
    wait_caught_up(master, [slave])
    files = segment_paths(master)
    assert len(files) >= 6
    old = time.time() - 100 * 3600
    for path in files[:3]:
        os.utime(path, (old, old))

    # Off-hours and with room on the disk, the periodic rounds leave expired segments alone.
    time.sleep(2.5)
    assert master.status()["minPhyOffset"] == 0
    before = master.metrics()
    assert rmq_admin(["deleteExpiredCommitLog", "-n", ns.addr, "-b", master.addr]) == 0
    assert "deleted 3 commitlog" in capsys.readouterr().out
    status = master.status()
    assert status["minPhyOffset"] == 3 * SEG
    assert status["retention"]["commitLogFilesDeleted"] == 3
    assert metric_delta(before, master.metrics(), "rmq_retention_commitlog_files_deleted_total") == 3
    assert [os.path.exists(p) for p in files[:4]] == [False, False, False, True]
    # The slave's copies are its own: recent, so kept.
    assert slave.status()["minPhyOffset"] == 0

    # Queue min offsets moved past the deleted records.
    mins = {}
    for qid in (0, 1):
        resp = rpc(master.addr, RequestCode.GET_MIN_OFFSET, {"topic": TOPIC, "queueId": str(qid)})
        mins[qid] = int(resp.ext_fields["offset"])
        assert mins[qid] > 0
    maxes = {qid: int(rpc(master.addr, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": str(qid)})
                      .ext_fields["offset"]) for qid in (0, 1)}
    retained = sum(maxes[q] - mins[q] for q in (0, 1))

    # A consumer whose committed offset (0) points into deleted data starts at the queues' new start.
    with PushConsumer(ns.addr, GROUP, TOPIC, log_dir=cluster.workdir) as consumer:
        consumer.wait_started()
        got = consumer.wait_count(retained, 60)
        time.sleep(1.0)
        got = consumer.messages
    assert len(got) == retained
    assert {(m["queue_id"], m["queue_offset"]) for m in got} == {
        (q, o) for q in (0, 1) for o in range(mins[q], maxes[q])}
    assert min(m["commit_log_offset"] for m in got) >= 3 * SEG

    # The stale slave's log ends before the master's first retained byte: it is refused with a reason
    # (it would need the deleted segments), not fed a stream with a hole.
    stale.start()
    poll(lambda: master.status()["ha"]["slavesBehindRetention"] > 0, 15, what="stale slave refused")
    assert stale.status()["maxPhyOffset"] < 3 * SEG
    assert "deleted by retention" in master.log_text()
    stale.stop()

    # An empty slave that joins now replicates from the master's first retained byte.
    late = cluster.broker(ns.addr, name="broker-r", broker_id=2, role="SLAVE",
                          haMasterAddress=f"127.0.0.1:{master.port + 1}", **conf)
    wait_caught_up(master, [late])
    assert late.status()["minPhyOffset"] == 3 * SEG
    for path in segment_paths(master):
        name = os.path.basename(path)
        with open(path, "rb") as a, open(late.store_dir / "commitlog" / name, "rb") as b:
            assert a.read() == b.read(), name


def test_a_full_disk_refuses_sends_with_service_not_available(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-f", diskSpaceWarningLevelRatio=1, diskSpaceCleanForciblyRatio=1,
                            cleanResourceInterval=200)
    used = disk_used_ratio(master.store_dir)
    assert used > 0.01, f"this test needs a disk more than 1 % used (it is {used:.2%})"
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=1)
    poll(lambda: master.status()["retention"]["diskFull"], 10, what="disk marked full")
    max_before = master.status()["maxPhyOffset"]
    resp = send_raw(master.addr, TOPIC, b"no room")
    assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "disk is full" in (resp.remark or "")
    results = produce(ns.addr, [{"topic": TOPIC, "body": "also no room"}], keep_going=True)
    assert results[0] is not None and "error" in results[0]
    assert master.status()["maxPhyOffset"] == max_before
    assert "rmq_disk_full{" in master.metrics() and master.status()["retention"]["diskUsedRatio"] > 0.01


def test_clean_expired_consume_queues_and_unused_topics(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """mqadmin cleanExpiredCQ (306): a queue whose every message retention deleted goes, the
    others stay. cleanUnusedTopic (316): queues of a topic without config (here: removed from
    topics.json while the broker was down) go, and stay gone after a crash-like restart."""
    ns = cluster.namesrv()
    conf: dict[str, Any] = {"mappedFileSizeCommitLog": SEG, "maxMessageSize": 65536,
            "mappedFileSizeConsumeQueue": 20 * 50,
            "deleteWhen": off_hours(), "cleanResourceInterval": 1000, "diskMaxUsedSpaceRatio": 95}
    b = cluster.broker(ns.addr, name="broker-c", **conf)
    for topic in ("OldTopic", "UnusedTopic", TOPIC):
        create_topic_and_wait(b.addr, ns.addr, topic, queues=1)
    for topic in ("OldTopic", "UnusedTopic"):
        assert send_raw(b.addr, topic, b"o" * 1000).code == ResponseCode.SUCCESS
    while len(segment_paths(b)) < 4:
        assert send_raw(b.addr, TOPIC, b"x" * 4000).code == ResponseCode.SUCCESS

    def max_offset(topic: str) -> int:
        return int(rpc(b.addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": "0"}).ext_fields["offset"])

    active = max_offset(TOPIC)
    assert rmq_admin(["cleanExpiredCQ", "-n", ns.addr, "-b", b.addr]) == 0
    assert f"{b.addr}: removed 0 expired consume queue(s)" in capsys.readouterr().out
    old = time.time() - 100 * 3600
    for path in segment_paths(b)[:2]:
        os.utime(path, (old, old))
    assert rmq_admin(["deleteExpiredCommitLog", "-n", ns.addr, "-b", b.addr]) == 0
    capsys.readouterr()
    # Deleted now or, once flushed, in the next rounds (the request keeps deletion on for them).
    poll(lambda: b.status()["minPhyOffset"] == 2 * SEG, 15, what="the two aged segments deleted")
    assert rmq_admin(["cleanExpiredCQ", "-n", ns.addr, "-b", b.addr]) == 0
    out = capsys.readouterr().out
    assert "removed 2 expired consume queue(s): OldTopic-0, UnusedTopic-0" in out, out
    assert not (b.store_dir / "consumequeue" / "OldTopic").exists()
    assert max_offset("OldTopic") == 0 and max_offset(TOPIC) == active

    # A topic's config gone while its queues are on disk.
    assert send_raw(b.addr, "UnusedTopic", b"again").code == ResponseCode.SUCCESS
    b.stop()
    topics_json = b.store_dir / "config" / "topics.json"
    doc = json.loads(topics_json.read_text())
    del doc["topicConfigTable"]["UnusedTopic"]
    topics_json.write_text(json.dumps(doc))
    b.start()
    assert (b.store_dir / "consumequeue" / "UnusedTopic").exists()
    assert rmq_admin(["cleanUnusedTopic", "-n", ns.addr, "-b", b.addr]) == 0
    out = capsys.readouterr().out
    assert f"{b.addr}: removed the consume queues of 1 unused topic(s): UnusedTopic" in out, out
    assert not (b.store_dir / "consumequeue" / "UnusedTopic").exists()
    assert max_offset(TOPIC) == active and (b.store_dir / "consumequeue" / TOPIC).exists()
    b.kill9()  # no clean shutdown: recovery re-dispatches, and the unused topic's queue stays gone
    b.start()
    assert not (b.store_dir / "consumequeue" / "UnusedTopic").exists() and max_offset(TOPIC) == active
