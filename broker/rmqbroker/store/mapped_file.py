"""Fixed-size memory-mapped segment files named by their 20-digit start offset, and queues of them.

Used by both the commitlog (§4.1, 1 GiB segments) and the consume queues (6,000,000-byte segments).
Appends are plain memory copies on the event-loop thread; :meth:`MappedFile.flush` is a blocking
``fdatasync`` meant to run in a worker thread (``asyncio.to_thread``).  ``fdatasync`` on the file
descriptor persists pages dirtied through the shared mapping (Linux tracks them in the page
cache), and unlike ``mmap.flush`` it releases the GIL.

Files are pre-sized sparse. A store write through a mapping into a hole that a full disk cannot
back is a SIGBUS, which would kill the process; so every writer makes sure of its room before it
writes (:meth:`MappedFile.reserve`). While the filesystem has :data:`PLENTY_FREE` that is a check
(``fstatvfs``) every 16th of a step; below it the blocks are reserved (``fallocate``,
:func:`reserve_blocks`) a step ahead, and a reservation that fails is a :class:`StoreFullError` on
that write, with nothing written. Reserving always cost 3-7 % more broker CPU per sent message
here (bench/RESULTS.md, 2026-11-29); checked ranges are small (256 KiB of commitlog, ~6 KB per
consume queue), so only another writer taking nearly 256 MiB in the meantime could fill the disk
under them.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import re
from collections.abc import Callable
from pathlib import Path

from rmqbroker.store.errors import StoreConfigError, StoreError, StoreFullError

log = logging.getLogger(__name__)

_NAME = re.compile(r"^\d{20}$")
# Suffix of a segment being created (see create_sized); leftovers from a crash are deleted at load.
TMP_SUFFIX = ".creating"
# Zeroing works in chunks so a 1 GiB tail is never copied into memory at once.
_ZERO_CHUNK = 1 << 20
_ZEROS = bytes(_ZERO_CHUNK)


_PAGE = mmap.PAGESIZE
# Blocks reserved ahead of the writes, per reservation: a 64th of the file, within these bounds
# (1 GiB commitlog segments: 4 MiB, one fallocate per ~4,000 1 KiB messages; consume-queue
# files: about 94 KB, ~4,700 units). Small enough that a file never holds much more disk than data.
_RESERVE_MIN = 64 * 1024
_RESERVE_MAX = 4 * 1024 * 1024
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# With this much free on its filesystem, a file only checks its next 16th of a step.
PLENTY_FREE = 256 * 1024 * 1024
_CANNOT_RESERVE = (errno.EOPNOTSUPP, errno.ENOSYS)


def _load_fallocate() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.fallocate
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    func.restype = ctypes.c_int
    result: Callable[[int, int, int, int], int] = func
    return result


# fallocate(2) itself (mode 0), not posix_fallocate: glibc's fallback for a filesystem without it
# writes a zero into every block, and the range may hold a slave's bytes being written.
_FALLOCATE = _load_fallocate()
_unreservable_logged = False


def reserve_blocks(fd: int, pos: int, n: int, path: Path) -> bool:
    """Have the filesystem allocate the blocks of ``[pos, pos + n)`` of a pre-sized file now.

    Raises :class:`StoreFullError` when the disk (or a quota) has no room for them. Returns False
    when this filesystem cannot reserve (writes then allocate as they go, as before; logged once).
    Releases the GIL for the system call; callable from any thread.
    """
    global _unreservable_logged
    if n <= 0:
        return True
    if _FALLOCATE is None:
        return False
    while _FALLOCATE(fd, 0, pos, n) != 0:
        err = ctypes.get_errno()
        if err == errno.EINTR:
            continue
        if err in _NO_SPACE:
            raise StoreFullError(f"no space left for {path} ({n} bytes at {pos}): {os.strerror(err)}")
        if err in _CANNOT_RESERVE:
            if not _unreservable_logged:
                _unreservable_logged = True
                log.warning("the filesystem of %s cannot reserve blocks (fallocate: %s): a full disk can stop "
                            "the broker with SIGBUS instead of refusing writes", path, os.strerror(err))
            return False
        raise StoreError(f"cannot reserve {n} bytes of {path} at {pos}: {os.strerror(err)}")
    return True


def plenty_free(fd: int) -> bool:
    """Whether the filesystem of ``fd`` has :data:`PLENTY_FREE` bytes available (not when unknown)."""
    try:
        st = os.fstatvfs(fd)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= PLENTY_FREE


def make_room(fd: int, path: Path, start: int, end: int, upto: int, checked: int, allocate: bool = False) -> int:
    """Room for writes from ``start`` to ``end`` of a pre-sized file; the new covered end.

    With plenty free (and not ``allocate``) a check covers up to ``checked``; else the blocks up to
    ``upto`` are reserved, or only up to ``end`` when the disk has no room for more. Returns -1
    when this filesystem cannot reserve; raises :class:`StoreFullError` when not even ``end`` fits.
    """
    if not allocate and plenty_free(fd):
        return checked
    try:
        reserved = reserve_blocks(fd, start, upto - start, path)
    except StoreFullError:
        if upto <= end:
            raise
        upto = end  # not room for the step ahead, but maybe for what is about to be written
        reserved = reserve_blocks(fd, start, upto - start, path)
    return upto if reserved else -1


def io_error(text: str, exc: OSError) -> StoreError:
    """A failed store write or file creation as a typed error: StoreFullError for no space."""
    return StoreFullError(f"{text}: {exc}") if exc.errno in _NO_SPACE else StoreError(f"{text}: {exc}")


def reserve_step(file_size: int) -> int:
    """How far ahead of a write a file of ``file_size`` bytes reserves blocks."""
    return min(file_size, _RESERVE_MAX, max(_RESERVE_MIN, file_size >> 6))


def file_name(offset: int) -> str:
    """The 20-digit zero-padded name RocketMQ gives a segment starting at ``offset``."""
    return f"{offset:020d}"


# Appends at least this large use pwrite rather than a copy into the mapping.
_PWRITE_MIN = 16 * 1024


class MappedFile:
    """One pre-sized segment file mapped read/write.

    ``wrote_position`` is where the next append goes (relative to the file start);
    ``flushed_position`` is how much is known durable.  Both are plain ints: the flush worker
    thread only reads ``wrote_position`` and only writes ``flushed_position``.
    """

    __slots__ = ("_closed", "_fd", "_step", "file_from_offset", "file_size", "flushed_position", "mm", "path",
                 "reserved", "wrote_position")

    def __init__(self, path: Path, file_size: int, *, create: bool) -> None:
        self.path = path
        self.file_size = file_size
        try:
            self.file_from_offset = int(path.name)
        except ValueError as exc:
            raise StoreError(f"segment name {path.name!r} is not a 20-digit offset") from exc
        try:
            fd = create_sized(path, file_size) if create else os.open(path, os.O_RDWR)
        except OSError as exc:
            if create:
                raise io_error(f"cannot create segment {path}", exc) from exc
            raise StoreError(f"cannot open segment {path}: {exc}") from exc
        try:
            if not create:
                actual = os.fstat(fd).st_size
                if actual != file_size:
                    raise StoreConfigError(
                        f"segment {path} is {actual} bytes but the configured size is {file_size}; "
                        "refusing to start (was the mapped file size setting changed?)"
                    )
            self.mm = mmap.mmap(fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            if create:
                _unlink_quietly(path)
            raise
        self._fd = fd
        self._closed = False
        self.wrote_position = 0
        self.flushed_position = 0
        # Writes below this (relative) position have their room: reserved, or checked (see reserve()).
        self.reserved = 0
        self._step = reserve_step(file_size)

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, wrote={self.wrote_position}, flushed={self.flushed_position})"

    @property
    def fd(self) -> int:
        """The segment's file descriptor (for positional writes from a worker thread)."""
        return self._fd

    @property
    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    @property
    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    @property
    def file_end_offset(self) -> int:
        return self.file_from_offset + self.file_size

    @property
    def max_offset(self) -> int:
        """Global offset just after the written data."""
        return self.file_from_offset + self.wrote_position

    def reserve(self, end: int, ahead: int = 0, *, allocate: bool = False) -> None:
        """Make sure of the room up to ``end`` (relative) before anything is written there.

        Covers from the write position on, up to ``end + ahead`` or one step beyond what was
        covered, whichever is further (never past the file's end); while the disk has plenty free
        (and not ``allocate``), a check covers up to ``end`` or a 16th of a step further. Raises
        :class:`StoreFullError` (nothing reserved is lost, nothing is written) when the disk has no room.
        """
        if end <= self.reserved:
            return
        start = max(self.reserved, min(self.wrote_position, end) & ~(_PAGE - 1))
        size = self.file_size
        covered = make_room(self._fd, self.path, start, end, min(size, max(end + ahead, start + self._step)),
                            min(size, max(end, start + (self._step >> 4))), allocate)
        # Without reservations on this filesystem: never asked again for this file.
        self.reserved = covered if covered >= 0 else size

    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Copy ``data`` at the write position; returns how many bytes fit (may be fewer).

        Raises :class:`StoreFullError`, having written nothing, when the disk has no room for them.
        """
        n = min(len(data), self.file_size - self.wrote_position)
        if n > 0:
            pos = self.wrote_position
            if pos + n > self.reserved:
                self.reserve(pos + n)
            chunk = data[:n] if n < len(data) else data
            if n >= _PWRITE_MIN:
                # Large copies (HA streams) go through the page cache with one syscall instead of
                # taking a page fault per fresh 4 KiB page of the mapping; the mapping sees them.
                try:
                    written = os.pwrite(self._fd, chunk, pos)
                except OSError as exc:
                    raise io_error(f"write to {self.path} at {pos} failed", exc) from exc
                if written != n:
                    raise StoreError(f"short write to {self.path}: {written} of {n} bytes")
            else:
                self.mm[pos:pos + n] = chunk
            self.wrote_position = pos + n
        return n

    def flush(self) -> int:
        """Make everything written so far durable; blocking, safe to call from a worker thread.

        Returns the new flushed position.  Appends that race with the sync are simply covered by
        the next flush: the target is taken before the system call.
        """
        target = self.wrote_position
        if target <= self.flushed_position or self._closed:
            return self.flushed_position
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            if exc.errno == errno.EBADF and self._closed:
                return self.flushed_position
            raise StoreError(f"fdatasync of {self.path} failed: {exc}") from exc
        self.flushed_position = max(self.flushed_position, target)
        return self.flushed_position

    def sync_all(self) -> None:
        """Durably persist the whole file, regardless of positions (used after truncation)."""
        if not self._closed:
            os.fdatasync(self._fd)

    def truncate_to(self, pos: int) -> bool:
        """Forget everything from ``pos`` on: positions move back and the bytes become zero.

        Zeroing matters: recovery and HA must never mistake stale bytes for records later.  The
        whole tail is examined (skipping holes of the sparse file) because after a crash the stale
        data may lie beyond the position we knew about.  Returns whether any non-zero byte was found.
        """
        if not 0 <= pos <= self.file_size:
            raise StoreError(f"cannot truncate {self.path.name} to {pos}")
        dirty = self._zero_range(pos, self.file_size)
        self.wrote_position = pos
        self.flushed_position = min(self.flushed_position, pos)
        return dirty

    def _zero_range(self, start: int, end: int) -> bool:
        found = False
        off = start
        while off < end:
            try:
                data_start = os.lseek(self._fd, off, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only a hole remains
                    return found
                data_start = off  # filesystem without SEEK_DATA: examine everything
            if data_start >= end:
                return found
            try:
                data_end = min(os.lseek(self._fd, data_start, os.SEEK_HOLE), end)
            except OSError:
                data_end = end
            a = data_start
            while a < data_end:
                b = min(a + _ZERO_CHUNK, data_end)
                if self.mm[a:b] != _ZEROS[:b - a]:
                    self.mm[a:b] = _ZEROS[:b - a]
                    found = True
                a = b
            off = data_end
        return found

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.mm.close()
        except BufferError:
            # A reader still holds a memoryview of the mapping (e.g. a pull body being sent);
            # the mapping is released when that view is garbage collected.
            log.debug("segment %s still has exported views; unmapping deferred", self.path)
        os.close(self._fd)

    def destroy(self) -> None:
        """Close and delete the file."""
        self.close()
        _unlink_quietly(self.path)


def create_sized(path: Path, file_size: int) -> int:
    """Create ``path`` at its full size atomically; returns an open read/write descriptor.

    The file is sized under a temporary name (``TMP_SUFFIX``) and renamed into place (directory
    fsynced), so a crash never leaves a short file that would make the next start refuse the store.
    Index files are created the same way.
    """
    if path.exists():
        raise FileExistsError(errno.EEXIST, "segment exists already", str(path))
    tmp = path.with_name(path.name + TMP_SUFFIX)
    _unlink_quietly(tmp)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        # Sparse pre-sizing: ftruncate is instant; blocks are allocated as pages are written.
        os.ftruncate(fd, file_size)
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return fd


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


class MappedFileQueue:
    """A directory of contiguous, equally sized segments."""

    def __init__(self, directory: Path, file_size: int) -> None:
        if file_size <= 0:
            raise StoreConfigError(f"mapped file size must be positive, got {file_size}")
        self.directory = directory
        self.file_size = file_size
        self.files: list[MappedFile] = []

    def __repr__(self) -> str:
        return f"MappedFileQueue({self.directory}, {len(self.files)} files)"

    def load(self, *, strict: bool = True) -> bool:
        """Map every existing segment (all marked full; recovery sets the real positions).

        With ``strict`` a segment of the wrong size or a gap between segments raises
        :class:`StoreConfigError`.  Without it (consume queues, which can be rebuilt) the bad
        segment and everything after it are deleted and ``False`` is returned.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob("*" + TMP_SUFFIX):
            log.info("removing %s, a segment whose creation was interrupted", leftover)
            _unlink_quietly(leftover)
        names = sorted(p.name for p in self.directory.iterdir() if _NAME.match(p.name) and p.is_file())
        intact = True
        expected: int | None = None
        for i, name in enumerate(names):
            path = self.directory / name
            offset = int(name)
            problem = None
            if expected is not None and offset != expected:
                problem = f"gap before segment {path}: expected start offset {expected}"
            elif offset % self.file_size:
                problem = f"segment {path} does not start at a multiple of the size {self.file_size}"
            else:
                size = path.stat().st_size
                if size != self.file_size:
                    problem = (f"segment {path} is {size} bytes but the configured size is "
                               f"{self.file_size}")
            if problem is not None:
                if strict:
                    raise StoreConfigError(problem + "; refusing to start")
                log.warning("%s; deleting it and %d later segment(s), they will be rebuilt",
                            problem, len(names) - i - 1)
                for later in names[i:]:
                    _unlink_quietly(self.directory / later)
                intact = False
                break
            mf = MappedFile(path, self.file_size, create=False)
            mf.wrote_position = mf.flushed_position = self.file_size
            self.files.append(mf)
            expected = offset + self.file_size
        return intact

    # -- lookup ----------------------------------------------------------------------------------
    @property
    def last_file(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    @property
    def first_file(self) -> MappedFile | None:
        return self.files[0] if self.files else None

    def min_offset(self) -> int:
        """Start of the first segment (0 when empty)."""
        return self.files[0].file_from_offset if self.files else 0

    def max_offset(self) -> int:
        """Global offset just after the last written byte (0 when empty)."""
        return self.files[-1].max_offset if self.files else 0

    def flushed_offset(self) -> int:
        for mf in reversed(self.files):
            if mf.flushed_position > 0:
                return mf.file_from_offset + mf.flushed_position
        return self.min_offset()

    def find_file(self, offset: int) -> MappedFile | None:
        """The segment whose range contains ``offset``, if it exists."""
        files = self.files
        if not files:
            return None
        idx = (offset - files[0].file_from_offset) // self.file_size
        if 0 <= idx < len(files):
            return files[idx]
        return None

    # -- growth ----------------------------------------------------------------------------------
    def create_file(self, start_offset: int) -> MappedFile:
        """Create the segment starting at ``start_offset`` (must continue the queue, or start it)."""
        if start_offset % self.file_size:
            raise StoreError(f"segment start {start_offset} is not a multiple of {self.file_size}")
        last = self.last_file
        if last is not None and start_offset != last.file_end_offset:
            raise StoreError(f"new segment at {start_offset} does not follow {last.path.name}")
        self.directory.mkdir(parents=True, exist_ok=True)
        mf = MappedFile(self.directory / file_name(start_offset), self.file_size, create=True)
        self.files.append(mf)
        return mf

    def get_last_file(self, start_offset: int = 0) -> MappedFile:
        """The segment to append to, creating the first one (at ``start_offset``) or the next one."""
        last = self.last_file
        if last is None:
            return self.create_file(start_offset - start_offset % self.file_size)
        if last.is_full:
            return self.create_file(last.file_end_offset)
        return last

    # -- durability ------------------------------------------------------------------------------
    def flush(self) -> int:
        """Flush every segment with unflushed data; blocking (run in a worker thread)."""
        for mf in list(self.files):
            if mf.wrote_position > mf.flushed_position:
                mf.flush()
        return self.flushed_offset()

    def dirty_bytes(self) -> int:
        return sum(mf.wrote_position - mf.flushed_position for mf in self.files[-2:])

    # -- truncation / deletion -------------------------------------------------------------------
    def truncate_to(self, offset: int) -> bool:
        """Drop everything from ``offset`` on: later segments are deleted, the containing one zeroed.

        Returns whether anything was dropped: non-zero bytes in the containing segment, or later
        segments.
        """
        dropped = False
        keep: list[MappedFile] = []
        for mf in self.files:
            if mf.file_from_offset >= offset and not (mf.file_from_offset == offset and not keep):
                mf.destroy()
                dropped = True
                continue
            keep.append(mf)
            if mf.file_end_offset > offset:
                dropped = mf.truncate_to(offset - mf.file_from_offset) or dropped
        self.files = keep
        return dropped

    def destroy(self) -> None:
        for mf in self.files:
            mf.destroy()
        self.files = []

    def close(self) -> None:
        for mf in self.files:
            mf.close()
