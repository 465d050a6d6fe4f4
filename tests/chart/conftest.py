"""Fixtures for the chart tests: helm from .tools/ (installed on first use), rendering, validation."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import tooling

REPO = tooling.REPO_ROOT
CHART = REPO / "charts" / "rmq-operator"
CRD_SOURCE_DIR = REPO / "crds"
CRD_CHART_DIR = CHART / "crds"
RELEASE = "rmq"
NAMESPACE = "rmq-system"
# The chart's kubeVersion floor and a current release: manifests must be valid for both.
KUBE_VERSIONS = ("1.28", "1.35")

Manifest = dict[str, Any]
Render = Callable[..., list[Manifest]]


@pytest.fixture(scope="session")
def tools() -> tooling.Tools:
    """helm and kubectl; installs them into .tools/ on a fresh machine. Never skipped: a failure is a failure."""
    try:
        return tooling.ensure(quiet=True)
    except RuntimeError as exc:
        pytest.fail(f"cannot install helm/kubectl (make tools): {exc}")


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def values_args(tmp_path: Path, values: dict[str, Any] | None) -> list[str]:
    if not values:
        return []
    path = tmp_path / f"values-{len(list(tmp_path.glob('values-*.json')))}.json"
    path.write_text(json.dumps(values))
    return ["--values", str(path)]


def parse_manifests(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@pytest.fixture
def render(tools: tooling.Tools, tmp_path: Path) -> Render:
    """``render(values=None, include_crds=False)`` -> the manifests ``helm template`` produces."""

    def _render(values: dict[str, Any] | None = None, include_crds: bool = False) -> list[Manifest]:
        args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *values_args(tmp_path, values)]
        if include_crds:
            args.append("--include-crds")
        return parse_manifests(run_helm(tools.helm, *args).stdout)

    return _render


def find(manifests: Iterable[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)]


def one(manifests: Iterable[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = find(manifests, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[m['metadata']['name'] for m in found]}"
    return found[0]


def crd_documents() -> list[Manifest]:
    """CustomResourceDefinitions shipped in the chart's crds/ directory."""
    docs: list[Manifest] = []
    for path in sorted(CRD_CHART_DIR.glob("*.yaml")):
        docs.extend(d for d in parse_manifests(path.read_text()) if d.get("kind") == "CustomResourceDefinition")
    return docs
