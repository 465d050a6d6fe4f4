"""Chaos for the operator: the real kopf operator against the emulated Kubernetes API, three real
broker processes as pods, a stream of sends, and a seeded random sequence of disruptions; checks
that the group always converges to one log and, where it must, loses no acknowledged send.

The group is the tests' group of three (SYNC or ASYNC, ``failover.masterLostSeconds`` of ``--lost``,
``masterDiscovery`` of ``--discovery``); three sender threads send one message after another to whichever broker
``status.masterAddress`` names, and record the keys acknowledged. Each step is one of:

- ``kill-master`` / ``kill-slave``: SIGKILL the pod's container, keep it down for a while, then let the
  "kubelet" start it again (a master sometimes with its stale ConfigMap, as a kubelet may);
- ``hang-master`` / ``hang-slave``: SIGSTOP the container for a while (past ``masterLostSeconds``
  sometimes), then SIGCONT;
- ``delete-pod``: delete a broker pod through the API (it comes back with a new IP);
- ``switchover``: the ``switchover-to`` annotation naming a random broker;
- ``roll``: the ``restart-at`` annotation (hand-over of the master, every pod restarted);
- ``operator-restart``: stop kopf, wait, start it again;
- ``scale``: ``spec.replicas`` 3 -> 4, until the fourth broker is in sync (or 60 s), then back to 3;
- ``kill-namesrv``: SIGKILL the nameserver pod's container for a while (slaves in ``NameServer``
  discovery learn their master from it);
- ``pause``.
After each step the run waits (up to ``--settle`` seconds) for the group to converge, or, one step in
three, goes straight on, so disruptions overlap.

At the end every container runs, and the group must converge (Ready, three in sync, not failing
over) within 180 s. Findings: no convergence; slaves whose commitlog differs from the master's
(SHA-256 of ``/commitlog`` from each admin endpoint up to the master's end); acknowledged keys the
stock C++ PullConsumer cannot read afterwards (under SYNC always a finding; under ASYNC only when
no failover happened, since an ASYNC failover may lose what no slave had); ``Traceback`` in any
broker log; errors logged by the operator.

Usage: ``python bench/operator_chaos.py [--seeds 1 2 3] [--steps 12] [--replication SYNC|ASYNC]
[--discovery Direct|NameServer]``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.helpers import poll, pull_all, route  # noqa: E402
from tests.operator.emulator import GROUP, OperatorHarness, condition  # noqa: E402
from tests.operator.podrunner import PodRunner, ProcessBackend  # noqa: E402
from tests.operator.test_e2e_failover import (  # noqa: E402
    NAME,
    TOPIC,
    MasterLookup,
    Sender,
    group_of_three,
    group_status,
)

from rmqbroker.remoting.client import RemotingError  # noqa: E402

PODS = [f"{NAME}-{i}" for i in range(3)]
STEPS = ("kill-master", "kill-slave", "hang-master", "hang-slave", "delete-pod", "switchover", "roll",
         "operator-restart", "kill-namesrv", "scale", "pause")
# Not in the default mix (seeds recorded in RESULTS keep their sequences): take them with --kinds.
EXTRA_STEPS = ("wipe-master", "wipe-slave")
NAMESRV = f"{NAME}-namesrv-0"


class ErrorLog(logging.Handler):
    """Operator log records at ERROR or above (the operator's own, its handlers' failures in kopf,
    and asyncio's reports of unclosed sessions)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        # kopf's own machinery (its API observers retrying while it stops) is not the operator's.
        if record.name.startswith(("rmqoperator", "kopf.objects", "asyncio")):
            self.records.append(f"{record.name}: {record.getMessage()[:300]}")


class Run:
    def __init__(self, workdir: Path, seed: int, replication: str, lost: int, settle: float,
                 discovery: str = "Direct", kinds: tuple[str, ...] = STEPS) -> None:
        self.rng = random.Random(seed)
        self.kinds = kinds
        self.replication = replication
        self.discovery = discovery
        self.lost = lost
        self.settle = settle
        self.workdir = workdir
        self.h = OperatorHarness(workdir, poll_seconds=0.3)
        self.h.handover_settle = 2.0
        self.backend = ProcessBackend(workdir)
        self.runner: PodRunner | None = None
        self.log: list[str] = []
        self.token: str | None = None  # the admin token, from the Secret the operator created

    # -- helpers --
    def status(self) -> dict[str, Any]:
        return group_status(self.h)

    def master(self) -> str | None:
        m = self.status().get("master")
        return str(m) if m else None

    def converged(self) -> dict[str, Any] | None:
        g = self.h.client.group(NAME)
        st = (g or {}).get("status") or {}
        rows = {r.get("pod"): r for r in st.get("replicas") or []}
        master = st.get("master")
        ok = (master in rows and st.get("inSyncReplicas") == 3 and st.get("readyReplicas") == 3
              and condition(g, "Ready").get("status") == "True"
              and condition(g, "FailingOver").get("status") == "False"
              and not (st.get("rolling") or {}).get("pending")
              and str(rows[master].get("role", "")).endswith("MASTER")
              and sum(1 for r in rows.values() if str(r.get("role", "")).endswith("MASTER")) == 1)
        return st if ok else None

    def wait_converged(self, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                st = self.converged()
                if st is not None:
                    return st
            time.sleep(0.3)
        return None

    def pid(self, pod: str) -> int | None:
        assert self.runner is not None
        c = self.runner.container(pod)
        if c is None or c.exited:
            return None
        return int(c.handle.popen.pid)

    def send_signal(self, pod: str, sig: int) -> None:
        pid = self.pid(pod)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def pick(self, role: str) -> str:
        master = self.master() or PODS[0]
        if role == "master":
            return master
        return self.rng.choice([p for p in PODS if p != master])

    # -- steps --
    def step(self) -> str:
        assert self.runner is not None
        kind = self.rng.choice(self.kinds)
        rng = self.rng
        if kind in ("kill-master", "kill-slave", "wipe-master", "wipe-slave"):
            pod = self.pick(kind.split("-")[1])
            down = rng.uniform(0.5, self.lost + 4)
            stale = kind == "kill-master" and rng.random() < 0.5
            self.runner.kill(pod)
            if kind.startswith("wipe"):
                # A lost volume: the node died with its local disk, the pod comes back on an empty claim.
                self.runner.wipe(pod)
            time.sleep(down)
            self.runner.restart(pod, stale_config=stale)
            return f"{kind} {pod} down {down:.1f}s{' stale config' if stale else ''}"
        if kind in ("hang-master", "hang-slave"):
            pod = self.pick(kind.split("-")[1])
            hang = rng.uniform(0.5, self.lost + 5)
            self.send_signal(pod, signal.SIGSTOP)
            time.sleep(hang)
            self.send_signal(pod, signal.SIGCONT)
            return f"{kind} {pod} {hang:.1f}s"
        if kind == "delete-pod":
            pod = rng.choice(PODS)
            self.h.client.delete("v1", "pods", pod)
            return f"delete-pod {pod}"
        if kind == "switchover":
            pod = rng.choice(PODS)
            self.h.client.patch_group(NAME, {"metadata": {"annotations": {f"{GROUP}/switchover-to": pod}}})
            return f"switchover-to {pod}"
        if kind == "roll":
            stamp = f"chaos-{time.time_ns()}"
            self.h.client.patch_group(NAME, {"metadata": {"annotations": {f"{GROUP}/restart-at": stamp}}})
            return "roll"
        if kind == "scale":
            t0 = time.monotonic()
            self.h.client.patch_group(NAME, {"spec": {"replicas": 4}})
            deadline = t0 + 60
            while time.monotonic() < deadline and self.status().get("inSyncReplicas") != 4:
                time.sleep(0.3)
            up = time.monotonic() - t0
            in_sync = self.status().get("inSyncReplicas")
            self.h.client.patch_group(NAME, {"spec": {"replicas": 3}})
            return f"scale 3 -> 4 ({in_sync} in sync after {up:.1f}s) -> 3"
        if kind == "kill-namesrv":
            down = rng.uniform(0.5, 8)
            self.runner.kill(NAMESRV)
            time.sleep(down)
            self.runner.restart(NAMESRV)
            return f"kill-namesrv down {down:.1f}s"
        if kind == "operator-restart":
            down = rng.uniform(0, 4)
            self.h.stop_operator()
            time.sleep(down)
            self.h.start_operator()
            return f"operator-restart down {down:.1f}s"
        pause = rng.uniform(1, 5)
        time.sleep(pause)
        return f"pause {pause:.1f}s"

    # -- checks --
    def admin_get(self, pod: str, path: str, timeout: float = 30) -> bytes:
        assert self.runner is not None
        if self.token is None:
            secret = self.h.client.get("v1", "secrets", f"{NAME}-admin-token") or {}
            self.token = base64.b64decode(secret["data"]["token"]).decode().strip()
        req = urllib.request.Request(f"http://{self.runner.ip_of(pod)}:10916{path}",
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return bytes(r.read())

    def digests(self) -> tuple[int, dict[str, str]]:
        st = {p: json.loads(self.admin_get(p, "/status")) for p in PODS}
        master = next(p for p in PODS if str(st[p]["role"]).endswith("MASTER"))
        end = int(st[master]["maxPhyOffset"])
        # A slave reaches the master's end within moments of the senders stopping.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            st = {p: json.loads(self.admin_get(p, "/status")) for p in PODS}
            if all(int(s["maxPhyOffset"]) == end for s in st.values()):
                break
            time.sleep(0.3)
        return end, {p: hashlib.sha256(self.admin_get(p, f"/commitlog?offset=0&length={end}")).hexdigest()[:16]
                     for p in PODS}

    def tracebacks(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for pod, paths in self.backend.logs.items():
            n = sum(p.read_text(errors="replace").count("Traceback") for p in paths if p.exists())
            if n:
                out[pod] = n
        return out

    # -- the run --
    def run(self, steps: int) -> dict[str, Any]:
        errors = ErrorLog()
        logging.getLogger().addHandler(errors)
        findings: list[str] = []
        senders: list[Sender] = []
        try:
            self.h.start_operator()
            self.runner = PodRunner(self.h.client, self.workdir, self.backend).start()
            group_of_three(self.h, self.lost, self.replication, self.discovery)
            if self.wait_converged(90) is None:
                raise RuntimeError(f"the group did not start: {json.dumps(self.status())[:1000]}")
            lookup = MasterLookup(self.h)
            senders = [Sender(lookup, prefix=f"c{n}-") for n in range(3)]
            for s in senders:
                s.start()
            time.sleep(2)
            for i in range(steps):
                t0 = time.monotonic()
                what = self.step()
                waited = ""
                if self.rng.random() < 2 / 3:
                    st = self.wait_converged(self.settle)
                    waited = f", converged on {st['master']}" if st else ", not converged yet"
                acked = sum(len(s.acked) for s in senders)
                line = f"step {i}: {what} ({time.monotonic() - t0:.1f}s{waited}; {acked} acked)"
                print(line, flush=True)
                self.log.append(line)
            for s in senders:
                s.stop.set()
            for s in senders:
                s.join(10)
            for pod in PODS:
                self.send_signal(pod, signal.SIGCONT)
                self.runner.restart(pod)
            self.runner.restart(NAMESRV)
            st = self.wait_converged(180)
            if st is None:
                findings.append(f"no convergence in 180 s: {json.dumps(self.status())[:1500]}")
                return self.report(findings, senders, errors)
            for _ in range(10):  # a pod the roll restarts meanwhile does not answer for a moment
                try:
                    end, digests = self.digests()
                    break
                except OSError:
                    time.sleep(2)
                    st = self.wait_converged(60) or st
            else:
                findings.append("the brokers' admin endpoints did not answer after convergence")
                return self.report(findings, senders, errors)
            master = str(st["master"])
            for pod, d in digests.items():
                if d != digests[master]:
                    findings.append(f"{pod}'s commitlog differs from the master's ({master}) up to {end}")
            acked = {k for s in senders for k in s.acked}
            namesrv = f"{self.runner.ip_of(NAMESRV)}:9876"

            def route_when_up() -> dict[str, Any] | None:
                try:
                    return route(namesrv, TOPIC)
                except RemotingError:  # a nameserver killed by the last step may not be back yet
                    return None

            try:
                poll(route_when_up, 60, 0.5, what=f"route of {TOPIC}")
            except TimeoutError:
                findings.append("the nameserver has no route for the topic 60 s after convergence")
                return self.report(findings, senders, errors)
            consumed = {m["keys"] for m in pull_all(namesrv, TOPIC, group=f"CG_CHAOS_{time.time_ns()}",
                                                    timeout=180)}
            missing = acked - consumed
            promoted = [e["message"] for e in self.h.client.events("Promoted")]
            if missing and (self.replication == "SYNC" or not promoted):
                findings.append(f"{len(missing)} of {len(acked)} acknowledged sends missing: {sorted(missing)[:8]}")
            return self.report(findings, senders, errors, end=end, missing=len(missing), promoted=promoted,
                               missingRuns=runs(missing)[:20])
        finally:
            logging.getLogger().removeHandler(errors)
            for pod in PODS:
                self.send_signal(pod, signal.SIGCONT)
            for s in senders:
                s.stop.set()
            if self.runner is not None:
                self.runner.close()
            self.h.close()

    def report(self, findings: list[str], senders: list[Sender], errors: ErrorLog, **extra: Any) -> dict[str, Any]:
        tb = self.tracebacks()
        if tb:
            findings.append(f"Traceback in broker logs: {tb}")
        if errors.records:
            findings.append(f"{len(errors.records)} operator errors, first: {errors.records[:3]}")
        reasons: dict[str, int] = {}
        for e in self.h.client.events():
            reasons[e["reason"]] = reasons.get(e["reason"], 0) + 1
        return {"acked": sum(len(s.acked) for s in senders), "failedSends": sum(s.failed for s in senders),
                "events": reasons, "epoch": self.status().get("epoch"), **extra, "findings": findings}


def runs(keys: set[str]) -> list[str]:
    """``prefix first-last`` for each run of consecutive sends among ``keys`` (``c0-17`` ...)."""
    by_prefix: dict[str, list[int]] = {}
    for k in keys:
        prefix, _, n = k.rpartition("-")
        by_prefix.setdefault(prefix, []).append(int(n))
    out = []
    for prefix, ns in sorted(by_prefix.items()):
        ns.sort()
        start = prev = ns[0]
        for n in [*ns[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            out.append(f"{prefix}-{start}..{prev}")
            if n is not None:
                start = prev = n
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--replication", choices=("SYNC", "ASYNC"), default="SYNC")
    ap.add_argument("--lost", type=int, default=3, help="failover.masterLostSeconds")
    ap.add_argument("--discovery", choices=("Direct", "NameServer"), default="Direct", help="spec.masterDiscovery")
    ap.add_argument("--settle", type=float, default=45, help="seconds to wait for convergence after a step")
    ap.add_argument("--kinds", nargs="+", choices=STEPS + EXTRA_STEPS, default=list(STEPS),
                    help="the steps to choose from (default: all but the wipe steps)")
    ap.add_argument("--keep", action="store_true", help="keep each run's folder (pod logs, stores)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failed = 0
    for seed in args.seeds:
        workdir = Path(tempfile.mkdtemp(prefix=f"opchaos-{seed}-"))
        print(f"== seed {seed} ({args.replication}, {args.discovery}, masterLostSeconds {args.lost}) in {workdir}",
              flush=True)
        t0 = time.monotonic()
        result = Run(workdir, seed, args.replication, args.lost, args.settle, args.discovery,
                     tuple(args.kinds)).run(args.steps)
        result["seconds"] = round(time.monotonic() - t0, 1)
        print(json.dumps({"seed": seed, **result}, indent=1), flush=True)
        if result["findings"]:
            failed += 1
        elif not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"{len(args.seeds) - failed} of {len(args.seeds)} seeds without findings")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
