"""Where the index stopped taking records after a failure (a project file, ``indexGap.json`` in the
store root, absent when there is no gap): ``{"reindexFrom": <commitlog offset>}``. The records from
there are stored but not findable by key until they are indexed; the file lets a restart index them
too. Written crash-safely like the metadata files; outside ``index/``, where RocketMQ would take any
file for an index file."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rmqbroker.metadata.errors import MetadataError, MetadataFormatError, MetadataPersistError
from rmqbroker.metadata.jsonfile import atomic_write, load_decoded_with_backup

log = logging.getLogger(__name__)

KEY = "reindexFrom"


def _decode(text: str) -> int:
    raw = json.loads(text)
    value = raw.get(KEY) if isinstance(raw, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise MetadataFormatError(f"{KEY} is not a commitlog offset")
    return value


def load(path: Path) -> int | None:
    """The offset to index again from, or None. An unreadable file is logged and read as 0: the
    whole log is indexed again, which costs time at start but finds every record."""
    try:
        return load_decoded_with_backup(path, _decode)
    except MetadataError as exc:
        log.error("cannot read %s (%s); indexing the commitlog again from its start", path, exc)
        return 0


def save(path: Path, offset: int) -> None:
    """Record the gap crash-safely; blocking."""
    atomic_write(path, json.dumps({KEY: offset}), backup=False)


def clear(path: Path) -> None:
    """The gap is closed; blocking. (``save`` keeps no ``.bak``.)"""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise MetadataPersistError(f"cannot remove {path}: {exc}") from exc
