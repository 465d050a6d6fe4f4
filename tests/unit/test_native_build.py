"""The mypyc build: the hot modules really are compiled here, and the same sources still pass the
codec and store unit tests as pure Python (what ``RMQ_PURE_PYTHON=1`` installs)."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPILED = re.findall(r'^\s*"broker/(rmqbroker/[\w/]+)\.py",$', (ROOT / "setup.py").read_text(), re.M)


def test_setup_lists_the_hot_modules() -> None:
    assert "rmqbroker/processors/send" in COMPILED and "rmqbroker/store/commitlog" in COMPILED
    for mod in COMPILED:
        assert (ROOT / "broker" / f"{mod}.py").exists(), mod


@pytest.mark.skipif(os.environ.get("RMQ_PURE_PYTHON", "") not in ("", "0"), reason="pure-Python install requested")
def test_hot_modules_are_compiled() -> None:
    for mod in COMPILED:
        module = importlib.import_module(mod.replace("/", "."))
        assert module.__file__ is not None and module.__file__.endswith(".so"), (
            f"{mod} is not compiled: install with `make venv` (setup.py runs mypyc)")


def test_pure_python_sources_pass_the_codec_and_store_tests(tmp_path: Path) -> None:
    """Copy the package without its extensions and run the unit tests of the compiled layers on it."""
    pure = tmp_path / "pure"
    shutil.copytree(ROOT / "broker" / "rmqbroker", pure / "rmqbroker",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    probe = subprocess.run(
        [sys.executable, "-c", "import rmqbroker.store.commitlog as m, rmqbroker.remoting.server as s; "
         "print(m.__file__, s.__file__)"],
        env={**os.environ, "PYTHONPATH": str(pure)}, capture_output=True, text=True, check=True)
    assert ".so" not in probe.stdout and str(pure) in probe.stdout
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         "tests/unit/remoting", "tests/unit/store"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{pure}{os.pathsep}{ROOT}"},
        capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert re.search(r"\d+ passed", run.stdout)
