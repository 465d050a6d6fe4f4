"""The message store facade the broker uses: puts, pulls, offset queries, recovery, flushing.

Puts append to the commitlog and write the consume-queue unit synchronously on the event-loop
thread (two memory copies); durability is handled by background flushers that run ``fdatasync``
in worker threads.  ``SYNC_FLUSH`` puts wait for a group commit: one ``fdatasync`` releases every
put whose record it covered.
"""

from __future__ import annotations

import asyncio
import enum
import fcntl
import functools
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqbroker.metadata.errors import MetadataError
from rmqbroker.store import deleted_topics, index_gap, queue_summary
from rmqbroker.store.checkpoint import AbortMarker, StoreCheckpoint
from rmqbroker.store.commitlog import CommitLog
from rmqbroker.store.config import StoreConfig
from rmqbroker.store.consume_queue import BLANK_SIZE, CQ_STORE_UNIT_SIZE, UNIT, ConsumeQueue
from rmqbroker.store.errors import CorruptRecordError, StoreConfigError, StoreError, StoreFullError, StoreLockedError
from rmqbroker.store.index import IndexFile, IndexService
from rmqbroker.store.mapped_file import MappedFile
from rmqbroker.store.queue_summary import QueueState, StoreSummary
from rmqbroker.store.record import (
    BLANK_MAGIC_CODE,
    DELAY,
    HEADER_SIZES,
    HOST_V6_MASK,
    KEYS,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_SIZE,
    REAL_QID,
    REAL_TOPIC,
    TAGS,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    UNIQ_KEY,
    WAIT,
    BatchEntry,
    check_record,
    decode_batch_body,
    dispatch_fields,
    dispatch_record,
    encode_properties,
    encode_tail_with_prefix,
    get_property,
    host_sys_flag,
    ip_to_bytes,
    java_string_hash,
    join_properties,
    offset_msg_id,
    peek_size_magic,
    record_size,
    record_topic,
    tags_code,
    topic_prefix,
)

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SLAVE_ROLE = "SLAVE"
ROLES = ("ASYNC_MASTER", "SYNC_MASTER", SLAVE_ROLE)
# RocketMQ picks the abnormal-recovery segment 3 s before the checkpoint to absorb clock skew
# between the commitlog and consume-queue flushers.
_CHECKPOINT_SAFETY_MS = 3000
# Pause after a failed background flush before trying again.
_FLUSH_ERROR_BACKOFF_S = 1.0
# How often records a failure left unindexed are tried again, and how many commitlog bytes of them
# one loop pass indexes.
_INDEX_RETRY_PERIOD_S = 5.0
_INDEX_RETRY_SLICE = 4 << 20
# "Pages" of the least-pages flush thresholds.
_PAGE_SIZE = 4096
# A full disk refuses every write until retention frees space: one error line per this many seconds.
_NO_SPACE_LOG_EVERY_S = 10.0
# Page cache populated ahead of the commitlog's write position (see _page_cache_prefetcher): how
# far ahead, and how often the position is looked at.
_PREFETCH_AHEAD = 32 * 1024 * 1024
_PREFETCH_PERIOD_S = 0.02
_HAS_FADVISE = hasattr(os, "posix_fadvise")
# One WILLNEED call populates at most the device's readahead limit (often a few MB): ask in steps.
_FADVISE_STEP = 2 * 1024 * 1024


def _populate(fd: int, pos: int, n: int) -> None:
    """Worker thread: bring ``[pos, pos + n)`` of a segment into the page cache (holes of the
    pre-sized file are zero-filled there, without I/O), then close ``fd``, a duplicate."""
    try:
        end = pos + n
        while pos < end:
            step = min(_FADVISE_STEP, end - pos)
            os.posix_fadvise(fd, pos, step, os.POSIX_FADV_WILLNEED)
            pos += step
    finally:
        os.close(fd)
# RocketMQ's accessMessageInMemoryMaxRatio: a pull further behind the log's end than this share of
# physical memory is suggested to go to a slave.
_ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO = 40


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 8 << 30  # unknown: assume a small server


# RocketMQ's maxMsgsNumBatch: most records one QUERY_MESSAGE answers with.
MAX_MSGS_NUM_BATCH = 64


class PutMessageStatus(enum.Enum):
    PUT_OK = 0
    FLUSH_DISK_TIMEOUT = 1
    FLUSH_SLAVE_TIMEOUT = 2
    SLAVE_NOT_AVAILABLE = 3
    SERVICE_NOT_AVAILABLE = 4
    CREATE_MAPEDFILE_FAILED = 5
    MESSAGE_ILLEGAL = 6
    PROPERTIES_SIZE_EXCEEDED = 7
    OS_PAGECACHE_BUSY = 8
    UNKNOWN_ERROR = 9


# Enum member lookups are not free; the put path uses these module constants.
_PUT_OK = PutMessageStatus.PUT_OK

# Statuses for which the message is in the commitlog (the send response header is filled).
STORED_STATUSES = frozenset({
    PutMessageStatus.PUT_OK,
    PutMessageStatus.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE,
})


class GetMessageStatus(enum.Enum):
    FOUND = 0
    NO_MATCHED_MESSAGE = 1
    MESSAGE_WAS_REMOVING = 2
    OFFSET_FOUND_NULL = 3
    OFFSET_OVERFLOW_BADLY = 4
    OFFSET_OVERFLOW_ONE = 5
    OFFSET_TOO_SMALL = 6
    NO_MATCHED_LOGIC_QUEUE = 7
    NO_MESSAGE_IN_QUEUE = 8


class MessageInner:
    """A message to store, as the send processor prepared it.

    ``properties`` is the full property map to store (the store adds REAL_TOPIC/REAL_QID for
    delayed messages and reads WAIT/DELAY/TAGS from it).  ``properties_string``, when set, is
    stored verbatim instead of re-encoding ``properties`` (saves a re-encode on the send path;
    it must describe the same properties, and is ignored for delayed messages).
    ``tags_code`` overrides the hash of TAGS; ``store_host`` overrides the configured store host.
    """

    # A plain class, not a dataclass: one is built per stored message, and mypyc compiles this
    # __init__ (a dataclass's generated one stays interpreted).
    def __init__(self, topic: str, queue_id: int, flag: int, body: bytes, properties: dict[str, str] | None = None,
                 sys_flag: int = 0, born_timestamp: int = 0, born_host: tuple[str, int] = ("127.0.0.1", 0),
                 reconsume_times: int = 0, tags_code: int | None = None, store_host: tuple[str, int] | None = None,
                 prepared_transaction_offset: int = 0, properties_string: str | None = None) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.flag = flag
        self.body = body
        self.properties: dict[str, str] = properties if properties is not None else {}
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.born_host = born_host
        self.reconsume_times = reconsume_times
        self.tags_code = tags_code
        self.store_host = store_host
        self.prepared_transaction_offset = prepared_transaction_offset
        self.properties_string = properties_string

    def __repr__(self) -> str:
        return (f"MessageInner(topic={self.topic!r}, queue_id={self.queue_id}, body={len(self.body)}B, "
                f"properties={self.properties!r}, sys_flag={self.sys_flag})")


@dataclass(slots=True)
class MessageBatchInner:
    """A batch send (§3.7): ``body`` is the (already inflated) batch body.

    ``properties`` are the batch's own properties; they are appended to every message's
    properties.  Pre-decoded ``entries`` may be passed instead of relying on ``body``.
    """

    topic: str
    queue_id: int
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    store_host: tuple[str, int] | None = None
    entries: list[BatchEntry] | None = None


class PutResult:
    """Outcome of a put.  For a batch, offsets/ids describe all messages (ids comma-joined).

    ``topic``/``queue_id`` say where the message really went: SCHEDULE_TOPIC_XXXX / level-1 for
    a delayed message.
    """

    # A plain class for mypyc, like MessageInner: one per put.
    def __init__(self, status: PutMessageStatus, wrote_offset: int = 0, wrote_bytes: int = 0, msg_id: str = "",
                 queue_offset: int = 0, store_timestamp: int = 0, msg_num: int = 0, topic: str = "",
                 queue_id: int = 0) -> None:
        self.status = status
        self.wrote_offset = wrote_offset
        self.wrote_bytes = wrote_bytes
        self.msg_id = msg_id
        self.queue_offset = queue_offset
        self.store_timestamp = store_timestamp
        self.msg_num = msg_num
        self.topic = topic
        self.queue_id = queue_id

    def __repr__(self) -> str:
        return (f"PutResult({self.status.name}, wrote_offset={self.wrote_offset}, wrote_bytes={self.wrote_bytes}, "
                f"msg_id={self.msg_id!r}, queue_offset={self.queue_offset}, msg_num={self.msg_num})")

    @property
    def ok(self) -> bool:
        """The message is stored (possibly without the requested durability)."""
        return self.status in STORED_STATUSES

    @property
    def end_offset(self) -> int:
        return self.wrote_offset + self.wrote_bytes

    @property
    def logics_offsets(self) -> list[int]:
        """Consume-queue offsets of every stored message (consecutive for a batch)."""
        return list(range(self.queue_offset, self.queue_offset + self.msg_num))


@dataclass(slots=True)
class GetMessageResult:
    """Outcome of :meth:`MessageStore.get_message` (§2.5 step 3).

    ``buffers`` are zero-copy views of the matched records in commitlog order; join them once
    (:meth:`body`) to build the pull response body.
    """

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    buffers: list[memoryview] = field(default_factory=list)
    buffer_total_size: int = 0
    message_count: int = 0
    # The pull is further behind the log's end than fits in memory (RocketMQ's
    # isSuggestPullingFromSlave): a slave can serve it without evicting the master's hot pages.
    suggest_pulling_from_slave: bool = False

    def body(self) -> bytes:
        """The pull response body: the matched records concatenated (one copy)."""
        return b"".join(self.buffers)


@dataclass(slots=True)
class QueryMessageResult:
    """Outcome of :meth:`MessageStore.query_message`: whole records, and how far the index is built."""

    records: list[bytes]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int


ArrivalListener = Callable[[str, int, int], None]
# HA seam for SYNC_MASTER: ``hook(end_offset, on_done)`` for a stored message that wants to wait;
# ``on_done(status)`` with PUT_OK, FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE (§7.5) runs from the
# slave ack itself (no loop pass in between), from the timeout, or at once.
ReplicationCallback = Callable[[int, Callable[[PutMessageStatus], None]], None]
TagFilter = Callable[[int], bool]
# Sees a whole record read from the commitlog (SQL92 selectors, which need its properties).
RecordFilter = Callable[[memoryview], bool]


def _result(status: PutMessageStatus) -> PutResult:
    return PutResult(status)


def _settle(fut: asyncio.Future[PutMessageStatus], status: PutMessageStatus) -> None:
    if not fut.done():
        fut.set_result(status)


class MessageStore:
    """RocketMQ's DefaultMessageStore, reduced to what the broker needs (§4)."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        # Read twice per put; the config is frozen, its property is not compiled.
        self._sync_flush = config.sync_flush
        self.commitlog = CommitLog(config.commit_log_dir, config.mapped_file_size_commit_log)
        self.checkpoint = StoreCheckpoint(config.checkpoint_path)
        self._abort = AbortMarker(config.abort_path)
        self._cqs: dict[str, dict[int, ConsumeQueue]] = {}
        self.index: IndexService | None = None
        # Failed attempts to index a record (e.g. no room for a new index file); it stays stored.
        self.index_failures = 0
        # Commitlog offset of the first record a failure left unindexed (-1: none). Records from
        # there are indexed by the retry task, in order, and not by dispatch meanwhile; the offset
        # is kept in ``indexGap.json`` so that a restart indexes them too.
        self._index_gap = -1
        self._index_gap_saved = -1  # the offset indexGap.json holds (-1: none written)
        # Writes refused for want of disk space (sends, consume-queue units, a slave's stream).
        self.no_space_failures = 0
        self._no_space_logged = 0.0
        # Why the last dispatch stopped short (no room for a consume-queue unit), for its caller.
        self._dispatch_error: StoreFullError | None = None
        # Held while a worker thread flushes consume queues, so that a deleted topic's queue files
        # are never closed under that thread.
        self._cq_io = asyncio.Lock()
        # Deleted topic -> commitlog offset its records end before (see store/deleted_topics.py).
        self._deleted: dict[str, int] = {}
        self._listeners: list[ArrivalListener] = []
        # Set by the HA service on a SYNC_MASTER; ``None`` means no replica wait.
        self.replication_callback: ReplicationCallback | None = None
        self._store_host = config.store_host
        try:
            self._store_ip = ip_to_bytes(config.store_host[0])
        except ValueError as exc:
            raise StoreConfigError(f"store host must be an IP address, got {config.store_host[0]!r}") from exc
        # offset_msg_id's ip+port hex for the configured store host, computed once rather than per put.
        self._msg_id_prefix = offset_msg_id(config.store_host[0], config.store_host[1], 0)[:-16]
        self._delay_levels = config.message_delay_levels
        self._max_delay_level = len(config.message_delay_levels)
        self._file_size = config.mapped_file_size_commit_log
        self._max_message_size = config.max_message_size
        self._in_memory_max = _physical_memory() * _ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO // 100
        self._running = False
        self._writable = False
        # Set by the retention service while the disk is over its warning ratio: puts are refused.
        self._disk_full = False
        self._term_fenced = False
        # Commitlog start the consume queues were last cleaned against (see clean_consume_queues).
        self._cq_clean_min = 0
        # Runtime role (promotion/demotion changes it): a SLAVE refuses puts.
        self._role = config.broker_role
        self._stopping = False
        self._last_exit_ok = True
        # The previous run ended with the machine (not only the process) crashing: see AbortMarker.
        self._machine_crashed = False
        self._lock_fd: int | None = None
        # Next commitlog offset whose record still has to be dispatched to consume queues.
        self._reput_offset = 0
        # Store time of the newest consume-queue unit written (for the checkpoint).
        self._logics_ts = 0
        self._flush_waiters: deque[tuple[int, asyncio.Future[bool]]] = deque()
        self._flush_event: asyncio.Event | None = None
        # ASYNC_FLUSH periodic flushes wait until this time.monotonic() (see defer_periodic_flush).
        self._flush_deferred_until = 0.0
        self._stop_event: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ============================================================================== lifecycle ===
    @property
    def running(self) -> bool:
        return self._running

    @property
    def last_exit_ok(self) -> bool:
        """Whether the previous run shut down cleanly (no ``abort`` file was found at start)."""
        return self._last_exit_ok

    async def start(self) -> None:
        """Load files, recover (normal or abnormal), make consume queues agree with the commitlog,
        create the abort marker and start the flushers."""
        if self._running:
            return
        self.config.store_path_root_dir.mkdir(parents=True, exist_ok=True)
        self._acquire_lock()
        try:
            self._last_exit_ok = not self._abort.exists()
            self._machine_crashed = not self._last_exit_ok and not self._abort.written_this_boot()
            await asyncio.to_thread(self._load_and_recover)
            await asyncio.to_thread(self._clear_summary)
            await asyncio.to_thread(self._abort.create)
        except BaseException:
            self._close_files()
            self._release_lock()
            raise
        self._flush_event = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._stopping = False
        self._running = True
        self._update_writable()
        self._tasks = [
            asyncio.create_task(self._commitlog_flusher(), name="store-commitlog-flush"),
            asyncio.create_task(self._consume_queue_flusher(), name="store-cq-flush"),
        ]
        if _HAS_FADVISE:
            self._tasks.append(asyncio.create_task(self._page_cache_prefetcher(), name="store-prefetch"))
        if self.index is not None:
            self._tasks.append(asyncio.create_task(self._index_gap_retrier(), name="store-index-retry"))
        log.info("message store started at %s: commitlog [%d, %d), %d consume queues, last exit %s",
                 self.config.store_path_root_dir, self.min_phy_offset(), self.max_phy_offset(),
                 sum(len(q) for q in self._cqs.values()), "clean" if self._last_exit_ok else "ABNORMAL")

    async def shutdown(self) -> None:
        """Stop the flushers, flush everything, write the checkpoint, delete the abort marker."""
        if not self._running:
            return
        self._running = False
        self._writable = False
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()
        if self._flush_event is not None:
            self._flush_event.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        clean = True
        try:
            async with self._cq_io:
                flushed = await asyncio.to_thread(self._flush_all_sync)
            self._release_flush_waiters(flushed)
        except StoreError:
            log.exception("final flush failed; keeping the abort marker so the next start recovers")
            clean = False
        for _end, fut in self._flush_waiters:
            if not fut.done():
                fut.set_result(False)
        self._flush_waiters.clear()
        if clean:
            # Read on the loop (the queues are idle now), written in a worker thread.
            await asyncio.to_thread(self._save_summary, self._summary())
        self._close_files()
        if clean:
            await asyncio.to_thread(self._abort.remove)
        self._release_lock()
        log.info("message store shut down (%s)", "clean" if clean else "dirty")

    def _acquire_lock(self) -> None:
        fd = os.open(self.config.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise StoreLockedError(f"store {self.config.store_path_root_dir} is locked by another "
                                   f"process ({exc})") from exc
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _summary(self) -> StoreSummary:
        queues = tuple(
            QueueState(topic, qid, cq.min_offset(), cq.max_offset(), cq.first_phy(), cq.max_phy_end)
            for topic, qs in sorted(self._cqs.items()) for qid, cq in sorted(qs.items()) if cq.max_offset() > 0)
        index_end = self.index.end_phy if self.index is not None else -1
        return StoreSummary(self.commitlog.max_offset(), index_end, queues)

    def _save_summary(self, summary: StoreSummary) -> None:
        path = self.config.queue_summary_path
        try:
            queue_summary.save(path, summary)
        except MetadataError as exc:
            # Only a lost queue goes unnoticed at the next start, as before the summary existed.
            log.error("cannot write %s; consume queues lost before the next start will not be rebuilt: %s",
                      path, exc)
            self._clear_summary()

    def _clear_summary(self) -> None:
        try:
            queue_summary.clear(self.config.queue_summary_path)
        except MetadataError as exc:
            log.error("%s; a later start may re-dispatch queues it names needlessly", exc)

    def _close_files(self) -> None:
        self.commitlog.close()
        if self.index is not None:
            self.index.close()
        for queues in self._cqs.values():
            for cq in queues.values():
                cq.close()

    # =============================================================================== recovery ===
    def _load_and_recover(self) -> None:
        """Blocking start-up work (§4.3); runs in a worker thread before anything else uses the store."""
        # Fresh state, so a store object can be started again after shutdown.
        self.commitlog = CommitLog(self.config.commit_log_dir, self.config.mapped_file_size_commit_log)
        self.checkpoint = StoreCheckpoint(self.config.checkpoint_path)
        self._cqs = {}
        self._deleted = deleted_topics.load(self.config.deleted_topics_path)
        self.checkpoint.load()
        self.commitlog.load()
        # Queues that lost units: re-dispatched from where they end once the units beyond the
        # commitlog's end are dropped too (a damaged unit may point far beyond it).
        damaged: list[ConsumeQueue] = []
        for cq in self._load_consume_queues():
            intact = cq.load()
            if not cq.recover() or not intact:
                damaged.append(cq)

        files = self.commitlog.mfq.files
        scan_start = files[max(0, len(files) - 3)].file_from_offset if files else 0
        ckpt_start = scan_start
        if not self._last_exit_ok:
            ckpt_start = self._checkpoint_segment_start()
            scan_start = min(scan_start, ckpt_start)
            log.warning("abnormal shutdown detected: rescanning the commitlog from %d", scan_start)
        end = self.commitlog.recover(scan_start, self.config.check_crc_on_recover)
        min_phy = self.commitlog.min_offset()
        summary = self._load_summary(end)
        if self.config.message_index_enable:
            self.index = IndexService(self.config.index_dir, self.config.max_hash_slot_num, self.config.max_index_num)
            durable = self.checkpoint.index_msg_timestamp if self._machine_crashed else None
            reindex_from = self.index.load(end, durable_until_ts=durable)
            self._index_gap = self._index_gap_saved = -1
            gap = index_gap.load(self.config.index_gap_path)
            if gap is not None and gap < end:
                log.warning("records from commitlog offset %d were stored but not indexed; indexing them now", gap)
                reindex_from = gap if reindex_from is None else min(reindex_from, gap)
            if summary is not None and self.index.end_phy < summary.index_end:
                # The newest index files are gone (deleted, or lost with a disk): their records are
                # indexed again from the newest record the remaining files hold.
                index_from = max(self.index.end_phy, min_phy)
                log.warning("the index ends at commitlog offset %d but reached %d at the last shutdown; "
                            "indexing the records from %d again", self.index.end_phy, summary.index_end, index_from)
                reindex_from = index_from if reindex_from is None else min(reindex_from, index_from)
            if reindex_from is not None:
                self._reindex(max(reindex_from, min_phy), end)  # a failure here sets the gap again
            if gap is not None and self._index_gap < 0:
                index_gap.clear(self.config.index_gap_path)
        else:
            self.index = None

        for queues in self._cqs.values():
            for cq in queues.values():
                removed = cq.truncate_beyond_phy(end)
                if removed:
                    log.warning("consume queue %s-%d: dropped %d unit(s) beyond the commitlog end %d",
                                cq.topic, cq.queue_id, removed, end)
                if not self._verify_tail(cq):
                    damaged.append(cq)
                cq.correct_min_offset(min_phy)
        lost = self._find_lost_units(summary, min_phy) if summary is not None else {}
        # Where each known queue takes records from while its gap is refilled: after its last unit
        # (its units before that are checked), or from wherever a lost queue's records start.
        takes_from = {f"{cq.topic}-{cq.queue_id}": cq.max_phy_end for qs in self._cqs.values() for cq in qs.values()}
        takes_from.update(dict.fromkeys(lost, 0))
        rebuild_ends = [cq.max_phy_end for cq in damaged if f"{cq.topic}-{cq.queue_id}" not in lost]
        rebuild_ends += lost.values()
        covered = max((cq.max_phy_end for qs in self._cqs.values() for cq in qs.values()), default=min_phy)
        dispatch_from = min(covered, *rebuild_ends) if rebuild_ends else covered
        if not self._last_exit_ok:
            dispatch_from = min(dispatch_from, ckpt_start)
        dispatch_from = max(min(dispatch_from, end), min_phy)
        if dispatch_from < end:
            log.info("dispatching commitlog [%d, %d) into consume queues", dispatch_from, end)
        reached = dispatch_from
        if dispatch_from < covered:
            # Records the healthy queues already hold: only the queues missing them get units, so
            # refilling one queue neither rewrites nor duplicates the others' units.
            began = time.monotonic()
            reached = self._dispatch_from(dispatch_from, covered - dispatch_from, takes_from=takes_from)
            self._raise_dispatch_error()
            log.info("re-dispatched commitlog [%d, %d) to the queues missing units in %.1f s", dispatch_from,
                     reached, time.monotonic() - began)
        self._reput_offset = self._dispatch_from(reached)
        # A master appends after _reput_offset as if all before it were dispatched: without room
        # for the consume queues the store does not start (it would leave their units out).
        self._raise_dispatch_error()
        if self._reput_offset != end:
            log.warning("dispatch stopped at %d before the commitlog end %d", self._reput_offset, end)

        table = self.commitlog.topic_queue_table
        table.clear()
        for topic, queues in self._cqs.items():
            for qid, cq in queues.items():
                if cq.max_offset() > 0:
                    table[f"{topic}-{qid}"] = cq.max_offset()
        self._logics_ts = self.commitlog.last_store_timestamp

    def _load_summary(self, end: int) -> StoreSummary | None:
        """The summary the last clean shutdown wrote, if it still describes this commitlog."""
        if not self._last_exit_ok:
            return None  # the queues grew after it was written: the checkpoint guides recovery
        summary = queue_summary.load(self.config.queue_summary_path)
        if summary is not None and summary.commitlog_end != end:
            # Another log (restored, replaced, cut): its queue offsets say nothing about this one.
            log.warning("%s describes a commitlog ending at %d, this one ends at %d; not using it",
                        self.config.queue_summary_path, summary.commitlog_end, end)
            return None
        return summary

    def _find_lost_units(self, summary: StoreSummary, min_phy: int) -> dict[str, int]:
        """Queues that lost units since the clean shutdown ``summary`` describes, compared with what
        recovery found on disk: ``topic-queueId`` -> commitlog offset from which their records are
        dispatched again. A queue missing, or missing its first units, is emptied and rebuilt
        whole: its units keep the queue offsets the records carry, so consumers' committed offsets
        still mean the same messages. A queue cut short is refilled from its last unit on."""
        lost: dict[str, int] = {}
        for q in summary.queues:
            key = f"{q.topic}-{q.queue_id}"
            cq = self._find_cq(q.topic, q.queue_id)
            held = cq.max_offset() if cq is not None else 0
            if q.phy_end <= min_phy:
                # Every record is gone: nothing to rebuild, but the queue keeps its offsets.
                if held < q.max_offset:
                    log.warning("consume queue %s lost its files; its records are all deleted, it keeps "
                                "offset %d", key, q.max_offset)
                    cq = self._get_or_create_cq(q.topic, q.queue_id)
                    cq.reset()
                    cq.fill_blanks_to(q.max_offset)
                continue
            if cq is None or held == 0:
                why = "is missing"
            elif cq.min_offset() > q.min_offset and q.first_phy >= min_phy:
                why = f"starts at offset {cq.min_offset()}, not {q.min_offset}"
            elif held < q.max_offset:
                log.warning("consume queue %s ends at offset %d, not %d; refilling it from commitlog offset %d",
                            key, held, q.max_offset, cq.max_phy_end)
                lost[key] = cq.max_phy_end
                continue
            else:
                continue
            start = max(q.first_phy, min_phy)
            log.warning("consume queue %s %s (offsets [%d, %d) at the last shutdown); rebuilding it from "
                        "commitlog offset %d", key, why, q.min_offset, q.max_offset, start)
            if cq is not None:
                cq.reset()
            lost[key] = start
        return lost

    def _load_consume_queues(self) -> list[ConsumeQueue]:
        root = self.config.consume_queue_dir
        root.mkdir(parents=True, exist_ok=True)
        out: list[ConsumeQueue] = []
        for topic_dir in sorted(root.iterdir()):
            if not topic_dir.is_dir():
                continue
            for qdir in sorted(topic_dir.iterdir()):
                if not qdir.is_dir() or not qdir.name.isdigit():
                    continue
                cq = ConsumeQueue(topic_dir.name, int(qdir.name), root,
                                  self.config.mapped_file_size_consume_queue)
                self._cqs.setdefault(cq.topic, {})[cq.queue_id] = cq
                out.append(cq)
        return out

    def _checkpoint_segment_start(self) -> int:
        """Newest segment whose first record is older than the checkpoint (abnormal recovery)."""
        files = self.commitlog.mfq.files
        limit = self.checkpoint.min_timestamp() - _CHECKPOINT_SAFETY_MS
        if not files:
            return 0
        if limit > 0:
            for mf in reversed(files):
                fields = self.commitlog.header_fields(mf.file_from_offset)
                if fields is not None and fields[1] == MESSAGE_MAGIC_CODE and 0 < fields[4] <= limit:
                    return mf.file_from_offset
        return files[0].file_from_offset

    def _unit_matches(self, cq: ConsumeQueue, logical: int) -> bool:
        """Whether the unit at ``logical`` points at this queue's record with that queue offset."""
        unit = cq.get_unit(logical)
        if unit is None:
            return False
        phy, size, _tags = unit
        if size == BLANK_SIZE and phy == 0:
            return True
        fields = self.commitlog.header_fields(phy)
        if fields is None:
            return phy < self.commitlog.min_offset()  # data deleted by retention: not corruption
        rec_size, magic, qid, qoff, _ts = fields
        if magic != MESSAGE_MAGIC_CODE or rec_size != size or qid != cq.queue_id or qoff != logical:
            return False
        mf = self.commitlog.mfq.find_file(phy)
        return mf is not None and record_topic(mf.mm, phy - mf.file_from_offset) == cq.topic

    def _verify_tail(self, cq: ConsumeQueue) -> bool:
        """Check the newest unit against the commitlog; on mismatch cut back to the last good one."""
        low, high = cq.min_offset(), cq.max_offset()
        if high <= low or self._unit_matches(cq, high - 1):
            return True
        # Units are good up to some point and bad after it: binary search for the last good one.
        lo, hi = low, high - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self._unit_matches(cq, mid):
                lo = mid + 1
            else:
                hi = mid
        log.warning("consume queue %s-%d: units from %d disagree with the commitlog; rebuilding them",
                    cq.topic, cq.queue_id, lo)
        cq.truncate_to_logical(lo)
        return False

    # =============================================================================== dispatch ===
    def _reindex(self, start: int, end: int) -> None:
        """Index the records of ``[start, end)`` again (index files lost with the machine)."""
        if start >= end:
            return
        began = time.monotonic()
        log.warning("indexing commitlog [%d, %d) again", start, end)
        stopped = self._dispatch_from(start, index_only=True)
        log.warning("indexed commitlog [%d, %d) again in %.1f s", start, stopped, time.monotonic() - began)

    def _dispatch_from(self, start: int, budget: int | None = None, index_only: bool = False,
                       takes_from: dict[str, int] | None = None) -> int:
        """Build consume-queue units (and index entries) for complete records from ``start`` (at most
        ``budget`` bytes of them when given); returns where it stopped (always a record boundary).
        ``index_only`` builds index entries alone. With ``takes_from`` (``topic-queueId`` -> commitlog
        offset) a record gets its unit only from its queue's offset on (queues not named: always)."""
        mfq = self.commitlog.mfq
        mf = mfq.find_file(start)
        if mf is None:
            return start
        rel = start - mf.file_from_offset
        limit = None if budget is None else start + budget
        try:
            while limit is None or mf.file_from_offset + rel < limit:
                wrote = mf.wrote_position
                fields = dispatch_record(mf.mm, rel, wrote)
                if fields is None:
                    # General path: end-of-file marker, IPv6 hosts, data still arriving, corruption.
                    if rel + 8 > wrote:
                        break
                    size, magic = peek_size_magic(mf.mm, rel)
                    if magic == BLANK_MAGIC_CODE:
                        nxt = mfq.find_file(mf.file_end_offset)
                        if nxt is None:
                            rel = mf.file_size
                            break
                        mf, rel = nxt, 0
                        continue
                    if magic == MESSAGE_MAGIC_CODE and size >= MIN_RECORD_SIZE and wrote < rel + size <= mf.file_size:
                        break  # the rest of this record has not arrived yet
                    check_record(mf.mm, rel, check_crc=False, limit=wrote)
                    fields = dispatch_fields(mf.mm, rel)
                phy = mf.file_from_offset + rel
                if index_only:
                    self._index_record(phy, fields[1], fields[5], fields[4], fields[6])
                elif takes_from is not None and phy < takes_from.get(f"{fields[1]}-{fields[2]}", 0):
                    # Its queue holds it already: only the index may still lack it.
                    self.commitlog.last_store_timestamp = fields[5]
                    self._index_record(phy, fields[1], fields[5], fields[4], fields[6])
                else:
                    self._dispatch_one(phy, fields)
                rel += fields[0]
        except CorruptRecordError as exc:
            log.error("cannot dispatch the commitlog past %d: %s", mf.file_from_offset + rel, exc)
        except StoreFullError as exc:
            # Nothing of this record was written: it is dispatched again when there is room.
            self._dispatch_error = exc
        return mf.file_from_offset + rel

    def _raise_dispatch_error(self) -> None:
        exc = self._dispatch_error
        if exc is not None:
            self._dispatch_error = None
            self.note_no_space("consume queues", exc)
            raise exc

    def note_no_space(self, what: str, exc: StoreError) -> None:
        """Count a write refused for want of disk space, and log it (at most every 10 s)."""
        self.no_space_failures += 1
        now = time.monotonic()
        if now - self._no_space_logged >= _NO_SPACE_LOG_EVERY_S:
            self._no_space_logged = now
            log.error("no space on the store's disk for %s (%d refused write(s) so far); retention deletes expired "
                      "files above diskSpaceCleanForciblyRatio, or give the volume more room: %s",
                      what, self.no_space_failures, exc)

    def _dispatch_one(self, phy: int, fields: tuple[int, str, int, int, int, int, str]) -> None:
        size, topic, qid, qoff, sys_flag, store_ts, props = fields
        tran = sys_flag & TRANSACTION_TYPE_MASK
        self.commitlog.last_store_timestamp = store_ts
        # The unit before the index entry: a unit that finds no room raises (the record is
        # dispatched again later), while an index failure is only a gap the retry task fills.
        deleted = self._deleted
        if tran in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE) or (deleted and phy < deleted.get(topic, -1)):
            # No unit: a half or rolled-back message, or a topic deleted since (its queues stay gone).
            if self.index is not None:
                self._index_record(phy, topic, store_ts, sys_flag, props)
            return
        tags = tags_code(get_property(props, TAGS))
        if topic == SCHEDULE_TOPIC:
            level = _parse_int(get_property(props, DELAY))
            if level > 0:
                tags = store_ts + self._delay_levels[min(level, self._max_delay_level) - 1]
        cq = self._get_or_create_cq(topic, qid)
        cq.put_unit(qoff, phy, size, tags)
        key = f"{topic}-{qid}"
        table = self.commitlog.topic_queue_table
        if table.get(key, 0) <= qoff:
            table[key] = qoff + 1
        self._logics_ts = store_ts
        if self.index is not None:
            self._index_record(phy, topic, store_ts, sys_flag, props)
        if self._listeners:
            self._notify(topic, qid, cq.max_offset())

    def _index_record(self, phy: int, topic: str, store_ts: int, sys_flag: int, props: str) -> None:
        if self.index is not None and sys_flag & TRANSACTION_TYPE_MASK != TRANSACTION_ROLLBACK_TYPE:
            uniq = get_property(props, UNIQ_KEY)
            keys = get_property(props, KEYS)
            if uniq or keys:
                self._index(phy, topic, store_ts, uniq, keys)

    def _get_or_create_cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        queues = self._cqs.get(topic)
        if queues is None:
            queues = self._cqs[topic] = {}
        cq = queues.get(queue_id)
        if cq is None:
            cq = ConsumeQueue(topic, queue_id, self.config.consume_queue_dir,
                              self.config.mapped_file_size_consume_queue)
            queues[queue_id] = cq
        return cq

    def _find_cq(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        queues = self._cqs.get(topic)
        return queues.get(queue_id) if queues is not None else None

    def _notify(self, topic: str, queue_id: int, max_offset: int) -> None:
        for listener in self._listeners:
            try:
                listener(topic, queue_id, max_offset)
            except Exception:
                log.exception("arrival listener %r failed", listener)

    def add_arrival_listener(self, listener: ArrivalListener) -> None:
        """Call ``listener(topic, queue_id, new_max_offset)`` after every consume-queue write."""
        # Copy on write: a listener may add or remove listeners while being notified.
        self._listeners = [*self._listeners, listener]

    def remove_arrival_listener(self, listener: ArrivalListener) -> None:
        self._listeners = [cb for cb in self._listeners if cb != listener]

    # =================================================================================== puts ===
    def append_message(self, msg: MessageInner) -> PutResult:
        """Validate and store one message without waiting for flush/replication.

        Nothing is written unless every check passes.  The schedule service can call this
        directly; the send path uses :meth:`put_message`.
        """
        if not self._writable:
            return _result(PutMessageStatus.SERVICE_NOT_AVAILABLE)
        topic = msg.topic
        queue_id = msg.queue_id
        props = msg.properties
        delay_ms = -1
        tran = msg.sys_flag & TRANSACTION_TYPE_MASK
        not_prepared = tran not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
        if not_prepared and DELAY in props:
            level = _parse_int(props[DELAY])
            if level > 0:
                level = min(level, self._max_delay_level)
                props = dict(props)
                props[DELAY] = str(level)
                props[REAL_TOPIC] = topic
                props[REAL_QID] = str(queue_id)
                topic = SCHEDULE_TOPIC
                queue_id = level - 1
                delay_ms = self._delay_levels[level - 1]
        prefix = topic_prefix(topic)
        if len(prefix) > MAX_TOPIC_LENGTH + 1:
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        props_str = msg.properties_string
        if props_str is None or delay_ms >= 0:
            props_str = encode_properties(props)
        props_b = props_str.encode("utf-8")
        if len(props_b) > MAX_PROPERTIES_LENGTH:
            return _result(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)
        body = msg.body
        if len(body) > self._max_message_size:
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        store_host = msg.store_host or self._store_host
        try:
            born_ip = ip_to_bytes(msg.born_host[0])
            store_ip = self._store_ip if msg.store_host is None else ip_to_bytes(store_host[0])
        except ValueError:
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        sys_flag = msg.sys_flag & ~HOST_V6_MASK
        if len(born_ip) != 4 or len(store_ip) != 4:
            sys_flag |= host_sys_flag(born_ip, store_ip)
        tail = encode_tail_with_prefix(prefix, props_b)
        size = HEADER_SIZES[(sys_flag >> 4) & 3] + len(body) + len(tail)
        if size + 8 > self._file_size:
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        try:
            phy, qoff, store_ts = self.commitlog.append_message(
                topic, queue_id, msg.flag, body, tail, size, sys_flag, msg.born_timestamp, born_ip,
                msg.born_host[1], store_ip, store_host[1], msg.reconsume_times,
                msg.prepared_transaction_offset, not_prepared,
            )
        except StoreFullError as exc:
            self.note_no_space("a message", exc)
            return _result(PutMessageStatus.SERVICE_NOT_AVAILABLE)
        except (StoreError, OSError):
            log.exception("commitlog append failed")
            return _result(PutMessageStatus.CREATE_MAPEDFILE_FAILED)
        if not_prepared:
            if delay_ms >= 0:
                tags = store_ts + delay_ms
            elif msg.tags_code is not None:
                tags = msg.tags_code
            else:
                tag = props.get(TAGS)
                tags = java_string_hash(tag) if tag else 0
            queues = self._cqs.get(topic)
            cq = queues.get(queue_id) if queues is not None else None
            if cq is None:
                cq = self._get_or_create_cq(topic, queue_id)
            try:
                cq.put_unit(qoff, phy, size, tags)
            except StoreFullError as exc:
                self._take_back(cq, phy, phy + size, qoff)
                self.note_no_space("a consume-queue unit", exc)
                return _result(PutMessageStatus.SERVICE_NOT_AVAILABLE)
            self._logics_ts = store_ts
            if self._listeners:
                self._notify(topic, queue_id, qoff + 1)
        if self.index is not None and tran != TRANSACTION_ROLLBACK_TYPE:
            uniq = props.get(UNIQ_KEY)
            keys = props.get(KEYS)
            if uniq or keys:
                self._index(phy, topic, store_ts, uniq, keys)
        self._reput_offset = phy + size
        # Upper-case hex of the 8-byte offset: two C calls, several times cheaper than "{:016X}".
        msg_id = (self._msg_id_prefix + phy.to_bytes(8, "big").hex().upper() if msg.store_host is None
                  else offset_msg_id(store_host[0], store_host[1], phy))
        return PutResult(_PUT_OK, phy, size, msg_id, qoff, store_ts, 1, topic, queue_id)

    def _take_back(self, cq: ConsumeQueue, phy: int, end: int, queue_offset: int) -> None:
        """Undo a put whose consume-queue units found no room: its records and any of its units
        written leave, so the send is refused with nothing stored (a retry stores it once)."""
        if cq.max_offset() > queue_offset:
            cq.truncate_to_logical(queue_offset)
        self.commitlog.undo_append(phy, end, f"{cq.topic}-{cq.queue_id}", queue_offset)

    async def put_message(self, msg: MessageInner) -> PutResult:
        """Store one message and, unless its WAIT property is ``"false"``, wait for the configured
        durability (SYNC_FLUSH group commit) and replication (``replication_callback``)."""
        result = self.append_message(msg)
        if result.status is _PUT_OK:
            await self._await_durability(result, msg.properties.get(WAIT) != "false")
        return result

    def append_messages(self, batch: MessageBatchInner) -> PutResult:
        """Validate and store a batch (consecutive queue offsets, one segment) without waiting."""
        if not self._writable:
            return _result(PutMessageStatus.SERVICE_NOT_AVAILABLE)
        prefix = topic_prefix(batch.topic)
        if len(prefix) > MAX_TOPIC_LENGTH + 1:
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        if batch.sys_flag & TRANSACTION_TYPE_MASK or _parse_int(batch.properties.get(DELAY)) > 0:
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        try:
            entries = batch.entries if batch.entries is not None else decode_batch_body(batch.body)
        except CorruptRecordError as exc:
            log.info("rejecting malformed batch for %s: %s", batch.topic, exc)
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        if not entries:
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        store_host = batch.store_host or self._store_host
        try:
            born_ip = ip_to_bytes(batch.born_host[0])
            store_ip = self._store_ip if batch.store_host is None else ip_to_bytes(store_host[0])
        except ValueError:
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        sys_flag = (batch.sys_flag & ~HOST_V6_MASK) | host_sys_flag(born_ip, store_ip)
        batch_props = encode_properties(batch.properties)
        max_size = self.config.max_message_size
        items: list[tuple[int, bytes, bytes, int]] = []
        tag_codes: list[int] = []
        index_keys: list[tuple[str | None, str | None]] = []
        total = 0
        for entry in entries:
            if len(entry.body) > max_size:
                return _result(PutMessageStatus.MESSAGE_ILLEGAL)
            props = join_properties(entry.properties, batch_props)
            props_b = props.encode("utf-8")
            if len(props_b) > MAX_PROPERTIES_LENGTH:
                return _result(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)
            tail = encode_tail_with_prefix(prefix, props_b)
            size = record_size(sys_flag, len(entry.body), len(tail))
            items.append((entry.flag, entry.body, tail, size))
            tag_codes.append(tags_code(get_property(props, TAGS)))
            if self.index is not None:
                index_keys.append((get_property(props, UNIQ_KEY), get_property(props, KEYS)))
            total += size
        if total + 8 > self._file_size:
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        try:
            offsets, first_qoff, store_ts = self.commitlog.append_batch(
                batch.topic, batch.queue_id, items, total, sys_flag, batch.born_timestamp, born_ip,
                batch.born_host[1], store_ip, store_host[1], 0,
            )
        except StoreFullError as exc:
            self.note_no_space("a message batch", exc)
            return _result(PutMessageStatus.SERVICE_NOT_AVAILABLE)
        except (StoreError, OSError):
            log.exception("commitlog batch append failed")
            return _result(PutMessageStatus.CREATE_MAPEDFILE_FAILED)
        cq = self._get_or_create_cq(batch.topic, batch.queue_id)
        try:
            for i, (phy, item) in enumerate(zip(offsets, items, strict=True)):
                cq.put_unit(first_qoff + i, phy, item[3], tag_codes[i])
        except StoreFullError as exc:
            self._take_back(cq, offsets[0], offsets[0] + total, first_qoff)
            self.note_no_space("consume-queue units", exc)
            return _result(PutMessageStatus.SERVICE_NOT_AVAILABLE)
        if self.index is not None:
            for phy, (uniq, keys) in zip(offsets, index_keys, strict=True):
                if uniq or keys:
                    self._index(phy, batch.topic, store_ts, uniq, keys)
        self._logics_ts = store_ts
        self._reput_offset = offsets[-1] + items[-1][3]
        if self._listeners:
            self._notify(batch.topic, batch.queue_id, first_qoff + len(items))
        host, port = store_host
        msg_ids = ",".join([offset_msg_id(host, port, phy) for phy in offsets])
        return PutResult(PutMessageStatus.PUT_OK, offsets[0], total, msg_ids, first_qoff, store_ts,
                         len(items), batch.topic, batch.queue_id)

    async def put_messages(self, batch: MessageBatchInner) -> PutResult:
        """Store a batch; waits like :meth:`put_message` (WAIT from the batch properties)."""
        result = self.append_messages(batch)
        if result.status is PutMessageStatus.PUT_OK:
            await self._await_durability(result, batch.properties.get(WAIT) != "false")
        return result

    def durability_wait(self, result: PutResult, wait: bool) -> Coroutine[Any, Any, None] | None:
        """What a stored put still has to wait for (SYNC_FLUSH, replication), or None.

        Lets a caller answer an ASYNC_FLUSH / ASYNC_MASTER put without scheduling anything.
        """
        if result.status is not _PUT_OK:
            return None
        if self._sync_flush or (wait and self.replication_callback is not None):
            return self._await_durability(result, wait)
        return None

    def replicate_then(self, result: PutResult, wait: bool, on_done: Callable[[PutMessageStatus], None]) -> bool:
        """ASYNC_FLUSH with replication: ``on_done(status)`` once the replication outcome is known
        (see ``ReplicationCallback``); False when the put needs nothing more (the caller answers at
        once) or needs :meth:`durability_wait`.
        """
        hook = self.replication_callback
        if result.status is not _PUT_OK or self._sync_flush or not wait or hook is None:
            return False
        hook(result.end_offset, on_done)
        return True

    def _replica_future(self, end_offset: int) -> asyncio.Future[PutMessageStatus] | None:
        """The replication outcome of ``end_offset`` as a future, for puts that also wait for a flush."""
        hook = self.replication_callback
        if hook is None:
            return None
        fut: asyncio.Future[PutMessageStatus] = asyncio.get_running_loop().create_future()
        hook(end_offset, functools.partial(_settle, fut))
        return fut

    async def _await_durability(self, result: PutResult, wait: bool) -> None:
        hook = self._replica_future(result.end_offset) if wait else None
        if self.config.sync_flush:
            if not wait:
                self._wake_flusher()
            elif hook is None:
                if not await self._wait_flushed(result.end_offset):
                    result.status = PutMessageStatus.FLUSH_DISK_TIMEOUT
                return
            else:
                flushed, replica = await asyncio.gather(self._wait_flushed(result.end_offset), hook)
                if not flushed:
                    result.status = PutMessageStatus.FLUSH_DISK_TIMEOUT
                if replica is not PutMessageStatus.PUT_OK:
                    result.status = replica
                return
        if hook is not None:
            replica = await hook
            if replica is not PutMessageStatus.PUT_OK:
                result.status = replica

    # ================================================================================ flushing ===
    def _wake_flusher(self) -> None:
        if self._flush_event is not None:
            self._flush_event.set()

    async def _wait_flushed(self, end_offset: int) -> bool:
        """Group commit: wait until a flush covers ``end_offset`` or the sync flush timeout passes."""
        if self.commitlog.flushed_offset() >= end_offset:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._flush_waiters.append((end_offset, fut))
        self._wake_flusher()
        timer = loop.call_later(self.config.sync_flush_timeout_ms / 1000, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()

    def _release_flush_waiters(self, flushed: int) -> None:
        waiters = self._flush_waiters
        while waiters and waiters[0][0] <= flushed:
            _end, fut = waiters.popleft()
            if not fut.done():
                fut.set_result(True)

    def _flush_commitlog_sync(self) -> int:
        """Blocking commitlog flush; records the checkpoint's physic timestamp."""
        ts = self.commitlog.last_store_timestamp
        flushed = self.commitlog.flush()
        self.checkpoint.physic_msg_timestamp = max(self.checkpoint.physic_msg_timestamp, ts)
        return flushed

    def _flush_consume_queues_sync(self, queues: list[ConsumeQueue], logics_ts: int) -> None:
        """Blocking flush of the given consume queues, then of the checkpoint."""
        for cq in queues:
            cq.flush()
        self.checkpoint.logics_msg_timestamp = max(self.checkpoint.logics_msg_timestamp, logics_ts)
        self.checkpoint.flush()

    def _dirty_queues(self) -> list[ConsumeQueue]:
        return [cq for qs in self._cqs.values() for cq in qs.values() if cq.is_dirty()]

    def _flush_all_sync(self) -> int:
        flushed = self._flush_commitlog_sync()
        if self.index is not None and self.index.files:
            self.index.flush()
            self.checkpoint.index_msg_timestamp = self.index.files[-1].end_ts
        self._flush_consume_queues_sync(self._dirty_queues(), self._logics_ts)
        return flushed

    def _index(self, phy: int, topic: str, store_ts: int, uniq: str | None, keys: str | None) -> None:
        """Index one stored record. The record is stored whatever happens here: a failure (no room
        for a new index file) leaves it and the records after it to the retry task, which indexes
        them in order once it can (meanwhile lookups by key miss them)."""
        if self._index_gap >= 0:
            return  # behind a failure: the retry task indexes this record in its turn
        index = self.index
        assert index is not None
        try:
            full = index.build(phy, topic, store_ts, uniq, keys)
        except (StoreError, OSError) as exc:
            self.index_failures += 1
            self._index_gap = phy
            if self.index_failures == 1 or self.index_failures % 1000 == 0:
                log.error("indexing the record at %d failed (%d failure(s) so far); records from there are "
                          "indexed when it succeeds, every %.0f s: %s", phy, self.index_failures,
                          _INDEX_RETRY_PERIOD_S, exc)
            if phy != self._index_gap_saved:
                try:
                    index_gap.save(self.config.index_gap_path, phy)
                    self._index_gap_saved = phy
                except MetadataError as save_exc:
                    log.error("cannot record the index gap at %d (a restart will not index those records): %s",
                              phy, save_exc)
            return
        if full:
            self._index_full(full)

    async def _index_gap_retrier(self) -> None:
        while await self._wait_or_stop(_INDEX_RETRY_PERIOD_S):
            if self._index_gap >= 0:
                await self.index_catch_up()

    @property
    def index_gap(self) -> int:
        """Commitlog offset from which stored records await indexing after a failure (-1: none)."""
        return self._index_gap

    async def index_catch_up(self) -> bool:
        """Index the records a failure left behind, in order and in slices, if the index can take
        them now; dispatch indexes as it goes from when this catches up with it. Whether it did."""
        if self._index_gap < 0 or self.index is None:
            return self._index_gap < 0
        began = pos = max(self._index_gap, self.commitlog.min_offset())
        while True:
            self._index_gap = -1  # lets _index build; a failure sets it again
            stopped = self._dispatch_from(pos, _INDEX_RETRY_SLICE, index_only=True)
            if self._index_gap >= 0:
                return False
            if stopped >= self._reput_offset or stopped == pos:
                break
            self._index_gap = pos = stopped
            await asyncio.sleep(0)
        log.warning("indexed the records of commitlog [%d, %d) that a failure had left behind", began, stopped)
        try:
            index_gap.clear(self.config.index_gap_path)  # one unlink: on the loop, so no failure slips in
            self._index_gap_saved = -1
        except MetadataError as exc:
            log.error("cannot remove %s (a restart indexes those records again): %s",
                      self.config.index_gap_path, exc)
        return True

    def _index_full(self, full: list[IndexFile]) -> None:
        """Index files fill up rarely (20 million entries): each is made durable once, off the loop,
        as RocketMQ's IndexService does (entries of the file being written are flushed at shutdown)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # start-up recovery runs in a worker thread
            for f in full:
                f.flush()
            return
        for f in full:
            loop.run_in_executor(None, _flush_index_file, f, self.checkpoint)

    async def flush(self) -> int:
        """Flush commitlog, consume queues and checkpoint now; returns the flushed commitlog offset."""
        async with self._cq_io:
            flushed = await asyncio.to_thread(self._flush_all_sync)
        self._release_flush_waiters(flushed)
        return flushed

    def defer_periodic_flush(self, until: float) -> None:
        """ASYNC_FLUSH: skip the periodic commitlog flushes until ``until`` (``time.monotonic()``),
        except the thorough one; callable from any thread.

        A slave catching up calls this while bulk frames arrive: writing back what it received
        would compete for the CPU with receiving the rest, and its acks never promised a flush
        (RocketMQ's slaves ack written bytes too). The flush after the catch-up writes it all.
        SYNC_FLUSH is not affected.
        """
        self._flush_deferred_until = max(self._flush_deferred_until, until)

    async def _commitlog_flusher(self) -> None:
        """SYNC_FLUSH: group commit whenever a put waits (and on every interval).  ASYNC_FLUSH: every
        interval once enough pages are dirty (unless deferred), and thoroughly now and then."""
        assert self._flush_event is not None and self._stop_event is not None
        event = self._flush_event
        cfg = self.config
        interval = cfg.flush_interval_commit_log_ms / 1000
        least = cfg.flush_commit_log_least_pages * _PAGE_SIZE
        thorough = cfg.flush_commit_log_thorough_interval_ms / 1000
        sync = cfg.sync_flush
        loop = asyncio.get_running_loop()
        last_flush = loop.time()
        while not self._stopping:
            try:
                async with asyncio.timeout(interval):
                    await (event if sync else self._stop_event).wait()
            except TimeoutError:
                pass
            event.clear()
            if self._stopping:
                break
            dirty = self.commitlog.max_offset() - self.commitlog.flushed_offset()
            if not self._flush_waiters:
                if dirty <= 0:
                    # Everything is on disk now: the thorough interval counts from here.
                    last_flush = loop.time()
                    continue
                if not sync and (dirty < least or time.monotonic() < self._flush_deferred_until) \
                        and loop.time() - last_flush < thorough:
                    continue
            try:
                flushed = await asyncio.to_thread(self._flush_commitlog_sync)
            except StoreError:
                log.exception("commitlog flush failed")
                await asyncio.sleep(_FLUSH_ERROR_BACKOFF_S)
                continue
            last_flush = loop.time()
            self._release_flush_waiters(flushed)

    async def _wait_or_stop(self, seconds: float) -> bool:
        """Wait ``seconds`` or until the store stops; whether it is still running."""
        assert self._stop_event is not None
        try:
            async with asyncio.timeout(seconds):
                await self._stop_event.wait()
        except TimeoutError:
            pass
        return not self._stopping

    async def _consume_queue_flusher(self) -> None:
        """Flush dirty consume queues and then the checkpoint, least-pages / thorough like the commitlog."""
        cfg = self.config
        interval = cfg.flush_interval_consume_queue_ms / 1000
        least = cfg.flush_consume_queue_least_pages * _PAGE_SIZE
        thorough = cfg.flush_consume_queue_thorough_interval_ms / 1000
        loop = asyncio.get_running_loop()
        last_flush = loop.time()
        while await self._wait_or_stop(interval):
            queues = self._dirty_queues()
            if not queues:
                continue
            if loop.time() - last_flush < thorough and sum(cq.mfq.dirty_bytes() for cq in queues) < least:
                continue
            try:
                async with self._cq_io:
                    # Only queues still in the table: one may have been deleted while we waited.
                    live = [cq for cq in queues if self._cqs.get(cq.topic, {}).get(cq.queue_id) is cq]
                    await asyncio.to_thread(self._flush_consume_queues_sync, live, self._logics_ts)
            except StoreError:
                log.exception("consume queue flush failed")
                continue
            last_flush = loop.time()

    async def _page_cache_prefetcher(self) -> None:
        """Keep the commitlog's next pages in the page cache ahead of the appends.

        The first write to a page of the mapping faults it in, and the kernel's fault-time
        readahead then zero-fills a whole window of the sparse segment at once: on the event loop
        that was a stall of ~18 ms every few MB (a send latency p99 of ~19 ms at saturation).
        ``posix_fadvise(WILLNEED)`` from a worker thread does that filling off the loop (and
        without the GIL), so appends only take minor faults on cached pages. Java's broker warms
        its next mapped file for the same reason.
        """
        mfq = self.commitlog.mfq
        current: MappedFile | None = None
        done = 0  # populated up to here in ``current``
        while await self._wait_or_stop(_PREFETCH_PERIOD_S):
            mf = mfq.last_file
            if mf is None:
                continue
            wrote = mf.wrote_position
            if mf is not current:
                current, done = mf, wrote - wrote % _PAGE_SIZE
            target = min(mf.file_size, wrote + _PREFETCH_AHEAD)
            # In steps of at least a quarter of the window, so that the thread hop is rare.
            if (target - done < _PREFETCH_AHEAD // 4 and target < mf.file_size) or target <= done:
                continue
            try:
                fd = os.dup(mf.fd)
            except OSError:
                continue  # the segment was closed meanwhile (truncation, shutdown)
            try:
                await asyncio.to_thread(_populate, fd, done, target - done)
            except OSError as exc:
                log.warning("populating commitlog pages ahead of %d failed: %s", mf.file_from_offset + done, exc)
                await asyncio.sleep(_FLUSH_ERROR_BACKOFF_S)
                continue
            done = target

    # ================================================================================== reads ===
    def _correct(self, old: int, new: int) -> int:
        # A slave leaves the client's offset alone unless offsetCheckInSlave is set (§2.5).
        if self._role == SLAVE_ROLE and not self.config.offset_check_in_slave:
            return old
        return new

    # Positional parameters are the pull processor's contract (RocketMQ's getMessage order).
    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        tag_filter: TagFilter | None = None,
        record_filter: RecordFilter | None = None,
    ) -> GetMessageResult:
        """Read up to ``max_msg_nums`` matching records from ``offset`` (§2.5 step 3).

        ``group`` is accepted for parity with RocketMQ (stats); ``tag_filter`` gets each unit's
        tagsCode and ``record_filter`` each record that passed it (``None`` matches everything).
        """
        G = GetMessageStatus
        cq = self._find_cq(topic, queue_id)
        if cq is None:
            return GetMessageResult(G.NO_MESSAGE_IN_QUEUE, self._correct(offset, 0), 0, 0)
        min_off = cq.min_offset()
        max_off = cq.max_offset()
        if max_off == 0:
            return GetMessageResult(G.NO_MESSAGE_IN_QUEUE, self._correct(offset, 0), min_off, max_off)
        if offset < min_off:
            return GetMessageResult(G.OFFSET_TOO_SMALL, self._correct(offset, min_off), min_off, max_off)
        if offset == max_off:
            return GetMessageResult(G.OFFSET_OVERFLOW_ONE, self._correct(offset, offset), min_off, max_off)
        if offset > max_off:
            return GetMessageResult(G.OFFSET_OVERFLOW_BADLY, self._correct(offset, max_off), min_off, max_off)
        found = cq.units_buffer(offset)
        if found is None:
            return GetMessageResult(G.OFFSET_FOUND_NULL, self._correct(offset, cq.roll_next_file(offset)),
                                    min_off, max_off)
        mf, start, end = found
        end = min(end, start + max(16000, max_msg_nums * CQ_STORE_UNIT_SIZE))
        mm = mf.mm
        unpack = UNIT.unpack_from
        commitlog = self.commitlog
        max_bytes = self.config.max_transfer_bytes_on_message_in_memory
        max_count = self.config.max_transfer_count_on_message_in_memory
        status = G.NO_MATCHED_MESSAGE
        buffers: list[memoryview] = []
        total = 0
        count = 0
        next_phy_file_start = -1
        max_phy_pulling = 0
        pos = start
        while pos < end:
            phy, size, tags = unpack(mm, pos)
            max_phy_pulling = phy
            if phy < next_phy_file_start or size == BLANK_SIZE:
                pos += CQ_STORE_UNIT_SIZE
                continue
            if count and (count >= max_msg_nums or total + size > max_bytes or count >= max_count):
                break
            if tag_filter is not None and not tag_filter(tags):
                pos += CQ_STORE_UNIT_SIZE
                continue
            view = commitlog.read(phy, size)
            if view is None:
                if not count:
                    status = G.MESSAGE_WAS_REMOVING
                next_phy_file_start = commitlog.roll_next_file(phy)
                pos += CQ_STORE_UNIT_SIZE
                continue
            next_phy_file_start = -1
            if record_filter is not None and not record_filter(view):
                pos += CQ_STORE_UNIT_SIZE
                continue
            buffers.append(view)
            total += size
            count += 1
            status = G.FOUND
            pos += CQ_STORE_UNIT_SIZE
        next_begin = offset + (pos - start) // CQ_STORE_UNIT_SIZE
        behind = commitlog.max_offset() - max_phy_pulling > self._in_memory_max if pos > start else False
        return GetMessageResult(status, next_begin, min_off, max_off, buffers, total, count, behind)

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self._find_cq(topic, queue_id)
        return cq.max_offset() if cq is not None else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self._find_cq(topic, queue_id)
        return cq.min_offset() if cq is not None else 0

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP (§2.9): exact store-time hit, else the nearer neighbour; 0 if none."""
        cq = self._find_cq(topic, queue_id)
        if cq is None:
            return 0
        return cq.search_offset_by_time(timestamp, self.commitlog.pickup_store_timestamp,
                                        self.commitlog.min_offset())

    def earliest_message_time(self) -> int:
        """Store time of the oldest record in the commitlog, -1 if there is none (Java's
        getEarliestMessageTime() without a queue)."""
        fields = self.commitlog.header_fields(self.commitlog.min_offset())
        if fields is None or fields[1] != MESSAGE_MAGIC_CODE:
            return -1
        return fields[4]

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int:
        """Store time of the oldest message in the queue, -1 if there is none."""
        cq = self._find_cq(topic, queue_id)
        unit = cq.earliest_unit() if cq is not None else None
        if unit is None:
            return -1
        return self.commitlog.pickup_store_timestamp(unit[0], unit[1])

    def get_message_store_timestamp(self, topic: str, queue_id: int, offset: int) -> int:
        """Store time of the message at a logical offset, -1 if unreadable."""
        cq = self._find_cq(topic, queue_id)
        unit = cq.get_unit(offset) if cq is not None else None
        if unit is None or unit[1] == BLANK_SIZE:
            return -1
        return self.commitlog.pickup_store_timestamp(unit[0], unit[1])

    def query_message(self, topic: str, key: str, max_num: int, begin: int, end: int) -> QueryMessageResult:
        """QUERY_MESSAGE (§4.5): the records of ``topic`` whose unique key or one of whose KEYS is
        ``key``, stored in ``[begin, end]`` (ms), at most ``max_num`` (capped at 64, RocketMQ's
        maxMsgsNumBatch), in commitlog order. Hash collisions are dropped here."""
        index = self.index
        if index is None:
            return QueryMessageResult([], 0, 0)
        phys, last_ts, last_phy = index.query(topic, key, min(max_num, MAX_MSGS_NUM_BATCH), begin, end)
        records: list[bytes] = []
        for phy in sorted(set(phys)):
            data = self.commitlog.look_message(phy)
            if data is None:
                continue  # deleted by retention, or cut by an HA truncation
            _size, rec_topic, _qid, _qoff, _flag, _ts, props = dispatch_fields(data, 0)
            if rec_topic != topic:
                continue
            keys = get_property(props, KEYS)
            if get_property(props, UNIQ_KEY) == key or (keys is not None and key in keys.split(" ")):
                records.append(data)
        return QueryMessageResult(records, last_ts, last_phy)

    def look_message_by_offset(self, phy_offset: int) -> bytes | None:
        """The raw record at a commitlog offset (VIEW_MESSAGE_BY_ID, send-back), or ``None``."""
        return self.commitlog.look_message(phy_offset)

    def get_commitlog_data(self, offset: int, length: int) -> bytes:
        """Raw commitlog bytes, clipped to what is written."""
        return self.commitlog.get_data(offset, length)

    def read_commitlog(self, offset: int, max_len: int) -> memoryview | None:
        """Zero-copy raw bytes from ``offset`` within one segment (HA transfer frames)."""
        return self.commitlog.read_range(offset, max_len)

    def max_phy_offset(self) -> int:
        return self.commitlog.max_offset()

    def min_phy_offset(self) -> int:
        return self.commitlog.min_offset()

    def flushed_phy_offset(self) -> int:
        return self.commitlog.flushed_offset()

    def topic_queue_table(self) -> Mapping[str, int]:
        """Live ``"topic-queueId"`` -> next queue offset map (do not mutate)."""
        return self.commitlog.topic_queue_table

    def list_queues(self, topic: str | None = None) -> list[tuple[str, int]]:
        """Existing consume queues as ``(topic, queue_id)``, optionally for one topic."""
        if topic is not None:
            return [(topic, qid) for qid in sorted(self._cqs.get(topic, {}))]
        return [(t, qid) for t in sorted(self._cqs) for qid in sorted(self._cqs[t])]

    def get_consume_queue_units(self, topic: str, queue_id: int, offset: int,
                                count: int) -> list[tuple[int, int, int]]:
        """Raw ``(phy offset, size, tagsCode)`` units from a logical offset (schedule service)."""
        cq = self._find_cq(topic, queue_id)
        if cq is None or offset < cq.min_offset():
            return []
        return cq.get_units(offset, count)

    def queue_message_bytes(self, topic: str, queue_id: int, begin: int, end: int) -> tuple[int, int]:
        """``(bytes, messages)`` of the messages at logical offsets ``[begin, end)`` still held by
        the queue (statistics: TOPIC_PUT_SIZE)."""
        cq = self._find_cq(topic, queue_id)
        if cq is None:
            return 0, 0
        begin = max(begin, cq.min_offset())
        if begin >= end:
            return 0, 0
        return cq.sum_sizes(begin, end - begin)

    def delay_level_ms(self, level: int) -> int:
        """Delay of a 1-based level, clamped to the configured levels."""
        return self._delay_levels[max(1, min(level, self._max_delay_level)) - 1]

    @property
    def max_delay_level(self) -> int:
        return self._max_delay_level

    # ==================================================================== HA / maintenance ===
    @property
    def role(self) -> str:
        return self._role

    def set_role(self, role: str) -> None:
        """Promotion/demotion at runtime: a SLAVE refuses puts and leaves pull offsets alone."""
        if role not in ROLES:
            raise StoreConfigError(f"broker role must be one of {', '.join(ROLES)}, got {role!r}")
        self._role = role
        self._update_writable()

    @property
    def disk_full(self) -> bool:
        return self._disk_full

    def set_disk_full(self, full: bool) -> None:
        """The retention service's verdict on the disk: while full, puts get SERVICE_NOT_AVAILABLE."""
        self._disk_full = full
        self._update_writable()

    @property
    def term_fenced(self) -> bool:
        return self._term_fenced

    def set_term_fenced(self, fenced: bool) -> None:
        """A master serving in an epoch another broker began: while set, puts get
        SERVICE_NOT_AVAILABLE (one term has one writer, or two logs diverge within it)."""
        self._term_fenced = fenced
        self._update_writable()

    def _update_writable(self) -> None:
        # Puts need a running store, a master role of its own term and room on the disk.
        self._writable = self._running and self._role != SLAVE_ROLE and not self._disk_full and not self._term_fenced

    def dispatched_phy_offset(self) -> int:
        """End of the last whole record in consume queues; always a record boundary.

        Equal to :meth:`max_phy_offset` except on a slave whose replicated tail stops inside a
        record (the rest has not arrived yet).
        """
        return self._reput_offset

    def append_raw(self, phy_offset: int, data: bytes | bytearray | memoryview, *, dispatch: bool = True) -> int:
        """Append replicated commitlog bytes (slave side); returns the new max physical offset.

        With ``dispatch`` every record now complete gets its consume-queue unit at once; without
        it the caller runs :meth:`dispatch_some` later (RocketMQ's reput service also trails the
        commitlog), which lets a catching-up slave take bytes at socket speed. Raises
        :class:`StoreError` if ``phy_offset`` does not continue the log.
        """
        if not self._running:
            raise StoreError("store is not running")
        was_empty = self.commitlog.max_offset() == 0
        new_max = self.commitlog.append_raw(phy_offset, data)
        if was_empty:
            self._reput_offset = phy_offset
        if dispatch:
            self._reput_offset = self._dispatch_from(self._reput_offset)
            if self._dispatch_error is not None:
                # Stored; its consume-queue units follow with a later dispatch_some().
                exc, self._dispatch_error = self._dispatch_error, None
                self.note_no_space("consume queues", exc)
        return new_max

    def reserve_raw(self, phy_offset: int, n: int) -> list[tuple[MappedFile, int, int]]:
        """Plan a replicated append written elsewhere (see :meth:`CommitLog.reserve_raw`)."""
        if not self._running:
            raise StoreError("store is not running")
        if self.commitlog.max_offset() == 0 and not self.commitlog.raw_pending:
            # An empty log starts wherever the master's stream starts.
            self._reput_offset = phy_offset
        return self.commitlog.reserve_raw(phy_offset, n)

    def raw_segment(self, phy_offset: int) -> MappedFile:
        """Segment for a replicated append copied in by the caller (see :meth:`CommitLog.raw_segment`)."""
        if not self._running:
            raise StoreError("store is not running")
        if self.commitlog.max_offset() == 0 and not self.commitlog.raw_pending:
            # An empty log starts wherever the master's stream starts.
            self._reput_offset = phy_offset
        return self.commitlog.raw_segment(phy_offset)

    def commit_raw(self, end: int) -> None:
        """Replicated bytes up to ``end`` are written; consume queues follow via :meth:`dispatch_some`."""
        self.commitlog.commit_raw(end)

    def dispatch_behind(self) -> int:
        """Commitlog bytes not yet dispatched into consume queues."""
        return self.commitlog.max_offset() - self._reput_offset

    def dispatch_some(self, budget: int | None = None) -> int:
        """Dispatch up to ``budget`` bytes of complete records (all when None); bytes still behind.

        Raises :class:`StoreFullError` when a consume queue has no room for a unit (dispatch stops
        before that record and goes on from it next time)."""
        self._reput_offset = self._dispatch_from(self._reput_offset, budget)
        self._raise_dispatch_error()
        return self.dispatch_behind()

    def truncate_to(self, phy_offset: int) -> None:
        """Cut the commitlog at ``phy_offset`` and drop consume-queue units beyond it (HA).

        ``phy_offset`` must be a record boundary (e.g. :meth:`dispatched_phy_offset`); the bytes
        after it are zeroed so they can never be mistaken for records later.
        """
        log.warning("truncating the commitlog from %d to %d", self.commitlog.max_offset(), phy_offset)
        self.commitlog.truncate_to(phy_offset)
        end = self.commitlog.max_offset()
        if self.index is not None:
            self.index.truncate(end)
        if self._index_gap >= end:
            self._index_gap = -1  # the records it left unindexed are cut
            index_gap.clear(self.config.index_gap_path)
            self._index_gap_saved = -1
        # Offsets past the cut will hold another log's records (the new master's).
        clamped = {topic: min(deleted_end, end) for topic, deleted_end in self._deleted.items()}
        if clamped != self._deleted:
            self._deleted = clamped
            deleted_topics.save(self.config.deleted_topics_path, clamped)
        table = self.commitlog.topic_queue_table
        for topic, queues in self._cqs.items():
            for qid, cq in queues.items():
                cq.truncate_beyond_phy(end)
                key = f"{topic}-{qid}"
                if cq.max_offset() > 0:
                    table[key] = cq.max_offset()
                else:
                    table.pop(key, None)
        self._reput_offset = min(self._reput_offset, end)

    async def delete_topic_queues(self, topic: str) -> bool:
        """A deleted topic's consume queues go, files included, and its queue offsets restart at
        0 (RocketMQ's cleanUnusedTopic); never while a flush thread writes them. Whether the topic
        had any. Its messages stay in the commitlog until retention removes them."""
        async with self._cq_io:
            # First where its records end, durably: a crash after this point cannot bring the
            # queues back (re-dispatch skips those records), whatever the files still hold. Never
            # below a point already known (a slave that learnt its master's point, further on).
            end = max(self.commitlog.max_offset(), self._deleted.get(topic, -1))
            if self._deleted.get(topic) != end:
                self._deleted[topic] = end
                await asyncio.to_thread(deleted_topics.save, self.config.deleted_topics_path, dict(self._deleted))
            if topic not in self._cqs:
                return False
            self.delete_consume_queue(topic)
        log.info("consume queues of deleted topic %s removed (its records end before %d)", topic, end)
        return True

    def deleted_topics(self) -> dict[str, int]:
        """Deleted topics and where this log ended when each was deleted."""
        return dict(self._deleted)

    async def apply_topic_deletions(self, deletions: Mapping[str, int]) -> list[str]:
        """A slave learns its master's deletions (topic -> the master's log end then). For each it
        had not applied that far: records before the point never reach a queue again, queues
        holding only such records go, and a queue already written by the topic created again
        stays, its queue offset where its units end. The topics whose queues changed."""
        async with self._cq_io:
            fresh = {topic: end for topic, end in deletions.items() if end > self._deleted.get(topic, -1)}
            if not fresh:
                return []
            # Durable first, as in delete_topic_queues: re-dispatch after a crash skips them too.
            self._deleted.update(fresh)
            await asyncio.to_thread(deleted_topics.save, self.config.deleted_topics_path, dict(self._deleted))
            table = self.commitlog.topic_queue_table
            changed: list[str] = []
            for topic, end in sorted(fresh.items()):
                if topic not in self._cqs:
                    continue
                changed.append(topic)
                self._drop_queues(topic, ending_by=end)
                for qid, cq in self._cqs.get(topic, {}).items():
                    table[f"{topic}-{qid}"] = cq.max_offset()
            if changed:
                log.info("deletions learnt from the master applied to the consume queues of %s", ", ".join(changed))
            return changed

    async def clean_expired_consume_queues(self) -> list[str]:
        """mqadmin cleanExpiredCQ (RocketMQ's cleanExpiredConsumerQueue): queues whose every record
        retention has deleted go, files and queue offsets included (a later message in one starts
        at offset 0 again); never the schedule topic's. ``topic-queueId`` of each queue dropped."""
        async with self._cq_io:
            min_phy = self.commitlog.min_offset()
            dropped: list[str] = []
            for topic in sorted(self._cqs):
                if topic != SCHEDULE_TOPIC:
                    dropped += [f"{topic}-{qid}" for qid in self._drop_queues(topic, ending_by=min_phy)]
        if dropped:
            log.info("expired consume queues removed: %s", ", ".join(dropped))
        return dropped

    def _drop_queues(self, topic: str, ending_by: int) -> list[int]:
        """Destroy ``topic``'s written queues whose last record ends by commitlog offset
        ``ending_by``, and their queue offsets; their ids. The caller holds ``_cq_io`` (no flush
        thread writes them meanwhile)."""
        dropped = [qid for qid, cq in sorted(self._cqs.get(topic, {}).items())
                   if cq.max_offset() > 0 and cq.max_phy_end <= ending_by]
        self._destroy_queues(topic, dropped)
        return dropped

    def _destroy_queues(self, topic: str, queue_ids: list[int]) -> None:
        queues = self._cqs.get(topic, {})
        table = self.commitlog.topic_queue_table
        for qid in queue_ids:
            queues.pop(qid).destroy()
            table.pop(f"{topic}-{qid}", None)
        if not queues:
            self._cqs.pop(topic, None)

    # ============================================================================== retention ===
    def deletable_commitlog_files(self) -> list[Path]:
        """Segments retention may delete, oldest first: never the last one, and only wholly
        written, flushed and dispatched ones (a slave's receiver and the flusher are done with them)."""
        files = self.commitlog.mfq.files
        safe_end = min(self._reput_offset, self.commitlog.flushed_offset(), self.commitlog.max_offset())
        out: list[Path] = []
        for mf in files[:-1]:
            if mf.file_end_offset > safe_end:
                break
            out.append(mf.path)
        return out

    async def delete_first_commitlog_file(self, path: Path) -> bool:
        """Delete the oldest segment if it is still ``path`` and still deletable; whether it went.

        It leaves the queue on this thread, so no reader finds it any more; unmapping and unlinking
        (slow for a large file) happen in a worker thread. Readers still holding a view keep the
        mapping alive until they drop it; the HA sender works on duplicated descriptors.
        """
        deletable = self.deletable_commitlog_files()
        if not deletable or deletable[0] != path:
            return False
        mfq = self.commitlog.mfq
        mf = mfq.files.pop(0)
        await asyncio.to_thread(mf.destroy)
        return True

    async def clean_consume_queues(self) -> int:
        """Drop consume-queue files whose units all point below the commitlog's start and move every
        queue's min offset past units whose records are gone; the number of files deleted.

        Nothing to do while the commitlog's start has not moved since the last call.
        """
        min_phy = self.commitlog.min_offset()
        if min_phy <= self._cq_clean_min:
            return 0
        gone: list[MappedFile] = []
        index_gone: list[IndexFile] = []
        async with self._cq_io:
            for queues in self._cqs.values():
                for cq in queues.values():
                    gone.extend(cq.detach_files_below(min_phy))
            if self.index is not None:
                index_gone = self.index.detach_expired(min_phy)
            if gone or index_gone:
                await asyncio.to_thread(_destroy_all, [*gone, *index_gone])
        # Deleted topics whose records are all gone need no protection from re-dispatch any more.
        kept = {topic: end for topic, end in self._deleted.items() if end > min_phy}
        if kept != self._deleted:
            self._deleted = kept
            await asyncio.to_thread(deleted_topics.save, self.config.deleted_topics_path, dict(kept))
        self._cq_clean_min = min_phy
        if gone or index_gone:
            log.info("retention deleted %d consume-queue and %d index file(s) below commitlog offset %d",
                     len(gone), len(index_gone), min_phy)
        return len(gone)

    def delete_consume_queue(self, topic: str) -> None:
        """Forget a topic's consume queues (files included) and its queue offsets."""
        self._destroy_queues(topic, list(self._cqs.get(topic, {})))


def _flush_index_file(f: IndexFile, checkpoint: StoreCheckpoint) -> None:
    try:
        f.flush()
    except StoreError:
        log.exception("flushing full index file %s failed", f.path)
        return
    checkpoint.index_msg_timestamp = max(checkpoint.index_msg_timestamp, f.end_ts)


def _destroy_all(files: list[MappedFile | IndexFile]) -> None:
    for mf in files:
        mf.destroy()


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)


def _parse_int(value: str | None) -> int:
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        return 0
