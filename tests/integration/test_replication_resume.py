"""A slave restarted while producers keep sending resumes from the offset it had stored.

Process-level check of issue 3's "a slave restarted mid-stream resumes where it was": the slave's
store reopens at the end it had written before the stop, its first report to the master (the
handshake's start offset) is that end, not 0, nothing is truncated or refused, and once the stream
ends its commitlog is byte-identical to the master's.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import Cluster
from tests.integration.helpers import StreamProducer, assert_sending, create_topic_and_wait, poll
from tests.integration.test_replication import SEG, assert_replicas_identical, group, record_spans

STORE_STARTED = re.compile(r"message store started at .*: commitlog \[(\d+), (\d+)\)")
FOLLOWING = re.compile(r"HA following master (\S+) from offset (\d+)")


def stored_end(store: Path) -> int:
    """Where the commitlog in ``store``'s segment files ends: after its last whole record (a
    segment closed by its end-of-file marker counts whole, as recovery does)."""
    end = 0
    for f in sorted((store / "commitlog").iterdir()):
        start = int(f.name)
        if end not in (start, 0):
            break  # a gap: nothing beyond it is part of the log
        data = f.read_bytes()
        pos = 0
        for at, size in record_spans(data):
            pos = len(data) if size == 0 else at + size  # the marker: the log goes on in the next segment
        end = start + pos
        if pos < len(data):
            break
    return end


def test_slave_restarted_mid_stream_resumes_from_its_stored_offset(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    master, slave = group(cluster, ns.addr, 2)
    create_topic_and_wait(master.addr, ns.addr, "ResumeTopic")
    # Every send must succeed here: the producers settle first (the C++ client's first-send race).
    producers = [StreamProducer(ns.addr, "ResumeTopic", f"r{i}", cluster.workdir / f"producer-{i}.jsonl", size=700,
                                seconds=9, settle_ms=300) for i in range(2)]
    # Let the slave replicate part of the stream (across a segment boundary), then stop it cleanly.
    poll(lambda: slave.status()["maxPhyOffset"] > SEG + 4096, 15, what="slave past the first segment")
    slave.stop()
    assert_sending(producers)  # when the slave stops
    end_at_stop = stored_end(slave.store_dir)
    assert end_at_stop > SEG
    log_before = len(slave.log_text())
    # The master keeps taking writes while the slave is down: the slave has something to resume.
    poll(lambda: master.status()["maxPhyOffset"] > end_at_stop + 64 * 1024, 10, what="master moved on")
    slave.start()
    assert_sending(producers)  # when the slave returns
    st = slave.status()
    # Freshly restarted: it holds at least what it stored, and none of it was cut.
    assert st["maxPhyOffset"] >= end_at_stop
    assert st["ha"]["truncatedBytes"] == 0

    restart_log = ""

    def resumed() -> bool:
        nonlocal restart_log
        restart_log = slave.log_text()[log_before:]
        return FOLLOWING.search(restart_log) is not None

    poll(resumed, 10, what="slave following the master again")
    started = STORE_STARTED.search(restart_log)
    assert started is not None, restart_log[-2000:]
    assert int(started.group(2)) == end_at_stop  # the store reopened at the end it had written
    following = FOLLOWING.search(restart_log)
    assert following is not None
    # The handshake's first report (where the master starts streaming) is the stored end, not 0.
    assert following.group(1) == f"127.0.0.1:{master.port + 1}"
    assert int(following.group(2)) == end_at_stop

    # The stream went on through the slave's return and its resume: enough of it.
    for p in producers:
        p.stop()
    results = [r for p in producers for r in p.results()]
    ok = [r for r in results if r.get("status") == 0]
    assert len(ok) == len(results) and len(ok) > 200, [r for r in results if r.get("status") != 0][:5]
    assert_replicas_identical(master, [slave])
    st = slave.status()
    # The master streamed from the slave's offset: a stream from anywhere else is refused (and
    # counted) by the slave, a log ahead of the master's would have been truncated.
    assert st["ha"]["truncatedBytes"] == 0 and st["ha"]["refusedStreams"] == 0
    assert st["ha"]["connects"] == 1 and st["ha"]["connected"] is True
    m = master.status()
    assert [s["ackedOffset"] for s in m["ha"]["slaves"]] == [m["maxPhyOffset"]]
