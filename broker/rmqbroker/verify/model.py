"""Plain data passed between the verification driver and its tasks (all picklable, no Spark types).

A :class:`ChunkTask` describes one slice of the master's commitlog and the replicas to compare;
a task returns a :class:`ChunkResult` whose size does not grow with the data (counts, queue
coverage ranges and the - normally empty - list of :class:`Mismatch`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# -- mismatch kinds -----------------------------------------------------------------------------
FRAMING = "framing"  # bytes at a record position do not form a record (magic, lengths)
BODY_CRC = "body_crc"  # BODYCRC does not match the stored body
RECORD = "record"  # a compared field (physicalOffset, size, bodyCrc, topic, queueId, queueOffset) differs
RECORD_BYTES = "record_bytes"  # compared fields agree but other bytes differ (properties, timestamps...)
MISSING = "missing"  # below the replica's max offset, but the replica does not serve the record
NON_RECORD_BYTES = "non_record_bytes"  # bytes outside records (end-of-segment blank marker, padding) differ
REPLICA_AHEAD = "replica_ahead"  # a slave's commitlog is longer than the master's
CHAIN = "chain"  # record boundaries of neighbouring chunks disagree (master framing is broken)
CQ_MISSING = "cq_missing"  # a record without its consume-queue unit (absent or blank)
CQ_WRONG = "cq_wrong"  # the record's unit has another phy offset, size or tagsCode
CQ_DANGLING = "cq_dangling"  # a unit that points at no record of its topic/queue/offset
TOPIC_CONFIG = "topic_config"  # topics.json content or DataVersion differs from the master
SUBSCRIPTION_GROUP = "subscription_group"  # subscriptionGroup.json content or DataVersion differs
CONSUMER_OFFSET_AHEAD = "consumer_offset_ahead"  # a slave's committed offset is beyond the master's
UNREACHABLE = "unreachable"  # a replica did not answer

# Fields compared record by record between replicas (names as in the report).
COMPARED_FIELDS = ("physicalOffset", "size", "bodyCrc", "topic", "queueId", "queueOffset")


@dataclass(slots=True)
class Mismatch:
    """One finding, located as exactly as the kind allows (offsets are commitlog offsets)."""

    replica: str
    kind: str
    offset: int | None = None
    size: int | None = None
    topic: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    field: str | None = None
    expected: str | None = None
    actual: str | None = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {"replica": d["replica"], "kind": d["kind"], "offset": d["offset"], "size": d["size"],
                "topic": d["topic"], "queueId": d["queue_id"], "queueOffset": d["queue_offset"],
                "field": d["field"], "expected": d["expected"], "actual": d["actual"], "detail": d["detail"]}


@dataclass(frozen=True, slots=True)
class ReplicaRef:
    """A replica's admin endpoint and the commitlog range it is verified on."""

    name: str  # label used in the report: the admin URL
    url: str
    token: str
    broker_id: int
    # [start, end): records wholly inside are compared; beyond ``end`` is lag, below ``start`` a head gap.
    start: int
    end: int
    timeout: float = 120.0  # seconds an admin request may take (a hung broker ends the run, not stalls it)


@dataclass(frozen=True, slots=True)
class ChunkTask:
    """Records starting in ``[start, stop)`` of the master's commitlog, compared on every replica."""

    index: int
    start: int
    stop: int
    master: ReplicaRef
    slaves: tuple[ReplicaRef, ...]
    # Known record boundary to start at (the first chunk, and re-runs after a boundary disagreement);
    # otherwise the task finds the first boundary at or after ``start`` itself.
    forced_start: int | None = None
    delay_levels_ms: tuple[int, ...] = ()
    check_consume_queues: bool = True
    # Extra bytes fetched after ``stop`` so the record crossing it usually needs no second request.
    slack: int = 256 * 1024
    # Findings kept per replica and chunk (all are counted).
    max_mismatches: int = 1000


@dataclass(slots=True)
class ReplicaChunkStats:
    records: int = 0
    bytes: int = 0
    lag_records: int = 0
    head_gap_records: int = 0
    cq_units: int = 0
    mismatches: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Timings:
    """Seconds spent per phase (summed over tasks), to say where the time goes."""

    fetch: float = 0.0
    decode: float = 0.0
    compare: float = 0.0
    consume_queue: float = 0.0

    def add(self, other: Timings) -> None:
        self.fetch += other.fetch
        self.decode += other.decode
        self.compare += other.compare
        self.consume_queue += other.consume_queue


@dataclass(slots=True)
class ChunkResult:
    index: int
    # First record boundary at or after the task's start and the first one at or after its stop
    # (the next chunk's first): ``None`` when the chunk holds no record start / the walk broke off.
    first: int | None
    handoff: int | None
    # The master's min offset when retention deleted the start of this chunk after planning (None:
    # it did not): the bytes below it are gone, not corrupt, and the record chain restarts there.
    retired: int | None = None
    stats: dict[str, ReplicaChunkStats] = field(default_factory=dict)
    mismatches: list[Mismatch] = field(default_factory=list)
    # Per replica: (topic, queueId, first logical offset, last logical offset) checked by this chunk.
    cq_coverage: dict[str, list[tuple[str, int, int, int]]] = field(default_factory=dict)
    # Per replica: units read for a logical offset whose record lies outside this chunk
    # (topic, queueId, logical offset, phy, size, tagsCode), resolved by the driver.
    foreign_units: dict[str, list[tuple[str, int, int, int, int, int]]] = field(default_factory=dict)
    timings: Timings = field(default_factory=Timings)
