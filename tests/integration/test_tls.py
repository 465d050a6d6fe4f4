"""TLS on the remoting ports (RocketMQ's tls.server.mode, tls.enable and tls.properties), with real
processes: the permissive default serves the stock C++ client in plain and a TLS client on the same
port; enforcing refuses plain connections and, with client authentication, clients without a
certificate the CA signed; brokers register with a TLS nameserver and slaves sync their master's
metadata over TLS; bad TLS settings stop the start with a message naming the key."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rmqbroker.admin_cli import main as admin_main
from rmqbroker.remoting.client import RemotingClient, RemotingConnectError
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from tests.conftest import Cluster
from tests.integration.helpers import message, metric_delta, poll, produce, rpc
from tests.support.certs import TestCA
from tests.support.procs import free_port, metric_value

PY = sys.executable


def tls_rpc(addr: str, code: int, ctx: ssl.SSLContext, ext: dict[str, str] | None = None, body: bytes = b"",
            timeout: float = 5.0) -> RemotingCommand:
    """One request over TLS on a fresh connection; the response."""

    async def call() -> RemotingCommand:
        client = RemotingClient(ssl_context=ctx)
        try:
            return await client.invoke(addr, RemotingCommand(code, ext_fields=dict(ext or {}), body=body), timeout)
        finally:
            await client.close()

    return asyncio.run(call())


def client_ctx(ca: Path | None = None, cert: Path | None = None, key: Path | None = None,
               password: str | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    if ca is None:
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx.load_verify_locations(cafile=str(ca))
    if cert is not None and key is not None:
        ctx.load_cert_chain(str(cert), str(key), password)
    return ctx


def peer_certificate(addr: str, ctx: ssl.SSLContext) -> dict[str, Any]:
    """The TLS handshake's view of the server's certificate (proves the port really speaks TLS)."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        from cryptography import x509

        cert = x509.load_der_x509_certificate(der)
        return {"subject": cert.subject.rfc4514_string(), "issuer": cert.issuer.rfc4514_string(),
                "version": tls.version()}


def send_ext(topic: str) -> dict[str, str]:
    return {"producerGroup": "PG_TLS", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
            "queueId": "0", "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
            "properties": "WAIT\x01true\x02KEYS\x01k\x02"}


def topic_ext(topic: str) -> dict[str, str]:
    return {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6",
            "topicFilterType": "SINGLE_TAG"}


def test_permissive_default_serves_plain_and_tls_on_one_port(cluster: Cluster) -> None:
    """Java's default: plain clients (the stock C++ one) and TLS clients on the same ports, with a
    self-signed certificate in test mode; nothing configured."""
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr)
    anyone = client_ctx()
    for addr in (ns.addr, broker.addr, f"127.0.0.1:{broker.fast_port}"):
        cert = peer_certificate(addr, anyone)
        assert cert["subject"] == cert["issuer"] == "CN=localhost", cert  # self-signed, made on demand
        assert cert["version"] in ("TLSv1.2", "TLSv1.3")

    results = produce(ns.addr, [message("TopicTlsPermissive", f"plain-{i}") for i in range(5)])
    assert [r["status"] for r in results if r] == [0] * 5

    resp = tls_rpc(broker.addr, RequestCode.SEND_MESSAGE, anyone, send_ext("TopicTlsPermissive"), b"over-tls")
    assert resp.code == ResponseCode.SUCCESS, resp
    assert int(resp.ext_fields["queueOffset"]) >= 0

    def routed() -> dict[str, Any] | None:
        r = tls_rpc(ns.addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, anyone, {"topic": "TopicTlsPermissive"})
        return json.loads(bytes(r.body)) if r.code == ResponseCode.SUCCESS else None

    assert poll(routed, 20, what="route over TLS")["brokerDatas"][0]["brokerName"] == "broker-a"
    assert "TLS permissive" in broker.log_text()


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Any]:
    ca = TestCA(tmp_path / "pki")
    other = TestCA(tmp_path / "pki-other", name="someone else's CA")
    return {"ca": ca, "server": ca.issue("server", password="s3cret"), "client": ca.issue("client"),
            "stranger": other.issue("stranger")}


def tls_properties(path: Path, pki: dict[str, Any], *, client_auth: str = "require") -> Path:
    """A tls.properties as Java's TlsHelper reads it: CA-signed certificates, clients verified."""
    ca, server, client = pki["ca"], pki["server"], pki["client"]
    path.write_text("\n".join([
        "# test PKI",
        "tls.test.mode.enable=false",
        f"tls.server.need.client.auth={client_auth}",
        f"tls.server.certPath={server.cert}",
        f"tls.server.keyPath={server.key}",
        "tls.server.keyPassword=s3cret",
        "tls.server.authClient=true",
        f"tls.server.trustCertPath={ca.cert}",
        f"tls.client.certPath={client.cert}",
        f"tls.client.keyPath={client.key}",
        "tls.client.authServer=true",
        f"tls.client.trustCertPath={ca.cert}",
    ]) + "\n")
    return path


def test_enforcing_with_client_certificates(cluster: Cluster, pki: dict[str, Any], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Enforcing mode with a CA: plain connections and clients without a CA-signed certificate are
    refused and counted; the broker registers with the TLS nameserver; a slave syncs its master's
    metadata and replicates over TLS (the HA port stays plain, as in Java)."""
    props = tls_properties(tmp_path / "tls.properties", pki)
    ns = cluster.namesrv(extra_args=["--tls-server-mode", "enforcing", "--tls-config-file", str(props)])
    tls_conf: dict[str, Any] = {"tlsServerMode": "enforcing", "tlsEnable": "true", "tlsConfigFile": str(props)}
    master = cluster.broker(ns.addr, **tls_conf)
    slave = cluster.broker(ns.addr, broker_id=1, role="SLAVE", haMasterAddress=f"127.0.0.1:{master.port + 1}",
                           slaveSyncInitialDelay=500, slaveSyncInterval=1000, **tls_conf)
    ca, client = pki["ca"], pki["client"]
    good = client_ctx(ca.cert, client.cert, client.key)

    # The broker registered over TLS: the nameserver routes its topics (asked over TLS too).
    def routed() -> dict[str, Any] | None:
        r = tls_rpc(ns.addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, good, {"topic": "TBW102"})
        return json.loads(bytes(r.body)) if r.code == ResponseCode.SUCCESS else None

    route = poll(routed, 20, what="TBW102 routed by the TLS nameserver")
    assert {b["brokerName"] for b in route["brokerDatas"]} == {"broker-a"}
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": master.addr, "1": slave.addr}

    # The server's certificate is the configured one, signed by the CA the client trusts.
    cert = peer_certificate(master.addr, good)
    assert cert["subject"] == "CN=server" and cert["issuer"] == "CN=rmq test CA"

    before = master.metrics()
    # A plain client (what the stock C++ client speaks) is closed before any request is read.
    with pytest.raises(RemotingConnectError):
        rpc(master.addr, RequestCode.GET_BROKER_RUNTIME_INFO)
    assert metric_delta(before, master.metrics(), "rmq_remoting_tls_refused_total", reason="plaintext") == 1
    # TLS without a client certificate, or with one another CA signed: the handshake fails.
    for ctx in (client_ctx(ca.cert), client_ctx(ca.cert, pki["stranger"].cert, pki["stranger"].key)):
        with pytest.raises(RemotingConnectError):
            tls_rpc(master.addr, RequestCode.GET_BROKER_RUNTIME_INFO, ctx)
    # The client refuses a server its CA did not sign (the other CA as its only trust anchor).
    with pytest.raises(RemotingConnectError):
        tls_rpc(master.addr, RequestCode.GET_BROKER_RUNTIME_INFO,
                client_ctx(pki["stranger"].cert.parent / "ca.crt", client.cert, client.key))
    after = master.metrics()
    assert metric_delta(before, after, "rmq_remoting_tls_refused_total", reason="handshake") == 3
    assert metric_delta(before, after, "rmq_remoting_tls_connections_total") == 0
    assert "TLS enforcing" in master.log_text()

    # With the right certificate: create a topic and send; the slave gets both.
    assert tls_rpc(master.addr, RequestCode.UPDATE_AND_CREATE_TOPIC, good, topic_ext("TopicTls")).code == 0
    for i in range(10):
        resp = tls_rpc(master.addr, RequestCode.SEND_MESSAGE, good, send_ext("TopicTls"), f"m{i}".encode())
        assert resp.code == ResponseCode.SUCCESS, resp
    topics = slave.store_dir / "config" / "topics.json"
    poll(lambda: topics.exists() and "TopicTls" in topics.read_text(), 20, what="slave synced TopicTls")
    target = master.status()["maxPhyOffset"]
    poll(lambda: slave.status()["maxPhyOffset"] == target, 20, what="slave caught up")
    max_offset = tls_rpc(slave.addr, RequestCode.GET_MAX_OFFSET, good, {"topic": "TopicTls", "queueId": "0"})
    assert max_offset.code == ResponseCode.SUCCESS
    assert int(max_offset.ext_fields["offset"]) == 10
    assert metric_delta(before, master.metrics(), "rmq_remoting_tls_connections_total") >= 11
    assert metric_value(slave.metrics(), "rmq_remoting_tls_refused_total") == 0

    # rmq-admin over TLS with the same file's client certificate; in plain it cannot reach the group.
    assert admin_main(["topicStatus", "-n", ns.addr, "-t", "TopicTls", "--tls", "--tlsConfigFile", str(props)]) == 0
    out = capsys.readouterr().out
    assert "TopicTls" in out or "broker-a" in out, out
    assert admin_main(["topicStatus", "-n", ns.addr, "-t", "TopicTls"]) != 0
    assert "if it serves TLS only, add --tls" in capsys.readouterr().err


def test_disabled_mode_closes_a_tls_client_and_counts_it(cluster: Cluster) -> None:
    broker = cluster.broker(None, tlsServerMode="disabled")
    before = broker.metrics()
    with pytest.raises(RemotingConnectError):
        tls_rpc(broker.addr, RequestCode.GET_BROKER_RUNTIME_INFO, client_ctx())
    assert metric_delta(before, broker.metrics(), "rmq_malformed_frames_total", reason="tls_not_enabled") == 1
    assert "TLS is disabled" in broker.log_text() or "tlsServerMode is disabled" in broker.log_text()
    assert rpc(broker.addr, RequestCode.GET_BROKER_RUNTIME_INFO).code == ResponseCode.SUCCESS


def _start_fails(args: list[str], cwd: Path) -> str:
    out = subprocess.run(args, check=False, capture_output=True, text=True, timeout=30, cwd=cwd)
    assert out.returncode == 2, out
    return out.stderr


@pytest.mark.parametrize(("conf", "expected"), [
    ({"tlsServerMode": "strict"}, "tlsServerMode: expected one of disabled, permissive, enforcing"),
    ({"tlsConfigFile": "/nonexistent/tls.properties"}, "TLS config file /nonexistent/tls.properties does not exist"),
    ({"tlsServerMode": "enforcing", "@file": "tls.test.mode.enable=false\n"},
     "tls.server.certPath and tls.server.keyPath are both needed"),
    ({"@file": "tls.test.mode.enable=maybe\n"}, "tls.test.mode.enable: expected true or false"),
    ({"@file": "tls.server.need.client.auth=sometimes\n"}, "tls.server.need.client.auth: expected one of"),
    ({"tlsServerMode": "disabled", "tlsEnable": "true",
      "@file": "tls.test.mode.enable=false\ntls.client.authServer=true\n"
               "tls.client.trustCertPath=/nonexistent/ca.crt\n"},
     "tls.client.trustCertPath=/nonexistent/ca.crt: cannot load the trusted certificates"),
])
def test_bad_tls_settings_stop_the_broker_with_the_key(tmp_path: Path, conf: dict[str, str], expected: str) -> None:
    lines = [f"listenPort={free_port()}", f"storePathRootDir={tmp_path / 'store'}", "brokerIP1=127.0.0.1"]
    for key, value in conf.items():
        if key == "@file":
            path = tmp_path / "tls.properties"
            path.write_text(value)
            lines.append(f"tlsConfigFile={path}")
        else:
            lines.append(f"{key}={value}")
    conf_path = tmp_path / "broker.conf"
    conf_path.write_text("\n".join(lines) + "\n")
    stderr = _start_fails([PY, "-m", "rmqbroker.main", "-c", str(conf_path)], tmp_path)
    assert expected in stderr, stderr


def test_bad_tls_settings_stop_the_nameserver(tmp_path: Path, pki: dict[str, Any]) -> None:
    props = tmp_path / "tls.properties"
    # A key file that is not the certificate's key.
    props.write_text(f"tls.test.mode.enable=false\ntls.server.certPath={pki['server'].cert}\n"
                     f"tls.server.keyPath={pki['client'].key}\n")
    stderr = _start_fails([PY, "-m", "rmqbroker.namesrv.main", "--listen", f"127.0.0.1:{free_port()}",
                           "--tls-server-mode", "enforcing", "--tls-config-file", str(props),
                           "--kv-config-path", str(tmp_path / "kv.json")], tmp_path)
    assert "cannot load the certificate and key" in stderr, stderr


def test_renewed_certificate_is_served_without_a_restart(cluster: Cluster, tmp_path: Path) -> None:
    """A renewed certificate (a Secret updated by cert-manager) reaches new connections within
    seconds; a renewal whose files do not match is logged and the previous certificate kept."""
    ca = TestCA(tmp_path / "pki")
    first = ca.issue("server")
    props = tmp_path / "tls.properties"
    props.write_text(f"tls.test.mode.enable=false\ntls.server.certPath={first.cert}\ntls.server.keyPath={first.key}\n")
    broker = cluster.broker(None, tlsServerMode="enforcing", tlsConfigFile=str(props))
    trust = client_ctx(ca.cert)
    assert peer_certificate(broker.addr, trust)["subject"] == "CN=server"

    renewed = ca.issue("server-renewed")
    first.cert.write_bytes(renewed.cert.read_bytes())
    first.key.write_bytes(renewed.key.read_bytes())
    poll(lambda: peer_certificate(broker.addr, trust)["subject"] == "CN=server-renewed", 15,
         what="the renewed certificate served")

    # A certificate without its key (half a renewal): the broker keeps serving the last good pair.
    first.cert.write_bytes(ca.issue("server-broken").cert.read_bytes())
    served = []

    def bad_renewal_logged() -> bool:
        served.append(peer_certificate(broker.addr, trust)["subject"])  # a handshake looks at the files
        return "do not load; keeping the previous ones" in broker.log_text()

    poll(bad_renewal_logged, 15, what="the bad renewal logged")
    assert set(served) == {"CN=server-renewed"}
    assert peer_certificate(broker.addr, trust)["subject"] == "CN=server-renewed"
    assert tls_rpc(broker.addr, RequestCode.GET_BROKER_RUNTIME_INFO, trust).code == ResponseCode.SUCCESS
