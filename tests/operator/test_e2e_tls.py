"""spec.tls end to end without a cluster: the real operator, the emulated API, real broker and
nameserver processes as pods, certificates from a Secret.

The group comes up Ready only if every broker registered with the TLS-enforcing nameserver over
TLS, and its slave syncs the master's metadata over TLS; clients then need TLS and a certificate
from the Secret's CA.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from rmqbroker.remoting.client import RemotingConnectError
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.integration.helpers import rpc
from tests.integration.test_tls import client_ctx, peer_certificate, send_ext, tls_rpc, topic_ext
from tests.operator.conftest import example
from tests.operator.emulator import OperatorHarness, condition, wait_for
from tests.operator.podrunner import PodRunner, ProcessBackend
from tests.support.certs import TestCA

NAME = "broker-a"


def test_tls_group_registers_syncs_and_refuses_plain_clients(
        harness: OperatorHarness, real_pods: tuple[PodRunner, ProcessBackend], tmp_path: Path) -> None:
    h, (runner, _) = harness, real_pods
    ca = TestCA(tmp_path / "pki")
    pod_cert, client = ca.issue("broker-a"), ca.issue("app")
    data = {"tls.crt": pod_cert.cert.read_bytes(), "tls.key": pod_cert.key.read_bytes(), "ca.crt": ca.cert.read_bytes()}
    h.client.create({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                     "metadata": {"name": "rmq-tls", "namespace": "default"},
                     "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}, "secrets")
    h.client.apply_group(example(replicas=2, replication="SYNC", tls={"secretName": "rmq-tls", "clientAuth": "require"},
                                 brokerConfig={"mappedFileSizeCommitLog": str(16 << 20),
                                               "mappedFileSizeConsumeQueue": "60000",
                                               "slaveSyncInitialDelay": "500", "slaveSyncInterval": "1000"}))

    def ready() -> dict[str, Any] | None:
        g = h.client.group(NAME)
        st = (g or {}).get("status") or {}
        ok = st.get("inSyncReplicas") == 2 and st.get("readyReplicas") == 2 and \
            condition(g, "Ready").get("status") == "True"
        return st if ok else None

    st = wait_for(ready, 90, "TLS group Ready with 2 in sync")
    master = st["masterAddress"]
    namesrv = f"{runner.ip_of('broker-a-namesrv-0')}:9876"
    good = client_ctx(ca.cert, client.cert, client.key)

    # The Secret's certificate is what every pod serves; plain and unauthenticated clients are refused.
    for addr in (master, namesrv):
        cert = peer_certificate(addr, good)
        assert cert["subject"] == "CN=broker-a" and cert["issuer"] == "CN=rmq test CA", (addr, cert)
        with pytest.raises(RemotingConnectError):
            rpc(addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
        with pytest.raises(RemotingConnectError):
            tls_rpc(addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, client_ctx(ca.cert), {"topic": "TBW102"})

    # Both brokers registered over TLS, and the slave syncs a topic made on the master over TLS.
    route = tls_rpc(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, good, {"topic": "TBW102"})
    assert route.code == ResponseCode.SUCCESS
    assert tls_rpc(master, RequestCode.UPDATE_AND_CREATE_TOPIC, good, topic_ext("TopicTlsK8s")).code == 0
    resp = tls_rpc(master, RequestCode.SEND_MESSAGE, good, send_ext("TopicTlsK8s"), b"hello")
    assert resp.code == ResponseCode.SUCCESS, resp  # SYNC_MASTER: the slave acknowledged it
    slave = next(r for r in st["replicas"] if r["role"] == "SLAVE")["pod"]
    topics = tmp_path / "pvc" / f"data-{slave}" / "store" / "config" / "topics.json"  # the slave's volume
    wait_for(lambda: topics.exists() and "TopicTlsK8s" in topics.read_text(), 20, "slave synced TopicTlsK8s")
