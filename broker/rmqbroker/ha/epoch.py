"""Replication epochs: which master wrote which part of the commitlog.

``config/epoch.json`` holds the current epoch and the history of epoch starts
``[{"epoch": e, "startOffset": o}, ...]``, and a slave's fence (``fencedBelowEpoch``, see
:meth:`EpochStore.fence_below`). A broker promoted at epoch ``e`` appends
``(e, its log end)``; a slave adopts its master's history. When a broker starts following a
master, the last epoch both histories share tells where their logs can differ: everything this
broker holds beyond the master's end of that epoch was never on the new master and is truncated.

It also holds the log's identity (``logId``), drawn by the master that began the log and taken
over by every broker that follows it. Epochs cannot tell two logs apart that both began at epoch
0: a master back on a replaced, empty volume starts a new log at epoch 0 whose offsets a slave
would take as the continuation of its own. The identity tells them apart. One drawn for a log
that already held bytes (a store from before identities existed) ends in ``@<offset>``: another
broker of that log may have drawn its own, so such identities say nothing (:func:`other_logs`).
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqbroker.metadata.jsonfile import atomic_write, load_with_backup

log = logging.getLogger(__name__)

FILE_NAME = "epoch.json"


class EpochError(ValueError):
    """An epoch change that would go backwards, or a malformed history."""


class EpochChangedError(EpochError):
    """An adoption based on an epoch state that has changed since it was read (a promotion, a
    demotion or another adoption came in between): the handshake must be redone against the
    current state."""


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


def parse_history(obj: Any) -> list[EpochEntry]:
    if not isinstance(obj, list):
        raise EpochError("epoch history must be a list")
    out = []
    for item in obj:
        if not isinstance(item, dict):
            raise EpochError("epoch entry must be an object")
        try:
            out.append(EpochEntry(int(item["epoch"]), int(item["startOffset"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise EpochError(f"bad epoch entry {item!r}") from exc
    for a, b in itertools.pairwise(out):
        if b.epoch <= a.epoch or b.start_offset < a.start_offset:
            raise EpochError("epoch history must increase")
    return out


def _with_origin(history: list[EpochEntry]) -> list[EpochEntry]:
    # A group's first master never records a promotion: epoch 0 implicitly starts at offset 0.
    if not history or history[0].epoch > 0:
        return [EpochEntry(0, 0), *history]
    return history


def divergence_offset(own: list[EpochEntry], master: list[EpochEntry], master_max: int) -> int:
    """Offset beyond which this log may differ from the master's.

    The last epoch present in both histories ends, on the master, where the master's next epoch
    starts (or at the master's log end if it is the master's current epoch), and on this broker
    where its own next epoch starts: bytes this broker wrote in an epoch the master never had
    are not the master's, whichever of the two began first.
    """
    own = _with_origin(own)
    master = _with_origin(master)
    master_epochs = {e.epoch for e in master}
    last = max(e.epoch for e in own if e.epoch in master_epochs)
    later = [e for e in master if e.epoch > last]
    point = later[0].start_offset if later else master_max
    own_later = [e for e in own if e.epoch > last]
    if own_later:
        point = min(point, own_later[0].start_offset)
    return point


def draw_log_id(log_end: int) -> str:
    """A new log identity for a log that ends at ``log_end`` (0: the log begins under it)."""
    drawn = uuid.uuid4().hex
    return drawn if log_end == 0 else f"{drawn}@{log_end}"


def log_id_of(value: object) -> str | None:
    """A log identity read from JSON (epoch.json, a master's epoch answer); None: absent or not one."""
    return value if isinstance(value, str) and value else None


def other_logs(a: str | None, b: str | None) -> bool:
    """Whether two log identities prove two different logs: both known, both drawn as their logs
    began, and different."""
    return a is not None and b is not None and "@" not in a and "@" not in b and a != b


def last_epoch(history: list[EpochEntry]) -> int:
    """The epoch the newest bytes of a log with this history were written in."""
    return _with_origin(history)[-1].epoch


def same_term(own: list[EpochEntry], master: list[EpochEntry]) -> bool:
    """Whether this broker's latest epoch is the master's current one: then every byte this
    broker holds was written by that master, and bytes beyond the master's end are ones the
    master lost (a restart from an older disk), not divergent ones."""
    return _with_origin(own)[-1].epoch == _with_origin(master)[-1].epoch


class EpochStore:
    """The persisted epoch state of one broker.

    Besides the group's history, it remembers the epoch this broker itself was promoted at
    (``ownEpoch``): promoting again at the current epoch is a retry of that promotion, allowed only
    to the broker that made it. A slave that merely adopted epoch ``e`` from its master must not
    become a second writer of ``e``. Every change checks and persists under one lock.

    ``generation`` counts the changes this process made. An HA handshake reads it before it
    looks at the epoch and history, and its ``adopt`` is refused if the count moved: a promotion,
    demotion or other adoption in between means the divergence point and the decision to follow
    were made for a state that no longer holds (a late adopt of a cancelled handshake would
    otherwise replace a promotion's history whenever its master's epoch is the newer one). It is
    not persisted: a handshake never outlives the process that read it.
    """

    def __init__(self, config_dir: Path) -> None:
        self.path = config_dir / FILE_NAME
        self._lock = threading.Lock()
        self.epoch = 0
        self.history: list[EpochEntry] = []
        self.own_epoch: int | None = None
        self.generation = 0
        # Masters below this epoch are not followed (POST /ha/fence, during a failover) until a
        # re-point. Persisted: a fenced slave that restarts before the failover re-points it must
        # not go back to the old master its configuration still names (it may only be hung).
        self.fence = 0
        # The log's identity (None: not known yet, or a store from before identities existed).
        self.log_id: str | None = None
        text = load_with_backup(self.path)
        if text:
            try:
                obj = json.loads(text)
                self.epoch = int(obj.get("epoch", 0))
                self.history = parse_history(obj.get("history", []))
                own = obj.get("ownEpoch")
                self.own_epoch = None if own is None else int(own)
                self.fence = int(obj.get("fencedBelowEpoch", 0))
                self.log_id = log_id_of(obj.get("logId"))
            except (ValueError, TypeError, AttributeError, EpochError) as exc:
                raise EpochError(f"{self.path} is unreadable: {exc}") from exc

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"epoch": self.epoch,
                               "history": [{"epoch": e.epoch, "startOffset": e.start_offset} for e in self.history]}
        if self.log_id is not None:
            obj["logId"] = self.log_id
        return obj

    def ensure_log_id(self, log_end: int) -> str:
        """This broker's log identity, drawn now if it has none (a master: a new log, or one kept
        from before identities existed, which ends at ``log_end``); blocking, it persists."""
        with self._lock:
            if self.log_id is None:
                self.log_id = draw_log_id(log_end)
                self._changed()
                self._persist()
                log.info("log identity %s", self.log_id)
            return self.log_id

    def _persist(self) -> None:
        obj = {**self.to_json_obj(), "ownEpoch": self.own_epoch}
        if self.fence:
            obj["fencedBelowEpoch"] = self.fence
        atomic_write(self.path, json.dumps(obj, indent=1))

    def _changed(self) -> None:
        # Bumped once the new state is in memory (before it is persisted, which may fail and
        # leave it there all the same): a reader on the event loop that reads the generation
        # first and then the fields sees either the old count (and its adopt is refused) or the
        # new count with the new fields, never the new count with old fields.
        self.generation += 1

    def _reached(self, epoch: int) -> None:
        # A fence is kept only while it is above the epoch: reaching it is what it waited for.
        if self.fence <= epoch:
            self.fence = 0

    def check_not_older(self, epoch: int) -> None:
        if epoch < self.epoch:
            raise EpochError(f"epoch {epoch} is older than this broker's epoch {self.epoch}")

    def begin_epoch(self, epoch: int, start_offset: int) -> None:
        """This broker becomes master at ``epoch``, writing from ``start_offset`` on (blocking)."""
        with self._lock:
            if epoch == self.epoch and self.own_epoch == epoch:
                return  # a retry of this broker's own promotion: its epoch began where it began
            if epoch <= self.epoch:
                raise EpochError(f"promotion epoch {epoch} must be newer than the current epoch {self.epoch}"
                                 + (f" (epoch {epoch} is another broker's term)" if epoch == self.epoch else ""))
            # A slave promoted before it received any byte of its master's latest terms holds
            # nothing of them: in this log they end, empty, where the new term begins.
            history = [e if e.start_offset <= start_offset else EpochEntry(e.epoch, start_offset)
                       for e in self.history]
            history.append(EpochEntry(epoch, start_offset))
            self.history = history
            if self.log_id is None:
                self.log_id = draw_log_id(start_offset)
            self.epoch = epoch
            self.own_epoch = epoch
            self._reached(epoch)
            self._changed()
            self._persist()
        log.info("epoch %d begins at offset %d", epoch, start_offset)

    def adopt(self, epoch: int, history: list[EpochEntry], *, seen: int | None = None,
              log_id: str | None = None) -> None:
        """Follow a master: take over its epoch, history and log identity (blocking; ``log_id``
        None: a master that does not tell it, whose log is taken to be this one).

        ``seen`` is the ``generation`` the caller read before deciding to follow; if anything
        changed the state since, :class:`EpochChangedError` and nothing is written.
        """
        with self._lock:
            if seen is not None and seen != self.generation:
                raise EpochChangedError(
                    f"epoch state changed while adopting epoch {epoch} (now epoch {self.epoch}); "
                    "the handshake must be redone")
            self.check_not_older(epoch)
            if epoch == self.epoch and self.own_epoch == epoch:
                # Two masters of one term: never merge another writer's history into ours.
                raise EpochError(f"epoch {epoch} is this broker's own term; a master at it is not ours to follow")
            log_id = log_id or self.log_id
            if epoch == self.epoch and history == self.history and log_id == self.log_id:
                return
            self.epoch = epoch
            self.history = list(history)
            self.log_id = log_id
            self._reached(epoch)
            self._changed()
            self._persist()

    def fence_below(self, epoch: int) -> None:
        """Follow no master older than ``epoch`` until :meth:`unfence` (a newer one is being
        promoted); blocking, it persists."""
        with self._lock:
            if epoch > self.fence:
                self.fence = epoch
                self._changed()
                self._persist()

    def unfence(self) -> None:
        """Lift the fence (a re-point names the master to follow); blocking, it persists."""
        with self._lock:
            if self.fence:
                self.fence = 0
                self._changed()
                self._persist()

    @property
    def fenced(self) -> bool:
        """Whether masters of the current epoch are refused (a fence above it is in place)."""
        return self.fence > self.epoch

    def set_epoch(self, epoch: int) -> None:
        with self._lock:
            self.check_not_older(epoch)
            if epoch != self.epoch:
                self.epoch = epoch
                self._reached(epoch)
                self._changed()
                self._persist()
