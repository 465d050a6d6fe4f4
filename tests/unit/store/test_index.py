"""Index files (§4.5) on real files: RocketMQ's byte layout, hash chains, time ranges, rollover,
restart, truncation, retention; and QUERY_MESSAGE lookups through the store."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from rmqbroker.store.checkpoint import boot_id
from rmqbroker.store.config import StoreConfig
from rmqbroker.store.errors import StoreError
from rmqbroker.store.index import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE, IndexService, build_key, key_hash
from rmqbroker.store.message_store import GetMessageStatus, MessageStore, PutMessageStatus
from rmqbroker.store.record import TRANSACTION_ROLLBACK_TYPE, decode_record, java_string_hash
from rmqbroker.store.retention import CleanService
from tests.unit.store.test_message_store import SEG, make_config, msg
from tests.unit.store.test_retention import Disk, retention

T0 = 1_700_000_000_000


def entries(svc: IndexService, file_no: int = -1) -> list[tuple[int, int, int, int]]:
    f = svc.files[file_no]
    base = HEADER_SIZE + f.slot_num * SLOT_SIZE
    return [struct.unpack_from(">iqii", f.mm, base + i * ENTRY_SIZE) for i in range(1, f.count)]


def test_layout_is_rocketmqs(tmp_path: Path) -> None:
    svc = IndexService(tmp_path / "index", slot_num=7, index_num=100)
    svc.load(0)
    svc.build(100, "T", T0, "UNIQ1", "k1 k2")
    svc.build(300, "T", T0 + 2500, None, "k1")
    f = svc.files[0]
    # Named yyyyMMddHHmmssSSS after its creation time (local time, as RocketMQ does).
    created = time.mktime(time.strptime(f.path.name[:14], "%Y%m%d%H%M%S"))
    assert len(f.path.name) == 17 and abs(created - time.time()) < 60
    assert f.path.stat().st_size == 40 + 7 * 4 + 100 * 20
    data = f.path.read_bytes()
    # Header: begin/end store time, begin/end commitlog offset, used slots, entry count (starts at 1).
    assert struct.unpack_from(">qqqqii", data, 0) == (T0, T0 + 2500, 100, 300, 3, 5)
    h_uniq, h_k1, h_k2 = (key_hash(build_key("T", k)) for k in ("UNIQ1", "k1", "k2"))
    assert h_k1 == abs(java_string_hash("T#k1"))
    # Entries from index 1: key hash, commitlog offset, seconds since the file's first entry, previous in slot.
    assert entries(svc) == [(h_uniq, 100, 0, 0), (h_k1, 100, 0, 0), (h_k2, 100, 0, 0), (h_k1, 300, 2, 2)]
    slot = struct.unpack_from(">i", data, 40 + (h_k1 % 7) * 4)[0]
    assert slot == 4  # the newest entry of k1's slot


def test_hash_chains_time_ranges_and_collisions(tmp_path: Path) -> None:
    svc = IndexService(tmp_path / "index", slot_num=3, index_num=1000)  # 3 slots: chains mix keys
    svc.load(0)
    for i in range(60):
        svc.build(1000 + i * 100, "T", T0 + i * 1000, f"U{i}", f"key{i % 5}")
    phys, last_ts, last_phy = svc.query("T", "key2", 64, 0, T0 + 10**9)
    assert (last_ts, last_phy) == (T0 + 59_000, 1000 + 59 * 100)
    # Hash lookups: offsets of key2 (newest first), possibly plus other keys of the same hash.
    want = [1000 + i * 100 for i in range(59, -1, -1) if i % 5 == 2]
    assert [p for p in phys if p in want] == want
    assert len(svc.query("T", "key2", 3, 0, T0 + 10**9)[0]) == 3
    ranged = svc.query("T", "U10", 64, T0 + 10_000, T0 + 10_000)[0]
    assert 2000 in ranged
    assert 2000 not in svc.query("T", "U10", 64, T0 + 20_000, T0 + 30_000)[0]
    # Keys are per topic: the same key of another topic has another hash.
    assert svc.query("Other", "key2", 64, 0, T0 + 10**9)[0] == []


def test_rollover_restart_truncate_and_expiry(tmp_path: Path) -> None:
    d = tmp_path / "index"
    svc = IndexService(d, slot_num=11, index_num=10)  # 9 entries per file
    svc.load(0)
    full = []
    for i in range(40):
        full += svc.build(i * 10, "T", T0 + i, None, f"k{i}")
    assert len(svc.files) == 5 and len(full) == 4
    names = [f.path.name for f in svc.files]
    assert names == sorted(names) and len(set(names)) == 5
    assert svc.query("T", "k3", 64, 0, T0 + 100)[0] == [30]
    assert svc.query("T", "k39", 64, 0, T0 + 100)[0] == [390]
    svc.close()

    again = IndexService(d, slot_num=11, index_num=10)
    again.load(10_000)
    assert again.end_phy == 390
    assert again.build(390, "T", T0, None, "dup") == [] and again.files[-1].count == 5  # re-dispatch: skipped
    assert again.query("T", "k21", 64, 0, T0 + 100)[0] == [210]
    # An HA truncation at 250: files beginning beyond go, records from there are indexed again.
    again.truncate(250)
    assert [f.begin_phy for f in again.files] == [0, 90, 180]
    again.build(250, "T", T0 + 50, None, "fresh")
    assert again.query("T", "fresh", 64, 0, T0 + 100)[0] == [250]
    # Retention: files wholly below the commitlog's new start go; never the last one.
    gone = again.detach_expired(200)
    assert [f.begin_phy for f in gone] == [0, 90] and [f.begin_phy for f in again.files] == [180, 250]
    for f in gone:
        f.destroy()
    assert len(list(d.iterdir())) == 2
    again.close()

    # Entries beyond the recovered commitlog end (its tail lost with the machine): what is written
    # there from now on is indexed again.
    straddling = IndexService(d, slot_num=11, index_num=10)
    straddling.load(200)
    assert [f.begin_phy for f in straddling.files] == [180] and straddling.files[0].end_phy > 200
    assert straddling.end_phy == 199
    straddling.build(200, "T", T0 + 90, None, "rewritten")
    assert 200 in straddling.query("T", "rewritten", 64, 0, T0 + 100)[0]
    straddling.close()

    # A file that begins beyond the commitlog end (lost with an OS crash) is dropped at load.
    third = IndexService(d, slot_num=11, index_num=10)
    third.load(150)
    assert third.files == [] and third.end_phy == -1
    with pytest.raises(StoreError):
        IndexService(d, slot_num=0, index_num=10)


def test_an_unusable_file_is_set_aside_and_indexing_goes_on(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "index"
    svc = IndexService(d, slot_num=11, index_num=10)
    svc.load(0)
    svc.build(1, "T", T0, None, "k")
    svc.close()
    other = IndexService(d, slot_num=12, index_num=10)  # maxHashSlotNum changed: another file size
    other.load(100)
    assert other.files == [] and "maxHashSlotNum" in caplog.text
    assert [".unusable" in p.name for p in d.iterdir()] == [True]
    other.build(5, "T", T0, None, "k2")
    assert other.query("T", "k2", 64, 0, T0 + 1)[0] == [5]
    other.close()
    # A header with an impossible entry count is set aside the same way.
    f = next(p for p in d.iterdir() if ".unusable" not in p.name)
    with open(f, "r+b") as fh:
        fh.seek(36)
        fh.write(struct.pack(">i", 10**6))
    third = IndexService(d, slot_num=12, index_num=10)
    third.load(100)
    assert third.files == [] and len(list(d.iterdir())) == 2


def test_after_a_machine_crash_files_not_known_durable_are_built_again(tmp_path: Path) -> None:
    d = tmp_path / "index"
    svc = IndexService(d, slot_num=11, index_num=10)  # 9 entries per file: records' keys straddle files
    svc.load(0)
    for i in range(20):
        svc.build(i * 10, "T", T0 + i, f"U{i}", f"k{i} all extra")
    assert len(svc.files) == 9
    durable = svc.files[2]
    straddles = durable.trailing_entries(durable.end_phy)
    assert 0 < straddles < 4  # the record at its end has its other keys in the next file
    durable_ts, durable_names = durable.end_ts, [f.path.name for f in svc.files[:3]]
    total = sum(f.count - 1 for f in svc.files)
    svc.close()

    again = IndexService(d, slot_num=11, index_num=10)
    start = again.load(10_000, durable_until_ts=durable_ts)
    assert start == durable.end_phy and [f.path.name for f in again.files] == durable_names
    assert len(list(d.iterdir())) == 3  # the files written after the checkpoint are gone
    for i in range(start // 10, 20):  # the store indexes the commitlog again from ``start``
        again.build(i * 10, "T", T0 + i, f"U{i}", f"k{i} all extra")
    assert sum(f.count - 1 for f in again.files) == total  # no key indexed twice
    for i in range(20):
        assert again.query("T", f"k{i}", 64, 0, T0 + 100)[0] == [i * 10]
        assert again.query("T", f"U{i}", 64, 0, T0 + 100)[0] == [i * 10]
    assert sorted(again.query("T", "all", 64, 0, T0 + 100)[0]) == [i * 10 for i in range(20)]
    second, first_end = again.files[1].path, again.files[0].end_phy
    again.close()

    # A file that is not full is never known durable; nor is anything after an unreadable file.
    with open(second, "r+b") as fh:
        fh.write(bytes(HEADER_SIZE))  # its header page never reached the disk
    third = IndexService(d, slot_num=11, index_num=10)
    assert third.load(10_000, durable_until_ts=T0 + 10**6) == first_end
    assert len(third.files) == 1
    third.close()
    # After a process crash (no durable time given) nothing is built again.
    fourth = IndexService(d, slot_num=11, index_num=10)
    assert fourth.load(10_000) is None and len(fourth.files) == 1
    fourth.close()


# ---------------------------------------------------------------- through the store
def small_index(root: Path, **kw: object) -> StoreConfig:
    return make_config(root, max_hash_slot_num=5, max_index_num=50, **kw)


async def test_store_answers_queries_by_key_and_unique_key(tmp_path: Path) -> None:
    cfg = small_index(tmp_path / "store")
    store = MessageStore(cfg)
    await store.start()
    try:
        sent = {}
        for i in range(120):  # several index files, and hash collisions in 5 slots
            r = store.append_message(msg("Orders", i % 3, f"order {i}".encode(), KEYS=f"order-{i} cust-{i % 4}",
                                         UNIQ_KEY=f"ID{i:04d}"))
            assert r.status is PutMessageStatus.PUT_OK
            sent[i] = r.wrote_offset
        store.append_message(msg("Other", 0, b"x", KEYS="order-7"))
        rolled = msg("Orders", 0, b"rolled back", KEYS="order-7")
        rolled.sys_flag = TRANSACTION_ROLLBACK_TYPE
        store.append_message(rolled)
        now = int(time.time() * 1000)
        got = store.query_message("Orders", "order-7", 64, 0, now + 1000)
        assert [decode_record(r).body for r in got.records] == [b"order 7"]
        assert got.index_last_update_phy_offset >= sent[119]
        by_cust = store.query_message("Orders", "cust-1", 64, 0, now + 1000).records
        assert [decode_record(r).body for r in by_cust] == [f"order {i}".encode() for i in range(1, 120, 4)]
        assert len(store.query_message("Orders", "cust-1", 5, 0, now + 1000).records) == 5
        assert [decode_record(r).body for r in store.query_message("Orders", "ID0042", 32, 0, now + 1000).records] \
            == [b"order 42"]
        assert store.query_message("Orders", "order-7", 64, now + 60_000, now + 120_000).records == []
        assert store.query_message("Orders", "nobody", 64, 0, now + 1000).records == []
        files = len(list(cfg.index_dir.iterdir()))
        assert files >= 5
        assert store.index is not None
        indexed = sum(f.count - 1 for f in store.index.files)
        assert indexed == 120 * 3 + 1  # UNIQ_KEY and two KEYS each; "Other"; not the rolled-back one
    finally:
        await store.shutdown()
    # After a restart (abnormal too: re-dispatch must not index records twice) queries still answer.
    cfg.abort_path.write_text(boot_id() or "")  # the process crashed, the machine did not
    store = MessageStore(cfg)
    await store.start()
    try:
        assert len(list(cfg.index_dir.iterdir())) == files
        assert store.index is not None and sum(f.count - 1 for f in store.index.files) == indexed
        assert [decode_record(r).body for r in store.query_message("Orders", "order-99", 64, 0,
                                                                   int(time.time() * 1000)).records] == [b"order 99"]
    finally:
        await store.shutdown()


async def two_runs_then_old_checkpoint(cfg: StoreConfig, first: int, total: int, keys: str = ""
                                        ) -> tuple[dict[str, bytes], int]:
    """Store messages 0..first-1, shut down, store the rest up to ``total`` in a second run, then put
    back the first run's checkpoint: the last one that reached the disk before the machine crashed.
    The index files as the first run left them, and the index entries at the end."""
    store = MessageStore(cfg)
    await store.start()
    for i in range(first):
        store.append_message(msg("Orders", i % 2, f"order {i}".encode(), KEYS=f"order-{i}{keys}", UNIQ_KEY=f"ID{i}"))
    await store.shutdown()
    checkpoint = cfg.checkpoint_path.read_bytes()
    before = {p.name: p.read_bytes() for p in cfg.index_dir.iterdir()}
    store = MessageStore(cfg)
    await store.start()
    for i in range(first, total):
        store.append_message(msg("Orders", i % 2, f"order {i}".encode(), KEYS=f"order-{i}{keys}", UNIQ_KEY=f"ID{i}"))
    assert store.index is not None
    indexed = sum(f.count - 1 for f in store.index.files)
    await store.shutdown()
    cfg.checkpoint_path.write_bytes(checkpoint)
    return before, indexed


async def test_a_machine_crash_rebuilds_the_index_pages_it_may_have_lost(tmp_path: Path) -> None:
    """The machine (not only the process) crashed: index pages written since the checkpoint may
    be lost, and a lost slot page cuts every chain through it. The store tells the two crashes
    apart by the boot id in the abort marker, and builds such files again from the commitlog."""
    cfg = small_index(tmp_path / "store")
    before, indexed = await two_runs_then_old_checkpoint(cfg, 60, 150, keys=" all")
    checkpoint = cfg.checkpoint_path.read_bytes()
    # Of the index files written since that checkpoint, the slot pages were lost (one file lost everything).
    changed = sorted(p for p in cfg.index_dir.iterdir() if before.get(p.name) != p.read_bytes())
    assert len(changed) >= 3
    for n, path in enumerate(changed):
        data = bytearray(path.read_bytes())
        lost = len(data) if n == 1 else HEADER_SIZE + 5 * SLOT_SIZE
        data[HEADER_SIZE if n != 1 else 0:lost] = bytes(lost - (HEADER_SIZE if n != 1 else 0))
        path.write_bytes(data)

    def found(st: MessageStore, key: str) -> list[bytes]:
        return [decode_record(r).body for r in st.query_message("Orders", key, 64, 0, int(time.time() * 1000)).records]

    # A process crash trusts the files (their pages were in the page cache): the damage shows.
    cfg.abort_path.write_text(boot_id() or "")
    store = MessageStore(cfg)
    await store.start()
    missing = [i for i in range(150) if found(store, f"order-{i}") != [f"order {i}".encode()]]
    assert missing
    await store.shutdown()
    for path in changed:  # the same damage again (the clean shutdown flushed the index)
        if path.exists():
            data = bytearray(path.read_bytes())
            data[HEADER_SIZE:HEADER_SIZE + 5 * SLOT_SIZE] = bytes(5 * SLOT_SIZE)
            path.write_bytes(data)
    cfg.checkpoint_path.write_bytes(checkpoint)
    cfg.abort_path.write_text("another-boot")
    store = MessageStore(cfg)
    await store.start()
    try:
        assert not store.last_exit_ok
        for i in range(150):
            assert found(store, f"order-{i}") == [f"order {i}".encode()]
            assert found(store, f"ID{i}") == [f"order {i}".encode()]
        assert len(found(store, "all")) == 64  # maxNum
        assert store.index is not None and sum(f.count - 1 for f in store.index.files) == indexed
        kept = [p for p in before if (cfg.index_dir / p).exists()]
        assert kept and all((cfg.index_dir / p).read_bytes() == before[p] for p in kept)
    finally:
        await store.shutdown()


async def test_index_off_and_slave_dispatch(tmp_path: Path) -> None:
    off = MessageStore(make_config(tmp_path / "off", message_index_enable=False))
    await off.start()
    try:
        off.append_message(msg("T", 0, b"a", KEYS="k"))
        assert off.query_message("T", "k", 64, 0, 1 << 62).records == []
        assert not (tmp_path / "off" / "index").exists()
        raw = off.get_commitlog_data(0, off.max_phy_offset())
    finally:
        await off.shutdown()
    # A slave builds the index from the replicated bytes (dispatch), like the master did at append.
    slave = MessageStore(small_index(tmp_path / "slave", broker_role="SLAVE"))
    await slave.start()
    try:
        slave.append_raw(0, raw)
        assert [decode_record(r).body for r in slave.query_message("T", "k", 64, 0, 1 << 62).records] == [b"a"]
    finally:
        await slave.shutdown()


async def test_retention_takes_index_files_with_the_commitlog(tmp_path: Path) -> None:
    cfg = small_index(tmp_path / "store")
    store = MessageStore(cfg)
    await store.start()
    try:
        i = 0
        while store.max_phy_offset() < 4 * SEG + 1:
            store.append_message(msg("T", 0, b"r" * 1000, KEYS=f"k{i}"))
            i += 1
        await store.flush()
        before = sorted(p.name for p in cfg.index_dir.iterdir())
        cleaner = CleanService(store, retention(), disk_usage=Disk(0.86))  # forced: the oldest go
        assert (await cleaner.run_once()).commitlog_files_deleted == 4
        after = sorted(p.name for p in cfg.index_dir.iterdir())
        assert len(after) < len(before) and after == before[len(before) - len(after):]
        assert store.query_message("T", "k0", 64, 0, 1 << 62).records == []
        assert len(store.query_message("T", f"k{i - 1}", 64, 0, 1 << 62).records) == 1
    finally:
        await store.shutdown()


@pytest.mark.parametrize("seed", range(4))
async def test_any_pages_lost_with_the_machine_are_built_again(tmp_path: Path, seed: int) -> None:
    """Whatever pages of the files written since the checkpoint the machine lost (random 4 KiB
    pages, the header's among them), every message is found by its keys afterwards, exactly once."""
    import random

    rng = random.Random(seed)
    # Files of ~80 KiB: the slots fill pages 0-4 (page 0 with the header), the entries the rest.
    cfg = make_config(tmp_path / "store", max_hash_slot_num=5000, max_index_num=3000)
    before, indexed = await two_runs_then_old_checkpoint(cfg, 500, 2500)
    for path in sorted(cfg.index_dir.iterdir()):
        data = bytearray(path.read_bytes())
        if before.get(path.name) == bytes(data):
            continue
        pages = list(range(0, len(data), 4096))
        # A slot page always (the worst loss: it cuts every chain through it), and others at random.
        for page in {4096, *rng.sample(pages, k=rng.randint(1, len(pages)))}:
            data[page:page + 4096] = bytes(len(data[page:page + 4096]))
        path.write_bytes(data)
    cfg.abort_path.write_text("another-boot")
    store = MessageStore(cfg)
    await store.start()
    try:
        now = int(time.time() * 1000) + 1000
        for i in range(2500):
            got = store.query_message("Orders", f"order-{i}", 64, 0, now).records
            assert [decode_record(r).body for r in got] == [f"order {i}".encode()], i
        assert store.index is not None and sum(f.count - 1 for f in store.index.files) == indexed
    finally:
        await store.shutdown()


def _break_index_dir(cfg: StoreConfig) -> Path:
    """Where the next index file must go there is now a plain file; returns where the files went."""
    saved = cfg.index_dir.with_name("index.saved")
    cfg.index_dir.rename(saved)
    cfg.index_dir.write_text("not a directory")
    return saved


def _mend_index_dir(cfg: StoreConfig, saved: Path) -> None:
    cfg.index_dir.unlink()
    saved.rename(cfg.index_dir)


def _found(store: MessageStore, key: str) -> int:
    return len(store.query_message("T", key, 64, 0, 1 << 62).records)


async def test_an_index_failure_never_costs_the_message_and_its_records_are_indexed_once_it_can(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "store", max_hash_slot_num=5, max_index_num=5)  # 4 entries a file
    store = MessageStore(cfg)
    await store.start()
    try:
        assert store.append_message(msg("T", 0, b"first", KEYS="a b c d")).status is PutMessageStatus.PUT_OK
        saved = _break_index_dir(cfg)
        second = store.append_message(msg("T", 0, b"second", KEYS="e"))
        assert store.append_message(msg("T", 0, b"third", KEYS="f")).status is PutMessageStatus.PUT_OK
        assert store.index_failures == 1 and store.index_gap == second.wrote_offset
        got = store.get_message("CG", "T", 0, 0, 32)  # never costs the message
        assert got.status is GetMessageStatus.FOUND and got.message_count == 3
        assert json.loads(cfg.index_gap_path.read_text()) == {"reindexFrom": second.wrote_offset}
        assert not await store.index_catch_up()  # still no room: the gap stays where it was
        assert store.index_gap == second.wrote_offset and store.index_failures == 2
        _mend_index_dir(cfg, saved)
        assert await store.index_catch_up()
        assert store.index_gap == -1 and not cfg.index_gap_path.exists()
        assert (_found(store, "e"), _found(store, "f")) == (1, 1)
        store.append_message(msg("T", 0, b"fourth", KEYS="g"))  # dispatch indexes as it goes again
        assert _found(store, "g") == 1 and _found(store, "a") == 1
    finally:
        await store.shutdown()


async def test_a_restart_indexes_the_records_an_index_failure_left_behind(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "store", max_hash_slot_num=5, max_index_num=5)
    store = MessageStore(cfg)
    await store.start()
    store.append_message(msg("T", 0, b"first", KEYS="a b c d"))
    saved = _break_index_dir(cfg)
    second = store.append_message(msg("T", 0, b"second", KEYS="e"))
    store.append_message(msg("T", 0, b"third", KEYS="f"))
    await store.shutdown()  # with the gap open
    assert json.loads(cfg.index_gap_path.read_text()) == {"reindexFrom": second.wrote_offset}
    _mend_index_dir(cfg, saved)
    again = MessageStore(cfg)
    await again.start()
    try:
        assert again.index_gap == -1 and not cfg.index_gap_path.exists()
        assert [_found(again, k) for k in "abcdef"] == [1] * 6  # each once: nothing indexed twice
    finally:
        await again.shutdown()
