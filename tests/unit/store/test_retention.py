"""File retention and disk-full protection on a real store: which segments go and when, what
consume queues and pulls see afterwards, and that a restart keeps it all consistent."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rmqbroker.store.config import StoreConfig
from rmqbroker.store.errors import StoreConfigError
from rmqbroker.store.message_store import GetMessageStatus, MessageStore, PutMessageStatus
from rmqbroker.store.retention import CleanService, RetentionConfig, parse_delete_when
from tests.unit.store.consistency import assert_store_consistent
from tests.unit.store.test_message_store import SEG, make_config, msg

HOUR = 3600.0
BODY = b"r" * 1000
TOPIC = "RetainedTopic"


class Disk:
    """A disk whose used fraction the test sets."""

    def __init__(self, ratio: float = 0.10) -> None:
        self.ratio = ratio

    def __call__(self, path: Path) -> float:
        return self.ratio


def off_hours() -> frozenset[int]:
    """A deleteWhen that is not the current hour."""
    return frozenset({(time.localtime().tm_hour + 12) % 24})


def retention(**overrides: object) -> RetentionConfig:
    base: dict[str, object] = {"delete_when": off_hours(), "delete_commit_log_files_interval_ms": 0}
    base.update(overrides)
    return RetentionConfig(**base)  # type: ignore[arg-type]


@pytest.fixture
def cfg(tmp_path: Path) -> StoreConfig:
    # Consume-queue files of 20 units, so that retention has whole ones to delete.
    return make_config(tmp_path / "store", mapped_file_size_consume_queue=20 * 20)


@pytest.fixture
async def store(cfg: StoreConfig) -> AsyncIterator[MessageStore]:
    s = MessageStore(cfg)
    await s.start()
    yield s
    await s.shutdown()


async def fill(store: MessageStore, segments: int) -> int:
    """Messages over two queues until the commitlog has ``segments`` full segments; all flushed."""
    n = 0
    while store.max_phy_offset() < segments * SEG + 1:
        assert store.append_message(msg(TOPIC, n % 2, BODY)).status is PutMessageStatus.PUT_OK
        n += 1
    await _flushed(store)
    return n


async def _flushed(store: MessageStore) -> None:
    for _ in range(200):
        if store.flushed_phy_offset() == store.max_phy_offset():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the commitlog was not flushed")


def segments(store: MessageStore) -> list[Path]:
    return [mf.path for mf in store.commitlog.mfq.files]


def age(paths: list[Path], hours: float) -> None:
    when = time.time() - hours * HOUR
    for p in paths:
        os.utime(p, (when, when))


async def test_expired_segments_go_oldest_first_and_queues_follow(store: MessageStore, cfg: StoreConfig) -> None:
    await fill(store, 6)
    files = segments(store)
    assert len(files) == 7
    # 0-2 and 4 are older than the 72 h default; 3 is recent, so deletion stops there (oldest first).
    age([*files[:3], files[4]], 100)
    cq_files_before = sum(len(q.mfq.files) for q in store._cqs[TOPIC].values())
    cleaner = CleanService(store, retention(), disk_usage=Disk())
    cleaner.request_manual_delete()
    report = await cleaner.run_once()
    assert report.deleting and not report.forced
    assert report.commitlog_files_deleted == 3
    assert segments(store) == files[3:]
    assert [p.exists() for p in files] == [False] * 3 + [True] * 4
    assert store.min_phy_offset() == 3 * SEG
    # Consume-queue files holding only units below the new start are gone; min offsets moved past them.
    assert report.consume_queue_files_deleted > 0
    assert sum(len(q.mfq.files) for q in store._cqs[TOPIC].values()) == cq_files_before - \
        report.consume_queue_files_deleted
    for qid in (0, 1):
        low = store.get_min_offset_in_queue(TOPIC, qid)
        assert low > 0
        first = store.get_consume_queue_units(TOPIC, qid, low, 1)[0]
        assert first[0] >= 3 * SEG
        # A pull below the min offset is told where the queue starts now (OFFSET_TOO_SMALL).
        res = store.get_message("CG", TOPIC, qid, 0, 32)
        assert res.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert res.next_begin_offset == low
        res = store.get_message("CG", TOPIC, qid, low, 1)
        assert res.status is GetMessageStatus.FOUND
    assert_store_consistent(store)
    assert cleaner.status()["commitLogFilesDeleted"] == 3

    # The same after a restart: recovery starts from the first remaining segment.
    mins = {qid: store.get_min_offset_in_queue(TOPIC, qid) for qid in (0, 1)}
    await store.shutdown()
    again = MessageStore(cfg)
    await again.start()
    try:
        assert again.min_phy_offset() == 3 * SEG
        assert {qid: again.get_min_offset_in_queue(TOPIC, qid) for qid in (0, 1)} == mins
        assert_store_consistent(again)
        assert again.append_message(msg(TOPIC, 0, BODY)).status is PutMessageStatus.PUT_OK
    finally:
        await again.shutdown()
        await store.start()  # the fixture shuts it down


async def test_nothing_goes_outside_delete_when_with_room_on_disk(store: MessageStore) -> None:
    await fill(store, 3)
    age(segments(store), 1000)
    cleaner = CleanService(store, retention(), disk_usage=Disk(0.10))
    report = await cleaner.run_once()
    assert not report.deleting
    assert report.commitlog_files_deleted == 0 and store.min_phy_offset() == 0


async def test_at_a_delete_when_hour_only_expired_segments_go(store: MessageStore) -> None:
    await fill(store, 4)
    files = segments(store)
    age(files[:2], 73)  # just past 72 h
    age(files[2:], 71)
    cleaner = CleanService(store, retention(delete_when=parse_delete_when(f"{time.localtime().tm_hour:02d}")),
                           disk_usage=Disk())
    report = await cleaner.run_once()
    assert report.deleting and report.commitlog_files_deleted == 2
    assert store.min_phy_offset() == 2 * SEG
    # A shorter fileReservedTime makes the 71 h old ones expired too; the segment being written stays.
    cleaner = CleanService(store, retention(delete_when=frozenset(range(24)), file_reserved_time_hours=48),
                           disk_usage=Disk())
    assert (await cleaner.run_once()).commitlog_files_deleted == 2
    assert segments(store) == [files[-1]]
    assert_store_consistent(store)


async def test_a_disk_over_max_used_deletes_expired_segments_whatever_the_hour(store: MessageStore) -> None:
    await fill(store, 3)
    files = segments(store)
    age(files[:1], 100)
    cleaner = CleanService(store, retention(), disk_usage=Disk(0.80))  # over 75 %, under 85 %
    report = await cleaner.run_once()
    assert report.deleting and not report.forced
    assert report.commitlog_files_deleted == 1
    assert not store.disk_full


async def test_a_disk_over_the_forced_ratio_loses_the_oldest_segments_whatever_their_age(
        store: MessageStore) -> None:
    await fill(store, 12)
    files = segments(store)
    cleaner = CleanService(store, retention(), disk_usage=Disk(0.86))
    report = await cleaner.run_once()
    assert report.forced
    # At most 10 a round, oldest first, none of them expired.
    assert report.commitlog_files_deleted == 10
    assert segments(store) == files[10:]
    assert not store.disk_full  # 86 % is under the warning ratio: still writable
    assert store.append_message(msg(TOPIC, 0, BODY)).status is PutMessageStatus.PUT_OK
    # Over the forced-clean ratio deletion runs even when diskMaxUsedSpaceRatio is set higher.
    await fill(store, 24)  # the first 10 segments are gone already
    cleaner = CleanService(store, retention(disk_max_used_space_ratio=95, disk_space_clean_forcibly_ratio=50,
                                            disk_space_warning_level_ratio=96), disk_usage=Disk(0.60))
    assert (await cleaner.run_once()).commitlog_files_deleted == 10
    # Forcing can be switched off: then only expired segments go.
    cleaner = CleanService(store, retention(clean_file_forcibly_enable=False), disk_usage=Disk(0.86))
    assert (await cleaner.run_once()).commitlog_files_deleted == 0
    assert_store_consistent(store)


async def test_a_full_disk_refuses_puts_until_it_is_under_the_forced_ratio(store: MessageStore) -> None:
    await fill(store, 1)
    disk = Disk(0.95)
    cleaner = CleanService(store, retention(), disk_usage=disk)
    await cleaner.run_once()
    assert store.disk_full and cleaner.status()["diskFull"] is True
    max_before = store.max_phy_offset()
    assert store.append_message(msg(TOPIC, 0, BODY)).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert store.max_phy_offset() == max_before  # nothing was written
    disk.ratio = 0.87  # under the warning ratio but over the forced-clean ratio: still full
    await cleaner.run_once()
    assert store.disk_full
    disk.ratio = 0.50
    await cleaner.run_once()
    assert not store.disk_full
    assert store.append_message(msg(TOPIC, 0, BODY)).status is PutMessageStatus.PUT_OK
    # A role change keeps the verdict: a full disk stays unwritable after a promotion.
    disk.ratio = 0.95
    await cleaner.run_once()
    store.set_role("SLAVE")
    store.set_role("ASYNC_MASTER")
    assert store.append_message(msg(TOPIC, 0, BODY)).status is PutMessageStatus.SERVICE_NOT_AVAILABLE


async def test_the_segment_being_written_and_undispatched_bytes_stay(store: MessageStore) -> None:
    # One segment only: never deleted, however full the disk.
    await fill(store, 0)
    cleaner = CleanService(store, retention(), disk_usage=Disk(0.99))
    assert (await cleaner.run_once()).commitlog_files_deleted == 0
    assert len(segments(store)) == 1
    # A segment whose records are not dispatched yet (a slave's trailing reput) stays too.
    store.set_disk_full(False)
    await fill(store, 3)
    store._reput_offset = SEG + 10  # as if dispatch trailed inside the second segment
    try:
        assert store.deletable_commitlog_files() == segments(store)[:1]
    finally:
        store.dispatch_some()


async def test_a_reader_holding_a_deleted_segment_keeps_its_bytes(store: MessageStore) -> None:
    await fill(store, 3)
    res = store.get_message("CG", TOPIC, 0, 0, 4)
    assert res.status is GetMessageStatus.FOUND
    held = res.body()
    cleaner = CleanService(store, retention(), disk_usage=Disk(0.90))
    assert (await cleaner.run_once()).commitlog_files_deleted == 3
    # The pull's views still read the old bytes (the mapping outlives the file's deletion).
    assert res.body() == held
    del res


async def test_deleted_topics_are_forgotten_once_their_records_are_gone(store: MessageStore,
                                                                        cfg: StoreConfig) -> None:
    store.append_message(msg("Gone", 0, BODY))
    await store.delete_topic_queues("Gone")
    assert "Gone" in store._deleted
    await fill(store, 3)
    age(segments(store)[:1], 100)
    cleaner = CleanService(store, retention(), disk_usage=Disk())
    cleaner.request_manual_delete()
    assert (await cleaner.run_once()).commitlog_files_deleted == 1
    assert "Gone" not in store._deleted
    assert "Gone" not in cfg.deleted_topics_path.read_text()


async def test_manual_rounds_run_out(store: MessageStore) -> None:
    await fill(store, 1)
    cleaner = CleanService(store, retention(), disk_usage=Disk())
    cleaner.request_manual_delete()
    for _ in range(20):
        assert (await cleaner.run_once()).deleting
    assert not (await cleaner.run_once()).deleting
    assert cleaner.manual_rounds_left == 0


def test_delete_when_parsing() -> None:
    assert parse_delete_when("04") == {4}
    assert parse_delete_when("03;04; 23") == {3, 4, 23}
    for bad in ("", "24", "4am", "03;;x", ";"):
        with pytest.raises(StoreConfigError):
            parse_delete_when(bad)
