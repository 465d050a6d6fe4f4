"""Soak: a broker group under steady stock-client traffic and client churn for many minutes, watched
for growth that would take a long-running process down (leaks of memory, descriptors or threads).

A nameserver, a master (``--role``) and one slave run as real processes on loopback. ``--producers``
C++ producers send ``--rate`` messages/s in all and a C++ PushConsumer group consumes them; every
client is replaced every ``--churn`` seconds (``bench/soak_clients.py``), so the brokers and the
nameserver register, heartbeat and forget clients all along. Every ``--interval`` seconds the
benchmark samples each server process: anonymous resident memory (``RssAnon``: the Python heap;
mapped store files are file-backed and not in it), open descriptors and threads.

It prints, per process, memory at the end of the warm-up, at the end and its peak, and the slope of
a least-squares line through the second half of the samples (KiB per minute: a leak keeps growing
while a warm-up cache flattens out), with the descriptor and thread ranges; and for the traffic,
sends acknowledged and failed, messages consumed (deliveries and distinct keys: after the
producers stop, the consumer must see every acknowledged message), and whether the slave ended byte for byte where
the master did. ``--kill slave|master --kill-every S`` also SIGKILLs that broker every S seconds
and restarts it on its store: each time it must recover its store and the stream must resume
(sends meanwhile fail or, on a SYNC_MASTER without its slave, get SLAVE_NOT_AVAILABLE; the
stock C++ client raises for both, and they are counted as send errors).

Usage: ``python bench/soak_bench.py [--minutes 10] [--rate 600] [--role SYNC_MASTER]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.helpers import create_topic_and_wait, poll  # noqa: E402
from tests.support.procs import PY, BrokerProc, Namesrv  # noqa: E402

TOPIC = "SoakTopic"


def proc_sample(pid: int) -> tuple[int, int, int]:
    """(RssAnon KiB, open descriptors, threads) of a live process."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    den = sum((t - mx) ** 2 for t, _ in points)
    return 60.0 * sum((t - mx) * (v - my) for t, v in points) / den if den else float("nan")


def commitlog_digest(store: Path, end: int) -> str:
    """SHA-256 of the commitlog [0, end), read from the segment files."""
    digest = hashlib.sha256()
    for f in sorted((store / "commitlog").iterdir()):
        start = int(f.name)
        if start >= end:
            break
        left = end - start
        with open(f, "rb") as fh:
            while left > 0:
                chunk = fh.read(min(left, 8 << 20))
                if not chunk:
                    break
                digest.update(chunk)
                left -= len(chunk)
    return digest.hexdigest()


@dataclass
class Client:
    """One soak_clients.py process; ``last`` is its newest totals line."""

    popen: subprocess.Popen[bytes]
    last: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, args: list[str], log: Path) -> Client:
        popen = subprocess.Popen([PY, str(ROOT / "bench" / "soak_clients.py"), *args], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=open(log, "wb"),  # noqa: SIM115 - child owns it
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        client = cls(popen)
        threading.Thread(target=client._read, daemon=True).start()
        return client

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            try:
                self.last = json.loads(raw)
            except ValueError:
                continue

    def stop(self, timeout: float = 30.0) -> None:
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            self.popen.stdin.close()
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)


def soak(work: Path, minutes: float, rate: float, producers: int, role: str, churn: float,
         interval: float, warmup: float, kill: str = "slave", kill_every: float = 0.0) -> dict[str, Any]:
    ns = Namesrv(work).start()
    # RocketMQ's default file sizes: descriptors then grow only when something leaks them.
    sizes: dict[str, Any] = {"mappedFileSizeCommitLog": 1024 ** 3, "mappedFileSizeConsumeQueue": 6_000_000}
    master = BrokerProc(work, ns.addr, role=role, **sizes)
    master.start()
    slave = BrokerProc(work, ns.addr, broker_id=1, role="SLAVE",
                       haMasterAddress=f"127.0.0.1:{master.conf['haListenPort']}", **sizes)
    slave.start()
    clients: list[Client] = []
    procs = {"namesrv": ns, "master": master, "slave": slave}
    samples: dict[str, list[tuple[float, int, int, int]]] = {name: [] for name in procs}
    try:
        create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=4)
        for i in range(producers):
            clients.append(Client.start(["produce", "--namesrv", ns.addr, "--topic", TOPIC, "--rate",
                                         str(rate / producers), "--churn", str(churn), "--index", str(i)],
                                        work / f"producer-{i}.stderr"))
        consumer = Client.start(["consume", "--namesrv", ns.addr, "--topic", TOPIC, "--churn", str(churn)],
                                work / "consumer.stderr")
        clients.append(consumer)
        t0 = time.monotonic()
        end = t0 + minutes * 60
        kills = 0
        next_kill = t0 + kill_every if kill_every else float("inf")
        print(f"[soak] {role} + SLAVE, {producers} producers at {rate:.0f} msg/s in all, clients replaced "
              f"every {churn:.0f} s, {minutes:.1f} min"
              + (f", {kill} SIGKILLed every {kill_every:.0f} s" if kill_every else ""), flush=True)
        next_sample = t0 + interval
        while time.monotonic() < end:
            time.sleep(max(0.0, min(next_sample, next_kill) - time.monotonic()))
            if time.monotonic() >= next_kill:
                # A crash mid-stream, then a restart on the same store: it must recover and resume.
                victim = slave if kill == "slave" else master
                victim.kill9()
                time.sleep(1.0)
                victim.start()
                kills += 1
                next_kill += kill_every
                continue
            next_sample += interval
            t = time.monotonic() - t0
            row = []
            for name, p in procs.items():
                if not p.alive:
                    raise RuntimeError(f"{name} exited:\n{p.log_text()[-3000:]}")
                assert p.popen is not None
                rss, fds, threads = proc_sample(p.popen.pid)
                samples[name].append((t, rss, fds, threads))
                row.append(f"{name} {rss / 1024:.1f} MiB {fds} fd {threads} thr")
            sent = sum(c.last.get("ok", 0) for c in clients[:-1])
            print(f"[soak] {t:6.0f}s  " + "  ".join(row) + f"  sent {sent} consumed {consumer.last.get('ok', 0)}",
                  flush=True)
        for c in clients[:-1]:
            c.stop()
        sent_ok = sum(c.last.get("ok", 0) for c in clients[:-1])
        drained = True
        try:
            poll(lambda: consumer.last.get("distinct", 0) >= sent_ok or None, 120, what="consumer drained")
        except TimeoutError:
            drained = False
        consumer.stop()
        target = master.status()["maxPhyOffset"]
        caught_up = True
        try:
            poll(lambda: slave.status()["maxPhyOffset"] == target or None, 60, what="slave caught up")
        except TimeoutError:
            caught_up = False
        report: dict[str, Any] = {"role": role, "minutes": minutes, "rate": rate, "producers": producers,
                                  "churn_s": churn, "killed": kill if kill_every else None, "kills": kills,
                                  "processes": {}}
        for name, rows in samples.items():
            after = [r for r in rows if r[0] >= warmup] or rows
            half = [r for r in after if r[0] >= (after[0][0] + after[-1][0]) / 2]
            report["processes"][name] = {
                "rss_anon_mib_after_warmup": round(after[0][1] / 1024, 1),
                "rss_anon_mib_end": round(after[-1][1] / 1024, 1),
                "rss_anon_mib_peak": round(max(r[1] for r in after) / 1024, 1),
                "rss_anon_kib_per_min_second_half": round(slope_per_minute([(r[0], r[1]) for r in half]), 1),
                "fds": [min(r[2] for r in after), max(r[2] for r in after), after[-1][2]],
                "threads": [min(r[3] for r in after), max(r[3] for r in after), after[-1][3]],
            }
        report["sent_ok"] = sent_ok
        report["send_errors"] = sum(c.last.get("errors", 0) for c in clients[:-1])
        report["send_last_error"] = next((c.last["last_error"] for c in clients[:-1] if c.last.get("last_error")), "")
        report["consumed"] = consumer.last.get("ok", 0)
        report["consumed_distinct"] = consumer.last.get("distinct", 0)
        report["all_consumed"] = drained
        report["client_instances"] = sum(c.last.get("clients", 0) for c in clients)
        report["slave_caught_up"] = caught_up
        report["slave_commitlog_identical"] = caught_up and (
            commitlog_digest(master.store_dir, target) == commitlog_digest(slave.store_dir, target))
        report["master_max_offset"] = target
        return report
    finally:
        for c in clients:
            if c.popen.poll() is None:
                c.popen.kill()
        slave.stop()
        master.stop()
        ns.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=600.0, help="messages/s, all producers together")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--role", choices=("ASYNC_MASTER", "SYNC_MASTER"), default="SYNC_MASTER")
    parser.add_argument("--churn", type=float, default=30.0, help="seconds each client instance lives")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds left out of the figures")
    parser.add_argument("--kill", choices=("slave", "master"), default="slave", help="which broker --kill-every kills")
    parser.add_argument("--kill-every", type=float, default=0.0,
                        help="SIGKILL and restart a broker this often (s; 0: never); its memory figures "
                             "then describe its last life only")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, stores)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rmq-soak-"))
    try:
        report = soak(work, args.minutes, args.rate, args.producers, args.role, args.churn, args.interval,
                      args.warmup, args.kill, args.kill_every)
    finally:
        if not args.keep:
            subprocess.run(["rm", "-rf", str(work)], check=False)
        else:
            print(f"[soak] work directory kept: {work}")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
