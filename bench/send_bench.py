#!/usr/bin/env python
"""Send-path benchmark: broker CPU per message, throughput and latency of SEND_MESSAGE(_V2).

Usage::

    .venv/bin/python bench/send_bench.py [--producers N] [--seconds S] [--size 1024]
                                         [--flush ASYNC_FLUSH|SYNC_FLUSH] [--client lean|cpp] ...

What it does
------------
1. Creates a temp dir, starts ``python -m rmqbroker.namesrv.main`` and ``python -m rmqbroker.main -c
   broker.conf`` (ASYNC_MASTER, ``--flush`` disk type, store in the temp dir, commitlog segment
   ``--segment-mb`` MiB, 1 GiB by default), waits for ``/readyz``, creates the topic with
   UPDATE_AND_CREATE_TOPIC (``--queues`` queues) and waits until the nameserver routes it.
2. Starts the load generator in ``--gen-procs`` (1-2) separate OS processes holding ``--producers``
   producer connections between them, then runs ``--warmup`` seconds of load followed by a measured
   window of exactly ``--seconds`` seconds, then drains the requests still in flight.
3. Prints messages/s, MB/s (message body bytes, 1 MB = 10^6 B), p50/p99/p999 send latency (request
   written -> SUCCESS response read, in the generator), broker CPU microseconds per message, the
   broker's CPU utilisation (whole process and its event-loop thread, % of one core), the load
   generator's own CPU, and how busy the whole machine was.
4. Stops everything (SIGTERM, then SIGKILL) and deletes the temp dir, also on Ctrl-C / SIGTERM and on
   errors (try/finally; the broker and nameserver also get PR_SET_PDEATHSIG so that they die with
   the benchmark even if it is SIGKILLed).

How the broker is isolated as the measured thing
------------------------------------------------
* **The figure is the broker process's own CPU time.** ``utime + stime`` of the broker PID (all its
  threads: event loop, flush threads from ``asyncio.to_thread``) is read from ``/proc/<pid>/stat``
  at the planned start and end of the window, and divided by the number of SUCCESS responses the
  generator read inside that same window (wall-clock ``[T0, T1)``, shared by all processes).  The
  event-loop thread's share (``/proc/<pid>/task/<pid>/stat``) is printed separately: the broker is
  single-threaded Python, so *that* thread reaching ~100 % of a core means the broker is the
  bottleneck.  Kernel work done outside the broker's context (page-cache writeback by kernel
  flusher threads, loopback softirqs charged to the sender) is not in the figure.
* **The generator is cheap per message and runs elsewhere.** The default ``lean`` client is a
  callback-only asyncio/uvloop protocol (no task or coroutine per message) that speaks the wire
  protocol directly: SEND_MESSAGE_V2 frames are cut from a pre-encoded JSON header template in
  which only ``opaque``, ``queueId`` (``e``) and ``bornTimestamp`` (``g``) vary; each connection
  keeps up to ``--window`` requests in flight and refills once ``--burst`` (default window/2) have
  completed, with one ``write`` per burst (``--burst 1`` = one write per message), and validates
  responses with a byte scan (code 0, opaque outstanding, 32-hex ``msgId`` present),
  falling back to ``json.loads`` for anything unexpected.  It runs in 1-2 separate processes whose
  CPU is measured the same way and printed (``generator CPU``), so a reader can check that the
  generator had headroom (it should use far less CPU per message than the broker and less than
  one core in total).  ``--pin`` additionally pins the broker to CPU 0 and the generator to the
  other CPU(s).
* **Warm-up is excluded.** Topic creation, first connections, consume-queue file creation and
  interpreter warm-up happen in the ``--warmup`` phase before T0; the drain after T1 is excluded too.
* ``--client cpp`` replaces the generator with the stock C++ client (PyPI ``rocketmq==0.4.4``,
  SEND_MESSAGE code 10; ``--producers`` producers, each its own client instance and connection,
  each a thread doing ``send_sync`` in a loop, spread over the generator processes) as a realism
  check.  Its per-message client cost is much higher (ctypes + HMAC
  signature + GIL), so check the generator line before reading the broker figures.
* ``--profile FILE`` runs ``py-spy record --format raw`` (non-blocking sampling) against the broker
  for the window and prints a per-category breakdown (see ``bench/profile_summary.py``); the
  sampler costs some broker CPU, so use separate runs for the headline CPU/msg figure.

Everything here only reads the broker's outputs; no broker code is imported or changed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import string
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from array import array
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.procs import free_port, free_port_block, wait_port  # noqa: E402

from rmqbroker.remoting.frame import RemotingCommand, decode_frame_payload, encode_frame  # noqa: E402

PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Frame prefix: int length (bytes after this field), int serializeType<<24 | headerLen.
FRAME_PREFIX = struct.Struct(">ii")
SEND_MESSAGE = 10
UPDATE_AND_CREATE_TOPIC = 17
GET_ROUTEINFO_BY_TOPIC = 105
SEND_MESSAGE_V2 = 310
JAVA_VERSION = 409  # V4_9_8 ordinal, what a 4.9.x Java client sends


# =========================================================================== small helpers ===
def proc_cpu_seconds(pid: int, tid: int | None = None) -> float:
    """utime + stime of a process (all threads) or of one of its threads, in seconds."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path, "rb") as f:
        raw = f.read()
    fields = raw[raw.rindex(b")") + 2:].split()
    # After "pid (comm) ": state=0 ... utime=11 stime=12 (fields 14 and 15 of proc(5)).
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_cpu_split(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read()
    fields = raw[raw.rindex(b")") + 2:].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def machine_busy_seconds() -> tuple[float, float, float]:
    """(busy, total, steal) CPU seconds over all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    vals = [int(v) for v in parts[:8]]  # user nice system idle iowait irq softirq steal
    idle = vals[3] + vals[4]  # idle + iowait
    total = sum(vals)
    return (total - idle - vals[7]) / CLK_TCK, total / CLK_TCK, vals[7] / CLK_TCK


def _pdeathsig() -> None:
    # Runs in the child between fork and exec: die with the benchmark even if it is SIGKILLed.
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def percentile(sorted_vals: array[int] | list[int], p: float) -> float:
    if not sorted_vals:
        return math.nan
    idx = max(0, min(len(sorted_vals) - 1, math.ceil(p * len(sorted_vals)) - 1))
    return float(sorted_vals[idx])


def rpc(addr: str, code: int, ext: dict[str, str], body: bytes = b"", timeout: float = 5.0,
        ) -> tuple[dict[str, Any], bytes]:
    """One blocking request/response on a fresh connection (setup only, never on the hot path),
    using the broker's own frame codec; returns ``({"code": …, "remark": …}, body)``."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(encode_frame(RemotingCommand(code, ext_fields=dict(ext), body=body)))

        def read(n: int) -> bytes:
            out = bytearray()
            while len(out) < n:
                chunk = s.recv(n - len(out))
                if not chunk:
                    raise ConnectionError("connection closed mid-frame")
                out += chunk
            return bytes(out)

        (length,) = struct.unpack(">i", read(4))
        resp = decode_frame_payload(read(length))
    return {"code": resp.code, "remark": resp.remark, "extFields": resp.ext_fields}, bytes(resp.body)


# ========================================================================= child processes ===
class Child:
    """A nameserver or broker subprocess with its output in a log file."""

    def __init__(self, name: str, args: list[str], log_path: Path, pythonpath: str | None = None) -> None:
        self.name = name
        self.args = args
        self.log_path = log_path
        self.pythonpath = pythonpath
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Child:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (self.pythonpath, env.get("PYTHONPATH"))))
        with open(self.log_path, "ab") as log:
            # preexec_fn is safe here: children are started before this process runs any thread.
            self.popen = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                          start_new_session=True, preexec_fn=_pdeathsig)  # noqa: PLW1509
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        p = self.popen
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def broker_conf(workdir: Path, namesrv: str, port: int, admin_port: int, flush: str, segment: int) -> Path:
    conf = {
        "brokerClusterName": "DefaultCluster",
        "brokerName": "bench-broker",
        "brokerId": 0,
        "brokerRole": "ASYNC_MASTER",
        "flushDiskType": flush,
        "brokerIP1": "127.0.0.1",
        "listenHost": "127.0.0.1",
        "listenPort": port,
        "haListenPort": port + 1,
        "adminListenPort": admin_port,
        "adminToken": "bench-token",
        "storePathRootDir": str(workdir / "store"),
        "mappedFileSizeCommitLog": segment,
        "namesrvAddr": namesrv,
    }
    path = workdir / "broker.conf"
    path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
    return path


def wait_ready(broker: Child, admin_port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not broker.alive:
            raise RuntimeError(f"broker exited during start-up:\n{broker.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"broker not ready within {timeout}s:\n{broker.log_tail()}")


def broker_messages_in(admin_port: int) -> float | None:
    """rmq_messages_in from /metrics (a cross-check of the acked count; read outside the window)."""
    req = urllib.request.Request(f"http://127.0.0.1:{admin_port}/metrics",
                                 headers={"Authorization": "Bearer bench-token"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    total = None
    for line in text.splitlines():
        if line.startswith("rmq_messages_in") and not line.startswith("rmq_messages_in_created"):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


def create_topic(broker_addr: str, namesrv_addr: str, topic: str, queues: int, timeout: float = 30.0) -> None:
    head, _ = rpc(broker_addr, UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(queues), "writeQueueNums": str(queues),
        "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"})
    if head.get("code") != 0:
        raise RuntimeError(f"UPDATE_AND_CREATE_TOPIC failed: {head}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        head, body = rpc(namesrv_addr, GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if head.get("code") == 0 and body:
            with contextlib.suppress(ValueError):
                route = json.loads(body)
                if any(q.get("writeQueueNums") == queues for q in route.get("queueDatas", [])):
                    return
        time.sleep(0.2)
    raise TimeoutError(f"nameserver did not route {topic} within {timeout}s")


def make_body(size: int) -> bytes:
    # Printable ASCII: the C++ wrapper passes bodies as NUL-terminated strings.
    rnd = random.Random(42)
    return "".join(rnd.choice(string.ascii_letters + string.digits) for _ in range(size)).encode()


# ============================================================================ lean generator ===
@dataclass
class FrameTemplate:
    """A pre-encoded SEND_MESSAGE_V2 JSON header split around the three fields that vary."""

    parts: tuple[bytes, bytes, bytes, bytes]  # before queueId | before bornTimestamp | before opaque | rest
    qids: list[bytes]

    @classmethod
    def build(cls, group: str, topic: str, queues: int, sys_flag: int = 0) -> FrameTemplate:
        # Java 4.9.x SendMessageRequestHeaderV2 as fastjson writes it (all values strings, keys sorted).
        props = "UNIQ_KEY\x017F000001A1B2C3D4E5F60000000000000000\x02WAIT\x01true\x02TAGS\x01TagA"
        ext = {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": "@QID@", "f": str(sys_flag), "g": "@BORN@",
               "h": "0", "i": props, "j": "0", "k": "false", "m": "false"}
        obj = {"code": SEND_MESSAGE_V2, "extFields": ext, "flag": 0, "language": "JAVA", "opaque": "@OPQ@",
               "serializeTypeCurrentRPC": "JSON", "version": JAVA_VERSION}
        text = json.dumps(obj, separators=(",", ":")).encode()
        a, rest = text.split(b"@QID@")
        b, rest = rest.split(b"@BORN@")
        c, d = rest.split(b'"@OPQ@"')
        return cls((a, b, c, d), [str(q).encode() for q in range(queues)])


@dataclass
class WorkerConfig:
    index: int
    client: str
    broker_addr: str
    namesrv_addr: str
    topic: str
    queues: int
    producers: int  # producers handled by this worker process
    window: int
    burst: int
    body: bytes
    home: str
    cpu: int | None
    tls: bool = False
    sys_flag: int = 0


@dataclass
class WorkerResult:
    pid: int
    acked_window: int = 0
    acked_total: int = 0
    errors_window: int = 0
    errors_total: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    unexpected: int = 0
    lost_connections: int = 0
    undrained: int = 0
    reads: int = 0  # data_received calls (lean) in the window
    writes: int = 0  # write() calls (lean) in the window
    latencies_ns: bytes = b""  # array('q') of in-window latencies

    def error(self, kind: str, in_window: bool) -> None:
        self.errors_total += 1
        if in_window:
            self.errors_window += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


class LeanState:
    """Per-process counters shared by the connections of one lean worker."""

    def __init__(self, result: WorkerResult, t0_ns: int, t1_ns: int) -> None:
        self.result = result
        self.t0 = t0_ns
        self.t1 = t1_ns
        self.sending = False
        self.lat = array("q")
        self.conns: list[LeanProducer] = []
        self.drained: asyncio.Future[None] | None = None


def _parse_response(header: bytes) -> tuple[int, int, bool]:
    """(code, opaque, has msgId) of a send response header; cheap byte scan with a JSON fallback."""
    i = header.find(b'"code":')
    j = header.find(b'"opaque":')
    if i >= 0 and j >= 0:
        try:
            ce = header.find(b",", i)
            code = int(header[i + 7:ce])
            oe = header.find(b",", j)
            if oe < 0:
                oe = header.find(b"}", j)
            opaque = int(header[j + 9:oe])
            m = header.find(b'"msgId":"')
            has_id = m >= 0 and header[m + 9 + 32:m + 10 + 32] in (b'"', b",")
            return code, opaque, has_id
        except ValueError:
            pass
    obj = json.loads(header)
    ext = obj.get("extFields") or {}
    return int(obj.get("code", -1)), int(obj.get("opaque", -1)), bool(ext.get("msgId"))


class LeanProducer(asyncio.Protocol):
    """One producer connection: keeps ``window`` SEND_MESSAGE_V2 requests in flight, callbacks only."""

    def __init__(self, st: LeanState, tmpl: FrameTemplate, body: bytes, window: int, burst: int,
                 first_queue: int) -> None:
        self.st = st
        self.tmpl = tmpl
        self.body = body
        self.window = window
        # Refill only once ``burst`` slots are free: one write() carries >= burst frames.
        self.refill_at = window - max(1, min(burst, window))
        ring = 1 << max(4, (2 * window - 1).bit_length())
        self.ring = [0] * ring
        self.mask = ring - 1
        self.opaque = 0
        self.inflight = 0
        self.qnext = first_queue % len(tmpl.qids)
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.st.sending or self.inflight:
            self.st.result.lost_connections += 1
        self.inflight = 0
        self._check_drained()

    def pump(self) -> None:
        n = self.window - self.inflight
        if n <= 0 or not self.st.sending or self.closed or self.transport is None:
            return
        p0, p1, p2, p3 = self.tmpl.parts
        qids = self.tmpl.qids
        nq = len(qids)
        body = self.body
        blen = len(body)
        ring = self.ring
        mask = self.mask
        pack = FRAME_PREFIX.pack
        now = time.perf_counter_ns()
        born = b"%d" % (time.time_ns() // 1_000_000)
        opq = self.opaque
        q = self.qnext
        out: list[bytes] = []
        for _ in range(n):
            opq = (opq + 1) & 0x7FFFFFFF
            header = b"".join((p0, qids[q], p1, born, p2, b"%d" % opq, p3))
            q = q + 1 if q + 1 < nq else 0
            hlen = len(header)
            out.append(pack(4 + hlen + blen, hlen))
            out.append(header)
            out.append(body)
            ring[opq & mask] = now
        self.opaque = opq
        self.qnext = q
        self.inflight += n
        if self.st.t0 <= now < self.st.t1:
            self.st.result.writes += 1
        self.transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        st = self.st
        res = st.result
        in_window = st.t0 <= now < st.t1
        if in_window:
            res.reads += 1
        buf = self.buf
        buf += data
        end = len(buf)
        pos = 0
        ring = self.ring
        mask = self.mask
        while end - pos >= 8:
            length, word = FRAME_PREFIX.unpack_from(buf, pos)
            if end - pos - 4 < length:
                break
            hlen = word & 0xFFFFFF
            header = bytes(buf[pos + 8:pos + 8 + hlen])
            pos += 4 + length
            code, opaque, has_id = _parse_response(header)
            sent = ring[opaque & mask]
            if sent == 0:
                res.unexpected += 1
                continue
            ring[opaque & mask] = 0
            self.inflight -= 1
            if code == 0 and has_id:
                res.acked_total += 1
                if in_window:
                    res.acked_window += 1
                    st.lat.append(now - sent)
            else:
                res.error(f"code {code}" if code != 0 else "no msgId", in_window)
        if pos:
            del buf[:pos]
        if st.sending:
            if self.inflight <= self.refill_at:
                self.pump()
        elif not self.inflight:
            self._check_drained()

    def _check_drained(self) -> None:
        st = self.st
        if st.drained is not None and not st.drained.done() and \
                all(c.inflight == 0 or c.closed for c in st.conns):
            st.drained.set_result(None)


async def _lean_main(pipe: Connection, cfg: WorkerConfig) -> WorkerResult:
    loop = asyncio.get_running_loop()
    result = WorkerResult(pid=os.getpid())
    host, port = cfg.broker_addr.rsplit(":", 1)
    tmpl = FrameTemplate.build(f"BENCH_PG_{cfg.index}", cfg.topic, cfg.queues, cfg.sys_flag)
    st = LeanState(result, 0, 0)
    ssl_context = None
    if cfg.tls:
        # As a Java client with -Dtls.enable=true in test mode: TLS without checking the certificate.
        from rmqbroker.remoting.tls import TlsSettings, client_context

        ssl_context = client_context(TlsSettings(client_enable=True))
    for i in range(cfg.producers):
        _, proto = await loop.create_connection(
            lambda i=i: LeanProducer(st, tmpl, cfg.body, cfg.window, cfg.burst, cfg.index * 7 + i * 3),
            host, int(port), ssl=ssl_context)
        st.conns.append(proto)
    pipe.send(("ready", os.getpid()))
    _, t0_wall, t1_wall = await loop.run_in_executor(None, pipe.recv)
    offset = time.time_ns() - time.perf_counter_ns()
    st.t0 = int(t0_wall * 1e9) - offset
    st.t1 = int(t1_wall * 1e9) - offset
    st.sending = True
    for c in st.conns:
        c.pump()
    await asyncio.sleep(max(0.0, t1_wall - time.time()))
    st.sending = False
    st.drained = loop.create_future()
    for c in st.conns:
        c._check_drained()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(st.drained), 15.0)
    result.undrained = sum(c.inflight for c in st.conns if not c.closed)
    for c in st.conns:
        if c.transport is not None:
            c.transport.close()
    result.latencies_ns = st.lat.tobytes()
    return result


def lean_worker(pipe: Connection, cfg: WorkerConfig) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    if cfg.cpu is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {cfg.cpu})
    try:
        import uvloop

        result = uvloop.run(_lean_main(pipe, cfg))
    except ImportError:
        result = asyncio.run(_lean_main(pipe, cfg))
    pipe.send(("result", result))


# ============================================================================= cpp generator ===
def cpp_worker(pipe: Connection, cfg: WorkerConfig) -> None:
    """Stock C++ client (rocketmq==0.4.4): ``cfg.producers`` producers, each a thread calling send_sync.

    Every producer gets its own instance name, hence its own client factory and TCP connection
    (like separate producer applications).  Sharing one Producer between threads makes the C++
    client fail sends with "GetTransport ... get timed_mutex timeout" under contention (a client-side
    lock with a short timeout), which would be counted as errors that are not the broker's.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cfg.cpu is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {cfg.cpu})
    os.environ["HOME"] = cfg.home  # librocketmq writes its logs under $HOME/logs/rocketmq-cpp
    from rocketmq.client import Message, Producer, SendStatus
    from rocketmq.ffi import dll

    result = WorkerResult(pid=os.getpid())
    producers: list[Any] = []
    for i in range(cfg.producers):
        producer = Producer(f"BENCH_CPP_PG_{cfg.index}_{i}", timeout=3000)
        dll.SetProducerInstanceName(producer._handle, f"bench{os.getpid()}_{i}".encode())
        producer.set_namesrv_addr(cfg.namesrv_addr)
        producer.start()
        # One warm-up send resolves the route before the clock starts.
        warm = Message(cfg.topic)
        warm.set_body(cfg.body)
        producer.send_sync(warm)
        producers.append(producer)
    pipe.send(("ready", os.getpid()))
    _, t0_wall, t1_wall = pipe.recv()
    offset = time.time_ns() - time.perf_counter_ns()
    t0 = int(t0_wall * 1e9) - offset
    t1 = int(t1_wall * 1e9) - offset
    lock = threading.Lock()
    lats: list[array[int]] = []

    def run(producer: Any) -> None:
        msg = Message(cfg.topic)
        msg.set_tags("TagA")
        msg.set_body(cfg.body)
        lat = array("q")
        acked = acked_w = 0
        errs: list[tuple[str, bool]] = []
        while True:
            start = time.perf_counter_ns()
            if start >= t1:
                break
            try:
                res = producer.send_sync(msg)
                ok = res.status == SendStatus.OK and bool(res.msg_id)
                kind = "" if ok else f"status {res.status.name}"
            except Exception as exc:
                ok, kind = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"
            done = time.perf_counter_ns()
            in_window = t0 <= done < t1
            if ok:
                acked += 1
                if in_window:
                    acked_w += 1
                    lat.append(done - start)
            else:
                errs.append((kind, in_window))
        with lock:
            result.acked_total += acked
            result.acked_window += acked_w
            for kind, in_window in errs:
                result.error(kind, in_window)
            lats.append(lat)

    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in producers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, t1_wall - time.time() + 10.0))
    result.undrained = sum(t.is_alive() for t in threads)
    merged = array("q")
    for a in lats:
        merged.extend(a)
    result.latencies_ns = merged.tobytes()
    pipe.send(("result", result))
    for producer in producers:
        with contextlib.suppress(Exception):
            producer.shutdown()
    os._exit(0)  # librocketmq's static destructors can hang at interpreter exit


# ============================================================================== orchestrator ===
@dataclass
class CpuSample:
    wall: float
    broker: float
    broker_user: float
    broker_sys: float
    broker_loop: float
    gens: list[tuple[float, float]]  # (user, sys) per generator process
    namesrv: float
    busy: float
    total: float
    steal: float


def sample(broker: Child, gens: list[int], namesrv: Child) -> CpuSample:
    wall = time.time()
    user, sys_ = proc_cpu_split(broker.pid)
    busy, total, steal = machine_busy_seconds()
    return CpuSample(wall, user + sys_, user, sys_, proc_cpu_seconds(broker.pid, broker.pid),
                     [proc_cpu_split(p) for p in gens], proc_cpu_seconds(namesrv.pid), busy, total,
                     steal)


def wait_quiet(max_wait: float, threshold_pct: float = 20.0) -> float:
    """Wait (up to ``max_wait`` s) for a 2 s interval in which the machine is < threshold busy; returns busy %."""
    deadline = time.monotonic() + max_wait
    while True:
        b0, t0, _ = machine_busy_seconds()
        time.sleep(2.0)
        b1, t1, _ = machine_busy_seconds()
        busy = (b1 - b0) / (t1 - t0) * 100 if t1 > t0 else 0.0
        if busy < threshold_pct or time.monotonic() >= deadline:
            return busy
        print(f"machine {busy:.0f} % busy (all CPUs); waiting for a quieter moment...", file=sys.stderr)


def sleep_until(t: float) -> None:
    while True:
        left = t - time.time()
        if left <= 0:
            return
        time.sleep(min(left, 0.5))


class Interrupted(Exception):
    pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(f"signal {signum}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.wait_quiet:
        wait_quiet(args.wait_quiet)
    workdir = Path(tempfile.mkdtemp(prefix="send-bench-"))
    namesrv: Child | None = None
    broker: Child | None = None
    workers: list[mp.process.BaseProcess] = []
    pipes: list[Connection] = []
    profiler: subprocess.Popen[bytes] | None = None
    try:
        ns_port = free_port()
        namesrv = Child("namesrv", [PY, "-m", "rmqbroker.namesrv.main", "--listen", f"127.0.0.1:{ns_port}"],
                        workdir / "namesrv.log", args.broker_path).start()
        wait_port(ns_port)
        ns_addr = f"127.0.0.1:{ns_port}"
        port = free_port_block(4) + 2  # listenPort - 2 is the VIP channel
        admin_port = free_port()
        conf = broker_conf(workdir, ns_addr, port, admin_port, args.flush, args.segment_mb * 1024 * 1024)
        broker = Child("broker", [PY, "-m", "rmqbroker.main", "-c", str(conf)], workdir / "broker.log",
                       args.broker_path).start()
        ncpu = os.cpu_count() or 1
        if args.pin and ncpu >= 2:
            # Affinity of every broker thread (flush threads are started later and inherit it).
            os.sched_setaffinity(broker.pid, {0})
        wait_ready(broker, admin_port)
        broker_addr = f"127.0.0.1:{port}"
        create_topic(broker_addr, ns_addr, args.topic, args.queues)

        body = make_body(args.size)
        if args.compressed:
            # As a producer compresses a body over 4 KiB: zlib, sysFlag bit 0 (the broker checks it inflates).
            body = zlib.compress(body, 5)
        nproc = max(1, min(args.gen_procs, args.producers))
        ctx = mp.get_context("spawn")
        target = lean_worker if args.client == "lean" else cpp_worker
        home = workdir / "home"
        home.mkdir()
        for i in range(nproc):
            share = args.producers // nproc + (1 if i < args.producers % nproc else 0)
            cpu = (1 + i % (ncpu - 1)) if args.pin and ncpu >= 2 else None
            cfg = WorkerConfig(i, args.client, broker_addr, ns_addr, args.topic, args.queues, share,
                               args.window, args.burst or max(1, args.window // 2), body, str(home), cpu,
                               tls=args.tls, sys_flag=1 if args.compressed else 0)
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=target, args=(child_end, cfg), daemon=True, name=f"gen-{i}")
            proc.start()
            child_end.close()
            workers.append(proc)
            pipes.append(parent_end)
        gen_pids: list[int] = []
        for pipe, p in zip(pipes, workers, strict=True):
            if not pipe.poll(60):
                raise RuntimeError(f"generator {p.name} did not connect (exit code {p.exitcode})")
            tag, pid = pipe.recv()
            assert tag == "ready"
            gen_pids.append(pid)
        stored_before = broker_messages_in(admin_port)

        t0 = time.time() + args.warmup
        t1 = t0 + args.seconds
        for pipe in pipes:
            pipe.send(("go", t0, t1))
        sleep_until(t0)
        s0 = sample(broker, gen_pids, namesrv)
        if args.profile:
            cmd = [str(Path(PY).parent / "py-spy"), "record", "--pid", str(broker.pid), "--duration",
                   str(max(1, int(args.seconds))), "--rate", str(args.profile_rate), "--format", "raw",
                   "--output", str(args.profile), "--threads"]
            if args.profile_native:
                cmd.append("--native")  # needs the blocking (pausing) sampler
            elif args.profile_nonblocking:
                cmd.append("--nonblocking")
            profiler = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        sleep_until(t1)
        s1 = sample(broker, gen_pids, namesrv)
        if not broker.alive:
            raise RuntimeError(f"broker died during the run:\n{broker.log_tail()}")

        results: list[WorkerResult] = []
        for pipe, p in zip(pipes, workers, strict=True):
            if not pipe.poll(60):
                raise RuntimeError(f"generator {p.name} sent no result (exit code {p.exitcode})")
            tag, res = pipe.recv()
            assert tag == "result"
            results.append(res)
        stored_after = broker_messages_in(admin_port)
        if profiler is not None:
            try:
                _, err = profiler.communicate(timeout=args.seconds + 60)
            except subprocess.TimeoutExpired:
                profiler.kill()
                _, err = profiler.communicate()
            if profiler.returncode != 0:
                print(f"py-spy failed ({profiler.returncode}): {err.decode(errors='replace')[-2000:]}",
                      file=sys.stderr)
            profiler = None
        return report(args, s0, s1, results, stored_before, stored_after, nproc)
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip cleanup
        if profiler is not None and profiler.poll() is None:
            profiler.kill()
            profiler.wait()
        for p in workers:
            if p.is_alive():
                p.terminate()
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        for pipe in pipes:
            pipe.close()
        for child in (broker, namesrv):
            if child is not None:
                child.stop()
        if args.keep:
            print(f"kept work dir {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        signal.signal(signal.SIGINT, previous)


def report(args: argparse.Namespace, s0: CpuSample, s1: CpuSample, results: list[WorkerResult],
           stored_before: float | None, stored_after: float | None, nproc: int) -> dict[str, Any]:
    wall = s1.wall - s0.wall
    acked = sum(r.acked_window for r in results)
    lat = array("q")
    for r in results:
        chunk = array("q")
        chunk.frombytes(r.latencies_ns)
        lat.extend(chunk)
    lat_sorted = sorted(lat)
    broker_cpu = s1.broker - s0.broker
    loop_cpu = s1.broker_loop - s0.broker_loop
    gen_cpu = [sum(b) - sum(a) for a, b in zip(s0.gens, s1.gens, strict=True)]
    gen_sys = sum(b[1] - a[1] for a, b in zip(s0.gens, s1.gens, strict=True))
    reads = sum(r.reads for r in results)
    writes = sum(r.writes for r in results)
    busy = s1.busy - s0.busy
    total = s1.total - s0.total
    ncpu = os.cpu_count() or 1
    errors_w = sum(r.errors_window for r in results)
    errors_t = sum(r.errors_total for r in results)
    kinds: dict[str, int] = {}
    for r in results:
        for k, v in r.error_kinds.items():
            kinds[k] = kinds.get(k, 0) + v
    out: dict[str, Any] = {
        "client": args.client, "tls": bool(getattr(args, "tls", False)),
        "producers": args.producers, "window": args.window if args.client == "lean" else 1,
        "burst": (args.burst or max(1, args.window // 2)) if args.client == "lean" else 1,
        "gen_procs": nproc, "size": args.size, "flush": args.flush, "seconds": args.seconds,
        "warmup": args.warmup, "queues": args.queues, "pinned": bool(args.pin), "profiled": bool(args.profile),
        "wall_s": wall, "acked": acked, "msgs_per_s": acked / wall if wall else 0.0,
        "mb_per_s": acked * args.size / wall / 1e6 if wall else 0.0,
        "p50_ms": percentile(lat_sorted, 0.50) / 1e6, "p99_ms": percentile(lat_sorted, 0.99) / 1e6,
        "p999_ms": percentile(lat_sorted, 0.999) / 1e6,
        "broker_cpu_s": broker_cpu, "broker_user_s": s1.broker_user - s0.broker_user,
        "broker_sys_s": s1.broker_sys - s0.broker_sys,
        "broker_us_per_msg": broker_cpu / acked * 1e6 if acked else math.nan,
        "broker_util_pct": broker_cpu / wall * 100 if wall else 0.0,
        "broker_loop_util_pct": loop_cpu / wall * 100 if wall else 0.0,
        "gen_cpu_s": gen_cpu, "gen_util_pct": [c / wall * 100 for c in gen_cpu],
        "gen_us_per_msg": sum(gen_cpu) / acked * 1e6 if acked else math.nan,
        "gen_sys_pct_of_gen": gen_sys / sum(gen_cpu) * 100 if sum(gen_cpu) else 0.0,
        "frames_per_write": acked / writes if writes else None,
        "responses_per_read": acked / reads if reads else None,
        "namesrv_cpu_s": s1.namesrv - s0.namesrv,
        "machine_busy_pct": busy / total * 100 * ncpu if total else 0.0, "ncpu": ncpu,
        "steal_pct": (s1.steal - s0.steal) / total * 100 * ncpu if total else 0.0,
        "other_busy_pct": (busy - broker_cpu - sum(gen_cpu) - (s1.namesrv - s0.namesrv)) / wall * 100 if wall else 0,
        "errors_window": errors_w, "errors_total": errors_t, "error_kinds": kinds,
        "acked_total": sum(r.acked_total for r in results),
        "stored_delta": (stored_after - stored_before) if stored_before is not None and stored_after is not None
        else None,
        "unexpected": sum(r.unexpected for r in results),
        "lost_connections": sum(r.lost_connections for r in results),
        "undrained": sum(r.undrained for r in results),
    }
    return out


def print_report(r: dict[str, Any]) -> None:
    window = f"window={r['window']}/producer, burst={r['burst']}" if r["client"] == "lean" else \
        "sync send per thread"
    over = " over TLS" if r.get("tls") else ""
    print(f"send_bench: client={r['client']}{over} producers={r['producers']} ({window}, {r['gen_procs']} generator "
          f"process(es){', pinned' if r['pinned'] else ''}) size={r['size']}B flush={r['flush']} "
          f"queues={r['queues']} warmup={r['warmup']}s window={r['wall_s']:.2f}s"
          f"{'  [py-spy attached]' if r['profiled'] else ''}")
    print(f"  messages/s        {r['msgs_per_s']:12,.0f}   ({r['acked']:,} SUCCESS responses in the window)")
    print(f"  MB/s (bodies)     {r['mb_per_s']:12.2f}")
    print(f"  latency ms        p50 {r['p50_ms']:.2f}   p99 {r['p99_ms']:.2f}   p999 {r['p999_ms']:.2f}")
    print(f"  broker CPU/msg    {r['broker_us_per_msg']:12.1f} us   (user {r['broker_user_s']:.2f}s + sys "
          f"{r['broker_sys_s']:.2f}s over the window)")
    print(f"  broker CPU        {r['broker_util_pct']:12.1f} % of one core   (event-loop thread "
          f"{r['broker_loop_util_pct']:.1f} %)")
    gens = ", ".join(f"{u:.1f}" for u in r["gen_util_pct"])
    print(f"  generator CPU     {sum(r['gen_util_pct']):12.1f} % of one core   ({gens} per process; "
          f"{r['gen_us_per_msg']:.1f} us/msg, {r['gen_sys_pct_of_gen']:.0f} % of it kernel)")
    if r["frames_per_write"]:
        print(f"  generator I/O     {r['frames_per_write']:12.1f} requests per write(), "
              f"{r['responses_per_read']:.1f} responses per read()")
    print(f"  machine busy      {r['machine_busy_pct']:12.1f} % of one core over {r['ncpu']} CPUs   (other "
          f"processes ~{r['other_busy_pct']:.1f} %, hypervisor steal {r.get('steal_pct', 0.0):.1f} %)")
    stored = "n/a" if r["stored_delta"] is None else f"{r['stored_delta']:,.0f}"
    print(f"  errors            {r['errors_window']} in window, {r['errors_total']} total {r['error_kinds'] or ''}"
          f"; acked overall {r['acked_total']:,}, broker stored {stored}; unexpected {r['unexpected']}, "
          f"lost conns {r['lost_connections']}, undrained {r['undrained']}")
    loop = r["broker_loop_util_pct"]
    gen_max = max(r["gen_util_pct"]) if r["gen_util_pct"] else 0.0
    if loop >= 90 and gen_max < 90:
        verdict = "broker-bound (event-loop thread saturated, generator has headroom)"
    elif gen_max >= 90:
        verdict = "GENERATOR-BOUND: a generator process is near 100 % of a core; add --gen-procs or fewer producers"
    elif r["other_busy_pct"] > 30:
        verdict = "machine noisy: other processes used a lot of CPU; rerun"
    else:
        verdict = "not saturated (latency/window bound): raise --producers or --window"
    print(f"  verdict           {verdict}")


def summarize_runs(path: Path) -> None:
    """Median (min-max) of the key figures over the runs appended to a ``--json`` file."""
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not runs:
        print(f"{path}: no runs")
        return
    r0 = runs[0]
    print(f"{path}: {len(runs)} run(s) of client={r0['client']} producers={r0['producers']} window={r0['window']} "
          f"flush={r0['flush']} size={r0['size']}")
    for key, label, fmt in (("msgs_per_s", "messages/s", "{:,.0f}"), ("mb_per_s", "MB/s", "{:.2f}"),
                            ("p50_ms", "p50 ms", "{:.2f}"), ("p99_ms", "p99 ms", "{:.2f}"),
                            ("p999_ms", "p999 ms", "{:.2f}"), ("broker_us_per_msg", "broker us/msg", "{:.1f}"),
                            ("broker_util_pct", "broker % core", "{:.1f}"),
                            ("broker_loop_util_pct", "loop thread % core", "{:.1f}"),
                            ("gen_us_per_msg", "generator us/msg", "{:.1f}"),
                            ("other_busy_pct", "other procs % core", "{:.1f}")):
        vals = sorted(float(r[key]) for r in runs if r.get(key) is not None)
        if vals:
            med = vals[len(vals) // 2] if len(vals) % 2 else (vals[len(vals) // 2 - 1] + vals[len(vals) // 2]) / 2
            print(f"  {label:<20} median {fmt.format(med):>10}   range {fmt.format(vals[0])} - {fmt.format(vals[-1])}")
    print(f"  errors               {sum(r['errors_total'] for r in runs)} total")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--producers", type=int, default=4, help="producer connections (cpp: send threads)")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured window")
    ap.add_argument("--warmup", type=float, default=3.0, help="load before the window starts")
    ap.add_argument("--size", type=int, default=1024, help="message body bytes")
    ap.add_argument("--flush", choices=("ASYNC_FLUSH", "SYNC_FLUSH"), default="ASYNC_FLUSH")
    ap.add_argument("--client", choices=("lean", "cpp"), default="lean")
    ap.add_argument("--compressed", action="store_true",
                    help="lean: send the --size body zlib-compressed (sysFlag 1), as producers send bodies over 4 KiB")
    ap.add_argument("--tls", action="store_true",
                    help="lean: connect over TLS (the broker's default permissive mode, self-signed certificate)")
    ap.add_argument("--window", type=int, default=32, help="lean: requests in flight per producer connection")
    ap.add_argument("--burst", type=int, default=0,
                    help="lean: refill a connection once this many requests completed, so each write() carries "
                         ">= this many frames (default window/2; 1 = one write per message)")
    ap.add_argument("--gen-procs", type=int, choices=(1, 2), default=1, help="generator OS processes")
    ap.add_argument("--queues", type=int, default=8, help="queues of the benchmark topic")
    ap.add_argument("--topic", default="BenchTopic")
    ap.add_argument("--segment-mb", type=int, default=1024, help="commitlog segment size (MiB)")
    ap.add_argument("--pin", action="store_true", help="pin the broker to CPU 0 and the generator to the others")
    ap.add_argument("--profile", type=Path, help="write a py-spy raw profile of the broker over the window here")
    ap.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--profile-native", action="store_true", help="py-spy --native (C frames too)")
    ap.add_argument("--profile-nonblocking", action="store_true",
                    help="py-spy --nonblocking: no pauses, but stacks of a busy loop come out torn")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                    help="first wait up to this long for the machine to be < 20 %% busy (shared machines)")
    ap.add_argument("--json", type=Path, help="also append the figures as one JSON line to this file")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, store)")
    ap.add_argument("--broker-path", help="run rmqbroker from this directory instead (prepended to PYTHONPATH; "
                    "for A/B runs of a candidate change)")
    ap.add_argument("--summarize", type=Path, metavar="JSONL",
                    help="only print median/range of the runs recorded in a --json file, then exit")
    args = ap.parse_args(argv)
    if args.summarize:
        summarize_runs(args.summarize)
        return 0
    if args.producers < 1 or args.window < 1 or args.seconds <= 0 or args.size < 1:
        ap.error("--producers, --window, --size must be >= 1 and --seconds > 0")
    if args.segment_mb * 1024 * 1024 < 4194304 + 1024 + 1:
        ap.error("--segment-mb must exceed the broker's maxMessageSize (4 MiB)")

    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        r = run(args)
    except (KeyboardInterrupt, Interrupted):
        print("interrupted; processes stopped and temp dir removed", file=sys.stderr)
        return 130
    print_report(r)
    if args.profile:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from profile_summary import summarize

        summarize(args.profile, r["acked"], r["broker_cpu_s"])
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
