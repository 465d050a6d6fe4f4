"""Start-up time of a healthy store after a clean shutdown, and after a lost consume queue.

A store (broker defaults: 1 GiB commitlog segments, 6 MB consume-queue files, index on) is filled
with ``--messages`` records of ``--body`` bytes over 16 topics of 8 queues, each with a client
message id and one KEYS word, and shut down cleanly. Then ``MessageStore.start`` is timed
``--rounds`` times after a clean shutdown (the common restart: what consume-queue checks add to
it matters), and, with ``--damaged``, once more after one queue's directory was deleted (the
start that rebuilds it). Page cache is warm (the data was just written), so this measures the CPU
cost of recovery, not the disk's read rate.

Usage: ``python bench/startup_bench.py [--messages 1000000] [--body 1000] [--rounds 5] [--damaged]
[--dir DIR] [--keep]``. With ``--dir`` an existing store there is reused (``--keep`` leaves it).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from index_rebuild_bench import config, fill  # noqa: E402  (bench/ is the script's directory)
from rmqbroker.store.message_store import MessageStore  # noqa: E402

TOPICS = 16
QUEUES = 8


async def timed_start(root: Path) -> tuple[float, int]:
    """Seconds ``start`` took, and the max offset of Orders0-0 afterwards."""
    store = MessageStore(config(root))
    began = time.perf_counter()
    await store.start()
    took = time.perf_counter() - began
    max0 = store.get_max_offset_in_queue("Orders0", 0)
    await store.shutdown()
    return took, max0


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--body", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--damaged", action="store_true")
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="startup-bench-"))
    try:
        if not (root / "commitlog").exists():
            began = time.perf_counter()
            await fill(root, args.messages, args.body, topics=TOPICS, queues=QUEUES)
            print(f"filled {root} with {args.messages} records in {time.perf_counter() - began:.1f} s")
        size = sum(p.stat().st_blocks * 512 for p in (root / "commitlog").iterdir())
        print(f"commitlog on disk: {size / 2**30:.2f} GiB")
        clean = []
        for _ in range(args.rounds):
            took, max0 = await timed_start(root)
            clean.append(took)
        print(f"clean start: median {statistics.median(clean):.3f} s "
              f"(runs {', '.join(f'{t:.3f}' for t in clean)}); Orders0-0 max offset {max0}")
        if args.damaged:
            shutil.rmtree(root / "consumequeue" / "Orders0" / "0")
            took, max0 = await timed_start(root)
            print(f"start after deleting consumequeue/Orders0/0: {took:.3f} s; Orders0-0 max offset {max0}")
            took, max0 = await timed_start(root)
            print(f"next clean start: {took:.3f} s; Orders0-0 max offset {max0}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
