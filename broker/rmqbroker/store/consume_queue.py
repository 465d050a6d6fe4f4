"""Consume queues (§4.2): one per topic/queue id, 20-byte units pointing into the commitlog.

Files live under ``consumequeue/<topic>/<queueId>/`` and are named by their 20-digit start
*byte* offset; logical offset n is unit n, i.e. byte n*20.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from pathlib import Path

from rmqbroker.store.errors import StoreError
from rmqbroker.store.mapped_file import MappedFile, MappedFileQueue

log = logging.getLogger(__name__)

CQ_STORE_UNIT_SIZE = 20
# One consume-queue unit:  0 commitlog physical offset q | 8 message total size i | 12 tagsCode q
UNIT = struct.Struct(">qiq")
# Units written in front of a queue that starts at a non-zero logical offset (and into gaps).
BLANK_SIZE = 0x7FFFFFFF
BLANK_UNIT = UNIT.pack(0, BLANK_SIZE, 0)
_ZERO_UNIT = bytes(CQ_STORE_UNIT_SIZE)
# Leading-blank detection compares this many units at a time.
_BLANK_RUN = BLANK_UNIT * 4096

# How a caller maps a unit to the store time of its record (-1 if unreadable).
StoreTimeLookup = Callable[[int, int], int]


class ConsumeQueue:
    """Units of one topic/queue id.  Appends go straight into the mapped segment."""

    __slots__ = ("_last", "directory", "file_size", "max_phy_end", "mfq", "min_logic_offset", "queue_id",
                 "topic", "units_per_file")

    def __init__(self, topic: str, queue_id: int, root_dir: Path, file_size: int) -> None:
        if file_size <= 0 or file_size % CQ_STORE_UNIT_SIZE:
            raise StoreError(f"consume queue file size {file_size} is not a positive multiple of 20")
        self.topic = topic
        self.queue_id = queue_id
        self.directory = root_dir / topic / str(queue_id)
        self.file_size = file_size
        self.units_per_file = file_size // CQ_STORE_UNIT_SIZE
        self.mfq = MappedFileQueue(self.directory, file_size)
        self.min_logic_offset = 0
        # Commitlog offset just after the record of the last non-blank unit (0 when empty).
        self.max_phy_end = 0
        self._last: MappedFile | None = None

    def __repr__(self) -> str:
        return f"ConsumeQueue({self.topic}-{self.queue_id}, min={self.min_offset()}, max={self.max_offset()})"

    # -- load / recovery -------------------------------------------------------------------------
    def load(self) -> bool:
        """Map existing files; ``False`` when a bad file had to be dropped (the queue needs repair)."""
        intact = self.mfq.load(strict=False)
        self._last = self.mfq.last_file
        return intact

    def recover(self) -> bool:
        """Find the valid end and drop what follows (§4.3).

        Units are checked from the third-last file on (earlier files were completed long ago and
        are trusted, as in RocketMQ): ``phy >= 0``, ``size > 0`` and physical offsets growing.
        The first all-zero unit of the last file is the normal end.  Returns ``False`` when units
        were lost (garbage, a zero unit inside a full file, non-zero bytes after the end, or an
        empty last file, which this class never leaves behind), so the store re-dispatches them.
        """
        files = self.mfq.files
        if not files:
            return True
        clean = True
        first_idx = max(0, len(files) - 3)
        for mf in files[:first_idx]:
            mf.wrote_position = mf.flushed_position = mf.file_size
        prev_end = self._last_phy_end_before(first_idx)
        stop_at = files[-1].file_end_offset
        for idx in range(first_idx, len(files)):
            mf = files[idx]
            valid = 0
            for phy, size, _tags in UNIT.iter_unpack(mf.mm):
                if phy == 0 and size == 0:
                    break
                if phy == 0 and size == BLANK_SIZE:
                    valid += CQ_STORE_UNIT_SIZE
                    continue
                if phy < 0 or size <= 0 or phy < prev_end:
                    clean = False
                    log.warning("consume queue %s-%d: invalid unit (%d, %d) at byte %d of %s; truncating there",
                                self.topic, self.queue_id, phy, size, valid, mf.path)
                    break
                prev_end = phy + size
                valid += CQ_STORE_UNIT_SIZE
            mf.wrote_position = mf.flushed_position = mf.file_size
            if valid < mf.file_size:
                if idx != len(files) - 1 or valid == 0:
                    clean = False
                stop_at = mf.file_from_offset + valid
                break
        if self.mfq.truncate_to(stop_at):
            clean = False
        self._drop_empty_tail()
        if not clean:
            log.warning("consume queue %s-%d lost units after logical offset %d; they will be rebuilt",
                        self.topic, self.queue_id, self.max_offset())
        self.min_logic_offset = self._first_real_offset()
        return clean

    def reset(self) -> None:
        """Forget every unit, files included (a queue about to be rebuilt from the commitlog)."""
        self.mfq.destroy()
        self._last = None
        self.min_logic_offset = 0
        self.max_phy_end = 0

    def fill_blanks_to(self, logical: int) -> None:
        """Give an empty queue the offsets of one whose records are all gone: blank units up to
        ``logical``, which becomes both its min and max offset (as RocketMQ's queues start when
        created at a non-zero offset), so its next message gets the queue offset its consumers
        expect rather than 0 again."""
        if self._last is not None or logical <= 0:
            return
        pos = logical * CQ_STORE_UNIT_SIZE
        # The file holding the last blank: an empty file at a boundary would read as damage at load.
        start = (pos - 1) // self.file_size * self.file_size
        self.mfq.create_file(start).append(BLANK_UNIT * ((pos - start) // CQ_STORE_UNIT_SIZE))
        self._last = self.mfq.last_file
        self.min_logic_offset = logical

    def _drop_empty_tail(self) -> None:
        """Delete a trailing file without units so an empty file always means damage at load."""
        last = self.mfq.last_file
        if last is not None and last.wrote_position == 0:
            last.destroy()
            self.mfq.files.pop()
        self._after_truncate()

    def _last_phy_end_before(self, file_index: int) -> int:
        """Record end of the last non-blank unit in files before ``file_index`` (0 if none)."""
        for mf in reversed(self.mfq.files[:file_index]):
            unit = self._last_real_unit(mf)
            if unit is not None:
                return unit[0] + unit[1]
        return 0

    @staticmethod
    def _last_real_unit(mf: MappedFile) -> tuple[int, int] | None:
        """``(phy, size)`` of the file's last unit that is not a blank, or None."""
        pos = mf.wrote_position - CQ_STORE_UNIT_SIZE
        while pos >= 0:
            phy, size, _tags = UNIT.unpack_from(mf.mm, pos)
            if size != BLANK_SIZE and size > 0:
                return int(phy), int(size)
            pos -= CQ_STORE_UNIT_SIZE
        return None

    def _first_real_offset(self) -> int:
        """Logical offset of the first unit that is not a leading blank."""
        first = self.mfq.first_file
        if first is None:
            return 0
        base = first.file_from_offset // CQ_STORE_UNIT_SIZE
        end = first.wrote_position
        pos = 0
        run = len(_BLANK_RUN)
        while pos + run <= end and first.mm[pos:pos + run] == _BLANK_RUN:
            pos += run
        while pos < end and first.mm[pos:pos + CQ_STORE_UNIT_SIZE] == BLANK_UNIT:
            pos += CQ_STORE_UNIT_SIZE
        return base + pos // CQ_STORE_UNIT_SIZE

    def _after_truncate(self) -> None:
        self._last = self.mfq.last_file
        self.max_phy_end = self._last_phy_end_before(len(self.mfq.files))

    # -- offsets ---------------------------------------------------------------------------------
    def max_offset(self) -> int:
        """Next logical offset to be written (= number of units, counting leading blanks)."""
        last = self._last
        if last is None:
            return 0
        return (last.file_from_offset + last.wrote_position) // CQ_STORE_UNIT_SIZE

    def min_offset(self) -> int:
        return self.min_logic_offset

    def roll_next_file(self, logical: int) -> int:
        """First logical offset of the file after the one holding ``logical``."""
        return logical + self.units_per_file - logical % self.units_per_file

    # -- writing ---------------------------------------------------------------------------------
    def put_unit(self, logical: int, phy: int, size: int, tags: int) -> None:
        """Write the unit for logical offset ``logical`` (hot path: an append at the end).

        Raises :class:`~rmqbroker.store.errors.StoreFullError` when the disk has no room for it.
        """
        last = self._last
        if last is not None:
            wpos = last.wrote_position
            # Within the reserved blocks (so also within the file): else the slow path reserves.
            end = wpos + CQ_STORE_UNIT_SIZE
            if logical * CQ_STORE_UNIT_SIZE == last.file_from_offset + wpos and end <= last.reserved:
                UNIT.pack_into(last.mm, wpos, phy, size, tags)
                last.wrote_position = end
                self.max_phy_end = phy + size
                return
        self._put_slow(logical, phy, size, tags)

    def _put_slow(self, logical: int, phy: int, size: int, tags: int) -> None:
        pos = logical * CQ_STORE_UNIT_SIZE
        if self._last is None:
            start = pos - pos % self.file_size
            mf = self.mfq.create_file(start)
            if pos > start:
                mf.append(BLANK_UNIT * ((pos - start) // CQ_STORE_UNIT_SIZE))
            self._last = mf
            self.min_logic_offset = logical
        max_pos = self.max_offset() * CQ_STORE_UNIT_SIZE
        if pos < max_pos:
            existing = self.get_unit(logical)
            if existing is not None and existing[0] == phy and existing[1] == size:
                return  # re-dispatch of a unit we already have
            log.warning("consume queue %s-%d: unit %d was %s, commitlog says (%d, %d); rewriting from there",
                        self.topic, self.queue_id, logical, existing, phy, size)
            self.truncate_to_logical(logical)
        elif pos > max_pos:
            log.warning("consume queue %s-%d: gap from %d to %d filled with blank units",
                        self.topic, self.queue_id, max_pos // CQ_STORE_UNIT_SIZE, logical)
            self._append_bytes(BLANK_UNIT * ((pos - max_pos) // CQ_STORE_UNIT_SIZE))
        self._append_bytes(UNIT.pack(phy, size, tags))
        self.max_phy_end = phy + size

    def _append_bytes(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            mf = self.mfq.get_last_file()
            n = mf.append(view)
            view = view[n:]
        self._last = self.mfq.last_file

    def truncate_to_logical(self, logical: int) -> None:
        """Drop units from ``logical`` on."""
        self.mfq.truncate_to(logical * CQ_STORE_UNIT_SIZE)
        self._drop_empty_tail()
        if self._last is None:
            self.min_logic_offset = 0
        elif self.min_logic_offset > logical:
            self.min_logic_offset = logical

    def truncate_beyond_phy(self, phy_end: int) -> int:
        """Drop trailing units whose record does not end by ``phy_end``; returns how many went."""
        max_off = self.max_offset()
        cut = max_off
        while cut > self.min_logic_offset:
            unit = self.get_unit(cut - 1)
            if unit is None:
                break
            phy, size, _tags = unit
            # Trailing gap fillers go too: they only mean something below a real unit.
            if size != BLANK_SIZE and phy + size <= phy_end:
                break
            cut -= 1
        if cut < max_off:
            self.truncate_to_logical(cut)
        return max_off - cut

    # -- reading ---------------------------------------------------------------------------------
    def get_unit(self, logical: int) -> tuple[int, int, int] | None:
        """``(phy, size, tagsCode)`` at ``logical``, or ``None`` if no such unit."""
        pos = logical * CQ_STORE_UNIT_SIZE
        mf = self.mfq.find_file(pos)
        if mf is None:
            return None
        rel = pos - mf.file_from_offset
        if rel < 0 or rel + CQ_STORE_UNIT_SIZE > mf.wrote_position:
            return None
        phy, size, tags = UNIT.unpack_from(mf.mm, rel)
        return int(phy), int(size), int(tags)

    def units_buffer(self, logical: int) -> tuple[MappedFile, int, int] | None:
        """The segment holding ``logical`` with the byte range ``[start, end)`` of its written units.

        Never crosses a segment, like RocketMQ's ``getIndexBuffer``.
        """
        if logical < 0:
            return None
        pos = logical * CQ_STORE_UNIT_SIZE
        mf = self.mfq.find_file(pos)
        if mf is None:
            return None
        rel = pos - mf.file_from_offset
        if rel >= mf.wrote_position:
            return None
        return mf, rel, mf.wrote_position

    def get_units(self, logical: int, count: int) -> list[tuple[int, int, int]]:
        """Up to ``count`` units starting at ``logical`` (crossing segments as needed)."""
        out: list[tuple[int, int, int]] = []
        while len(out) < count:
            found = self.units_buffer(logical)
            if found is None:
                break
            mf, start, end = found
            end = min(end, start + (count - len(out)) * CQ_STORE_UNIT_SIZE)
            for pos in range(start, end, CQ_STORE_UNIT_SIZE):
                phy, size, tags = UNIT.unpack_from(mf.mm, pos)
                out.append((int(phy), int(size), int(tags)))
            logical += (end - start) // CQ_STORE_UNIT_SIZE
        return out

    def sum_sizes(self, logical: int, count: int) -> tuple[int, int]:
        """``(bytes, units)``: the message sizes the next ``count`` units from ``logical`` record,
        and how many units were there (statistics; blank units count nothing)."""
        total = 0
        done = 0
        while done < count:
            found = self.units_buffer(logical)
            if found is None:
                break
            mf, start, end = found
            end = min(end, start + (count - done) * CQ_STORE_UNIT_SIZE)
            chunk = bytes(mf.mm[start:end])
            n = (end - start) // CQ_STORE_UNIT_SIZE
            # The 4 big-endian bytes of every unit's size (bytes 8-11), summed column by column:
            # no per-unit tuple. A message is far below 2 GiB, so only a blank unit's size starts
            # with 0x7F, which finds the blanks to leave out.
            blanks = chunk[8::CQ_STORE_UNIT_SIZE].count(0x7F)
            for i, blank_byte in enumerate((0x7F, 0xFF, 0xFF, 0xFF)):
                column = sum(chunk[8 + i::CQ_STORE_UNIT_SIZE]) - blank_byte * blanks
                total += column << (8 * (3 - i))
            done += n
            logical += n
        return total, done

    def search_offset_by_time(self, timestamp: int, store_time: StoreTimeLookup, min_phy: int) -> int:
        """Logical offset whose store time equals ``timestamp``, else the nearer neighbour (§2.9).

        Store times grow with logical offset, so this is a lower-bound binary search; units whose
        record is gone (below ``min_phy``) or unreadable count as older than anything.
        """
        low, high = self.min_offset(), self.max_offset()
        if high <= low:
            return 0

        def time_at(logical: int) -> int:
            unit = self.get_unit(logical)
            if unit is None or unit[1] == BLANK_SIZE or unit[0] < min_phy:
                return -1
            return store_time(unit[0], unit[1])

        lo, hi = low, high
        while lo < hi:
            mid = (lo + hi) // 2
            if time_at(mid) < timestamp:
                lo = mid + 1
            else:
                hi = mid
        if lo < high and time_at(lo) == timestamp:
            return lo
        left = lo - 1 if lo - 1 >= low else -1
        right = lo if lo < high else -1
        if right < 0:
            return left if left >= 0 else 0
        if left < 0:
            return right
        left_time = time_at(left)
        if left_time < 0:
            return right
        return left if abs(timestamp - left_time) <= abs(time_at(right) - timestamp) else right

    def first_phy(self) -> int:
        """Commitlog offset of the first non-blank unit from the min offset on (-1: none)."""
        unit = self.earliest_unit()
        return unit[0] if unit is not None else -1

    def earliest_unit(self) -> tuple[int, int, int] | None:
        """First non-blank unit at or after the min offset."""
        logical = self.min_offset()
        max_off = self.max_offset()
        while logical < max_off:
            unit = self.get_unit(logical)
            if unit is None:
                return None
            if unit[1] != BLANK_SIZE:
                return unit
            logical += 1
        return None

    def correct_min_offset(self, min_phy: int) -> None:
        """Move the min offset past units whose commitlog data no longer exists.

        Physical offsets grow with logical ones, so this is a binary search for the first real
        unit at or after ``min_phy`` (a file holds 300,000 units; walking them would stall the loop).
        """
        lo, hi = self.min_logic_offset, self.max_offset()
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self.get_unit(mid)
            if unit is None or (unit[1] != BLANK_SIZE and unit[0] >= min_phy):
                hi = mid
            else:
                lo = mid + 1
        self.min_logic_offset = max(self.min_logic_offset, lo)

    def detach_files_below(self, min_phy: int) -> list[MappedFile]:
        """Take out the leading files (never the last) whose units all point below ``min_phy``, the
        commitlog's new start, and move the min offset past units whose records are gone.

        The files are returned for the caller to destroy off the event loop (RocketMQ's
        deleteExpiredFileByOffset + correctMinOffset).
        """
        files = self.mfq.files
        n = 0
        while n < len(files) - 1 and ((unit := self._last_real_unit(files[n])) is None or unit[0] < min_phy):
            n += 1
        gone = files[:n]
        if gone:
            del files[:n]
            self.min_logic_offset = max(self.min_logic_offset, files[0].file_from_offset // CQ_STORE_UNIT_SIZE)
        self.correct_min_offset(min_phy)
        return gone

    # -- durability / lifecycle ------------------------------------------------------------------
    def is_dirty(self) -> bool:
        return self.mfq.dirty_bytes() > 0

    def flush(self) -> None:
        """Blocking; run in a worker thread."""
        self.mfq.flush()

    def close(self) -> None:
        self.mfq.close()
        self._last = None

    def destroy(self) -> None:
        self.mfq.destroy()
        self._last = None
        try:
            self.directory.rmdir()
            self.directory.parent.rmdir()
        except OSError:
            pass
