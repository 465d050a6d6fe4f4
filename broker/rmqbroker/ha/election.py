"""Which slave to promote when a group's master is lost: the one rule the operator and rmq-local share.

Inputs are plain facts, not Kubernetes objects or local processes: the live slaves
(:class:`Candidate`), every slave of the group, the group's epoch and what was seen while the
master was last healthy (:class:`MasterRecord`).

Safety rule under SYNC replication (``strict``): a SYNC_MASTER acknowledges a send only once a
slave has stored it, so the slave with the highest offset holds every acknowledged message --
provided every slave that was following the master is visible now. The choice is refused while
such a slave cannot be seen, or when the best visible one was lagging, and the candidate must be
in the master's epoch.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

# A slave following the master within this many bytes counts as in sync. Polls of master and
# slave are a few milliseconds apart, so a busy but healthy slave shows some lag.
IN_SYNC_MAX_LAG = 4 * 1024 * 1024


@dataclass(frozen=True)
class FailoverSpec:
    """A BrokerGroup's ``spec.failover`` (the CRD's defaults), for the operator and rmq-local alike."""

    enabled: bool = True
    master_lost_seconds: int = 30
    allow_data_loss: bool = False

    def strict(self, replication: str) -> bool:
        """Only a slave holding every acknowledged message may be promoted (SYNC, no data loss allowed)."""
        return replication == "SYNC" and not self.allow_data_loss


@dataclass(frozen=True)
class Candidate:
    """A reachable slave: its name, tie-break rank (lower wins) and what its ``/status`` says."""

    name: str
    rank: int
    epoch: int
    max_offset: int


@dataclass(frozen=True)
class MasterRecord:
    """What was seen of the group while its master was last healthy."""

    seen_healthy: bool
    connected: frozenset[str]  # slaves connected to the master then
    in_sync: frozenset[str]  # slaves in sync with it then
    master_offset: int


def in_sync(follows_master: bool, connected: bool, slave_epoch: int, master_epoch: int, lag: int) -> bool:
    """A slave counts as in sync: following this master, connected, same epoch, little lag."""
    return follows_master and connected and slave_epoch == master_epoch and lag <= IN_SYNC_MAX_LAG


def choose(live: Sequence[Candidate], slaves: Collection[str], epoch: int, strict: bool,
           record: MasterRecord) -> tuple[str | None, str]:
    """The slave to promote, or None and why none is safe.

    ``live`` are the reachable slaves, ``slaves`` the names of every slave of the group, ``epoch``
    the group's current epoch.
    """
    if not live:
        return None, "no reachable slave"
    if strict:
        current = [c for c in live if c.epoch == epoch]
        if not current:
            # E.g. every store was lost: no slave can hold what the master acknowledged.
            return None, (f"no reachable slave is in the master's epoch {epoch} (spec.failover.allowDataLoss: "
                          "true promotes the most advanced one anyway)")
        could_ack = record.connected if record.seen_healthy else frozenset(slaves)
        hidden = sorted(n for n in could_ack if n not in {c.name for c in live})
        if hidden:
            return None, f"slave(s) {', '.join(hidden)} that followed the master cannot be reached"
        best = max(current, key=lambda c: (c.max_offset, -c.rank))
        if record.seen_healthy and best.name not in record.in_sync and best.max_offset < record.master_offset:
            return None, f"{best.name} (the most advanced slave) was lagging behind the master"
        return best.name, "highest offset among in-sync slaves"
    synced = [c for c in live if c.name in record.in_sync]
    pool = synced or list(live)
    best = max(pool, key=lambda c: (c.epoch == epoch, c.max_offset, -c.rank))
    return best.name, "highest offset among in-sync slaves" if synced else "highest offset (no slave was in sync)"


def next_epoch(epoch: int, seen: Collection[int]) -> int:
    """The epoch a promotion starts: above the group's and every broker's."""
    return max([epoch, *seen]) + 1
