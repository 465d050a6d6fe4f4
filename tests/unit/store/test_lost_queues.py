"""Consume queues and index files lost while the commitlog still holds their records are rebuilt
from it at start, with the queue offsets the records carry; the other queues are left as they are."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import pytest

from rmqbroker.store.config import StoreConfig
from rmqbroker.store.message_store import SCHEDULE_TOPIC, MessageBatchInner, MessageStore
from rmqbroker.store.record import TRANSACTION_PREPARED_TYPE, BatchEntry, decode_record, encode_batch_body
from tests.unit.store.consistency import assert_store_consistent
from tests.unit.store.test_message_store import SEG, bodies, make_config, msg

CQ_UNITS = 100  # units per consume-queue file in make_config
HALF = "RMQ_SYS_TRANS_HALF_TOPIC"


@pytest.fixture
def cfg(tmp_path: Path) -> StoreConfig:
    return make_config(tmp_path / "store")


def queue_files(cfg: StoreConfig) -> dict[str, bytes]:
    """Every consume-queue file's bytes, by path relative to consumequeue/."""
    root = cfg.consume_queue_dir
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


async def fill(cfg: StoreConfig, count: int = 1800, body: bytes = b"m" * 40) -> dict[str, int]:
    """``count`` messages over T0/T1 x queues 0-2 (T1-1 fills 3 CQ files), plus delay, batch,
    half-topic and prepared transactional records; a clean shutdown. The queue table."""
    store = MessageStore(cfg)
    await store.start()
    for i in range(count):
        await store.put_message(msg(f"T{i % 2}", i % 3, body + b"%d" % i, f"Tag{i % 4}", KEYS=f"k{i}",
                                    UNIQ_KEY=f"U{i:08d}"))
        if i % 50 == 0:
            await store.put_message(msg("Late", 1, b"delayed %d" % i, DELAY=str(1 + i % 3)))
            await store.put_message(msg(HALF, 0, b"half %d" % i, TRAN_MSG="true"))
            prepared = msg("Tx", 0, b"prepared %d" % i)
            prepared.sys_flag = TRANSACTION_PREPARED_TYPE
            await store.put_message(prepared)
            entries = [BatchEntry(0, b"b%d-%d" % (i, k), f"TAGS\x01B{k}") for k in range(3)]
            assert (await store.put_messages(MessageBatchInner("TB", 0, encode_batch_body(entries)))).ok
    table = dict(store.topic_queue_table())
    await store.shutdown()
    return table


def read_all(store: MessageStore, topic: str, qid: int) -> list[bytes]:
    out: list[bytes] = []
    offset = store.get_min_offset_in_queue(topic, qid)
    while offset < store.get_max_offset_in_queue(topic, qid):
        res = store.get_message("g", topic, qid, offset, 32)
        out += bodies(res.body())
        offset = res.next_begin_offset
    return out


def lose(cfg: StoreConfig, damage: str) -> list[str]:
    """Apply ``damage``; the queue keys ("topic-qid") it hits."""
    cq = cfg.consume_queue_dir
    files = sorted((cq / "T1" / "1").iterdir())
    assert len(files) == 3 and (cq / "T1" / "1" / f"{2 * CQ_UNITS * 20:020d}").exists()
    if damage == "queue directory":
        shutil.rmtree(cq / "T1" / "1")
    elif damage == "topic directory":
        shutil.rmtree(cq / "T1")
        return ["T1-0", "T1-1", "T1-2"]
    elif damage == "every file of the queue":
        for f in files:
            f.unlink()
    elif damage == "first file":
        files[0].unlink()
    elif damage == "last file":
        files[-1].unlink()
    elif damage == "the files of schedule, batch and half queues":
        for topic, qid in [(SCHEDULE_TOPIC, 0), (SCHEDULE_TOPIC, 1), ("TB", 0), (HALF, 0)]:
            for f in (cq / topic / str(qid)).iterdir():
                f.unlink()
        return [f"{SCHEDULE_TOPIC}-0", f"{SCHEDULE_TOPIC}-1", "TB-0", f"{HALF}-0"]
    elif damage == "whole consumequeue directory but one queue":
        for d in sorted(cq.iterdir()):
            if d.name != "T0":
                shutil.rmtree(d)
        for q in (cq / "T0").iterdir():
            if q.name != "2":
                shutil.rmtree(q)
        return ["*"]
    return ["T1-1"]


DAMAGES = ["queue directory", "topic directory", "every file of the queue", "first file", "last file",
           "the files of schedule, batch and half queues", "whole consumequeue directory but one queue"]


@pytest.mark.parametrize("damage", DAMAGES)
async def test_a_lost_consume_queue_is_rebuilt_and_no_other_queue_changes(cfg: StoreConfig, damage: str) -> None:
    table = await fill(cfg)
    before = queue_files(cfg)
    store = MessageStore(cfg)
    await store.start()
    expected = {(t, q): read_all(store, t, q) for t, q in store.list_queues()}
    mins = {(t, q): store.get_min_offset_in_queue(t, q) for t, q in store.list_queues()}
    await store.shutdown()
    hit = lose(cfg, damage)
    stamps = {k: (cfg.consume_queue_dir / k).stat().st_mtime_ns for k in queue_files(cfg)}

    again = MessageStore(cfg)
    await again.start()
    try:
        assert dict(again.topic_queue_table()) == table
        assert assert_store_consistent(again) == 1800 + 36 * (1 + 1 + 1 + 3)
        for (t, q), got in expected.items():
            assert again.get_min_offset_in_queue(t, q) == mins[(t, q)], (t, q)
            assert read_all(again, t, q) == got, (t, q)
    finally:
        await again.shutdown()
    assert queue_files(cfg) == before  # the lost files are back, byte for byte
    # and the queues that lost nothing were not written at all
    untouched = [k for k in stamps if "*" not in hit and "-".join(k.split("/")[:2]) not in hit]
    assert all((cfg.consume_queue_dir / k).stat().st_mtime_ns == stamps[k] for k in untouched)
    assert untouched or hit == ["*"]


async def test_a_healthy_restart_re_dispatches_nothing(cfg: StoreConfig, caplog: pytest.LogCaptureFixture) -> None:
    await fill(cfg, count=300)
    for _ in range(2):
        store = MessageStore(cfg)
        with caplog.at_level(logging.INFO, logger="rmqbroker.store.message_store"):
            await store.start()
            assert not cfg.queue_summary_path.exists()  # read once: a crash never leaves it stale
        await store.shutdown()
        assert "dispatching commitlog" not in caplog.text and "rebuilding" not in caplog.text
        assert cfg.queue_summary_path.exists()


async def test_retention_rebuilt_queues_keep_their_offsets(cfg: StoreConfig) -> None:
    """With the commitlog's first segments deleted, a rebuilt queue starts at the offset of its first
    record still stored, as it did before; a queue whose records are all gone keeps its offsets."""
    store = MessageStore(cfg)
    await store.start()
    for _ in range(40):
        await store.put_message(msg("Old", 0, b"o" * 1000))
    for i in range(600):
        await store.put_message(msg("T", i % 2, b"x" * 400 + b"%d" % i))
    await store.flush()
    while store.min_phy_offset() < 3 * SEG:
        assert await store.delete_first_commitlog_file(store.deletable_commitlog_files()[0])
    await store.clean_consume_queues()
    min_phy = store.min_phy_offset()
    state = {k: (store.get_min_offset_in_queue(*k), store.get_max_offset_in_queue(*k), read_all(store, *k))
             for k in [("Old", 0), ("T", 0), ("T", 1)]}
    await store.shutdown()
    assert state[("Old", 0)][:2] == (40, 40) and 0 < state[("T", 0)][0] < state[("T", 0)][1] == 300
    for q in ("Old/0", "T/0", "T/1"):
        shutil.rmtree(cfg.consume_queue_dir / q)

    again = MessageStore(cfg)
    await again.start()
    try:
        assert again.min_phy_offset() == min_phy
        for k, (lo, hi, got) in state.items():
            assert (again.get_min_offset_in_queue(*k), again.get_max_offset_in_queue(*k)) == (lo, hi), k
            assert read_all(again, *k) == got
        r = await again.put_message(msg("Old", 0, b"new"))
        assert r.queue_offset == 40
        assert again.get_message("g", "Old", 0, 40, 1).status.name == "FOUND"
        assert_store_consistent(again)
    finally:
        await again.shutdown()


async def test_a_slave_rebuilds_a_lost_queue_from_what_it_replicated(tmp_path: Path) -> None:
    master = MessageStore(make_config(tmp_path / "m"))
    await master.start()
    for i in range(400):
        await master.put_message(msg(f"T{i % 2}", i % 2, b"s" * 300, DELAY="2" if i % 41 == 0 else "0"))
    last_seg = master.max_phy_offset() - master.max_phy_offset() % SEG - SEG
    stream = master.get_commitlog_data(last_seg, 10**9)  # the slave starts mid-stream
    slave_cfg = make_config(tmp_path / "s", broker_role="SLAVE")
    slave = MessageStore(slave_cfg)
    await slave.start()
    slave.append_raw(last_seg, stream)
    table = dict(slave.topic_queue_table())
    lo = slave.get_min_offset_in_queue("T1", 1)
    units = slave.get_consume_queue_units("T1", 1, lo, 1000)
    await slave.shutdown()
    await master.shutdown()
    assert lo > 0
    shutil.rmtree(slave_cfg.consume_queue_dir / "T1")
    shutil.rmtree(slave_cfg.consume_queue_dir / SCHEDULE_TOPIC)

    again = MessageStore(slave_cfg)
    await again.start()
    try:
        assert dict(again.topic_queue_table()) == table
        assert again.get_min_offset_in_queue("T1", 1) == lo
        assert again.get_consume_queue_units("T1", 1, lo, 1000) == units
        assert_store_consistent(again)
    finally:
        await again.shutdown()


async def test_lost_newest_index_files_are_built_again(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "store", max_hash_slot_num=5, max_index_num=50)  # 49 keys a file
    store = MessageStore(cfg)
    await store.start()
    for i in range(100):
        store.append_message(msg("Orders", i % 3, b"order %d" % i, KEYS=f"order-{i}"))
    await store.shutdown()
    files = sorted(cfg.index_dir.iterdir())
    assert len(files) == 3
    files[-1].unlink()
    files[-2].unlink()

    again = MessageStore(cfg)
    await again.start()
    try:
        now = int(time.time() * 1000) + 1000
        for i in (0, 48, 49, 98, 99):
            got = again.query_message("Orders", f"order-{i}", 64, 0, now).records
            assert [decode_record(r).body for r in got] == [b"order %d" % i], i
        assert again.index is not None and sum(f.count - 1 for f in again.index.files) == 100
    finally:
        await again.shutdown()
