"""The mypyc build: the hot modules really are compiled here, and the same sources still pass the
codec and store unit tests as pure Python (what ``RMQ_PURE_PYTHON=1`` installs)."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import zlib
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


def test_store_works_on_zlib_where_isal_is_missing(tmp_path: Path) -> None:
    """Without an isal wheel the record codec falls back to zlib's CRC32: same values, every store
    unit test (golden CRCs included) still passes on the pure sources."""
    pure = tmp_path / "pure"
    shutil.copytree(ROOT / "broker" / "rmqbroker", pure / "rmqbroker",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (pure / "isal").mkdir()
    (pure / "isal" / "__init__.py").write_text('raise ImportError("isal hidden by the test")\n')
    env = {**os.environ, "PYTHONPATH": f"{pure}{os.pathsep}{ROOT}"}
    probe = subprocess.run(
        [sys.executable, "-c", "import zlib, rmqbroker.store.record as r; "
         "assert r._crc_impl is zlib, r._crc_impl; print(r.body_crc(b'RocketMQ'))"],
        env=env, capture_output=True, text=True, check=True)
    assert int(probe.stdout) == zlib.crc32(b"RocketMQ") & 0x7FFFFFFF
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "tests/unit/store"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert re.search(r"\d+ passed", run.stdout)


def test_record_crc_uses_isal_when_installed() -> None:
    record = importlib.import_module("rmqbroker.store.record")
    assert record._crc_impl.__name__ == "isal.isal_zlib"
    for body in (b"", b"RocketMQ", bytes(range(256)) * 33):
        assert record.body_crc(body) == zlib.crc32(body) & 0x7FFFFFFF
        assert record.body_crc(memoryview(bytearray(body))) == zlib.crc32(body) & 0x7FFFFFFF
