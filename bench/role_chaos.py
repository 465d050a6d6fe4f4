"""Random admin-API sequences against a broker group under sends: promotions, demotions, re-points,
fences, kill -9 and SIGSTOP in any order, then one convergence; checks that the brokers always
answer and always converge to one log.

Three brokers (Direct discovery, ASYNC or SYNC) take a seeded random sequence of steps while two
threads send to every broker in turn (whichever is master stores them). Each step is one of:
promote a broker at the next epoch, demote a master (sometimes with a drain), re-point a slave at
any broker (with or without an epoch), fence a slave, kill -9 and restart a broker, SIGSTOP one for
up to 1.5 s, or pause. Admin answers of 200, 400 and 409 are all legitimate here (a step may be
refused: an older epoch, a re-point of a master); anything else (5xx, a timeout, a dead process) is
a finding.

Then the group is converged as the operator would: the broker that began the newest epoch is
made master again at it, else the one with the longest log at that epoch is promoted at a new one;
every other master is demoted, every slave re-pointed at it. Findings: a slave that does not reach the
master's log end within 30 s, commitlogs that differ (SHA-256 of the segment files), and
``Traceback`` lines in any broker's log.

Not a benchmark of record: the random promotions ignore replication progress, so acknowledged
sends may be lost on purpose; what must hold is answering and converging.

Usage: ``python bench/role_chaos.py [--seeds 1 2 3] [--steps 40] [--mode ASYNC|SYNC]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.helpers import create_topic, send_raw  # noqa: E402
from tests.integration.test_replication import commitlog_bytes  # noqa: E402
from tests.support.procs import BrokerProc  # noqa: E402

TOPIC = "RoleChaos"
OK_CODES = {200, 400, 409}


class Run:
    def __init__(self, workdir: Path, seed: int, mode: str) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.master_role = "SYNC_MASTER" if mode == "SYNC" else "ASYNC_MASTER"
        sync = {"slaveSyncInitialDelay": 300, "slaveSyncInterval": 1000}
        first = BrokerProc(workdir, None, name="broker-c", role=self.master_role, **sync)
        self.brokers = [first]
        for i in (1, 2):
            self.brokers.append(BrokerProc(workdir, None, name="broker-c", broker_id=i, role="SLAVE",
                                           haMasterAddress=ha(first), **sync))
        self.findings: list[str] = []
        self.answers: dict[str, dict[int, int]] = {}
        self.stop = threading.Event()
        self.acked = 0

    # -- helpers --
    def call(self, b: BrokerProc, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        op = path.strip("/").replace("/", "-")
        try:
            code, raw = b.admin(path, "POST", json.dumps(body).encode())
        except OSError as exc:
            self.findings.append(f"seed {self.seed}: {path} {body} to {b.admin_port}: no answer ({exc})")
            return 0, {}
        self.answers.setdefault(op, {}).setdefault(code, 0)
        self.answers[op][code] += 1
        if code not in OK_CODES:
            self.findings.append(f"seed {self.seed}: {path} {body} answered {code}: {raw[:300]!r}")
        try:
            obj: dict[str, Any] = json.loads(raw)
        except ValueError:
            obj = {}
        return code, obj

    def status(self, b: BrokerProc) -> dict[str, Any] | None:
        try:
            code, raw = b.admin("/status")
        except OSError:
            return None
        return json.loads(raw) if code == 200 else None

    def epoch(self) -> int:
        return max((st["epoch"] for b in self.brokers if (st := self.status(b)) is not None), default=0)

    def send_loop(self, k: int) -> None:
        i = 0
        while not self.stop.is_set():
            b = self.brokers[(i + k) % len(self.brokers)]
            i += 1
            try:
                if send_raw(b.addr, TOPIC, f"m-{k}-{i}".encode() * 8).code == 0:
                    self.acked += 1
            except Exception:  # a broker down or stopped: try the next
                time.sleep(0.01)

    # -- steps --
    def step(self) -> str:
        rng = self.rng
        b = rng.choice(self.brokers)
        n = self.brokers.index(b)
        st = self.status(b)
        op = rng.choice(["promote", "demote", "repoint", "repoint", "fence", "kill", "hang", "pause"])
        if op == "kill":
            b.kill9()
            b.start()
            return f"kill -9 and restart broker {n}"
        if op == "hang":
            b.signal(signal.SIGSTOP)
            time.sleep(rng.uniform(0.2, 1.5))
            b.signal(signal.SIGCONT)
            return f"SIGSTOP broker {n}, SIGCONT"
        if op == "pause" or st is None:
            time.sleep(rng.uniform(0.0, 0.5))
            return "pause"
        e = self.epoch()
        if op == "promote":
            code, _ = self.call(b, "/role", {"role": rng.choice(["ASYNC_MASTER", "SYNC_MASTER"]), "brokerId": 0,
                                             "epoch": e + 1})
            return f"promote broker {n} at epoch {e + 1}: {code}"
        if op == "demote":
            body: dict[str, Any] = {"role": "SLAVE", "brokerId": n or 3, "epoch": e}
            if rng.random() < 0.3:
                body["drainMillis"] = rng.choice([0, 200, 1000])
            code, _ = self.call(b, "/role", body)
            return f"demote broker {n} at epoch {e}: {code}"
        if op == "repoint":
            t = rng.choice(self.brokers)
            body = {"haAddress": ha(t), "brokerAddress": t.addr}
            if rng.random() < 0.5:
                body["epoch"] = e
            code, _ = self.call(b, "/ha/master", body)
            return f"re-point broker {n} at broker {self.brokers.index(t)}: {code}"
        code, _ = self.call(b, "/ha/fence", {"epoch": e + 1})
        return f"fence broker {n} below {e + 1}: {code}"

    # -- convergence --
    def converge(self) -> None:
        for b in self.brokers:
            b.signal(signal.SIGCONT)
            if not b.alive:
                self.findings.append(f"seed {self.seed}: broker {self.brokers.index(b)} died:\n{b.log_text()[-2000:]}")
                b.start()
        sts = [self.status(b) for b in self.brokers]
        if any(st is None for st in sts):
            self.findings.append(f"seed {self.seed}: a broker has no /status before convergence")
            return
        e = max(st["epoch"] for st in sts if st)  # type: ignore[index]
        owners = [i for i, st in enumerate(sts) if st and st["epoch"] == e and st["ownEpoch"] == e]
        if owners:
            best = owners[0]  # it holds the term's log: master again at its own epoch (a retry)
        else:
            best = max(range(3), key=lambda i: (sts[i]["epoch"], sts[i]["maxPhyOffset"]))  # type: ignore[index]
            e += 1
        m = self.brokers[best]
        st_m = sts[best]
        assert st_m is not None
        if st_m["role"] == "SLAVE" or st_m["termFenced"] or not owners:
            code, body = self.call(m, "/role", {"role": self.master_role, "brokerId": 0, "epoch": e})
            if code != 200:
                self.findings.append(f"seed {self.seed}: convergence promotion refused: {code} {body}")
                return
        for i, b in enumerate(self.brokers):
            if b is m:
                continue
            if sts[i]["role"] != "SLAVE":  # type: ignore[index]
                self.call(b, "/role", {"role": "SLAVE", "brokerId": i or 3, "epoch": e})
            code, body = self.call(b, "/ha/master", {"haAddress": ha(m), "brokerAddress": m.addr, "epoch": e})
            if code != 200:
                self.findings.append(f"seed {self.seed}: convergence re-point of broker {i} refused: {code} {body}")
        deadline = time.monotonic() + 30
        end = -1
        while time.monotonic() < deadline:
            ms = self.status(m)
            end = ms["maxPhyOffset"] if ms else -1
            offs = [(st or {}).get("maxPhyOffset") for st in (self.status(b) for b in self.brokers)]
            if all(o == end for o in offs):
                break
            time.sleep(0.2)
        else:
            detail = {}
            for i, b in enumerate(self.brokers):
                st = self.status(b) or {}
                detail[i] = {k: st.get("ha", {}).get(k) for k in
                             ("connected", "aheadOfMasterBytes", "refusedStreams", "truncatedBytes")}
                detail[i]["max"] = st.get("maxPhyOffset")
            self.findings.append(f"seed {self.seed}: not converged in 30 s (master broker {best}, end {end}): {detail}")
            return
        digests = {i: digest(b, end) for i, b in enumerate(self.brokers)}
        if len(set(digests.values())) != 1:
            self.findings.append(f"seed {self.seed}: logs differ up to {end}: {digests}")
        print(f"seed {self.seed}: {self.acked} sends acknowledged; converged on broker {best} at epoch {e}, "
              f"{end} bytes, logs identical: "
              f"{len(set(digests.values())) == 1}", flush=True)

    def run(self, steps: int) -> None:
        for b in self.brokers:
            b.start()
        create_topic(self.brokers[0].addr, TOPIC, queues=4)
        time.sleep(1.5)  # the slaves' first metadata round brings them the topic
        senders = [threading.Thread(target=self.send_loop, args=(k,), daemon=True) for k in range(2)]
        for t in senders:
            t.start()
        try:
            for i in range(steps):
                what = self.step()
                print(f"seed {self.seed} step {i:2d}: {what}", flush=True)
            self.stop.set()
            for t in senders:
                t.join(30)
            self.converge()
        finally:
            self.stop.set()
            for b in self.brokers:
                b.stop()
            for i, b in enumerate(self.brokers):
                tb = [line for line in b.log_text().splitlines() if "Traceback" in line or " ERROR " in line]
                if any("Traceback" in line for line in tb):
                    self.findings.append(f"seed {self.seed}: broker {i} logged a traceback:\n{b.log_text()[-3000:]}")
                for line in tb[:5]:
                    print(f"  broker {i}: {line[:200]}")


def ha(b: BrokerProc) -> str:
    return f"127.0.0.1:{b.conf['haListenPort']}"


def digest(b: BrokerProc, end: int) -> str:
    return hashlib.sha256(commitlog_bytes(b.store_dir, end)).hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--mode", choices=["ASYNC", "SYNC"], default="ASYNC")
    args = ap.parse_args()
    findings: list[str] = []
    answers: dict[str, dict[int, int]] = {}
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="role-chaos-") as tmp:
            r = Run(Path(tmp), seed, args.mode)
            r.run(args.steps)
            findings += r.findings
            for op, codes in r.answers.items():
                for code, count in codes.items():
                    answers.setdefault(op, {}).setdefault(code, 0)
                    answers[op][code] += count
    print(json.dumps({"mode": args.mode, "seeds": args.seeds, "steps": args.steps, "answers": answers,
                      "findings": len(findings)}, indent=1))
    for f in findings:
        print("FINDING:", f)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
