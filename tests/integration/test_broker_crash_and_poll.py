"""A real ``rmq-broker`` killed with SIGKILL under a stream of stock-client sends keeps every
message it answered SEND_OK for, and a suspended pull is woken by the message it waits for."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from pathlib import Path

from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.store.config import StoreConfig
from rmqbroker.store.message_store import MessageStore
from tests.conftest import Cluster
from tests.integration.helpers import (
    StreamProducer,
    assert_sending,
    create_topic_and_wait,
    poll,
    pull_all,
    rpc,
    send_raw,
)
from tests.unit.store.consistency import assert_store_consistent

SEG = 1024 * 1024  # small segments: the stream crosses several before the kill
CQ_FILE = 60000  # as BrokerProc's default mappedFileSizeConsumeQueue


async def _check_store(root: Path) -> int:
    store = MessageStore(StoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=SEG,
                                     mapped_file_size_consume_queue=CQ_FILE))
    await store.start()
    try:
        return assert_store_consistent(store)
    finally:
        await store.shutdown()


def test_kill9_broker_mid_stream_keeps_every_acknowledged_message(cluster: Cluster) -> None:
    """SIGKILL during sends from three C++ producers, then a restart on the same store: every key
    that got SEND_OK is read back by the C++ PullConsumer, every record's body CRC verifies and
    the consume queues agree with the commitlog."""
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr, name="broker-crash", mappedFileSizeCommitLog=SEG,
                            mappedFileSizeConsumeQueue=CQ_FILE, maxMessageSize=64 * 1024)
    create_topic_and_wait(broker.addr, ns.addr, "CrashTopic", queues=4)
    producers = [StreamProducer(ns.addr, "CrashTopic", f"c{i}", cluster.workdir / f"crash-c{i}.jsonl", count=100000,
                                size=512, seconds=8) for i in range(3)]
    time.sleep(3)
    assert_sending(producers)
    broker.kill9()
    # Once a send has failed against the dead broker, the rest of the producers' 8 s adds nothing.
    poll(lambda: any(b'"error"' in p.out.read_bytes() for p in producers), 30, what="a send failed after the kill")
    for p in producers:
        p.stop()
    results = [r for p in producers for r in p.results()]
    acked = {r["key"] for r in results if r.get("status") == 0}
    assert len(acked) > 200, f"only {len(acked)} sends acknowledged before the kill"
    # Killed mid-stream: sends after the kill failed, and the store was not shut down cleanly.
    assert any("error" in r for r in results), "no send failed: the broker was not killed mid-stream"
    assert (broker.store_dir / "abort").exists()
    assert sum(1 for _ in (broker.store_dir / "commitlog").iterdir()) >= 2

    broker.start()
    msgs = pull_all(ns.addr, "CrashTopic", group="CG_CRASH", timeout=90)
    keys = [m["keys"] for m in msgs]
    missing = acked - set(keys)
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    for m in msgs:
        assert m["body"].startswith(f"{m['keys']}|"), m
    broker.stop()
    records = asyncio.run(_check_store(broker.store_dir))
    assert records >= len(acked)


def _pull(addr: str, topic: str, offset: int, suspend_ms: int) -> tuple[RemotingCommand, float]:
    resp = rpc(addr, RequestCode.PULL_MESSAGE, {
        "consumerGroup": "CG_POLL", "topic": topic, "queueId": "0", "queueOffset": str(offset),
        "maxMsgNums": "32", "sysFlag": "6", "commitOffset": "0", "suspendTimeoutMillis": str(suspend_ms),
        "subscription": "*", "subVersion": "0"}, timeout=suspend_ms / 1000 + 10)  # sysFlag: suspend + subscription
    return resp, time.monotonic()


def test_suspended_pull_is_woken_by_an_arriving_message(cluster: Cluster) -> None:
    """A pull at the end of a queue with a 15 s suspend neither answers at once nor waits out its
    timeout: the send that lands in its queue wakes it within a second (held pulls are otherwise
    answered only at their deadline)."""
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr, name="broker-poll")
    create_topic_and_wait(broker.addr, ns.addr, "PollTopic", queues=1)
    assert send_raw(broker.addr, "PollTopic", b"first").code == ResponseCode.SUCCESS
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        waiting = pool.submit(_pull, broker.addr, "PollTopic", 1, 15000)
        time.sleep(1.5)
        assert not waiting.done(), "the pull was answered without waiting for a message"
        sent_at = time.monotonic()
        assert send_raw(broker.addr, "PollTopic", b"second").code == ResponseCode.SUCCESS
        resp, answered_at = waiting.result(timeout=30)
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    assert b"second" in bytes(resp.body)
    assert answered_at - sent_at < 1.0, f"pull answered {answered_at - sent_at:.2f}s after the send"
