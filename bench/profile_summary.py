#!/usr/bin/env python
"""Summarize a py-spy ``--format raw`` profile of the broker into send-path cost categories.

Usage::

    .venv/bin/python bench/profile_summary.py PROFILE.raw [--acked N --cpu-seconds S] [--src broker/]

Each sample is charged to the *deepest* frame of its stack that belongs to a known send-path
function (its "owner"); library code an owner calls (``json``, ``struct``, uvloop's C write path,
libc syscalls) is charged to that owner.  A sample whose stack reaches the garbage collector is
charged to GC.  Samples without an owner are event-loop overhead (uvloop/libuv, epoll, callbacks).
Idle samples (a thread parked in epoll/futex waits; only present with ``--native``) are dropped.

With ``--acked`` and ``--cpu-seconds`` (what ``send_bench.py`` measured over the same window) the
shares are also converted to broker CPU microseconds per message, assuming samples are
proportional to CPU time (py-spy samples running threads only).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")

# (category, function regex, file regex); first match wins for a given frame.
OWNERS: list[tuple[str, str, str]] = [
    ("GC", r"^gc_collect|^collect_with_callback|^\(gc\)$", r""),
    ("flush threads (fdatasync, checkpoint)", r"^(MappedFile\.flush|MappedFile\.sync_all|"
     r"MessageStore\._flush_\w+|MessageStore\._flush_all_sync|StoreCheckpoint\.\w+|fdatasync|fsync|msync)$", r""),
    ("socket read syscall (uvloop)", r"^(read|recv|recvfrom|readv)$", r"libc"),
    ("frame split (data_received)", r"^Connection\.data_received$", r"remoting/server\.py"),
    ("frame decode: JSON header (json.loads + field checks)", r"^(_decode_json_header|_ext_value)$",
     r"remoting/frame\.py"),
    ("frame decode: other (slices, body copy)", r"^decode_frame_payload$", r"remoting/frame\.py"),
    ("dispatch: create_task + done-callback", r"^Connection\._dispatch$", r"remoting/server\.py"),
    ("metrics (latency histogram)", r"^Broker\._observe_latency$", r"rmqbroker/broker\.py"),
    ("metrics (latency histogram)", r".", r"prometheus_client"),
    ("metrics (counters)", r"^BrokerStats\.\w+$", r"rmqbroker/stats\.py"),
    ("request task (_run: await chain, timing)", r"^Connection\.(_run|_finish|_error_response)$",
     r"remoting/server\.py"),
    ("send: V2->V1 header rename", r"^normalize_send_v2", r"remoting/wire\.py"),
    ("send: header fields (Header.req_*/opt_*, int())", r"^Header\.\w+$", r"remoting/wire\.py"),
    ("send: topic/permission checks", r"^(SendMessageProcessor\._check|validate_topic|is_topic_or_group_illegal|"
     r"is_not_allowed_send_topic|TopicConfigManager\.select|BrokerContext\.\w+|BrokerSettings\.\w+)$", r""),
    ("send: properties decode", r"^decode_properties", r"store/record\.py"),
    ("send: build response (ext dict, RemotingCommand)", r"^(SendMessageProcessor\._response|"
     r"RemotingCommand\.make_response|RemotingCommand\.__init__)$", r""),
    ("send: processor body (misc)", r"^SendMessageProcessor\.send$", r"processors/send\.py"),
    ("store: properties encode", r"^encode_properties", r"store/record\.py"),
    ("store: body CRC32", r"^(crc32|crc32_z|zlib_crc32|zlib_crc32_impl)$", r""),
    ("store: record encode (pack_into + memcpy to mmap)", r"^write_record_into$", r"store/record\.py"),
    ("store: record helpers (tail, sizes, ip, tagsCode)", r"^(encode_tail_with_prefix|encode_tail|topic_prefix|"
     r"record_size|ip_to_bytes|tags_code|java_string_hash|host_sys_flag|header_size)$", r"store/record\.py"),
    ("store: msgId (offset_msg_id)", r"^(offset_msg_id|_msg_id_prefix)$", r"store/record\.py"),
    ("store: consume-queue write", r"^ConsumeQueue\.\w+$", r"store/consume_queue\.py"),
    ("store: commitlog append (offsets, table, time)", r"^CommitLog\.\w+$", r"store/commitlog\.py"),
    ("store: arrival notify (pull holds)", r"^(MessageStore\._notify|PullHoldService\.\w+|\w+\.on_arrival)$", r""),
    ("store: durability wait / flush waiters", r"^MessageStore\.(_await_durability|_wait_flushed|"
     r"_release_flush_waiters|_wake_flusher)$", r""),
    ("store: append_message / put_message (checks, objects)", r"^(MessageStore\.\w+|MessageInner\.__init__|"
     r"PutResult\.__init__|__init__)$", r"store/message_store\.py|<string>"),
    ("response: encode header (json.dumps)", r"^(encode_header|_json_header|_binary_header)$", r"remoting/frame\.py"),
    ("response: transport.write (incl. write syscall)", r"^Connection\.(send_response|_flush_out|_flush)$",
     r"remoting/server\.py"),
    ("other broker Python", r".", r"rmqbroker/(?!main\.py|runtime\.py)"),
]
_OWNERS = [(cat, re.compile(f), re.compile(p)) for cat, f, p in OWNERS]
_IDLE_LEAF = re.compile(r"^(epoll_wait|epoll_pwait|epoll_pwait2|futex\w*|pthread_cond_\w*wait|sem_\w*wait|"
                        r"__futex\w*|do_futex_wait\w*|select|poll|nanosleep|clock_nanosleep|accept4?)$")
_IDLE_PY = re.compile(r"^(Condition\.wait|SimpleQueue\.get|_worker|Queue\.get|Event\.wait|"
                      r"Thread\._wait_for_tstate_lock)$")
# Native frames of a thread that waits (for a lock, the GIL, a queue): idle even if the leaf is unresolved.
_IDLE_WAIT = re.compile(r"^(PyThread_acquire_lock_timed|take_gil|pthread_cond_timedwait|pthread_cond_wait|"
                        r"_queue_SimpleQueue_get_impl|acquire_timed|epoll_wait|epoll_pwait)$")
EVENT_LOOP = "event loop (uvloop/libuv, epoll, Handle/Task stepping)"


@dataclass
class Frame:
    func: str
    file: str
    line: int

    @property
    def native(self) -> bool:
        return self.file.endswith((".so", ".c", ".h")) or ".so." in self.file or self.func.startswith("0x")


def parse_frame(text: str) -> Frame:
    m = _FRAME.match(text)
    if m is None:
        return Frame(text, "", 0)
    return Frame(m["func"], m["file"], int(m["line"] or 0))


class CrcLines:
    """Source lines that call ``zlib.crc32`` (py-spy charges a C builtin to its caller's line)."""

    def __init__(self, roots: Iterable[Path]) -> None:
        self.roots = list(roots)
        self._cache: dict[str, set[int]] = {}

    def __call__(self, frame: Frame) -> bool:
        if "crc32" in frame.func:
            return True
        if not frame.file.endswith(("commitlog.py", "record.py")):
            return False
        lines = self._cache.get(frame.file)
        if lines is None:
            lines = set()
            for root in self.roots:
                path = root / frame.file
                if path.exists():
                    for i, text in enumerate(path.read_text(errors="replace").splitlines(), 1):
                        if "crc32(" in text and not text.lstrip().startswith(("#", "def ")):
                            lines.add(i)
                    break
            self._cache[frame.file] = lines
        return frame.line in lines


def categorize(frames: list[Frame], crc: CrcLines) -> str | None:
    """Category of one sample, or None when idle."""
    if not frames:
        return None
    leaf = frames[-1]
    if _IDLE_LEAF.match(leaf.func) or (leaf.func.startswith("0x") and any(
            f.func.startswith(("uv__io_poll", "uv_run")) or _IDLE_PY.match(f.func) or _IDLE_WAIT.match(f.func)
            for f in frames[-5:])):
        return None
    if any(_IDLE_PY.match(f.func) for f in frames[-2:]) and not any(
            f.func.startswith(("MessageStore", "MappedFile", "fdatasync")) for f in frames):
        return None
    for f in frames:
        if f.func.startswith("gc_collect") or f.func == "(gc)":
            return "GC"
    for f in reversed(frames):
        if crc(f) and f.line and not f.native:
            return "store: body CRC32"
        for cat, fre, pre in _OWNERS:
            if cat == "GC":
                continue
            if fre.search(f.func) and (not pre.pattern or pre.search(f.file)):
                if cat == "socket read syscall (uvloop)" and not f.native:
                    continue
                return cat
    return EVENT_LOOP


@dataclass
class Summary:
    total: int
    by_cat: Counter[str]
    by_thread: Counter[str]
    self_lines: Counter[str]
    idle: int


def load(path: Path, roots: Iterable[Path]) -> Summary:
    crc = CrcLines(roots)
    by_cat: Counter[str] = Counter()
    by_thread: Counter[str] = Counter()
    self_lines: Counter[str] = Counter()
    idle = total = 0
    for raw in path.read_text(errors="replace").splitlines():
        stack, _, count = raw.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        parts = stack.split(";")
        thread = "all"
        if parts and parts[0].startswith(("thread ", "process ")):
            thread = parts[0].split(":", 1)[-1].strip() or parts[0]
            parts = parts[1:]
        frames = [parse_frame(p) for p in parts]
        cat = categorize(frames, crc)
        if cat is None:
            idle += n
            continue
        total += n
        by_cat[cat] += n
        by_thread[re.sub(r"_\d+$", "_N", thread)] += n
        py = [f for f in frames if not f.native]
        if py:
            leaf = py[-1]
            self_lines[f"{leaf.func} ({leaf.file}:{leaf.line})"] += n
    return Summary(total, by_cat, by_thread, self_lines, idle)


def summarize(path: Path, acked: int | None = None, cpu_seconds: float | None = None,
              roots: Iterable[Path] | None = None, top: int = 20) -> Summary:
    here = Path(__file__).resolve().parent.parent
    s = load(path, roots or [here / "broker"])
    if not s.total:
        print(f"profile {path}: no samples")
        return s
    per_msg = cpu_seconds * 1e6 / acked if acked and cpu_seconds else None
    print(f"\nbroker profile {path} ({s.total} busy samples, {s.idle} idle dropped)")
    print("  threads: " + ", ".join(f"{t} {n * 100 / s.total:.1f}%" for t, n in s.by_thread.most_common()))
    head = f"  {'category':<58} {'share':>6}" + (f" {'us/msg':>7}" if per_msg else "")
    print(head)
    for cat, n in s.by_cat.most_common():
        share = n / s.total
        extra = f" {share * per_msg:7.1f}" if per_msg else ""
        print(f"  {cat:<58} {share * 100:5.1f}%{extra}")
    if per_msg:
        print(f"  {'total':<58} {100.0:5.1f}% {per_msg:7.1f}")
    print(f"  top {top} Python lines by self time (C callees included):")
    for line, n in s.self_lines.most_common(top):
        print(f"    {n * 100 / s.total:5.1f}%  {line}")
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("profile", type=Path)
    ap.add_argument("--acked", type=int, help="messages acknowledged in the profiled window")
    ap.add_argument("--cpu-seconds", type=float, help="broker CPU seconds over the profiled window")
    ap.add_argument("--src", type=Path, action="append", help="source root(s) of rmqbroker (default broker/)")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    summarize(args.profile, args.acked, args.cpu_seconds, args.src, args.top)


if __name__ == "__main__":
    main()
