"""MessageStore facade on real files: puts, pulls (§2.5 table), flushing, delay, batches, HA, restart."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import struct
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from rmqbroker.store.config import StoreConfig, parse_delay_levels
from rmqbroker.store.errors import StoreConfigError, StoreError, StoreLockedError
from rmqbroker.store.mapped_file import file_name
from rmqbroker.store.message_store import (
    SCHEDULE_TOPIC,
    GetMessageStatus,
    MessageBatchInner,
    MessageInner,
    MessageStore,
    PutMessageStatus,
)
from rmqbroker.store.record import (
    TRANSACTION_PREPARED_TYPE,
    BatchEntry,
    decode_record,
    encode_batch_body,
    iter_records,
    java_string_hash,
    offset_msg_id,
)
from tests.unit.store.consistency import assert_store_consistent

SEG = 64 * 1024
G = GetMessageStatus
P = PutMessageStatus


def make_config(root: Path, **overrides: object) -> StoreConfig:
    base = StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=SEG,
        mapped_file_size_consume_queue=20 * 100,
        flush_interval_commit_log_ms=50,
        flush_interval_consume_queue_ms=50,
        flush_commit_log_least_pages=0,
        flush_consume_queue_least_pages=0,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


@pytest.fixture
def cfg(tmp_path: Path) -> StoreConfig:
    return make_config(tmp_path / "store")


@pytest.fixture
async def store(cfg: StoreConfig) -> AsyncIterator[MessageStore]:
    s = MessageStore(cfg)
    await s.start()
    yield s
    await s.shutdown()


def msg(topic: str = "TopicTest", qid: int = 0, body: bytes = b"hello", tags: str | None = "TagA",
        **props: str) -> MessageInner:
    properties = dict(props)
    if tags is not None:
        properties["TAGS"] = tags
    return MessageInner(topic=topic, queue_id=qid, flag=0, body=body, properties=properties,
                        born_timestamp=1700000000000, born_host=("10.0.0.5", 50000))


def bodies(result_body: bytes) -> list[bytes]:
    return [r.body for r in iter_records(result_body)]


def segment_sizes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in directory.iterdir()}


def overwrite_newest(directory: Path, pos: int, data: bytes) -> None:
    """Write ``data`` at ``pos`` of the newest segment in ``directory`` (simulated damage)."""
    newest = max(directory.iterdir())
    with open(newest, "r+b") as f:
        f.seek(pos)
        f.write(data)


async def test_put_and_get_round_trip(store: MessageStore) -> None:
    r = await store.put_message(msg(body=b"first", KEYS="K1"))
    assert r.status is P.PUT_OK and r.ok
    assert (r.wrote_offset, r.queue_offset, r.msg_num) == (0, 0, 1)
    assert r.msg_id == offset_msg_id("127.0.0.1", 10911, 0)
    r2 = await store.put_message(msg(body=b"second"))
    assert r2.wrote_offset == r.wrote_bytes and r2.queue_offset == 1
    got = store.get_message("g", "TopicTest", 0, 0, 32)
    assert got.status is G.FOUND and got.message_count == 2 and got.next_begin_offset == 2
    assert (got.min_offset, got.max_offset) == (0, 2)
    assert got.buffer_total_size == r.wrote_bytes + r2.wrote_bytes
    recs = list(iter_records(got.body()))
    assert [x.body for x in recs] == [b"first", b"second"]
    first = recs[0]
    assert first.properties == {"KEYS": "K1", "TAGS": "TagA"}
    assert first.born_host == ("10.0.0.5", 50000) and first.store_host == ("127.0.0.1", 10911)
    assert first.store_timestamp == r.store_timestamp and first.msg_id == r.msg_id
    assert store.get_consume_queue_units("TopicTest", 0, 0, 5) == [
        (0, r.wrote_bytes, java_string_hash("TagA")), (r.wrote_bytes, r2.wrote_bytes, 2598919)]
    assert store.get_max_offset_in_queue("TopicTest", 0) == 2
    assert store.get_min_offset_in_queue("TopicTest", 0) == 0
    assert store.get_max_offset_in_queue("Nope", 0) == 0 and store.get_min_offset_in_queue("Nope", 0) == 0
    assert store.topic_queue_table() == {"TopicTest-0": 2}
    assert store.list_queues() == [("TopicTest", 0)] and store.list_queues("X") == []
    assert assert_store_consistent(store) == 2


async def test_segments_roll_and_queues_agree(store: MessageStore) -> None:
    sizes = [10, 900, 3000, 20000, 1, 45000]
    results = []
    for i in range(300):
        tags = None if i % 7 == 0 else f"Tag{i % 3}"
        r = await store.put_message(msg(f"Topic{i % 3}", i % 4, bytes([i % 256]) * sizes[i % len(sizes)], tags))
        assert r.status is P.PUT_OK
        results.append(r)
    sizes_on_disk = segment_sizes(store.config.commit_log_dir)
    assert len(sizes_on_disk) > 20 and sorted(sizes_on_disk)[1] == file_name(SEG)
    assert set(sizes_on_disk.values()) == {SEG}
    for r in results:
        assert r.wrote_offset // SEG == (r.end_offset - 1) // SEG
    assert assert_store_consistent(store) == 300
    # paging through a queue returns every message in order
    for topic in ("Topic0", "Topic1", "Topic2"):
        for qid in range(4):
            expected = [bytes([i % 256]) * sizes[i % len(sizes)] for i in range(300)
                        if i % 3 == int(topic[-1]) and i % 4 == qid]
            got: list[bytes] = []
            offset = 0
            while True:
                res = store.get_message("g", topic, qid, offset, 32)
                if res.status is not G.FOUND:
                    assert res.status is G.OFFSET_OVERFLOW_ONE
                    break
                got += bodies(res.body())
                offset = res.next_begin_offset
            assert got == expected


async def test_get_message_status_table(cfg: StoreConfig) -> None:
    store = MessageStore(cfg)
    await store.start()
    # queue unknown / empty
    res = store.get_message("g", "T", 0, 5, 32)
    assert (res.status, res.next_begin_offset, res.min_offset, res.max_offset) == (G.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
    for i in range(150):
        await store.put_message(msg("T", 0, b"x" * 1500, "TagA" if i % 2 else "TagB"))
    assert store.get_max_offset_in_queue("T", 0) == 150
    res = store.get_message("g", "T", 0, 150, 32)
    assert (res.status, res.next_begin_offset) == (G.OFFSET_OVERFLOW_ONE, 150)
    res = store.get_message("g", "T", 0, 400, 32)
    assert (res.status, res.next_begin_offset) == (G.OFFSET_OVERFLOW_BADLY, 150)
    res = store.get_message("g", "T", 0, 10, 4)
    assert (res.status, res.next_begin_offset, res.message_count) == (G.FOUND, 14, 4)
    tag_a = java_string_hash("TagA")
    res = store.get_message("g", "T", 0, 10, 4, lambda code: code == tag_a)
    assert (res.status, res.next_begin_offset, res.message_count) == (G.FOUND, 18, 4)
    assert all(r.tags == "TagA" for r in iter_records(res.body()))
    res = store.get_message("g", "T", 0, 10, 4, lambda code: False)
    # scanned to the end of the CQ file holding offset 10 (100 units per file)
    assert (res.status, res.next_begin_offset, res.message_count) == (G.NO_MATCHED_MESSAGE, 100, 0)
    await store.shutdown()

    # retention removed the first commitlog segments: CQ min is corrected -> OFFSET_TOO_SMALL
    for name in sorted(os.listdir(cfg.commit_log_dir))[:3]:
        os.unlink(cfg.commit_log_dir / name)
    store = MessageStore(cfg)
    await store.start()
    min_off = store.get_min_offset_in_queue("T", 0)
    assert min_off > 100  # beyond the first CQ file
    assert store.min_phy_offset() == 3 * SEG
    res = store.get_message("g", "T", 0, 0, 32)
    assert (res.status, res.next_begin_offset, res.min_offset) == (G.OFFSET_TOO_SMALL, min_off, min_off)
    # before the clean-up corrected the CQ min, the data was simply gone
    cq = store._find_cq("T", 0)
    assert cq is not None
    cq.min_logic_offset = 0
    res = store.get_message("g", "T", 0, 0, 32)
    assert (res.status, res.message_count, res.next_begin_offset) == (G.MESSAGE_WAS_REMOVING, 0, 100)
    res = store.get_message("g", "T", 0, min_off - 2, 32)
    assert res.status is G.FOUND and res.next_begin_offset == min(min_off + 30, 150)
    assert res.message_count == res.next_begin_offset - min_off
    # a CQ file that vanished under a stale min offset -> OFFSET_FOUND_NULL, next = next CQ file
    cq.mfq.files.pop(0).close()
    res = store.get_message("g", "T", 0, 3, 32)
    assert (res.status, res.next_begin_offset) == (G.OFFSET_FOUND_NULL, 100)
    await store.shutdown()


async def test_slave_keeps_request_offset_on_correction(tmp_path: Path) -> None:
    store = MessageStore(make_config(tmp_path / "s", broker_role="SLAVE"))
    await store.start()
    assert (await store.put_message(msg())).status is P.SERVICE_NOT_AVAILABLE
    res = store.get_message("g", "T", 0, 7, 32)
    assert (res.status, res.next_begin_offset) == (G.NO_MESSAGE_IN_QUEUE, 7)
    # promotion at runtime
    store.set_role("SYNC_MASTER")
    assert store.role == "SYNC_MASTER"
    assert (await store.put_message(msg("T"))).status is P.PUT_OK
    assert store.get_message("g", "T", 0, 7, 32).next_begin_offset == 1  # corrected like a master
    store.set_role("SLAVE")
    assert (await store.put_message(msg("T"))).status is P.SERVICE_NOT_AVAILABLE
    with pytest.raises(StoreConfigError):
        store.set_role("BOSS")
    await store.shutdown()


async def test_transfer_limits(store: MessageStore) -> None:
    for _ in range(40):
        await store.put_message(msg("Small", 0, b"s" * 100))
    res = store.get_message("g", "Small", 0, 0, 64)
    assert (res.message_count, res.next_begin_offset) == (32, 32)  # in-memory count limit
    res = store.get_message("g", "Small", 0, 0, 5)
    assert (res.message_count, res.next_begin_offset) == (5, 5)
    sizes = []
    for _ in range(40):
        r = await store.put_message(msg("Big", 1, b"b" * 10000))
        sizes.append(r.wrote_bytes)
    res = store.get_message("g", "Big", 1, 0, 64)
    fit = 0
    while sum(sizes[:fit + 1]) <= 262144:
        fit += 1
    assert res.message_count == fit and res.buffer_total_size <= 262144
    assert res.next_begin_offset == fit


async def test_scan_limit(tmp_path: Path) -> None:
    store = MessageStore(make_config(tmp_path / "st", mapped_file_size_consume_queue=20 * 2000))
    await store.start()
    for i in range(1000):
        await store.put_message(msg("T", 0, b"x", "Other" if i < 900 else "TagA"))
    tag_a = java_string_hash("TagA")
    res = store.get_message("g", "T", 0, 0, 32, lambda c: c == tag_a)
    assert (res.status, res.next_begin_offset) == (G.NO_MATCHED_MESSAGE, 800)  # max(16000, 32*20) bytes
    res = store.get_message("g", "T", 0, 0, 1000, lambda c: c == tag_a)
    assert (res.status, res.message_count, res.next_begin_offset) == (G.FOUND, 32, 932)
    await store.shutdown()


async def test_sync_flush_group_commit(tmp_path: Path) -> None:
    store = MessageStore(make_config(tmp_path / "sync", flush_disk_type="SYNC_FLUSH",
                                     flush_interval_commit_log_ms=10_000))
    await store.start()
    before = store.commitlog.flush_count
    results = await asyncio.gather(*(store.put_message(msg("T", i % 4, b"y" * 500)) for i in range(200)))
    assert all(r.status is P.PUT_OK for r in results)
    fsyncs = store.commitlog.flush_count - before
    assert 1 <= fsyncs < 200
    assert store.flushed_phy_offset() >= max(r.end_offset for r in results)
    # WAIT=false does not wait, but the flusher is woken
    r = await store.put_message(msg("T", 0, b"nowait", WAIT="false"))
    assert r.status is P.PUT_OK
    for _ in range(100):
        if store.flushed_phy_offset() >= r.end_offset:
            break
        await asyncio.sleep(0.01)
    assert store.flushed_phy_offset() >= r.end_offset
    await store.shutdown()


async def test_sync_flush_timeout_keeps_message(tmp_path: Path) -> None:
    store = MessageStore(make_config(tmp_path / "to", flush_disk_type="SYNC_FLUSH", sync_flush_timeout_ms=0))
    await store.start()
    r = await store.put_message(msg(body=b"late"))
    assert r.status is P.FLUSH_DISK_TIMEOUT and r.ok and r.queue_offset == 0
    assert bodies(store.get_message("g", "TopicTest", 0, 0, 1).body()) == [b"late"]
    await store.shutdown()


async def test_async_flush(store: MessageStore) -> None:
    r = await store.put_message(msg())
    for _ in range(200):
        if store.flushed_phy_offset() >= r.end_offset:
            break
        await asyncio.sleep(0.01)
    assert store.flushed_phy_offset() == store.max_phy_offset()
    for _ in range(200):  # the consume-queue flusher sets the values, then writes the file
        path = store.checkpoint.path
        if store.checkpoint.logics_msg_timestamp and path.exists() and path.stat().st_size:
            break
        await asyncio.sleep(0.01)
    assert store.checkpoint.physic_msg_timestamp == r.store_timestamp
    assert store.checkpoint.logics_msg_timestamp == r.store_timestamp
    assert store.checkpoint.path.stat().st_size == 4096


async def test_async_flush_waits_for_least_pages(tmp_path: Path) -> None:
    store = MessageStore(make_config(tmp_path / "lp", flush_commit_log_least_pages=4,
                                     flush_interval_commit_log_ms=10))
    await store.start()
    await asyncio.sleep(0.05)  # let the flusher settle on an empty log
    flushes = store.commitlog.flush_count
    await store.put_message(msg(body=b"tiny"))
    await asyncio.sleep(0.1)
    assert store.commitlog.flush_count == flushes and store.flushed_phy_offset() == 0
    await store.put_message(msg(body=b"x" * 20000))
    for _ in range(100):
        if store.flushed_phy_offset() == store.max_phy_offset():
            break
        await asyncio.sleep(0.01)
    assert store.flushed_phy_offset() == store.max_phy_offset()
    await store.shutdown()


async def _flushed_within(store: MessageStore, seconds: float) -> bool:
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        if store.flushed_phy_offset() == store.max_phy_offset():
            return True
        await asyncio.sleep(0.01)
    return store.flushed_phy_offset() == store.max_phy_offset()


async def test_deferred_periodic_flush(tmp_path: Path) -> None:
    """A catching-up slave defers ASYNC_FLUSH's periodic flushes; they resume when the deferral
    ends, the thorough interval still bounds it, and SYNC_FLUSH ignores it."""
    store = MessageStore(make_config(tmp_path / "d", flush_interval_commit_log_ms=10))
    await store.start()
    try:
        store.defer_periodic_flush(time.monotonic() + 1.5)
        await store.put_message(msg(body=b"x" * 20000))
        assert not await _flushed_within(store, 0.3)
        assert store.flushed_phy_offset() == 0
        assert await _flushed_within(store, 5.0)
    finally:
        await store.shutdown()

    bounded = MessageStore(make_config(tmp_path / "t", flush_interval_commit_log_ms=10,
                                       flush_commit_log_thorough_interval_ms=300))
    await bounded.start()
    try:
        await asyncio.sleep(0.05)
        bounded.defer_periodic_flush(time.monotonic() + 3600)
        await bounded.put_message(msg(body=b"y" * 20000))
        assert not await _flushed_within(bounded, 0.1)
        assert await _flushed_within(bounded, 2.0)
    finally:
        await bounded.shutdown()

    sync = MessageStore(make_config(tmp_path / "s", flush_disk_type="SYNC_FLUSH"))
    await sync.start()
    try:
        sync.defer_periodic_flush(time.monotonic() + 3600)
        r = await sync.put_message(msg(body=b"z" * 20000))
        assert r.status is P.PUT_OK
        assert sync.flushed_phy_offset() >= r.end_offset
    finally:
        await sync.shutdown()


async def test_pull_far_behind_is_suggested_to_a_slave(store: MessageStore) -> None:
    for i in range(20):
        await store.put_message(msg(body=bytes([i]) * 500))
    near = store.get_message("G", "TopicTest", 0, 0, 32)
    assert near.message_count == 20 and not near.suggest_pulling_from_slave
    store._in_memory_max = 3000  # as if memory held only ~5 of these records
    early = store.get_message("G", "TopicTest", 0, 0, 2)
    late = store.get_message("G", "TopicTest", 0, 15, 32)
    assert early.suggest_pulling_from_slave and not late.suggest_pulling_from_slave


async def test_delay_put(store: MessageStore) -> None:
    r = await store.put_message(msg("Orig", 3, b"later", DELAY="3", KEYS="k"))
    assert r.status is P.PUT_OK and (r.topic, r.queue_id) == (SCHEDULE_TOPIC, 2)
    assert store.get_max_offset_in_queue("Orig", 3) == 0
    [(phy, size, tags)] = store.get_consume_queue_units(SCHEDULE_TOPIC, 2, 0, 10)
    assert (phy, size) == (r.wrote_offset, r.wrote_bytes)
    assert tags == r.store_timestamp + 10_000
    rec = decode_record(store.look_message_by_offset(phy) or b"")
    assert rec.topic == SCHEDULE_TOPIC and rec.queue_id == 2
    assert rec.properties["REAL_TOPIC"] == "Orig" and rec.properties["REAL_QID"] == "3"
    assert rec.properties["DELAY"] == "3" and rec.properties["TAGS"] == "TagA"
    # level clamped to the max (18 -> 2h)
    r2 = await store.put_message(msg("Orig", 0, DELAY="99"))
    assert (r2.topic, r2.queue_id) == (SCHEDULE_TOPIC, 17)
    [(_p, _s, tags2)] = store.get_consume_queue_units(SCHEDULE_TOPIC, 17, 0, 1)
    assert tags2 == r2.store_timestamp + 2 * 3600 * 1000
    assert decode_record(store.look_message_by_offset(r2.wrote_offset) or b"").properties["DELAY"] == "18"
    # DELAY=0 or garbage: stored normally
    r3 = await store.put_message(msg("Orig", 1, DELAY="0"))
    r4 = await store.put_message(msg("Orig", 1, DELAY="soon"))
    assert (r3.topic, r4.topic) == ("Orig", "Orig")
    assert store.list_queues(SCHEDULE_TOPIC) == [(SCHEDULE_TOPIC, 2), (SCHEDULE_TOPIC, 17)]
    assert store.delay_level_ms(1) == 1000 and store.max_delay_level == 18
    assert assert_store_consistent(store) == 4


async def test_prepared_transaction_gets_no_unit(store: MessageStore) -> None:
    m = msg("Tx", 0, DELAY="2")
    m.sys_flag = TRANSACTION_PREPARED_TYPE
    r = await store.put_message(m)
    assert r.status is P.PUT_OK and r.queue_offset == 0 and r.topic == "Tx"
    assert store.get_max_offset_in_queue("Tx", 0) == 0 and store.list_queues() == []
    r2 = await store.put_message(msg("Tx", 0))
    assert r2.queue_offset == 0
    assert assert_store_consistent(store) == 2


async def test_bad_input_leaves_store_untouched(tmp_path: Path) -> None:
    store = MessageStore(make_config(tmp_path / "bad", max_message_size=1024))
    await store.start()
    await store.put_message(msg())
    before = (store.max_phy_offset(), dict(store.topic_queue_table()), store.list_queues())
    cases = [
        (msg(body=b"x" * 1025), P.MESSAGE_ILLEGAL),
        (msg(topic="T" * 128), P.MESSAGE_ILLEGAL),
        (msg(BIG="v" * 40000), P.PROPERTIES_SIZE_EXCEEDED),
        (msg(topic="Fresh", body=b"x" * 2000), P.MESSAGE_ILLEGAL),
    ]
    bad_host = msg(topic="Fresh")
    bad_host.born_host = ("not-an-ip", 1)
    cases.append((bad_host, P.MESSAGE_ILLEGAL))
    for m, status in cases:
        assert (await store.put_message(m)).status is status
    assert (store.max_phy_offset(), dict(store.topic_queue_table()), store.list_queues()) == before
    assert not (store.config.consume_queue_dir / "Fresh").exists()
    await store.shutdown()
    # a record that fits max_message_size but not a segment is illegal too
    store = MessageStore(make_config(tmp_path / "bad2"))
    await store.start()
    assert (await store.put_message(msg(body=b"x" * SEG))).status is P.MESSAGE_ILLEGAL
    assert store.max_phy_offset() == 0
    await store.shutdown()
    assert (await store.put_message(msg())).status is P.SERVICE_NOT_AVAILABLE  # not running


async def test_batch_put(store: MessageStore) -> None:
    await store.put_message(msg("B", 1))
    entries = [BatchEntry(i, f"body{i}".encode(), f"TAGS\x01T{i % 2}\x02UNIQ_KEY\x01U{i}\x02") for i in range(5)]
    batch = MessageBatchInner(topic="B", queue_id=1, body=encode_batch_body(entries),
                              properties={"WAIT": "true", "CLUSTER": "C"}, born_host=("10.1.1.1", 5))
    r = await store.put_messages(batch)
    assert r.status is P.PUT_OK and r.msg_num == 5 and r.queue_offset == 1
    assert r.logics_offsets == [1, 2, 3, 4, 5]
    ids = r.msg_id.split(",")
    assert len(ids) == 5 and ids[0] == offset_msg_id("127.0.0.1", 10911, r.wrote_offset)
    res = store.get_message("g", "B", 1, 1, 32)
    recs = list(iter_records(res.body()))
    assert [x.body for x in recs] == [f"body{i}".encode() for i in range(5)]
    assert [x.flag for x in recs] == list(range(5))
    assert [x.queue_offset for x in recs] == [1, 2, 3, 4, 5]
    assert recs[0].properties_str == "TAGS\x01T0\x02UNIQ_KEY\x01U0\x02WAIT\x01true\x02CLUSTER\x01C"
    assert sum(x.total_size for x in recs) == r.wrote_bytes
    assert [x.msg_id for x in recs] == ids
    units = store.get_consume_queue_units("B", 1, 1, 5)
    assert [u[2] for u in units] == [java_string_hash(f"T{i % 2}") for i in range(5)]
    assert assert_store_consistent(store) == 6


async def test_batch_never_spans_segments(store: MessageStore) -> None:
    await store.put_message(msg(body=b"x" * 40000))
    entries = [BatchEntry(0, b"y" * 5000, "") for _ in range(6)]
    r = await store.put_messages(MessageBatchInner("B", 0, encode_batch_body(entries)))
    assert r.status is P.PUT_OK and r.wrote_offset == SEG
    too_big = [BatchEntry(0, b"z" * 20000, "") for _ in range(4)]
    assert (await store.put_messages(MessageBatchInner("B", 0, encode_batch_body(too_big)))).status \
        is P.MESSAGE_ILLEGAL
    assert assert_store_consistent(store) == 7


async def test_batch_rejections(tmp_path: Path) -> None:
    store = MessageStore(make_config(tmp_path / "br", max_message_size=100))
    await store.start()
    good = encode_batch_body([BatchEntry(0, b"a", "")])
    cases = [
        (MessageBatchInner("B", 0, good, {"DELAY": "2"}), P.MESSAGE_ILLEGAL),
        (MessageBatchInner("B", 0, good, sys_flag=TRANSACTION_PREPARED_TYPE), P.MESSAGE_ILLEGAL),
        (MessageBatchInner("B", 0, good[:-1]), P.MESSAGE_ILLEGAL),
        (MessageBatchInner("B", 0, b""), P.MESSAGE_ILLEGAL),
        (MessageBatchInner("B" * 200, 0, good), P.MESSAGE_ILLEGAL),
        (MessageBatchInner("B", 0, encode_batch_body([BatchEntry(0, b"a" * 101, "")])), P.MESSAGE_ILLEGAL),
        # entry properties plus the appended batch properties no longer fit the short length
        (MessageBatchInner("B", 0, encode_batch_body([BatchEntry(0, b"a", "K\x01" + "v" * 30000)]),
                           {"X": "y" * 3000}), P.PROPERTIES_SIZE_EXCEEDED),
    ]
    for batch, status in cases:
        assert (await store.put_messages(batch)).status is status
    assert store.max_phy_offset() == 0 and store.list_queues() == []
    await store.shutdown()


async def test_restart_keeps_everything(cfg: StoreConfig) -> None:
    store = MessageStore(cfg)
    await store.start()
    assert store.last_exit_ok
    results = [await store.put_message(msg(f"T{i % 2}", i % 3, bytes([i]) * (i * 300))) for i in range(120)]
    await store.put_message(msg("Orig", 0, DELAY="1"))
    table = dict(store.topic_queue_table())
    max_phy = store.max_phy_offset()
    dump = store.get_commitlog_data(0, max_phy)
    await store.shutdown()
    assert not cfg.abort_path.exists()

    again = MessageStore(cfg)
    await again.start()
    assert again.last_exit_ok
    assert cfg.abort_path.exists()
    assert again.max_phy_offset() == max_phy and dict(again.topic_queue_table()) == table
    assert again.get_commitlog_data(0, max_phy) == dump
    assert assert_store_consistent(again) == 121
    for r in results:
        assert again.look_message_by_offset(r.wrote_offset) == dump[r.wrote_offset:r.end_offset]
    r = await again.put_message(msg("T0", 0))
    assert r.queue_offset == table["T0-0"] and r.wrote_offset >= max_phy
    await again.shutdown()
    # the same object can be started again
    await again.start()
    assert again.get_max_offset_in_queue("T0", 0) == table["T0-0"] + 1
    await again.shutdown()


async def test_torn_tail_and_corrupt_consume_queue_are_repaired(cfg: StoreConfig) -> None:
    store = MessageStore(cfg)
    await store.start()
    for i in range(200):
        await store.put_message(msg(f"T{i % 2}", i % 2, b"q" * 700, f"Tag{i % 5}"))
    end = store.max_phy_offset()
    first = store.look_message_by_offset(0)
    await store.shutdown()
    assert first is not None
    # half a record after the valid end of the last segment
    overwrite_newest(cfg.commit_log_dir, end % SEG, first[: len(first) // 2])
    # garbage in the middle of the newest CQ file of T1-1, and a zeroed CQ file of T0-0
    overwrite_newest(cfg.consume_queue_dir / "T1" / "1", 20 * 3, os.urandom(20 * 5))
    overwrite_newest(cfg.consume_queue_dir / "T0" / "0", 0, bytes(2000))

    again = MessageStore(cfg)
    await again.start()
    assert again.max_phy_offset() == end
    assert again.get_commitlog_data(end, 10**6) == b""
    assert assert_store_consistent(again) == 200
    assert again.get_max_offset_in_queue("T1", 1) == 100 and again.get_max_offset_in_queue("T0", 0) == 100
    r = await again.put_message(msg("T1", 1))
    assert r.queue_offset == 100 and r.wrote_offset == end
    await again.shutdown()


@pytest.mark.parametrize("damage", ["beyond the log", "one bit flipped"])
async def test_a_damaged_unit_mid_queue_is_rebuilt_with_every_unit_after_it(cfg: StoreConfig, damage: str) -> None:
    """A unit whose commitlog offset points past the log's end (a disk error) cuts the queue
    there; every unit from it on is rebuilt from the commitlog, none is left blank."""
    store = MessageStore(cfg)
    await store.start()
    for i in range(120):
        await store.put_message(msg("T", i % 2, b"m%d" % i))
    await store.shutdown()
    newest = max((cfg.consume_queue_dir / "T" / "0").iterdir())
    phy, size, tags = struct.unpack_from(">qiq", newest.read_bytes(), 20 * 30)
    bad = 1 << 40 if damage == "beyond the log" else phy ^ (1 << 40)
    overwrite_newest(cfg.consume_queue_dir / "T" / "0", 20 * 30, struct.pack(">qiq", bad, size, tags))
    again = MessageStore(cfg)
    await again.start()
    assert again.get_max_offset_in_queue("T", 0) == 60
    got: list[bytes] = []
    while len(got) < 60:
        res = again.get_message("g", "T", 0, len(got), 32)
        assert res.status is G.FOUND
        got += bodies(res.body())
    assert got == [b"m%d" % i for i in range(0, 120, 2)]
    assert assert_store_consistent(again) == 120
    await again.shutdown()


async def test_missing_consumequeue_dir_is_rebuilt(cfg: StoreConfig) -> None:
    store = MessageStore(cfg)
    await store.start()
    for i in range(50):
        await store.put_message(msg("T", i % 3, b"w" * 3000, DELAY="2" if i == 7 else "0"))
    table = dict(store.topic_queue_table())
    await store.shutdown()
    for path in sorted(cfg.consume_queue_dir.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    again = MessageStore(cfg)
    await again.start()
    assert dict(again.topic_queue_table()) == table
    assert assert_store_consistent(again) == 50
    await again.shutdown()


async def test_abnormal_restart_redispatches(cfg: StoreConfig) -> None:
    store = MessageStore(cfg)
    await store.start()
    for _ in range(30):
        await store.put_message(msg("T", 0, b"a" * 100))
    await store.shutdown()
    cfg.abort_path.touch()  # as if the previous run had crashed
    again = MessageStore(cfg)
    await again.start()
    assert not again.last_exit_ok
    assert assert_store_consistent(again) == 30
    await again.shutdown()


async def test_deleted_topic_stays_deleted_after_an_abnormal_restart(cfg: StoreConfig) -> None:
    """Recovery after a crash re-dispatches the commitlog from the checkpoint's segment; the
    records of a topic deleted since then must not bring its consume queues back, nor mix into
    the queues of a topic created again under the name."""
    store = MessageStore(cfg)
    await store.start()
    for _ in range(5):
        await store.put_message(msg("T", 0, b"old" * 30))
        await store.put_message(msg("U", 0))
    assert await store.delete_topic_queues("T")
    new = [await store.put_message(msg("T", 0, b"new")) for _ in range(2)]
    assert [r.queue_offset for r in new] == [0, 1]
    await store.shutdown()
    cfg.abort_path.touch()  # as if the previous run had crashed
    again = MessageStore(cfg)
    await again.start()
    assert not again.last_exit_ok
    assert again.get_max_offset_in_queue("T", 0) == 2 and again.get_max_offset_in_queue("U", 0) == 5
    res = again.get_message("g", "T", 0, 0, 32)
    assert res.status is G.FOUND and res.message_count == 2
    assert all(body == b"new" for body in bodies(res.body()))
    # Deleted again without messages since: nothing of it comes back either.
    assert await again.delete_topic_queues("T")
    await again.shutdown()
    cfg.abort_path.touch()
    third = MessageStore(cfg)
    await third.start()
    assert ("T", 0) not in third.list_queues() and third.get_max_offset_in_queue("U", 0) == 5
    await third.shutdown()


async def test_a_masters_deletion_drops_queues_of_older_records_only(cfg: StoreConfig) -> None:
    """A slave learns its master's deletion point of a topic: queues holding only records from
    before it go (the slave skips such records from then on, after a crash too); a queue with a
    record from after it (the topic written again) stays, its queue offset where its units end."""
    store = MessageStore(cfg)
    await store.start()
    for _ in range(3):
        await store.put_message(msg("T", 0))
        await store.put_message(msg("T", 1))
        await store.put_message(msg("U", 0))
    end = store.max_phy_offset()
    await store.put_message(msg("T", 0, b"after"))
    assert await store.apply_topic_deletions({"T": end}) == ["T"]
    assert ("T", 1) not in store.list_queues() and store.get_max_offset_in_queue("T", 1) == 0
    assert store.get_max_offset_in_queue("T", 0) == 4 and store.topic_queue_table()["T-0"] == 4
    assert "T-1" not in store.topic_queue_table() and store.get_max_offset_in_queue("U", 0) == 3
    assert store.deleted_topics() == {"T": end}
    path = store.config.store_path_root_dir / "deletedTopics.json"
    assert json.loads(path.read_text()) == {"T": end}
    # Known already (or an older point): nothing changes.
    assert await store.apply_topic_deletions({"T": end}) == []
    assert await store.apply_topic_deletions({"T": end - 1}) == []
    # The slave's own deletion later never moves the point back.
    assert await store.delete_topic_queues("U")
    await store.shutdown()
    cfg.abort_path.touch()  # a crash: re-dispatch from the checkpoint skips T's records before ``end``
    again = MessageStore(cfg)
    await again.start()
    assert ("T", 1) not in again.list_queues() and again.get_max_offset_in_queue("T", 0) == 4
    assert again.deleted_topics()["T"] == end
    await again.shutdown()


async def test_truncation_moves_deleted_topic_ends_back_to_the_cut(store: MessageStore) -> None:
    """After a cut (a demoted master following the new one), offsets past it hold the new
    master's records, which must be dispatched even for a topic deleted here before the cut."""
    results = [await store.put_message(msg("T", 0)) for _ in range(4)]
    assert await store.delete_topic_queues("T")
    path = store.config.store_path_root_dir / "deletedTopics.json"
    assert json.loads(path.read_text()) == {"T": results[-1].end_offset}
    store.truncate_to(results[1].end_offset)
    assert json.loads(path.read_text()) == {"T": results[1].end_offset}


async def test_wrong_segment_size_refuses_to_start(cfg: StoreConfig) -> None:
    store = MessageStore(cfg)
    await store.start()
    await store.put_message(msg())
    await store.shutdown()
    bigger = dataclasses.replace(cfg, mapped_file_size_commit_log=2 * SEG)
    with pytest.raises(StoreConfigError, match="configured size"):
        await MessageStore(bigger).start()
    # the failed start released the lock
    ok = MessageStore(cfg)
    await ok.start()
    await ok.shutdown()


async def test_store_lock(store: MessageStore, cfg: StoreConfig) -> None:
    with pytest.raises(StoreLockedError):
        await MessageStore(cfg).start()


async def test_offset_by_time_and_earliest(store: MessageStore) -> None:
    assert store.get_earliest_message_time("T", 0) == -1
    assert store.get_offset_in_queue_by_time("T", 0, 123) == 0
    results = []
    for i in range(6):
        results.append(await store.put_message(msg("T", 0, str(i).encode())))
        await asyncio.sleep(0.005)
    times = [r.store_timestamp for r in results]
    assert store.get_earliest_message_time("T", 0) == times[0]
    assert store.get_message_store_timestamp("T", 0, 3) == times[3]
    assert store.get_message_store_timestamp("T", 0, 99) == -1
    for i, ts in enumerate(times):
        assert store.get_offset_in_queue_by_time("T", 0, ts) == times.index(ts) <= i
    assert store.get_offset_in_queue_by_time("T", 0, times[0] - 10_000) == 0
    assert store.get_offset_in_queue_by_time("T", 0, times[-1] + 10_000) == 5


async def test_look_message_and_raw_reads(store: MessageStore) -> None:
    r = await store.put_message(msg(body=b"abc"))
    raw = store.look_message_by_offset(0)
    assert raw is not None and decode_record(raw).body == b"abc" and len(raw) == r.wrote_bytes
    for bad in (-1, 1, 5, r.wrote_bytes, 10**12):
        assert store.look_message_by_offset(bad) is None
    assert store.get_commitlog_data(0, 10**6) == raw
    assert store.get_commitlog_data(5, 3) == raw[5:8]
    view = store.read_commitlog(0, 10)
    assert view is not None and bytes(view) == raw[:10]
    assert store.read_commitlog(r.wrote_bytes, 10) is None


async def test_arrival_listener_and_replication_hook(store: MessageStore) -> None:
    seen: list[tuple[str, int, int]] = []
    store.add_arrival_listener(lambda t, q, m: seen.append((t, q, m)))

    def broken(topic: str, qid: int, max_offset: int) -> None:
        raise RuntimeError("listener bug")

    store.add_arrival_listener(broken)
    await store.put_message(msg("T", 2))
    await store.put_message(msg("T", 2))
    assert seen == [("T", 2, 1), ("T", 2, 2)]
    store.remove_arrival_listener(broken)

    ends: list[int] = []

    def hook(end_offset: int, on_done: Callable[[PutMessageStatus], None]) -> None:
        ends.append(end_offset)
        on_done(P.FLUSH_SLAVE_TIMEOUT)

    store.replication_callback = hook
    r = await store.put_message(msg("T", 2))
    assert r.status is P.FLUSH_SLAVE_TIMEOUT and r.ok and ends == [r.end_offset]
    r = await store.put_message(msg("T", 2, WAIT="false"))
    assert r.status is P.PUT_OK and len(ends) == 1


async def test_ha_slave_replicates_raw_stream(tmp_path: Path) -> None:
    master = MessageStore(make_config(tmp_path / "m"))
    await master.start()
    for i in range(120):
        await master.put_message(msg(f"T{i % 2}", i % 3, bytes([i]) * (200 + 37 * i), f"Tag{i % 4}",
                                     DELAY="4" if i % 17 == 0 else "0"))
    stream = master.get_commitlog_data(0, master.max_phy_offset())

    slave = MessageStore(make_config(tmp_path / "s", broker_role="SLAVE"))
    await slave.start()
    arrivals: list[tuple[str, int, int]] = []
    slave.add_arrival_listener(lambda t, q, m: arrivals.append((t, q, m)))
    pos = 0
    step = 1
    while pos < len(stream):
        chunk = stream[pos:pos + step]
        assert slave.append_raw(pos, chunk) == pos + len(chunk)
        pos += len(chunk)
        step = step * 3 + 11
    with pytest.raises(StoreError):
        slave.append_raw(pos + 5, b"x")
    assert slave.max_phy_offset() == master.max_phy_offset()
    assert dict(slave.topic_queue_table()) == dict(master.topic_queue_table())
    for topic, qid in master.list_queues():
        assert slave.get_consume_queue_units(topic, qid, 0, 1000) == master.get_consume_queue_units(
            topic, qid, 0, 1000)
    assert assert_store_consistent(slave) == 120
    assert len(arrivals) == 120
    await slave.shutdown()
    await master.shutdown()


async def test_ha_slave_starting_mid_stream(tmp_path: Path) -> None:
    master = MessageStore(make_config(tmp_path / "m"))
    await master.start()
    for _ in range(100):
        await master.put_message(msg("T", 0, b"v" * 2000))
    last_seg_start = master.max_phy_offset() - master.max_phy_offset() % SEG
    stream = master.get_commitlog_data(last_seg_start, 10**9)
    slave = MessageStore(make_config(tmp_path / "s", broker_role="SLAVE"))
    await slave.start()
    # a replicated tail that ends inside a record is not dispatched until the rest arrives
    slave.append_raw(last_seg_start, stream[:-10])
    assert slave.dispatched_phy_offset() < slave.max_phy_offset() == master.max_phy_offset() - 10
    assert slave.get_max_offset_in_queue("T", 0) == 99
    slave.append_raw(master.max_phy_offset() - 10, stream[-10:])
    assert slave.dispatched_phy_offset() == slave.max_phy_offset() == master.max_phy_offset()
    lo = slave.get_min_offset_in_queue("T", 0)
    assert lo > 0 and slave.get_max_offset_in_queue("T", 0) == 100
    res = slave.get_message("g", "T", 0, 0, 32)
    assert (res.status, res.next_begin_offset) == (G.OFFSET_TOO_SMALL, 0)  # slave leaves the offset alone
    res = slave.get_message("g", "T", 0, lo, 32)
    assert res.status is G.FOUND and bodies(res.body())[0] == b"v" * 2000
    assert assert_store_consistent(slave) == 100 - lo
    await slave.shutdown()
    again = MessageStore(make_config(tmp_path / "s", broker_role="SLAVE"))
    await again.start()
    assert again.get_min_offset_in_queue("T", 0) == lo and again.min_phy_offset() == last_seg_start
    assert assert_store_consistent(again) == 100 - lo
    await again.shutdown()
    await master.shutdown()


async def test_truncate_and_delete_consume_queue(store: MessageStore) -> None:
    results = [await store.put_message(msg("T", 0, b"t" * 100)) for _ in range(10)]
    assert store.dispatched_phy_offset() == store.max_phy_offset() == results[-1].end_offset
    store.truncate_to(results[6].wrote_offset)
    assert store.dispatched_phy_offset() == results[6].wrote_offset
    assert store.max_phy_offset() == results[6].wrote_offset
    assert store.get_max_offset_in_queue("T", 0) == 6 and store.topic_queue_table()["T-0"] == 6
    r = await store.put_message(msg("T", 0))
    assert r.queue_offset == 6 and r.wrote_offset == results[6].wrote_offset
    assert assert_store_consistent(store) == 7
    store.delete_consume_queue("T")
    assert store.list_queues() == [] and "T-0" not in store.topic_queue_table()
    assert not (store.config.consume_queue_dir / "T").exists()


async def test_delete_topic_queues_waits_for_a_consume_queue_flush(store: MessageStore) -> None:
    """A deleted topic's queue files are not closed while a flush thread may be writing them; once
    gone, the topic's queue offsets restart at 0 and other topics are untouched."""
    for topic in ("T", "U"):
        await store.put_message(msg(topic, 0))
    async with store._cq_io:  # what the consume-queue flusher holds while its thread runs
        deleting = asyncio.ensure_future(store.delete_topic_queues("T"))
        await asyncio.sleep(0.05)
        assert not deleting.done() and (store.config.consume_queue_dir / "T").exists()
    assert await deleting is True
    assert not (store.config.consume_queue_dir / "T").exists()
    assert store.list_queues() == [("U", 0)]
    assert await store.delete_topic_queues("T") is False
    again = await store.put_message(msg("T", 0))
    assert again.queue_offset == 0 and store.get_max_offset_in_queue("T", 0) == 1
    res = store.get_message("g", "T", 0, 0, 32)
    assert res.status is G.FOUND and res.message_count == 1  # the new message, not the deleted one


def test_config_helpers(tmp_path: Path) -> None:
    assert parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")[-1] == 7_200_000
    assert parse_delay_levels("1d 2h") == (86_400_000, 7_200_000)
    for bad in ("", "5x", "1.5s"):
        with pytest.raises(StoreConfigError):
            parse_delay_levels(bad)
    with pytest.raises(StoreConfigError):
        StoreConfig(store_path_root_dir=tmp_path, mapped_file_size_consume_queue=30)
    cfg = StoreConfig(store_path_root_dir=tmp_path)
    assert cfg.commit_log_dir == tmp_path / "commitlog" and len(cfg.message_delay_levels) == 18
    assert struct.calcsize(">qiq") == 20
