"""One verification task: a slice of the master's commitlog, compared on every replica.

Record boundaries
-----------------
A task owns the records that *start* in ``[start, stop)``.  It fetches the master's bytes from
``start`` (plus some slack; more on demand when a record crosses the end) and finds its first
record boundary itself: the first position at or after ``start`` holding either a complete,
self-consistent record whose body CRC matches (magic, TOTALSIZE agreeing with BODYLENGTH,
TOPICLENGTH and PROPERTIESLENGTH, checked by the broker's ``check_record``) or an end-of-segment
blank marker followed by zeroes.  Candidates are located with a C-speed search for the magic
code, so finding the boundary costs at most about one record.

A message body can in principle contain bytes that look like a valid record (e.g. a stored
record forwarded as a payload), so that guess is not trusted on its own: every task also walks
past its ``stop`` to the first record at or after it (its *handoff*), following TOTALSIZE from
its start.  The driver checks that each task's first boundary equals the previous task's
handoff; the first task starts at the master's min offset, which is a segment start and hence a
true boundary.  By induction every boundary used is on the one chain of records that starts
there.  A disagreement is settled by re-running the task from the handoff (``forced_start``).

Comparison
----------
Replicas are compared over the exact span the master walk covered.  When a slave's bytes equal
the master's (one ``memcmp``), every record is identical on both, so the master's decoded
records stand for the slave's (no second decode).  Otherwise each record is decoded on both
sides with the broker's codec and the compared fields are checked one by one, so a fault is
reported at its record's offset with its topic and queue.

Consume queues
--------------
The records of a chunk say which units must exist: record (topic, queueId, queueOffset) at
offset P with size S needs unit ``queueOffset`` of that queue to be ``(P, S, tagsCode)``.  The
task reads exactly those logical ranges of every queue from each replica; units in the range
that belong to no record of the chunk are reported as dangling when they point inside the chunk
and handed to the driver otherwise.  Logical ranges no chunk covered are checked by the driver.

I/O overlap
-----------
The slaves' bytes and every replica's unit ranges are requested from a small thread pool while
the task's own thread decodes, so a task does not leave its core idle while brokers answer.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from rmqbroker.store.consume_queue import BLANK_SIZE, CQ_STORE_UNIT_SIZE, UNIT
from rmqbroker.store.errors import CorruptRecordError
from rmqbroker.store.message_store import SCHEDULE_TOPIC
from rmqbroker.store.record import (
    BLANK_MAGIC_CODE,
    DELAY,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_SIZE,
    TAGS,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageRecord,
    ReadBuffer,
    check_record,
    decode_record,
    get_property,
    peek_size_magic,
    tags_code,
    verify_record,
)
from rmqbroker.verify.admin_client import AdminClient, AdminError
from rmqbroker.verify.model import (
    BODY_CRC,
    CQ_DANGLING,
    CQ_MISSING,
    CQ_WRONG,
    FRAMING,
    MISSING,
    NON_RECORD_BYTES,
    RECORD,
    RECORD_BYTES,
    UNREACHABLE,
    ChunkResult,
    ChunkTask,
    Mismatch,
    ReplicaChunkStats,
    ReplicaRef,
    Timings,
)

_MAGIC = struct.pack(">i", MESSAGE_MAGIC_CODE)
_BLANK = struct.pack(">i", BLANK_MAGIC_CODE)
# A record never spans a segment; segments are at most 1 GiB in practice.
_MAX_RECORD = 1 << 30
# How many zero bytes after a blank marker are looked at to accept it as a boundary.
_BLANK_ZERO_PROBE = 4096

# A walked record: (pos, size, crc_ok, topic, queueId, queueOffset, sysFlag, storeTimestamp, properties)
Rec = tuple[int, int, bool, str, int, int, int, int, str]
# Expected consume-queue units: (topic, queueId) -> {queueOffset: (phy, size, tagsCode)}
Expected = dict[tuple[str, int], dict[int, tuple[int, int, int]]]


Raw = bytes | bytearray
# Prefetched units per queue: (first logical offset, count, pending response).
Prefetched = dict[tuple[str, int], tuple[int, int, "Future[Raw]"]]

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _io_pool() -> ThreadPoolExecutor:
    """Threads that wait on the brokers while the task's thread decodes (sockets release the GIL).

    A task alone would leave its core idle during every request; overlapping keeps ``local[*]``
    (one task per core) busy.  One pool per Python worker process, reused across tasks.
    """
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rmq-verify-io")
        return _pool


def prefetch_units(client: AdminClient, expected: Expected) -> Prefetched:
    """Start reading every queue range ``expected`` needs."""
    pool = _io_pool()
    out: Prefetched = {}
    for (topic, qid), units in expected.items():
        qmin, qmax = min(units), max(units)
        count = qmax - qmin + 1
        out[(topic, qid)] = (qmin, count, pool.submit(client.consume_queue, topic, qid, qmin, count))
    return out


class _Window:
    """Bytes ``[base, end)`` of one replica's commitlog, fetched lazily up to ``limit``."""

    __slots__ = ("base", "client", "data", "gone_to", "limit", "short", "slack", "timings")

    def __init__(self, client: AdminClient, base: int, limit: int, slack: int, timings: Timings) -> None:
        self.client = client
        self.base = base
        self.limit = limit
        self.slack = slack
        self.timings = timings
        self.data: bytes | bytearray = b""
        # The replica served less than asked although the range is below ``limit``.
        self.short = False
        # The replica's log now starts above ``base`` (retention deleted ``[base, gone_to)``).
        self.gone_to: int | None = None

    @property
    def end(self) -> int:
        return self.base + len(self.data)

    def ensure(self, upto: int) -> bool:
        """Make ``[base, upto)`` available; False when the replica has no such bytes."""
        if upto <= self.end:
            return True
        if self.short or self.end >= self.limit:
            return False
        want = min(self.limit, upto + self.slack) - self.end
        t0 = time.perf_counter()
        first, more = self.client.commitlog(self.end, want)
        self.timings.fetch += time.perf_counter() - t0
        if first != self.end or len(more) < want:
            self.short = True
            if not self.data and first > self.base:
                self.gone_to = first
        if first == self.end and more:
            self.data = more if not self.data else bytes(self.data) + bytes(more)
        return upto <= self.end


def _blank_ok(win: _Window, pos: int) -> bool:
    """A blank marker at ``pos`` with a sane length and zeroes after it (RocketMQ leaves them)."""
    size, _magic = peek_size_magic(win.data, pos - win.base)
    if size < 8 or size > _MAX_RECORD:
        return False
    probe = pos + min(size, 8 + _BLANK_ZERO_PROBE)
    win.ensure(probe)
    probe = min(probe, win.end)
    rel = pos - win.base
    tail = win.data[rel + 8:probe - win.base]
    return tail.count(0) == len(tail)


def _record_ok(win: _Window, pos: int) -> bool:
    """A complete record with valid framing and body CRC at ``pos``."""
    size, _magic = peek_size_magic(win.data, pos - win.base)
    if size < MIN_RECORD_SIZE or size > _MAX_RECORD or not win.ensure(pos + size):
        return False
    try:
        check_record(win.data, pos - win.base, check_crc=True)
    except CorruptRecordError:
        return False
    return True


def find_boundary(win: _Window, frm: int, before: int) -> int | None:
    """First position in ``[frm, before)`` where a record or a blank marker starts (see module doc)."""
    pos = frm
    while pos < before:
        win.ensure(min(before, win.limit) + 8)
        data = win.data
        rel = pos - win.base
        limit = min(before, win.end - 8) - win.base
        if rel >= limit:
            return None
        # The magic code is 4 bytes into a record or marker.
        # Magic at i means a candidate at i - 4; candidates must lie below ``limit``.
        m = data.find(_MAGIC, rel + 4, limit + 7)
        # A blank marker only matters before the first record candidate (bounded: no 32 MB scans).
        b = data.find(_BLANK, rel + 4, m + 1 if m >= 0 else limit + 7)
        cands = [c - 4 for c in (m, b) if c >= 0]
        if not cands:
            return None
        cand = min(cands)
        cpos = win.base + cand
        if (cand == b - 4 and _blank_ok(win, cpos)) or (cand == m - 4 and _record_ok(win, cpos)):
            return cpos
        pos = cpos + 1
    return None


def _mm(replica: ReplicaRef, kind: str, pos: int | None, rec: Rec | None = None, **kw: object) -> Mismatch:
    m = Mismatch(replica.name, kind, pos)
    if rec is not None:
        m.size, m.topic, m.queue_id, m.queue_offset = rec[1], rec[3], rec[4], rec[5]
    for k, v in kw.items():
        setattr(m, k, v)
    return m


class _Sink:
    """Mismatches of one task, counted per replica and capped per replica."""

    def __init__(self, res: ChunkResult, cap: int) -> None:
        self.res = res
        self.cap = cap
        self.kept: dict[str, int] = {}

    def add(self, m: Mismatch) -> None:
        stats = self.res.stats[m.replica]
        stats.mismatches += 1
        stats.by_kind[m.kind] = stats.by_kind.get(m.kind, 0) + 1
        kept = self.kept.get(m.replica, 0)
        if kept < self.cap:
            self.kept[m.replica] = kept + 1
            self.res.mismatches.append(m)


def _walk_master(task: ChunkTask, win: _Window, sink: _Sink) -> tuple[int | None, int | None, list[Rec]]:
    """Decode the records starting in ``[start, stop)``: (first boundary, handoff, records)."""
    master = task.master
    end = master.end
    if task.forced_start is not None:
        pos: int | None = task.forced_start
    else:
        pos = find_boundary(win, task.start, min(task.stop, end))
    if pos is None:
        return None, None, []
    first = pos
    records: list[Rec] = []
    append = records.append
    stop = min(task.stop, end)
    data, base = win.data, win.base
    while pos < stop:
        # Hot path: one codec call per record; everything else only when it raises.
        try:
            size, crc_ok, topic, qid, qoff, sys_flag, store_ts, props = verify_record(data, pos - base)
        except CorruptRecordError as exc:
            if not win.ensure(pos + 8):
                sink.add(_mm(master, FRAMING, pos, detail=f"commitlog ends at {win.end} inside a record header"))
                return first, None, records
            data = win.data
            size, magic = peek_size_magic(data, pos - base)
            if magic == BLANK_MAGIC_CODE and size >= 8:
                pos += size  # rest of the segment is padding; the next segment starts a record
                continue
            if magic == MESSAGE_MAGIC_CODE and MIN_RECORD_SIZE <= size <= _MAX_RECORD and pos + size > win.end:
                if win.ensure(pos + size):
                    data = win.data
                    continue  # the record crossed the fetched end: retry with more bytes
                sink.add(_mm(master, FRAMING, pos, size=size,
                             detail=f"record of {size} bytes runs past the served commitlog end {win.end}"))
                return first, None, records
            sink.add(_mm(master, FRAMING, pos, detail=str(exc)))
            nxt = find_boundary(win, pos + 1, end)
            data = win.data
            pos = end if nxt is None else nxt
            continue
        rec: Rec = (pos, size, crc_ok, topic, qid, qoff, sys_flag, store_ts, props)
        if not crc_ok:
            sink.add(_mm(master, BODY_CRC, pos, rec, field="bodyCrc", detail="stored BODYCRC does not match body"))
        append(rec)
        pos += size
    return first, min(pos, end), records


def _decode(buf: ReadBuffer, rel: int, phy: int) -> MessageRecord | str:
    try:
        return decode_record(buf, rel)
    except CorruptRecordError as exc:
        return _at(exc, rel, phy)


def _at(exc: CorruptRecordError, rel: int, phy: int) -> str:
    """The codec's message, with the record's place in the fetched buffer given as its commitlog
    offset (the buffer's layout depends on chunking; the report must not)."""
    return str(exc).replace(f"at {rel}", f"at {phy}", 1)


def _compare_record(slave: ReplicaRef, rec: Rec, mbuf: ReadBuffer, mrel: int, sbuf: ReadBuffer, srel: int,
                    sink: _Sink) -> Rec | None:
    """Field-by-field comparison of one record whose bytes differ; the slave's record if it decodes."""
    pos = rec[0]
    s = _decode(sbuf, srel, pos)
    if isinstance(s, str):
        sink.add(_mm(slave, FRAMING, pos, rec, detail=f"replica: {s}"))
        return None
    m = _decode(mbuf, mrel, pos)
    if isinstance(m, str):  # cannot happen for a walked record, but do not crash on it
        sink.add(_mm(slave, FRAMING, pos, rec, detail=f"master: {m}"))
        return None
    pairs = (("physicalOffset", m.physical_offset, s.physical_offset), ("size", m.total_size, s.total_size),
             ("bodyCrc", m.body_crc, s.body_crc), ("topic", m.topic, s.topic),
             ("queueId", m.queue_id, s.queue_id), ("queueOffset", m.queue_offset, s.queue_offset))
    differs = False
    for name, a, b in pairs:
        if a != b:
            differs = True
            sink.add(_mm(slave, RECORD, pos, rec, field=name, expected=str(a), actual=str(b)))
    crc_ok = True
    try:
        check_record(sbuf, srel, True)
    except CorruptRecordError as exc:
        crc_ok = False
        if not differs:
            sink.add(_mm(slave, BODY_CRC, pos, rec, field="bodyCrc", detail=f"replica: {_at(exc, srel, pos)}"))
            differs = True
    if not differs:
        other = [n for n in ("flag", "sys_flag", "born_timestamp", "born_host", "store_timestamp", "store_host",
                             "reconsume_times", "prepared_transaction_offset", "body", "properties_str")
                 if getattr(m, n) != getattr(s, n)]
        sink.add(_mm(slave, RECORD_BYTES, pos, rec, field=",".join(other) or None,
                     detail="compared fields agree but the record bytes differ"))
    props = s.properties_str
    return (pos, s.total_size, crc_ok, s.topic, s.queue_id, s.queue_offset, s.sys_flag, s.store_timestamp, props)


def _equal(a: Raw, b: memoryview) -> bool:
    """One memcmp: bytearray's == takes any buffer (memoryview == memoryview compares item by item)."""
    return bytearray.__eq__(a if isinstance(a, bytearray) else bytearray(a), b)


def _slave_bytes(client: AdminClient, lo: int, hi: int, pre: Future[tuple[int, Raw]] | None) -> tuple[int, Raw]:
    """The slave's bytes of ``[lo, hi)`` (fewer if it has fewer), from the prefetch where it covers them."""
    if hi <= lo:
        return lo, b""
    if pre is not None:
        got_from, data = pre.result()
        got_to = got_from + len(data)
        if got_from <= lo < got_to:
            part = data[lo - got_from:min(hi, got_to) - got_from]
            if got_to >= hi:
                return lo, part
            more_from, more = client.commitlog(got_to, hi - got_to)  # the record crossing the chunk end
            return lo, (part + more) if more_from == got_to else part
    return client.commitlog(lo, hi - lo)


def _compare_slave(task: ChunkTask, slave: ReplicaRef, client: AdminClient, mwin: _Window, first: int,
                   span_end: int, records: list[Rec], sink: _Sink, timings: Timings,
                   stats: ReplicaChunkStats, pre: Future[tuple[int, Raw]] | None = None) -> tuple[list[Rec], bool]:
    """Compare one slave over ``[first, span_end)``; its records in range and whether it was byte-identical."""
    lo = max(first, slave.start)
    hi = min(span_end, slave.end)
    t0 = time.perf_counter()
    got_from, sdata = _slave_bytes(client, lo, hi, pre)
    t1 = time.perf_counter()
    timings.fetch += t1 - t0
    got_to = got_from + len(sdata)
    mdata = mwin.data
    mb = mwin.base
    identical = got_from == lo and got_to == hi and _equal(sdata, memoryview(mdata)[lo - mb:hi - mb])
    own: list[Rec] = []
    if identical and lo == first and hi == span_end and all(r[2] for r in records):
        # The whole span, byte for byte: the master's records are the slave's (the common case).
        stats.records += len(records)
        stats.bytes += hi - lo
        timings.compare += time.perf_counter() - t1
        return records, True
    if identical:
        for rec in records:
            pos, size = rec[0], rec[1]
            if pos < slave.start:
                stats.head_gap_records += 1
            elif pos + size > slave.end:
                stats.lag_records += 1
            else:
                own.append(rec)
                if not rec[2]:  # the master's corrupt body was replicated as it is
                    sink.add(_mm(slave, BODY_CRC, pos, rec, field="bodyCrc", detail="replicated corrupt body"))
        stats.records += len(own)
        stats.bytes += hi - lo if hi > lo else 0
        timings.compare += time.perf_counter() - t1
        return own, True
    for rec in records:
        pos, size = rec[0], rec[1]
        if pos < slave.start:
            stats.head_gap_records += 1
            continue
        if pos + size > slave.end:
            stats.lag_records += 1
            continue
        if pos < got_from:
            # The slave's log now starts above the record: its retention deleted it during the
            # run (the admin endpoint serves from the min offset). A head gap, as at discovery.
            stats.head_gap_records += 1
            continue
        if pos + size > got_to:
            sink.add(_mm(slave, MISSING, pos, rec,
                         detail=f"below the replica's max offset {slave.end} but not served "
                                f"(served [{got_from}, {got_to}))"))
            continue
        stats.records += 1
        stats.bytes += size
        mrel = pos - mb
        srel = pos - got_from
        if sdata[srel:srel + size] == mdata[mrel:mrel + size]:
            own.append(rec)
            if not rec[2]:
                sink.add(_mm(slave, BODY_CRC, pos, rec, field="bodyCrc", detail="replicated corrupt body"))
            continue
        srec = _compare_record(slave, rec, mdata, mrel, sdata, srel, sink)
        if srec is not None:
            own.append(srec)
    _compare_between_records(slave, records, max(lo, got_from), min(hi, got_to), mdata, mb, sdata, got_from, sink)
    timings.compare += time.perf_counter() - t1
    return own, False


def _compare_between_records(slave: ReplicaRef, records: list[Rec], start: int, stop: int, mdata: ReadBuffer,
                             mb: int, sdata: Raw, sb: int, sink: _Sink) -> None:
    """The bytes of ``[start, stop)`` that no record covers (a segment's end-of-file blank marker
    and its padding) must be the master's too: one finding per differing stretch."""
    cursor = start
    stretches: list[tuple[int, int]] = []
    for rec in records:
        pos, size = rec[0], rec[1]
        if pos > cursor:
            stretches.append((cursor, min(pos, stop)))
        cursor = max(cursor, pos + size)
        if cursor >= stop:
            break
    if cursor < stop:
        stretches.append((cursor, stop))
    sview, mview = memoryview(sdata), memoryview(mdata)
    for a, b in stretches:
        if a >= b:
            continue
        theirs, ours = bytes(sview[a - sb:b - sb]), bytes(mview[a - mb:b - mb])  # padding: small
        if theirs == ours:
            continue
        first = next(i for i in range(b - a) if theirs[i] != ours[i])
        sink.add(_mm(slave, NON_RECORD_BYTES, a + first,
                     detail=f"bytes [{a}, {b}) outside records differ from the master's, first at {a + first} "
                            f"(master {ours[first]:#04x}, replica {theirs[first]:#04x})"))


def expected_units(records: list[Rec], delay_levels_ms: tuple[int, ...],
                   dup: Callable[[Rec, int], None] | None = None) -> Expected:
    """The consume-queue units ``records`` require (prepared/rolled-back transactions have none)."""
    out: Expected = {}
    for rec in records:
        pos, size, _ok, topic, qid, qoff, sys_flag, store_ts, props = rec
        tran = sys_flag & TRANSACTION_TYPE_MASK
        if tran in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
            continue
        tag = get_property(props, TAGS)
        code = tags_code(tag) if tag else 0
        if topic == SCHEDULE_TOPIC and delay_levels_ms:
            # Delayed messages index their delivery time instead of the tag hash (§6.1).
            raw = get_property(props, DELAY)
            level = int(raw) if raw and raw.isdigit() else 0
            if level > 0:
                code = store_ts + delay_levels_ms[min(level, len(delay_levels_ms)) - 1]
        units = out.get((topic, qid))
        if units is None:
            units = out[(topic, qid)] = {}
        if qoff in units:
            if dup is not None:
                dup(rec, units[qoff][0])
            continue
        units[qoff] = (pos, size, code)
    return out


def check_units(replica: ReplicaRef, client: AdminClient, expected: Expected, by_pos: dict[int, Rec],
                lo: int, hi: int, sink: _Sink, res: ChunkResult,
                master_raw: dict[tuple[str, int], tuple[int, Raw]] | None,
                master_findings: dict[tuple[str, int], list[Mismatch]] | None,
                prefetched: Prefetched | None = None,
                ) -> tuple[dict[tuple[str, int], tuple[int, Raw]], dict[tuple[str, int], list[Mismatch]]]:
    """Check one replica's units for the chunk's records; returns the raw units and findings per queue.

    ``master_raw``/``master_findings``: a slave whose records are the master's and whose raw
    units are byte-identical inherits the master's findings for that queue without re-checking.
    """
    raw_out: dict[tuple[str, int], tuple[int, Raw]] = {}
    findings: dict[tuple[str, int], list[Mismatch]] = {}
    coverage = res.cq_coverage.setdefault(replica.name, [])
    foreign = res.foreign_units.setdefault(replica.name, [])
    stats = res.stats[replica.name]
    pack = UNIT.pack
    for key, units in expected.items():
        topic, qid = key
        qmin, qmax = min(units), max(units)
        count = qmax - qmin + 1
        coverage.append((topic, qid, qmin, qmax))
        pre = prefetched.get(key) if prefetched else None
        if pre is not None and pre[0] == qmin and pre[1] == count:
            raw = pre[2].result()
        else:
            raw = client.consume_queue(topic, qid, qmin, count)
        raw_out[key] = (qmin, raw)
        stats.cq_units += len(units)
        if master_raw is not None and master_findings is not None and master_raw.get(key) == (qmin, raw):
            for f in master_findings.get(key, ()):
                sink.add(Mismatch(replica.name, f.kind, f.offset, f.size, f.topic, f.queue_id, f.queue_offset,
                                  f.field, f.expected, f.actual, f.detail))
            continue
        if len(units) == count and raw == b"".join([pack(*units[q]) for q in range(qmin, qmax + 1)]):
            findings[key] = []  # exactly the units the records require (one memcmp)
            continue
        found: list[Mismatch] = []
        n = len(raw) // CQ_STORE_UNIT_SIZE
        logical = qmin
        for phy, size, tags in UNIT.iter_unpack(memoryview(raw)[:n * CQ_STORE_UNIT_SIZE]):
            want = units.get(logical)
            if want is None:
                if not (size == BLANK_SIZE and phy == 0):
                    rec = by_pos.get(phy)
                    if lo <= phy < hi:
                        what = (f"record of {rec[3]} queue {rec[4]} offset {rec[5]}" if rec is not None
                                else "no record boundary")
                        found.append(Mismatch(replica.name, CQ_DANGLING, phy, size, topic, qid, logical,
                                              detail=f"unit points at {what}"))
                    else:
                        foreign.append((topic, qid, logical, phy, size, tags))
            elif (phy, size, tags) != want:
                if size == BLANK_SIZE and phy == 0:
                    found.append(Mismatch(replica.name, CQ_MISSING, want[0], want[1], topic, qid, logical,
                                          detail="unit is a blank filler"))
                else:
                    for name, a, b in (("phy", want[0], phy), ("size", want[1], size), ("tagsCode", want[2], tags)):
                        if a != b:
                            found.append(Mismatch(replica.name, CQ_WRONG, want[0], want[1], topic, qid, logical,
                                                  field=name, expected=str(a), actual=str(b)))
            logical += 1
        for missing in range(qmin + n, qmax + 1):
            want = units.get(missing)
            if want is not None:
                found.append(Mismatch(replica.name, CQ_MISSING, want[0], want[1], topic, qid, missing,
                                      detail="consume queue has no unit at this offset"))
        findings[key] = found
        for f in found:
            sink.add(f)
    return raw_out, findings


def verify_chunk(task: ChunkTask) -> ChunkResult:
    """Run one task (module-level so Spark pickles it by reference)."""
    timings = Timings()
    res = ChunkResult(task.index, None, None, timings=timings)
    replicas = (task.master, *task.slaves)
    for r in replicas:
        res.stats[r.name] = ReplicaChunkStats()
    sink = _Sink(res, task.max_mismatches)
    master = task.master
    mclient = AdminClient(master.url, master.token, master.timeout)
    stop = min(task.stop, master.end)
    base = task.forced_start if task.forced_start is not None else task.start
    pool = _io_pool()
    clients = {s.name: AdminClient(s.url, s.token, s.timeout) for s in task.slaves}
    # The slaves' bytes of this chunk arrive while the master's records are decoded.
    slave_pre = {s.name: pool.submit(clients[s.name].commitlog, max(base, s.start),
                                     min(stop + task.slack, s.end) - max(base, s.start))
                 for s in task.slaves if min(stop + task.slack, s.end) > max(base, s.start)}
    win = _Window(mclient, base, master.end, task.slack, timings)
    t0 = time.perf_counter()
    try:
        win.ensure(stop)
        if win.gone_to is not None:
            # Retention deleted the master's oldest segments after planning (a run can take longer
            # than the gap to the next deleteWhen). Its new min offset is a segment start, hence a
            # record boundary; the bytes below it are no longer anybody's to verify, and walking
            # them as records reported the master's log as corrupt ("framing" at the old start).
            res.retired = win.gone_to
            if win.gone_to >= stop:
                return res
            task = replace(task, forced_start=win.gone_to)
            base = win.gone_to
            win = _Window(mclient, base, master.end, task.slack, timings)
            win.ensure(stop)
        first, handoff, records = _walk_master(task, win, sink)
    except AdminError as exc:
        sink.add(Mismatch(master.name, UNREACHABLE, task.start, detail=str(exc)))
        return res
    timings.decode += time.perf_counter() - t0 - timings.fetch
    res.first, res.handoff = first, handoff
    if first is None:
        return res
    span_end = handoff if handoff is not None else (records[-1][0] + records[-1][1] if records else first)
    mstats = res.stats[master.name]
    mstats.records = len(records)
    mstats.bytes = span_end - first

    def dup(rec: Rec, other: int) -> None:
        sink.add(_mm(master, CQ_MISSING, rec[0], rec, detail=f"queue offset also used by the record at {other}"))

    t1 = time.perf_counter()
    exp_master = expected_units(records, task.delay_levels_ms, dup) if task.check_consume_queues else {}
    by_pos = {r[0]: r for r in records}
    m_raw: dict[tuple[str, int], tuple[int, Raw]] = {}
    m_found: dict[tuple[str, int], list[Mismatch]] = {}
    # Every replica's units for the master's queue ranges, requested at once (a slave whose records
    # turn out to differ asks again for its own ranges).
    unit_pre = {r.name: prefetch_units(clients.get(r.name, mclient), exp_master) for r in replicas} \
        if task.check_consume_queues else {}
    if task.check_consume_queues:
        try:
            m_raw, m_found = check_units(master, mclient, exp_master, by_pos, first, span_end, sink, res, None, None,
                                         unit_pre[master.name])
        except AdminError as exc:
            sink.add(Mismatch(master.name, UNREACHABLE, first, detail=f"consume queue: {exc}"))
    timings.consume_queue += time.perf_counter() - t1
    for slave in task.slaves:
        client = clients[slave.name]
        try:
            own, identical = _compare_slave(task, slave, client, win, first, span_end, records, sink, timings,
                                            res.stats[slave.name], slave_pre.get(slave.name))
            if not task.check_consume_queues:
                continue
            t2 = time.perf_counter()
            if identical and len(own) == len(records):
                exp, sby_pos, reuse = exp_master, by_pos, True
            else:
                exp, sby_pos, reuse = expected_units(own, task.delay_levels_ms), {r[0]: r for r in own}, False
            check_units(slave, client, exp, sby_pos, max(first, slave.start), min(span_end, slave.end), sink, res,
                        m_raw if reuse else None, m_found if reuse else None, unit_pre.get(slave.name))
            timings.consume_queue += time.perf_counter() - t2
        except AdminError as exc:
            sink.add(Mismatch(slave.name, UNREACHABLE, first, detail=str(exc)))
    return res
