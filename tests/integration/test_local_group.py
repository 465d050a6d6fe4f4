"""`rmq-local up` runs a BrokerGroup manifest as real processes (the README's main job)."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqbroker.managed_keys import MANAGED_KEYS
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.integration.helpers import poll, rpc, send_raw
from tests.support.procs import free_port_block


def test_local_group_up_once(tmp_path: Path) -> None:
    manifest = tmp_path / "bg.yaml"
    manifest.write_text(
        "apiVersion: rmq.brokergroup.dev/v1alpha1\nkind: BrokerGroup\nmetadata: {name: local-a}\n"
        "spec:\n  replicas: 2\n  replication: SYNC\n  masterDiscovery: NameServer\n"
        "  brokerConfig: {defaultTopicQueueNums: '2'}\n")
    for _attempt in range(3):
        # Ports probed free can be taken by another process before rmq-local binds them; it
        # refuses busy ports up front, so a fresh pick is a clean retry.
        base = free_port_block(32) + 2  # the VIP channels sit 2 below each listen port
        namesrv_port = base + 29  # brokers use base + 10 * id + {-2, 0, 1, 5}
        out = subprocess.run([sys.executable, "-m", "rmqbroker.local", "up", str(manifest), "--once",
                              "--data-dir", str(tmp_path / "data"), "--base-port", str(base),
                              "--namesrv-port", str(namesrv_port)],
                             capture_output=True, text=True, timeout=120, check=False)
        if "ports in use" not in out.stderr:
            break
    assert out.returncode == 0, out.stderr + out.stdout
    lines = out.stdout.splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("BROKER"))) + 1:]
    assert [row.split()[2] for row in table] == ["SYNC_MASTER", "SLAVE"]
    assert all(row.split()[-1] == "UP" for row in table)
    conf = (tmp_path / "data" / "broker-1.conf").read_text()
    assert "brokerRole=SLAVE" in conf and "haMasterAddress" not in conf  # NameServer discovery
    assert "defaultTopicQueueNums=2" in conf


def test_live_table_in_a_terminal_keeps_the_addresses_on_screen(tmp_path: Path) -> None:
    """In a terminal the table is redrawn every second on a cleared screen: the banner (nameserver
    address, admin endpoint) must be redrawn above it. It was printed once and cleared a second
    later, so `make run` never showed a newcomer where to connect."""
    manifest = tmp_path / "bg.yaml"
    manifest.write_text("kind: BrokerGroup\nmetadata: {name: tty}\nspec: {replicas: 1}\n")
    base = free_port_block(32) + 2
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "rmqbroker.local", "up", str(manifest), "--data-dir",
                             str(tmp_path / "d"), "--base-port", str(base), "--namesrv-port", str(base + 29)],
                            stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    os.close(terminal)
    screen = b""
    try:
        deadline = time.monotonic() + 60
        # A frame is complete only once the next one begins: a pty hands a redraw over in pieces.
        while screen.count(b"\x1b[H\x1b[J") < 3 and time.monotonic() < deadline and proc.poll() is None:
            if select.select([controller], [], [], 0.5)[0]:
                screen += os.read(controller, 65536)
    finally:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(OSError):  # drain, so the stop's output cannot block on a full pty
            while select.select([controller], [], [], 0.5)[0] and os.read(controller, 65536):
                pass
        proc.wait(timeout=30)
        os.close(controller)
    assert screen.count(b"\x1b[H\x1b[J") >= 3, screen.decode(errors="replace")
    last = screen.split(b"\x1b[H\x1b[J")[2].decode()
    assert f"nameserver:    127.0.0.1:{base + 29}" in last and f"http://127.0.0.1:{base + 5}/status" in last, last
    assert "BROKER" in last


def test_local_group_rejects_bad_manifest(tmp_path: Path) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text("kind: BrokerGroup\nmetadata: {name: x}\nspec: {replicas: 9}\n")
    out = subprocess.run([sys.executable, "-m", "rmqbroker.local", "up", str(manifest), "--once",
                          "--data-dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=30,
                         check=False)
    assert out.returncode == 2 and "replicas" in out.stderr


def test_local_group_refuses_managed_broker_config_keys(tmp_path: Path) -> None:
    from rmqoperator.spec import RESERVED_KEYS

    assert RESERVED_KEYS is MANAGED_KEYS  # the operator and rmq-local refuse the same keys
    manifest = tmp_path / "bg.yaml"
    manifest.write_text(
        "kind: BrokerGroup\nmetadata: {name: x}\nspec:\n  brokerConfig:\n"
        "    defaultTopicQueueNums: '2'\n    listenPort: '20000'\n    brokerRole: SYNC_MASTER\n"
        "    storePathRootDir: /tmp/shared\n")
    data = tmp_path / "d"
    out = subprocess.run([sys.executable, "-m", "rmqbroker.local", "up", str(manifest), "--once",
                          "--data-dir", str(data)], capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 2, out.stderr + out.stdout
    assert "may not set keys rmq-local manages: brokerRole, listenPort, storePathRootDir" in out.stderr
    assert "defaultTopicQueueNums" not in out.stderr
    assert not data.exists()  # refused before anything was created or started


def test_local_group_refuses_an_unreadable_state_file(tmp_path: Path) -> None:
    manifest = tmp_path / "bg.yaml"
    manifest.write_text("kind: BrokerGroup\nmetadata: {name: x}\nspec: {}\n")
    data = tmp_path / "d"
    data.mkdir()
    (data / "state.json").write_text("{")
    out = subprocess.run([sys.executable, "-m", "rmqbroker.local", "up", str(manifest), "--once",
                          "--data-dir", str(data)], capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 2, out.stderr + out.stdout
    assert f"cannot read {data.resolve() / 'state.json'}" in out.stderr and "remove it" in out.stderr
    assert not (data / "broker-0.conf").exists()  # refused before anything was written or started


@dataclass
class Row:
    name: str
    id: int | None  # brokerId: 0 is the master
    role: str
    epoch: str
    max_offset: str
    lag: str
    disk: str
    ha: str
    restarts: int
    state: str


def status_output(data_dir: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "rmqbroker.local", "status", "--data-dir", str(data_dir)],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def status_rows(data_dir: Path) -> list[Row]:
    """`rmq-local status`, parsed (the HA column may hold several words, e.g. "1/1 in sync")."""
    text = status_output(data_dir)
    lines = text.split("\n\n")[0].splitlines()  # recent events follow a blank line
    assert lines[0].split()[:4] == ["BROKER", "ID", "ROLE", "ADDRESS"], text
    rows = []
    for line in lines[1:]:
        t = line.split()
        rows.append(Row(t[0], int(t[1]) if t[1].isdigit() else None, t[2], t[4], t[5], t[6], t[7],
                        " ".join(t[8:-2]), int(t[-2]), t[-1]))
    return rows


@dataclass
class Group:
    proc: subprocess.Popen[str]
    data_dir: Path
    base: int

    @property
    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads((self.data_dir / "state.json").read_text())
        return result

    def admin_status(self, ordinal: int) -> dict[str, Any]:
        token = (self.data_dir / "admin-token").read_text().strip()
        req = urllib.request.Request(f"http://127.0.0.1:{self.base + 10 * ordinal + 5}/status",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            result: dict[str, Any] = json.loads(r.read())
            return result


    def pid(self, ordinal: int) -> int:
        result: int = self.state["brokers"][ordinal]["pid"]
        return result

    def addr(self, ordinal: int) -> str:
        return f"127.0.0.1:{self.base + 10 * ordinal}"


@contextlib.contextmanager
def running_group(tmp_path: Path, manifest_text: str) -> Iterator[Group]:
    """`rmq-local up` in the background until the block ends (then killed if still running)."""
    manifest = tmp_path / "bg.yaml"
    manifest.write_text(manifest_text)
    base = free_port_block(32) + 2  # the VIP channels sit 2 below each listen port
    data_dir = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "rmqbroker.local", "up", str(manifest),
                             "--data-dir", str(data_dir), "--base-port", str(base),
                             "--namesrv-port", str(base + 29)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (data_dir / "state.json").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert (data_dir / "state.json").exists(), "group did not come up"
        yield Group(proc, data_dir, base)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_local_group_direct_status_flush_type_and_sigterm(tmp_path: Path) -> None:
    """One running group (Direct discovery) for: `rmq-local status` (roles, HA link, offsets),
    the manifest's flushDiskType reaching the brokers, and an orderly stop on SIGTERM."""
    # A flush interval nobody waits for: the commitlog is flushed on a send only under SYNC_FLUSH.
    text = ("kind: BrokerGroup\nmetadata: {name: local-b}\n"
            "spec:\n  replicas: 2\n  replication: ASYNC\n  masterDiscovery: Direct\n"
            "  flushDiskType: SYNC_FLUSH\n  brokerConfig: {flushIntervalCommitLog: '600000'}\n")
    with running_group(tmp_path, text) as g:
        for i in (0, 1):
            conf = (g.data_dir / f"broker-{i}.conf").read_text()
            assert "flushDiskType=SYNC_FLUSH" in conf
        assert "haMasterAddress=127.0.0.1:" in (g.data_dir / "broker-1.conf").read_text()

        def linked() -> list[Row] | None:
            rows = status_rows(g.data_dir)
            return rows if rows[1].ha == "connected" and rows[0].ha == "1/1 in sync" else None

        rows = poll(linked, 30, 0.2, what="slave connected to the master")
        assert [(r.name, r.id, r.role, r.state) for r in rows] == [("broker-0", 0, "ASYNC_MASTER", "UP"),
                                                                    ("broker-1", 1, "SLAVE", "UP")]
        assert rows[0].lag == "-"

        resp = send_raw(f"127.0.0.1:{g.base}", "LocalTopic", b"x" * 100)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        master = g.admin_status(0)
        assert master["maxPhyOffset"] > 0
        assert master["flushedPhyOffset"] == master["maxPhyOffset"]  # flushed before the answer: SYNC_FLUSH

        def caught_up() -> list[Row] | None:
            rows = status_rows(g.data_dir)
            return rows if rows[1].max_offset == rows[0].max_offset and rows[1].lag == "0" else None

        rows = poll(caught_up, 30, 0.2, what="slave caught up in `rmq-local status`")
        assert int(rows[0].max_offset) == master["maxPhyOffset"]
        # Each broker's disk as its retention service measured it (its first round, a second after start).
        def measured() -> list[Row] | None:
            rows = status_rows(g.data_dir)
            return rows if all(r.disk != "-" for r in rows) else None

        rows = poll(measured, 10, 0.2, what="disk use measured")
        assert all(r.disk.endswith("%") and 0 < int(r.disk.rstrip("%")) <= 100 for r in rows), rows

        pids = [b["pid"] for b in g.state["brokers"]]
        g.proc.send_signal(signal.SIGTERM)
        assert g.proc.wait(60) == 0
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            raise AssertionError(f"broker {pid} still running after rmq-local stopped")


def test_local_group_nameserver_discovery_slaves_connect(tmp_path: Path) -> None:
    """Without haMasterAddress the slaves learn the master's HA address from the nameserver."""
    text = ("kind: BrokerGroup\nmetadata: {name: local-c}\n"
            "spec: {replicas: 3, replication: SYNC, masterDiscovery: NameServer}\n")
    with running_group(tmp_path, text) as g:
        for i in (1, 2):
            assert "haMasterAddress" not in (g.data_dir / f"broker-{i}.conf").read_text()

        def linked() -> list[Row] | None:
            rows = status_rows(g.data_dir)
            return rows if all(r.ha == "connected" for r in rows[1:]) and rows[0].ha == "2/2 in sync" else None

        rows = poll(linked, 30, 0.2, what="slaves connected to the master")
        assert [r.role for r in rows] == ["SYNC_MASTER", "SLAVE", "SLAVE"]
        for i in (1, 2):
            assert g.admin_status(i)["ha"]["masterAddress"] == f"127.0.0.1:{g.base + 1}"
        # A SYNC_MASTER answers SUCCESS only once a slave acknowledged the message.
        resp = send_raw(f"127.0.0.1:{g.base}", "LocalTopic", b"y" * 100)
        assert resp.code == ResponseCode.SUCCESS, resp.remark


def _roles(rows: list[Row]) -> list[tuple[str, int | None, str]]:
    return [(r.name, r.id, r.role) for r in rows]


def test_local_group_restarts_processes_and_fails_over_a_lost_master(tmp_path: Path) -> None:
    """rmq-local does what the kubelet and the operator do: a killed slave is started again, a
    master that stops answering is replaced by the most advanced slave (no acknowledged SYNC message
    lost), the old master follows the new one when it returns, and the roles survive a restart of
    the whole group."""
    text = ("kind: BrokerGroup\nmetadata: {name: local-f}\n"
            "spec:\n  replicas: 3\n  replication: SYNC\n  masterDiscovery: Direct\n"
            "  failover: {masterLostSeconds: 2}\n")
    with running_group(tmp_path, text) as g:
        def linked() -> list[Row] | None:
            rows = status_rows(g.data_dir)
            ok = (rows[0].ha == "2/2 in sync" and all(r.ha == "connected" for r in rows[1:])
                  and all(r.epoch == "1" for r in rows))
            return rows if ok else None

        # The master begins epoch 1 once it serves; the slaves follow it into it.
        poll(linked, 30, 0.2, what="slaves connected to the master in epoch 1")
        assert g.state["epoch"] == 1
        for i in range(20):
            resp = send_raw(g.addr(0), "LocalTopic", f"before-{i}".encode())
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        acked = g.admin_status(0)["maxPhyOffset"]

        # A slave killed with SIGKILL is started again and follows the master again.
        os.kill(g.pid(2), signal.SIGKILL)

        def slave_back() -> list[Row] | None:
            rows = linked()
            return rows if rows and rows[2].restarts == 1 and rows[2].lag == "0" else None

        rows = poll(slave_back, 30, 0.3, what="killed slave started again")
        assert _roles(rows) == [("broker-0", 0, "SYNC_MASTER"), ("broker-1", 1, "SLAVE"), ("broker-2", 2, "SLAVE")]
        assert "broker-2 exited (signal 9)" in status_output(g.data_dir)

        # A value saved at run time (mqadmin updateBrokerConfig) outlives the failover's re-render.
        resp = rpc(g.addr(0), RequestCode.UPDATE_BROKER_CONFIG, body=b"fileReservedTime=12\n")
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert "fileReservedTime=12" in (g.data_dir / "broker-0.conf").read_text()

        # A second `up` on this data directory is refused before it rewrites anything.
        confs = {p.name: p.read_bytes() for p in g.data_dir.glob("*.conf")}
        other = free_port_block(32) + 2
        second = subprocess.run([sys.executable, "-m", "rmqbroker.local", "up", str(tmp_path / "bg.yaml"), "--once",
                                 "--data-dir", str(g.data_dir), "--base-port", str(other),
                                 "--namesrv-port", str(other + 29)],
                                capture_output=True, text=True, timeout=60, check=False)
        assert second.returncode == 1, second.stderr
        assert f"in use by another rmq-local (pid {g.proc.pid})" in second.stderr
        assert {p.name: p.read_bytes() for p in g.data_dir.glob("*.conf")} == confs

        # The master stops answering (SIGSTOP): after masterLostSeconds a slave is promoted.
        master_pid = g.pid(0)
        os.kill(master_pid, signal.SIGSTOP)
        try:
            def promoted() -> list[Row] | None:
                rows = status_rows(g.data_dir)
                # state.json (the old master's row) is written once POST /role has returned.
                return rows if rows[1].role == "SYNC_MASTER" and rows[1].id == 0 and rows[0].id == 1 else None

            rows = poll(promoted, 30, 0.3, what="broker-1 promoted")
            assert rows[1].epoch == "2"
            assert int(rows[1].max_offset) >= acked  # every acknowledged message is on the new master
            assert rows[0].state == "NO-ANSWER"
            state = g.state
            assert state["assignment"] == {"0": 1, "1": 0, "2": 2} and state["epoch"] == 2
            conf0 = (g.data_dir / "broker-0.conf").read_text()
            assert "brokerRole=SLAVE" in conf0 and f"haMasterAddress=127.0.0.1:{g.base + 11}" in conf0
            assert "fileReservedTime=12" in conf0

            # The new SYNC_MASTER takes sends once the other slave follows it.
            def sent() -> bool:
                return send_raw(g.addr(1), "LocalTopic", b"after").code == ResponseCode.SUCCESS

            poll(sent, 30, 0.3, what="a send acknowledged by the new master")
        finally:
            os.kill(master_pid, signal.SIGCONT)

        # The old master answers again: demoted, it follows the new master and catches up.
        def converged() -> list[Row] | None:
            rows = status_rows(g.data_dir)
            ok = (_roles(rows) == [("broker-0", 1, "SLAVE"), ("broker-1", 0, "SYNC_MASTER"), ("broker-2", 2, "SLAVE")]
                  and rows[1].ha == "2/2 in sync" and rows[0].lag == "0" and rows[2].lag == "0")
            return rows if ok else None

        poll(converged, 30, 0.3, what="old master demoted and following")
        assert g.admin_status(0)["ha"]["masterAddress"] == f"127.0.0.1:{g.base + 11}"
        out = status_output(g.data_dir)
        assert "promoted broker-1 to SYNC_MASTER at epoch 2" in out
        assert "broker-0 -> SLAVE brokerId 1" in out
        g.proc.send_signal(signal.SIGTERM)
        assert g.proc.wait(60) == 0

    # The whole group started again (on other ports) keeps the roles of the failover.
    with running_group(tmp_path, text) as g2:
        def back() -> list[Row] | None:
            rows = status_rows(g2.data_dir)
            ok = (_roles(rows) == [("broker-0", 1, "SLAVE"), ("broker-1", 0, "SYNC_MASTER"), ("broker-2", 2, "SLAVE")]
                  and rows[1].ha == "2/2 in sync" and all(r.restarts == 0 for r in rows))
            return rows if ok else None

        rows = poll(back, 60, 0.3, what="group up again with the failed-over roles")
        assert all(r.epoch == "2" for r in rows)
        resp = send_raw(g2.addr(1), "LocalTopic", b"again")
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        # The manifest's confs again: the run-time value is dropped, and the user told which.
        assert "fileReservedTime" not in (g2.data_dir / "broker-0.conf").read_text()
        g2.proc.send_signal(signal.SIGTERM)
        assert g2.proc.wait(60) == 0
        assert g2.proc.stderr is not None
        assert "broker-0.conf: fileReservedTime=12: differ from the manifest" in g2.proc.stderr.read()


def test_local_group_without_failover_restarts_the_master_and_keeps_roles(tmp_path: Path) -> None:
    """With spec.failover.enabled false a lost master is reported, never replaced; a master that
    exits is started again as the master."""
    text = ("kind: BrokerGroup\nmetadata: {name: local-g}\n"
            "spec:\n  replicas: 2\n  replication: ASYNC\n"
            "  failover: {enabled: false, masterLostSeconds: 1}\n")
    with running_group(tmp_path, text) as g:
        def linked() -> list[Row] | None:
            rows = status_rows(g.data_dir)
            ok = rows[0].ha == "1/1 in sync" and rows[1].ha == "connected" and all(r.epoch == "1" for r in rows)
            return rows if ok else None

        poll(linked, 30, 0.2, what="slave connected to the master in epoch 1")
        master_pid = g.pid(0)
        os.kill(master_pid, signal.SIGSTOP)
        try:
            poll(lambda: "failover is off" in status_output(g.data_dir), 20, 0.3, what="lost master reported")
            assert _roles(status_rows(g.data_dir))[1] == ("broker-1", 1, "SLAVE")
            assert g.state["epoch"] == 1  # the first term, no promotion
        finally:
            os.kill(master_pid, signal.SIGCONT)
        os.kill(master_pid, signal.SIGKILL)

        def restarted() -> list[Row] | None:
            rows = linked()
            return rows if rows and rows[0].restarts == 1 else None

        rows = poll(restarted, 30, 0.3, what="master started again")
        assert _roles(rows) == [("broker-0", 0, "ASYNC_MASTER"), ("broker-1", 1, "SLAVE")]
        assert g.pid(0) != master_pid
        resp = send_raw(g.addr(0), "LocalTopic", b"x")
        assert resp.code == ResponseCode.SUCCESS, resp.remark


def test_local_group_replaces_a_master_back_on_an_emptied_store_at_once(tmp_path: Path) -> None:
    """A master that starts again without its store (the folder deleted, another disk) is back at
    epoch 0 with a new log, which its slave refuses. It is replaced at once, not after
    masterLostSeconds, by the slave holding the group's log; it then follows and copies it."""
    text = ("kind: BrokerGroup\nmetadata: {name: local-w}\n"
            "spec:\n  replicas: 2\n  replication: SYNC\n  failover: {masterLostSeconds: 60}\n")
    with running_group(tmp_path, text) as g:
        def linked() -> list[Row] | None:
            rows = status_rows(g.data_dir)
            ok = rows[0].ha == "1/1 in sync" and rows[1].ha == "connected" and all(r.epoch == "1" for r in rows)
            return rows if ok and g.state["epoch"] == 1 else None

        poll(linked, 30, 0.2, what="slave connected to the master in epoch 1")
        for i in (0, 1):
            assert "haGroupEpoch=1" in (g.data_dir / f"broker-{i}.conf").read_text()
        assert "broker-0, the master, began epoch 1" in status_output(g.data_dir)
        for i in range(20):
            resp = send_raw(g.addr(0), "LocalTopic", f"kept-{i}".encode())
            assert resp.code == ResponseCode.SUCCESS, resp.remark
        acked = g.admin_status(0)["maxPhyOffset"]

        master_pid = g.pid(0)
        os.kill(master_pid, signal.SIGSTOP)
        shutil.rmtree(g.data_dir / "broker-0" / "store")
        os.kill(master_pid, signal.SIGKILL)
        lost_at = time.monotonic()

        def replaced() -> list[Row] | None:
            rows = status_rows(g.data_dir)
            return rows if rows[1].role == "SYNC_MASTER" and rows[1].id == 0 and rows[0].id == 1 else None

        rows = poll(replaced, 45, 0.3, what="broker-1 promoted")
        assert time.monotonic() - lost_at < 30, "waited for masterLostSeconds (60)"
        assert rows[1].epoch == "2" and int(rows[1].max_offset) >= acked
        assert "master broker-0 lost its store: it is at epoch 0, older than the group's 1" in status_output(g.data_dir)

        def converged() -> list[Row] | None:
            rows = status_rows(g.data_dir)
            ok = (_roles(rows) == [("broker-0", 1, "SLAVE"), ("broker-1", 0, "SYNC_MASTER")]
                  and rows[1].ha == "1/1 in sync" and rows[0].lag == "0")
            return rows if ok else None

        poll(converged, 30, 0.3, what="the emptied broker following the new master")
        assert g.admin_status(0)["maxPhyOffset"] == g.admin_status(1)["maxPhyOffset"] >= acked
        assert "haGroupEpoch=2" in (g.data_dir / "broker-0.conf").read_text()
        resp = send_raw(g.addr(1), "LocalTopic", b"after")
        assert resp.code == ResponseCode.SUCCESS, resp.remark


def test_a_group_of_one_goes_on_with_an_empty_log_when_its_broker_lost_its_store(tmp_path: Path) -> None:
    """The only broker back without its store refuses writes (haGroupEpoch) like any master that
    lost its store, but nobody holds the group's log and nobody can replace it: it begins a new
    epoch on its empty log and takes sends again."""
    text = ("kind: BrokerGroup\nmetadata: {name: local-one}\n"
            "spec:\n  replicas: 1\n  replication: ASYNC\n  failover: {masterLostSeconds: 60}\n")
    with running_group(tmp_path, text) as g:
        poll(lambda: g.state["epoch"] == 1, 30, 0.2, what="epoch 1 begun")
        assert send_raw(g.addr(0), "LocalTopic", b"gone").code == ResponseCode.SUCCESS
        pid = g.pid(0)
        os.kill(pid, signal.SIGSTOP)
        shutil.rmtree(g.data_dir / "broker-0" / "store")
        os.kill(pid, signal.SIGKILL)
        poll(lambda: g.state["epoch"] == 2, 30, 0.2, what="a new epoch on the empty log")
        st = g.admin_status(0)
        assert (st["role"], st["epoch"], st["termFenced"]) == ("ASYNC_MASTER", 2, False)
        assert "it is the group's only broker" in status_output(g.data_dir)
        resp = send_raw(g.addr(0), "LocalTopic", b"again")
        assert resp.code == ResponseCode.SUCCESS, resp.remark


def test_local_cluster_of_two_groups_shares_one_nameserver(tmp_path: Path) -> None:
    """`rmq-local up examples/cluster.yaml`: the Kubernetes example of two groups as one cluster runs
    locally around one nameserver, and the stock producer spreads a topic over both groups."""
    from rmqbroker.local import GROUP_PORT_STRIDE
    from tests.integration.helpers import create_topic, message, produce, route

    example = Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml"
    base = free_port_block(128) + 2
    namesrv = f"127.0.0.1:{base + 120}"
    data_dir = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "rmqbroker.local", "up", str(example), "--data-dir", str(data_dir),
                             "--base-port", str(base), "--namesrv-port", str(base + 120)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        poll(lambda: (data_dir / "state.json").exists() or proc.poll() is not None, 90, 0.2, what="cluster up")
        assert proc.poll() is None, proc.communicate()

        def linked() -> str | None:
            out = status_output(data_dir)
            return out if out.count("1/1 in sync") == 2 and out.count(" connected ") == 2 else None

        out = poll(linked, 30, 0.3, what="both groups' slaves connected")
        assert "== BrokerGroup broker-a ==" in out and "== BrokerGroup broker-b ==" in out
        assert (data_dir / "broker-b" / "broker-0" / "store").is_dir()
        # One nameserver for the cluster, at the top of the data directory.
        assert (data_dir / "namesrv.log").is_file() and not (data_dir / "broker-a" / "namesrv.log").exists()
        masters = {"broker-a": f"127.0.0.1:{base}", "broker-b": f"127.0.0.1:{base + GROUP_PORT_STRIDE}"}

        def both_registered() -> dict[str, Any] | None:
            info = json.loads(bytes(rpc(namesrv, RequestCode.GET_BROKER_CLUSTER_INFO).body))
            table = info["brokerAddrTable"]
            ok = all(sorted((table.get(n) or {}).get("brokerAddrs", {})) == ["0", "1"] for n in masters)
            return info if ok else None

        info = poll(both_registered, 30, 0.3, what="both groups registered with the one nameserver")
        assert sorted(info["clusterAddrTable"]["DefaultCluster"]) == ["broker-a", "broker-b"]
        assert {n: info["brokerAddrTable"][n]["brokerAddrs"]["0"] for n in masters} == masters

        for master in masters.values():
            create_topic(master, "LocalCluster", 4)
        poll(lambda: len((route(namesrv, "LocalCluster") or {}).get("brokerDatas", [])) == 2, 30, 0.3,
             what="route over both groups")
        results = produce(namesrv, [message("LocalCluster", f"m{i}") for i in range(20)], settle_ms=300)
        assert all(r is not None and r["status"] == 0 for r in results), results

        def stored(broker: str) -> int:
            return sum(int(rpc(broker, RequestCode.GET_MAX_OFFSET, {"topic": "LocalCluster", "queueId": str(q)})
                           .ext_fields["offset"]) for q in range(4))

        counts = {n: stored(addr) for n, addr in masters.items()}
        assert sum(counts.values()) == 20 and all(counts.values()), counts
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_local_group_with_tls_and_acl_from_secrets_in_the_manifest(tmp_path: Path) -> None:
    """spec.tls (enforcing) and spec.acl run locally from Secrets in the same file: the nameserver
    and brokers serve only TLS, with the manifest's certificate; requests must be signed; the slave
    replicates and its metadata sync (TLS, signed with the Secret's account) succeeds."""
    import base64

    import yaml

    from rmqbroker.acl import sign
    from rmqbroker.remoting.client import RemotingConnectError
    from tests.integration.test_tls import client_ctx, peer_certificate, send_ext, tls_rpc
    from tests.support.certs import TestCA

    ca = TestCA(tmp_path / "ca", name="local test CA")
    leaf = ca.issue("localhost")
    acl = yaml.safe_dump({"accounts": [
        {"accessKey": "local-admin", "secretKey": "local-admin-secret", "admin": True},
        {"accessKey": "app-user", "secretKey": "app-secret", "defaultTopicPerm": "PUB"}]})
    docs = [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "local-tls"},
         "data": {"tls.crt": base64.b64encode(leaf.cert.read_bytes()).decode(),
                  "tls.key": base64.b64encode(leaf.key.read_bytes()).decode(),
                  "ca.crt": base64.b64encode(ca.cert.read_bytes()).decode()}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "local-acl"},
         "stringData": {"plain_acl.yml": acl, "accessKey": "local-admin", "secretKey": "local-admin-secret"}},
        {"apiVersion": "rmq.brokergroup.dev/v1alpha1", "kind": "BrokerGroup", "metadata": {"name": "local-sec"},
         "spec": {"replicas": 2, "replication": "SYNC", "masterDiscovery": "Direct",
                  "tls": {"secretName": "local-tls", "mode": "enforcing"}, "acl": {"secretName": "local-acl"},
                  "brokerConfig": {"slaveSyncInitialDelay": "300", "slaveSyncInterval": "500"}}},
    ]
    with running_group(tmp_path, yaml.safe_dump_all(docs)) as g:
        def linked() -> list[Row] | None:
            rows = status_rows(g.data_dir)
            return rows if rows[1].ha == "connected" and rows[0].ha == "1/1 in sync" else None

        poll(linked, 30, 0.2, what="slave connected to the master")
        trusted = client_ctx(ca.cert)
        namesrv = f"127.0.0.1:{g.base + 29}"
        for addr in (namesrv, g.addr(0), g.addr(1)):
            assert peer_certificate(addr, trusted)["issuer"] == "CN=local test CA"
        # Enforcing: a plain connection gets no answer.
        try:
            plain = send_raw(g.addr(0), "LocalSecTopic", b"plain")
        except (OSError, RemotingConnectError):
            plain = None
        assert plain is None or plain.code != ResponseCode.SUCCESS
        # The ACL: unsigned refused, signed by the Secret's plain_acl.yml account accepted (a SYNC send:
        # the slave acknowledged it over the HA port).
        ext = send_ext("LocalSecTopic")
        resp = tls_rpc(g.addr(0), RequestCode.SEND_MESSAGE, trusted, dict(ext), b"unsigned")
        assert resp.code != ResponseCode.SUCCESS and "accessKey" in (resp.remark or ""), resp
        signed = dict(ext)
        sign(signed, b"signed", "app-user", "app-secret")
        resp = tls_rpc(g.addr(0), RequestCode.SEND_MESSAGE, trusted, signed, b"signed")
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        # The slave's metadata sync reaches the master over TLS and signs with the Secret's account.
        topics_file = g.data_dir / "broker-1" / "store" / "config" / "topics.json"

        def synced() -> bool:
            text = topics_file.read_text() if topics_file.exists() else "{}"
            return "LocalSecTopic" in (json.loads(text or "{}").get("topicConfigTable") or {})

        poll(synced, 15, what="the send's topic synced to the slave")
        sync = g.admin_status(1)["metadataSync"]
        assert sync["failures"] == 0 and sync["lastError"] is None, sync
        # Each broker has its own plain_acl.yml, as each Java broker has: a change sent to every
        # broker (rmq-admin deleteAccessConfig -c) is made on each. With one file for the group the
        # first made it for all and the second answered "Accesskey: app-user not existed" (210).
        for addr in (g.addr(0), g.addr(1)):
            delete = {"accessKey": "app-user"}
            sign(delete, b"", "local-admin", "local-admin-secret")
            resp = tls_rpc(addr, RequestCode.DELETE_ACL_CONFIG, trusted, delete, b"")
            assert resp.code == ResponseCode.SUCCESS, (addr, resp.code, resp.remark)
        for path in [*(g.data_dir / "secrets").rglob("*"), *g.data_dir.glob("broker-*.conf")]:
            if path.is_file():
                assert path.stat().st_mode & 0o077 == 0, f"{path} readable by others"


def test_local_group_says_why_a_broker_did_not_start(tmp_path: Path) -> None:
    """A broker that exits at its first start (here: the ACL Secret's plain_acl.yml is refused)
    stops `rmq-local up` with the broker's own reason, not only a log path."""
    manifest = tmp_path / "bg.yaml"
    manifest.write_text(
        "kind: Secret\nmetadata: {name: weak-acl}\n"
        "stringData: {plain_acl.yml: \"accounts:\\n  - {accessKey: ab, secretKey: cd}\\n\"}\n---\n"
        "kind: BrokerGroup\nmetadata: {name: local-w}\nspec: {replicas: 1, acl: {secretName: weak-acl}}\n")
    base = free_port_block(32) + 2
    out = subprocess.run([sys.executable, "-m", "rmqbroker.local", "up", str(manifest), "--once",
                          "--data-dir", str(tmp_path / "d"), "--base-port", str(base),
                          "--namesrv-port", str(base + 29)], capture_output=True, text=True, timeout=90, check=False)
    assert out.returncode == 1, out.stderr + out.stdout
    assert "broker-0 failed to start" in out.stderr
    assert "accessKey and secretKey need at least 6 characters" in out.stderr
