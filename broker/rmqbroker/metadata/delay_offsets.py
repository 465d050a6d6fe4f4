"""Delivery progress of delayed messages per delay level and ``delayOffset.json`` (§5.3, §6.1).

Level ``n`` (1-based) maps to the next consume-queue offset to deliver in ``SCHEDULE_TOPIC_XXXX``
queue ``n - 1``.  Flushed periodically; a slave stores the master's body verbatim.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

from rmqbroker.metadata._coerce import as_object, int_keyed
from rmqbroker.metadata.base import JsonConfigFile
from rmqbroker.metadata.jsonfile import fastjson_loads

log = logging.getLogger(__name__)

_Parsed = tuple[dict[int, int], dict[str, Any]]


def _decode_obj(obj: Any) -> _Parsed:
    data = as_object(obj, "delay offsets")
    raw = data.get("offsetTable")
    table = int_keyed(raw, "offsetTable") if raw is not None else {}
    return table, {k: v for k, v in data.items() if k != "offsetTable"}


def decode_delay_offsets(text: str | bytes) -> dict[int, int]:
    """Parse delayOffset.json / a GET_ALL_DELAY_OFFSET body (quoted or bare int keys)."""
    table, _ = _decode_obj(fastjson_loads(text))
    return table


class DelayOffsetTable(JsonConfigFile[_Parsed]):
    """``{delayLevel: offset}`` for the scheduled-message service."""

    FILE_NAME = "delayOffset.json"

    def __init__(self, config_dir: Path, *, autoload: bool = True) -> None:
        super().__init__(config_dir)
        self._table: dict[int, int] = {}
        self._extra: dict[str, Any] = {}
        if autoload:
            self.load()

    def _parse(self, text: str) -> _Parsed:
        return _decode_obj(fastjson_loads(text))

    def _install_locked(self, parsed: _Parsed) -> None:
        self._table, self._extra = parsed

    def _snapshot_locked(self) -> dict[str, Any]:
        obj: dict[str, Any] = copy.deepcopy(self._extra) if self._extra else {}
        obj["offsetTable"] = {str(level): self._table[level] for level in sorted(self._table)}
        return dict(sorted(obj.items()))

    def get(self, level: int, default: int = 0) -> int:
        """Next offset to deliver for ``level``; ``default`` (0 = from the start) when unknown."""
        return self._table.get(level, default)

    def set(self, level: int, offset: int) -> None:
        with self._lock:
            if self._table.get(level) == offset:
                return
            self._table[level] = offset
            self._mark_changed_locked()

    def table(self) -> dict[int, int]:
        with self._lock:
            return dict(self._table)

    def replace_from_json(self, text: str) -> None:
        """Slave sync (§7.6): store the master's GET_ALL_DELAY_OFFSET body verbatim and load it.

        The body is validated first, so a garbled response never replaces a good file.  Raises
        MetadataFormatError (bad body) or MetadataPersistError (write failed; memory is updated).
        """
        parsed = self._parse(text)
        self._write_verbatim(text, parsed)
        log.debug("delay offsets replaced from master: %s", parsed[0])
