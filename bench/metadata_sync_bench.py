"""How long a master and its slave stop answering while the slave's metadata sync moves a large
consumer offset table.

The master starts with ``--topics`` topics of ``--queues`` queues and ``--groups`` groups with an
offset on every queue (files written before it starts: topics x groups keys, x queues offsets); its
slave syncs every second (``slaveSyncInterval=1000``, the default being 10 s). For ``--seconds`` a
client commits an offset on the master (so its table is dirty and written every
flushConsumerOffsetInterval) and then sends a cheap request (GET_BROKER_RUNTIME_INFO) to each
broker, every 5 ms; every answer of the master (commit included) and the slave is timed. Printed:
each broker's latency p50/p99/max, the answers slower than 20 ms (a broker's event loop held by one
piece of work), and the sync rounds completed.

Usage: ``python bench/metadata_sync_bench.py [--topics 10000] [--queues 8] [--groups 5] [--seconds 20]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.procs import BrokerProc, Namesrv  # noqa: E402

from rmqbroker.remoting.client import RemotingClient  # noqa: E402
from rmqbroker.remoting.codes import RequestCode  # noqa: E402
from rmqbroker.remoting.frame import RemotingCommand  # noqa: E402


def write_tables(store: Path, topics: int, queues: int, groups: int) -> None:
    """The master's topics, groups and consumer offsets, as RocketMQ's config files."""
    cfg = store / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    version = {"timestamp": 1, "counter": 1}
    table = {f"T{i:05d}": {"topicName": f"T{i:05d}", "readQueueNums": queues, "writeQueueNums": queues, "perm": 6,
                           "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False} for i in range(topics)}
    (cfg / "topics.json").write_text(json.dumps({"topicConfigTable": table, "dataVersion": version}))
    offsets = {f"T{i:05d}@G{g:03d}": {str(q): 1000 + q for q in range(queues)}
               for i in range(topics) for g in range(groups)}
    (cfg / "consumerOffset.json").write_text(json.dumps({"offsetTable": offsets}))
    subs = {f"G{g:03d}": {"groupName": f"G{g:03d}"} for g in range(groups)}
    (cfg / "subscriptionGroup.json").write_text(json.dumps({"subscriptionGroupTable": subs, "dataVersion": version}))


async def probe(master: str, slave: str, seconds: float) -> dict[str, list[float]]:
    """Latency (ms) of a cheap request to each broker, every 5 ms, with a commit on the master."""
    out: dict[str, list[float]] = {master: [], slave: []}
    client = RemotingClient()
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            # The commit is timed too: a stall that begins while it is in flight shows in its answer.
            began = time.perf_counter()
            await client.invoke(master, RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields={
                "consumerGroup": "G000", "topic": "T00000", "queueId": "0",
                "commitOffset": str(int(time.time() * 1000))}), 10)
            out[master].append((time.perf_counter() - began) * 1000)
            for addr in (master, slave):
                began = time.perf_counter()
                await client.invoke(addr, RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO, ext_fields={}), 10)
                out[addr].append((time.perf_counter() - began) * 1000)
            await asyncio.sleep(0.005)
    finally:
        await client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=10000)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--groups", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="metadata-sync-bench-"))
    ns = Namesrv(work).start()
    master = BrokerProc(work, ns.addr, name="msb", role="ASYNC_MASTER")
    write_tables(master.store_dir, args.topics, args.queues, args.groups)
    slave = BrokerProc(work, ns.addr, name="msb", broker_id=1, role="SLAVE", slaveSyncInterval=1000,
                       slaveSyncInitialDelay=500, haMasterAddress=f"127.0.0.1:{master.port + 1}")
    try:
        master.start(wait_ready=False)
        master.wait_ready(120)
        slave.start(wait_ready=False)
        slave.wait_ready(120)
        deadline = time.monotonic() + 120
        while slave.status()["metadataSync"]["rounds"] < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        rounds = slave.status()["metadataSync"]["rounds"]
        latency = asyncio.run(probe(master.addr, slave.addr, args.seconds))
        sync = slave.status()["metadataSync"]
        print(f"[metadata-sync] {args.topics} topics x {args.groups} groups x {args.queues} queues = "
              f"{args.topics * args.groups * args.queues} queue offsets, {args.seconds:.0f} s")
        for addr, label in ((master.addr, "master"), (slave.addr, "slave")):
            ms = sorted(latency[addr])
            slow = [round(x) for x in latency[addr] if x > 20]
            print(f"[metadata-sync] {label}: {len(ms)} requests, p50 {ms[len(ms) // 2]:.2f} ms, "
                  f"p99 {ms[len(ms) * 99 // 100]:.2f} ms, max {ms[-1]:.1f} ms; answers over 20 ms: {slow}")
        print(f"[metadata-sync] sync rounds in the window: {sync['rounds'] - rounds}, failures {sync['failures']}, "
              f"last error {sync['lastError']}")
    finally:
        for proc in (slave, master, ns):
            proc.stop()


if __name__ == "__main__":
    main()
