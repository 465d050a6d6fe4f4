"""`rmq-local`: run a BrokerGroup manifest as local processes (no Kubernetes).

``rmq-local up examples/brokergroup.yaml`` starts a nameserver, the master and ``replicas - 1``
slaves with data under ``--data-dir`` and shows a live table of roles, offsets and lag until
Ctrl-C; ``rmq-local status`` prints the table once for a group started earlier.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rmqbroker.managed_keys import managed_keys_in

STATE_FILE = "state.json"


class ManifestError(ValueError):
    """The manifest is not a usable BrokerGroup."""


@dataclass(frozen=True)
class GroupSpec:
    """The parts of a BrokerGroup spec a local group uses."""

    name: str
    cluster_name: str
    broker_name: str
    replicas: int
    replication: str
    flush_disk_type: str
    master_discovery: str
    broker_config: dict[str, str]

    @property
    def master_role(self) -> str:
        return "SYNC_MASTER" if self.replication == "SYNC" else "ASYNC_MASTER"


def load_manifest(path: Path) -> GroupSpec:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    except (OSError, yaml.YAMLError) as exc:
        raise ManifestError(f"cannot read {path}: {exc}") from exc
    groups = [d for d in docs if isinstance(d, dict) and d.get("kind") == "BrokerGroup"]
    if len(groups) != 1:
        raise ManifestError(f"{path} must contain exactly one BrokerGroup, found {len(groups)}")
    doc = groups[0]
    meta = doc.get("metadata") or {}
    spec = doc.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict) or not meta.get("name"):
        raise ManifestError("BrokerGroup needs metadata.name and a spec object")
    replicas = spec.get("replicas", 2)
    if not isinstance(replicas, int) or not 1 <= replicas <= 5:
        raise ManifestError("spec.replicas must be an integer from 1 to 5")
    replication = spec.get("replication", "ASYNC")
    if replication not in ("SYNC", "ASYNC"):
        raise ManifestError("spec.replication must be SYNC or ASYNC")
    flush = spec.get("flushDiskType", "ASYNC_FLUSH")
    if flush not in ("ASYNC_FLUSH", "SYNC_FLUSH"):
        raise ManifestError("spec.flushDiskType must be ASYNC_FLUSH or SYNC_FLUSH")
    discovery = spec.get("masterDiscovery", "Direct")
    if discovery not in ("Direct", "NameServer"):
        raise ManifestError("spec.masterDiscovery must be Direct or NameServer")
    extra = spec.get("brokerConfig") or {}
    if not isinstance(extra, dict) or not all(isinstance(v, str) for v in extra.values()):
        raise ManifestError("spec.brokerConfig must map keys to strings")
    # Refused rather than overridden: rmq-local assigns these per broker, and one brokerConfig
    # value applied to every broker would clash (two masters, one port, one store directory).
    managed = managed_keys_in(str(k) for k in extra)
    if managed:
        raise ManifestError(f"spec.brokerConfig may not set keys rmq-local manages: {', '.join(managed)}")
    return GroupSpec(
        name=str(meta["name"]),
        cluster_name=str(spec.get("clusterName", "DefaultCluster")),
        broker_name=str(spec.get("brokerName") or meta["name"]),
        replicas=replicas,
        replication=replication,
        flush_disk_type=flush,
        master_discovery=discovery,
        broker_config={str(k): v for k, v in extra.items()},
    )


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def render_conf(spec: GroupSpec, broker_id: int, data_dir: Path, ports: dict[str, int], namesrv: str,
                master_ha: str, token_file: Path) -> str:
    role = spec.master_role if broker_id == 0 else "SLAVE"
    # Defaults brokerConfig may change; the managed keys below are applied after it.
    conf: dict[str, str] = {
        "flushDiskType": spec.flush_disk_type,
        "mappedFileSizeCommitLog": str(64 * 1024 * 1024),
    }
    conf.update(spec.broker_config)
    conf |= {
        "brokerClusterName": spec.cluster_name,
        "brokerName": spec.broker_name,
        "brokerId": str(broker_id),
        "brokerRole": role,
        "namesrvAddr": namesrv,
        "brokerIP1": "127.0.0.1",
        "listenHost": "127.0.0.1",
        "listenPort": str(ports["listen"]),
        "haListenPort": str(ports["ha"]),
        "fastListenPort": str(ports["listen"] - 2),
        "adminListenPort": str(ports["admin"]),
        "adminTokenFile": str(token_file),
        "storePathRootDir": str(data_dir / f"broker-{broker_id}" / "store"),
    }
    if broker_id != 0 and spec.master_discovery == "Direct":
        conf["haMasterAddress"] = master_ha
    return "".join(f"{k}={v}\n" for k, v in conf.items())


def fetch_status(admin_port: int, token: str) -> dict[str, Any] | None:
    req = urllib.request.Request(f"http://127.0.0.1:{admin_port}/status",
                                 headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=1) as r:
            data: dict[str, Any] = json.loads(r.read())
            return data
    except (urllib.error.URLError, OSError, ValueError):
        return None


def status_table(state: dict[str, Any]) -> str:
    token = Path(state["tokenFile"]).read_text().strip()
    rows = [("ID", "ROLE", "ADDRESS", "EPOCH", "MAX OFFSET", "LAG BYTES", "DISK", "HA", "STATE")]
    statuses = [fetch_status(b["admin"], token) for b in state["brokers"]]
    master_max = next((s["maxPhyOffset"] for s in statuses if s and s.get("brokerId") == 0), None)
    for b, st in zip(state["brokers"], statuses, strict=True):
        if st is None:
            rows.append((str(b["id"]), "-", f"127.0.0.1:{b['listen']}", "-", "-", "-", "-", "-", "DOWN"))
            continue
        lag = "-" if master_max is None or st["brokerId"] == 0 else str(max(0, master_max - st["maxPhyOffset"]))
        ha = st.get("ha") or {}
        if st["role"] == "SLAVE":
            link = "connected" if ha.get("connected") else "disconnected"
        else:
            slaves = ha.get("slaves") or []
            link = f"{sum(1 for x in slaves if x.get('inSync'))}/{len(slaves)} in sync"
        rows.append((str(st["brokerId"]), st["role"], st["brokerAddr"], str(st.get("epoch", 0)),
                     str(st["maxPhyOffset"]), lag, _disk(st.get("retention") or {}), link, "UP"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def _disk(retention: dict[str, Any]) -> str:
    """Used share of the disk holding the store; FULL when the broker refuses sends for it."""
    ratio = retention.get("diskUsedRatio")
    if not isinstance(ratio, (int, float)) or ratio < 0:
        return "-"
    return f"{'FULL-' if retention.get('diskFull') else ''}{ratio * 100:.0f}%"


def _wait_ready(admin_port: int, timeout: float, proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/healthz", timeout=1):
                return True
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    return False


def up(manifest: Path, data_dir: Path, base_port: int, namesrv_port: int, once: bool) -> int:
    spec = load_manifest(manifest)
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    token_file = data_dir / "admin-token"
    if not token_file.exists():
        token_file.write_text(secrets.token_hex(16) + "\n")
        token_file.chmod(0o600)
    procs: list[subprocess.Popen[bytes]] = []
    namesrv = f"127.0.0.1:{namesrv_port}"
    state: dict[str, Any] = {"group": spec.name, "namesrv": namesrv, "tokenFile": str(token_file), "brokers": []}

    def spawn(args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = open(data_dir / log_name, "ab")  # noqa: SIM115 - owned by the child process
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(p)
        return p

    def stop_all() -> None:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()

    try:
        needed = [namesrv_port] + [base_port + 10 * i + d for i in range(spec.replicas) for d in (-2, 0, 1, 5)]
        busy = [p for p in needed if not _port_free(p)]
        if busy:
            print(f"rmq-local: ports in use: {busy}; pass --base-port/--namesrv-port", file=sys.stderr)
            return 1
        spawn([sys.executable, "-m", "rmqbroker.namesrv.main", "--listen", namesrv], "namesrv.log")
        master_ha = f"127.0.0.1:{base_port + 1}"
        for broker_id in range(spec.replicas):
            ports = {"listen": base_port + 10 * broker_id, "ha": base_port + 10 * broker_id + 1,
                     "admin": base_port + 10 * broker_id + 5}
            conf_path = data_dir / f"broker-{broker_id}.conf"
            conf_path.write_text(render_conf(spec, broker_id, data_dir, ports, namesrv, master_ha, token_file))
            p = spawn([sys.executable, "-m", "rmqbroker.main", "-c", str(conf_path)], f"broker-{broker_id}.log")
            state["brokers"].append({"id": broker_id, "pid": p.pid, **ports})
            if not _wait_ready(ports["admin"], 30, p):
                print(f"rmq-local: broker {broker_id} failed to start; see {data_dir}/broker-{broker_id}.log",
                      file=sys.stderr)
                return 1
        (data_dir / STATE_FILE).write_text(json.dumps(state, indent=1))
        print(f"BrokerGroup {spec.name}: {spec.replicas} broker(s), {spec.replication} replication, "
              f"data in {data_dir}")
        print(f"  nameserver:  {namesrv}   (clients: producer.set_namesrv_addr('{namesrv}'))")
        print(f"  admin API:   http://127.0.0.1:{base_port + 5}/status  "
              f"(Authorization: Bearer $(cat {token_file}))")
        print("  Ctrl-C stops the group.\n", flush=True)
        if once:
            print(status_table(state))
            return 0
        interactive = sys.stdout.isatty()
        while all(p.poll() is None for p in procs):
            table = status_table(state)
            if interactive:
                sys.stdout.write("\x1b[H\x1b[J" + table + "\n")
            else:
                print(table + "\n")
            sys.stdout.flush()
            time.sleep(1.0 if interactive else 10.0)
        print("rmq-local: a process exited; stopping the group", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop_all()


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rmq-local", description="Run a BrokerGroup as local processes")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start the group and show its state until Ctrl-C")
    p_up.add_argument("manifest", type=Path, nargs="?", default=Path("examples/brokergroup.yaml"))
    p_up.add_argument("--data-dir", type=Path, default=Path(os.environ.get("RMQ_LOCAL_DATA", "local-data")))
    p_up.add_argument("--base-port", type=int, default=10911)
    p_up.add_argument("--namesrv-port", type=int, default=9876)
    p_up.add_argument("--once", action="store_true", help="print the table once, then stop the group")
    p_st = sub.add_parser("status", help="print the state of a running local group")
    p_st.add_argument("--data-dir", type=Path, default=Path(os.environ.get("RMQ_LOCAL_DATA", "local-data")))
    args = parser.parse_args(argv)
    if args.cmd == "up":
        # Ctrl-C and SIGTERM both stop the group in order, even when started from a background
        # job of a non-interactive shell (which would otherwise inherit SIGINT as ignored).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _terminate)
        try:
            raise SystemExit(up(args.manifest, args.data_dir, args.base_port, args.namesrv_port, args.once))
        except ManifestError as exc:
            print(f"rmq-local: {exc}", file=sys.stderr)
            raise SystemExit(2) from exc
    state_path = args.data_dir / STATE_FILE
    if not state_path.exists():
        print(f"rmq-local: no group state in {args.data_dir} (is `rmq-local up` running?)", file=sys.stderr)
        raise SystemExit(1)
    print(status_table(json.loads(state_path.read_text())))


if __name__ == "__main__":
    main()
