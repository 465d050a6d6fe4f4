"""A disk that fills up: writes are refused with RocketMQ's errors, nothing crashes, nothing is lost.

Store files are sparse and written through shared mappings; a write into a hole that a full disk
cannot back is a SIGBUS, which used to kill the broker (a master mid-send, or a slave taking the
stream). Each test runs the store on a real, small filesystem (a tmpfs in a private mount
namespace, :mod:`tests.support.small_disk`), fills it, and then frees it again.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from tests.conftest import Cluster
from tests.integration.helpers import create_topic, poll, rpc
from tests.support.procs import BrokerProc, metric_value
from tests.support.small_disk import SmallDisk, small_disk_available

pytestmark = pytest.mark.skipif(not small_disk_available(),
                                reason="needs the right to mount a tmpfs (root or CAP_SYS_ADMIN), as CI has")

HERE = Path(__file__).parent
# Retention would start refusing sends by itself once it measured the disk; these tests are about
# the writes that reach a full disk first (between two of its rounds, or under a quota).
NO_RETENTION: dict[str, object] = {"cleanResourceInterval": 3_600_000}


def _send_command(topic: str, queue_id: int, body: bytes) -> RemotingCommand:
    return RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields={
        "producerGroup": "PG_FULL", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": str(queue_id), "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
        "properties": "WAIT\x01true\x02"}, body=body)


def send_all(addr: str, topic: str, bodies: list[bytes], concurrency: int = 16) -> list[RemotingCommand]:
    """Send every body (queues 0-3 in turn) over one connection, ``concurrency`` at a time; the answers."""

    async def run() -> list[RemotingCommand]:
        client = RemotingClient()
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int, body: bytes) -> RemotingCommand:
            async with sem:
                return await client.invoke(addr, _send_command(topic, i % 4, body), 10)

        try:
            return list(await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies))))
        finally:
            await client.close()

    return asyncio.run(run())


def max_offset(addr: str, topic: str, queue_id: int) -> int:
    resp = rpc(addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)})
    assert resp.code == ResponseCode.SUCCESS, resp
    return int(resp.ext_fields["offset"])


def no_space_failures(broker: BrokerProc) -> float:
    return metric_value(broker.metrics(), "rmq_store_no_space_failures_total")


def broker_on(disk: SmallDisk, cluster: Cluster, namesrv: str | None, **kw: object) -> BrokerProc:
    b = BrokerProc(cluster.workdir, namesrv, **kw)  # type: ignore[arg-type]
    assert b.store_dir == disk.mount_dir, "the disk must be mounted where the broker keeps its store"
    b.args = disk.wrap(b.args)
    cluster.procs.append(b)
    return b


def test_a_store_on_a_full_disk_refuses_what_finds_no_room_and_takes_it_back(tmp_path: Path) -> None:
    with SmallDisk(tmp_path / "disk", 8) as disk:
        run = subprocess.run(disk.wrap([sys.executable, str(HERE / "full_disk_store.py"), str(disk.mount_dir)]),
                             capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, f"rc {run.returncode}\n{run.stderr[-3000:]}"
    seen = json.loads(run.stdout)
    assert seen["first"] == "PUT_OK"
    # A new queue's consume-queue file could get no block: refused, and its record taken back.
    assert seen["refused"] == "SERVICE_NOT_AVAILABLE"
    assert seen["end_unchanged"] and seen["b_max_after_refusal"] == 0
    # A record whose only missing room is an index slot is stored; the index catches up later.
    assert seen["stored_while_full"] == "PUT_OK"
    assert seen["index_gap_while_full"] == seen["a2_offset"] and seen["query_while_full"] == 0
    assert seen["no_space_failures"] >= 1
    # With room again the refused message is stored where it would have gone, as the queue's first.
    assert seen["again"] == "PUT_OK" and seen["again_queue_offset"] == 0 and seen["again_continues_log"]
    assert seen["index_caught_up"] and seen["query_after"] == 1
    restart = seen["restart"]
    assert (restart["A"], restart["B"], restart["query"]) == (["a1", "a2"], ["b1"], 1)
    assert restart["end"] == restart["expected_end"]


def test_a_master_whose_disk_fills_refuses_sends_and_takes_them_again_once_there_is_room(
        cluster: Cluster) -> None:
    with SmallDisk(cluster.workdir / "store-broker-full-0", 24) as disk:
        disk.fill(leave=3 << 20)
        master = broker_on(disk, cluster, None, name="broker-full", **NO_RETENTION).start()
        create_topic(master.addr, "Full")
        body = b"x" * 16_000
        answers: list[RemotingCommand] = []
        for _ in range(30):  # 3 MB of room: refusals start after ~190 sends
            answers += send_all(master.addr, "Full", [body] * 32)
            if answers[-1].code != ResponseCode.SUCCESS:
                break
        assert master.alive, master.log_text()[-3000:]
        codes = [a.code for a in answers]
        stored = codes.count(ResponseCode.SUCCESS)
        assert 0 < stored < len(codes), f"{stored} of {len(codes)} sends stored: the disk never filled"
        assert set(codes) == {ResponseCode.SUCCESS, ResponseCode.SERVICE_NOT_AVAILABLE}
        refused = next(a for a in answers if a.code != ResponseCode.SUCCESS)
        assert "disk is full" in (refused.remark or "")
        assert no_space_failures(master) >= 1
        assert "no space on the store's disk" in master.log_text()
        # What was acknowledged is there, in the queues the answers named.
        assert sum(max_offset(master.addr, "Full", q) for q in range(4)) == stored
        disk.free()
        after = send_all(master.addr, "Full", [b"after"] * 8)
        assert [a.code for a in after] == [ResponseCode.SUCCESS] * 8
        end = master.status()["maxPhyOffset"]
        # A clean restart on the same disk finds the log and queues as they were answered.
        master.stop()
        master.start()
        assert master.status()["maxPhyOffset"] == end
        assert sum(max_offset(master.addr, "Full", q) for q in range(4)) == stored + 8
        phy = int(after[-1].ext_fields["msgId"][-16:], 16)
        last = rpc(master.addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(phy)})
        assert last.code == ResponseCode.SUCCESS and b"after" in bytes(last.body), last


def test_a_slave_whose_disk_fills_stays_up_and_catches_up_once_there_is_room(cluster: Cluster) -> None:
    master = cluster.broker(None, name="broker-sf", cleanResourceInterval=3_600_000)
    with SmallDisk(cluster.workdir / "store-broker-sf-1", 24) as disk:
        disk.fill(leave=3 << 20)
        slave = broker_on(disk, cluster, None, name="broker-sf", broker_id=1, role="SLAVE",
                          haMasterAddress=f"127.0.0.1:{master.port + 1}", **NO_RETENTION).start()
        create_topic(master.addr, "Full")
        # Small messages: the slave copies small frames through its mapping, where a hole a full
        # disk cannot back is a SIGBUS rather than an error.
        for _ in range(6):
            answers = send_all(master.addr, "Full", [b"y" * 1000] * 1000)
            assert {a.code for a in answers} == {ResponseCode.SUCCESS}
        master_end = master.status()["maxPhyOffset"]
        assert master_end > 5 << 20
        poll(lambda: no_space_failures(slave) >= 1, 20, what="the slave's disk full")
        assert slave.alive, slave.log_text()[-3000:]
        assert slave.status()["maxPhyOffset"] < master_end
        disk.free()
        poll(lambda: slave.status()["maxPhyOffset"] == master_end, 30, what="the slave caught up")
        poll(lambda: slave.status()["dispatchedPhyOffset"] == master_end, 30, what="the slave's queues built")
        code, master_bytes = master.admin(f"/commitlog?offset=0&length={master_end}")
        assert code == 200
        assert slave.admin(f"/commitlog?offset=0&length={master_end}") == (200, master_bytes)
        assert [max_offset(slave.addr, "Full", q) for q in range(4)] == \
            [max_offset(master.addr, "Full", q) for q in range(4)]
        assert slave.alive
