"""Retention while everything else runs: segments are deleted every 200 ms (forced, whatever their
age) on a master and its slave while the stock C++ producer sends, a C++ push consumer consumes and
the slave replicates. Nothing may fail or crash, and afterwards both stores are consistent and the
replica holds the master's bytes wherever both still have them."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from rmqbroker.store.config import StoreConfig
from rmqbroker.store.message_store import MessageStore
from tests.conftest import Cluster
from tests.integration.helpers import PushConsumer, StreamProducer, create_topic_and_wait, poll, wait_caught_up
from tests.support.procs import BrokerProc
from tests.unit.store.consistency import assert_store_consistent

SEG = 256 * 1024
TOPIC = "ChurnTopic"


def consistent(broker: BrokerProc) -> int:
    async def check() -> int:
        store = MessageStore(StoreConfig(store_path_root_dir=broker.store_dir, mapped_file_size_commit_log=SEG,
                                         mapped_file_size_consume_queue=20 * 200, max_index_num=2000,
                                         max_hash_slot_num=500))
        await store.start()
        try:
            return assert_store_consistent(store)
        finally:
            await store.shutdown()

    return asyncio.run(check())


def test_segments_deleted_under_load_lose_nothing_they_should_keep(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    conf: dict[str, Any] = {"mappedFileSizeCommitLog": SEG, "maxMessageSize": 65536,
            "mappedFileSizeConsumeQueue": 20 * 200,
            "cleanResourceInterval": 200, "deleteCommitLogFilesInterval": 0,
            # Every round is over the forced-clean ratio but never "full": the oldest segments go.
            "diskSpaceCleanForciblyRatio": 1, "diskSpaceWarningLevelRatio": 100,
            "maxIndexNum": 2000, "maxHashSlotNum": 500}
    master = cluster.broker(ns.addr, name="broker-churn", **conf)
    slave = cluster.broker(ns.addr, name="broker-churn", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}", **conf)
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=4)
    producer = StreamProducer(ns.addr, TOPIC, "churn", cluster.workdir / "churn.jsonl", count=4000, size=2000,
                              seconds=60, settle_ms=300)
    with PushConsumer(ns.addr, "CG_CHURN", TOPIC, log_dir=cluster.workdir) as consumer:
        consumer.wait_started()
        results = producer.results(timeout=120)
        time.sleep(1.0)
        received = consumer.messages
    assert len(results) == 4000 and all(r.get("status") == 0 for r in results), \
        [r for r in results if r.get("status") != 0][:3]
    assert received, "the consumer received nothing"
    assert all(m["topic"] == TOPIC for m in received)

    wait_caught_up(master, [slave])
    m, s = master.status(), slave.status()
    assert m["retention"]["commitLogFilesDeleted"] > 5 and s["retention"]["commitLogFilesDeleted"] > 5
    assert m["minPhyOffset"] > 0 and s["minPhyOffset"] > 0
    assert master.popen is not None and master.popen.poll() is None
    assert slave.popen is not None and slave.popen.poll() is None
    # The replica's bytes equal the master's wherever both still have a segment.
    common = sorted(set(os.listdir(master.store_dir / "commitlog")) & set(os.listdir(slave.store_dir / "commitlog")))
    assert common
    for name in common:
        assert (master.store_dir / "commitlog" / name).read_bytes() == \
            (slave.store_dir / "commitlog" / name).read_bytes(), name
    poll(lambda: master.status()["flushedPhyOffset"] == master.status()["maxPhyOffset"], 10, what="flushed")
    slave.stop()
    master.stop()
    # Consume queues agree with what is left of each commitlog, after a restart from these files.
    assert consistent(master) > 0 and consistent(slave) > 0
    assert not any(".unusable" in p for p in os.listdir(master.store_dir / "index"))
