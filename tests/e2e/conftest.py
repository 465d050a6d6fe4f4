"""Fixtures for the kind e2e tests (opt-in: ``pytest -m e2e tests/e2e``; see .github/workflows/e2e-kind.yaml).

Environment: RMQ_E2E_NAMESPACE (default ``default``), RMQ_E2E_GROUP (``broker-a``), RMQ_E2E_CLIENT_IMAGE
(``rmq-e2e-client:e2e``, built from tests/e2e/client and loaded into kind), KUBECTL (kubectl binary).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from tests.e2e.kube import Kubectl, find_kubectl


@dataclass(frozen=True)
class E2EConfig:
    namespace: str
    group: str
    client_image: str
    client_pull_policy: str
    cordon: bool


@pytest.fixture(scope="session")
def e2e_config() -> E2EConfig:
    return E2EConfig(
        namespace=os.environ.get("RMQ_E2E_NAMESPACE", "default"),
        group=os.environ.get("RMQ_E2E_GROUP", "broker-a"),
        client_image=os.environ.get("RMQ_E2E_CLIENT_IMAGE", "rmq-e2e-client:e2e"),
        client_pull_policy=os.environ.get("RMQ_E2E_CLIENT_PULL_POLICY", "IfNotPresent"),
        cordon=os.environ.get("RMQ_E2E_CORDON", "1") != "0",
    )


@pytest.fixture(scope="session")
def kubectl(e2e_config: E2EConfig) -> Kubectl:
    try:
        binary = find_kubectl()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    k = Kubectl(binary, e2e_config.namespace)
    k.run("version", namespaced=False)  # fails early, with kubectl's message, when there is no cluster
    return k
