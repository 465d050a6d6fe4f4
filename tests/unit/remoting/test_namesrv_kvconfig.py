"""The nameserver's KV store on its own: loading kvConfig.json (Java's, ours, corrupt ones with and
without a usable .bak) and keeping the served table unchanged when a change cannot be written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmqbroker.metadata.errors import MetadataLoadError, MetadataPersistError
from rmqbroker.namesrv.kvconfig import KVConfigStore


def store(path: Path) -> KVConfigStore:
    kv = KVConfigStore(path)
    kv.load()
    return kv


def test_missing_file_is_an_empty_table(tmp_path: Path) -> None:
    kv = store(tmp_path / "none" / "kvConfig.json")
    assert kv.snapshot() == {}
    assert not (tmp_path / "none").exists()  # loading never creates anything


@pytest.mark.parametrize("text", [
    '{"configTable":{"NS":{"k":',            # truncated
    "\x00\x00\x00\x00",                        # zeroed by a crash
    '["configTable"]',                         # not an object
    '{"configTable":["NS"]}',                  # configTable of the wrong type
    '{"configTable":{"NS":"k=v"}}',            # a namespace that is not an object
    '{"configTable":{"NS":{"k":{"v":1}}}}',    # a value that is not text
])
def test_corrupt_file_without_backup_refuses_to_load(tmp_path: Path, text: str) -> None:
    path = tmp_path / "kvConfig.json"
    path.write_text(text)
    kv = KVConfigStore(path)
    with pytest.raises(MetadataLoadError, match=r"kvConfig\.json"):
        kv.load()
    assert path.read_text() == text  # never replaced by an empty table


def test_corrupt_file_falls_back_to_its_backup(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    path.write_text('{"configTable":{"NS":{"k":')
    path.with_name("kvConfig.json.bak").write_text('{"configTable":{"NS":{"k":"from-bak"}}}')
    assert store(path).get("NS", "k") == "from-bak"


def test_corrupt_file_and_backup(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    path.write_text("{")
    path.with_name("kvConfig.json.bak").write_text("}")
    with pytest.raises(MetadataLoadError, match="neither"):
        KVConfigStore(path).load()


def test_java_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    path.write_text('\ufeff{"configTable":{"ORDER_TOPIC_CONFIG":{"T":"broker-a:8"},"E":{},"N":{"i":3,"b":false,'
                    '"z":null}}}')
    kv = store(path)
    assert kv.get("ORDER_TOPIC_CONFIG", "T") == "broker-a:8"
    assert kv.namespace("N") == {"i": "3", "b": "false"}
    assert kv.namespace("E") is None  # an empty namespace is no namespace


async def test_changes_are_written_before_they_are_served(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    kv = store(path)
    await kv.put("NS", "b", "2")
    await kv.put("NS", "a", "1")
    assert path.read_text() == '{"configTable":{"NS":{"a":"1","b":"2"}}}'
    assert store(path).snapshot() == {"NS": {"a": "1", "b": "2"}}
    assert await kv.delete("NS", "a") is True
    assert await kv.delete("NS", "a") is False
    assert json.loads(path.read_text()) == {"configTable": {"NS": {"b": "2"}}}


async def test_failed_write_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    kv = store(path)
    await kv.put("NS", "k", "v")
    path.with_name("kvConfig.json.tmp").mkdir()  # the write's first step fails
    with pytest.raises(MetadataPersistError):
        await kv.put("NS", "k", "changed")
    with pytest.raises(MetadataPersistError):
        await kv.delete("NS", "k")
    assert kv.get("NS", "k") == "v"
    assert json.loads(path.read_text()) == {"configTable": {"NS": {"k": "v"}}}
