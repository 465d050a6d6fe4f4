"""JSON files the way RocketMQ keeps them: fastjson-tolerant parsing, crash-safe writes, ``.bak`` fallback.

Java brokers write metadata with fastjson, which emits ``Map<Integer, …>`` keys unquoted
(``{"offsetTable":{"T@G":{0:12}}}``).  We read that form and standard JSON alike, and always write
standard JSON (quoted keys), which fastjson reads back, so files stay interchangeable (§5).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rmqbroker.metadata.errors import MetadataFormatError, MetadataLoadError, MetadataPersistError

log = logging.getLogger(__name__)

T = TypeVar("T")

TMP_SUFFIX = ".tmp"
BAK_SUFFIX = ".bak"

# Only the tokens that decide whether a bare integer is an object key are matched; whitespace and
# scalar values are skipped by finditer.  A string literal is matched whole (escapes included), so
# digits and colons inside strings are never looked at.  In valid JSON a ":" can only follow a key,
# hence "integer followed by colon" right after "{" or "," is a fastjson integer key.
_SIGNIFICANT = re.compile(
    r"""
    "[^"\\]*(?:\\.[^"\\]*)*"
  | [{}\[\],:]
  | (?<![\w.+-])-?[0-9]+(?=[\ \t\r\n]*:)
    """,
    re.VERBOSE | re.DOTALL,
)


def _quote_numeric_keys(text: str) -> str:
    """Rewrite fastjson's bare integer object keys as quoted strings; everything else is copied."""
    out: list[str] = []
    copied_upto = 0
    # Open containers: a bare integer is a key only right after "{" or after "," inside an object.
    stack: list[str] = []
    key_expected = False
    for match in _SIGNIFICANT.finditer(text):
        token = match.group()
        first = token[0]
        if first in {'"', ":"}:
            key_expected = False
        elif first in "{[":
            stack.append(first)
            key_expected = first == "{"
        elif first in "}]":
            if stack:
                stack.pop()
            key_expected = False
        elif first == ",":
            key_expected = bool(stack) and stack[-1] == "{"
        else:
            if key_expected:
                out.append(text[copied_upto : match.start()])
                out.append(f'"{token}"')
                copied_upto = match.end()
            key_expected = False
    if not out:
        return text
    out.append(text[copied_upto:])
    return "".join(out)


def fastjson_loads(text: str | bytes) -> Any:
    """Parse standard JSON or fastjson output with unquoted (possibly negative) integer keys.

    Object keys always come back as ``str`` (as with :func:`json.loads`); callers convert the
    integer-keyed maps themselves.  Raises :class:`MetadataFormatError` on anything unparseable.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MetadataFormatError("metadata JSON is not valid UTF-8") from exc
    text = text.removeprefix("\ufeff")
    try:
        return json.loads(text)
    except RecursionError as exc:
        # Nesting deeper than the interpreter's stack: malformed for every metadata document, and
        # not a ValueError, so callers that treat a bad body as a failed request would crash on it.
        raise MetadataFormatError("invalid JSON: nested too deeply") from exc
    except json.JSONDecodeError as first_error:
        fixed = _quote_numeric_keys(text)
        if fixed is text:
            raise MetadataFormatError(f"invalid JSON: {first_error}") from first_error
        try:
            return json.loads(fixed)
        except RecursionError as exc:
            raise MetadataFormatError("invalid JSON: nested too deeply") from exc
        except json.JSONDecodeError as exc:
            raise MetadataFormatError(f"invalid JSON: {exc}") from exc


# A MessageQueue where fastjson writes it as a map key (TopicStatsTable, ConsumeStats): the bare
# object, fields in name order. Not valid JSON; every RocketMQ client parses it. The C++ client
# writes the same keys pretty-printed (ConsumerRunningInfo), hence the optional whitespace.
MessageQueue = tuple[str, str, int]  # (topic, brokerName, queueId)
_MQ_KEY = re.compile(r'\{\s*"brokerName"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"queueId"\s*:\s*(-?\d+)\s*,'
                     r'\s*"topic"\s*:\s*("(?:[^"\\]|\\.)*")\s*\}\s*:')


def mq_key(broker_name: str, topic: str, queue_id: int) -> str:
    """The map key fastjson writes for a MessageQueue."""
    return f'{{"brokerName":{json.dumps(broker_name)},"queueId":{queue_id},"topic":{json.dumps(topic)}}}'


def dumps_mq_keyed(table: str, entries: Iterable[tuple[str, str, int, Any]], **fields: Any) -> bytes:
    """A body whose ``table`` member is keyed by MessageQueue objects, as fastjson writes it (the
    counterpart of :func:`loads_mq_keyed`): ``entries`` are ``(brokerName, topic, queueId, value)``,
    ``fields`` the document's other members. Members in name order, compact, like fastjson."""
    members = [f"{json.dumps(k)}:{json.dumps(v, separators=(',', ':'), sort_keys=True)}" for k, v in fields.items()]
    rows = ",".join(f"{mq_key(broker, topic, qid)}:{json.dumps(value, separators=(',', ':'), sort_keys=True)}"
                    for broker, topic, qid, value in entries)
    members.append(f"{json.dumps(table)}:{{{rows}}}")
    return ("{" + ",".join(sorted(members)) + "}").encode("utf-8")


def loads_with_mq_keys(body: bytes) -> tuple[Any, list[MessageQueue]]:
    """A document whose maps may be keyed by MessageQueue objects at any depth (ConsumeStatsList
    nests ConsumeStats): each such key is replaced by the string of its index in the returned list.
    Raises :class:`MetadataFormatError` when the body is not UTF-8 or not JSON once keys are replaced."""
    queues: list[MessageQueue] = []

    def placeholder(m: re.Match[str]) -> str:
        queues.append((json.loads(m[3]), json.loads(m[1]), int(m[2])))
        return f'"{len(queues) - 1}":'

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MetadataFormatError("not valid UTF-8") from exc
    return fastjson_loads(_MQ_KEY.sub(placeholder, text)), queues


def loads_mq_keyed(body: bytes, table: str) -> tuple[dict[str, Any], dict[MessageQueue, Any]]:
    """A body whose ``table`` member is keyed by MessageQueue objects: the document, and that table
    keyed by ``(topic, brokerName, queueId)``. Raises :class:`MetadataFormatError` when a key is not
    in fastjson's form (whitespace aside)."""
    doc, queues = loads_with_mq_keys(body)
    if not isinstance(doc, dict) or not isinstance(doc.get(table, {}), dict):
        raise MetadataFormatError(f"no {table} object")
    try:
        return doc, {queues[int(k)]: v for k, v in doc.get(table, {}).items()}
    except (ValueError, IndexError) as exc:  # a key that was not a MessageQueue
        raise MetadataFormatError(f"{table}: a key is not a MessageQueue") from exc


# One encoder for every compact text: json.dumps builds a new one per call given these arguments.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def to_json_text(obj: Any, *, pretty: bool) -> str:
    """Serialise like fastjson: compact ``"k":v`` separators, tab-indented when pretty, UTF-8 kept raw."""
    if pretty:
        return json.dumps(obj, indent="\t", separators=(",", ":"), ensure_ascii=False)
    return _COMPACT(obj)


# Table entries read and encoded per piece of object_pieces(): about a millisecond for entries of a
# few fields (a consumer offset key of 8 queues, a topic config).
PIECE_KEYS = 256


def object_pieces(head: Mapping[str, Any], table_field: str, keys: Sequence[str],
                  read: Callable[[Sequence[str]], Mapping[str, Any]], *, pretty: bool) -> Iterator[str]:
    """The JSON text of ``head`` with ``table_field`` added (fields in sorted order, as
    to_json_text's callers sort them), in pieces: the table's entries are read by ``read`` and
    encoded PIECE_KEYS ``keys`` at a time, each as it is when its piece is due (read takes the
    table's lock for its slice), so that a caller on the event loop can let it run between pieces.
    Compact, or ``pretty``: one field of ``head`` and one table entry per line."""
    newline, indent = ("\n", "\t") if pretty else ("", "")
    fields = sorted([*head, table_field])
    yield "{" + newline
    for n, name in enumerate(fields):
        end = ("," if n < len(fields) - 1 else "") + newline
        if name != table_field:
            yield f"{indent}{_COMPACT(name)}:{_COMPACT(head[name])}{end}"
            continue
        yield f"{indent}{_COMPACT(name)}:{{{newline if keys else ''}"
        first = True
        for start in range(0, len(keys), PIECE_KEYS):
            piece = read(keys[start:start + PIECE_KEYS])
            if not piece:
                continue
            if pretty:
                text = f",\n{indent * 2}".join(f"{_COMPACT(key)}:{_COMPACT(value)}" for key, value in piece.items())
            else:
                text = _COMPACT(piece)[1:-1]
            yield ("" if first else "," + newline) + indent * 2 + text
            first = False
        yield (newline + indent if keys else "") + "}" + end
    yield "}"


async def join_yielding(pieces: Iterable[str]) -> str:
    """The pieces joined, the event loop let run after each."""
    out: list[str] = []
    for piece in pieces:
        out.append(piece)
        await asyncio.sleep(0)
    return "".join(out)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        log.debug("cannot open %s to fsync it: %s", directory, exc)
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems refuse fsync on directories; the rename itself is still atomic there.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _write_and_fsync(path: Path, data: bytes, mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # a tmp file left by a crash keeps its old mode otherwise
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def _rotate_backup(path: Path, bak: Path) -> None:
    """Make ``bak`` hold the current content of ``path`` without ever leaving ``bak`` half-written."""
    try:
        if path.stat().st_size == 0:
            # An empty file is never a better backup than the one we already have.
            return
    except FileNotFoundError:
        return
    staging = bak.with_name(bak.name + TMP_SUFFIX)
    staging.unlink(missing_ok=True)
    try:
        # The live file is only ever replaced, never rewritten in place, so a hard link is a
        # frozen copy of the old content at no I/O cost.
        os.link(path, staging)
    except OSError:
        _write_and_fsync(staging, path.read_bytes())
    os.replace(staging, bak)


def atomic_write(path: Path, text: str | bytes, *, mode: int = 0o644, backup: bool = True) -> None:
    """Write ``text`` (or bytes as they are) to ``path`` so a crash leaves either the old or the new content.

    Steps: write and fsync ``<file>.tmp`` (created with ``mode``); keep the current content as
    ``<file>.bak`` (unless ``backup`` is off: a file of secrets gets no second copy); rename the
    tmp file over ``<file>``; fsync the directory.  Raises :class:`MetadataPersistError`.
    """
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    bak = path.with_name(path.name + BAK_SUFFIX)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_and_fsync(tmp, text if isinstance(text, bytes) else text.encode("utf-8"), mode)
        if backup:
            _rotate_backup(path, bak)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            log.debug("could not remove %s after a failed write", tmp)
        raise MetadataPersistError(f"failed to write {path}: {exc}") from exc


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MetadataLoadError(f"cannot read {path}: {exc}") from exc


def load_decoded_with_backup(path: Path, decode: Callable[[str], T]) -> T | None:
    """Load ``path`` through ``decode``, falling back to ``<file>.bak``.

    The backup is used when the file is missing, empty, not UTF-8, or ``decode`` raises
    ``ValueError``/``TypeError``/``KeyError`` on it.  Returns ``None`` when the file does not exist
    and has no backup (a fresh broker).  Raises :class:`MetadataLoadError` when content exists but
    none of it decodes, and when the file exists but is empty with no usable backup: writes here
    never leave an empty file, so one is a lost write, and starting empty would drop every topic
    or offset it held at the next persist.
    """
    path = Path(path)
    bak = path.with_name(path.name + BAK_SUFFIX)
    data = _read_bytes(path)
    main_error: Exception | None = None
    if data is not None and data.strip():
        try:
            return decode(data.decode("utf-8"))
        except (ValueError, TypeError, KeyError) as exc:
            main_error = exc
            log.warning("%s is corrupt (%s); trying %s", path, exc, bak.name)
    backup = _read_bytes(bak)
    if backup is None or not backup.strip():
        if main_error is not None:
            raise MetadataLoadError(f"{path} is corrupt and there is no usable {bak.name}") from main_error
        if data is not None:
            raise MetadataLoadError(f"{path} is empty and there is no usable {bak.name}; remove it to start "
                                    "without what it held")
        return None
    try:
        result = decode(backup.decode("utf-8"))
    except (ValueError, TypeError, KeyError) as exc:
        raise MetadataLoadError(f"neither {path} nor {bak.name} can be decoded") from exc
    if main_error is None:
        log.warning("%s is missing or empty; loaded %s instead", path, bak.name)
    else:
        log.warning("loaded %s instead of corrupt %s", bak.name, path)
    return result


def load_with_backup(path: Path) -> str | None:
    """Return the text of ``path``, or of ``<file>.bak`` when the file is missing/empty/unparseable."""

    def check(text: str) -> str:
        fastjson_loads(text)
        return text

    return load_decoded_with_backup(path, check)
