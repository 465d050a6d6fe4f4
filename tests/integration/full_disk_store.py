"""Helper process for test_disk_full: a message store on a disk that fills up, run inside the
small disk's namespace (the disk is ``argv[1]``); prints what it saw as one JSON object.

Steps: a message stored; the disk filled to the last byte; a message to a new queue (whose
consume-queue file cannot get blocks: refused and taken back) and one to the first queue with a
key whose index slot cannot get blocks (stored, indexed later); the disk freed; the refused
message stored again, the index caught up; the store restarted and read back.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, inside the namespace

from rmqbroker.store.config import StoreConfig
from rmqbroker.store.index import HEADER_SIZE, SLOT_SIZE, build_key, key_hash
from rmqbroker.store.message_store import MessageInner, MessageStore
from tests.support.small_disk import fill

SLOTS = 5_000_000  # StoreConfig's default maxHashSlotNum
FILLER = "filler"


def config(root: Path) -> StoreConfig:
    return StoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=1 << 20,
                       mapped_file_size_consume_queue=20 * 1000)


def message(topic: str, body: bytes, keys: str) -> MessageInner:
    return MessageInner(topic=topic, queue_id=0, flag=0, body=body, properties={"KEYS": keys},
                        born_timestamp=1700000000000, born_host=("10.0.0.5", 50000))


def slot_page(topic: str, key: str) -> int:
    return (HEADER_SIZE + key_hash(build_key(topic, key)) % SLOTS * SLOT_SIZE) // 4096


def other_key(topic: str, taken: set[int]) -> str:
    """A key whose index slot lies on a page no earlier key touched (or the header's)."""
    n = 0
    while slot_page(topic, f"k{n}") in taken | {0}:
        n += 1
    return f"k{n}"


def queue_bodies(store: MessageStore, topic: str) -> list[bytes]:
    from rmqbroker.store.record import iter_records
    got = store.get_message("g", topic, 0, 0, 32)
    return [r.body for r in iter_records(got.body())] if got.message_count else []


async def main(disk: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    root = disk / "store"
    store = MessageStore(config(root))
    await store.start()
    first = await store.put_message(message("A", b"a1", "k-first"))
    out["first"] = first.status.name
    key = other_key("A", {slot_page("A", "k-first")})
    fill(disk, FILLER)
    end_before = store.max_phy_offset()
    refused = await store.put_message(message("B", b"b1", "kb"))
    out["refused"] = refused.status.name
    out["end_unchanged"] = store.max_phy_offset() == end_before
    out["b_max_after_refusal"] = store.get_max_offset_in_queue("B", 0)
    stored = await store.put_message(message("A", b"a2", key))
    out["stored_while_full"] = stored.status.name
    out["index_gap_while_full"] = store.index_gap
    out["a2_offset"] = stored.wrote_offset
    out["query_while_full"] = len(store.query_message("A", key, 32, 0, 2**62).records)
    out["no_space_failures"] = store.no_space_failures
    (disk / FILLER).unlink()
    again = await store.put_message(message("B", b"b1", "kb"))
    out["again"] = again.status.name
    out["again_queue_offset"] = again.queue_offset
    out["again_continues_log"] = again.wrote_offset == stored.wrote_offset + stored.wrote_bytes
    out["index_caught_up"] = await store.index_catch_up()
    out["query_after"] = len(store.query_message("A", key, 32, 0, 2**62).records)
    await store.shutdown()
    store = MessageStore(config(root))
    await store.start()
    out["restart"] = {
        "A": [b.decode() for b in queue_bodies(store, "A")],
        "B": [b.decode() for b in queue_bodies(store, "B")],
        "end": store.max_phy_offset(),
        "expected_end": again.wrote_offset + again.wrote_bytes,
        "query": len(store.query_message("A", key, 32, 0, 2**62).records),
    }
    await store.shutdown()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1])))))
