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


def test_a_master_refusing_writes_shows_as_fenced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rmqbroker.localgroup import view

    (tmp_path / "token").write_text("t\n")
    state = {"tokenFile": str(tmp_path / "token"), "events": [],
             "brokers": [{"id": 0, "name": "broker-0", "brokerId": 0, "pid": 1, "listen": 10911, "admin": 10916},
                         {"id": 1, "name": "broker-1", "brokerId": 1, "pid": 1, "listen": 10921, "admin": 10926}]}
    answers = {10916: {"brokerId": 0, "role": "SYNC_MASTER", "brokerAddr": "127.0.0.1:10911", "epoch": 0,
                       "maxPhyOffset": 0, "termFenced": True, "ha": {"slaves": []}},
               10926: {"brokerId": 1, "role": "SLAVE", "brokerAddr": "127.0.0.1:10921", "epoch": 1,
                       "maxPhyOffset": 500, "ha": {"connected": False}}}
    monkeypatch.setattr(view, "_alive", lambda pid: True)
    monkeypatch.setattr(view, "fetch_status", lambda port, token: answers[port])
    rows = [line.split() for line in view.status_table(state, events=False).splitlines()[1:]]
    assert [(r[0], r[-1]) for r in rows] == [("broker-0", "FENCED"), ("broker-1", "UP")]
