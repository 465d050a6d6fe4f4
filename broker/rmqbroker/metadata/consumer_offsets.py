"""Committed consumer offsets and ``consumerOffset.json`` (§5.2).

The table is keyed ``"<topic>@<group>"`` with a ``{queueId: nextOffsetToConsume}`` map per key.
Unlike topics it is not persisted on every commit: the broker flushes it periodically (5 s) and at
shutdown, and the ``dirty`` flag lets it skip the write when nothing was committed.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rmqbroker.metadata._coerce import as_bool, as_int, as_object, checked_int_keyed, plain_int_keyed
from rmqbroker.metadata.base import JsonConfigFile
from rmqbroker.metadata.errors import MetadataFormatError
from rmqbroker.metadata.jsonfile import PIECE_KEYS, fastjson_loads, join_yielding, object_pieces

log = logging.getLogger(__name__)

TOPIC_GROUP_SEPARATOR = "@"

OffsetTable = dict[str, dict[int, int]]
# (key, queueId) -> (the master's offset as last synced, whether handed to the master since)
SlaveCommits = dict[tuple[str, int], tuple[int, bool]]
_Parsed = tuple[OffsetTable, dict[str, Any], SlaveCommits]

# Top-level field of consumerOffset.json holding a slave's SlaveCommits (so a restarted slave still
# keeps and hands over what a group committed to it while its master was away). Java's decoder
# ignores fields it does not know; a master never writes it.
SLAVE_COMMITS_FIELD = "slaveCommits"


def offset_key(topic: str, group: str) -> str:
    return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"


def split_offset_key(key: str) -> tuple[str, str] | None:
    """``(topic, group)`` of a table key, or None for a malformed key (skipped by the helpers)."""
    parts = key.split(TOPIC_GROUP_SEPARATOR)
    if len(parts) != 2:
        return None
    return parts[0], parts[1]


def _decode_obj(obj: Any) -> _Parsed:
    data = as_object(obj, "consumer offsets")
    table: OffsetTable = {}
    raw_table = data.get("offsetTable")
    if raw_table is not None:
        for key, raw in as_object(raw_table, "offsetTable").items():
            plain = plain_int_keyed(raw)
            table[key] = plain if plain is not None else checked_int_keyed(raw, f"offsetTable[{key}]")
    extra = {k: v for k, v in data.items() if k not in ("offsetTable", SLAVE_COMMITS_FIELD)}
    commits: SlaveCommits = {}
    raw_commits = data.get(SLAVE_COMMITS_FIELD)
    if raw_commits is not None:
        try:
            commits = _decode_slave_commits(raw_commits, table)
        except MetadataFormatError as exc:
            # A damaged annotation must not cost the offsets themselves: without it this slave
            # takes the master's offsets, as RocketMQ does.
            log.warning("consumer offsets: ignoring %s: %s", SLAVE_COMMITS_FIELD, exc)
    return table, extra, commits


def _decode_slave_commits(raw: Any, table: OffsetTable) -> SlaveCommits:
    commits: SlaveCommits = {}
    for key, queues in as_object(raw, SLAVE_COMMITS_FIELD).items():
        for qid, entry in as_object(queues, f"{SLAVE_COMMITS_FIELD}[{key}]").items():
            what = f"{SLAVE_COMMITS_FIELD}[{key}][{qid}]"
            fields = as_object(entry, what)
            queue_id = as_int(qid, f"{what} key")
            if queue_id in table.get(key, {}):  # an entry without its offset says nothing
                commits[(key, queue_id)] = (as_int(fields.get("masterOffset"), f"{what}.masterOffset"),
                                            as_bool(fields.get("handedOver", False), f"{what}.handedOver"))
    return commits


def _encode_slave_commits(commits: SlaveCommits) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (key, queue_id), (base, handed) in sorted(commits.items()):
        out.setdefault(key, {})[str(queue_id)] = {"masterOffset": base, "handedOver": handed}
    return out


def decode_consumer_offsets(text: str | bytes) -> OffsetTable:
    """Parse consumerOffset.json / a GET_ALL_CONSUMER_OFFSET body (quoted or bare int keys).

    Standard JSON is read one offset table entry at a time, so that a slave decoding its master's
    table in a worker thread gives the event loop the GIL between entries: one ``json.loads`` of
    hundreds of thousands of queue offsets holds it ~70 ms at once. Anything else (fastjson's
    bare integer keys, as a Java master writes them) is read whole, as before."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MetadataFormatError("metadata JSON is not valid UTF-8") from exc
    try:
        return _offset_table_by_entry(text.removeprefix("\ufeff"))
    except _NotPlainJson:
        table, _, _ = _decode_obj(fastjson_loads(text))
        return table


class _NotPlainJson(Exception):
    pass


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
_BLANKS = frozenset(" \t\n\r")


class _Scanner:
    """A cursor over standard JSON text that reads an object member by member."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def space(self) -> None:
        if self.text[self.at:self.at + 1] in _BLANKS:  # compact text has none: no regex then
            match = _SPACE.match(self.text, self.at)
            self.at = match.end() if match else self.at

    def take(self, char: str) -> bool:
        self.space()
        if self.text.startswith(char, self.at):
            self.at += 1
            return True
        return False

    def expect(self, char: str) -> None:
        if not self.take(char):
            raise _NotPlainJson

    def value(self) -> Any:
        self.space()
        try:
            obj, self.at = _DECODER.raw_decode(self.text, self.at)
        except ValueError as exc:
            raise _NotPlainJson from exc
        return obj

    def members(self) -> Iterator[str]:
        """The keys of the object starting here; at each, the caller reads its value."""
        self.expect("{")
        if self.take("}"):
            return
        while True:
            self.space()
            if not self.text.startswith('"', self.at):
                raise _NotPlainJson
            key = self.value()
            self.expect(":")
            yield key
            if self.take("}"):
                return
            self.expect(",")

    def offset_table(self, table: OffsetTable) -> None:
        """Read the ``{key: {queueId: offset}}`` object starting here into ``table``: members()
        and value() inlined, for the hundreds of thousands of entries a master may send."""
        self.expect("{")
        text, decode, space = self.text, _DECODER.raw_decode, _SPACE.match
        at = self.at
        try:
            at = space(text, at).end()  # type: ignore[union-attr]  # matches the empty string
            if text.startswith("}", at):
                self.at = at + 1
                return
            while True:
                key, at = decode(text, at)
                at = space(text, at).end()  # type: ignore[union-attr]
                if type(key) is not str or not text.startswith(":", at):
                    raise _NotPlainJson
                raw, at = decode(text, space(text, at + 1).end())  # type: ignore[union-attr]
                plain = plain_int_keyed(raw)
                table[key] = plain if plain is not None else checked_int_keyed(raw, f"offsetTable[{key}]")
                at = space(text, at).end()  # type: ignore[union-attr]
                if text.startswith("}", at):
                    self.at = at + 1
                    return
                if not text.startswith(",", at):
                    raise _NotPlainJson
                at = space(text, at + 1).end()  # type: ignore[union-attr]
        except ValueError as exc:  # raw_decode's JSONDecodeError, not MetadataFormatError
            if isinstance(exc, MetadataFormatError):
                raise
            raise _NotPlainJson from exc


def _offset_table_by_entry(text: str) -> OffsetTable:
    """The ``offsetTable`` of a standard JSON object, decoded entry by entry (the other fields are
    read and left); _NotPlainJson when the text is not such an object."""
    scanner = _Scanner(text)
    table: OffsetTable = {}
    for field in scanner.members():
        if field == "offsetTable":
            table = {}  # as json.loads: the last of repeated fields counts
            scanner.offset_table(table)
        else:
            scanner.value()
    scanner.space()
    if scanner.at != len(text):
        raise _NotPlainJson
    return table


def encode_offset_table(table: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    return {key: {str(q): table[key][q] for q in sorted(table[key])} for key in sorted(table)}


class ConsumerOffsetManager(JsonConfigFile[_Parsed]):
    """The ``topic@group -> {queueId: offset}`` table behind QUERY/UPDATE_CONSUMER_OFFSET."""

    FILE_NAME = "consumerOffset.json"

    def __init__(self, config_dir: Path, *, autoload: bool = True) -> None:
        super().__init__(config_dir)
        self._table: OffsetTable = {}
        self._extra: dict[str, Any] = {}
        # Slave only: (key, queueId) -> (the master's offset as last synced, whether this slave has
        # handed the master its commits since), for queues a group committed to this slave (its
        # master away: stock clients commit to any broker of the group's route). See merge_all.
        # Persisted with the offsets (SLAVE_COMMITS_FIELD), so a restart keeps them.
        self._ahead_of_master: SlaveCommits = {}
        if autoload:
            self.load()

    # -- JsonConfigFile hooks -------------------------------------------------------------------

    def _parse(self, text: str) -> _Parsed:
        return _decode_obj(fastjson_loads(text))

    def _install_locked(self, parsed: _Parsed) -> None:
        self._table, self._extra, self._ahead_of_master = parsed

    def _file_text(self) -> tuple[int, str]:
        with self._lock:
            generation = self._generation
        return generation, "".join(self._pieces(pretty=True))

    def _pieces(self, pretty: bool) -> Iterator[str]:
        """The file's JSON text in pieces (object_pieces), so that a caller on the event loop can
        let it run between them: for a table of hundreds of thousands of queue offsets one whole
        encoding held the loop for ~0.25 s. Each key's queues are as they were when its piece was
        read (as Java's ConcurrentHashMap is serialised), not one atomic snapshot."""
        with self._lock:
            head = self._head_locked()
            keys = sorted(self._table)

        def read(names: Sequence[str]) -> dict[str, dict[str, int]]:
            with self._lock:
                return {key: {str(q): queues[q] for q in sorted(queues)} for key in names
                        if (queues := self._table.get(key)) is not None}

        return object_pieces(head, "offsetTable", keys, read, pretty=pretty)

    async def encode_async(self) -> str:
        """encode(), with the event loop let run between the pieces (GET_ALL_CONSUMER_OFFSET)."""
        return await join_yielding(self._pieces(pretty=False))

    async def persist_async(self) -> None:
        """Persist with the text built on the loop, piece by piece, and written (fsync) by a worker
        thread."""
        with self._lock:
            generation = self._generation
        text = await join_yielding(self._pieces(pretty=True))
        await asyncio.to_thread(self._write_unless_older, generation, text)

    def _head_locked(self) -> dict[str, Any]:
        """The file's fields besides the offset table."""
        head: dict[str, Any] = copy.deepcopy(self._extra) if self._extra else {}
        if self._ahead_of_master:
            head[SLAVE_COMMITS_FIELD] = _encode_slave_commits(self._ahead_of_master)
        return head

    def _snapshot_locked(self) -> dict[str, Any]:
        return dict(sorted({**self._head_locked(), "offsetTable": encode_offset_table(self._table)}.items()))

    # -- offsets --------------------------------------------------------------------------------

    def commit(self, group: str, topic: str, queue_id: int, offset: int, client_host: str = "", *,
               on_slave: bool = False) -> None:
        """Record the next offset ``group`` will consume from ``topic``/``queue_id``; ``on_slave``:
        committed by a client to this broker while it is a slave (kept over the master's stale
        offset by ``merge_all``)."""
        key = offset_key(topic, group)
        with self._lock:
            queues = self._table.get(key)
            if queues is None:
                queues = self._table[key] = {}
            previous = queues.get(queue_id)
            if on_slave:
                # The master's offset is the one before the first commit here since the last sync.
                if (key, queue_id) not in self._ahead_of_master:
                    self._ahead_of_master[(key, queue_id)] = (-1 if previous is None else previous, False)
                    self._mark_changed_locked()
            elif self._ahead_of_master.pop((key, queue_id), None) is not None:
                self._mark_changed_locked()
            if previous == offset:
                return
            queues[queue_id] = offset
            self._mark_changed_locked()
        if previous is not None and offset < previous:
            # After a reset, and routinely around a rebalance (a client commits the offset of a
            # queue it has just given up); a trace for stale clients, not an operator's warning.
            log.info(
                "offset of %s moved back: %s queue %d %d -> %d (from %s)",
                group,
                topic,
                queue_id,
                previous,
                offset,
                client_host,
            )

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed one for this queue."""
        queues = self._table.get(offset_key(topic, group))
        if queues is None:
            return -1
        return queues.get(queue_id, -1)

    def query_all(self, group: str, topic: str) -> dict[int, int]:
        """All committed queue offsets of ``group`` on ``topic`` (a copy; empty when none)."""
        with self._lock:
            return dict(self._table.get(offset_key(topic, group), {}))

    def offsets_for_group(self, group: str) -> dict[str, dict[int, int]]:
        """``{topic: {queueId: offset}}`` for every topic ``group`` has committed on."""
        result: dict[str, dict[int, int]] = {}
        with self._lock:
            for key, queues in self._table.items():
                parts = split_offset_key(key)
                if parts is not None and parts[1] == group:
                    result[parts[0]] = dict(queues)
        return result

    def which_groups_by_topic(self, topic: str) -> set[str]:
        with self._lock:
            keys = list(self._table)
        return {p[1] for p in map(split_offset_key, keys) if p is not None and p[0] == topic}

    def which_topics_by_group(self, group: str) -> set[str]:
        with self._lock:
            keys = list(self._table)
        return {p[0] for p in map(split_offset_key, keys) if p is not None and p[1] == group}

    def remove_offsets(self, group: str | None = None, topic: str | None = None) -> bool:
        """Forget the offsets of ``group`` and/or on ``topic`` (a group on one topic, a group on all,
        or every group on a deleted topic); True if anything was removed."""
        if group is None and topic is None:
            raise ValueError("remove_offsets needs a group or a topic")
        with self._lock:
            doomed = [
                key
                for key in self._table
                if (parts := split_offset_key(key)) is not None
                and (group is None or parts[1] == group)
                and (topic is None or parts[0] == topic)
            ]
            self._drop_locked(doomed)
        if doomed:
            log.info("removed offsets of group %s on topic %s: %s", group or "*", topic or "*", doomed)
        return bool(doomed)

    def _drop_locked(self, doomed: list[str]) -> None:
        """Forget the ``topic@group`` entries ``doomed`` (all present) and what was committed to them here."""
        if not doomed:
            return
        gone = set(doomed)
        for key in gone:
            del self._table[key]
        self._ahead_of_master = {k: v for k, v in self._ahead_of_master.items() if k[0] not in gone}
        self._mark_changed_locked()

    def remove_keys(self, keys: Iterable[str]) -> bool:
        """Forget the given ``topic@group`` entries; True if any existed."""
        with self._lock:
            doomed = [key for key in keys if key in self._table]
            self._drop_locked(doomed)
        if doomed:
            log.info("removed offsets %s", doomed)
        return bool(doomed)

    def clone_offset(self, src_group: str, dst_group: str, topic: str) -> bool:
        """Copy ``src_group``'s offsets on ``topic`` to ``dst_group`` (CLONE_GROUP_OFFSET)."""
        with self._lock:
            source = self._table.get(offset_key(topic, src_group))
            if source is None:
                return False
            self._table[offset_key(topic, dst_group)] = dict(source)
            self._mark_changed_locked()
        return True

    def forget_slave_commits(self) -> None:
        """This broker is a master now: no commit made here is measured against another master."""
        with self._lock:
            if self._ahead_of_master:
                self._ahead_of_master.clear()
                self._mark_changed_locked()

    def keys_committed_here(self) -> set[str]:
        """The ``topic@group`` keys with a queue a group committed to this slave that the master has
        nothing newer than (see merge_all)."""
        with self._lock:
            return {key for key, _ in self._ahead_of_master}

    def awaits_hand_over(self) -> bool:
        """Whether a commit made here is kept over the master's and not handed over yet."""
        return bool(self.kept_over_master())

    def kept_over_master(self) -> list[tuple[str, str, int, int]]:
        """``(group, topic, queueId, offset)`` of every commit ``merge_all`` keeps over the master's."""
        out: list[tuple[str, str, int, int]] = []
        with self._lock:
            for (key, queue_id), (base, _) in self._ahead_of_master.items():
                offset = self._table.get(key, {}).get(queue_id)
                parts = split_offset_key(key)
                if offset is not None and offset != base and parts is not None:
                    out.append((parts[1], parts[0], queue_id, offset))
        return out

    def relayed(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """The master now has ``offset`` from this slave: it is the master's offset commits here are
        measured against (one the group makes here later is kept and handed on in turn, not lost to
        the master's next report)."""
        pending = (offset_key(topic, group), queue_id)
        with self._lock:
            if pending in self._ahead_of_master:
                self._ahead_of_master[pending] = (offset, True)
                self._mark_changed_locked()

    def table(self) -> OffsetTable:
        """A deep copy of the whole table."""
        with self._lock:
            return {key: dict(queues) for key, queues in self._table.items()}

    def table_keys(self) -> list[str]:
        """The ``topic@group`` keys of the table."""
        with self._lock:
            return list(self._table)

    def entries(self, keys: Iterable[str]) -> OffsetTable:
        """A copy of the named keys' queues (keys not in the table left out)."""
        with self._lock:
            return {key: dict(queues) for key in keys if (queues := self._table.get(key)) is not None}

    def merge_all(self, table: Mapping[str, Mapping[int, int]]) -> bool:
        """Slave sync (§7.6): each incoming ``topic@group`` entry replaces the local one (RocketMQ's
        putAll), except a queue offset committed here that the master knows nothing newer than.
        RocketMQ 4.9 takes the master's there too, so a group that committed here while the master
        was down re-consumes all of it if this slave is promoted later, or when it restarts against
        the master, which never got those commits (SlaveMetadataSync hands them over). Until this
        slave has handed its commits to the master, a master offset at or below the one last
        synced is taken for the master's stale table (a kill -9 also loses up to
        flushConsumerOffsetInterval of its commits); after, any offset but the one handed over is
        the master's own (the group committed there, or it was reset) and wins. True if anything
        changed."""
        with self._lock:
            return self._merge_locked(table.items())

    async def merge_all_async(self, table: Mapping[str, Mapping[int, int]]) -> bool:
        """merge_all() in slices of PIECE_KEYS keys, the event loop let run between them (a slave
        merges its master's whole table each round)."""
        items = list(table.items())
        changed = False
        for start in range(0, len(items), PIECE_KEYS):
            with self._lock:
                changed |= self._merge_locked(items[start:start + PIECE_KEYS])
            await asyncio.sleep(0)
        return changed

    def _merge_locked(self, items: Iterable[tuple[str, Mapping[int, int]]]) -> bool:
        changed = False
        pending_keys = {key for key, _ in self._ahead_of_master}
        for key, queues in items:
            if key not in pending_keys:
                # Nothing committed here: the master's queues as they are (compared first, so that
                # an unchanged table of hundreds of thousands of offsets costs no copies).
                if self._table.get(key, {}) != queues:
                    self._table[key] = dict(queues)
                    changed = True
                continue
            merged = dict(queues)
            current = self._table.get(key, {})
            for queue_id in list(current):
                pending = self._ahead_of_master.get((key, queue_id))
                if pending is None:
                    continue
                base, handed = pending
                theirs = merged.get(queue_id, -1)
                # Before the hand-over, a master offset between the base and the group's commit
                # here is stale too: the base is the master's offset as of the last round before
                # the outage, and the master may come back with a later one that still predates
                # every commit made here (one flushed after that round and before a kill -9; a
                # hung master, SIGSTOP, applies on resuming the commits queued in its sockets).
                # A group's commits only move forward, except resets: one made on the returned
                # master before the hand-over is overridden, as with their offsets below the base.
                mine = current[queue_id]
                if theirs == base or (not handed and (theirs < base or theirs < mine)):
                    merged[queue_id] = mine
                else:
                    del self._ahead_of_master[(key, queue_id)]
                    changed = True
            if merged != current:
                self._table[key] = merged
                changed = True
        if changed:
            self._mark_changed_locked()
        return changed
