"""Persistence machinery shared by the metadata managers: locking, dirty tracking, atomic persist.

Mutations happen on the event-loop thread while ``persist()`` may run in a worker thread, so each
manager takes a consistent snapshot under its state lock and serialises file writes with a second
lock; a persist therefore always writes a state at least as new as any earlier persist.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from rmqbroker.metadata.errors import MetadataPersistError
from rmqbroker.metadata.jsonfile import atomic_write, load_decoded_with_backup, to_json_text

log = logging.getLogger(__name__)

P = TypeVar("P")


class JsonConfigFile(ABC, Generic[P]):
    """One ``config/<FILE_NAME>`` JSON file backed by an in-memory table.

    Subclasses implement parsing (``_parse``, pure: it must not touch state so that a corrupt file
    can fall back to ``.bak`` cleanly), installing a parsed value (``_install_locked``) and
    snapshotting the state as a JSON-ready object (``_snapshot_locked``).
    """

    FILE_NAME: ClassVar[str]

    def __init__(self, config_dir: Path) -> None:
        self._path = Path(config_dir) / self.FILE_NAME
        # RLock: listeners and helpers may re-enter while a mutation holds the lock.
        self._lock = threading.RLock()
        self._persist_lock = threading.Lock()
        self._generation = 0
        self._persisted_generation = 0

    @property
    def path(self) -> Path:
        return self._path

    @property
    def dirty(self) -> bool:
        """True when memory holds changes that are not on disk yet."""
        return self._generation != self._persisted_generation

    # -- subclass hooks -------------------------------------------------------------------------

    @abstractmethod
    def _parse(self, text: str) -> P: ...

    @abstractmethod
    def _install_locked(self, parsed: P) -> None: ...

    @abstractmethod
    def _snapshot_locked(self) -> dict[str, Any]: ...

    # -- loading / encoding ---------------------------------------------------------------------

    def load(self) -> bool:
        """Load the file (or its ``.bak``) into memory; False when neither exists (fresh start).

        Raises :class:`~rmqbroker.metadata.errors.MetadataLoadError` when content exists but is
        unusable.
        """
        parsed = load_decoded_with_backup(self._path, self._parse)
        if parsed is None:
            log.info("%s not found; starting with built-in defaults", self._path)
            return False
        with self._lock:
            self._install_locked(parsed)
            # What was just loaded is what is on disk.
            self._persisted_generation = self._generation
        log.info("loaded %s", self._path)
        return True

    def encode(self, pretty: bool = False, extra: Mapping[str, Any] | None = None) -> str:
        """The file's JSON text (compact by default, as in the GET_ALL_* response bodies), with
        ``extra`` top-level fields added (a response's, never persisted)."""
        with self._lock:
            obj = self._snapshot_locked()
        if extra:
            obj = dict(sorted({**obj, **extra}.items()))
        return to_json_text(obj, pretty=pretty)

    # -- persistence ----------------------------------------------------------------------------

    def _mark_changed_locked(self) -> None:
        self._generation += 1

    def persist(self) -> None:
        """Write the current state to disk (blocking, fsyncs).  Raises MetadataPersistError."""
        with self._persist_lock:
            generation, text = self._file_text()
            self._write_locked(generation, text)

    def _file_text(self) -> tuple[int, str]:
        """The generation of the state and the file's text of it (at least that new)."""
        with self._lock:
            obj = self._snapshot_locked()
            generation = self._generation
        return generation, to_json_text(obj, pretty=True)

    def _write_locked(self, generation: int, text: str) -> None:
        """Write ``text``, the state at ``generation`` or later; the persist lock is held."""
        atomic_write(self._path, text)
        with self._lock:
            self._persisted_generation = max(self._persisted_generation, generation)
        log.debug("persisted %s", self._path)

    def _write_unless_older(self, generation: int, text: str) -> None:
        """Write ``text`` (read without the persist lock) unless a newer state is on disk already."""
        with self._persist_lock:
            if generation > self._persisted_generation:
                self._write_locked(generation, text)

    def persist_if_dirty(self) -> bool:
        """Persist only when something changed since the last write; True if a write happened."""
        if not self.dirty:
            return False
        self.persist()
        return True

    async def persist_async(self) -> None:
        """:meth:`persist` in a worker thread so the event loop never waits on fsync."""
        await asyncio.to_thread(self.persist)

    async def persist_if_dirty_async(self) -> bool:
        if not self.dirty:
            return False
        await self.persist_async()
        return True

    def _persist_after_change(self, persist: bool) -> None:
        """Persist after a mutation; a failed write is logged and left dirty for a later retry.

        A mutation that already took effect in memory must not be reported as failed to the
        client (the Java broker behaves the same way), hence no exception here.
        """
        if not persist:
            return
        try:
            self.persist()
        except MetadataPersistError:
            log.exception("could not persist %s; the change stays in memory and is retried later", self._path)

    def _write_verbatim(self, text: str, parsed: P) -> None:
        """Store ``text`` as the file content and ``parsed`` (its decoded form) as the state."""
        with self._persist_lock:
            with self._lock:
                self._install_locked(parsed)
                self._mark_changed_locked()
                generation = self._generation
            atomic_write(self._path, text)
            with self._lock:
                self._persisted_generation = max(self._persisted_generation, generation)
