"""Where each deleted topic's records end in the commitlog (a project file, ``deletedTopics.json``
in the store root): dispatch skips a deleted topic's records before that point, so that recovery
after a crash, which re-dispatches the commitlog from the checkpoint's segment, does not bring a
deleted topic's consume queues back. Records written after the point belong to a topic created
again under the name and are dispatched as usual. Written and read like the metadata files
(crash-safe write, ``.bak`` fallback)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rmqbroker.metadata.errors import MetadataError, MetadataFormatError
from rmqbroker.metadata.jsonfile import atomic_write, load_decoded_with_backup

log = logging.getLogger(__name__)


def _decode(text: str) -> dict[str, int]:
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise MetadataFormatError("not a JSON object")
    return {str(k): v for k, v in raw.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


def load(path: Path) -> dict[str, int]:
    """The table, or empty when there is none or it cannot be read (logged: deleted topics may then
    reappear after a crash, which loses no message)."""
    try:
        return load_decoded_with_backup(path, _decode) or {}
    except MetadataError as exc:
        log.error("cannot read %s (%s); deleted topics may reappear after a crash", path, exc)
        return {}


def save(path: Path, table: dict[str, int]) -> None:
    """Write the table crash-safely; blocking."""
    atomic_write(path, json.dumps(dict(sorted(table.items())), indent=1))
