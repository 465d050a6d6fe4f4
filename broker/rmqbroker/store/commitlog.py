"""The commitlog (§3.1, §4.1): every message of every topic appended to one sequence of segments.

Owns physical offsets, store timestamps, queue-offset assignment (the ``topic-queueId`` table),
segment rolling with the end-of-file blank marker, raw appends from an HA master, reads, and
the recovery scan that finds the valid end after a restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

from rmqbroker.store.errors import CorruptRecordError, StoreError
from rmqbroker.store.mapped_file import MappedFile, MappedFileQueue
from rmqbroker.store.record import (
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_SIZE,
    body_crc,
    check_record,
    peek_size_magic,
    record_header_fields,
    write_blank,
    write_record_into,
)

log = logging.getLogger(__name__)


class CommitLog:
    """Append-only record log over a :class:`MappedFileQueue`.

    All mutating methods run on the event-loop thread; :meth:`flush` may run in a worker thread.
    """

    def __init__(self, directory: Path, file_size: int) -> None:
        self.mfq = MappedFileQueue(directory, file_size)
        self.file_size = file_size
        # "topic-queueId" -> next consume-queue logical offset.
        self.topic_queue_table: dict[str, int] = {}
        # Store time of the newest record appended (0 until the first one).
        self.last_store_timestamp = 0
        # Number of fdatasync rounds, for tests and metrics.
        self.flush_count = 0
        self._last: MappedFile | None = None
        # End of bytes reserved for a replicated append but not yet committed (None: nothing pending).
        self._raw_end: int | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def load(self) -> None:
        """Map the existing segments; a segment of the wrong size raises :class:`StoreConfigError`."""
        self.mfq.load(strict=True)
        self._last = self.mfq.last_file

    def close(self) -> None:
        self.mfq.close()
        self._last = None

    # -- offsets ---------------------------------------------------------------------------------
    def min_offset(self) -> int:
        return self.mfq.min_offset()

    def max_offset(self) -> int:
        last = self._last
        return last.file_from_offset + last.wrote_position if last is not None else 0

    def flushed_offset(self) -> int:
        return self.mfq.flushed_offset()

    def roll_next_file(self, offset: int) -> int:
        """Start offset of the segment after the one containing ``offset``."""
        return offset + self.file_size - offset % self.file_size

    # -- appends ---------------------------------------------------------------------------------
    def _file_for(self, size: int) -> tuple[MappedFile, int]:
        """Segment and position where ``size`` bytes go, rolling (with a blank marker) if needed."""
        mf = self._last
        if mf is None or mf.wrote_position >= self.file_size:
            mf = self.mfq.get_last_file()
            self._last = mf
        pos = mf.wrote_position
        if pos + size + END_FILE_MIN_BLANK_LENGTH > self.file_size:
            if pos + 8 > mf.reserved:
                mf.reserve(pos + 8)  # the marker's size and magic code
            write_blank(mf.mm, pos, self.file_size - pos)
            mf.wrote_position = self.file_size
            mf = self.mfq.get_last_file()
            self._last = mf
            pos = 0
        return mf, pos

    # Positional on purpose: one call per stored message.
    def append_message(
        self,
        topic: str,
        queue_id: int,
        flag: int,
        body: bytes,
        tail: bytes,
        size: int,
        sys_flag: int,
        born_timestamp: int,
        born_ip: bytes,
        born_port: int,
        store_ip: bytes,
        store_port: int,
        reconsume_times: int,
        prepared_transaction_offset: int,
        assign_queue_offset: bool,
    ) -> tuple[int, int, int]:
        """Append one record; returns ``(physical offset, queue offset, store timestamp)``.

        ``size`` must be :func:`~rmqbroker.store.record.record_size` of the record and the caller
        must have checked that it fits an empty segment.  Prepared/rollback transactional records
        (``assign_queue_offset=False``) get queue offset 0 and do not advance the table.
        """
        mf = self._last
        if mf is not None and (pos := mf.wrote_position) + size + END_FILE_MIN_BLANK_LENGTH <= self.file_size:
            pass  # fast path: fits the current segment
        else:
            mf, pos = self._file_for(size)
        if pos + size > mf.reserved:
            mf.reserve(pos + size)  # StoreFullError when the disk is full: nothing written
        key = f"{topic}-{queue_id}"
        table = self.topic_queue_table
        queue_offset = table.get(key, 0) if assign_queue_offset else 0
        phy = mf.file_from_offset + pos
        store_ts = time.time_ns() // 1_000_000
        write_record_into(
            mf.mm, pos, size, body_crc(body), queue_id, flag, queue_offset, phy, sys_flag,
            born_timestamp, born_ip, born_port, store_ts, store_ip, store_port, reconsume_times,
            prepared_transaction_offset, body, tail,
        )
        mf.wrote_position = pos + size
        if assign_queue_offset:
            table[key] = queue_offset + 1
        self.last_store_timestamp = store_ts
        return phy, queue_offset, store_ts

    def append_batch(
        self,
        topic: str,
        queue_id: int,
        entries: list[tuple[int, bytes, bytes, int]],
        total_size: int,
        sys_flag: int,
        born_timestamp: int,
        born_ip: bytes,
        born_port: int,
        store_ip: bytes,
        store_port: int,
        reconsume_times: int,
    ) -> tuple[list[int], int, int]:
        """Append a batch of ``(flag, body, tail, size)`` records contiguously in one segment.

        Returns ``(physical offsets, first queue offset, store timestamp)``; queue offsets are
        consecutive.  ``total_size`` (sum of sizes) must fit an empty segment.
        """
        mf, pos = self._file_for(total_size)
        if pos + total_size > mf.reserved:
            mf.reserve(pos + total_size)
        key = f"{topic}-{queue_id}"
        first_qoff = self.topic_queue_table.get(key, 0)
        store_ts = time.time_ns() // 1_000_000
        mm = mf.mm
        base = mf.file_from_offset
        offsets: list[int] = []
        qoff = first_qoff
        for flag, body, tail, size in entries:
            phy = base + pos
            write_record_into(
                mm, pos, size, body_crc(body), queue_id, flag, qoff, phy, sys_flag,
                born_timestamp, born_ip, born_port, store_ts, store_ip, store_port, reconsume_times, 0,
                body, tail,
            )
            offsets.append(phy)
            pos += size
            qoff += 1
        mf.wrote_position = pos
        self.topic_queue_table[key] = qoff
        self.last_store_timestamp = store_ts
        return offsets, first_qoff, store_ts

    def undo_append(self, phy: int, end: int, key: str, queue_offset: int) -> None:
        """Take back the newest append, ``[phy, end)`` (its consume-queue units could not be written):
        its bytes are zeroed, the write position goes back to ``phy`` and the queue ``key``'s next
        offset to ``queue_offset``. Nothing can have read it: appends and reads share the loop."""
        mf = self.mfq.find_file(phy)
        if mf is None or mf.max_offset != end:
            raise StoreError(f"cannot take back [{phy}, {end}): it is not the newest append")
        rel = phy - mf.file_from_offset
        mf.mm[rel:rel + end - phy] = bytes(end - phy)
        mf.wrote_position = rel
        mf.flushed_position = min(mf.flushed_position, rel)
        self.topic_queue_table[key] = queue_offset

    def append_raw(self, phy_offset: int, data: bytes | bytearray | memoryview) -> int:
        """Append bytes replicated from a master at exactly ``phy_offset``; returns the new max offset.

        The bytes are copied as they are (records, blank markers and zero tails included) and may
        run into following segments.  An empty log accepts any start offset, creating the segment
        that contains it.
        """
        current = self.max_offset()
        if current == 0 and phy_offset != 0:
            # Nothing written yet: start the log where the master's stream starts.
            self.mfq.destroy()
            mf = self.mfq.create_file(phy_offset - phy_offset % self.file_size)
            mf.wrote_position = mf.flushed_position = phy_offset % self.file_size
            self._last = mf
        elif phy_offset != current:
            raise StoreError(f"raw append at {phy_offset} does not continue the commitlog at {current}")
        view = memoryview(data)
        while view:
            mf = self.mfq.get_last_file(phy_offset)
            n = mf.append(view)
            view = view[n:]
            self._last = mf
        return self.max_offset()

    def reserve_raw(self, phy_offset: int, n: int) -> list[tuple[MappedFile, int, int]]:
        """Plan a replicated append of ``n`` bytes at ``phy_offset`` without writing it.

        Returns ``(segment, position, length)`` pieces, creating segments as needed. The caller
        writes them (e.g. with ``os.pwrite`` on ``segment.fd`` in a worker thread, so receiving and
        writing overlap) and then calls :meth:`commit_raw`; until then readers don't see them.
        """
        expected = self._raw_end if self._raw_end is not None else self.max_offset()
        if expected == 0 and phy_offset != 0 and self._raw_end is None:
            # Nothing written yet: start the log where the master's stream starts.
            self.mfq.destroy()
            mf = self.mfq.create_file(phy_offset - phy_offset % self.file_size)
            mf.wrote_position = mf.flushed_position = phy_offset % self.file_size
            self._last = mf
        elif phy_offset != expected:
            raise StoreError(f"raw append at {phy_offset} does not continue the commitlog at {expected}")
        pieces: list[tuple[MappedFile, int, int]] = []
        pos, left = phy_offset, n
        while left > 0:
            found = self.mfq.find_file(pos)
            mf = found if found is not None else self.mfq.create_file(pos - pos % self.file_size)
            rel = pos - mf.file_from_offset
            k = min(left, mf.file_size - rel)
            pieces.append((mf, rel, k))
            pos += k
            left -= k
        self._raw_end = pos
        return pieces

    @property
    def raw_pending(self) -> bool:
        """Whether reserved replicated bytes are still uncommitted."""
        return self._raw_end is not None

    def commit_raw(self, end: int) -> None:
        """Bytes reserved by :meth:`reserve_raw` are written up to ``end``: make them visible."""
        for mf in reversed(self.mfq.files):
            if mf.file_from_offset >= end:
                continue
            upto = min(end - mf.file_from_offset, mf.file_size)
            if upto <= mf.wrote_position:
                break
            mf.wrote_position = upto
            if self._last is None or mf.file_from_offset >= self._last.file_from_offset:
                self._last = mf
        if self._raw_end == end:
            self._raw_end = None

    def raw_segment(self, phy_offset: int) -> MappedFile:
        """The segment that holds ``phy_offset`` for replicated bytes written elsewhere.

        Created when missing; an empty log starts at ``phy_offset``. The caller copies into
        ``segment.fd`` itself (any thread) and then calls :meth:`commit_raw` on this thread.
        """
        if self.max_offset() == 0 and phy_offset != 0 and self._raw_end is None:
            self.mfq.destroy()
            mf = self.mfq.create_file(phy_offset - phy_offset % self.file_size)
            mf.wrote_position = mf.flushed_position = phy_offset % self.file_size
            self._last = mf
            return mf
        found = self.mfq.find_file(phy_offset)
        return found if found is not None else self.mfq.create_file(phy_offset - phy_offset % self.file_size)

    # -- reads -----------------------------------------------------------------------------------
    def read(self, phy_offset: int, size: int) -> memoryview | None:
        """A view of ``size`` written bytes at ``phy_offset`` inside one segment, or ``None``."""
        mf = self.mfq.find_file(phy_offset)
        if mf is None or size <= 0:
            return None
        rel = phy_offset - mf.file_from_offset
        if rel < 0 or rel + size > mf.wrote_position:
            return None
        return memoryview(mf.mm)[rel:rel + size]

    def read_range(self, phy_offset: int, max_len: int) -> memoryview | None:
        """Written bytes from ``phy_offset`` to at most ``max_len``, never crossing a segment."""
        mf = self.mfq.find_file(phy_offset)
        if mf is None or max_len <= 0:
            return None
        rel = phy_offset - mf.file_from_offset
        end = min(mf.wrote_position, rel + max_len)
        if rel < 0 or rel >= end:
            return None
        return memoryview(mf.mm)[rel:end]

    def get_data(self, phy_offset: int, length: int) -> bytes:
        """Raw bytes ``[phy_offset, phy_offset+length)`` clipped to what is written; may cross segments."""
        parts: list[bytes] = []
        end = min(phy_offset + length, self.max_offset())
        pos = max(phy_offset, self.min_offset())
        while pos < end:
            view = self.read_range(pos, end - pos)
            if view is None:
                break
            parts.append(bytes(view))
            pos += len(view)
        return b"".join(parts)

    def look_message(self, phy_offset: int) -> bytes | None:
        """The record at ``phy_offset`` (size from its TOTALSIZE), or ``None`` if there is none."""
        mf = self.mfq.find_file(phy_offset)
        if mf is None:
            return None
        rel = phy_offset - mf.file_from_offset
        if rel < 0 or rel + 8 > mf.wrote_position:
            return None
        size, magic = peek_size_magic(mf.mm, rel)
        if magic != MESSAGE_MAGIC_CODE or size < MIN_RECORD_SIZE or rel + size > mf.wrote_position:
            return None
        return mf.mm[rel:rel + size]

    def header_fields(self, phy_offset: int) -> tuple[int, int, int, int, int] | None:
        """``(size, magic, queue_id, queue_offset, store_timestamp)`` at ``phy_offset`` if readable."""
        mf = self.mfq.find_file(phy_offset)
        if mf is None:
            return None
        rel = phy_offset - mf.file_from_offset
        if rel < 0 or rel + MIN_RECORD_SIZE > mf.wrote_position:
            return None
        return record_header_fields(mf.mm, rel)

    def pickup_store_timestamp(self, phy_offset: int, size: int) -> int:
        """Store time of the record at ``phy_offset`` if it has that size, else -1."""
        fields = self.header_fields(phy_offset)
        if fields is None or fields[0] != size or fields[1] != MESSAGE_MAGIC_CODE:
            return -1
        return fields[4]

    def iter_records(self, start: int) -> Iterator[tuple[MappedFile, int, int]]:
        """Complete records from the record boundary ``start``: ``(segment, relative pos, size)``.

        A blank end-of-file marker is yielded with size 0 (the walk continues in the next
        segment).  Stops quietly at the written end or before a record that is not complete yet
        (HA data still arriving); raises :class:`CorruptRecordError` on a malformed record.
        """
        mf = self.mfq.find_file(start)
        if mf is None:
            return
        rel = start - mf.file_from_offset
        while True:
            wrote = mf.wrote_position
            if rel + 8 > wrote:
                return
            size, magic = peek_size_magic(mf.mm, rel)
            if magic == BLANK_MAGIC_CODE:
                yield mf, rel, 0
                nxt = self.mfq.find_file(mf.file_end_offset)
                if nxt is None:
                    return
                mf, rel = nxt, 0
                continue
            if magic == MESSAGE_MAGIC_CODE and size >= MIN_RECORD_SIZE and wrote < rel + size <= mf.file_size:
                return  # the rest of this record has not arrived yet
            size = check_record(mf.mm, rel, check_crc=False, limit=wrote)
            yield mf, rel, size
            rel += size

    # -- recovery --------------------------------------------------------------------------------
    def recover(self, scan_start: int, check_crc: bool) -> int:
        """Scan records from the segment holding ``scan_start`` and cut everything after the last
        valid one (§4.3).  Returns the valid end offset; blocking, meant for start-up.
        """
        files = self.mfq.files
        if not files:
            return 0
        idx = max(0, min(len(files) - 1, (scan_start - files[0].file_from_offset) // self.file_size))
        end = files[idx].file_from_offset
        i = idx
        while i < len(files):
            mf = files[i]
            end, next_file = self._scan_segment(mf, check_crc)
            if not next_file:
                break
            i += 1
        log.info("commitlog recovered: valid end %d (scan started at %d)", end, files[idx].file_from_offset)
        self.truncate_to(end)
        for mf in self.mfq.files[idx:]:
            mf.sync_all()
            mf.flushed_position = mf.wrote_position
        return end

    def _scan_segment(self, mf: MappedFile, check_crc: bool) -> tuple[int, bool]:
        """Valid end inside ``mf`` and whether the scan continues into the next segment."""
        size_limit = self.file_size
        rel = 0
        with memoryview(mf.mm) as view:
            while rel + 8 <= size_limit:
                size, magic = peek_size_magic(view, rel)
                if size == 0 and magic == 0:
                    return mf.file_from_offset + rel, False
                try:
                    n = check_record(view, rel, check_crc)
                except CorruptRecordError as exc:
                    log.warning("commitlog recovery stops at offset %d (segment %s): %s",
                                mf.file_from_offset + rel, mf.path.name, exc)
                    return mf.file_from_offset + rel, False
                if n == 0:
                    if size != size_limit - rel:
                        log.warning("commitlog recovery stops at offset %d: blank marker claims %d bytes, "
                                    "%d are left", mf.file_from_offset + rel, size, size_limit - rel)
                        return mf.file_from_offset + rel, False
                    # A complete segment: its end (blank tail included) stays the log end even
                    # when the next segment does not exist yet, so max offsets never move backwards
                    # across restarts (an HA slave may already hold the blank tail).
                    return mf.file_end_offset, self.mfq.find_file(mf.file_end_offset) is not None
                rel += n
        log.warning("commitlog segment %s has no end-of-file marker", mf.path.name)
        return mf.file_from_offset + rel, False

    def truncate_to(self, offset: int) -> None:
        """Drop everything from ``offset`` on (zeroing the tail of the segment that holds it)."""
        self.mfq.truncate_to(offset)
        self._last = self.mfq.last_file
        self._raw_end = None

    # -- durability ------------------------------------------------------------------------------
    def flush(self) -> int:
        """Flush every dirty segment; blocking (worker thread).  Returns the flushed offset."""
        self.flush_count += 1
        return self.mfq.flush()

    def is_dirty(self) -> bool:
        return self.max_offset() > self.mfq.flushed_offset()
