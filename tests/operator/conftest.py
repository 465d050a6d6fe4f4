"""Fixtures: the emulated API server with the real operator, and the pod runner (fake or real brokers)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.operator.emulator import REPO, OperatorHarness
from tests.operator.podrunner import FakeBackend, PodRunner, ProcessBackend

EXAMPLE = REPO / "examples" / "brokergroup.yaml"


def example(**spec: Any) -> dict[str, Any]:
    """examples/brokergroup.yaml with ``spec`` keys replaced."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc = copy.deepcopy(doc)
    doc["spec"].update(spec)
    return doc


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[OperatorHarness]:
    h = OperatorHarness(tmp_path, poll_seconds=0.3)
    try:
        h.start_operator()
        yield h
    finally:
        h.close()


B = TypeVar("B", bound=FakeBackend)


@contextlib.contextmanager
def pods_on(harness: OperatorHarness, tmp_path: Path, backend: B) -> Iterator[tuple[PodRunner, B]]:
    """A pod runner with ``backend`` for the test's duration."""
    runner = PodRunner(harness.client, tmp_path, backend).start()
    try:
        yield runner, backend
    finally:
        runner.close()
        backend.close()


@pytest.fixture
def fake_pods(harness: OperatorHarness, tmp_path: Path) -> Iterator[tuple[PodRunner, FakeBackend]]:
    with pods_on(harness, tmp_path, FakeBackend()) as pods:
        yield pods


@pytest.fixture
def real_pods(harness: OperatorHarness, tmp_path: Path,
              request: pytest.FixtureRequest) -> Iterator[tuple[PodRunner, ProcessBackend]]:
    backend = ProcessBackend(tmp_path)
    runner = PodRunner(harness.client, tmp_path, backend).start()
    try:
        yield runner, backend
    finally:
        runner.close()
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            for pod in backend.logs:
                print(f"===== {pod} =====\n{backend.log_tail(pod)}")


def pytest_configure(config: pytest.Config) -> None:
    # kmock 0.8 loads its bundled resource list with a deprecated importlib.resources call.
    config.addinivalue_line("filterwarnings", "ignore:read_binary is deprecated:DeprecationWarning")
