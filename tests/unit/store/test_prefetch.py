"""The store keeps the commitlog's next pages in the page cache ahead of its appends, so that the
event loop's first write to a page never pays for the kernel zero-filling a readahead window."""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import time
from pathlib import Path

import pytest

from rmqbroker.store.message_store import MessageStore
from tests.unit.store.test_message_store import make_config, msg

SEGMENT = 128 * 1024 * 1024  # sparse: costs no disk until written
PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident_pages(path: Path, start: int, length: int) -> int:
    """How many pages of ``path`` in ``[start, start + length)`` are in the page cache (mincore;
    mapping the file touches none of them)."""
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, start + length)
    finally:
        os.close(fd)
    try:
        anchor = ctypes.c_char.from_buffer(mm)
        vec = ctypes.create_string_buffer(length // PAGE)
        rc = _libc.mincore(ctypes.addressof(anchor) + start, length, vec)
        del anchor
        if rc != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return sum(b & 1 for b in vec.raw)
    finally:
        mm.close()


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise is Linux-only")
async def test_pages_ahead_of_the_write_position_are_cached(tmp_path: Path) -> None:
    store = MessageStore(make_config(tmp_path / "store", mapped_file_size_commit_log=SEGMENT))
    await store.start()
    try:
        assert store.append_message(msg(body=b"x" * 1000)).status.name == "PUT_OK"
        segment = store.commitlog.mfq.last_file
        assert segment is not None
        ahead = 16 * 1024 * 1024
        deadline = time.monotonic() + 20  # generous: the worker thread competes with the rest of a busy suite
        while resident_pages(segment.path, 0, ahead) < ahead // PAGE:
            assert time.monotonic() < deadline, "pages ahead of the appends were not brought into the cache"
            await asyncio.sleep(0.05)
        # Only ahead of the appends, not the whole segment.
        far = SEGMENT - ahead
        assert resident_pages(segment.path, far, ahead) == 0
    finally:
        await store.shutdown()
    _evict(tmp_path / "store" / "commitlog" / f"{0:020d}")
