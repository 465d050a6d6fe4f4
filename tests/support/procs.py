"""Start real `rmq-namesrv` / `rmq-broker` processes on free loopback ports and wait until they serve."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PY = sys.executable


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return low, high


# Ports are picked below the kernel's ephemeral range: a port picked inside it can be taken as the
# local port of some outgoing connection (a client, a slave's HA link) between the pick and the
# server's bind, which then fails with "address already in use".
_EPHEMERAL = _ephemeral_range()
_PICK_LOW = 10000
_PICK_HIGH = _EPHEMERAL[0] if _EPHEMERAL[0] - _PICK_LOW >= 2000 else 65535
_rng = random.Random()
# The ports handed out last (set for lookups, deque for their order).
_recent: set[int] = set()
_recent_order: collections.deque[int] = collections.deque()


def _bindable(ports: range) -> bool:
    socks: list[socket.socket] = []
    try:
        for port in ports:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def free_port_block(n: int) -> int:
    """A base port with n consecutive free ports (broker: listen, listen+1 for HA), outside the
    ephemeral range when the system leaves room below it."""
    low, high = _EPHEMERAL
    for _ in range(500):
        base = _rng.randrange(_PICK_LOW, _PICK_HIGH - n)
        if _PICK_HIGH == 65535 and base + n > low and base <= high:
            continue  # no room below the ephemeral range: at least stay out of it
        ports = range(base, base + n)
        # Nothing reserves a port until its process binds it: never hand one out twice in a row.
        if not _recent.isdisjoint(ports) or not _bindable(ports):
            continue
        _recent.update(ports)
        _recent_order.extend(ports)
        while len(_recent_order) > 1024:
            _recent.discard(_recent_order.popleft())
        return base
    raise RuntimeError(f"no block of {n} free ports in [{_PICK_LOW}, {_PICK_HIGH})")


def free_port() -> int:
    return free_port_block(1)


def wait_port(port: int, timeout: float = 15.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {host}:{port} did not open within {timeout}s")


@dataclass
class Proc:
    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        return self

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def signal(self, sig: int) -> None:
        assert self.popen is not None
        self.popen.send_signal(sig)

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)  # a SIGSTOPped process would never see the SIGTERM
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._log.close()
        return self.popen.returncode

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Namesrv(Proc):
    def __init__(self, workdir: Path, port: int | None = None, expiry: float = 120.0,
                 scan_interval: float | None = None, kv_config_path: Path | None = None,
                 order_message_enable: bool = False, extra_args: list[str] | None = None) -> None:
        self.port = port or free_port()
        # The KV config under the test's directory, never the default ~/namesrv/kvConfig.json.
        self.kv_config_path = kv_config_path or workdir / f"namesrv-{self.port}" / "kvConfig.json"
        args = [PY, "-m", "rmqbroker.namesrv.main", "--listen", f"127.0.0.1:{self.port}",
                "--broker-expiry-seconds", str(expiry), "--kv-config-path", str(self.kv_config_path)]
        if scan_interval is not None:
            args += ["--scan-interval-seconds", str(scan_interval)]
        if order_message_enable:
            args += ["--order-message-enable"]
        args += extra_args or []
        super().__init__(args, workdir / f"namesrv-{self.port}.log")

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Namesrv:
        super().start()
        wait_port(self.port)
        return self


class BrokerProc(Proc):
    """A broker with its own store under workdir; ``conf`` overrides broker.conf keys."""

    def __init__(self, workdir: Path, namesrv: str | None, name: str = "broker-a", broker_id: int = 0,
                 role: str = "ASYNC_MASTER", token: str = "test-token", **conf: Any) -> None:
        base = free_port_block(4)  # VIP channel, (unused), listen, HA: listenPort - 2 is the VIP default
        self.port = base + 2
        self.fast_port = base
        self.admin_port = free_port()
        self.token = token
        self.store_dir = workdir / f"store-{name}-{broker_id}"
        self.conf: dict[str, Any] = {
            "brokerClusterName": "DefaultCluster",
            "brokerName": name,
            "brokerId": broker_id,
            "brokerRole": role,
            "flushDiskType": "ASYNC_FLUSH",
            "brokerIP1": "127.0.0.1",
            "listenHost": "127.0.0.1",
            "listenPort": base + 2,
            "haListenPort": base + 3,
            "fastListenPort": base,
            "adminListenPort": self.admin_port,
            "adminToken": token,
            "storePathRootDir": str(self.store_dir),
            "mappedFileSizeCommitLog": 16 * 1024 * 1024,
            "mappedFileSizeConsumeQueue": 60000,
        }
        if namesrv:
            self.conf["namesrvAddr"] = namesrv
        self.conf.update(conf)
        self.conf_path = workdir / f"broker-{name}-{broker_id}.conf"
        self.write_conf()
        super().__init__([PY, "-m", "rmqbroker.main", "-c", str(self.conf_path)],
                         workdir / f"broker-{name}-{broker_id}.log")

    def write_conf(self) -> None:
        self.conf_path.write_text("".join(f"{k}={v}\n" for k, v in self.conf.items()))

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, wait_ready: bool = True) -> BrokerProc:
        super().start()
        if wait_ready:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                raise RuntimeError(f"broker exited:\n{self.log_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"broker not ready in {timeout}s:\n{self.log_text()[-3000:]}")

    def admin(self, path: str, method: str = "GET", body: bytes | None = None, token: str | None = "default",
              ) -> tuple[int, bytes]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}", data=body, method=method)
        tok = self.token if token == "default" else token
        if tok:
            req.add_header("Authorization", f"Bearer {tok}")
        # A role change persists the epoch file; on a loaded CI machine two promotions took just
        # over 10 s (cause not shown; the broker now logs a slow promotion's steps). The operator
        # allows control calls 15 s; the suite allows 30 s so such a stall is logged, not fatal.
        timeout = 10 if method == "GET" else 30
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def status(self) -> dict[str, Any]:
        code, body = self.admin("/status")
        assert code == 200, body
        result: dict[str, Any] = json.loads(body)
        return result

    def metrics(self) -> str:
        code, body = self.admin("/metrics")
        assert code == 200, body
        return body.decode()


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include ``labels``."""
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
            found = True
    if not found:
        raise KeyError(f"metric {name} {labels} not found")
    return total
