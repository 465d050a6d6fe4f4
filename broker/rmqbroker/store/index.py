"""Index files (§4.5): RocketMQ's on-disk hash index of message keys, read by QUERY_MESSAGE (12).

Every indexed message adds one entry per key: its unique key (``UNIQ_KEY``, the client's message
id) and each space-separated token of ``KEYS``, each as ``topic#key``. A file holds a fixed table
of hash slots, each pointing at the newest entry with that slot, and entries that chain to the
previous entry of their slot. Files are named by their creation time (``yyyyMMddHHmmssSSS``) under
``<storePathRootDir>/index/`` and a new one starts when the last is full. Entries store the record's
commitlog offset and its store time in seconds since the file's first entry, so a query walks the
files newest first and stops at its time range's start.

Lookups are by hash: a query can return records of other keys that share a hash; RocketMQ's clients
filter those out, and so does ``rmq-admin``.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import struct
import time
from pathlib import Path

from rmqbroker.store.errors import StoreError
from rmqbroker.store.mapped_file import TMP_SUFFIX, create_sized, make_room, plenty_free, reserve_blocks, reserve_step
from rmqbroker.store.record import java_string_hash

log = logging.getLogger(__name__)

# Header: 0 beginTimestamp q | 8 endTimestamp q | 16 beginPhyOffset q | 24 endPhyOffset q |
#         32 hashSlotCount i | 36 indexCount i
HEADER = struct.Struct(">qqqqii")
HEADER_SIZE = HEADER.size  # 40
# Slot: 0 index number of the newest entry in this slot i (0 = empty)
SLOT = struct.Struct(">i")
SLOT_SIZE = SLOT.size  # 4
# Entry: 0 keyHash i | 4 commitlog offset q | 12 store time - beginTimestamp, seconds i | 16 prevIndex i
ENTRY = struct.Struct(">iqii")
ENTRY_SIZE = ENTRY.size  # 20
_INT_MAX = 0x7FFFFFFF
_PAGE = mmap.PAGESIZE
_NAME = re.compile(r"^\d{17}$")


def key_hash(key: str) -> int:
    """RocketMQ's indexKeyHashMethod: ``abs(String.hashCode())``, with Integer.MIN_VALUE as 0."""
    h = java_string_hash(key)
    return 0 if h == -(1 << 31) else abs(h)


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


def file_name(millis: int) -> str:
    """``yyyyMMddHHmmssSSS`` in local time, as RocketMQ names index files."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(millis / 1000)) + f"{millis % 1000:03d}"


class IndexFile:
    """One index file, mapped read/write. Single writer (the event loop)."""

    __slots__ = ("_entries_reserved", "_entry_step", "_fd", "_slot_pages", "begin_phy", "begin_ts", "count",
                 "end_phy", "end_ts", "file_size", "index_num", "mm",
                 "path", "slot_count", "slot_num")

    def __init__(self, path: Path, slot_num: int, index_num: int, *, create: bool) -> None:
        self.path = path
        self.slot_num = slot_num
        self.index_num = index_num
        self.file_size = HEADER_SIZE + slot_num * SLOT_SIZE + index_num * ENTRY_SIZE
        try:
            fd = create_sized(path, self.file_size) if create else os.open(path, os.O_RDWR)
        except OSError as exc:
            raise StoreError(f"cannot {'create' if create else 'open'} index file {path}: {exc}") from exc
        try:
            if not create and os.fstat(fd).st_size != self.file_size:
                raise StoreError(f"index file {path} is {os.fstat(fd).st_size} bytes, not the {self.file_size} "
                                 "that maxHashSlotNum/maxIndexNum give")
            self.mm = mmap.mmap(fd, self.file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        # Blocks are reserved before an entry or slot is written (see mapped_file.reserve_blocks):
        # the slots page by page as the hash first touches each (what writing them would allocate
        # anyway), the entries a step ahead, as they are appended in order.
        self._slot_pages = bytearray((HEADER_SIZE + slot_num * SLOT_SIZE + _PAGE - 1) // _PAGE)
        self._entries_reserved = 0
        self._entry_step = reserve_step(index_num * ENTRY_SIZE)
        if create:
            try:
                self._reserve_slot_page(0)  # the header's page
            except BaseException:
                self.destroy()  # a file without its header would stop the next start
                raise
            self.begin_ts = self.end_ts = self.begin_phy = self.end_phy = 0
            self.slot_count = 0
            self.count = 1  # entry 0 is never used: slot value 0 means "empty"
            self._write_header()
        else:
            (self.begin_ts, self.end_ts, self.begin_phy, self.end_phy, self.slot_count,
             self.count) = HEADER.unpack_from(self.mm, 0)
            if not 1 <= self.count <= index_num + 1:
                raise StoreError(f"index file {path} has an impossible entry count {self.count}")

    def __repr__(self) -> str:
        return f"IndexFile({self.path.name}, entries={self.count - 1}, phy=[{self.begin_phy}, {self.end_phy}])"

    @property
    def is_full(self) -> bool:
        return self.count >= self.index_num

    def _write_header(self) -> None:
        HEADER.pack_into(self.mm, 0, self.begin_ts, self.end_ts, self.begin_phy, self.end_phy, self.slot_count,
                         self.count)

    def _reserve_slot_page(self, page: int) -> None:
        start = page * _PAGE
        if not plenty_free(self._fd):  # else a check: the page is written right after
            reserve_blocks(self._fd, start, min(_PAGE, self.file_size - start), self.path)
        self._slot_pages[page] = 1

    def _reserve_entries(self, end: int) -> None:
        start = max(self._entries_reserved, (end - ENTRY_SIZE) & ~(_PAGE - 1))
        size = self.file_size
        covered = make_room(self._fd, self.path, start, end, min(size, max(end, start + self._entry_step)),
                            min(size, max(end, start + (self._entry_step >> 4))))
        if covered < 0:  # this filesystem cannot reserve: never asked again
            covered = size
            self._slot_pages[:] = b"\x01" * len(self._slot_pages)
        self._entries_reserved = covered

    def put(self, khash: int, phy: int, store_ts: int) -> None:
        """Add an entry (the service starts a new file before this one is full)."""
        if self.count >= self.index_num:
            raise StoreError(f"index file {self.path.name} is full")
        mm = self.mm
        slot_pos = HEADER_SIZE + (khash % self.slot_num) * SLOT_SIZE
        idx = self.count
        entry_pos = HEADER_SIZE + self.slot_num * SLOT_SIZE + idx * ENTRY_SIZE
        # Room first (StoreFullError with nothing written), then the writes.
        if entry_pos + ENTRY_SIZE > self._entries_reserved:
            self._reserve_entries(entry_pos + ENTRY_SIZE)
        if not self._slot_pages[slot_pos // _PAGE]:
            self._reserve_slot_page(slot_pos // _PAGE)
        prev = SLOT.unpack_from(mm, slot_pos)[0]
        if prev <= 0 or prev > self.count:
            prev = 0
        if idx <= 1:
            # The first entry sets the file's time base (a new file carried the last one's end).
            self.begin_phy = phy
            self.begin_ts = store_ts
        diff = min(max((store_ts - self.begin_ts) // 1000, 0), _INT_MAX)
        ENTRY.pack_into(mm, entry_pos, khash, phy, diff, prev)
        SLOT.pack_into(mm, slot_pos, idx)
        if prev == 0:
            self.slot_count += 1
        self.count = idx + 1
        self.end_phy = phy
        self.end_ts = store_ts
        # The header goes with every entry: a crashed process leaves a file that loads as it was.
        self._write_header()

    def trailing_entries(self, phy: int) -> int:
        """How many of the newest entries point at the record at ``phy``."""
        base = HEADER_SIZE + self.slot_num * SLOT_SIZE
        n = 0
        idx = self.count - 1
        while idx >= 1 and ENTRY.unpack_from(self.mm, base + idx * ENTRY_SIZE)[1] == phy:
            n += 1
            idx -= 1
        return n

    def time_overlaps(self, begin: int, end: int) -> bool:
        return (begin < self.begin_ts and end > self.end_ts) or self.begin_ts <= begin <= self.end_ts \
            or self.begin_ts <= end <= self.end_ts

    def select(self, khash: int, max_num: int, begin: int, end: int, out: list[int]) -> None:
        """Append the commitlog offsets of entries with this hash stored in ``[begin, end]`` (ms),
        newest first, until ``out`` holds ``max_num``."""
        mm = self.mm
        count = self.count
        if count <= 1:
            return
        slot_pos = HEADER_SIZE + (khash % self.slot_num) * SLOT_SIZE
        # A slot no entry ever used may lie in a hole of the sparse file: read with a system call,
        # since on tmpfs a fault there allocates a page, a SIGBUS when the disk is full.
        raw = os.pread(self._fd, SLOT_SIZE, slot_pos) if not self._slot_pages[slot_pos // _PAGE] else None
        idx = SLOT.unpack(raw)[0] if raw is not None else SLOT.unpack_from(mm, slot_pos)[0]
        if idx <= 0 or idx >= count:
            return
        base = HEADER_SIZE + self.slot_num * SLOT_SIZE
        while len(out) < max_num:
            h, phy, diff, prev = ENTRY.unpack_from(mm, base + idx * ENTRY_SIZE)
            if diff < 0:
                break
            stored = self.begin_ts + diff * 1000
            # Times are kept in whole seconds: an entry can read as up to 999 ms older than it is.
            if h == khash and begin - 999 <= stored <= end:
                out.append(phy)
            if prev <= 0 or prev >= count or prev >= idx or stored < begin - 999:
                break
            idx = prev

    def flush(self) -> None:
        """Blocking; run in a worker thread."""
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            if exc.errno != errno.EBADF:
                raise StoreError(f"fdatasync of {self.path} failed: {exc}") from exc

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:
            log.debug("index file %s still has exported views; unmapping deferred", self.path)
        try:
            os.close(self._fd)
        except OSError:
            pass

    def destroy(self) -> None:
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class IndexService:
    """The index files of one store: built as records are dispatched, queried newest first."""

    def __init__(self, directory: Path, slot_num: int, index_num: int) -> None:
        if slot_num <= 0 or index_num <= 1:
            raise StoreError("maxHashSlotNum must be positive and maxIndexNum above 1")
        self.directory = directory
        self.slot_num = slot_num
        self.index_num = index_num
        self.files: list[IndexFile] = []
        # Commitlog offset of the newest indexed record (-1: none).
        self.end_phy = -1
        # Indexing again after a machine crash: the record at this offset already has this many of
        # its keys in the last file kept (its other keys went to a file that was dropped).
        self._resume_phy = -1
        self._resume_keys = 0

    def load(self, commitlog_end: int, *, durable_until_ts: int | None = None) -> int | None:
        """Map the existing files, oldest first. Files that begin at or beyond the recovered commitlog
        end index records that are gone (lost with an OS crash): they are deleted.

        ``durable_until_ts`` is given after a crash of the machine, with the checkpoint's index time:
        only a file known to be written back whole (full, and flushed up to that time) can be
        trusted, because a lost slot page cuts every chain through it and a lost entry page breaks
        the chains that lead to it. From the first file that is not, files are deleted, and the
        commitlog offset from which records must be indexed again is returned (``None``: nothing).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob("*" + TMP_SUFFIX):
            leftover.unlink(missing_ok=True)
        machine_crash = durable_until_ts is not None
        rebuild_from: int | None = None
        for name in sorted(p.name for p in self.directory.iterdir() if _NAME.match(p.name)):
            if rebuild_from is not None:
                log.warning("index file %s was written after the last one known durable; rebuilding it", name)
                (self.directory / name).unlink(missing_ok=True)
                continue
            try:
                f = IndexFile(self.directory / name, self.slot_num, self.index_num, create=False)
            except StoreError as exc:
                if machine_crash:
                    log.warning("%s; rebuilding the index from there", exc)
                    (self.directory / name).unlink(missing_ok=True)
                    rebuild_from = self._rebuild_start(None)
                    continue
                self._set_aside(name, exc)
                continue
            if f.count > 1 and f.begin_phy >= commitlog_end:
                log.warning("index file %s starts at %d, beyond the commitlog end %d; deleting it", name,
                            f.begin_phy, commitlog_end)
                f.destroy()
                continue
            if durable_until_ts is not None and not (f.is_full and f.end_ts <= durable_until_ts):
                log.warning("the machine crashed while %s was written (entries up to %d ms, checkpoint at %d ms): "
                            "rebuilding it from the commitlog", name, f.end_ts, durable_until_ts)
                rebuild_from = self._rebuild_start(f)
                f.destroy()
                continue
            self.files.append(f)
        self.end_phy = max((f.end_phy for f in self.files if f.count > 1), default=-1)
        if rebuild_from is not None:
            self.end_phy = rebuild_from - 1
        if self.end_phy >= commitlog_end:
            # Entries for records the commitlog lost (an index page reached the disk before the
            # records it points at): records written there from now on are indexed again, and
            # lookups drop the stale entries, whose records do not hold the key.
            log.warning("the index reaches commitlog offset %d, beyond the recovered end %d", self.end_phy,
                        commitlog_end)
            self.end_phy = commitlog_end - 1
            if self._resume_phy >= commitlog_end:
                self._resume_phy = -1
        return rebuild_from

    def _rebuild_start(self, first_dropped: IndexFile | None) -> int:
        """Where indexing starts again when the files from ``first_dropped`` on are dropped: at the
        last kept file's newest record (its keys may continue in the dropped file, and those it
        holds are not indexed twice), else where the dropped file began, else at the log's start."""
        if self.files:
            last = self.files[-1]
            self._resume_phy = last.end_phy
            self._resume_keys = last.trailing_entries(last.end_phy)
            return last.end_phy
        if first_dropped is not None and first_dropped.count > 1:
            return first_dropped.begin_phy
        return 0

    def _set_aside(self, name: str, exc: StoreError) -> None:
        # The commitlog is the truth and the index only a lookup aid: a broker must not stay
        # down for it. The file is kept aside for inspection; its messages are not found by key.
        aside = self.directory / (name + ".unusable")
        n = 1
        while aside.exists():  # one set aside before under the same name: keep both
            n += 1
            aside = self.directory / f"{name}.unusable.{n}"
        log.error("%s; moving it aside to %s (queries miss the messages it indexed)", exc, aside.name)
        os.replace(self.directory / name, aside)

    def _writable_file(self) -> IndexFile:
        last = self.files[-1] if self.files else None
        if last is not None and not last.is_full:
            return last
        millis = int(time.time() * 1000)
        path = self.directory / file_name(millis)
        # Names must sort in creation order (a full file can be younger than a millisecond).
        while path.exists() or (last is not None and path.name <= last.path.name):
            millis += 1
            path = self.directory / file_name(millis)
        self.directory.mkdir(parents=True, exist_ok=True)
        f = IndexFile(path, self.slot_num, self.index_num, create=True)
        if last is not None:
            # A new file continues where the full one ended, as RocketMQ's does.
            f.begin_phy = f.end_phy = last.end_phy
            f.begin_ts = f.end_ts = last.end_ts
            f._write_header()
        self.files.append(f)
        return f

    def build(self, phy: int, topic: str, store_ts: int, uniq_key: str | None, keys: str | None) -> list[IndexFile]:
        """Index one record's keys; returns files that became full (the caller flushes them).

        A record at or before the newest indexed one is skipped: re-dispatch after a restart.
        """
        if phy <= self.end_phy:
            return []
        full: list[IndexFile] = []
        skip = 0
        if phy == self._resume_phy:
            skip = self._resume_keys
            self._resume_phy = -1
            self.end_phy = phy
        if uniq_key:
            if skip:
                skip -= 1
            else:
                self._put(build_key(topic, uniq_key), phy, store_ts, full)
        if keys:
            for key in keys.split(" "):
                if key:
                    if skip:
                        skip -= 1
                    else:
                        self._put(build_key(topic, key), phy, store_ts, full)
        return full

    def _put(self, key: str, phy: int, store_ts: int, full: list[IndexFile]) -> None:
        khash = key_hash(key)
        f = self._writable_file()
        f.put(khash, phy, store_ts)
        if f.is_full:
            full.append(f)
        self.end_phy = phy

    def query(self, topic: str, key: str, max_num: int, begin: int, end: int) -> tuple[list[int], int, int]:
        """Commitlog offsets of records indexed under ``topic#key`` stored in ``[begin, end]`` (ms),
        newest first, at most ``max_num``; with the last file's end time and offset."""
        out: list[int] = []
        last_ts, last_phy = (self.files[-1].end_ts, self.files[-1].end_phy) if self.files else (0, 0)
        khash = key_hash(build_key(topic, key))
        for f in reversed(self.files):
            if f.count > 1 and f.time_overlaps(begin, end):
                f.select(khash, max_num, begin, end, out)
            if f.begin_ts < begin or len(out) >= max_num:
                break
        return out, last_ts, last_phy

    def detach_expired(self, min_phy: int) -> list[IndexFile]:
        """Take out the files (never the last) whose entries all point below ``min_phy``."""
        n = 0
        while n < len(self.files) - 1 and self.files[n].end_phy < min_phy:
            n += 1
        gone = self.files[:n]
        del self.files[:n]
        return gone

    def truncate(self, end: int) -> None:
        """The commitlog was cut at ``end`` (HA): files that begin beyond go; records written there
        from now on are indexed again. Older entries past ``end`` stay in the straddling file; they
        carry their old key's hash, so lookups of other keys never match them and readers drop
        what does not hold the key they asked for."""
        while self.files and self.files[-1].count > 1 and self.files[-1].begin_phy >= end:
            self.files.pop().destroy()
        self.end_phy = min(self.end_phy, end - 1)
        self._resume_phy = -1

    def flush(self) -> None:
        """Blocking; run in a worker thread."""
        for f in list(self.files):
            f.flush()

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []
