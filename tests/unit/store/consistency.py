"""Shared check: consume queues agree with the commitlog (used by unit and integration tests)."""

from __future__ import annotations

from collections import defaultdict

from rmqbroker.store.consume_queue import BLANK_SIZE
from rmqbroker.store.message_store import SCHEDULE_TOPIC, MessageStore
from rmqbroker.store.record import (
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    check_record,
    decode_record,
    tags_code,
)


def expected_tags_code(store: MessageStore, topic: str, store_ts: int, props: dict[str, str]) -> int:
    if topic == SCHEDULE_TOPIC and int(props.get("DELAY", "0")) > 0:
        return store_ts + store.delay_level_ms(int(props["DELAY"]))
    return tags_code(props.get("TAGS"))


def assert_store_consistent(store: MessageStore) -> int:
    """Walk the whole commitlog: every record verifies (CRC included) and has exactly its unit;
    every unit of every queue points at a record of that topic/queue.  Returns the record count."""
    cl = store.commitlog
    seen: dict[tuple[str, int], set[int]] = defaultdict(set)
    count = 0
    end = cl.min_offset()
    for mf, rel, size in cl.iter_records(cl.min_offset()):
        if size == 0:
            end = mf.file_end_offset
            continue
        assert check_record(mf.mm, rel, check_crc=True) == size
        rec = decode_record(mf.mm, rel)
        phy = mf.file_from_offset + rel
        end = phy + size
        assert rec.physical_offset == phy
        count += 1
        if rec.sys_flag & TRANSACTION_TYPE_MASK in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
            continue
        units = store.get_consume_queue_units(rec.topic, rec.queue_id, rec.queue_offset, 1)
        expected = (phy, size, expected_tags_code(store, rec.topic, rec.store_timestamp, rec.properties))
        assert units == [expected], (rec.topic, rec.queue_id, rec.queue_offset, units, expected)
        seen[(rec.topic, rec.queue_id)].add(rec.queue_offset)
    assert end == cl.max_offset(), f"records end at {end}, commitlog max is {cl.max_offset()}"
    table = store.topic_queue_table()
    for topic, qid in store.list_queues():
        lo = store.get_min_offset_in_queue(topic, qid)
        hi = store.get_max_offset_in_queue(topic, qid)
        units = store.get_consume_queue_units(topic, qid, lo, hi - lo)
        real = {lo + i for i, u in enumerate(units) if u[1] != BLANK_SIZE}
        assert real == seen.get((topic, qid), set()), (topic, qid)
        if hi > 0:
            assert table[f"{topic}-{qid}"] == hi
    assert set(seen) <= set(store.list_queues())
    return count
