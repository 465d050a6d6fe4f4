"""broker.conf on disk: whether a run-time change can be saved there, and saving it in place.

A saved change rewrites only the lines of the changed keys (comments, order and every other line
stay as they are) and appends keys the file did not have; the file is replaced atomically and
keeps its mode. A file without write permission (a Kubernetes ConfigMap, a file the operator
made read-only) is left alone: its owner decides what the broker starts with.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from rmqbroker.metadata.errors import MetadataPersistError
from rmqbroker.metadata.jsonfile import atomic_write
from rmqbroker.properties import property_line

log = logging.getLogger(__name__)


class ConfWriteError(OSError):
    """broker.conf could not be rewritten; the message says which file and why."""


def rewrite_properties(text: str, changes: Mapping[str, str]) -> str:
    """``text`` (Java properties) with each key of ``changes`` set: every line of that key gets the
    new value (keeping its indentation and line ending), keys without a line are appended in the
    order given. Other lines are returned byte for byte."""
    lines = text.splitlines(keepends=True)
    seen: set[str] = set()
    for i, raw in enumerate(lines):
        entry = property_line(raw)
        if entry is None or entry[0] not in changes:
            continue
        key = entry[0]
        body = raw.rstrip("\r\n")
        ending = raw[len(body):]
        indent = body[:len(body) - len(body.lstrip())]
        lines[i] = f"{indent}{key}={changes[key]}{ending}"
        seen.add(key)
    missing = [k for k in changes if k not in seen]
    if missing and lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += "\n"
    lines.extend(f"{key}={changes[key]}\n" for key in missing)
    return "".join(lines)


def unwritable_reason(path: Path) -> str | None:
    """Why a change cannot be saved to ``path``, or None when it can.

    A file with no write bit counts as read-only even for root (who could write it anyway): its
    owner marked it so on purpose."""
    target = path.resolve()
    try:
        st = target.stat()
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror})"
    if not st.st_mode & 0o222:
        return f"{path} is read-only (mode {st.st_mode & 0o777:04o})"
    try:
        read_only_fs = bool(os.statvfs(target.parent).f_flag & os.ST_RDONLY)
    except OSError:
        read_only_fs = False
    if read_only_fs:
        return f"{path} is on a read-only file system"
    if not os.access(target, os.W_OK):
        return f"{path} is not writable by this process"
    if not os.access(target.parent, os.W_OK | os.X_OK):
        # The atomic replace writes a temporary file next to it.
        return f"the directory of {path} is not writable by this process"
    return None


def save_changes(path: Path, changes: Mapping[str, str]) -> None:
    """Rewrite broker.conf at ``path`` (a symlink's target) with ``changes``, atomically, keeping its
    mode and owner. Raises :class:`ConfWriteError`."""
    target = path.resolve()
    try:
        st = target.stat()
        text = target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfWriteError(f"cannot read {path}: {exc}") from exc
    mode = st.st_mode & 0o777
    try:
        # No .bak copy: broker.conf may hold the admin token, and a stray copy would outlive its rotation.
        atomic_write(target, rewrite_properties(text, changes), mode=mode, backup=False)
        new = target.stat()
        if new.st_mode & 0o777 != mode:  # the umask narrowed the new file's mode
            os.chmod(target, mode)
        if (new.st_uid, new.st_gid) != (st.st_uid, st.st_gid):  # only possible as root
            os.chown(target, st.st_uid, st.st_gid)
    except (MetadataPersistError, OSError) as exc:
        raise ConfWriteError(f"cannot write {path}: {exc}") from exc
    log.info("saved %s to %s", ", ".join(sorted(changes)), path)
