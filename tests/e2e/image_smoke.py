"""Smoke-check the built image with podman (``make image-smoke``); stdlib only.

Checks, in containers that run like the chart's pods (uid 10001, read-only root, no capabilities):
  * the image runs as uid 10001 and has the role entrypoints, each answering --help (rmq-broker,
    rmq-namesrv required; rmq-operator, rmq-verify, rmq-admin checked if present, required with
    --require-all),
    Java 17 and PySpark;
  * a nameserver and a broker started from the image: the broker answers ``GET /healthz`` on its admin
    port, and ``GET /readyz`` once it has registered with the nameserver.
Containers use the host network (``--network=host``; slirp port forwarding is unreliable in sandboxes)
on free loopback ports, and are removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REQUIRED_ENTRYPOINTS = ("rmq-broker", "rmq-namesrv")
OPTIONAL_ENTRYPOINTS = ("rmq-operator", "rmq-verify", "rmq-admin")
HARDENING = (
    "--user=10001:10001", "--read-only", "--tmpfs=/tmp",
    "--cap-drop=ALL", "--security-opt=no-new-privileges",
)


class Podman:
    def __init__(self, conf: Path | None) -> None:
        self.env = dict(os.environ)
        if conf is not None:
            self.env["CONTAINERS_CONF"] = str(conf.resolve())

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["podman", *args], capture_output=True, text=True, env=self.env,
                              timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def shell(self, image: str, script: str) -> subprocess.CompletedProcess[str]:
        return self.run("run", "--rm", "--pull=never", *HARDENING, "--network=none", image,
                        "sh", "-c", script, check=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def wait_status(podman: Podman, container: str, url: str, want: int, timeout: float) -> tuple[int | None, float]:
    """Poll ``url`` until it answers ``want``, the container stops, or ``timeout`` passes."""
    start = time.monotonic()
    status: int | None = None
    while time.monotonic() - start < timeout:
        status = http_status(url)
        if status == want:
            break
        state = podman.run("inspect", "--format", "{{.State.Running}}", container, check=False).stdout.strip()
        if state != "true":
            break
        time.sleep(0.5)
    return status, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="localhost/rmq-brokergroup:dev")
    parser.add_argument("--podman-conf", type=Path, default=None, help="containers.conf (CONTAINERS_CONF)")
    parser.add_argument("--require-all", action="store_true",
                        help="also require rmq-operator, rmq-verify and rmq-admin")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    podman = Podman(args.podman_conf)
    failures: list[str] = []

    size = podman.run("image", "inspect", "--format", "{{.Size}}", args.image).stdout.strip()
    print(f"image {args.image}: {int(size) / 1e6:.0f} MB")

    uid = podman.shell(args.image, "id -u").stdout.strip()
    print(f"runs as uid {uid}")
    if uid != "10001":
        failures.append(f"image runs as uid {uid!r}, want 10001")

    for name in (*REQUIRED_ENTRYPOINTS, *OPTIONAL_ENTRYPOINTS):
        found = podman.shell(args.image, f"command -v {name}").stdout.strip()
        if found:  # it must also import and parse its arguments, on a read-only root as a non-root user
            helped = podman.shell(args.image, f"{name} --help >/dev/null")
            state = found if helped.returncode == 0 else f"{found}, --help FAILED: {helped.stderr.strip()[-300:]}"
            if helped.returncode != 0:
                failures.append(f"{name} --help exits {helped.returncode}")
        else:
            state = "MISSING"
        print(f"entrypoint {name}: {state}")
        if not found and (name in REQUIRED_ENTRYPOINTS or args.require_all):
            failures.append(f"entrypoint {name} missing")

    java = podman.shell(args.image, "java -version 2>&1 | head -1")
    print(f"java: {java.stdout.strip() or java.stderr.strip()}")
    if 'version "17' not in java.stdout:
        failures.append("Java 17 runtime missing")
    spark = podman.shell(args.image, "python -c 'import pyspark; print(pyspark.__version__)'")
    print(f"pyspark: {spark.stdout.strip() or spark.stderr.strip()[-300:]}")
    if spark.returncode != 0:
        failures.append("pyspark does not import")

    # The wheel carries the mypyc build of the send path (setup.py); a pure-Python fallback would work
    # but at about twice the CPU per message.
    native = podman.shell(args.image, "python -c 'import rmqbroker.store.commitlog as m, "
                                      "rmqbroker.processors.send as s; print(m.__file__, s.__file__)'")
    print(f"compiled hot path: {native.stdout.strip() or native.stderr.strip()[-300:]}")
    if native.returncode != 0 or native.stdout.count(".so") != 2:
        failures.append("the send path is not compiled in the image")

    ns_port, listen_port, admin_port = free_port(), free_port(), free_port()
    suffix = f"{os.getpid()}"
    names = [f"rmq-smoke-namesrv-{suffix}", f"rmq-smoke-broker-{suffix}"]
    # The broker's store on a host directory, like a PersistentVolume (a podman tmpfs stays root-owned).
    data_dir = Path(tempfile.mkdtemp(prefix="rmq-smoke-data-"))
    data_dir.chmod(0o777)
    try:
        podman.run("run", "-d", "--pull=never", "--name", names[0], "--network=host", *HARDENING, args.image,
                   "rmq-namesrv", "--listen", f"127.0.0.1:{ns_port}")
        podman.run("run", "-d", "--pull=never", "--name", names[1], "--network=host", *HARDENING,
                   f"--volume={data_dir}:/data", args.image,
                   "rmq-broker", "-n", f"127.0.0.1:{ns_port}",
                   "--set", "brokerIP1=127.0.0.1", "--set", "listenHost=127.0.0.1",
                   "--set", f"listenPort={listen_port}", "--set", f"haListenPort={free_port()}",
                   "--set", f"adminListenPort={admin_port}", "--set", "storePathRootDir=/data/store")
        status, took = wait_status(podman, names[1], f"http://127.0.0.1:{admin_port}/healthz", 200, args.timeout)
        print(f"broker GET /healthz -> {status} after {took:.1f} s")
        if status != 200:
            failures.append(f"/healthz answered {status}")
        status, took = wait_status(podman, names[1], f"http://127.0.0.1:{admin_port}/readyz", 200, args.timeout)
        print(f"broker GET /readyz -> {status} after {took:.1f} s (registered with the nameserver)")
        if status != 200:
            failures.append(f"/readyz answered {status}")
    finally:
        for name in names:
            if failures:
                logs = podman.run("logs", name, check=False)
                print(f"----- {name} logs -----\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}")
            podman.run("rm", "-f", "-t", "5", name, check=False)
        shutil.rmtree(data_dir, ignore_errors=True)

    if failures:
        print("IMAGE SMOKE FAILED: " + "; ".join(failures))
        return 1
    print("image smoke OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
