"""Shared fixtures for the metadata tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    path = tmp_path / "store" / "config"
    path.mkdir(parents=True)
    return path
