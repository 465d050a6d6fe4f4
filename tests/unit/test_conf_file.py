"""broker.conf rewritten in place (conf_file.py) and run-time changes parsed as at start-up (config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmqbroker.conf_file import ConfWriteError, rewrite_properties, save_changes, unwritable_reason
from rmqbroker.config import ConfigError, build_settings, override_sources, updated_settings
from rmqbroker.properties import parse_properties

CONF = """# broker-a: hand-written
brokerName=broker-a
  brokerPermission = 6
! old style comment
listenPort:10911\r
flushDiskType ASYNC_FLUSH
"""


def test_rewrite_changes_only_the_lines_of_changed_keys() -> None:
    out = rewrite_properties(CONF, {"brokerPermission": "4", "listenPort": "10920", "flushDiskType": "SYNC_FLUSH"})
    assert out == """# broker-a: hand-written
brokerName=broker-a
  brokerPermission=4
! old style comment
listenPort=10920\r
flushDiskType=SYNC_FLUSH
"""
    assert parse_properties(out)["brokerPermission"] == "4"


def test_rewrite_appends_new_keys_in_order_and_ends_lines() -> None:
    assert rewrite_properties("a=1", {"b": "2", "c": "3"}) == "a=1\nb=2\nc=3\n"
    assert rewrite_properties("", {"b": "2"}) == "b=2\n"
    # Every line of a key given twice gets the value (the last one is what start-up reads).
    assert rewrite_properties("a=1\nx=0\na=2\n", {"a": "9"}) == "a=9\nx=0\na=9\n"
    # A commented-out key stays a comment; the key is appended.
    assert rewrite_properties("#a=1\n", {"a": "2"}) == "#a=1\na=2\n"
    assert rewrite_properties(CONF, {}) == CONF


def test_save_keeps_the_mode_and_writes_no_backup(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(CONF)
    conf.chmod(0o640)
    link = tmp_path / "link.conf"
    link.symlink_to(conf)
    save_changes(link, {"brokerPermission": "2"})
    assert link.is_symlink()
    assert "  brokerPermission=2\n" in conf.read_text()
    assert conf.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broker.conf", "link.conf"]


def test_unwritable_reasons(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    assert "cannot be read" in (unwritable_reason(conf) or "")
    conf.write_text(CONF)
    assert unwritable_reason(conf) is None
    conf.chmod(0o444)
    assert "read-only (mode 0444)" in (unwritable_reason(conf) or "")
    with pytest.raises(ConfWriteError):
        save_changes(tmp_path / "missing.conf", {"a": "1"})


def test_updated_settings_parses_and_validates_as_start_up() -> None:
    base = build_settings("brokerName=b\nlistenPort=10911\n", env={})
    new = updated_settings(base, {"brokerPermission": " 4 ", "slaveReadEnable": "TRUE"})
    assert (new.brokerPermission, new.slaveReadEnable, base.brokerPermission) == (4, True, 6)
    for changes, word in (({"nope": "1"}, "nope: not a broker setting"),
                          ({"brokerPermission": "rw"}, "brokerPermission: expected an integer"),
                          ({"brokerPermission": "16"}, "brokerPermission"),
                          ({"diskSpaceCleanForciblyRatio": "95"}, "diskSpaceCleanForciblyRatio"),
                          ({"shortPollingTimeMills": "-1"}, "shortPollingTimeMills")):
        with pytest.raises(ConfigError, match=word):
            updated_settings(base, changes)


def test_override_sources_name_where_a_key_is_set() -> None:
    got = override_sources({"RMQ_BROKER_BROKER_PERMISSION": "4", "NAMESRV_ADDR": "h:1", "RMQ_BROKER_NOPE": "x",
                            "PATH": "/bin"}, {"slaveReadEnable": "true", "unknownKey": "1"})
    assert got == {"brokerPermission": "the environment variable RMQ_BROKER_BROKER_PERMISSION",
                   "namesrvAddr": "the environment variable NAMESRV_ADDR", "slaveReadEnable": "the command line"}
