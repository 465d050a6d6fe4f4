"""Start-up after a crash of the machine, when the store indexes its newest records again.

A store is filled with ``--messages`` records of ``--body`` bytes, each with a client message id
(UNIQ_KEY) and one KEYS word, in one index file (broker defaults), and shut down. Then, in turns:

* a *process crash*: the abort marker carries this boot's id, so the index files are kept;
* a *machine crash*: the marker names another boot and the checkpoint predates the index file,
  so the store deletes that file and indexes the commitlog again before it opens.

Each start is timed (``MessageStore.start``: recovery and, for the machine crash, the indexing),
``--rounds`` times in alternation; the median of each, their difference per indexed record and
their ratio are printed. Page cache is warm in both (the data was just written), so this measures
the CPU cost of indexing again, not the disk's read rate.

Usage: ``python bench/index_rebuild_bench.py [--messages 500000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rmqbroker.store.checkpoint import boot_id  # noqa: E402
from rmqbroker.store.config import StoreConfig  # noqa: E402
from rmqbroker.store.message_store import MessageInner, MessageStore  # noqa: E402


def config(root: Path) -> StoreConfig:
    return StoreConfig(store_path_root_dir=root)


async def fill(root: Path, messages: int, body: int, topics: int = 1, queues: int = 8) -> None:
    """``messages`` keyed records over ``queues`` queues of topic Orders (``Orders0``... when
    ``topics`` > 1); also used by startup_bench.py."""
    store = MessageStore(config(root))
    await store.start()
    payload = b"x" * body
    for i in range(messages):
        store.append_message(MessageInner(
            topic="Orders" if topics == 1 else f"Orders{i % topics}", queue_id=(i // topics) % queues, flag=0,
            body=payload, properties={"UNIQ_KEY": f"0A000001{i:024X}", "KEYS": f"order-{i}", "TAGS": "TagA"},
            born_timestamp=1700000000000, born_host=("10.0.0.5", 50000)))
        if i % 10000 == 0:
            await asyncio.sleep(0)  # let the flushers run
    await store.shutdown()


async def timed_start(root: Path, checkpoint: bytes, marker: str) -> tuple[float, int]:
    """Seconds ``start`` took after a crash whose abort marker holds ``marker``; index entries."""
    (root / "checkpoint").write_bytes(checkpoint)
    (root / "abort").write_text(marker)
    store = MessageStore(config(root))
    began = time.perf_counter()
    await store.start()
    took = time.perf_counter() - began
    entries = sum(f.count - 1 for f in store.index.files) if store.index is not None else 0
    await store.shutdown()
    return took, entries


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=500_000)
    p.add_argument("--body", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="idx-bench-", dir=args.workdir))
    try:
        root = work / "store"
        began = time.perf_counter()
        await fill(root, args.messages, args.body)
        filled = time.perf_counter() - began
        # The checkpoint of an empty store: nothing of the index file is known to be on disk.
        empty = work / "empty"
        store = MessageStore(config(empty))
        await store.start()
        await store.shutdown()
        checkpoint = (empty / "checkpoint").read_bytes()
        process, machine = [], []
        entries = 0
        for _ in range(args.rounds):
            t, e = await timed_start(root, checkpoint, boot_id() or "")
            process.append(t)
            t, entries = await timed_start(root, checkpoint, "another-boot")
            machine.append(t)
            assert entries == e == 2 * args.messages, (entries, e)
        p_med, m_med = statistics.median(process), statistics.median(machine)
        print(json.dumps({
            "messages": args.messages, "body_bytes": args.body, "index_entries": entries,
            "fill_seconds": round(filled, 2),
            "start_after_process_crash_s": [round(t, 3) for t in process],
            "start_after_machine_crash_s": [round(t, 3) for t in machine],
            "median_process_crash_s": round(p_med, 3), "median_machine_crash_s": round(m_med, 3),
            "reindex_us_per_record": round((m_med - p_med) / args.messages * 1e6, 2),
            "ratio_machine_to_process": round(m_med / p_med, 2),
        }, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
