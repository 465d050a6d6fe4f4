"""What an SQL92 selector costs a pull, against the tag path on the same store in the same run.

A store is filled with ``--messages`` records of ``--body`` bytes in 4 queues, each with a tag and
two user properties (``a`` = 0..99, ``region`` = eu/us). Every queue is then read from its start
to its end by the store's pull read (``MessageStore.get_message``, 32 messages a call, as a
consumer pulls), in three ways, ``--rounds`` times in alternation:

* ``tag *``: no filter, every record is returned (the baseline);
* ``sql all``: the selector ``a >= 0``, which selects every record: the whole cost of evaluating;
* ``sql 10%``: the selector ``a < 20 AND region = 'eu'``, which selects one record in ten.

The record filter is the pull processor's own (properties decoded, then the compiled selector).
Printed: microseconds per record read (median of the rounds) and each SQL way's ratio to the tag
way measured in the same round.

Usage: ``python bench/sql_filter_bench.py [--messages 200000] [--rounds 5]``.
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
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rmqbroker.filter.sql92 import compile_sql92  # noqa: E402
from rmqbroker.processors.pull import _selecting  # noqa: E402
from rmqbroker.store.config import StoreConfig  # noqa: E402
from rmqbroker.store.message_store import MessageInner, MessageStore  # noqa: E402

TOPIC = "Orders"
QUEUES = 4


def read_all(store: MessageStore, record_filter: Callable[[memoryview], bool] | None) -> tuple[int, int]:
    """Read every queue to its end; (records returned, records read)."""
    returned = read = 0
    for qid in range(QUEUES):
        offset = 0
        end = store.get_max_offset_in_queue(TOPIC, qid)
        while offset < end:
            result = store.get_message("CG", TOPIC, qid, offset, 32, None, record_filter)
            returned += result.message_count
            read += result.next_begin_offset - offset
            offset = result.next_begin_offset
    return returned, read


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--body", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sql-bench-", dir=args.workdir))
    try:
        store = MessageStore(StoreConfig(store_path_root_dir=work / "store"))
        await store.start()
        payload = b"x" * args.body
        for i in range(args.messages):
            store.append_message(MessageInner(
                topic=TOPIC, queue_id=i % QUEUES, flag=0, body=payload,
                properties={"UNIQ_KEY": f"0A000001{i:024X}", "TAGS": "TagA", "a": str(i % 100),
                            "region": "eu" if i % 2 else "us"},
                born_timestamp=1700000000000, born_host=("10.0.0.5", 50000)))
        ways: dict[str, Callable[[memoryview], bool] | None] = {
            "tag *": None,
            "sql all": _selecting(compile_sql92("a >= 0")),
            "sql 10%": _selecting(compile_sql92("a < 20 AND region = 'eu'")),
        }
        per_record: dict[str, list[float]] = {name: [] for name in ways}
        ratios: dict[str, list[float]] = {name: [] for name in ways if name != "tag *"}
        selected: dict[str, int] = {}
        read_all(store, None)  # page cache and code paths warm before the first timed round
        for _ in range(args.rounds):
            this_round: dict[str, float] = {}
            for name, record_filter in ways.items():
                began = time.process_time()
                returned, read = read_all(store, record_filter)
                took = time.process_time() - began
                assert read == args.messages, (name, read)
                selected[name] = returned
                this_round[name] = took / read * 1e6
                per_record[name].append(this_round[name])
            for name, series in ratios.items():
                series.append(this_round[name] / this_round["tag *"])
        await store.shutdown()
        out = {
            "messages": args.messages, "body": args.body, "rounds": args.rounds,
            "selected": selected,
            "us_per_record_read_median": {n: round(statistics.median(v), 3) for n, v in per_record.items()},
            "ratio_to_tag_median": {n: round(statistics.median(v), 2) for n, v in ratios.items()},
        }
        print(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
