"""The ``checkpoint`` file (§4.4) and the ``abort`` marker that tells a crash from a clean exit (§4.1)."""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

from rmqbroker.store.errors import StoreError

log = logging.getLogger(__name__)

# RocketMQ maps the checkpoint as one 4 KiB page; only the first 24 bytes carry data.
CHECKPOINT_FILE_SIZE = 4096
# Checkpoint: 0 physicMsgTimestamp q | 8 logicsMsgTimestamp q | 16 indexMsgTimestamp q
_CHECKPOINT = struct.Struct(">qqq")
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


class StoreCheckpoint:
    """Store times up to which commitlog / consume queue / index data is known durable.

    Values are updated in memory by the flushers; :meth:`flush` writes and fsyncs the file
    (blocking, run it in a worker thread).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self._written: tuple[int, int, int] | None = None

    def load(self) -> None:
        """Read the file if it exists; a missing or short file counts as all zeros."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreError(f"cannot read checkpoint {self.path}: {exc}") from exc
        if len(data) < _CHECKPOINT.size:
            log.warning("checkpoint %s is only %d bytes; ignoring it", self.path, len(data))
            return
        values = _CHECKPOINT.unpack_from(data, 0)
        self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp = values
        self._written = values
        log.info("checkpoint: physic=%d logics=%d index=%d", *values)

    def min_timestamp(self) -> int:
        """The store time up to which both commitlog and consume queues were durable."""
        return min(self.physic_msg_timestamp, self.logics_msg_timestamp)

    def flush(self) -> None:
        """Write and fsync the file if a value changed; blocking."""
        values = (self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp)
        if values == self._written:
            return
        page = bytearray(CHECKPOINT_FILE_SIZE)
        _CHECKPOINT.pack_into(page, 0, *values)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, page, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StoreError(f"cannot write checkpoint {self.path}: {exc}") from exc
        self._written = values


class AbortMarker:
    """The ``abort`` file: present while the store runs, so finding it at start means a crash.

    RocketMQ only tests whether it exists. This store also writes the kernel's boot id into it, so
    that the next start can tell a crash of the process (every write to a mapped file survived in
    the page cache) from a crash or power loss of the machine (pages not yet written back are
    lost). A marker without a boot id (a Java broker's, an older one's) counts as the machine's.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def exists(self) -> bool:
        return self.path.exists()

    def written_this_boot(self) -> bool:
        """Whether the marker was written since the machine last booted (a process crash)."""
        current = boot_id()
        if current is None:
            return False
        try:
            return self.path.read_text(encoding="ascii", errors="replace").strip() == current
        except OSError:
            return False

    def create(self) -> None:
        """Write the marker with this boot's id and fsync it and its directory entry; blocking."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, (boot_id() or "").encode("ascii"))
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_dir(self.path.parent)
        except OSError as exc:
            raise StoreError(f"cannot create abort marker {self.path}: {exc}") from exc

    def remove(self) -> None:
        try:
            self.path.unlink()
            _fsync_dir(self.path.parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreError(f"cannot remove abort marker {self.path}: {exc}") from exc


def boot_id() -> str | None:
    """The running kernel's boot id (new at every boot; shared by the containers of one node)."""
    try:
        with open(_BOOT_ID, encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
