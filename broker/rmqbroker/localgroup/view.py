"""The table `rmq-local` shows: one row per broker from its ``GET /status``, then recent events."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rmqbroker.localgroup.supervisor import fetch_status


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _disk(retention: dict[str, Any]) -> str:
    """Used share of the disk holding the store; FULL when the broker refuses sends for it."""
    ratio = retention.get("diskUsedRatio")
    if not isinstance(ratio, (int, float)) or ratio < 0:
        return "-"
    return f"{'FULL-' if retention.get('diskFull') else ''}{ratio * 100:.0f}%"


def status_table(state: dict[str, Any], events: bool = True) -> str:
    token = Path(state["tokenFile"]).read_text().strip()
    rows = [("BROKER", "ID", "ROLE", "ADDRESS", "EPOCH", "MAX OFFSET", "LAG BYTES", "DISK", "HA", "RESTARTS",
             "STATE")]
    brokers = state["brokers"]
    statuses = [fetch_status(b["admin"], token) if _alive(b.get("pid")) else None for b in brokers]
    master_max = next((s["maxPhyOffset"] for s in statuses if s and s.get("brokerId") == 0), None)
    for b, st in zip(brokers, statuses, strict=True):
        name, restarts = str(b.get("name") or f"broker-{b['id']}"), str(b.get("restarts", 0))
        if st is None:
            how = "DOWN"
            if _alive(b.get("pid")):
                how = "NO-ANSWER" if b.get("answered") else "STARTING"
            rows.append((name, str(b.get("brokerId", "-")), "-", f"127.0.0.1:{b['listen']}", "-", "-", "-", "-", "-",
                         restarts, how))
            continue
        lag = "-" if master_max is None or st["brokerId"] == 0 else str(max(0, master_max - st["maxPhyOffset"]))
        ha = st.get("ha") or {}
        if st["role"] == "SLAVE":
            link = "connected" if ha.get("connected") else "disconnected"
        else:
            slaves = ha.get("slaves") or []
            link = f"{sum(1 for x in slaves if x.get('inSync'))}/{len(slaves)} in sync"
        # A master refusing writes (back without its store, or in another broker's term) answers,
        # but the group cannot take sends until it is replaced or demoted.
        how = "FENCED" if st.get("termFenced") else "UP"
        rows.append((name, str(st["brokerId"]), st["role"], st["brokerAddr"], str(st.get("epoch", 0)),
                     str(st["maxPhyOffset"]), lag, _disk(st.get("retention") or {}), link, restarts, how))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if events and state.get("events"):
        lines += ["", "Recent events:", *(f"  {e}" for e in state["events"])]
    return "\n".join(lines)
