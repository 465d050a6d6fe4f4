"""Verification of a group that is live while it runs: real brokers, each test its own small group.

The fixture group of ``test_verify`` is quiet and fully in sync; these are the states a scheduled
run meets in production instead (a slave catching up, a slave between two metadata rounds,
retention deleting segments while the run reads them), where
the verdict must be lag, not a mismatch.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from rmqbroker.admin_cli import main as rmq_admin
from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.store.record import BatchEntry, encode_batch_body
from rmqbroker.verify.chunk import verify_chunk
from rmqbroker.verify.cli import main
from rmqbroker.verify.job import (
    LocalExecutor,
    VerifyOptions,
    check_chain,
    discover,
    plan,
    residual_consume_queues,
    verify,
)
from rmqbroker.verify.progress import Progress
from tests.conftest import Cluster
from tests.integration.helpers import create_topic, poll
from tests.support.procs import BrokerProc

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TOPIC = "LiveVerifyT"


async def _fill(addr: str, batches: int, per_batch: int, body_size: int, queues: int = 4) -> None:
    """Many small records fast (batches): a slave's consume-queue dispatch, not its byte stream,
    is then what takes time when it catches up."""
    client = RemotingClient()
    sem = asyncio.Semaphore(8)
    rng = random.Random(5)

    async def one(i: int) -> None:
        async with sem:
            body = encode_batch_body([BatchEntry(0, rng.randbytes(body_size), f"TAGS\x01T{j % 3}\x02KEYS\x01k{i}_{j}")
                                      for j in range(per_batch)])
            ext = {"producerGroup": "PG_LIVE", "topic": TOPIC, "defaultTopic": "TBW102",
                   "defaultTopicQueueNums": "4", "queueId": str(i % queues), "sysFlag": "0",
                   "bornTimestamp": str(int(time.time() * 1000)), "flag": "0", "properties": "WAIT\x01true"}
            resp = await client.invoke(addr, RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, ext_fields=ext,
                                                             body=body), 30)
            assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)

    await asyncio.gather(*(one(i) for i in range(batches)))
    await client.close()


def _serves(b: BrokerProc, offset: int) -> bool:
    """Whether ``GET /commitlog`` hands out the byte at ``offset``."""
    req = urllib.request.Request(f"http://127.0.0.1:{b.admin_port}/commitlog?offset={offset}&length=1",
                                 headers={"Authorization": f"Bearer {b.token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return len(resp.read()) == 1


def test_a_slave_still_building_its_consume_queues_is_lag_not_missing(cluster: Cluster) -> None:
    """A slave catching up takes bytes at socket speed and builds consume queues behind them
    (seconds for a few hundred thousand records), serving ``GET /commitlog`` only up to what it
    dispatched. Verified up to its maxPhyOffset, such a healthy slave had every record of the
    undispatched stretch reported as ``missing``."""
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-live")
    create_topic(master.addr, TOPIC, 4)
    asyncio.run(_fill(master.addr, 400, 500, 20))  # 200,000 records, ~33 MB
    end = master.status()["maxPhyOffset"]
    slave = cluster.broker(ns.addr, name="broker-live", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}")
    poll(lambda: slave.status()["maxPhyOffset"] >= end, 30, interval=0.01, what="slave received the log")
    urls = [f"http://127.0.0.1:{b.admin_port}" for b in (master, slave)]
    mstate, (sstate,), errors = discover(urls, master.token)
    assert not errors, errors
    tasks = plan(mstate.ref, [sstate.ref], VerifyOptions(urls, master.token, parallelism=2), ())
    # The last chunk first, as executors running every chunk at once reach it right after planning.
    res = verify_chunk(tasks[-1])
    stats = res.stats[sstate.ref.name]
    assert [(m.kind, m.offset, m.detail) for m in res.mismatches][:3] == []
    assert stats.records + stats.lag_records == res.stats[mstate.ref.name].records
    # The scenario happened: at discovery the slave held the whole log but served less of it.
    assert sstate.status["maxPhyOffset"] == end and sstate.ref.end < end
    assert sstate.lag_bytes == end - sstate.ref.end and stats.lag_records > 0

    # Once its consume queues are built the whole group verifies clean, with no lag left.
    poll(lambda: _serves(slave, end - 1), 60, what="slave dispatched everything")
    outcome = verify(VerifyOptions(urls, master.token, check_metadata=False), LocalExecutor())
    assert [(s.ref.name, s.mismatch_count, s.lag_bytes) for s in outcome.slaves] == [(urls[1], 0, 0)]
    assert outcome.master.mismatch_count == 0 and outcome.slaves[0].stats.records == 200_000


def test_a_slave_between_two_metadata_rounds_is_not_a_mismatch(spark: SparkSession, cluster: Cluster,
                                                                 tmp_path: Path) -> None:
    """Slaves copy topics and groups every slaveSyncInterval (10 s by default), so right after a
    topic is created (or a slave restarted, or a failover) their DataVersions differ from the
    master's. A run in that window reported topic_config mismatches (exit 1) for a healthy group;
    it now waits for the slave's next round and reports only what that round left."""
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-meta", slaveSyncInitialDelay=200, slaveSyncInterval=5000)
    slave = cluster.broker(ns.addr, name="broker-meta", broker_id=1, role="SLAVE", slaveSyncInitialDelay=200,
                           slaveSyncInterval=5000, haMasterAddress=f"127.0.0.1:{master.port + 1}")
    create_topic(master.addr, TOPIC, 4)
    asyncio.run(_fill(master.addr, 4, 50, 100))
    rounds = slave.status()["metadataSync"]["rounds"]
    # Right after a round: the next one is 5 s away, so the run below starts inside the window.
    poll(lambda: slave.status()["metadataSync"]["rounds"] > rounds, 20, interval=0.02, what="a metadata round")
    create_topic(master.addr, "LiveVerifyNew", 2)
    report = tmp_path / "report.json"
    code = main(["--replicas", ",".join(f"http://127.0.0.1:{b.admin_port}" for b in (master, slave)),
                 "--token", master.token, "--report", str(report), "--quiet", "--progress", "off"])
    rep = json.loads(report.read_text())
    slave_rep = rep["replicas"][1]
    assert (code, rep["result"]) == (0, "clean"), slave_rep["mismatches"]
    assert slave_rep["metadata"]["waitedForSyncSeconds"] > 0  # its DataVersion was behind at first
    assert "LiveVerifyNew" in json.loads(slave.admin("/metadata")[1])["topics"]["topicConfigTable"]


def test_segments_retention_deletes_during_the_run_are_gone_not_corrupt(cluster: Cluster) -> None:
    """Retention deletes the oldest segments at deleteWhen (or when the disk fills) whether or not
    a verification is reading them. Chunks planned over them then found the master serving from
    its new min offset and reported the master's log as corrupt ("framing" at the old start, exit
    1); the slave's own deletion showed as "missing" records."""
    ns = cluster.namesrv()
    seg = 1 << 20
    off_hours = f"{(time.localtime().tm_hour + 12) % 24:02d}"  # no scheduled round during the test
    conf: dict[str, object] = {"mappedFileSizeCommitLog": seg, "maxMessageSize": 65536, "deleteWhen": off_hours,
                               "cleanResourceInterval": 1000, "diskMaxUsedSpaceRatio": 95}
    master = cluster.broker(ns.addr, name="broker-ret", **conf)  # type: ignore[arg-type]
    slave = cluster.broker(ns.addr, name="broker-ret", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}", **conf)  # type: ignore[arg-type]
    create_topic(master.addr, TOPIC, 4)
    asyncio.run(_fill(master.addr, 120, 10, 4000))  # ~5 segments
    end = master.status()["maxPhyOffset"]
    poll(lambda: slave.status()["dispatchedPhyOffset"] >= end, 30, what="slave caught up")
    urls = [f"http://127.0.0.1:{b.admin_port}" for b in (master, slave)]
    mstate, (sstate,), errors = discover(urls, master.token)
    assert not errors and (mstate.ref.start, sstate.ref.start, sstate.ref.end) == (0, 0, end)
    tasks = plan(mstate.ref, [sstate.ref], VerifyOptions(urls, master.token, parallelism=1), ())
    assert len(tasks) >= 4 and tasks[0].stop < 2 * seg

    # After planning: the master loses its first two segments, the slave its first three.
    for broker, n in ((master, 2), (slave, 3)):
        old = time.time() - 100 * 3600
        for name in sorted(os.listdir(broker.store_dir / "commitlog"))[:n]:
            os.utime(broker.store_dir / "commitlog" / name, (old, old))
        assert rmq_admin(["deleteExpiredCommitLog", "-n", ns.addr, "-b", broker.addr]) == 0
    poll(lambda: (master.status()["minPhyOffset"], slave.status()["minPhyOffset"]) == (2 * seg, 3 * seg), 20,
         what="segments deleted")

    results = LocalExecutor().run(tasks, Progress(enabled=False), end)
    results, _reruns, chain = check_chain(tasks, results, mstate.ref, verify_chunk)
    found = [(m.replica, m.kind, m.offset, m.detail) for r in results for m in r.mismatches]
    assert found == [] and chain == []
    assert results[0].retired == 2 * seg and results[0].first is None
    mstats = [r.stats[mstate.ref.name] for r in results]
    sstats = [r.stats[sstate.ref.name] for r in results]
    assert sum(st.bytes for st in mstats) == end - 2 * seg  # every retained byte walked once
    assert sum(st.records for st in sstats) + sum(st.head_gap_records for st in sstats) == sum(
        st.records for st in mstats)
    assert sum(st.head_gap_records for st in sstats) > 0
    for ref in (mstate.ref, sstate.ref):
        cq_found, _read = residual_consume_queues(ref, results, ())
        assert [(m.kind, m.offset, m.detail) for m in cq_found] == []
