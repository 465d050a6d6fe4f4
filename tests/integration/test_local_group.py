"""`rmq-local up` runs a BrokerGroup manifest as real processes (the README's main job)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
        base = free_port_block(30)
        namesrv_port = base + 29  # brokers use base + 10 * id + {0, 1, 5}
        out = subprocess.run([sys.executable, "-m", "rmqbroker.local", "up", str(manifest), "--once",
                              "--data-dir", str(tmp_path / "data"), "--base-port", str(base),
                              "--namesrv-port", str(namesrv_port)],
                             capture_output=True, text=True, timeout=120, check=False)
        if "ports in use" not in out.stderr:
            break
    assert out.returncode == 0, out.stderr + out.stdout
    lines = out.stdout.splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("ID"))) + 1:]
    assert [row.split()[1] for row in table] == ["SYNC_MASTER", "SLAVE"]
    assert all(row.split()[-1] == "UP" for row in table)
    conf = (tmp_path / "data" / "broker-1.conf").read_text()
    assert "brokerRole=SLAVE" in conf and "haMasterAddress" not in conf  # NameServer discovery
    assert "defaultTopicQueueNums=2" in conf


def test_local_group_rejects_bad_manifest(tmp_path: Path) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text("kind: BrokerGroup\nmetadata: {name: x}\nspec: {replicas: 9}\n")
    out = subprocess.run([sys.executable, "-m", "rmqbroker.local", "up", str(manifest), "--once",
                          "--data-dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=30,
                         check=False)
    assert out.returncode == 2 and "replicas" in out.stderr


def test_local_group_stops_every_process_on_sigterm(tmp_path: Path) -> None:
    import signal
    import time

    manifest = tmp_path / "bg.yaml"
    manifest.write_text("kind: BrokerGroup\nmetadata: {name: local-b}\nspec: {replicas: 2, replication: ASYNC}\n")
    base = free_port_block(30)
    proc = subprocess.Popen([sys.executable, "-m", "rmqbroker.local", "up", str(manifest),
                             "--data-dir", str(tmp_path / "data"), "--base-port", str(base),
                             "--namesrv-port", str(base + 29)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        state = tmp_path / "data" / "state.json"
        deadline = time.monotonic() + 60
        while not state.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert state.exists(), "group did not come up"
        import json

        pids = [b["pid"] for b in json.loads(state.read_text())["brokers"]]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            raise AssertionError(f"broker {pid} still running after rmq-local stopped")
    finally:
        if proc.poll() is None:
            proc.kill()
