"""Test-only stand-in for the StatefulSet controller and the kubelet, on loopback addresses.

It reads what the operator created in the emulator (StatefulSets, their pod templates, the
ConfigMap and Secret volumes), creates the Pod objects, "runs" each pod's container and reports
``status.podIP`` and the Ready condition from the container's readiness probe -- the part of a
cluster the emulator does not have. Every pod gets its own loopback address (127.x.y.z), so all
brokers use the ports the operator rendered, as in a cluster.

Backends:

* :class:`ProcessBackend` starts the real ``rmqbroker`` processes (``rmq-broker`` /
  ``rmq-namesrv`` from the container command), with the mounted files written to a per-pod
  folder, in-cluster DNS names in the rendered config rewritten to the pods' loopback addresses,
  and ``listenHost`` set to the pod's address (a container would bind 0.0.0.0 in its own network
  namespace).
* :class:`FakeBackend` serves only the admin API (``/status``, ``/role``, ``/ha/master``,
  ``/readyz``) from an in-process fake, for fast operator tests that need no real broker.

Like a StatefulSet controller it recreates deleted pods (with a new IP) from the current
template, creates and removes pods on scale, and removes every pod of a deleted StatefulSet.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from tests.operator.emulator import NS, ApiFailure, Client, LoopThread

log = logging.getLogger(__name__)

POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
MODULES = {"rmq-broker": "rmqbroker.main", "rmq-namesrv": "rmqbroker.namesrv.main"}


def loopback_prefix() -> str:
    """A random 127.a.b. prefix so concurrent or leftover tests never share addresses."""
    return f"127.{random.randint(10, 250)}.{random.randint(1, 250)}."


@dataclass
class Container:
    """One running container of a pod (whatever the backend runs)."""

    pod: str
    ip: str
    handle: Any
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    exited: bool = False
    restarts: int = 0
    # The kubelet's containerStatuses[].started: the startup probe has passed since the start.
    probed: bool = False


class Backend(Protocol):
    def start(self, runner: PodRunner, pod: dict[str, Any], ip: str, files: dict[str, Path],
              env: dict[str, str], args: list[str]) -> Any: ...

    def stop(self, handle: Any, kill: bool = False) -> None: ...

    def alive(self, handle: Any) -> bool: ...


# ---------------------------------------------------------------- the runner
class PodRunner:
    def __init__(self, client: Client, workdir: Path, backend: Backend, interval: float = 0.2) -> None:
        self.client = client
        self.workdir = workdir
        self.backend = backend
        self.interval = interval
        self.prefix = loopback_prefix()
        self._next_ip = 2
        self.ips: dict[str, str] = {}  # pod -> current IP
        self.containers: dict[str, Container] = {}
        self.held: set[str] = set()  # pods whose container stays down (killed, not restarted)
        self.stale: set[str] = set()  # pods whose next start keeps the previously mounted ConfigMap files
        self.deleted: list[str] = []  # pods the runner saw deleted (by the operator), in order
        self.created: list[str] = []
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-runner", daemon=True)
        self._published: dict[str, tuple[Any, ...]] = {}

    # -- lifecycle --
    def start(self) -> PodRunner:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with self.lock:
            for c in list(self.containers.values()):
                self.backend.stop(c.handle)
            self.containers.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except (ApiFailure, OSError) as exc:
                log.warning("pod runner round failed: %s", exc)
            except Exception:
                log.exception("pod runner round failed")
            self._stop.wait(self.interval)

    # -- test controls --
    def kill(self, pod: str) -> None:
        """SIGKILL the pod's container and keep it down (the pod object stays, not Ready)."""
        with self.lock:
            self.held.add(pod)
            c = self.containers.get(pod)
            if c is not None:
                self.backend.stop(c.handle, kill=True)
                c.exited = True
                c.ready = False

    def restart(self, pod: str, stale_config: bool = False) -> None:
        """Let the kubelet restart the pod's container (same pod, same IP).

        The container reads the current ConfigMap, or with ``stale_config`` the files it had
        before (the kubelet syncs ConfigMap volumes with a delay of up to a minute or so).
        """
        with self.lock:
            if stale_config:
                self.stale.add(pod)
            self.held.discard(pod)

    def wipe(self, pod: str) -> None:
        """Empty the pod's volume claims, as a replaced volume would (with its container down)."""
        for claim in (self.workdir / "pvc").glob(f"*-{pod}"):
            shutil.rmtree(claim)
            claim.mkdir()

    def ip_of(self, pod: str) -> str:
        return self.ips[pod]

    def container(self, pod: str) -> Container | None:
        return self.containers.get(pod)

    # -- reconcile --
    def _alloc_ip(self, pod: str) -> str:
        ip = f"{self.prefix}{self._next_ip}"
        self._next_ip += 1
        self.ips[pod] = ip
        return ip

    def sync(self) -> None:
        with self.lock:
            stss = [s for s in self.client.items("apps/v1", "statefulsets")
                    if (s["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "rmq-operator"]
            pods = {p["metadata"]["name"]: p for p in self.client.items("v1", "pods")}
            wanted: dict[str, tuple[dict[str, Any], int]] = {}
            for sts in stss:
                for o in range(int(sts["spec"].get("replicas", 1))):
                    wanted[f"{sts['metadata']['name']}-{o}"] = (sts, o)
            # Pods deleted through the API (rolling restart, fallback) or no longer wanted.
            for name in list(self.containers):
                if name not in pods or name not in wanted:
                    self.backend.stop(self.containers.pop(name).handle)
                    self._published.pop(name, None)
                    if name not in pods:
                        self.deleted.append(name)
                        self.held.discard(name)  # a new pod gets a new container
            for name, pod in pods.items():
                if name not in wanted and self._ours(pod):
                    self.client.delete("v1", "pods", name)
                    self._published.pop(name, None)
            # New pods: every IP first, so a config naming another pod can be rewritten.
            new = [(n, s, o) for n, (s, o) in sorted(wanted.items()) if n not in pods]
            for name, _, _ in new:
                self._alloc_ip(name)
            for name, sts, o in new:
                pod = self._create_pod(sts, name, o)
                pods[name] = pod
                self.created.append(name)
            for name in sorted(wanted):
                self._run_container(name, pods[name])
            for name in sorted(wanted):
                self._publish(name)

    @staticmethod
    def _ours(pod: dict[str, Any]) -> bool:
        return (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "rmq-operator"

    def _create_pod(self, sts: dict[str, Any], name: str, ordinal: int) -> dict[str, Any]:
        tmpl = sts["spec"]["template"]
        meta = tmpl.get("metadata") or {}
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": NS,
                "labels": {**(meta.get("labels") or {}), POD_INDEX_LABEL: str(ordinal),
                           "statefulset.kubernetes.io/pod-name": name},
                "annotations": dict(meta.get("annotations") or {}),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts["metadata"]["name"],
                                     "uid": sts["metadata"].get("uid", ""), "controller": True}],
            },
            "spec": {**tmpl["spec"], "hostname": name, "subdomain": sts["spec"].get("serviceName")},
        }
        return self.client.create(pod, "pods")

    def _run_container(self, name: str, pod: dict[str, Any]) -> None:
        c = self.containers.get(name)
        if c is not None:
            if not c.exited and not self.backend.alive(c.handle):
                c.exited, c.ready = True, False
            if c.exited and name not in self.held:
                self.backend.stop(c.handle)
                restarts = c.restarts + 1
                self.containers.pop(name)
                self._start(name, pod, restarts)
            elif not c.exited:
                c.ready = self._probe(pod, self.ips[name])
                c.probed = c.probed or c.ready
            return
        if name in self.held:
            return
        self._start(name, pod, 0)

    def _start(self, name: str, pod: dict[str, Any], restarts: int) -> None:
        ip = self.ips[name]
        spec = pod["spec"]
        container = spec["containers"][0]
        env = self._env(pod, container, ip)
        files = self._mount(name, spec, container)
        args = [self.rewrite(self._expand(a, env), files) for a in container.get("args") or []]
        handle = self.backend.start(self, pod, ip, files, env, args)
        self.stale.discard(name)
        self.containers[name] = Container(pod=name, ip=ip, handle=handle, restarts=restarts)

    def _env(self, pod: dict[str, Any], container: dict[str, Any], ip: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
                continue
            path = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
            if path == "status.podIP":
                env[item["name"]] = ip
            elif path == "metadata.name":
                env[item["name"]] = pod["metadata"]["name"]
            elif m := re.fullmatch(r"metadata\.labels\['(.+)'\]", path):
                env[item["name"]] = (pod["metadata"].get("labels") or {}).get(m.group(1), "")
        return env

    @staticmethod
    def _expand(arg: str, env: dict[str, str]) -> str:
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)

    def _mount(self, pod: str, spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Path]:
        """Materialize the container's volumes under the pod's folder: mountPath -> local folder."""
        root = self.workdir / "pods" / pod
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        out: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or []:
            vol = volumes.get(mount["name"])
            if vol is None:  # a volumeClaimTemplate: persistent per pod name, like a PVC
                local = self.workdir / "pvc" / f"{mount['name']}-{pod}"
                local.mkdir(parents=True, exist_ok=True)
            elif "configMap" in vol:
                local = root / mount["name"]
                if pod in self.stale and local.exists():
                    out[mount["mountPath"]] = local
                    continue
                shutil.rmtree(local, ignore_errors=True)
                local.mkdir(parents=True)
                cm = self.client.get("v1", "configmaps", vol["configMap"]["name"]) or {}
                for key, text in (cm.get("data") or {}).items():
                    (local / key).write_text(text)
            elif "secret" in vol:
                local = root / mount["name"]
                shutil.rmtree(local, ignore_errors=True)
                local.mkdir(parents=True)
                sec = self.client.get("v1", "secrets", vol["secret"]["secretName"]) or {}
                for key, b64 in (sec.get("data") or {}).items():
                    (local / key).write_bytes(base64.b64decode(b64))
            else:
                local = root / mount["name"]
                local.mkdir(parents=True, exist_ok=True)
            out[mount["mountPath"]] = local
        return out

    def rewrite(self, text: str, files: dict[str, Path]) -> str:
        """Mount paths -> local folders, cluster DNS names of known pods -> their loopback IPs."""
        if files:
            # One pass, whole path components only: local folders may themselves start with /tmp.
            alternation = "|".join(re.escape(m) for m in sorted(files, key=len, reverse=True))
            text = re.sub(rf"(?<![\w./-])({alternation})(?=/|\s|$)", lambda m: str(files[m.group(1)]), text,
                          flags=re.MULTILINE)

        def dns(m: re.Match[str]) -> str:
            return self.ips.get(m.group(1), m.group(0))

        return re.sub(r"([a-z0-9-]+)\.[a-z0-9-]+\.[a-z0-9-]+\.svc(?:\.cluster\.local)?", dns, text)

    def _probe(self, pod: dict[str, Any], ip: str) -> bool:
        container = pod["spec"]["containers"][0]
        probe = container.get("readinessProbe") or {}
        ports = {p["name"]: p["containerPort"] for p in container.get("ports") or []}
        try:
            if "httpGet" in probe:
                port = probe["httpGet"]["port"]
                port = ports.get(port, port)
                with urllib.request.urlopen(f"http://{ip}:{port}{probe['httpGet']['path']}", timeout=0.5) as r:
                    return bool(r.status == 200)
            if "tcpSocket" in probe:
                port = probe["tcpSocket"]["port"]
                with socket.create_connection((ip, int(ports.get(port, port))), timeout=0.5):
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return True

    def _publish(self, name: str) -> None:
        """Write the pod's status (IP, Ready, container state) when it changed."""
        c = self.containers.get(name)
        ip = self.ips.get(name)
        running = c is not None and not c.exited
        ready = bool(c and c.ready and running)
        started = bool(c and c.probed and running)
        key = (ip, ready, running, started, c.restarts if c else 0)
        if self._published.get(name) == key:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        state: dict[str, Any] = {"running": {"startedAt": now}} if running else {
            "terminated": {"exitCode": 137, "reason": "Error", "finishedAt": now}}
        status = {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now},
                           {"type": "ContainersReady", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "main", "ready": ready, "started": started,
                                   "restartCount": c.restarts if c else 0, "state": state}],
        }
        try:
            self.client.patch("v1", "pods", name, {"status": status}, sub="status")
            self._published[name] = key
        except ApiFailure as exc:
            if exc.status != 404:
                raise


# ---------------------------------------------------------------- real processes
@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log_path: Path
    log: Any


class ProcessBackend:
    """Runs the container's command as a real local process."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.logs: dict[str, list[Path]] = {}

    def start(self, runner: PodRunner, pod: dict[str, Any], ip: str, files: dict[str, Path],
              env: dict[str, str], args: list[str]) -> Proc:
        name = pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        module = MODULES[container["command"][0]]
        local_args = []
        for a in args:
            local_args.append(ip + a[len("0.0.0.0"):] if a.startswith("0.0.0.0:") else a)
        if module == "rmqbroker.main":
            conf_path = Path(local_args[local_args.index("-c") + 1])
            text = conf_path.read_text()
            if "\nlistenHost=" not in text:  # not yet localized (a stale restart reuses the file as is)
                text = runner.rewrite(text, files)
                # The container binds 0.0.0.0 in its own network namespace; here the pod's address.
                text += f"listenHost={ip}\n"
                conf_path.write_text(text)
        for local in files.values():
            # spec.tls's tls.properties names the Secret's mount path: point it at the local folder.
            props = local / "tls.properties"
            if props.is_file():
                props.write_text(runner.rewrite(props.read_text(), files))
        log_path = self.workdir / "logs" / f"{name}-{len(self.logs.get(name, []))}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.logs.setdefault(name, []).append(log_path)
        logf = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        popen = subprocess.Popen([sys.executable, "-m", module, *local_args], stdout=logf, stderr=subprocess.STDOUT,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, start_new_session=True)
        return Proc(popen, log_path, logf)

    def stop(self, handle: Proc, kill: bool = False) -> None:
        p = handle.popen
        if p.poll() is None:
            p.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        with contextlib.suppress(Exception):
            handle.log.close()

    def alive(self, handle: Proc) -> bool:
        return handle.popen.poll() is None

    def log_tail(self, pod: str, chars: int = 3000) -> str:
        paths = self.logs.get(pod, [])
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in paths if p.exists())


# ---------------------------------------------------------------- fake brokers
@dataclass
class FakeBroker:
    """The admin API of a broker, with the state the operator reads and changes."""

    conf: dict[str, str]
    ip: str
    role: str = ""
    broker_id: int = 0
    epoch: int = 0
    own_epoch: int | None = None  # the latest epoch it began as a promoted master
    max_offset: int = 1000
    ha_master: str | None = None
    fence: int = 0  # POST /ha/fence: masters below this epoch are not followed until a re-point
    fence_route: bool = True
    fence_fails: bool = False  # the fence answers 500 (a broker that cannot drop its master)
    lose_promotion_answer: bool = False  # a promotion is carried out but answered 500 (a lost answer)
    promotion_seconds: float = 0.0  # how long a promotion takes before it is carried out and answered
    status_hangs: bool = False  # GET /status answers nothing while set (a hung process, a partition)
    fence_seconds: float = 0.0  # how long POST /ha/fence takes before it is carried out and answered
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    runner: web.AppRunner | None = None
    # HA address -> the live fake serving it (a slave is connected when its master is up)
    peers: dict[str, FakeBroker] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.role = self.conf.get("brokerRole", "ASYNC_MASTER")
        self.broker_id = int(self.conf.get("brokerId", "0"))
        self.ha_master = self.conf.get("haMasterAddress") or None

    @property
    def ha_address(self) -> str:
        return f"{self.ip}:{self.conf.get('haListenPort')}"

    def status(self) -> dict[str, Any]:
        slave = self.role == "SLAVE"
        master = self.peers.get(self.ha_master or "")
        connected = slave and master is not None and master.role != "SLAVE" and master.epoch >= self.fence
        if connected:
            assert master is not None
            self.epoch = max(self.epoch, master.epoch)  # a real slave adopts its master's epoch history
        return {"role": self.role, "brokerId": self.broker_id, "epoch": self.epoch, "ownEpoch": self.own_epoch,
                "maxPhyOffset": self.max_offset,
                "brokerAddr": f"{self.ip}:{self.conf.get('listenPort')}",
                "ha": {"masterAddress": self.ha_master if slave else None, "connected": connected, "slaves": [],
                       "fencedBelowEpoch": self.fence if self.fence > self.epoch else 0}}

    async def _status(self, request: web.Request) -> web.Response:
        while self.status_hangs:  # noqa: ASYNC110 - set by the test's thread, not this loop's
            await asyncio.sleep(0.1)
        return web.json_response(self.status())

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _role(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("role", body))
        if body["role"] != "SLAVE" and self.promotion_seconds:
            await asyncio.sleep(self.promotion_seconds)
        if body["epoch"] < self.epoch:
            return web.json_response({"error": "stale epoch"}, status=409)
        if self.role == "SLAVE" and body["role"] != "SLAVE" and (body["epoch"] > self.epoch
                                                                  or self.own_epoch == self.epoch):
            self.own_epoch = body["epoch"]  # a promotion begins its epoch (or retries its own)
        self.role, self.broker_id, self.epoch = body["role"], body["brokerId"], body["epoch"]
        extra = {"drained": True} if body.get("drainMillis") else {}
        if body.get("syncMetadata"):
            extra["metadataSynced"] = True
        if self.lose_promotion_answer and self.role != "SLAVE":
            return web.json_response({"error": "answer lost"}, status=500)
        return web.json_response({"role": self.role, "brokerId": self.broker_id, "epoch": self.epoch,
                                  "maxPhyOffset": self.max_offset, **extra})

    async def _repoint(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("repoint", body))
        if self.role != "SLAVE":
            return web.json_response({"error": "not a slave"}, status=409)
        self.ha_master = body["haAddress"]
        self.epoch = max(self.epoch, body.get("epoch") or 0)
        self.fence = 0
        return web.json_response(body)

    async def _fence(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("fence", body))
        if self.fence_seconds:
            await asyncio.sleep(self.fence_seconds)
        if self.fence_fails:
            return web.json_response({"error": "fence failed"}, status=500)
        if self.role != "SLAVE":
            return web.json_response({"error": "only a slave is fenced"}, status=409)
        self.fence = max(self.fence, body["epoch"])
        return web.json_response({"epoch": self.epoch, "fencedBelowEpoch": self.fence, "maxPhyOffset": self.max_offset})

    async def start(self, port: int) -> None:
        app = web.Application()
        app.router.add_get("/status", self._status)
        app.router.add_get("/readyz", self._ok)
        app.router.add_get("/healthz", self._ok)
        app.router.add_post("/role", self._role)
        app.router.add_post("/ha/master", self._repoint)
        if self.fence_route:
            app.router.add_post("/ha/fence", self._fence)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.ip, port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


class FakeBackend:
    """Brokers are :class:`FakeBroker` admin endpoints; nameservers are plain TCP listeners."""

    def __init__(self) -> None:
        self.loop = LoopThread("fake-brokers")
        self.brokers: dict[str, FakeBroker] = {}  # pod -> its current fake
        self.peers: dict[str, FakeBroker] = {}
        self.fence = True  # False: brokers of an older image, without POST /ha/fence
        self.lost_promotion_answers: set[str] = set()  # pods whose promotions are answered 500

    def start(self, runner: PodRunner, pod: dict[str, Any], ip: str, files: dict[str, Path],
              env: dict[str, str], args: list[str]) -> Any:
        name = pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        if container["command"][0] == "rmq-namesrv":
            srv = socket.socket()
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind((ip, int(container["ports"][0]["containerPort"])))
            srv.listen()
            return srv
        conf_path = Path(args[args.index("-c") + 1])
        from rmqbroker.properties import parse_properties

        text = conf_path.read_text()
        conf = parse_properties(text if "\nlistenHost=" in text else runner.rewrite(text, files))
        broker = FakeBroker(conf, ip, peers=self.peers, fence_route=self.fence,
                            lose_promotion_answer=name in self.lost_promotion_answers)
        self.loop.call(broker.start(int(conf["adminListenPort"])))
        self.brokers[name] = broker
        self.peers[broker.ha_address] = broker
        return broker

    def stop(self, handle: Any, kill: bool = False) -> None:
        if isinstance(handle, FakeBroker):
            self.peers.pop(handle.ha_address, None)
            self.loop.call(handle.stop())
        else:
            handle.close()

    def alive(self, handle: Any) -> bool:
        return True

    def close(self) -> None:
        self.loop.stop()
