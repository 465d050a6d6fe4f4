"""How soon a slave follows a master restarted in place (real broker processes on loopback).

An ASYNC_MASTER is killed (SIGKILL) and started again after a random 0.5-6 s, ``--rounds`` times;
two slaves follow it by ``haMasterAddress``: one running this tree, and, with ``--baseline DIR``,
one running the broker sources in DIR (e.g. a ``git worktree`` of an older commit), in the same
run. For each restart the time from the master answering ``/readyz`` again until each slave's
``/status`` shows ``ha.connected`` is the window in which an ASYNC master acknowledges sends that
no slave has yet. Prints each slave's gaps (p50, max) and, with a baseline, the ratio of means.

Usage: ``python bench/reconnect_bench.py [--rounds 12] [--baseline /tmp/wt-old]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.procs import BrokerProc  # noqa: E402


def connected(slave: BrokerProc) -> bool:
    try:
        return bool(slave.status()["ha"]["connected"])
    except (OSError, AssertionError, KeyError):
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--baseline", type=Path, help="a source tree (its broker/ folder) to run the second slave from")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="reconnect-bench-"))
    master = BrokerProc(work, None, broker_id=0, role="ASYNC_MASTER")
    ha = f"127.0.0.1:{master.conf['haListenPort']}"
    slaves = {"this tree": BrokerProc(work, None, broker_id=1, role="SLAVE", haMasterAddress=ha)}
    if args.baseline is not None:
        old = BrokerProc(work, None, broker_id=2, role="SLAVE", haMasterAddress=ha)
        old.env = {"PYTHONPATH": str(args.baseline / "broker")}
        slaves["baseline"] = old
    gaps: dict[str, list[float]] = {name: [] for name in slaves}
    try:
        master.start()
        for s in slaves.values():
            s.start()
        for r in range(args.rounds):
            deadline = time.monotonic() + 20
            while not all(connected(s) for s in slaves.values()):
                if time.monotonic() > deadline:
                    raise SystemExit(f"round {r}: slaves not connected before the kill")
                time.sleep(0.05)
            master.kill9()
            time.sleep(rng.uniform(0.5, 6.0))
            master.start(wait_ready=False)
            master.wait_ready()
            back = time.monotonic()
            pending = dict(slaves)
            while pending and time.monotonic() - back < 30:
                for name, s in list(pending.items()):
                    if connected(s):
                        gaps[name].append(time.monotonic() - back)
                        del pending[name]
                time.sleep(0.02)
            print(f"round {r + 1}: " + ", ".join(f"{n} {gaps[n][-1]:.2f}s" if n not in pending else f"{n} >30s"
                                                 for n in slaves), flush=True)
    finally:
        for p in (*slaves.values(), master):
            p.stop()
    out = {name: {"p50_s": round(statistics.median(g), 3), "mean_s": round(statistics.fmean(g), 3),
                  "max_s": round(max(g), 3), "rounds": len(g)} for name, g in gaps.items() if g}
    if "baseline" in out and "this tree" in out:
        out["mean_ratio_this_tree_to_baseline"] = round(out["this tree"]["mean_s"] / out["baseline"]["mean_s"], 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
