"""ali-ons (npm), a pure-JavaScript port of RocketMQ 4.x's Java client, installed into ``.tools/node``
and driven through ``tests/integration/clients/ons_client.js``: a second client implementation, written
independently of Apache's C++ client, for the compatibility tests.

The install needs ``npm`` and the npm registry (as the chart tests' helm/kubectl do) and is idempotent:
a stamp file names the package that is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

PACKAGE = "ali-ons@3.12.0"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = REPO_ROOT / ".tools" / "node"
SCRIPT = REPO_ROOT / "tests" / "integration" / "clients" / "ons_client.js"


class NodeClientError(RuntimeError):
    """npm or node is missing, or the install failed."""


def install(prefix: Path = DEFAULT_DIR) -> Path:
    """Install ali-ons under ``prefix`` unless the stamp says it is there; returns its node_modules."""
    modules = prefix / "node_modules"
    stamp = prefix / ".package"
    if stamp.exists() and stamp.read_text().strip() == PACKAGE and (modules / "ali-ons").is_dir():
        return modules
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise NodeClientError("node and npm are needed on PATH for the ali-ons client tests")
    prefix.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-save", "--loglevel=error",
         PACKAGE], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise NodeClientError(f"npm install {PACKAGE} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    stamp.write_text(PACKAGE + "\n")
    return modules


def run(modules: Path, mode: str, spec: dict[str, Any], timeout: float = 90.0) -> tuple[int, Any, str]:
    """Run the client script once: (exit code, its result or None, stdout + stderr for messages)."""
    env = {**os.environ, "ONS_MODULES": str(modules)}
    proc = subprocess.run(["node", str(SCRIPT), mode, json.dumps(spec)], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    out = json.loads(lines[-1][len("RESULT "):]) if lines else None
    return proc.returncode, out, proc.stdout[-3000:] + proc.stderr[-3000:]
