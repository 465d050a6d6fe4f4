"""The nameserver's KV config: namespace -> key -> value, kept in RocketMQ's ``kvConfig.json``.

The file is ``{"configTable":{"<namespace>":{"<key>":"<value>"}}}``, as a Java nameserver's
KVConfigManager writes it, so either can read the other's. Namespace ``ORDER_TOPIC_CONFIG`` holds
the order configuration of topics (``brokerName:queueNums;…``) that routes carry as ``orderTopicConf``.

A change is answered only once it is on disk: the new table is written first (atomically, with the
previous content kept as ``.bak``) and becomes the one served after that, so a failed write leaves
both the file and the served table as they were.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from rmqbroker.metadata.errors import MetadataFormatError
from rmqbroker.metadata.jsonfile import atomic_write, fastjson_loads, load_decoded_with_backup, to_json_text

log = logging.getLogger(__name__)

ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"
DEFAULT_PATH = Path("~/namesrv/kvConfig.json")

Table = dict[str, dict[str, str]]


def _scalar_text(namespace: str, key: str, value: Any) -> str:
    # fastjson reads a number or boolean into a String field as its text; so do we.
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise MetadataFormatError(f"configTable[{namespace!r}][{key!r}] is not a string")


def decode_config_table(text: str) -> Table:
    """The ``configTable`` of a ``kvConfig.json`` text; MetadataFormatError when it is not one."""
    doc = fastjson_loads(text)
    if not isinstance(doc, dict):
        raise MetadataFormatError("kvConfig.json is not a JSON object")
    raw = doc.get("configTable") or {}
    if not isinstance(raw, dict):
        raise MetadataFormatError("configTable is not an object")
    table: Table = {}
    for namespace, entries in raw.items():
        if entries is None:
            continue
        if not isinstance(entries, dict):
            raise MetadataFormatError(f"configTable[{namespace!r}] is not an object")
        # fastjson leaves null values out; a hand-edited null means "no value" as well.
        kv = {key: _scalar_text(namespace, key, value) for key, value in entries.items() if value is not None}
        if kv:
            table[namespace] = kv
    return table


def encode_config_table(table: Table) -> str:
    """``kvConfig.json`` text: compact like Java's, namespaces and keys sorted for stable diffs."""
    ordered = {ns: dict(sorted(kv.items())) for ns, kv in sorted(table.items())}
    return to_json_text({"configTable": ordered}, pretty=False)


class KVConfigStore:
    """The KV table and its file (``path`` None: memory only).

    Reads are plain lookups on the event loop thread. Changes are serialised by a lock and written
    in a worker thread, so a slow disk delays only the KV request, never route lookups.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path.expanduser() if path is not None else None
        self._table: Table = {}
        self._lock = asyncio.Lock()

    def load(self) -> None:
        """Read the file (or its ``.bak``); a missing file is an empty table.

        Raises MetadataLoadError when the file has content that neither it nor ``.bak`` decodes:
        starting empty would let the next change overwrite the only copy of the entries.
        """
        if self.path is None:
            return
        table = load_decoded_with_backup(self.path, decode_config_table)
        self._table = table or {}
        log.info("loaded %d KV config namespace(s) from %s", len(self._table), self.path)

    def get(self, namespace: str, key: str) -> str | None:
        return self._table.get(namespace, {}).get(key)

    def namespace(self, namespace: str) -> dict[str, str] | None:
        """A copy of a namespace's entries; None when it has none."""
        kv = self._table.get(namespace)
        return dict(kv) if kv else None

    def snapshot(self) -> Table:
        return {ns: dict(kv) for ns, kv in self._table.items()}

    async def put(self, namespace: str, key: str, value: str) -> None:
        """Create or replace an entry. Raises MetadataPersistError (nothing changed) when it cannot be written."""
        async with self._lock:
            table = dict(self._table)
            previous = table.get(namespace, {})
            table[namespace] = {**previous, key: value}
            await self._commit(table)
        log.info("KV config %s: namespace %s key %s value %s", "updated" if key in previous else "created",
                 namespace, key, value)

    async def delete(self, namespace: str, key: str) -> bool:
        """Remove an entry (a namespace without entries goes too); False when there was none."""
        async with self._lock:
            previous = self._table.get(namespace, {})
            if key not in previous:
                return False
            table = dict(self._table)
            rest = {k: v for k, v in previous.items() if k != key}
            if rest:
                table[namespace] = rest
            else:
                del table[namespace]
            await self._commit(table)
        log.info("KV config deleted: namespace %s key %s", namespace, key)
        return True

    async def _commit(self, table: Table) -> None:
        if self.path is not None:
            await asyncio.to_thread(atomic_write, self.path, encode_config_table(table))
        self._table = table
