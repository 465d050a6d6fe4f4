"""Shared fixtures: real nameserver/broker processes on loopback, cleaned up after each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import BrokerProc, Namesrv, Proc

BROKER_SRC = Path(__file__).resolve().parents[1] / "broker" / "rmqbroker"


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to test mypyc extensions older than their sources: the stale binary, not the edited
    module, is what every broker process would import."""
    stale = [str(so.relative_to(BROKER_SRC.parent)) for so in BROKER_SRC.rglob("*.so")
             if (src := so.with_name(so.name.split(".", 1)[0] + ".py")).exists()
             and src.stat().st_mtime > so.stat().st_mtime]
    if stale:
        pytest.exit(f"compiled modules older than their sources: {', '.join(stale)}; rebuild them with "
                    "`make venv` (or `.venv/bin/pip install --no-deps --no-build-isolation -e .`)", returncode=2)


class Cluster:
    """Processes started by one test; all stopped (and logs attached on failure) afterwards."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[Proc] = []

    def namesrv(self, **kw: object) -> Namesrv:
        ns = Namesrv(self.workdir, **kw)  # type: ignore[arg-type]
        self.procs.append(ns)
        return ns.start()

    def broker(self, namesrv: str | None, start: bool = True, **kw: object) -> BrokerProc:
        b = BrokerProc(self.workdir, namesrv, **kw)  # type: ignore[arg-type]
        self.procs.append(b)
        return b.start() if start else b

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            p.stop()


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.stop_all()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for p in c.procs:
            print(f"===== {p.log_path.name} =====\n{p.log_text()[-4000:]}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    rep = yield
    if call.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
    return rep
