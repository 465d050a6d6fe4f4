"""DelayOffsetTable / delayOffset.json (§5.3, §7.6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmqbroker.metadata.delay_offsets import DelayOffsetTable, decode_delay_offsets
from rmqbroker.metadata.errors import MetadataFormatError

JAVA_DELAY_OFFSET_JSON = """{
\t"offsetTable":{1:3,3:10,18:0
\t}
}"""


def test_loads_java_written_file(config_dir: Path) -> None:
    (config_dir / "delayOffset.json").write_text(JAVA_DELAY_OFFSET_JSON)
    table = DelayOffsetTable(config_dir)
    assert table.table() == {1: 3, 3: 10, 18: 0}
    assert table.get(3) == 10
    assert table.get(2) == 0
    assert table.get(2, -1) == -1
    assert not table.dirty


def test_set_dirty_and_persist(config_dir: Path) -> None:
    table = DelayOffsetTable(config_dir)
    table.set(2, 5)
    table.set(10, 1)
    assert table.dirty
    assert table.persist_if_dirty()
    assert json.loads((config_dir / "delayOffset.json").read_text()) == {"offsetTable": {"2": 5, "10": 1}}
    assert table.encode() == '{"offsetTable":{"2":5,"10":1}}'
    table.set(2, 5)
    assert not table.dirty
    assert DelayOffsetTable(config_dir).table() == {2: 5, 10: 1}


def test_replace_from_json_stores_body_verbatim(config_dir: Path) -> None:
    table = DelayOffsetTable(config_dir)
    table.set(1, 1)
    table.persist()
    body = '{"offsetTable":{1:7,2:8}}'
    table.replace_from_json(body)
    assert (config_dir / "delayOffset.json").read_text() == body
    assert table.table() == {1: 7, 2: 8}
    assert not table.dirty
    assert (config_dir / "delayOffset.json.bak").read_text() == '{\n\t"offsetTable":{\n\t\t"1":1\n\t}\n}'
    assert DelayOffsetTable(config_dir).table() == {1: 7, 2: 8}


def test_replace_from_json_rejects_garbage_without_touching_file(config_dir: Path) -> None:
    table = DelayOffsetTable(config_dir)
    table.set(1, 1)
    table.persist()
    before = (config_dir / "delayOffset.json").read_text()
    with pytest.raises(MetadataFormatError):
        table.replace_from_json('{"offsetTable":{1:')
    with pytest.raises(MetadataFormatError):
        table.replace_from_json('{"offsetTable":[1,2]}')
    assert (config_dir / "delayOffset.json").read_text() == before
    assert table.table() == {1: 1}


def test_decode_helper_and_bak(config_dir: Path) -> None:
    assert decode_delay_offsets('{"offsetTable":{"4":2}}') == {4: 2}
    assert decode_delay_offsets("{}") == {}
    (config_dir / "delayOffset.json.bak").write_text(JAVA_DELAY_OFFSET_JSON)
    (config_dir / "delayOffset.json").write_text("")
    assert DelayOffsetTable(config_dir).get(1) == 3
