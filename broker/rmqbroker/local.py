"""`rmq-local`: run a BrokerGroup manifest as local processes (no Kubernetes).

``rmq-local up examples/brokergroup.yaml`` starts a nameserver, the master and ``replicas - 1``
slaves with data under ``--data-dir`` and shows a live table of roles, offsets and lag until
Ctrl-C; ``rmq-local status`` prints the table once for a group started earlier. A manifest of
several BrokerGroups runs them as one cluster around one nameserver. While it runs,
exited processes are started again and a lost master is failed over
(:mod:`rmqbroker.localgroup.supervisor`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from rmqbroker.localgroup.manifest import GroupSpec, ManifestError, load_groups, load_manifest, render_conf
from rmqbroker.localgroup.supervisor import STATE_FILE, LocalGroup, Proc
from rmqbroker.localgroup.view import status_table

__all__ = ["GroupSpec", "ManifestError", "load_groups", "load_manifest", "main", "render_conf", "status_table"]

# How long a broker may take to answer /healthz when the group starts (a large store recovers first).
START_TIMEOUT = 60.0
TICK = 1.0
# The brokers of the second group of a manifest start this many ports above the first's, and so on
# (a group uses at most 5 brokers x 10 ports, from base - 2).
GROUP_PORT_STRIDE = 50
# Held by the `rmq-local up` that runs a data directory, with its pid inside.
LOCK_FILE = "rmq-local.lock"


def _claim(data_dir: Path) -> int | None:
    """Lock ``data_dir`` for this process (the descriptor, kept open while it runs), or None when
    another ``rmq-local up`` holds it."""
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _holder(data_dir: Path) -> str:
    with contextlib.suppress(OSError, ValueError):
        return f" (pid {int((data_dir / LOCK_FILE).read_text())})"
    return ""


def _stores_in_use(groups: list[LocalGroup]) -> list[Path]:
    """Brokers' store directories some process holds (the broker's own lock on its store): a
    broker left running by an earlier rmq-local that was killed."""
    held = []
    for group in groups:
        for ordinal in group.assignment:
            lock = group.store_dir(ordinal) / "lock"
            if not lock.exists():
                continue
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                held.append(lock.parent)
            finally:
                os.close(fd)
    return held


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        # As the brokers bind: connections of a group stopped a moment ago (TIME_WAIT) do not
        # hold the port, a listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_ready(admin_port: int, timeout: float, proc: Proc) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.running:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/healthz", timeout=1):
                return True
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    return False


def _last_words(proc: Proc, lines: int = 3) -> str:
    """The end of what a process logged since it was started (its reason to exit, as a bad
    setting's exit 2 gives it), indented."""
    try:
        with open(proc.log_path, "rb") as f:
            f.seek(proc.log_offset)
            tail = f.read().decode(errors="replace").rstrip().splitlines()[-lines:]
    except OSError:
        return ""
    return "".join(f"\n  {line}" for line in tail)


def _open_groups(specs: list[GroupSpec], data_dir: Path, base_port: int, namesrv: str,
                 token_file: Path) -> list[LocalGroup]:
    """One LocalGroup per spec with the roles of its previous run. One group keeps its data in
    ``data_dir`` itself, several each in ``data_dir/<name>``, ``GROUP_PORT_STRIDE`` ports apart."""
    groups = []
    for g, spec in enumerate(specs):
        gdir = data_dir / spec.name if len(specs) > 1 else data_dir
        gdir.mkdir(parents=True, exist_ok=True)
        group = LocalGroup(spec, gdir, base_port + GROUP_PORT_STRIDE * g, namesrv, token_file)
        state_path = gdir / STATE_FILE
        try:
            saved = json.loads(state_path.read_text()) if state_path.exists() else None
        except (OSError, ValueError) as exc:
            raise ManifestError(f"cannot read {state_path} ({exc}); it holds which broker is master: "
                                "remove it to start with broker-0 as master") from exc
        try:
            group.load_assignment(saved if isinstance(saved, dict) else None)
        except ValueError as exc:
            raise ManifestError(f"BrokerGroup {spec.name}: {exc}") from exc
        groups.append(group)
    return groups


def _save(groups: list[LocalGroup], data_dir: Path) -> None:
    for group in groups:
        group.save()
    if len(groups) > 1:
        # The index `rmq-local status` starts from: the groups, each with its own state.json.
        index = {"groups": [g.spec.name for g in groups], "namesrv": groups[0].namesrv}
        (data_dir / STATE_FILE).write_text(json.dumps(index, indent=1))


def _tables(groups: list[LocalGroup], events: bool) -> str:
    if len(groups) == 1:
        return status_table(groups[0].state(), events=events)
    return "\n\n".join(f"== BrokerGroup {g.spec.name} ==\n{status_table(g.state(), events=events)}" for g in groups)


def _banner(groups: list[LocalGroup], token_file: Path) -> str:
    """What the group is and how to reach it: printed once, and on top of every redraw of the
    live table in a terminal (which clears the screen each second)."""
    lines: list[str] = []
    add = lines.append
    for group in groups:
        spec, fo = group.spec, group.spec.failover
        add(f"BrokerGroup {spec.name}: {spec.replicas} broker(s), {spec.replication} replication, "
            f"master {group.name_of(group.master)} (epoch {group.epoch}), data in {group.data_dir}")
        add(f"  admin API:   http://127.0.0.1:{group.ports(group.master)['admin']}/status  "
            f"(Authorization: Bearer $(cat {token_file}))")
        add("  failover:    " + (f"a slave is promoted when the master is unreachable for {fo.master_lost_seconds}s"
                               if fo.enabled else "off (spec.failover.enabled: false)"))
        if spec.tls is not None:
            t = spec.tls
            add(f"  TLS:         {t.mode} on the remoting ports, client certificates {t.client_auth} "
                f"(Secret {t.secret_name}; files in {group.data_dir / 'secrets'})")
        if spec.acl is not None:
            add(f"  ACL:         on (Secret {spec.acl.secret_name}): clients sign with an account of "
                "its plain_acl.yml (producer.set_session_credentials(accessKey, secretKey, 'LOCAL'))")
    namesrv = groups[0].namesrv
    add(f"nameserver:    {namesrv}   (clients: producer.set_namesrv_addr('{namesrv}'))")
    add("Ctrl-C stops every process; a process that exits is started again.\n")
    return "\n".join(lines) + "\n"


def up(manifest: Path, data_dir: Path, base_port: int, namesrv_port: int, once: bool) -> int:
    specs = load_groups(manifest)
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    # Before anything in it is written: a second `up` on the same directory would rewrite the
    # running group's confs (ports, addresses) and break its next restart.
    lock_fd = _claim(data_dir)
    if lock_fd is None:
        print(f"rmq-local: {data_dir} is in use by another rmq-local{_holder(data_dir)}; stop it, or give "
              "this group its own --data-dir", file=sys.stderr)
        return 1
    try:
        return _up(specs, data_dir, base_port, namesrv_port, once)
    finally:
        os.close(lock_fd)


def _up(specs: list[GroupSpec], data_dir: Path, base_port: int, namesrv_port: int, once: bool) -> int:
    token_file = data_dir / "admin-token"
    if not token_file.exists():
        token_file.write_text(secrets.token_hex(16) + "\n")
        token_file.chmod(0o600)
    groups = _open_groups(specs, data_dir, base_port, f"127.0.0.1:{namesrv_port}", token_file)
    try:
        held = _stores_in_use(groups)
        if held:
            print(f"rmq-local: store(s) in use by another process: {', '.join(map(str, held))}; a broker of an "
                  "earlier run may still be running (see `ps`): stop it first", file=sys.stderr)
            return 1
        needed = [namesrv_port] + [g.ports(o)["listen"] + d for g in groups for o in range(g.spec.replicas)
                                   for d in (-2, 0, 1, 5)]
        busy = [p for p in needed if not _port_free(p)]
        if busy:
            print(f"rmq-local: ports in use: {busy}; pass --base-port/--namesrv-port", file=sys.stderr)
            return 1
        for i, group in enumerate(groups):
            for line in group.write_confs(keep_saved=False):
                print(f"rmq-local: {group.spec.name} {line}: differ from the manifest (set at run time, e.g. by "
                      "updateBrokerConfig, or by an earlier manifest); starting with the manifest's values: put "
                      "a value in spec.brokerConfig to keep it", file=sys.stderr)
            group.add_processes(namesrv_dir=data_dir if i == 0 else None)
            now = time.monotonic()
            for name in group.start_order():
                proc = group.procs[name]
                proc.start(now)
                if name == "namesrv":
                    continue
                ordinal = int(name.rsplit("-", 1)[1])
                if not _wait_ready(group.ports(ordinal)["admin"], START_TIMEOUT, proc):
                    print(f"rmq-local: {group.spec.name} {name} failed to start; see {proc.log_path}"
                          + _last_words(proc), file=sys.stderr)
                    return 1
        _save(groups, data_dir)
        banner = _banner(groups, token_file)
        print(banner, end="", flush=True)
        if once:
            print(_tables(groups, events=False))
            return 0
        interactive = sys.stdout.isatty()
        shown = 0.0
        printed = {e for g in groups for e in g.events}
        while True:
            for group in groups:
                group.tick(time.monotonic())
            if interactive:
                sys.stdout.write("\x1b[H\x1b[J" + banner + _tables(groups, events=True) + "\n")
            else:
                # Events are kept in bounded lists: print the ones this pass added.
                prefix = len(groups) > 1
                for group in groups:
                    for e in group.events:
                        if e not in printed:
                            print(f"{group.spec.name}: {e}" if prefix else e)
                printed = {e for g in groups for e in g.events}
                if time.monotonic() - shown >= 10.0:
                    print(_tables(groups, events=False) + "\n")
                    shown = time.monotonic()
            sys.stdout.flush()
            time.sleep(TICK)
    except KeyboardInterrupt:
        return 0
    finally:
        # One stop at a time: a second Ctrl-C or SIGTERM (e.g. from a wrapper forwarding it) must
        # not cut the orderly stop short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for group in reversed(groups):  # the first group's nameserver last
            group.stop_all()
        if any(g.procs for g in groups):
            _save(groups, data_dir)


def status(data_dir: Path) -> int:
    state_path = data_dir / STATE_FILE
    if not state_path.exists():
        print(f"rmq-local: no group state in {data_dir} (is `rmq-local up` running?)", file=sys.stderr)
        return 1
    path = state_path
    try:
        state = json.loads(state_path.read_text())
        if "groups" not in state:
            print(status_table(state))
            return 0
        tables = []
        for name in state["groups"]:
            path = data_dir / name / STATE_FILE
            group_state = json.loads(path.read_text())
            tables.append(f"== BrokerGroup {name} ==\n{status_table(group_state)}")
    except (OSError, ValueError) as exc:
        # A damaged or half-removed data directory: say which file, not a traceback.
        print(f"rmq-local: cannot read {path}: {exc}", file=sys.stderr)
        return 1
    print("\n\n".join(tables))
    return 0


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
    raise SystemExit(status(args.data_dir))


if __name__ == "__main__":
    main()
