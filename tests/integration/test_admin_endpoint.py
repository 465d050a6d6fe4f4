"""The broker's admin HTTP endpoint: open probes, token-protected status and metrics."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import Cluster
from tests.integration.helpers import message, poll, produce
from tests.support.procs import BrokerProc, free_port, metric_value

TOKEN = "s3cret-admin-token"


@pytest.fixture
def broker(cluster: Cluster) -> BrokerProc:
    ns = cluster.namesrv()
    return cluster.broker(ns.addr, token=TOKEN)


def test_probes_are_open(broker: BrokerProc) -> None:
    for path in ("/healthz", "/readyz"):
        assert broker.admin(path, token=None)[0] == 200
        assert broker.admin(path, token="wrong")[0] == 200


@pytest.mark.parametrize("path", ["/status", "/metrics"])
def test_status_and_metrics_need_the_token(broker: BrokerProc, path: str) -> None:
    for token in (None, "wrong", TOKEN + "x", TOKEN[:-1], ""):
        code, body = broker.admin(path, token=token)
        assert code == 401, (token, code)
        assert b"rmq_" not in body and b"maxPhyOffset" not in body
    # the scheme must be Bearer
    assert _basic_auth(broker, path)[0] == 401
    code, body = broker.admin(path)
    assert code == 200 and body


def _raw_http(port: int, request: bytes) -> bytes:
    """What the endpoint answers to ``request`` sent as it is."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        return s.recv(4096)


def test_a_token_outside_ascii_and_malformed_http_get_4xx_without_tracebacks(broker: BrokerProc) -> None:
    port = broker.admin_port
    answer = _raw_http(port, "GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer é\r\n"
                             "Connection: close\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 401"), answer[:80]
    for bad in (b"GET /status HTTP/9.9\r\n\r\n",
                b"GET /status HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n"):
        assert b" 400 " in _raw_http(port, bad).split(b"\r\n")[0]
    poll(lambda: broker.log_text().count("malformed HTTP request") >= 3, 5, 0.1, what="malformed requests logged")
    log = broker.log_text()
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]
    assert broker.admin("/status")[0] == 200


def _basic_auth(broker: BrokerProc, path: str) -> tuple[int, bytes]:
    """The token presented with the wrong scheme."""
    req = urllib.request.Request(f"http://127.0.0.1:{broker.admin_port}{path}")
    req.add_header("Authorization", f"Basic {TOKEN}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _probe(broker: BrokerProc, path: str) -> int | None:
    """The probe's HTTP status, or None while the endpoint is not listening yet."""
    try:
        return broker.admin(path, token=None)[0]
    except OSError:
        return None


def test_status_content(cluster: Cluster, broker: BrokerProc) -> None:
    status = broker.status()
    for key in ("cluster", "brokerName", "brokerId", "role", "maxPhyOffset", "minPhyOffset", "topics",
                "dataVersions"):
        assert key in status, key
    assert (status["cluster"], status["brokerName"], status["brokerId"], status["role"]) == \
        ("DefaultCluster", "broker-a", 0, "ASYNC_MASTER")
    assert status["maxPhyOffset"] == status["minPhyOffset"] == 0
    topics_before = status["topics"]
    version_before = status["dataVersions"]["topics"]

    ns_addr = broker.conf["namesrvAddr"]
    produce(ns_addr, [message("StatusTopic", f"s{i}") for i in range(3)])
    status = broker.status()
    # the sends reached the store and auto-created a topic (bumping the topics' data version)
    assert status["maxPhyOffset"] > 0
    assert status["topics"] == topics_before + 1
    assert status["dataVersions"]["topics"] != version_before
    metrics = broker.metrics()
    assert metric_value(metrics, "rmq_messages_in_total") == 3
    assert metric_value(metrics, "rmq_commitlog_max_offset") == status["maxPhyOffset"]
    json.dumps(status)  # plain JSON all the way down


def test_readyz_waits_for_nameserver_registration(cluster: Cluster) -> None:
    ns_port = free_port()
    broker = cluster.broker(f"127.0.0.1:{ns_port}", start=False, token=TOKEN)
    broker.start(wait_ready=False)
    poll(lambda: _probe(broker, "/healthz") == 200, timeout=15, what="healthz")
    # alive but not registered anywhere: not ready
    assert broker.admin("/readyz", token=None)[0] == 503
    assert broker.status()["registered"] is False
    cluster.namesrv(port=ns_port)
    poll(lambda: broker.admin("/readyz", token=None)[0] == 200, timeout=15, what="readyz after registration")
    assert broker.status()["registered"] is True


def test_without_a_configured_token_one_is_generated_never_an_open_endpoint(cluster: Cluster) -> None:
    b = cluster.broker(None, name="broker-notoken", token="")
    token_file = b.store_dir / "config" / "adminToken"
    token = token_file.read_text().strip()
    assert len(token) >= 32 and token_file.stat().st_mode & 0o077 == 0
    assert b.admin("/status", token=None)[0] == 401
    assert b.admin("/readyz", token=None)[0] == 200
    assert b.admin("/status", token=token)[0] == 200
    b.stop()
    b.start()  # the same token across restarts: clients keep working
    assert b.admin("/status", token=token)[0] == 200


def test_an_empty_token_file_is_a_configuration_error(cluster: Cluster) -> None:
    empty = cluster.workdir / "empty-token"
    empty.write_text("\n")
    b = cluster.broker(None, start=False, name="broker-emptytoken", token="", adminTokenFile=str(empty))
    b.start(wait_ready=False)
    assert b.popen is not None and b.popen.wait(20) == 2
    assert "adminTokenFile" in b.log_text() and "empty" in b.log_text()


def _soft_nofile(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as fh:
        line = next(x for x in fh if x.startswith("Max open files"))
    return int(line.split()[3])


def test_open_files_limit_is_raised_and_exported(cluster: Cluster) -> None:
    """A broker started from a shell's low soft limit raises it to the hard limit (its store files
    and connections each hold a descriptor), and /metrics shows descriptors in use and the limit."""
    import resource
    import sys

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    low = 256
    if hard != resource.RLIM_INFINITY and hard <= low:
        pytest.skip(f"hard open-files limit {hard} leaves nothing to raise")
    broker = cluster.broker(None, token=TOKEN, start=False)
    # Start it the way `ulimit -Sn 256; rmq-broker ...` would.
    shim = (f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({low}, {hard!r})); "
            "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
    broker.args = [sys.executable, "-c", shim, *broker.args[1:]]
    broker.start()
    assert broker.popen is not None
    expected = (1 << 20) if hard == resource.RLIM_INFINITY else hard
    assert _soft_nofile(broker.popen.pid) == expected
    code, body = broker.admin("/metrics")
    assert code == 200
    text = body.decode()
    assert metric_value(text, "process_max_fds") == expected
    open_fds = metric_value(text, "process_open_fds")
    assert 10 < open_fds < expected
    assert metric_value(text, "process_resident_memory_bytes") > 10 * 1024 * 1024
    assert "open-files limit raised from 256" in broker.log_text()


def test_a_request_trickled_byte_by_byte_is_closed_after_the_idle_time(cluster: Cluster) -> None:
    """Slowloris: a peer that never completes its request's headers (one header line now and
    then) must not hold a connection, and the file descriptor behind it, for aiohttp's default
    hour; it is closed after serverChannelMaxIdleTimeSeconds, as on the remoting port."""
    broker = cluster.broker(None, token=TOKEN, serverChannelMaxIdleTimeSeconds=2)
    with socket.create_connection(("127.0.0.1", broker.admin_port), timeout=0.1) as s:
        s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        closed_after: float | None = None
        while time.monotonic() - started < 10:
            time.sleep(0.3)
            try:
                s.sendall(b"X-Slow: 1\r\n")
                if s.recv(4096, socket.MSG_DONTWAIT) == b"":
                    closed_after = time.monotonic() - started
                    break
            except (BlockingIOError, TimeoutError):  # nothing to read yet: still open
                continue
            except OSError:
                closed_after = time.monotonic() - started
                break
    assert closed_after is not None, "the admin endpoint kept a stalled request open for 10 s"
    assert closed_after < 5, closed_after
    assert broker.admin("/status")[0] == 200
