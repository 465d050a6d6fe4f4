"""Store configuration: the subset of broker settings the message store needs, frozen."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rmqbroker.store.errors import StoreConfigError

DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"(\d+)([smhd])")

FlushDiskType = Literal["ASYNC_FLUSH", "SYNC_FLUSH"]


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """``messageDelayLevel`` (``"1s 5s … 2h"``, units s/m/h/d) -> delay of each level in ms."""
    levels: list[int] = []
    for token in text.split():
        m = _LEVEL.fullmatch(token)
        if m is None:
            raise StoreConfigError(f"bad delay level {token!r} in {text!r} (use e.g. 5s, 2m, 1h, 1d)")
        levels.append(int(m.group(1)) * _UNIT_MS[m.group(2)])
    if not levels:
        raise StoreConfigError("messageDelayLevel has no levels")
    return tuple(levels)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Settings of :class:`~rmqbroker.store.message_store.MessageStore` (RocketMQ 4.9.x defaults)."""

    store_path_root_dir: Path
    store_path_commit_log: Path | None = None
    mapped_file_size_commit_log: int = 1073741824
    mapped_file_size_consume_queue: int = 6000000
    flush_disk_type: FlushDiskType = "ASYNC_FLUSH"
    flush_interval_commit_log_ms: int = 500
    flush_interval_consume_queue_ms: int = 1000
    # ASYNC_FLUSH flushes only once this many 4 KiB pages are dirty, except for a "thorough" flush
    # at least every thorough interval (RocketMQ's flushCommitLogLeastPages / ...ThoroughInterval).
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval_ms: int = 10000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval_ms: int = 60000
    sync_flush_timeout_ms: int = 5000
    max_message_size: int = 4194304
    message_delay_levels: tuple[int, ...] = field(
        default_factory=lambda: parse_delay_levels(DEFAULT_MESSAGE_DELAY_LEVEL))
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    check_crc_on_recover: bool = True
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_memory: int = 262144
    broker_role: str = "ASYNC_MASTER"
    # RocketMQ's offsetCheckInSlave: whether a slave corrects nextBeginOffset like a master.
    offset_check_in_slave: bool = False
    # Index files (§4.5) for QUERY_MESSAGE: messageIndexEnable, maxHashSlotNum, maxIndexNum.
    message_index_enable: bool = True
    max_hash_slot_num: int = 5000000
    max_index_num: int = 20000000

    def __post_init__(self) -> None:
        if self.mapped_file_size_consume_queue <= 0 or self.mapped_file_size_consume_queue % 20:
            raise StoreConfigError("mapped_file_size_consume_queue must be a positive multiple of 20")
        if self.mapped_file_size_commit_log < 4096:
            raise StoreConfigError("mapped_file_size_commit_log must be at least 4096 bytes")
        if self.flush_disk_type not in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            raise StoreConfigError(f"flush_disk_type must be ASYNC_FLUSH or SYNC_FLUSH, "
                                   f"got {self.flush_disk_type!r}")
        if not self.message_delay_levels:
            raise StoreConfigError("message_delay_levels must not be empty")
        if self.max_hash_slot_num <= 0 or self.max_index_num <= 1:
            raise StoreConfigError("max_hash_slot_num must be positive and max_index_num above 1")

    @property
    def commit_log_dir(self) -> Path:
        return self.store_path_commit_log or self.store_path_root_dir / "commitlog"

    @property
    def consume_queue_dir(self) -> Path:
        return self.store_path_root_dir / "consumequeue"

    @property
    def index_dir(self) -> Path:
        return self.store_path_root_dir / "index"

    @property
    def checkpoint_path(self) -> Path:
        return self.store_path_root_dir / "checkpoint"

    @property
    def abort_path(self) -> Path:
        return self.store_path_root_dir / "abort"

    @property
    def deleted_topics_path(self) -> Path:
        return self.store_path_root_dir / "deletedTopics.json"

    @property
    def index_gap_path(self) -> Path:
        return self.store_path_root_dir / "indexGap.json"

    @property
    def queue_summary_path(self) -> Path:
        return self.store_path_root_dir / "consumeQueueSummary.json"

    @property
    def lock_path(self) -> Path:
        return self.store_path_root_dir / "lock"

    @property
    def is_slave(self) -> bool:
        return self.broker_role == "SLAVE"

    @property
    def sync_flush(self) -> bool:
        return self.flush_disk_type == "SYNC_FLUSH"
