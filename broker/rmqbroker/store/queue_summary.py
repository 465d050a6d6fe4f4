"""What the consume queues and the index held at the last clean shutdown (a project file,
``consumeQueueSummary.json`` in the store root, which RocketMQ ignores).

A consume queue is derived data: when one is lost or cut short (files deleted, a directory gone)
its units can be rebuilt from the commitlog, but nothing on disk says which queues existed or how
far they reached, and scanning the whole log at every start to find out would make every start
as slow as the scan. So a clean shutdown writes, per queue, its offsets and where its records lie,
plus the commitlog's end and the index's newest record; the next start compares the recovered
files with it and re-dispatches only what is missing. The file is removed once that start has
recovered, so a crash later never leaves a stale summary behind (after a crash, recovery works as
before: from the checkpoint, without it).

Layout::

    {"commitLogEnd": <offset>, "indexEnd": <offset of the newest indexed record, -1: none>,
     "queues": [[topic, queueId, minOffset, maxOffset, firstPhyOffset, phyEnd], ...]}

``firstPhyOffset`` is the commitlog offset of the unit at ``minOffset`` (-1 when the queue has no
unit there); ``phyEnd`` is where the record of its last unit ends.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from rmqbroker.metadata.errors import MetadataError, MetadataFormatError, MetadataPersistError
from rmqbroker.metadata.jsonfile import atomic_write, load_decoded_with_backup

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QueueState:
    """One consume queue as it was at the clean shutdown."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    first_phy: int
    phy_end: int


@dataclass(frozen=True, slots=True)
class StoreSummary:
    commitlog_end: int
    index_end: int
    queues: tuple[QueueState, ...]


def _int(value: object, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise MetadataFormatError(f"{value!r} is not an offset")
    return value


def _decode(text: str) -> StoreSummary:
    raw = json.loads(text)
    if not isinstance(raw, dict) or not isinstance(raw.get("queues"), list):
        raise MetadataFormatError("not a consume-queue summary")
    queues = []
    for row in raw["queues"]:
        if not isinstance(row, list) or len(row) != 6 or not isinstance(row[0], str):
            raise MetadataFormatError(f"bad queue entry {row!r}")
        queues.append(QueueState(row[0], _int(row[1]), _int(row[2]), _int(row[3]), _int(row[4], -1),
                                 _int(row[5])))
    return StoreSummary(_int(raw.get("commitLogEnd")), _int(raw.get("indexEnd"), -1), tuple(queues))


def load(path: Path) -> StoreSummary | None:
    """The summary, or None when there is none or it cannot be read (logged: damaged queues are
    then found only by the checks of their own files, as without a summary)."""
    try:
        return load_decoded_with_backup(path, _decode)
    except MetadataError as exc:
        log.error("cannot read %s (%s); consume queues lost since the last shutdown are not rebuilt", path, exc)
        return None


def save(path: Path, summary: StoreSummary) -> None:
    """Write the summary crash-safely; blocking."""
    doc = {
        "commitLogEnd": summary.commitlog_end,
        "indexEnd": summary.index_end,
        "queues": [[q.topic, q.queue_id, q.min_offset, q.max_offset, q.first_phy, q.phy_end] for q in summary.queues],
    }
    atomic_write(path, json.dumps(doc, separators=(",", ":")), backup=False)


def clear(path: Path) -> None:
    """Blocking; the start that read the summary has recovered (``save`` keeps no ``.bak``)."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise MetadataPersistError(f"cannot remove {path}: {exc}") from exc
