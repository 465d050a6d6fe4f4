"""The verification driver: discover the group, plan chunks, run them (Spark or in-process), check
the chunk chain, finish the consume-queue and metadata checks, and build the report.

Consistent snapshot of a live group: slaves' statuses are read before the master's, so every
slave's max offset is <= the master's end for a healthy group.  Everything below the master's
end is immutable (the commitlog is append-only), so the job verifies ``[masterMin, masterEnd)``
while the group keeps serving; bytes a slave did not have at snapshot time count as lag.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from rmqbroker.store.config import parse_delay_levels
from rmqbroker.store.consume_queue import BLANK_SIZE, CQ_STORE_UNIT_SIZE, UNIT
from rmqbroker.store.errors import CorruptRecordError
from rmqbroker.store.record import decode_record
from rmqbroker.verify.admin_client import AdminClient, AdminError, QueueInfo
from rmqbroker.verify.chunk import Rec, expected_units, verify_chunk
from rmqbroker.verify.metadata import compare_metadata
from rmqbroker.verify.model import (
    CHAIN,
    CONSUMER_OFFSET_AHEAD,
    CQ_DANGLING,
    REPLICA_AHEAD,
    UNREACHABLE,
    ChunkResult,
    ChunkTask,
    Mismatch,
    ReplicaChunkStats,
    ReplicaRef,
    Timings,
)
from rmqbroker.verify.progress import Progress

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
MIN_CHUNK = 1 << 20


@dataclass
class VerifyOptions:
    replicas: list[str]
    token: str = ""
    chunk_size: int = 64 << 20
    # Spark parallelism the plan aims at: at least this many chunks (x4) when the log is small.
    parallelism: int = 2
    check_consume_queues: bool = True
    check_metadata: bool = True
    max_mismatches: int = 1000
    slack: int = 256 * 1024
    timeout: float = 120.0  # per admin request, seconds
    # How long to wait for a slave whose metadata is behind to sync (None: two of its intervals + 10 s).
    metadata_settle: float | None = None


@dataclass
class ReplicaState:
    ref: ReplicaRef
    status: dict[str, Any]
    is_master: bool
    stats: ReplicaChunkStats = field(default_factory=ReplicaChunkStats)
    lag_bytes: int = 0
    head_gap_bytes: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    mismatch_count: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None


@dataclass
class VerifyOutcome:
    """Everything the report is built from."""

    master: ReplicaState
    slaves: list[ReplicaState]
    start: int
    end: int
    tasks: int
    chunk_size: int
    reruns: int
    engine: str
    timings: Timings
    phases: dict[str, float]
    errors: list[str] = field(default_factory=list)

    @property
    def replicas(self) -> list[ReplicaState]:
        return [self.master, *self.slaves]


class Executor(Protocol):
    name: str

    def run(self, tasks: Sequence[ChunkTask], progress: Progress, span: int) -> list[ChunkResult]: ...


class LocalExecutor:
    """Runs the tasks one after the other in this process (small groups; the benchmark's baseline)."""

    name = "local"

    def run(self, tasks: Sequence[ChunkTask], progress: Progress, span: int) -> list[ChunkResult]:
        out: list[ChunkResult] = []
        for i, task in enumerate(tasks):
            out.append(verify_chunk(task))
            progress.update(i + 1, len(tasks), span * (i + 1) // max(len(tasks), 1))
        progress.update(len(tasks), len(tasks), span, force=True)
        return out


class SparkExecutor:
    """One Spark task per chunk: ``parallelize(tasks, len(tasks)).map(verify_chunk).collect()``.

    Results are small (counts, coverage ranges, findings), so collecting them is cheap; the
    commitlog bytes never leave the Python workers that fetched them.
    """

    name = "spark"

    def __init__(self, sc: SparkContext) -> None:
        self.sc = sc

    def run(self, tasks: Sequence[ChunkTask], progress: Progress, span: int) -> list[ChunkResult]:
        sc = self.sc
        group = f"rmq-verify-{uuid.uuid4().hex[:8]}"
        sc.setJobGroup(group, "replica verification", interruptOnCancel=True)
        done = threading.Event()

        def watch() -> None:
            tracker = sc.statusTracker()
            while not done.wait(0.25):
                completed = 0
                for job_id in tracker.getJobIdsForGroup(group):
                    job = tracker.getJobInfo(job_id)
                    for sid in job.stageIds if job is not None else ():
                        stage = tracker.getStageInfo(sid)
                        if stage is not None:
                            completed += stage.numCompletedTasks
                progress.update(completed, len(tasks), span * completed // max(len(tasks), 1))

        watcher = threading.Thread(target=watch, name="rmq-verify-progress", daemon=True)
        if progress.enabled:
            watcher.start()
        try:
            results: list[ChunkResult] = sc.parallelize(list(tasks), len(tasks)).map(verify_chunk).collect()
        finally:
            done.set()
            if watcher.is_alive():
                watcher.join()
        progress.update(len(tasks), len(tasks), span, force=True)
        return results


def spark_context(master: str | None = None, conf: dict[str, str] | None = None) -> SparkContext:
    """The job's SparkContext: local[*] unless launched by spark-submit or told otherwise.

    A bare SparkContext, not a SparkSession: the job only needs RDDs, and the session's SQL
    machinery takes seconds to start (measured here: 11-14 s vs 20-28 s on a loaded 2-core box).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit already chose the master
    effective = master or (None if under_submit else "local[*]")
    if effective is not None and effective.startswith("local"):
        # Executors are threads of this JVM: keep everything on loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark import SparkConf, SparkContext

    sconf = (SparkConf().setAppName("rmq-verify")
             .set("spark.ui.enabled", "false")
             .set("spark.ui.showConsoleProgress", "false"))
    if effective is not None:
        sconf = sconf.setMaster(effective)
        if effective.startswith("local") and "spark.driver.extraJavaOptions" not in (conf or {}):
            # In local mode the JVM only schedules tasks and carries small results; the Python
            # workers do the work.  C1-only JIT and the serial GC halve its start-up here (about
            # 11 s -> 4-6 s on the loaded 2-core test machine) and leave the cores to the workers.
            sconf = sconf.set("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    for k, v in (conf or {}).items():
        sconf = sconf.set(k, v)
    sc = SparkContext.getOrCreate(sconf)
    sc.setLogLevel("ERROR")
    return sc


def spark_session(master: str | None = None, conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession on the job's context (for Parquet output and tests)."""
    spark_context(master, conf)
    from pyspark.sql import SparkSession

    return SparkSession.builder.getOrCreate()


# -- discovery and planning -----------------------------------------------------------------------
def discover(urls: Sequence[str], token: str, timeout: float = 120.0,
             ) -> tuple[ReplicaState, list[ReplicaState], list[str]]:
    """Statuses of every replica (slaves read before the master: see module doc)."""
    if not urls:
        raise ValueError("no replicas given")
    statuses: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    for url in urls:
        try:
            statuses[url] = AdminClient(url, token, timeout).status()
        except AdminError as exc:
            errors.append(str(exc))
    masters = [u for u in urls if u in statuses and statuses[u].get("role") in MASTER_ROLES]
    if len(masters) != 1:
        # Ambiguous (mid-failover) or no master: the first URL is taken as the reference.
        master_url = urls[0]
        errors.append(f"{len(masters)} replicas report a master role; using {master_url} as the reference")
    else:
        master_url = masters[0]
    if master_url not in statuses:
        raise AdminError(f"reference replica {master_url} is unreachable: {'; '.join(errors)}")
    # Re-read the master last so its end covers what the slaves had.
    mstatus = AdminClient(master_url, token, timeout).status()
    mstart, mend = int(mstatus.get("minPhyOffset", 0)), served_end(mstatus)
    mmax = int(mstatus.get("maxPhyOffset", 0))
    master = ReplicaState(ReplicaRef(master_url, master_url, token, int(mstatus.get("brokerId", 0)), mstart, mend,
                                     timeout),
                          mstatus, True)
    slaves: list[ReplicaState] = []
    for url in urls:
        if url == master_url or url not in statuses:
            continue
        st = statuses[url]
        smin, smax, send = int(st.get("minPhyOffset", 0)), int(st.get("maxPhyOffset", 0)), served_end(st)
        ref = ReplicaRef(url, url, token, int(st.get("brokerId", -1)), max(smin, mstart), max(min(send, mend), mstart),
                         timeout)
        state = ReplicaState(ref, st, False)
        state.lag_bytes = max(0, mend - max(send, mstart))
        state.head_gap_bytes = max(0, min(smin, mend) - mstart)
        if smax > mmax:
            state.mismatches.append(Mismatch(url, REPLICA_AHEAD, mmax, smax - mmax,
                                             detail=f"replica max offset {smax} is beyond the master's {mmax}"))
        slaves.append(state)
    for url in urls:
        if url not in statuses:
            state = ReplicaState(ReplicaRef(url, url, token, -1, mend, mend, timeout), {}, False)
            state.mismatches.append(Mismatch(url, UNREACHABLE, detail="status unavailable"))
            slaves.append(state)
    return master, slaves, errors


def served_end(status: dict[str, Any]) -> int:
    """Where a replica's ``GET /commitlog`` stops: its ``dispatchedPhyOffset`` (the records already in
    its consume queues), which trails ``maxPhyOffset`` while a slave catches up; ``maxPhyOffset``
    from a broker that does not report it.  Bytes between the two are not served yet, so they are
    lag: verified against them, a healthy catching-up slave was reported as ``missing`` records."""
    top = int(status.get("maxPhyOffset", 0))
    dispatched = status.get("dispatchedPhyOffset")
    return top if dispatched is None else min(top, int(dispatched))


def plan(master: ReplicaRef, slaves: Sequence[ReplicaRef], opts: VerifyOptions,
         delay_levels: tuple[int, ...]) -> list[ChunkTask]:
    span = master.end - master.start
    if span <= 0:
        return []
    size = opts.chunk_size
    # Enough chunks to keep every core busy (and balance stragglers) on a small log.
    want = max(1, opts.parallelism) * 4
    if span // size < want:
        size = max(MIN_CHUNK, span // want)
    n = max(1, math.ceil(span / size))
    size = math.ceil(span / n)
    tasks = []
    for i in range(n):
        lo = master.start + i * size
        hi = min(master.end, lo + size)
        tasks.append(ChunkTask(i, lo, hi, master, tuple(slaves), forced_start=master.start if i == 0 else None,
                               delay_levels_ms=delay_levels, check_consume_queues=opts.check_consume_queues,
                               slack=opts.slack, max_mismatches=opts.max_mismatches))
    return tasks


def check_chain(tasks: Sequence[ChunkTask], results: list[ChunkResult], master: ReplicaRef,
                rerun: Callable[[ChunkTask], ChunkResult]) -> tuple[list[ChunkResult], int, list[Mismatch]]:
    """Make every chunk start where its predecessor's walk ended (see chunk module doc).

    Returns the results (re-run ones replaced), the number of re-runs and chain findings.
    """
    by_index = {r.index: r for r in results}
    out: list[ChunkResult] = []
    findings: list[Mismatch] = []
    reruns = 0
    expected: int | None = master.start
    for task in tasks:
        res = by_index[task.index]
        if res.retired is not None and (expected is None or expected < res.retired):
            # Retention deleted the master's log up to ``retired`` during the run: the chain
            # restarts at that segment start (chunks walked before the deletion are re-run from it).
            expected = res.retired
        if expected is not None and expected >= task.stop:
            # The previous record runs over this whole chunk: whatever the task took for records
            # here lies inside that record's body (a lookalike), so its result is dropped.
            if res.first is not None:
                res = ChunkResult(task.index, None, None)
                reruns += 1
        elif expected is not None and res.first != expected:
            # The task's own boundary guess disagrees with the chain: redo it from the true boundary.
            res = rerun(replace(task, forced_start=expected))
            reruns += 1
        if res.first is not None:
            expected = res.handoff
        out.append(res)
    if expected is not None and expected != master.end:
        findings.append(Mismatch(master.name, CHAIN, expected,
                                 detail=f"the record chain ends at {expected}, not at the max offset {master.end}"))
    return out, reruns, findings


# -- consume-queue residue --------------------------------------------------------------------------
def _uncovered(lo: int, hi: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sub-ranges of ``[lo, hi)`` not in any inclusive ``covered`` range."""
    out: list[tuple[int, int]] = []
    pos = lo
    for a, b in sorted(covered):
        if a > pos:
            out.append((pos, min(a, hi)))
        pos = max(pos, b + 1)
        if pos >= hi:
            break
    if pos < hi:
        out.append((pos, hi))
    return [(a, b) for a, b in out if a < b]


def _record_at(client: AdminClient, phy: int, size: int) -> Rec | str:
    try:
        first, data = client.commitlog(phy, size)
    except AdminError as exc:
        return str(exc)
    if first != phy or len(data) < size:
        return "no such bytes on the replica"
    try:
        r = decode_record(data, 0)
    except CorruptRecordError as exc:
        return f"not a record: {exc}"
    return (phy, r.total_size, True, r.topic, r.queue_id, r.queue_offset, r.sys_flag, r.store_timestamp,
            r.properties_str)


def check_unit(replica: ReplicaRef, client: AdminClient, topic: str, qid: int, logical: int, phy: int, size: int,
               tags: int, delay_levels: tuple[int, ...]) -> Mismatch | None:
    """A unit no chunk accounted for: fine only if the record at ``phy`` is exactly its record."""
    rec = _record_at(client, phy, size)
    if isinstance(rec, str):
        return Mismatch(replica.name, CQ_DANGLING, phy, size, topic, qid, logical, detail=f"unit points at {rec}")
    want = expected_units([rec], delay_levels).get((topic, qid), {}).get(logical)
    if want == (phy, size, tags):
        return None
    return Mismatch(replica.name, CQ_DANGLING, phy, size, topic, qid, logical,
                    detail=f"unit points at the record of {rec[3]} queue {rec[4]} offset {rec[5]} "
                           f"(size {rec[1]})", expected=str(want), actual=str((phy, size, tags)))


def residual_consume_queues(replica: ReplicaRef, results: Sequence[ChunkResult],
                            delay_levels: tuple[int, ...]) -> tuple[list[Mismatch], int]:
    """Units outside every chunk's logical ranges, and units chunks handed over; (findings, units read)."""
    client = AdminClient(replica.url, replica.token, replica.timeout)
    covered: dict[tuple[str, int], list[tuple[int, int]]] = {}
    findings: list[Mismatch] = []
    read = 0
    # Retention may have deleted the oldest segments since discovery: units pointing there point
    # at records that are gone by design (consume queue files are deleted later, as in RocketMQ).
    floor = max(replica.start, int(client.status().get("minPhyOffset", 0)))
    for res in results:
        for topic, qid, a, b in res.cq_coverage.get(replica.name, ()):
            covered.setdefault((topic, qid), []).append((a, b))
        for topic, qid, logical, phy, size, tags in res.foreign_units.get(replica.name, ()):
            if floor <= phy < replica.end:
                m = check_unit(replica, client, topic, qid, logical, phy, size, tags, delay_levels)
                if m is not None:
                    findings.append(m)
    queues: list[QueueInfo] = client.queues()
    for q in queues:
        for a, b in _uncovered(q.min_offset, q.max_offset, covered.get((q.topic, q.queue_id), [])):
            logical = a
            while logical < b:
                count = min(b - logical, 1 << 18)
                raw = client.consume_queue(q.topic, q.queue_id, logical, count)
                n = len(raw) // CQ_STORE_UNIT_SIZE
                read += n
                for i, (phy, size, tags) in enumerate(UNIT.iter_unpack(memoryview(raw)[:n * CQ_STORE_UNIT_SIZE])):
                    if (size == BLANK_SIZE and phy == 0) or not floor <= phy < replica.end:
                        continue  # a filler, or a record outside the verified range (lag / head gap)
                    m = check_unit(replica, client, q.topic, q.queue_id, logical + i, phy, size, tags, delay_levels)
                    if m is not None:
                        findings.append(m)
                if n < count:
                    break
                logical += n
    return findings, read


# -- metadata ----------------------------------------------------------------------------------------
def sync_repairs(m: Mismatch) -> bool:
    """Whether the slave's next metadata round can remove ``m``: another DataVersion (the round
    copies the master's table) or a consumer offset ahead (the round overwrites it). The same
    DataVersion with other content is never repaired by a round."""
    return m.field == "dataVersion" or m.kind == CONSUMER_OFFSET_AHEAD


def _key(m: Mismatch) -> tuple[str, str | None, str | None, int | None]:
    return m.kind, m.field, m.topic, m.queue_id


def settle_metadata(slave: ReplicaRef, master: ReplicaRef, found: list[Mismatch], settle: float | None,
                    ) -> tuple[list[Mismatch], float | None]:
    """Findings that survive one metadata round of the slave taken after the master was read again.

    A slave copies the master's metadata every ``slaveSyncInterval`` (10 s by default; its first
    round 3 s after it starts or is re-pointed), so right after a topic or group change, a slave
    restart or a failover its DataVersions differ from the master's without anything being wrong.
    Reported as they were, a scheduled run in that window failed a healthy group. Returns the
    findings (those of the first comparison when no round completes in time: the sync is stuck,
    which is a real disagreement) and the seconds waited (None: the slave syncs from no master).
    """
    sclient = AdminClient(slave.url, slave.token, slave.timeout)
    mclient = AdminClient(master.url, master.token, master.timeout)
    began = time.monotonic()
    try:
        before = mclient.metadata()
        sync = sclient.status().get("metadataSync") or {}
    except AdminError:
        return found, None
    if not sync.get("masterAddress"):
        return found, None
    rounds = int(sync.get("rounds") or 0)
    if settle is None:
        settle = 2 * int(sync.get("intervalMillis") or 10_000) / 1000 + 10
    # The round in progress may have read the master before ``before``; the one after it did not.
    want = rounds + 2
    while True:
        try:
            sync = sclient.status().get("metadataSync") or {}
        except AdminError:
            return found, time.monotonic() - began
        if int(sync.get("rounds") or 0) >= want:
            break
        if time.monotonic() - began > settle:
            why = f"; last error: {sync['lastError']}" if sync.get("lastError") else ""
            for m in found:
                if sync_repairs(m):
                    m.detail += f" (the slave's metadata sync completed no round in {settle:.0f} s{why})"
            return found, time.monotonic() - began
        time.sleep(0.2)
    try:
        smeta, after = sclient.metadata(), mclient.metadata()
    except AdminError:
        return found, time.monotonic() - began
    # The master may change while we wait: what the slave holds must match it before or after.
    earlier = {_key(m) for m in compare_metadata(slave.name, before, smeta)}
    return ([m for m in compare_metadata(slave.name, after, smeta) if _key(m) in earlier],
            time.monotonic() - began)


# -- the whole run -----------------------------------------------------------------------------------
def _count(state: ReplicaState, m: Mismatch, cap: int) -> None:
    state.mismatch_count += 1
    state.by_kind[m.kind] = state.by_kind.get(m.kind, 0) + 1
    _keep(state, m, cap)


def _keep(state: ReplicaState, m: Mismatch, cap: int) -> None:
    if len(state.mismatches) < cap:
        state.mismatches.append(m)


def verify(opts: VerifyOptions, executor: Executor, progress: Progress | None = None) -> VerifyOutcome:
    progress = progress or Progress(enabled=False)
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    master, slaves, errors = discover(opts.replicas, opts.token, opts.timeout)
    metadata: dict[str, dict[str, Any]] = {}
    delay_levels: tuple[int, ...] = ()
    if opts.check_metadata or opts.check_consume_queues:
        # Slaves first, master last (consumer offsets only grow on the master).
        for st in [*slaves, master]:
            if st.status:
                try:
                    metadata[st.ref.name] = AdminClient(st.ref.url, st.ref.token, st.ref.timeout).metadata()
                except AdminError as exc:
                    errors.append(str(exc))
        levels = metadata.get(master.ref.name, {}).get("messageDelayLevel")
        if isinstance(levels, str):
            try:
                delay_levels = parse_delay_levels(levels)
            except ValueError as exc:
                errors.append(f"master messageDelayLevel: {exc}")
    live_slaves = [s for s in slaves if s.status]
    tasks = plan(master.ref, [s.ref for s in live_slaves], opts, delay_levels)
    phases["discover"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    results = executor.run(tasks, progress, master.ref.end - master.ref.start) if tasks else []
    progress.close()
    phases["chunks"] = time.perf_counter() - t1
    results, reruns, chain = check_chain(tasks, results, master.ref, verify_chunk)

    states = {s.ref.name: s for s in [master, *slaves]}
    timings = Timings()
    cap = opts.max_mismatches
    for m in chain:
        _count(master, m, cap)
    for st in slaves:
        pre, st.mismatches = st.mismatches, []
        for m in pre:
            _count(st, m, cap)
    for res in sorted(results, key=lambda r: r.index):
        timings.add(res.timings)
        for name, cs in res.stats.items():
            agg = states[name].stats
            agg.records += cs.records
            agg.bytes += cs.bytes
            agg.lag_records += cs.lag_records
            agg.head_gap_records += cs.head_gap_records
            agg.cq_units += cs.cq_units
            # Tasks count every finding but keep only the first ``max_mismatches`` of each replica.
            st = states[name]
            st.mismatch_count += cs.mismatches
            for kind, n in cs.by_kind.items():
                st.by_kind[kind] = st.by_kind.get(kind, 0) + n
        for m in res.mismatches:
            _keep(states[m.replica], m, cap)

    t2 = time.perf_counter()
    if opts.check_consume_queues and tasks:
        for st in [master, *live_slaves]:
            try:
                found, read = residual_consume_queues(st.ref, results, delay_levels)
            except AdminError as exc:
                found, read = [Mismatch(st.ref.name, UNREACHABLE, detail=f"consume queues: {exc}")], 0
            st.stats.cq_units += read
            for m in found:
                _count(st, m, cap)
    phases["consumeQueueResidue"] = time.perf_counter() - t2

    t3 = time.perf_counter()
    if opts.check_metadata and master.ref.name in metadata:
        mmeta = metadata[master.ref.name]
        for st in live_slaves:
            smeta = metadata.get(st.ref.name)
            if smeta is None:
                _count(st, Mismatch(st.ref.name, UNREACHABLE, detail="metadata unavailable"), cap)
                continue
            st.metadata = {"topicsDataVersion": (smeta.get("topics") or {}).get("dataVersion"),
                           "subscriptionGroupsDataVersion": (smeta.get("subscriptionGroups") or {}).get("dataVersion")}
            found = compare_metadata(st.ref.name, mmeta, smeta)
            if any(sync_repairs(m) for m in found):
                found, waited = settle_metadata(st.ref, master.ref, found, opts.metadata_settle)
                if waited is not None:
                    st.metadata["waitedForSyncSeconds"] = round(waited, 3)
            for m in found:
                _count(st, m, cap)
        master.metadata = {"topicsDataVersion": (mmeta.get("topics") or {}).get("dataVersion"),
                           "subscriptionGroupsDataVersion": (mmeta.get("subscriptionGroups") or {}).get("dataVersion")}
    phases["metadata"] = time.perf_counter() - t3
    chunk_size = (tasks[0].stop - tasks[0].start) if tasks else 0
    return VerifyOutcome(master, slaves, master.ref.start, master.ref.end, len(tasks), chunk_size, reruns,
                         executor.name, timings, phases, errors)
