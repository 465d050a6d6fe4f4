"""File retention and disk-full protection (RocketMQ's CleanCommitLogService/CleanConsumeQueueService).

Every ``cleanResourceInterval`` the service measures the disk that holds the commitlog and decides:

* **whether to delete** this round: at an hour listed in ``deleteWhen``, when the disk is fuller
  than ``diskMaxUsedSpaceRatio`` or ``diskSpaceCleanForciblyRatio``, or for the next 20 rounds after
  a DELETE_EXPIRED_COMMITLOG (329) request;
* **what to delete**: commitlog segments not modified for ``fileReservedTime`` hours, oldest first,
  at most 10 a round, never the segment being written. Above ``diskSpaceCleanForciblyRatio`` (with
  ``cleanFileForciblyEnable``) the oldest segments go whatever their age.

The store then deletes consume-queue and index files that point only below the commitlog's new
start and moves every queue's min offset up: a pull below it gets OFFSET_TOO_SMALL and the client
moves on.
Above ``diskSpaceWarningLevelRatio`` the store refuses puts (SERVICE_NOT_AVAILABLE) until the disk
is back under ``diskSpaceCleanForciblyRatio``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rmqbroker.store.errors import StoreConfigError, StoreError
from rmqbroker.store.message_store import MessageStore

log = logging.getLogger(__name__)

# RocketMQ's DELETE_FILES_BATCH_MAX: segments deleted per round at most.
DELETE_FILES_BATCH_MAX = 10
# Rounds a DELETE_EXPIRED_COMMITLOG request keeps deletion on outside deleteWhen (Java: 20).
MANUAL_DELETE_ROUNDS = 20

# How the service measures a disk: the used fraction (0..1) of the file system holding a path.
DiskUsage = Callable[[Path], float]


def disk_capacity(path: Path) -> tuple[int, int] | None:
    """(total, free) bytes of the file system holding ``path``, as Java's ``File.getTotalSpace`` and
    ``getFreeSpace`` give them (free including root's reserve); None when the path does not exist."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize, st.f_bfree * st.f_frsize


def disk_used_ratio(path: Path) -> float:
    """Used fraction of the file system holding ``path``, as Java's getDiskPartitionSpaceUsedPercent
    computes it ((total - free) / total); -1 when unknown."""
    capacity = disk_capacity(path)
    if capacity is None or capacity[0] <= 0:
        return -1.0
    total, free = capacity
    return (total - free) / total


def parse_delete_when(text: str) -> frozenset[int]:
    """``deleteWhen`` (``"04"`` or ``"03;04;05"``) -> the hours of the day it names."""
    hours: set[int] = set()
    for raw in text.split(";"):
        part = raw.strip()
        if not part:
            continue
        if not part.isdigit() or not 0 <= int(part) <= 23:
            raise StoreConfigError(f"deleteWhen: {part!r} is not an hour 00-23 (use e.g. 04 or 03;04)")
        hours.add(int(part))
    if not hours:
        raise StoreConfigError(f"deleteWhen: {text!r} names no hour")
    return frozenset(hours)


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """Retention settings (RocketMQ 4.9.x defaults; the two ratios are 5.x's percent keys)."""

    file_reserved_time_hours: float = 72
    delete_when: frozenset[int] = frozenset({4})
    disk_max_used_space_ratio: int = 75
    disk_space_warning_level_ratio: int = 90
    disk_space_clean_forcibly_ratio: int = 85
    clean_file_forcibly_enable: bool = True
    clean_resource_interval_ms: int = 10000
    delete_commit_log_files_interval_ms: int = 100


@dataclass(slots=True)
class RoundReport:
    """What one clean round saw and did."""

    disk_used_ratio: float
    deleting: bool
    forced: bool
    commitlog_files_deleted: int
    consume_queue_files_deleted: int


class CleanService:
    """Deletes expired files of one store and marks its disk full; runs from the broker's supervisor."""

    def __init__(self, store: MessageStore, config: RetentionConfig,
                 disk_usage: DiskUsage = disk_used_ratio, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config
        self._disk_usage = disk_usage
        self._clock = clock
        self._manual_rounds = 0
        self._lock = asyncio.Lock()
        self.last_ratio = -1.0
        self.last_run_ms = 0
        self.commitlog_files_deleted = 0
        self.consume_queue_files_deleted = 0
        self._space_full = False  # last round saw the disk over diskMaxUsedSpaceRatio (logged once)

    def request_manual_delete(self) -> None:
        """DELETE_EXPIRED_COMMITLOG: delete expired segments in the coming rounds whatever the hour."""
        self._manual_rounds = MANUAL_DELETE_ROUNDS

    @property
    def manual_rounds_left(self) -> int:
        return self._manual_rounds

    def status(self) -> dict[str, object]:
        cfg = self.config
        return {
            "diskUsedRatio": round(self.last_ratio, 4),
            "diskFull": self.store.disk_full,
            "fileReservedTimeHours": cfg.file_reserved_time_hours,
            "deleteWhen": ";".join(f"{h:02d}" for h in sorted(cfg.delete_when)),
            "lastRunMillis": self.last_run_ms,
            "commitLogFilesDeleted": self.commitlog_files_deleted,
            "consumeQueueFilesDeleted": self.consume_queue_files_deleted,
            "manualRoundsLeft": self._manual_rounds,
        }

    async def run_once(self) -> RoundReport:
        """One round: measure the disk, maybe delete commitlog segments, then consume-queue files."""
        async with self._lock:
            return await self._round()

    async def _round(self) -> RoundReport:
        cfg = self.config
        store = self.store
        ratio = await asyncio.to_thread(self._disk_usage, store.config.commit_log_dir)
        self.last_ratio = ratio
        percent = ratio * 100
        forced = False
        if percent > cfg.disk_space_warning_level_ratio:
            if not store.disk_full:
                log.error("disk of %s is %.1f%% used (over diskSpaceWarningLevelRatio %d%%): refusing new "
                          "messages until it is under %d%%", store.config.commit_log_dir, percent,
                          cfg.disk_space_warning_level_ratio, cfg.disk_space_clean_forcibly_ratio)
                store.set_disk_full(True)
            forced = True
        elif percent > cfg.disk_space_clean_forcibly_ratio:
            forced = True
        elif store.disk_full and ratio >= 0:
            log.warning("disk of %s is %.1f%% used again: accepting messages", store.config.commit_log_dir, percent)
            store.set_disk_full(False)
        # Over the forced-clean ratio counts as full whatever diskMaxUsedSpaceRatio says (as in Java).
        space_full = ratio < 0 or percent > cfg.disk_max_used_space_ratio or forced
        if space_full != self._space_full:
            if ratio < 0:
                log.warning("cannot measure the disk of %s: deleting expired segments at any hour",
                            store.config.commit_log_dir)
            elif space_full:
                log.warning("disk of %s is %.1f%% used (over diskMaxUsedSpaceRatio %d%%): deleting expired "
                            "segments at any hour", store.config.commit_log_dir, percent, cfg.disk_max_used_space_ratio)
            self._space_full = space_full
        hour = time.localtime(self._clock()).tm_hour
        time_up = hour in cfg.delete_when
        manual = self._manual_rounds > 0
        deleting = time_up or space_full or manual
        if manual:
            self._manual_rounds -= 1
        forced = forced and cfg.clean_file_forcibly_enable
        deleted = await self._delete_commitlog_files(forced) if deleting else 0
        # Cheap when the commitlog's start has not moved (RocketMQ's CleanConsumeQueueService too).
        cq_deleted = await store.clean_consume_queues()
        self.commitlog_files_deleted += deleted
        self.consume_queue_files_deleted += cq_deleted
        self.last_run_ms = int(self._clock() * 1000)
        return RoundReport(ratio, deleting, forced, deleted, cq_deleted)

    async def _delete_commitlog_files(self, forced: bool) -> int:
        """Oldest first, stopping at the first segment still within its reserved time (unless forced)."""
        store = self.store
        keep_s = self.config.file_reserved_time_hours * 3600
        deleted = 0
        while deleted < DELETE_FILES_BATCH_MAX:
            candidates = store.deletable_commitlog_files()
            if not candidates:
                break
            first = candidates[0]
            if not forced:
                try:
                    mtime = (await asyncio.to_thread(os.stat, first)).st_mtime
                except OSError:
                    mtime = 0.0
                if self._clock() < mtime + keep_s:
                    break
            try:
                if not await store.delete_first_commitlog_file(first):
                    break
            except StoreError:
                log.exception("deleting commitlog segment %s failed", first)
                break
            deleted += 1
            log.info("retention deleted commitlog segment %s (%s); the commitlog now starts at %d", first.name,
                     "disk over the forced-clean ratio" if forced else "expired", store.min_phy_offset())
            if self.config.delete_commit_log_files_interval_ms > 0:
                await asyncio.sleep(self.config.delete_commit_log_files_interval_ms / 1000)
        return deleted
