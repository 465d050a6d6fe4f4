"""Helper process for test_store_recovery: appends messages until killed, printing every acknowledgement.

Usage: ``python store_writer.py <store root> <ASYNC_FLUSH|SYNC_FLUSH>``.  Each acknowledged message
is printed as ``<seq> <topic> <queue id> <queue offset>`` after its put returned; the body of
message ``seq`` is :func:`body_for` (seq), so the parent can check it after recovery.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Literal

from rmqbroker.store.config import StoreConfig
from rmqbroker.store.message_store import MessageBatchInner, MessageInner, MessageStore
from rmqbroker.store.record import BatchEntry, encode_batch_body

SEGMENT = 64 * 1024
CQ_FILE = 20 * 50


def body_for(seq: int) -> bytes:
    return f"msg-{seq}-".encode() * (1 + (seq * 7919) % 1500)


def config(root: Path, flush: Literal["ASYNC_FLUSH", "SYNC_FLUSH"]) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=SEGMENT,
        mapped_file_size_consume_queue=CQ_FILE,
        flush_disk_type=flush,
        flush_interval_commit_log_ms=20,
        flush_interval_consume_queue_ms=20,
    )


def _single(seq: int) -> MessageInner:
    props = {"TAGS": f"Tag{seq % 5}", "KEYS": f"K{seq}", "UNIQ_KEY": f"{seq:032X}"}
    if seq % 23 == 0:
        props["DELAY"] = str(1 + seq % 18)
    return MessageInner(topic=f"T{seq % 3}", queue_id=seq % 4, flag=0, body=body_for(seq), properties=props,
                        born_timestamp=1_700_000_000_000 + seq, born_host=("127.0.0.1", 40000))


async def run(root: Path, flush: Literal["ASYNC_FLUSH", "SYNC_FLUSH"]) -> None:
    store = MessageStore(config(root, flush))
    await store.start()
    print("READY", flush=True)
    seq = 0
    rounds = 0
    while True:
        rounds += 1
        if rounds % 3 == 0:  # every third put is a batch
            count = 3
            entries = [BatchEntry(0, body_for(seq + k), f"TAGS\x01Tag{(seq + k) % 5}") for k in range(count)]
            r = await store.put_messages(MessageBatchInner(topic="TB", queue_id=seq % 2,
                                                           body=encode_batch_body(entries)))
            assert r.ok, r
            for k in range(count):
                print(seq + k, r.topic, r.queue_id, r.queue_offset + k, flush=True)
            seq += count
            continue
        # several puts in flight at once, so SYNC_FLUSH group commits are exercised too
        msgs = [_single(seq + k) for k in range(4)]
        results = await asyncio.gather(*(store.put_message(m) for m in msgs))
        for k, r in enumerate(results):
            assert r.ok, r
            print(seq + k, r.topic, r.queue_id, r.queue_offset, flush=True)
        seq += len(msgs)


if __name__ == "__main__":
    mode: Literal["ASYNC_FLUSH", "SYNC_FLUSH"] = "SYNC_FLUSH" if sys.argv[2] == "SYNC_FLUSH" else "ASYNC_FLUSH"
    asyncio.run(run(Path(sys.argv[1]), mode))
