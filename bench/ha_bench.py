"""HA replication benchmarks (real broker processes on loopback).

(a) ``catchup``: a master holding a large commitlog (default 1 GiB, written through the store API
    before the broker starts) and, ``--reps`` times, a new empty slave started against it; the
    rate at which the master receives the slave's acks (offset and time of each ack from the
    master's /status), from the first acked bytes until the slave acked the whole log. Before
    each catch-up, raw loopback socket throughput (sendfile of the same segment files into a
    recv_into loop in another process) is measured; each pair's ratio catch-up / raw and their
    median are printed, and so is the ceiling of the slave's own kernel path: the same sendfile
    stream spliced socket -> pipe -> a file (no broker).
(b) ``lag``: a steady 5,000 msg/s stream of 1 KiB sends to an ASYNC master with one slave; for a
    sample of sends the time from the send's acknowledgement until the slave's HA ack covers it
    (read from the master's /status) — reported as p50/p99 replication lag.
(c) ``syncasync``: 16 concurrent producers for a fixed time against an ASYNC_MASTER and a
    SYNC_MASTER (each with one slave, broker default segment sizes), in rounds that alternate
    which mode goes first; throughput of each and the ratio SYNC/ASYNC, with the master's and the
    slave's CPU per message over the same window (where the SYNC surcharge goes). ``--variant``
    runs other sets of roles and broker.conf keys the same way (an A/B of a setting). ``--slave ideal``
    puts ``bench/ideal_slave.c`` (built with gcc; acks each frame at once, stores nothing) in the
    slave's place: the ratio a slave costing next to nothing would allow on this host.

Usage: ``python bench/ha_bench.py [catchup|lag|syncasync|all] [--gib 1.0] [--seconds 10]``.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tests.support.procs import BrokerProc, Namesrv  # noqa: E402

from rmqbroker.remoting.client import RemotingClient  # noqa: E402
from rmqbroker.remoting.codes import RequestCode  # noqa: E402
from rmqbroker.remoting.frame import RemotingCommand  # noqa: E402

SEG = 1024 * 1024 * 1024
F_SETPIPE_SZ = 1031  # Linux fcntl: size a pipe
# How often the catch-up benchmark samples the master's /status (s); the timing itself comes from
# the ack timestamps in the samples, not from when we looked.
ACK_POLL = 0.02


def status(b: BrokerProc) -> dict[str, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{b.admin_port}/status",
                                 headers={"Authorization": f"Bearer {b.token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        result: dict[str, Any] = json.loads(r.read())
        return result


def fill_store(store_dir: Path, total_bytes: int, body_size: int) -> int:
    """Write ~total_bytes of messages through the store API (no broker running); the end offset."""
    from rmqbroker.store.config import StoreConfig
    from rmqbroker.store.message_store import MessageInner, MessageStore

    async def run() -> int:
        store = MessageStore(StoreConfig(store_path_root_dir=store_dir, mapped_file_size_commit_log=SEG,
                                         store_host=("127.0.0.1", 10911)))
        await store.start()
        body = os.urandom(body_size)
        n = 0
        while store.max_phy_offset() < total_bytes:
            store.append_message(MessageInner(topic="CatchUp", queue_id=n % 8, flag=0, body=body,
                                              properties={"KEYS": str(n)}, born_host=("127.0.0.1", 1)))
            n += 1
        end = store.max_phy_offset()
        await store.shutdown()
        return end

    return asyncio.run(run())


def _splice_into(conn: socket.socket, sink: str, total: int) -> int:
    """The slave's kernel path without a broker: splice socket -> pipe -> a pre-sized file, blocks
    allocated ahead as the slave's receiver does. Bytes moved."""
    fd = os.open(sink, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 20)
        os.ftruncate(fd, total)  # sized up front, like a commitlog segment
        got = allocated = 0
        while got < total:
            if got + (1 << 20) > allocated:
                os.posix_fallocate(fd, allocated, 64 << 20)
                allocated += 64 << 20
            n = os.splice(conn.fileno(), w, min(1 << 20, total - got))
            if n == 0:
                break
            moved = 0
            while moved < n:
                moved += os.splice(r, fd, n - moved, offset_dst=got + moved)
            got += n
        return got
    finally:
        for x in (r, w, fd):
            os.close(x)
        os.unlink(sink)


def _raw_receiver(port_q: Any, total: int, result_q: Any, sink: str | None = None) -> None:
    """Receive ``total`` bytes into one reused buffer, or with ``sink`` through :func:`_splice_into`."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port_q.put(srv.getsockname()[1])
        conn, _ = srv.accept()
        with conn:
            start = time.perf_counter()
            if sink:
                got = _splice_into(conn, sink, total)
            else:
                view = memoryview(bytearray(4 * 1024 * 1024))
                got = 0
                while got < total:
                    n = conn.recv_into(view)
                    if n == 0:
                        break
                    got += n
            result_q.put((got, time.perf_counter() - start))


def raw_loopback(files: list[Path], total: int, sink: Path | None = None) -> float:
    """Bytes/s of sendfile(segment files) -> recv_into on loopback, in two processes (with
    ``sink``: into that file the way the slave lands a catch-up, as a ceiling for it)."""
    ctx = mp.get_context("spawn")
    port_q: Any = ctx.Queue()
    result_q: Any = ctx.Queue()
    p = ctx.Process(target=_raw_receiver, args=(port_q, total, result_q, str(sink) if sink else None))
    p.start()
    port = port_q.get(timeout=30)
    with socket.create_connection(("127.0.0.1", port)) as s:
        sent = 0
        for f in files:
            with open(f, "rb") as fh:
                remaining = min(f.stat().st_size, total - sent)
                while remaining > 0:
                    n = s.sendfile(fh, count=remaining)
                    if not n:
                        break
                    remaining -= n
                    sent += n
    got, secs = result_q.get(timeout=120)
    p.join(30)
    return float(got / secs)


def pagecache_write(work: Path, total: int) -> float:
    """Bytes/s of pwrite into a fresh file: what any slave pays to land bytes in the page cache."""
    path = work / "pwrite.probe"
    buf = os.urandom(1 << 20)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, total)
        start = time.perf_counter()
        for pos in range(0, total - len(buf) + 1, len(buf)):
            os.pwrite(fd, buf, pos)
        return float((total - total % len(buf)) / (time.perf_counter() - start))
    finally:
        os.close(fd)
        path.unlink()


def _catch_up_once(work: Path, master: BrokerProc, end: int) -> tuple[int, float, float]:
    """Start an empty slave against ``master`` and time its catch-up to ``end``.

    Measured from the master's side: each /status sample pairs a slave's acked offset with the
    master's wall-clock time of that very ack, so the rate between the first sample with bytes
    acked and the one that covers the whole log is exact to the millisecond however coarsely we
    poll (process start-up is not replication). Polling the master, not the slave, keeps the
    benchmark's HTTP requests off the process being measured. Returns (bytes measured, seconds,
    ms until the slave's own maxPhyOffset showed the end after its last ack).
    """
    work.mkdir(parents=True)
    slave = BrokerProc(work, None, name="bench-ha", broker_id=1, role="SLAVE", mappedFileSizeCommitLog=SEG,
                       mappedFileSizeConsumeQueue=6000000,
                       haMasterAddress=f"127.0.0.1:{master.port + 1}")
    try:
        slave.start(wait_ready=False)
        first: tuple[int, int] | None = None
        last: tuple[int, int] | None = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            acks = [(s["ackedOffset"], s["lastAckMillis"]) for s in status(master)["ha"]["slaves"]]
            if acks:
                if first is None and acks[0][0] > 0:
                    first = acks[0]
                if acks[0][0] >= end:
                    last = acks[0]
                    break
            time.sleep(ACK_POLL)
        assert first is not None and last is not None, "the slave did not catch up within 10 minutes"
        if last[0] - first[0] < end // 2:
            raise SystemExit(f"catch-up: only {last[0] - first[0]} of {end} bytes fell between two samples; "
                             "lower ACK_POLL or raise --gib")
        # The slave's own view: its consume-queue-facing maxPhyOffset follows its acks.
        t_acked = time.perf_counter()
        while status(slave)["maxPhyOffset"] < end:
            time.sleep(0.005)
        visible_ms = (time.perf_counter() - t_acked) * 1000
    finally:
        slave.stop()
        shutil.rmtree(work, ignore_errors=True)
    # A master restarted between acks would make these meaningless; it is not restarted here.
    return last[0] - first[0], max(last[1] - first[1], 1) / 1000, visible_ms


def bench_catchup(work: Path, gib: float, body_size: int, reps: int = 3) -> dict[str, Any]:
    """``reps`` pairs of (raw loopback, catch-up of a new empty slave), interleaved, each from a
    clean page cache; per-pair ratios and their median. A single loopback figure on this shared
    VM swings 2.5-8.6 GB/s from one minute to the next, so one pair is not a measurement."""
    master_store = work / "master"
    master_store.mkdir(parents=True)
    print(f"[catchup] writing {gib:.2f} GiB of {body_size}-byte messages through the store API ...", flush=True)
    t0 = time.perf_counter()
    end = fill_store(master_store / "store", int(gib * (1 << 30)), body_size)
    print(f"[catchup] wrote {end / 1e6:.0f} MB in {time.perf_counter() - t0:.1f}s", flush=True)
    # Ceilings, once: the slave's kernel path without a broker, and plain page-cache writes.
    files = sorted((master_store / "store" / "commitlog").iterdir())
    os.sync()
    kernel_path = raw_loopback(files, end, sink=work / "splice.probe")
    os.sync()
    pwrite = pagecache_write(work, end)
    master = BrokerProc(work, None, name="bench-ha", mappedFileSizeCommitLog=SEG, mappedFileSizeConsumeQueue=6000000,
                        storePathRootDir=str(master_store / "store"))
    master.start()
    pairs: list[dict[str, float]] = []
    try:
        for i in range(reps):
            os.sync()
            raw = raw_loopback(files, end)
            os.sync()
            measured, secs, visible_ms = _catch_up_once(work / f"slave-{i}", master, end)
            rate = measured / secs
            pairs.append({"raw_loopback_MBps": raw / 1e6, "catchup_MBps": rate / 1e6, "ratio": rate / raw,
                          "seconds": secs, "slave_visible_after_ack_ms": visible_ms})
            print(f"[catchup] pair {i}: raw {raw / 1e6:.0f} MB/s, catch-up {rate / 1e6:.0f} MB/s "
                  f"({measured / 1e6:.0f} MB in {secs:.2f} s), ratio {rate / raw:.2f}", flush=True)
    finally:
        master.stop()
    shutil.rmtree(master_store, ignore_errors=True)
    catchup = statistics.median(p["catchup_MBps"] for p in pairs)
    raw_median = statistics.median(p["raw_loopback_MBps"] for p in pairs)
    return {"bytes": end, "body_size": body_size, "pairs": pairs,
            "ratio_median": statistics.median(p["ratio"] for p in pairs),
            "catchup_MBps_median": catchup, "raw_loopback_MBps_median": raw_median,
            "splice_to_file_MBps": kernel_path / 1e6, "ratio_to_splice": catchup * 1e6 / kernel_path,
            "pagecache_pwrite_MBps": pwrite / 1e6, "ratio_to_pwrite": catchup * 1e6 / pwrite}


async def _sender(addr: str, topic: str, body: bytes, rate: float, seconds: float,
                  acks: list[tuple[int, float]]) -> None:
    client = RemotingClient()
    interval = 1.0 / rate
    next_at = time.perf_counter()
    stop_at = next_at + seconds
    sem = asyncio.Semaphore(256)

    async def one(i: int) -> None:
        async with sem:
            ext = {"a": "PG_BENCH", "b": topic, "c": "TBW102", "d": "4", "e": str(i % 4), "f": "0",
                   "g": str(int(time.time() * 1000)), "h": "0", "i": "WAIT\x01true\x02"}
            resp = await client.invoke(addr, RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=ext,
                                                             body=body), 10)
            if resp.code == 0:
                offset = int(resp.ext_fields["msgId"][16:], 16)
                acks.append((offset + 1, time.perf_counter()))

    tasks = []
    i = 0
    while time.perf_counter() < stop_at:
        tasks.append(asyncio.create_task(one(i)))
        i += 1
        next_at += interval
        delay = next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    await asyncio.gather(*tasks)
    await client.close()


def bench_lag(work: Path, seconds: float, rate: float, test_segments: bool = False) -> dict[str, Any]:
    """Steady ``rate`` sends; the master measures append -> first slave ack per append.

    Brokers use the default segment sizes (1 GiB commitlog, 6,000,000-byte consume queues), like
    ``catchup``; ``test_segments`` keeps the test helper's 16 MiB / 60,000-byte segments (a new
    commitlog segment every ~3 s at this rate, each created on the event loop with a directory
    fsync), as the runs before 2026-11-22 05:45 did.
    """
    sizes: dict[str, Any] = {} if test_segments else {"mappedFileSizeCommitLog": SEG,
                                                      "mappedFileSizeConsumeQueue": 6000000}
    master = BrokerProc(work, None, name="bench-lag", **sizes)
    master.start()
    slave = BrokerProc(work, None, name="bench-lag", broker_id=1, role="SLAVE",
                       haMasterAddress=f"127.0.0.1:{master.port + 1}", **sizes)
    slave.start()
    acks: list[tuple[int, float]] = []
    try:
        time.sleep(1)
        t0 = time.perf_counter()
        asyncio.run(_sender(master.addr, "LagTopic", os.urandom(1024), rate, seconds, acks))
        achieved = len(acks) / (time.perf_counter() - t0)
        time.sleep(0.5)
        lag = status(master)["ha"]["replicationLagMs"]
    finally:
        slave.stop()
        master.stop()
    return {"target_rate": rate, "achieved_rate": achieved, "sent": len(acks),
            "segments": "test (16 MiB / 60,000 B)" if test_segments else "default (1 GiB / 6,000,000 B)",
            **{f"lag_{k}": v for k, v in lag.items()},
            "note": "lag = time from the master's append to the first slave ack covering it (master-side)"}


def _pin(pid: int, cpu: int) -> None:
    """Every thread of ``pid`` (and so the ones it starts later) onto ``cpu``."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), {cpu})


Variant = tuple[str, str, dict[str, str]]  # label, brokerRole, broker.conf keys of master and slave
DEFAULT_VARIANTS: list[Variant] = [("ASYNC_MASTER", "ASYNC_MASTER", {}), ("SYNC_MASTER", "SYNC_MASTER", {})]


def parse_variant(text: str) -> Variant:
    """``LABEL:ROLE[:key=value,...]``, e.g. ``paced-off:ASYNC_MASTER:haPushAfterAck=false``."""
    label, role, *rest = text.split(":", 2)
    if role not in ("ASYNC_MASTER", "SYNC_MASTER"):
        raise argparse.ArgumentTypeError(f"{text}: the role is ASYNC_MASTER or SYNC_MASTER")
    conf = dict(kv.split("=", 1) for kv in rest[0].split(",")) if rest and rest[0] else {}
    return label, role, conf


class IdealSlave:
    """``ideal_slave.c`` following a master's HA port (process-compatible with BrokerProc here)."""

    def __init__(self, binary: Path, ha_port: int) -> None:
        self.popen: subprocess.Popen[bytes] | None = subprocess.Popen([str(binary), str(ha_port)])

    def stop(self) -> None:
        if self.popen is not None:
            self.popen.terminate()
            self.popen.wait(10)
            self.popen = None


def build_ideal_slave(work: Path) -> Path:
    binary = work / "ideal_slave"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(ROOT / "bench" / "ideal_slave.c")], check=True)
    return binary


def bench_syncasync(work: Path, seconds: float, producers: int, rounds: int = 3,
                    client: str = "lean", test_segments: bool = False, pin: bool = False,
                    variants: list[Variant] | None = None, slave_kind: str = "broker") -> dict[str, Any]:
    """Closed-loop producers against an ASYNC_MASTER and a SYNC_MASTER (one slave each), in
    interleaved rounds on fresh groups so that machine noise hits both alike; medians reported.

    ``client="lean"`` (default): send_bench's callback-only generator in its own process, one
    connection per producer with one request in flight (= ``producers`` closed-loop producers),
    1 s warm-up excluded. ``client="remoting"``: the earlier in-process generator (the project's
    RemotingClient, a coroutine per request), which on two cores competes with the brokers for CPU.
    ``variants`` (default: ASYNC_MASTER and SYNC_MASTER) are run in that order in even rounds and
    in reverse in odd ones; each one's median is also given as a ratio to the first's.
    ``slave_kind="ideal"`` replaces the slave broker by ``ideal_slave.c`` (acks every frame at once,
    stores nothing): a bound on what any slave could do for the SYNC/ASYNC ratio on this host.
    ``client="cpp"``: ``producers`` stock C++ clients (rocketmq==0.4.4, each its own instance and
    connection, a thread calling ``send_sync`` in a loop) in one process, routed by a nameserver:
    what an application sees; the client's CPU shares the host's two vCPUs with the brokers.
    """
    variants = variants or DEFAULT_VARIANTS
    namesrv = Namesrv(work).start() if client == "cpp" else None
    try:
        return _syncasync_rounds(work, seconds, producers, rounds, client, test_segments, pin, variants,
                                 slave_kind, namesrv)
    finally:
        if namesrv is not None:
            namesrv.stop()


def _syncasync_rounds(work: Path, seconds: float, producers: int, rounds: int, client: str, test_segments: bool,
                      pin: bool, variants: list[Variant], slave_kind: str, namesrv: Namesrv | None) -> dict[str, Any]:
    ns_addr = namesrv.addr if namesrv is not None else None
    ideal = build_ideal_slave(work) if slave_kind == "ideal" else None
    sizes: dict[str, Any] = {} if test_segments else {"mappedFileSizeCommitLog": SEG,
                                                      "mappedFileSizeConsumeQueue": 6000000}
    rates: dict[str, list[float]] = {v[0]: [] for v in variants}
    latency_ms: dict[str, list[float]] = {v[0]: [] for v in variants}
    cpu_us: dict[str, list[float]] = {v[0]: [] for v in variants}
    order = list(enumerate(variants))
    for r in range(rounds):
        # Alternate which mode goes first, and start each run with no dirty pages left by the
        # one before (its stores deleted, then sync): writeback of an earlier run's bytes would
        # otherwise land on whichever mode runs next.
        for k, (label, role, conf) in order if r % 2 == 0 else order[::-1]:
            os.sync()
            name = f"bench-{role.lower().replace('_', '-')}-{r}-{k}"
            master = BrokerProc(work, ns_addr, name=name, role=role, **{**sizes, **conf})
            master.start()
            slave: BrokerProc | IdealSlave
            if ideal is not None:
                slave = IdealSlave(ideal, master.port + 1)
            else:
                slave = BrokerProc(work, ns_addr, name=name, broker_id=1, role="SLAVE",
                                   haMasterAddress=f"127.0.0.1:{master.port + 1}", **{**sizes, **conf})
                slave.start()
            try:
                time.sleep(1)
                assert master.popen is not None and slave.popen is not None
                pids = (master.popen.pid, slave.popen.pid)
                if pin:
                    _pin(master.popen.pid, 0)
                    _pin(slave.popen.pid, 1)
                if client == "lean":
                    count, p50, cpu = _closed_loop_lean(master.addr, producers, seconds, pids=pids,
                                                        gen_cpu=1 if pin else None)
                elif client == "cpp":
                    assert ns_addr is not None
                    from send_bench import create_topic

                    topic = f"SyncAsync{r}x{k}"
                    create_topic(master.addr, ns_addr, topic, 4)
                    count, p50, cpu = _closed_loop_lean(master.addr, producers, seconds, pids=pids,
                                                        gen_cpu=1 if pin else None, cpp=(ns_addr, topic, work))
                else:
                    cpu = (float("nan"), float("nan"))
                    count, p50 = asyncio.run(_closed_loop(master.addr, producers, seconds)), float("nan")
                lag = master.status()["ha"].get("replicationLagMs")
                print(f"[syncasync]   append->first slave ack (master, recent window): {lag}", flush=True)
            finally:
                slave.stop()
                master.stop()
                shutil.rmtree(master.store_dir, ignore_errors=True)
                if isinstance(slave, BrokerProc):
                    shutil.rmtree(slave.store_dir, ignore_errors=True)
            rates[label].append(count / seconds)
            latency_ms[label].append(p50)
            per_msg = tuple(c / count * 1e6 if count else float("nan") for c in cpu)
            cpu_us[label].append(per_msg[0])
            print(f"[syncasync] round {r} {label}: {count / seconds:.0f} msg/s, p50 {p50:.3f} ms, CPU/msg "
                  f"master {per_msg[0]:.1f} us, slave {per_msg[1]:.1f} us", flush=True)
    out: dict[str, Any] = {label: {"msgs_per_s_median": statistics.median(v), "rounds": v,
                                   "p50_latency_ms": latency_ms[label],
                                   "master_cpu_us_per_msg": cpu_us[label]} for label, v in rates.items()}
    first = variants[0][0]
    for label in rates:
        out[label]["ratio_to_" + first] = out[label]["msgs_per_s_median"] / out[first]["msgs_per_s_median"]
        print(f"[syncasync] {label}: median {out[label]['msgs_per_s_median']:.0f} msg/s, "
              f"{out[label]['ratio_to_' + first]:.3f} of {first}", flush=True)
    if "SYNC_MASTER" in out and "ASYNC_MASTER" in out:
        out["ratio_sync_async"] = out["SYNC_MASTER"]["msgs_per_s_median"] / out["ASYNC_MASTER"]["msgs_per_s_median"]
    out["client"] = client
    return out


def _closed_loop_lean(addr: str, producers: int, seconds: float, warmup: float = 1.0,
                      pids: tuple[int, ...] = (), gen_cpu: int | None = None,
                      cpp: tuple[str, str, Path] | None = None) -> tuple[int, float, tuple[float, ...]]:
    """Acks inside the window, their median latency (ms) and the CPU seconds each of ``pids``
    used in the window, from send_bench's lean generator in a separate process: ``producers``
    connections with one request in flight each. With ``cpp`` (nameserver, topic, work dir):
    send_bench's stock C++ client worker instead, ``producers`` producers each sending in a loop."""
    from send_bench import WorkerConfig, cpp_worker, lean_worker, make_body, proc_cpu_seconds

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    namesrv, topic, home = "", "SyncAsync", ""
    if cpp:
        namesrv, topic, work = cpp
        (work / "cpp-home").mkdir(exist_ok=True)  # librocketmq logs under $HOME
        home = str(work / "cpp-home")
    cfg = WorkerConfig(index=0, client="cpp" if cpp else "lean", broker_addr=addr, namesrv_addr=namesrv, topic=topic,
                       queues=4, producers=producers, window=1, burst=1, body=make_body(1024), home=home, cpu=gen_cpu)
    proc = ctx.Process(target=cpp_worker if cpp else lean_worker, args=(child, cfg))
    proc.start()
    try:
        kind, _pid = parent.recv()
        assert kind == "ready", kind
        t0 = time.time() + warmup
        parent.send(("go", t0, t0 + seconds))
        time.sleep(max(0.0, t0 - time.time()))
        cpu0 = [proc_cpu_seconds(p) for p in pids]
        time.sleep(max(0.0, t0 + seconds - time.time()))
        cpu = tuple(proc_cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True))
        kind, result = parent.recv()
        assert kind == "result", kind
    finally:
        proc.join(30)
    if result.errors_window:
        print(f"[syncasync] errors in window: {result.error_kinds}", flush=True)
    lat = sorted(array("q", result.latencies_ns))
    if lat:
        print(f"[syncasync]   latency ms p50 {lat[len(lat) // 2] / 1e6:.3f} p90 {lat[len(lat) * 9 // 10] / 1e6:.3f} "
              f"p99 {lat[len(lat) * 99 // 100] / 1e6:.3f} mean {sum(lat) / len(lat) / 1e6:.3f}", flush=True)
    return int(result.acked_window), (lat[len(lat) // 2] / 1e6 if lat else float("nan")), cpu


async def _closed_loop(addr: str, producers: int, seconds: float) -> int:
    body = os.urandom(1024)
    stop_at = time.perf_counter() + seconds
    counts = [0] * producers

    async def producer(k: int) -> None:
        client = RemotingClient()
        i = 0
        while time.perf_counter() < stop_at:
            ext = {"a": "PG_BENCH", "b": "SyncAsync", "c": "TBW102", "d": "4", "e": str(i % 4), "f": "0",
                   "g": str(int(time.time() * 1000)), "h": "0", "i": "WAIT\x01true\x02"}
            resp = await client.invoke(addr, RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=ext,
                                                             body=body), 10)
            if resp.code == 0:
                counts[k] += 1
            i += 1
        await client.close()

    await asyncio.gather(*(producer(k) for k in range(producers)))
    return sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("which", nargs="?", default="all", choices=("catchup", "lag", "syncasync", "all"))
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--body", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=3, help="catchup: interleaved (raw, catch-up) pairs")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=5000.0)
    parser.add_argument("--producers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="syncasync: rounds of (ASYNC, SYNC) runs")
    parser.add_argument("--pin", action="store_true",
                        help="syncasync: the master alone on CPU 0, the slave and the generator on CPU 1")
    parser.add_argument("--test-segments", action="store_true",
                        help="lag, syncasync: the test helper's small segments instead of the broker defaults")
    parser.add_argument("--variant", action="append", type=parse_variant, dest="variants",
                        help="syncasync: LABEL:ROLE[:key=value,...] (repeatable) instead of ASYNC_MASTER and "
                             "SYNC_MASTER, e.g. off:ASYNC_MASTER:haPushAfterAck=false")
    parser.add_argument("--slave", default="broker", choices=("broker", "ideal"),
                        help="syncasync: a slave broker, or ideal_slave.c (acks at once, stores nothing)")
    parser.add_argument("--client", default="lean", choices=("lean", "remoting", "cpp"),
                        help="syncasync load generator (see bench_syncasync)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ha-bench-"))
    results: dict[str, Any] = {}
    try:
        if args.which in ("catchup", "all"):
            results["catchup"] = bench_catchup(work / "c", args.gib, args.body, args.reps)
            print(json.dumps(results["catchup"]), flush=True)
        if args.which in ("lag", "all"):
            (work / "l").mkdir()
            results["lag"] = bench_lag(work / "l", args.seconds, args.rate, test_segments=args.test_segments)
            print(json.dumps(results["lag"]), flush=True)
        if args.which in ("syncasync", "all"):
            (work / "s").mkdir()
            results["syncasync"] = bench_syncasync(work / "s", args.seconds, args.producers, args.rounds,
                                                   client=args.client, test_segments=args.test_segments, pin=args.pin,
                                                   variants=args.variants, slave_kind=args.slave)
            print(json.dumps(results["syncasync"]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
