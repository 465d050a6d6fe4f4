#!/usr/bin/env python
"""In-process micro-benchmark of the broker's send path, stage by stage, plus optimization prototypes.

Usage::

    .venv/bin/python bench/micro_send_path.py [--n 20000] [--rounds 7]

It builds a real ``Broker`` object (store in a temp dir, no sockets, no nameserver) and times, in
thread CPU time (min over ``--rounds``), each stage a SEND_MESSAGE_V2 request goes through, fed with
the exact frame ``send_bench.py``'s lean client sends:

* the broker's own functions (``decode_frame_payload``, ``normalize_send_v2``, the processor's
  ``send`` coroutine driven without an event loop, ``MessageStore.append_message``,
  ``encode_header``, the latency observer, ...), and
* prototypes of cheaper alternatives written here (they are *not* broker code), so that the savings
  quoted in ``RESULTS.md`` are measured rather than guessed.

Costs of a stage measured in isolation are lower bounds of its cost under load (warm caches,
no GC pressure from other objects, no event-loop bookkeeping in between).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import socket
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from send_bench import FRAME_PREFIX, FrameTemplate, make_body

Fn = Callable[[], object]


def per_call_us(fn: Fn, n: int, rounds: int) -> float:
    """Thread CPU microseconds per call of ``fn``, min over rounds, loop overhead removed."""

    def loop(f: Fn) -> float:
        t = time.thread_time_ns()
        for _ in range(n):
            f()
        return (time.thread_time_ns() - t) / n / 1000

    def empty() -> None:
        return None

    base = min(loop(empty) for _ in range(3))
    return max(0.0, min(loop(fn) for _ in range(rounds)) - base)


def _SECTION() -> None:
    return None


def drive(coro: object) -> Any:
    """Run a coroutine that never suspends (ASYNC_FLUSH, no replication) without an event loop.

    A handler that already answered synchronously (returns its result, not a coroutine) is passed through.
    """
    if not isinstance(coro, Coroutine):
        return coro
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("coroutine suspended")


# ------------------------------------------------------------------ optimization prototypes ---
_RESP_TPL = (b'{"code":0,"extFields":{"MSG_REGION":"DefaultRegion","TRACE_ON":"true","msgId":"%s",'
             b'"queueId":"%d","queueOffset":"%d"},"flag":1,"language":"JAVA","opaque":%d,'
             b'"serializeTypeCurrentRPC":"JSON","version":409}')


def proto_response_frame(msg_id: bytes, queue_id: int, queue_offset: int, opaque: int) -> bytes:
    """Send response header from a bytes template (what a specialised encoder would do)."""
    hdr = _RESP_TPL % (msg_id, queue_id, queue_offset, opaque)
    return FRAME_PREFIX.pack(4 + len(hdr), len(hdr)) + hdr


def proto_v2_fields(ext: dict[str, str]) -> tuple[Any, ...]:
    """Read the V2 single-letter fields directly (no renamed dict, no Header object)."""
    return (ext["b"], int(ext["e"]), int(ext["f"]), ext["c"], int(ext["d"]), int(ext["g"]), int(ext["h"]),
            int(ext.get("j") or 0), ext.get("m"), ext.get("i"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=20000, help="calls per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--proto-path", help="extra sys.path entry for prototype-only libraries (e.g. a "
                    "`pip install --target DIR orjson`); the broker is not changed")
    args = ap.parse_args()
    if args.proto_path:
        sys.path.append(args.proto_path)
    try:
        import uvloop

        return uvloop.run(amain(args))
    except ImportError:
        return asyncio.run(amain(args))


async def amain(args: argparse.Namespace) -> int:
    from rmqbroker.broker import Broker
    from rmqbroker.config import build_settings
    from rmqbroker.metadata.topics import TopicConfig
    from rmqbroker.remoting import frame as fr
    from rmqbroker.remoting.server import Connection
    from rmqbroker.remoting.wire import normalize_send_v2
    from rmqbroker.store import record as rec
    from rmqbroker.store.message_store import MessageInner

    n, rounds = args.n, args.rounds
    workdir = Path(tempfile.mkdtemp(prefix="micro-send-"))
    rows: list[tuple[str, float, str]] = []
    extra: list[str] = []
    stages: list[tuple[str, Fn, str]] = []

    def row(name: str, fn: Fn, note: str = "") -> None:
        stages.append((name, fn, note))

    def section(title: str) -> None:
        stages.append((title, _SECTION, ""))

    def measure_all() -> dict[str, float]:
        # Rounds are interleaved across stages so that machine noise hits every stage alike.
        best: dict[str, float] = {}
        for _ in range(rounds):
            for name, fn, _note in stages:
                if fn is not _SECTION:
                    best[name] = min(best.get(name, float("inf")), per_call_us(fn, n, 1))
        for name, fn, note in stages:
            if fn is _SECTION:
                print(name)
            else:
                print(f"  {name:<66} {best[name]:8.2f} us  {note}", flush=True)
                rows.append((name, best[name], note))
        return best

    broker = None
    try:
        settings = build_settings(
            f"brokerName=micro\nbrokerIP1=127.0.0.1\nlistenHost=127.0.0.1\nlistenPort=1\nfastListenPort=0\n"
            f"storePathRootDir={workdir / 'store'}\nflushDiskType=ASYNC_FLUSH\n", env={})
        broker = Broker(settings)
        await broker.store.start()
        broker.topics.update_topic_config(TopicConfig("BenchTopic", 8, 8), persist=False)
        conn = Connection(broker.server)
        conn.remote_host, conn.remote_port, conn.remote_addr = "127.0.0.1", 40000, "127.0.0.1:40000"

        tmpl = FrameTemplate.build("BENCH_PG_0", "BenchTopic", 8)
        body = make_body(1024)
        p0, p1, p2, p3 = tmpl.parts
        header = b"".join((p0, b"3", p1, b"1763776000000", p2, b"12345", p3))
        frame = FRAME_PREFIX.pack(4 + len(header) + len(body), len(header)) + header + body
        payload = bytearray(frame[4:])
        cmd = fr.decode_frame_payload(memoryview(payload))
        ext = cmd.ext_fields
        props_str = ext["i"]
        props = rec.decode_properties(props_str)
        props[rec.CLUSTER] = "DefaultCluster"
        proc = broker.send
        answer = drive(proc.send(conn, cmd))
        # The processor answers a plain success with a complete prebuilt frame.
        resp = fr.decode_frame(answer, 4, len(answer)) if isinstance(answer, bytes) else answer
        assert resp.code == 0, resp
        print(f"micro_send_path: n={n} rounds={rounds}; request header {len(header)} B, body {len(body)} B, "
              f"response header {len(fr.encode_header(resp)) - 8} B")

        section("broker functions (current code):")
        row("decode_frame_payload (whole request frame)", lambda: fr.decode_frame_payload(memoryview(payload)))
        row("  json.loads(header) alone", lambda: json.loads(header))
        row("normalize_send_v2 (V2 -> V1 dict)", lambda: normalize_send_v2(ext))
        row("decode_properties", lambda: rec.decode_properties(props_str))
        row("encode_properties (+CLUSTER)", lambda: rec.encode_properties(props))
        row("zlib.crc32(1 KiB body)", lambda: zlib.crc32(body))
        row("offset_msg_id", lambda: rec.offset_msg_id("127.0.0.1", 10911, 123456789))
        msg = MessageInner(topic="BenchTopic", queue_id=3, flag=0, body=body, properties=props, sys_flag=0,
                           born_timestamp=1763776000000, born_host=("127.0.0.1", 40000))
        row("MessageStore.append_message (commitlog + CQ + msgId)", lambda: broker.store.append_message(msg))
        row("MessageStore.put_message (append + durability await, driven)",
            lambda: drive(broker.store.put_message(msg)))
        row("SendMessageProcessor.send, whole (driven w/o event loop)", lambda: drive(proc.send(conn, cmd)))
        row("  SendMessageProcessor._check_sendable (role, permission, topic name)",
            lambda: proc._check_sendable("BenchTopic"))
        row("  SendMessageProcessor._topic_config (lookup, queue id)",
            lambda: proc._topic_config("BenchTopic", 3, "TBW102", 4, "127.0.0.1:40000"))
        put = broker.store.append_message(msg)
        if hasattr(proc, "_response"):
            row("  SendMessageProcessor._response (ext dict + make_response)",
                lambda: proc._response(cmd, put, 3, 1024))
        row("  MessageInner(...) construction", lambda: MessageInner(
            topic="BenchTopic", queue_id=3, flag=0, body=body, properties=props, sys_flag=0,
            born_timestamp=1763776000000, born_host=("127.0.0.1", 40000), reconsume_times=0))
        row("  cmd.make_response(0, None, ext) (RemotingCommand kwargs)",
            lambda: cmd.make_response(0, None, {"msgId": "x"}))
        row("encode_header(response)", lambda: fr.encode_header(resp))
        row("latency observer (Broker._observe_latency, histogram)",
            lambda: broker.server.latency.observe(310, 0.0012))
        row("2x time.perf_counter() in Connection._run", lambda: (time.perf_counter(), time.perf_counter()))

        def full() -> None:
            c = fr.decode_frame_payload(memoryview(payload))
            r = drive(proc.send(conn, c))
            if not isinstance(r, bytes):  # a prebuilt frame needs no encoding
                fr.encode_header(r)

        row("decode + send + encode_header (pure Python per message)", full)

        # asyncio costs, measured on the running (uv)loop.
        loop = asyncio.get_running_loop()

        async def noop() -> None:
            return None

        async def tasks(count: int) -> float:
            pending: set[asyncio.Task[None]] = set()
            t = time.thread_time_ns()
            for i in range(count):
                task = loop.create_task(noop())
                pending.add(task)
                task.add_done_callback(pending.discard)
                if i % 32 == 31:
                    await asyncio.sleep(0)
            if pending:
                await asyncio.wait(set(pending))
            return (time.thread_time_ns() - t) / count / 1000

        task_us = min([await tasks(n) for _ in range(rounds)])
        coro_us = per_call_us(lambda: drive(noop()), n, rounds)
        extra.append(f"  {'create_task + done callback + task step (trivial coroutine)':<66} {task_us:8.2f} us")
        extra.append(f"  {'  vs driving the coroutine directly (coro.send)':<66} {coro_us:8.2f} us")

        # Socket costs on loopback TCP (this machine's syscall + TCP cost per write/read).
        srv = socket.create_server(("127.0.0.1", 0))
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
        for s in (a, b):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        resp_frame = fr.encode_header(resp)

        def write_cost(per_write: int, writes: int) -> float:
            chunk = resp_frame * per_write
            best = float("inf")
            for _ in range(rounds):
                spent = 0
                for _ in range(writes // 200):
                    t = time.thread_time_ns()
                    for _ in range(200):
                        a.send(chunk)
                    spent += time.thread_time_ns() - t
                    need = 200 * len(chunk)
                    while need:
                        need -= len(b.recv(min(need, 1 << 20)))
                best = min(best, spent / (writes // 200 * 200) / 1000)
            return best / per_write

        w1 = write_cost(1, 4000)
        w16 = write_cost(16, 2000)
        extra.append(f"  {'socket send() of one 250 B response (loopback TCP, idle peer)':<66} {w1:8.2f} us")
        extra.append(f"  {'  per response when 16 responses share one send()':<66} {w16:8.2f} us")

        def read_cost(frames_per_read: int) -> float:
            best = float("inf")
            chunk = frame * frames_per_read
            buf = bytearray(len(chunk))
            for _ in range(rounds):
                spent = 0
                reads = 0
                for _ in range(40):
                    for _ in range(20):
                        b.sendall(chunk)
                    t = time.thread_time_ns()
                    for _ in range(20):
                        got = 0
                        while got < len(chunk):
                            got += a.recv_into(memoryview(buf)[got:])
                            reads += 1
                    spent += time.thread_time_ns() - t
                best = min(best, spent / (40 * 20 * frames_per_read) / 1000)
            return best

        r1 = read_cost(1)
        r16 = read_cost(16)
        extra.append(f"  {'socket recv of one 1.3 KiB request (data already queued)':<66} {r1:8.2f} us")
        extra.append(f"  {'  per request when 16 requests arrive per recv':<66} {r16:8.2f} us")
        for s in (a, b, srv):
            s.close()

        section("prototypes (bench code, not the broker):")

        def proto_decode() -> object:
            view = memoryview(payload)
            word = int.from_bytes(view[0:4], "big")
            hlen = word & 0xFFFFFF
            obj = json.loads(view[4:4 + hlen].tobytes())
            e = obj.get("extFields") or {}
            for k, v in e.items():
                if type(v) is not str:
                    e[k] = str(v)
            return fr.RemotingCommand(obj["code"], opaque=obj["opaque"], flag=obj.get("flag", 0), ext_fields=e,
                                      body=bytes(view[4 + hlen:]), language=obj.get("language", "JAVA"),
                                      version=obj.get("version", 0))

        row("P1 decode: json.loads + str-check only + RemotingCommand", proto_decode)
        row("P3 read V2 letters directly", lambda: proto_v2_fields(ext))

        def cur_fields() -> object:
            from rmqbroker.remoting.wire import Header
            h = Header(normalize_send_v2(ext))
            return (h.req_str("topic"), h.req_int("queueId"), h.req_int("sysFlag"), h.req_str("defaultTopic"),
                    h.req_int("defaultTopicQueueNums"), h.req_int("bornTimestamp"), h.req_int("flag"),
                    h.opt_int("reconsumeTimes", 0), h.opt_int("maxReconsumeTimes", -1), h.opt_str("batch"),
                    h.opt_str("properties"))

        row("  current: normalize_send_v2 + Header + 11 field reads", cur_fields)

        def proto_props() -> object:
            s = props_str.rstrip("\x02") + "\x02CLUSTER\x01DefaultCluster"
            return s, rec.get_property(s, "TAGS"), rec.get_property(s, "DELAY"), rec.get_property(s, "WAIT")

        row("P4 properties pass-through (+CLUSTER, 3x get_property)", proto_props)
        row("  current: decode_properties + encode_properties",
            lambda: rec.encode_properties(rec.decode_properties(props_str) | {"CLUSTER": "DefaultCluster"}))
        msg_id = b"7F00000100002A9F00000000075BCD15"
        row("P2 response frame from a bytes template", lambda: proto_response_frame(msg_id, 3, 12345, 12345))
        row("  current: _response (a prebuilt frame)",
            lambda: proc._response(cmd, broker.store.append_message(msg), 3, 1024)
            if hasattr(proc, "_response") else None, "(includes one append_message)")
        try:
            import orjson  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            orjson = None
            print("  (orjson not importable: pass --proto-path to time the orjson prototypes)")
        loads = orjson.loads if orjson is not None else json.loads
        if orjson is not None:
            row("  orjson.loads(header) alone", lambda: orjson.loads(header))

        def proto_decode_fast() -> fr.RemotingCommand:
            view = memoryview(payload)
            hlen = int.from_bytes(view[0:4], "big") & 0xFFFFFF
            obj = loads(bytes(view[4:4 + hlen]))
            e = obj.get("extFields") or {}
            for k, v in e.items():
                if type(v) is not str:
                    e[k] = str(v)
            return fr.RemotingCommand(obj["code"], opaque=obj["opaque"], flag=obj.get("flag", 0), ext_fields=e,
                                      body=bytes(view[4 + hlen:]), language=obj.get("language", "JAVA"),
                                      version=obj.get("version", 0))

        if orjson is not None:
            row("P1b decode with orjson + str-check + RemotingCommand", proto_decode_fast)
        store = broker.store
        prefix = rec._msg_id_prefix("127.0.0.1", 10911).encode() if hasattr(rec, "_msg_id_prefix") else b""

        def proto_all() -> bytes:
            c = proto_decode_fast()
            e = c.ext_fields
            topic, qid, sys_flag, _dt, _dn, born, flag, recon, _batch, pstr = proto_v2_fields(e)
            pstr = (pstr or "").rstrip("\x02") + "\x02CLUSTER\x01DefaultCluster"
            m = MessageInner(topic=topic, queue_id=qid, flag=flag, body=bytes(c.body), properties={}, sys_flag=sys_flag,
                             born_timestamp=born, born_host=("127.0.0.1", 40000), reconsume_times=recon,
                             tags_code=rec.tags_code(rec.get_property(pstr, "TAGS")), properties_string=pstr)
            r = store.append_message(m)
            return proto_response_frame(prefix + b"%016X" % r.wrote_offset, qid, r.queue_offset, c.opaque)

        row("P-all decode(fast)+direct fields+props pass-through+append+template", proto_all,
            "(no topic checks, no task, no metrics)")
        best = measure_all()
        print("asyncio and sockets (measured before the table):")
        for line in extra:
            print(line)
        print(f"\nsum of the pure-Python stages: {best['decode + send + encode_header (pure Python per message)']:.1f}"
              " us/msg; compare with send_bench's broker CPU/msg: the rest is event loop, syscalls, GC and cache "
              "effects under load")
    finally:
        gc.collect()
        if broker is not None:
            await broker.store.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
