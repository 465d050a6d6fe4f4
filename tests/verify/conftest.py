"""Fixtures of the replica-verification tests: one SparkSession and one replicating group per session.

The group (nameserver, master, two slaves) is filled once by real broker processes; the second
slave is then stopped for a moment so its store can be copied while consistent ("golden" store).
Fault tests start an extra, non-replicating slave on a copy of that golden store with one fault
injected into its files - so the live group stays clean for every test.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.store.record import BatchEntry, encode_batch_body, encode_record
from rmqbroker.verify.job import spark_session
from tests.conftest import Cluster
from tests.integration.helpers import create_topic, poll
from tests.support.procs import BrokerProc

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SEG = 1024 * 1024  # small segments: records cross chunk and segment boundaries, blank markers appear
TOPICS = ("VerifyT1", "VerifyT2", "VerifyT3")  # equal lengths: a topic can be swapped in place
QUEUES = 4
MESSAGES = 4000
GROUPS = ("CG_VERIFY_A", "CG_VERIFY_B")
DELAYED = 5


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    if shutil.which("java") is None:
        # Never skipped: the Spark path is the product; a machine without Java 17 is misconfigured.
        pytest.fail("rmq-verify's Spark tests need Java 17 on PATH (apt-get install openjdk-17-jre-headless)")
    session = spark_session("local[2]", {"spark.default.parallelism": "2"})
    yield session
    session.stop()


@dataclass
class Group:
    master: BrokerProc
    slaves: list[BrokerProc]
    golden: Path  # copy of slave 2's store taken while it was stopped
    workdir: Path
    token: str

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{b.admin_port}" for b in (self.master, *self.slaves)]


def _send_header(topic: str, queue_id: int, props: str, sys_flag: int = 0) -> dict[str, str]:
    return {"producerGroup": "PG_VERIFY", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
            "queueId": str(queue_id), "sysFlag": str(sys_flag), "bornTimestamp": str(int(time.time() * 1000)),
            "flag": "0", "properties": props}


def _trap_body() -> bytes:
    """A body made of valid stored records (a forwarded-record payload): fake boundaries everywhere."""
    rng = random.Random(7)
    parts = [encode_record(topic="Fake", body=rng.randbytes(1500), properties={"TAGS": "x"}, queue_offset=i,
                           physical_offset=i * 1700) for i in range(180)]
    return b"".join(parts)


async def _load(addr: str) -> None:
    """Thousands of messages across topics and queues: tags, keys, zlib-compressed bodies, a batch,
    record-lookalike payloads and delayed messages."""
    rng = random.Random(1234)
    client = RemotingClient()
    sem = asyncio.Semaphore(64)

    async def send(code: int, ext: dict[str, str], body: bytes) -> None:
        async with sem:
            resp = await client.invoke(addr, RemotingCommand(code, ext_fields=ext, body=body), 15)
            assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)

    jobs = []
    for i in range(MESSAGES):
        topic = TOPICS[i % len(TOPICS)]
        tag = ("TagA", "TagB", "")[i % 3]
        props = f"WAIT\x01true\x02KEYS\x01k{i}\x02" + (f"TAGS\x01{tag}\x02" if tag else "")
        if i % 10 == 0:
            # Compressed like the C++ client does it: sysFlag bit 0 and a zlib body (stored as sent).
            text = (f"message {i} " * rng.randint(200, 600)).encode()
            jobs.append(send(RequestCode.SEND_MESSAGE, _send_header(topic, i % QUEUES, props, 1), zlib.compress(text)))
        else:
            jobs.append(send(RequestCode.SEND_MESSAGE, _send_header(topic, i % QUEUES, props),
                             rng.randbytes(rng.randint(50, 1200))))
    await asyncio.gather(*jobs)
    batch = encode_batch_body([BatchEntry(0, f"batch {i}".encode() * 20, f"TAGS\x01TagB\x02KEYS\x01b{i}")
                               for i in range(20)])
    await send(RequestCode.SEND_BATCH_MESSAGE, _send_header("VerifyT2", 1, "WAIT\x01true"), batch)
    for i in range(2):
        await send(RequestCode.SEND_MESSAGE, _send_header("VerifyT3", i, f"TAGS\x01Trap\x02KEYS\x01trap{i}"),
                   _trap_body())
    for i in range(DELAYED):
        props = f"DELAY\x011\x02TAGS\x01Later\x02KEYS\x01d{i}"
        await send(RequestCode.SEND_MESSAGE, _send_header("VerifyT1", 0, props), f"delayed {i}".encode())
    for group in GROUPS:
        hb = {"clientID": f"c-{group}", "consumerDataSet": [
            {"groupName": group, "consumeType": 1, "messageModel": 1, "consumeFromWhere": 0,
             "subscriptionDataSet": []}]}
        await send(RequestCode.HEART_BEAT, {}, json.dumps(hb).encode())
        for topic in TOPICS:
            for q in range(QUEUES):
                await send(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic,
                                                                "queueId": str(q), "commitOffset": str(10 + q)}, b"")
    await client.close()


def _metadata(b: BrokerProc) -> dict[str, Any]:
    code, body = b.admin("/metadata")
    assert code == 200, body
    result: dict[str, Any] = json.loads(body)
    return result


def _in_sync(master: BrokerProc, slaves: list[BrokerProc]) -> bool:
    m = _metadata(master)
    top = master.status()["maxPhyOffset"]
    for s in slaves:
        if s.status()["maxPhyOffset"] != top:
            return False
        sm = _metadata(s)
        for k in ("topics", "subscriptionGroups", "consumerOffsets"):
            if sm[k] != m[k]:
                return False
    return True


@pytest.fixture(scope="session")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    workdir = tmp_path_factory.mktemp("verify-group")
    cluster = Cluster(workdir)
    try:
        ns = cluster.namesrv()
        conf: dict[str, Any] = {"mappedFileSizeCommitLog": SEG, "maxMessageSize": 512 * 1024,
                                "slaveSyncInitialDelay": 300, "slaveSyncInterval": 500,
                                "flushConsumerOffsetInterval": 500, "messageDelayLevel": "1s 2s 3s"}
        master = cluster.broker(ns.addr, name="broker-v", broker_id=0, **conf)
        slaves = [cluster.broker(ns.addr, name="broker-v", broker_id=i, role="SLAVE",
                                 haMasterAddress=f"127.0.0.1:{master.port + 1}", **conf) for i in (1, 2)]
        for topic in TOPICS:
            create_topic(master.addr, topic, QUEUES)
        asyncio.run(_load(master.addr))
        # Delayed messages come back into VerifyT1 after 1 s (the master re-puts them).
        poll(lambda: _metadata(master)["delayOffsets"].get("offsetTable", {}).get("1") == DELAYED, 20,
             what="delayed messages delivered")
        poll(lambda: _in_sync(master, slaves), 30, what="slaves caught up and metadata synced")
        # A clean shutdown flushes everything: its files are a consistent store. A stop cut short
        # (killed after its timeout on a busy machine) would leave a store whose recovery rewrites
        # consume queues, and every fault test would then report something else than its fault.
        assert slaves[1].stop(timeout=60) == 0, slaves[1].log_text()[-3000:]
        assert not (slaves[1].store_dir / "abort").exists(), "slave 2 did not shut down cleanly"
        golden = workdir / "golden"
        shutil.copytree(slaves[1].store_dir, golden)
        slaves[1].start()
        poll(lambda: _in_sync(master, slaves), 30, what="slave 2 back in sync")
        yield Group(master, slaves, golden, workdir, master.token)
    finally:
        cluster.stop_all()


@dataclass
class StoreFiles:
    """The golden store's files, for choosing where to inject a fault."""

    root: Path

    def commitlog(self) -> bytes:
        files = sorted((self.root / "commitlog").iterdir())
        return b"".join(f.read_bytes() for f in files)

    def records(self) -> list[tuple[int, Any]]:
        """(offset, decoded record) of every record, walking segments like recovery does."""
        from rmqbroker.store.record import check_record, decode_record

        out = []
        for f in sorted((self.root / "commitlog").iterdir()):
            data = f.read_bytes()
            base = int(f.name)
            pos = 0
            while pos + 8 <= len(data):
                try:
                    size = check_record(data, pos)
                except Exception:
                    break
                if size == 0:
                    break
                out.append((base + pos, decode_record(data, pos)))
                pos += size
        return out


def start_copy(group: Group, name: str, mutate: Any) -> BrokerProc:
    """A non-replicating slave serving a copy of the golden store after ``mutate(store_root)``.

    checkCRCOnRecover=false: the broker serves a corrupt body instead of truncating the log at it;
    no nameserver and a dead HA address: nothing repairs the fault behind the test's back.
    """
    workdir = group.workdir / name
    workdir.mkdir()
    b = BrokerProc(workdir, None, name="broker-v", broker_id=3, role="SLAVE", token=group.token,
                   mappedFileSizeCommitLog=SEG, maxMessageSize=512 * 1024, checkCRCOnRecover="false",
                   haMasterAddress="127.0.0.1:9",
                   messageDelayLevel="1s 2s 3s")
    shutil.copytree(group.golden, b.store_dir)
    (b.store_dir / "lock").unlink(missing_ok=True)
    mutate(b.store_dir)
    return b.start()
