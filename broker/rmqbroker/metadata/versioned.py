"""A JSON config file holding one name-keyed table under a DataVersion (topics.json,
subscriptionGroup.json): parsing of the wrapper, snapshotting, slave replacement, lookups."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from rmqbroker.metadata._coerce import as_object
from rmqbroker.metadata.base import JsonConfigFile
from rmqbroker.metadata.data_version import DataVersion
from rmqbroker.metadata.jsonfile import fastjson_loads, join_yielding, object_pieces

log = logging.getLogger(__name__)


class JsonEntry(Protocol):
    def to_json_obj(self) -> dict[str, Any]: ...


E = TypeVar("E", bound=JsonEntry)

# (table, DataVersion or None, wrapper fields this broker does not interpret)
Wrapper = tuple[dict[str, E], DataVersion | None, dict[str, Any]]


def decode_wrapper(obj: Any, table_key: str, entry: Callable[[Any, str], E]) -> Wrapper[E]:
    """``{"dataVersion": …, "<table_key>": {name: entry}, …}`` -> (table, version, extra fields)."""
    data = as_object(obj, f"{table_key} wrapper")
    table: dict[str, E] = {}
    raw_table = data.get(table_key)
    if raw_table is not None:
        for name, raw in as_object(raw_table, table_key).items():
            table[name] = entry(raw, name)
    raw_version = data.get("dataVersion")
    version = DataVersion.from_json_obj(raw_version) if raw_version is not None else None
    extra = {k: v for k, v in data.items() if k not in (table_key, "dataVersion")}
    return table, version, extra


class VersionedTableFile(JsonConfigFile[Wrapper[E]], Generic[E]):
    """Shared state and behaviour of the DataVersion'ed tables; subclasses name the table key
    and how an entry is decoded, and add their own mutations."""

    TABLE_KEY: ClassVar[str]
    KIND: ClassVar[str]  # for log lines, e.g. "topic"

    def __init__(self, config_dir: Path) -> None:
        super().__init__(config_dir)
        self._table: dict[str, E] = {}
        self._data_version = DataVersion()
        self._extra: dict[str, Any] = {}

    @staticmethod
    def _entry_from_json(raw: Any, name: str) -> E:
        raise NotImplementedError

    # -- JsonConfigFile hooks --
    def _parse(self, text: str) -> Wrapper[E]:
        return decode_wrapper(fastjson_loads(text), self.TABLE_KEY, self._entry_from_json)

    def _install_locked(self, parsed: Wrapper[E]) -> None:
        table, version, extra = parsed
        # Like the Java broker: persisted entries override the built-in defaults, built-ins stay.
        self._table.update(table)
        if version is not None:
            self._data_version.assign(version)
        self._extra = extra

    def _head_locked(self) -> dict[str, Any]:
        """The file's fields besides the table."""
        head: dict[str, Any] = copy.deepcopy(self._extra) if self._extra else {}
        head["dataVersion"] = self._data_version.to_json_obj()
        return head

    def _snapshot_locked(self) -> dict[str, Any]:
        obj = self._head_locked()
        obj[self.TABLE_KEY] = {name: self._table[name].to_json_obj() for name in sorted(self._table)}
        return dict(sorted(obj.items()))

    async def encode_async(self, extra: Mapping[str, Any] | None = None) -> str:
        """encode() (compact, ``extra`` fields added) in pieces, the event loop let run between them:
        every slave asks for the table every round (GET_ALL_TOPIC_CONFIG,
        GET_ALL_SUBSCRIPTIONGROUP_CONFIG), and 10,000 topics held a master's loop ~35 ms each time.
        The DataVersion is read first, so an entry changed while the pieces are read may show its
        change under the older version; the slave's next round sees the newer one and takes the
        table again."""
        with self._lock:
            head = self._head_locked()
            names = sorted(self._table)
        head.update(extra or {})

        def read(part: Sequence[str]) -> dict[str, Any]:
            with self._lock:
                return {name: entry.to_json_obj() for name in part if (entry := self._table.get(name)) is not None}

        return await join_yielding(object_pieces(head, self.TABLE_KEY, names, read, pretty=False))

    # -- queries --
    @property
    def data_version(self) -> DataVersion:
        """A copy of the current DataVersion."""
        with self._lock:
            return self._data_version.copy()

    def __contains__(self, name: object) -> bool:
        return name in self._table

    def __len__(self) -> int:
        return len(self._table)

    def table(self) -> dict[str, E]:
        with self._lock:
            return dict(self._table)

    # -- slave sync --
    def replace_all(self, table: Mapping[str, E], data_version: DataVersion, *, persist: bool = True) -> bool:
        """Adopt the master's table and version (slave sync, §7.6); no-op when versions are equal."""
        with self._lock:
            if self._data_version == data_version:
                return False
            self._table = dict(table)
            self._data_version.assign(data_version)
            self._mark_changed_locked()
        log.info("%s table replaced from master: %d entries, %s", self.KIND, len(table), data_version)
        self._persist_after_change(persist)
        return True
