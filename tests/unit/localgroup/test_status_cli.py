"""`rmq-local status` on a data directory whose state it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmqbroker.local import status


@pytest.mark.parametrize("layout", ["one group", "several groups"])
def test_unreadable_state_is_one_line_naming_the_file(tmp_path: Path, layout: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A damaged state.json (or a group's missing one) gives exit status 1 and the file's name,
    not a traceback."""
    if layout == "one group":
        bad = tmp_path / "state.json"
        bad.write_text('{"group": "broker-a", "bro')
    else:
        (tmp_path / "state.json").write_text(json.dumps({"groups": ["broker-a"], "namesrv": "127.0.0.1:9876"}))
        bad = tmp_path / "broker-a" / "state.json"
    assert status(tmp_path) == 1
    assert f"rmq-local: cannot read {bad}: " in capsys.readouterr().err
