"""Fixtures of the broker acceptance tests: a cluster shared by one module's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Cluster


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Processes shared by every test of a module (use through ``shared_cluster``)."""
    c = Cluster(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]))
    yield c
    c.stop_all()


@pytest.fixture
def shared_cluster(module_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The module's cluster; its process logs are printed when the test fails."""
    yield module_cluster
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for p in module_cluster.procs:
            print(f"===== {p.log_path.name} =====\n{p.log_text()[-4000:]}")
