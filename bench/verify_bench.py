#!/usr/bin/env python
"""Replica-verification benchmark: ``rmq-verify`` on Spark vs a single-process pure-Python pass.

Usage::

    .venv/bin/python bench/verify_bench.py [--gib 1.1] [--workdir DIR] [--keep] [--spark-master local[2]]
                                           [--chunk-size 32M] [--append-results]

What it does
------------
1. Writes a master store of ``--gib`` GiB of commitlog directly with the broker's record codec
   (``write_record_into``; 1 GiB segments, blank end-of-segment markers, 4 topics x 8 queues,
   bodies 256 B - 4 KiB, 10 % zlib-compressed with sysFlag 1, tags).  It is cached in ``--workdir``
   and reused by later runs.
2. Starts a real broker on it once so the broker itself recovers the log (with CRC checks) and
   builds the consume queues, stops it cleanly, and copies the store (sparse) as the slave's.
3. Starts the master (ASYNC_MASTER) and the slave (SLAVE, replicating from the master's HA port;
   it is already caught up) as real broker processes with admin endpoints.
4. Runs, in the same run and against the same two processes:
   * ``rmq-verify --engine spark --master local[2]`` (new process: JVM start included), and
   * ``rmq-verify --engine local``: the same chunk tasks one after the other in one process.
5. Prints MB/s of commitlog per replica pair (bytes of the master's log / wall time; 1 MB = 10^6 B),
   the ratio, and where the time goes (JVM/SparkSession start, fetch, decode, compare, consume
   queues - task phases are summed over tasks, so on 2 cores they add up to ~2x the wall time).
   ``--append-results`` appends the figures to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
import zlib
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.procs import BrokerProc, Namesrv  # noqa: E402

from rmqbroker.store.record import (  # noqa: E402
    COMPRESSED,
    END_FILE_MIN_BLANK_LENGTH,
    body_crc,
    encode_tail,
    ip_to_bytes,
    record_size,
    write_blank,
    write_record_into,
)

SEG = 1 << 30
TOPICS = ("BenchVerifyA", "BenchVerifyB", "BenchVerifyC", "BenchVerifyD")
QUEUES = 8
TOKEN = "bench-token"
TAGS = ("TagA", "TagB", "TagC", "")


def write_store(root: Path, total: int) -> tuple[int, int]:
    """A commitlog of ``total`` bytes (rounded to whole records); returns (records, end offset)."""
    rng = random.Random(42)
    pool = rng.randbytes(16 << 20)
    text = b" ".join(f"order-{i} item={i * 7} qty={i % 13}".encode() for i in range(200_000))
    # A pool of compressed bodies (compressing 10 % of a GiB at record time would dominate the set-up).
    zbodies = []
    for _ in range(256):
        start = rng.randrange(0, len(text) - 40000)
        zbodies.append(zlib.compress(text[start:start + rng.randint(4096, 32768)], 5))
    ip = ip_to_bytes("127.0.0.1")
    qoffs = {(t, q): 0 for t in TOPICS for q in range(QUEUES)}
    tails = {(t, tag): encode_tail(t.encode(), (f"TAGS\x01{tag}\x02" if tag else "").encode()
                                   + b"KEYS\x01bench\x02WAIT\x01true")
             for t in TOPICS for tag in TAGS}
    (root / "commitlog").mkdir(parents=True)
    phy = 0
    n = 0
    now = int(time.time() * 1000)
    seg_start = 0
    buf = bytearray(SEG)
    pos = 0
    while phy < total:
        i = n
        topic = TOPICS[i % len(TOPICS)]
        qid = (i // len(TOPICS)) % QUEUES
        if i % 10 == 0:
            body: bytes | memoryview = zbodies[rng.randrange(len(zbodies))]
            sys_flag = COMPRESSED
        else:
            off = rng.randrange(0, len(pool) - 4096)
            body = memoryview(pool)[off:off + rng.randint(256, 4096)]
            sys_flag = 0
        tail = tails[(topic, TAGS[i % len(TAGS)])]
        size = record_size(sys_flag, len(body), len(tail))
        if pos + size + END_FILE_MIN_BLANK_LENGTH > SEG:
            write_blank(buf, pos, SEG - pos)
            (root / "commitlog" / f"{seg_start:020d}").write_bytes(buf)
            seg_start += SEG
            phy = seg_start
            buf = bytearray(SEG)
            pos = 0
            continue
        key = (topic, qid)
        write_record_into(buf, pos, size, body_crc(body), qid, 0, qoffs[key], phy, sys_flag, now + i, ip, 40000,
                          now + i, ip, 10911, 0, 0, body, tail)
        qoffs[key] += 1
        pos += size
        phy += size
        n += 1
    with open(root / "commitlog" / f"{seg_start:020d}", "wb") as f:
        f.write(memoryview(buf)[:pos])
        f.truncate(SEG)  # full-size segment, sparse after the data
    return n, phy


def broker(workdir: Path, store: Path, broker_id: int, role: str, **conf: Any) -> BrokerProc:
    b = BrokerProc(workdir, None, name="bench-v", broker_id=broker_id, role=role, token=TOKEN,
                   mappedFileSizeCommitLog=SEG, mappedFileSizeConsumeQueue=6_000_000, **conf)
    if b.store_dir != store:
        b.store_dir = store
        b.conf["storePathRootDir"] = str(store)
        b.write_conf()
    return b


def prepare(workdir: Path, gib: float) -> tuple[Path, Path, dict[str, Any]]:
    master_store, slave_store = workdir / "master-store", workdir / "slave-store"
    info_path = workdir / "store.json"
    if info_path.exists() and slave_store.exists():
        return master_store, slave_store, json.loads(info_path.read_text())
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    t0 = time.perf_counter()
    records, end = write_store(master_store, int(gib * (1 << 30)))
    t1 = time.perf_counter()
    print(f"wrote {records} records, {end / 1e6:,.0f} MB of commitlog in {t1 - t0:.1f}s", flush=True)
    # The broker recovers the log (CRC-checked) and builds every consume queue itself.
    b = broker(workdir, master_store, 0, "ASYNC_MASTER").start(wait_ready=False)
    b.wait_ready(timeout=900)
    st = b.status()
    assert st["maxPhyOffset"] == end, (st["maxPhyOffset"], end)
    b.stop(timeout=300)
    t2 = time.perf_counter()
    print(f"broker recovery + consume-queue build: {t2 - t1:.1f}s", flush=True)
    subprocess.run(["cp", "-a", "--sparse=always", str(master_store), str(slave_store)], check=True)
    (slave_store / "lock").unlink(missing_ok=True)
    info = {"records": records, "end": end, "gib": gib}
    info_path.write_text(json.dumps(info))
    return master_store, slave_store, info


def naive_pass(urls: list[str], end: int) -> tuple[float, int, dict[str, float]]:
    """The obvious single-process tool, for contrast: every record of every replica decoded with
    ``decode_record`` (body CRC recomputed), the six fields compared, then every consume-queue unit
    of every replica checked against the decoded records.  No byte-equality shortcut, no threads."""
    from rmqbroker.store.consume_queue import BLANK_SIZE, UNIT
    from rmqbroker.store.record import BLANK_MAGIC_CODE, body_crc, decode_record, peek_size_magic, tags_code
    from rmqbroker.verify.admin_client import AdminClient

    t0 = time.perf_counter()
    clients = [AdminClient(u, TOKEN) for u in urls]
    times = {"fetch": 0.0, "decode": 0.0, "compare": 0.0, "cq": 0.0}
    units: dict[tuple[str, int, int], tuple[int, int, int]] = {}
    pos, mismatches, step = 0, 0, 64 << 20
    while pos < end:
        t = time.perf_counter()
        bufs = [bytes(c.commitlog(pos, min(step + (4 << 20), end - pos))[1]) for c in clients]
        times["fetch"] += time.perf_counter() - t
        rel = 0
        while pos + rel < end and rel < step:
            size, magic = peek_size_magic(bufs[0], rel)
            if magic == BLANK_MAGIC_CODE:
                rel += size
                continue
            t = time.perf_counter()
            recs = [decode_record(b, rel) for b in bufs]
            crc_ok = [body_crc(r.body) == r.body_crc for r in recs]
            t2 = time.perf_counter()
            times["decode"] += t2 - t
            m = recs[0]
            key = (m.physical_offset, m.total_size, m.body_crc, m.topic, m.queue_id, m.queue_offset)
            for r, ok in zip(recs, crc_ok, strict=True):
                if not ok or (r.physical_offset, r.total_size, r.body_crc, r.topic, r.queue_id, r.queue_offset) != key:
                    mismatches += 1
            units[(m.topic, m.queue_id, m.queue_offset)] = (pos + rel, m.total_size, tags_code(m.tags))
            times["compare"] += time.perf_counter() - t2
            rel += m.total_size
        pos += rel
    t = time.perf_counter()
    for c in clients:
        for q in c.queues():
            raw = c.consume_queue(q.topic, q.queue_id, q.min_offset, q.max_offset - q.min_offset)
            for i, (phy, size, tags) in enumerate(UNIT.iter_unpack(raw)):
                if size != BLANK_SIZE and units.get((q.topic, q.queue_id, q.min_offset + i)) != (phy, size, tags):
                    mismatches += 1
    times["cq"] = time.perf_counter() - t
    return time.perf_counter() - t0, mismatches, times


def run_verify(urls: list[str], report: Path, *extra: str) -> tuple[float, dict[str, Any]]:
    exe = Path(sys.executable).with_name("rmq-verify")
    t0 = time.perf_counter()
    proc = subprocess.run([str(exe), "--replicas", ",".join(urls), "--token", TOKEN, "--report", str(report),
                           "--progress", "off", *extra], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"rmq-verify {' '.join(extra)} exited {proc.returncode}:\n{proc.stdout}\n"
                         f"{proc.stderr[-3000:]}")
    return wall, json.loads(report.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.1)
    ap.add_argument("--workdir", default="/tmp/rmq-verify-bench")
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument("--chunk-size", default="64M")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--append-results", action="store_true")
    args = ap.parse_args()
    workdir = Path(args.workdir)
    master_store, slave_store, info = prepare(workdir, args.gib)
    run_dir = workdir / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    # A nameserver so the slave learns its master and syncs metadata, as in production.
    ns = Namesrv(run_dir).start()
    sync = {"namesrvAddr": ns.addr, "slaveSyncInitialDelay": 300, "slaveSyncInterval": 1000}
    m = broker(run_dir, master_store, 0, "ASYNC_MASTER", **sync).start(wait_ready=False)
    s: BrokerProc | None = None
    try:
        m.wait_ready(timeout=600)
        s = broker(run_dir, slave_store, 1, "SLAVE", haMasterAddress=f"127.0.0.1:{m.port + 1}",
                   **sync).start(wait_ready=False)
        s.wait_ready(timeout=600)
        assert s.status()["maxPhyOffset"] == m.status()["maxPhyOffset"] == info["end"]
        deadline = time.monotonic() + 60
        while s.status()["dataVersions"] != m.status()["dataVersions"]:
            if time.monotonic() > deadline:
                raise SystemExit("slave metadata never synced")
            time.sleep(0.5)
        urls = [f"http://127.0.0.1:{m.admin_port}", f"http://127.0.0.1:{s.admin_port}"]
        runs = [measure(urls, info, args, run_dir, i) for i in range(args.runs)]
    finally:
        for b in (s, m):
            if b is not None:
                b.stop(timeout=120)
        ns.stop()
    text = "\n\n".join(runs)
    print(text)
    if args.append_results:
        results = ROOT / "bench" / "RESULTS.md"
        with open(results, "a") as f:
            f.write(f"\n## {date(2026, 11, 22).isoformat()} — replica verification "
                    f"(`bench/verify_bench.py`, issue 5)\n\n"
                    "2 cores shared by the two brokers, the Spark JVM, its Python workers and the driver, on a "
                    "machine where other jobs were running (load averages per run below); spark and the two "
                    "single-process passes run back to back against the same broker processes in each run.\n\n"
                    "```\n" + text + "\n```\n")


def measure(urls: list[str], info: dict[str, Any], args: argparse.Namespace, run_dir: Path, i: int) -> str:
    load0 = os.getloadavg()[0]
    spark_wall, spark_rep = run_verify(urls, run_dir / f"spark{i}.json", "--engine", "spark", "--master",
                                       args.spark_master, "--chunk-size", args.chunk_size)
    local_wall, local_rep = run_verify(urls, run_dir / f"local{i}.json", "--engine", "local",
                                       "--chunk-size", args.chunk_size)
    naive_wall, naive_bad, naive_t = naive_pass(urls, info["end"])
    assert naive_bad == 0, naive_bad
    for rep in (spark_rep, local_rep):
        assert rep["result"] == "clean", rep["replicas"]
    nbytes = spark_rep["bytesVerified"]
    assert nbytes == local_rep["bytesVerified"] == info["end"]
    spark_mbs, local_mbs, naive_mbs = nbytes / spark_wall / 1e6, nbytes / local_wall / 1e6, nbytes / naive_wall / 1e6
    st = spark_rep["timings"]
    lt = local_rep["timings"]
    job_only = nbytes / (st["chunks"] + st["consumeQueueResidue"] + st["metadata"] + st["discover"]) / 1e6
    # Log size at which the JVM start is paid back: start = size * (1/local - 1/job).
    breakeven = st["sparkStart"] / (1 / local_mbs - 1 / job_only) if job_only > local_mbs else -1.0
    lines = [
        f"run {i + 1}: load average {load0:.1f} -> {os.getloadavg()[0]:.1f}",
        f"store: {nbytes / 1e6:,.0f} MB commitlog ({nbytes / (1 << 30):.2f} GiB), {info['records']:,} records "
        f"(avg {nbytes / info['records']:,.0f} B), 4 topics x 8 queues, master + 1 slave (one replica pair)",
        f"spark ({spark_rep['sparkMaster']}, {spark_rep['chunks']} chunks of {spark_rep['chunkSize'] >> 20} MiB): "
        f"{spark_wall:.1f}s wall = {spark_mbs:,.0f} MB/s per replica pair "
        f"(JVM + SparkContext start {st['sparkStart']:.1f}s; job alone {job_only:,.0f} MB/s)",
        f"single process, same task code (--engine local): {local_wall:.1f}s wall = {local_mbs:,.0f} MB/s; "
        f"spark/this = {spark_mbs / local_mbs:.2f}x end to end, {job_only / local_mbs:.2f}x job alone",
        f"single process, naive pure-Python pass (decode every record of both replicas, compare fields, check "
        f"every unit): {naive_wall:.1f}s = {naive_mbs:,.0f} MB/s; spark/naive = {spark_mbs / naive_mbs:.2f}x "
        f"end to end, {job_only / naive_mbs:.2f}x job alone",
        (f"break-even log size for spark end to end vs --engine local: {breakeven:,.0f} MB" if breakeven > 0
         else "spark job alone was not faster than --engine local in this run"),
        "where the time goes (task phases summed over tasks; with 2 slots they add up to ~2x the stage wall):",
        f"  spark : start {st['sparkStart']:.1f}s | chunk stage {st['chunks']:.1f}s wall: "
        f"fetch {st['taskFetch']:.1f}s, decode+CRC {st['taskDecode']:.1f}s, compare {st['taskCompare']:.1f}s, "
        f"consume queues {st['taskConsumeQueue']:.1f}s | CQ residue {st['consumeQueueResidue']:.1f}s | "
        f"metadata {st['metadata']:.2f}s",
        f"  local : chunk stage {lt['chunks']:.1f}s: fetch {lt['taskFetch']:.1f}s, decode+CRC {lt['taskDecode']:.1f}s, "
        f"compare {lt['taskCompare']:.1f}s, consume queues {lt['taskConsumeQueue']:.1f}s | "
        f"CQ residue {lt['consumeQueueResidue']:.1f}s",
        f"  naive : fetch {naive_t['fetch']:.1f}s, decode+CRC {naive_t['decode']:.1f}s, compare "
        f"{naive_t['compare']:.1f}s, consume queues {naive_t['cq']:.1f}s",
    ]
    print("\n".join(lines), flush=True)
    return "\n".join(lines)

if __name__ == "__main__":
    main()
