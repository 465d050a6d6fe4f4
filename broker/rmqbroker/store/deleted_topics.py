"""Where each deleted topic's records end in the commitlog (a project file, ``deletedTopics.json``
in the store root): dispatch skips a deleted topic's records before that point, so that recovery
after a crash, which re-dispatches the commitlog from the checkpoint's segment, does not bring a
deleted topic's consume queues back. Records written after the point belong to a topic created
again under the name and are dispatched as usual."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "deletedTopics.json"


def load(path: Path) -> dict[str, int]:
    """The table, or empty when the file is absent or unreadable (logged: deleted topics may then
    reappear after a crash, which loses no message)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.error("cannot read %s (%s); deleted topics may reappear after a crash", path, exc)
        return {}
    if not isinstance(raw, dict):
        log.error("%s is not a JSON object; ignoring it", path)
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


def save(path: Path, table: dict[str, int]) -> None:
    """Write the table atomically (temporary file, fsync, rename, directory fsync); blocking."""
    tmp = path.with_name(path.name + ".tmp")
    data = json.dumps(dict(sorted(table.items())), indent=1).encode("utf-8")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
