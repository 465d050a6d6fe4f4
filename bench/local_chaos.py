"""Chaos for the local group's supervisor: rmq-local under a stream of SYNC sends while its brokers are
stopped, killed and resumed, checked for lost acknowledged messages and divergent logs.

``rmq-local up`` runs a SYNC group of three brokers with ``masterLostSeconds`` of ``--lost``. Sender
threads send one message after another to whichever broker ``state.json`` names master, and record
the keys the broker acknowledged. Each round does one of, in turn:

- ``hang``: SIGSTOP the master until a slave is promoted, then SIGCONT it (it must be demoted and
  follow, truncating what it stored but never had acknowledged);
- ``kill-master``: SIGKILL the master (rmq-local starts it again; no failover is expected);
- ``kill-slave``: SIGKILL a slave (started again, it catches up);
- ``wipe-master`` / ``wipe-slave`` (only with ``--actions``): stop the broker, delete its store and
  SIGKILL it, so it starts again empty (a lost disk). A master must be replaced at once by a slave
  holding the group's log; a slave copies the log from zero.

At the end, with the group settled, every broker must hold the same commitlog (SHA-256 of the
bytes from the admin endpoint's ``/commitlog``) and the stock C++ PullConsumer must read every
acknowledged key through the nameserver.

Usage: ``python bench/local_chaos.py [--rounds 9] [--lost 3] [--senders 4] [--actions hang wipe-master ...]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.helpers import create_topic, poll, pull_all, send_raw  # noqa: E402
from tests.support.procs import free_port_block  # noqa: E402

from rmqbroker.remoting.codes import ResponseCode  # noqa: E402

TOPIC = "ChaosTopic"


class Group:
    def __init__(self, data_dir: Path, base: int) -> None:
        self.data_dir, self.base = data_dir, base

    @property
    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads((self.data_dir / "state.json").read_text())
        return result

    @property
    def token(self) -> str:
        return (self.data_dir / "admin-token").read_text().strip()

    def master(self) -> int:
        return next(int(o) for o, b in self.state["assignment"].items() if b == 0)

    def pid(self, ordinal: int) -> int:
        result: int = self.state["brokers"][ordinal]["pid"]
        return result

    def addr(self, ordinal: int) -> str:
        return f"127.0.0.1:{self.base + 10 * ordinal}"

    def admin(self, ordinal: int, path: str) -> bytes:
        req = urllib.request.Request(f"http://127.0.0.1:{self.base + 10 * ordinal + 5}{path}",
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            data: bytes = r.read()
            return data

    def status(self, ordinal: int) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = json.loads(self.admin(ordinal, "/status"))
            return result
        except OSError:
            return None

    def settled(self) -> list[dict[str, Any]] | None:
        """Every broker up, one master, the others connected to it and at least where it was.

        The senders keep sending: the slaves are read after the master and compared with the
        offset it had then (equal offsets read one after the other held only when no send came in
        between, so a busy group looked unsettled for tens of seconds)."""
        sts = [self.status(o) for o in range(3)]
        if any(s is None for s in sts):
            return None
        masters = [o for o, s in enumerate(sts) if s is not None and s["role"] == "SYNC_MASTER"]
        if len(masters) != 1:
            return None
        m = sts[masters[0]]
        slaves = [self.status(o) for o in range(3) if o != masters[0]]
        assert m is not None
        ok = all(s is not None and s["role"] == "SLAVE" and s["ha"]["connected"]
                 and s["maxPhyOffset"] >= m["maxPhyOffset"] for s in slaves)
        return [m, *(s for s in slaves if s is not None)] if ok else None


class Sender(threading.Thread):
    def __init__(self, group: Group, n: int) -> None:
        super().__init__(daemon=True)
        self.group, self.n = group, n
        self.acked: list[str] = []
        self.failed = 0
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            key = f"s{self.n}-{i}"
            i += 1
            try:
                resp = send_raw(self.group.addr(self.group.master()), TOPIC, key.encode(), timeout=3.0,
                                properties=f"WAIT\x01true\x02KEYS\x01{key}\x02")
                if resp.code == ResponseCode.SUCCESS:
                    self.acked.append(key)
                else:
                    self.failed += 1
                    time.sleep(0.05)
            except Exception:
                self.failed += 1
                time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--lost", type=int, default=3, help="masterLostSeconds")
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--pause", type=float, default=4.0, help="seconds of traffic between rounds")
    ap.add_argument("--actions", nargs="+", default=["hang", "kill-slave", "kill-master"],
                    choices=["hang", "kill-slave", "kill-master", "wipe-master", "wipe-slave"],
                    help="the rounds' actions, taken in turn")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="local-chaos-"))
    manifest = work / "bg.yaml"
    manifest.write_text("kind: BrokerGroup\nmetadata: {name: chaos}\nspec:\n  replicas: 3\n  replication: SYNC\n"
                        f"  failover: {{masterLostSeconds: {args.lost}}}\n"
                        "  brokerConfig: {mappedFileSizeCommitLog: '16777216', defaultTopicQueueNums: '4'}\n")
    base = free_port_block(40) + 2
    namesrv = f"127.0.0.1:{base + 35}"
    data_dir = work / "data"
    up = subprocess.Popen([sys.executable, "-m", "rmqbroker.local", "up", str(manifest), "--data-dir", str(data_dir),
                           "--base-port", str(base), "--namesrv-port", str(base + 35)],
                          stdout=open(work / "rmq-local.out", "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
    g = Group(data_dir, base)
    senders: list[Sender] = []
    t0 = time.monotonic()
    try:
        poll((data_dir / "state.json").exists, 60, 0.2, what="group up")
        poll(g.settled, 60, 0.3, what="group settled")
        create_topic(g.addr(g.master()), TOPIC, 4)
        senders = [Sender(g, n) for n in range(args.senders)]
        for s in senders:
            s.start()
        actions = args.actions
        for r in range(args.rounds):
            time.sleep(args.pause)
            action = actions[r % len(actions)]
            m = g.master()
            start = time.monotonic()
            if action == "hang":
                pid = g.pid(m)
                os.kill(pid, signal.SIGSTOP)
                try:
                    poll(lambda m=m: g.master() != m, 60, 0.2, what="a slave promoted")
                finally:
                    os.kill(pid, signal.SIGCONT)
                note = f"broker-{m} hung; broker-{g.master()} promoted after {time.monotonic() - start:.1f}s"
            elif action == "kill-master":
                os.kill(g.pid(m), signal.SIGKILL)
                note = f"broker-{m} (master) killed"
            elif action in ("wipe-master", "wipe-slave"):
                victim = m if action == "wipe-master" else (m + 1 + r % 2) % 3
                pid = g.pid(victim)
                os.kill(pid, signal.SIGSTOP)
                shutil.rmtree(data_dir / f"broker-{victim}" / "store")
                os.kill(pid, signal.SIGKILL)
                if action == "wipe-master":
                    poll(lambda m=m: g.master() != m, 60, 0.2, what="a slave promoted")
                    note = (f"broker-{m} (master) back without its store; broker-{g.master()} promoted after "
                            f"{time.monotonic() - start:.1f}s")
                else:
                    note = f"broker-{victim} (slave) back without its store"
            else:
                victim = (m + 1 + r % 2) % 3
                os.kill(g.pid(victim), signal.SIGKILL)
                note = f"broker-{victim} (slave) killed"
            poll(g.settled, 90, 0.3, what=f"settled after {action}")
            acked = sum(len(s.acked) for s in senders)
            print(f"round {r + 1} {action:<11} {note}; settled after {time.monotonic() - start:.1f}s; "
                  f"epoch {g.state['epoch']}, {acked} acked so far", flush=True)
        time.sleep(args.pause)
        for s in senders:
            s.stop.set()
        for s in senders:
            s.join(10)
        sts = poll(g.settled, 90, 0.3, what="final settle")
        end = sts[0]["maxPhyOffset"]
        digests = {o: hashlib.sha256(g.admin(o, f"/commitlog?offset=0&length={end}")).hexdigest() for o in range(3)}
        acked = {k for s in senders for k in s.acked}
        failed = sum(s.failed for s in senders)
        consumed = {m["keys"] for m in pull_all(namesrv, TOPIC, group="CG_CHAOS", timeout=120)}
        missing = acked - consumed
        restarts = {b["name"]: b["restarts"] for b in g.state["brokers"]}
        print(json.dumps({"rounds": args.rounds, "seconds": round(time.monotonic() - t0, 1),
                          "epoch": g.state["epoch"], "restarts": restarts, "acked": len(acked),
                          "failedSends": failed, "consumedDistinct": len(consumed), "missing": len(missing),
                          "commitlogBytes": end, "identicalLogs": len(set(digests.values())) == 1}, indent=1))
        if missing or len(set(digests.values())) != 1:
            print(f"FAILED: missing {sorted(missing)[:10]}, digests {digests}; logs in {work}")
            raise SystemExit(1)
    finally:
        for s in senders:
            s.stop.set()
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()


if __name__ == "__main__":
    main()
