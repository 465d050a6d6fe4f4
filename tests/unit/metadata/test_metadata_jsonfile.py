"""fastjson-tolerant parsing, atomic writes and .bak fallback (§5)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqbroker.metadata import jsonfile
from rmqbroker.metadata.errors import MetadataFormatError, MetadataLoadError, MetadataPersistError
from rmqbroker.metadata.jsonfile import (
    atomic_write,
    dumps_mq_keyed,
    fastjson_loads,
    load_decoded_with_backup,
    load_with_backup,
    loads_mq_keyed,
    mq_key,
    to_json_text,
)

# -- fastjson_loads ---------------------------------------------------------------------------------


def test_standard_json_passes_through() -> None:
    assert fastjson_loads('{"a":[1,2,{"b":null}]}') == {"a": [1, 2, {"b": None}]}


def test_unquoted_int_keys_become_string_keys() -> None:
    text = '{"offsetTable":{"T@G":{0:12,1:7},"%RETRY%G@G":{0:0}}}'
    assert fastjson_loads(text) == {"offsetTable": {"T@G": {"0": 12, "1": 7}, "%RETRY%G@G": {"0": 0}}}


def test_negative_and_large_keys() -> None:
    assert fastjson_loads("{-1:3, 9223372036854775807 : -4}") == {"-1": 3, "9223372036854775807": -4}


def test_java_pretty_output_with_fastjson_line_breaks() -> None:
    # fastjson's pretty printer puts a line break before the closing brace of int-keyed maps.
    text = '{\n\t"offsetTable":{\n\t\t"TopicTest@CG":{0:250,1:249,2:250,3:251\n\t\t}\n\t}\n}'
    assert fastjson_loads(text) == {"offsetTable": {"TopicTest@CG": {"0": 250, "1": 249, "2": 250, "3": 251}}}


@pytest.mark.parametrize(
    ("text", "standard"),
    [
        ('{0:"a,1:b"}', '{"0":"a,1:b"}'),
        ('{0:"{2:3}","x":"\\",4:"}', '{"0":"{2:3}","x":"\\",4:"}'),
        ('{0:["5:6", 7, {8:"9:"}]}', '{"0":["5:6", 7, {"8":"9:"}]}'),
        ('{"k\\\\":1, 2:"\\u0030:"}', '{"k\\\\":1, "2":"\\u0030:"}'),
        ('{"1:2":{3:"}"}}', '{"1:2":{"3":"}"}}'),
    ],
)
def test_strings_with_digits_and_colons_are_untouched(text: str, standard: str) -> None:
    assert fastjson_loads(text) == json.loads(standard)


def test_numbers_in_arrays_and_values_are_not_keys() -> None:
    assert fastjson_loads('{1:[2,3],"a":4,5:-6}') == {"1": [2, 3], "a": 4, "5": -6}


def test_bytes_and_bom_accepted() -> None:
    assert fastjson_loads(b"\xef\xbb\xbf{0:1}") == {"0": 1}


@pytest.mark.parametrize("text", ["", "{", "{0:}", "[1:2]", "{0:1", "garbage", '{"a":1}x', "{a:1}"])
def test_invalid_input_raises_typed_error(text: str) -> None:
    with pytest.raises(MetadataFormatError) as info:
        fastjson_loads(text)
    assert isinstance(info.value, ValueError)
    assert info.value.__cause__ is not None


def test_invalid_utf8_raises_typed_error() -> None:
    with pytest.raises(MetadataFormatError):
        fastjson_loads(b'{"a":"\xff"}')


# -- property test ----------------------------------------------------------------------------------

_TRICKY = st.sampled_from(["{0:1}", ",12:", '"', "\\", '\\"1:', "-1:", "a:b", '{"x":1}', "0", "", "é:1"])
_TEXT = st.text(max_size=12) | _TRICKY
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT
)
_KEYS = st.integers(min_value=-(10**12), max_value=10**12) | _TEXT
_VALUES = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=4),
    max_leaves=25,
)
_WS = st.sampled_from(["", " ", "\n\t\t", "\r\n ", "\t"])


def _fastjson_dumps(value: Any, ws: str, ascii_only: bool) -> str:
    """Serialise like fastjson: integer dict keys are written bare."""
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            key_text = str(key) if isinstance(key, int) else json.dumps(key, ensure_ascii=ascii_only)
            items.append(f"{key_text}{ws}:{ws}{_fastjson_dumps(item, ws, ascii_only)}")
        return "{" + ws + ("," + ws).join(items) + ws + "}"
    if isinstance(value, list):
        return "[" + ws + ("," + ws).join(_fastjson_dumps(v, ws, ascii_only) for v in value) + ws + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


@settings(max_examples=400, deadline=None)
@given(value=_VALUES, ws=_WS, ascii_only=st.booleans())
def test_fastjson_form_parses_like_standard_form(value: Any, ws: str, ascii_only: bool) -> None:
    fastjson_text = _fastjson_dumps(value, ws, ascii_only)
    standard = json.loads(json.dumps(value))  # json.dumps quotes int keys
    assert fastjson_loads(fastjson_text) == standard


@settings(max_examples=300, deadline=None)
@given(value=_VALUES, ascii_only=st.booleans())
def test_preprocessor_is_identity_on_standard_json(value: Any, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert jsonfile._quote_numeric_keys(text) == text


# -- writing ----------------------------------------------------------------------------------------


def test_to_json_text_pretty_like_fastjson() -> None:
    assert to_json_text({"a": {"b": 1}}, pretty=True) == '{\n\t"a":{\n\t\t"b":1\n\t}\n}'
    assert to_json_text({"a": "é", "n": [1, 2]}, pretty=False) == '{"a":"é","n":[1,2]}'


def test_atomic_write_creates_file_and_keeps_previous_as_bak(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "topics.json"
    atomic_write(path, "first")
    assert path.read_text() == "first"
    assert not path.with_name("topics.json.bak").exists()
    atomic_write(path, "second")
    atomic_write(path, "third")
    assert path.read_text() == "third"
    assert path.with_name("topics.json.bak").read_text() == "second"
    assert not path.with_name("topics.json.tmp").exists()
    assert not path.with_name("topics.json.bak.tmp").exists()


def test_atomic_write_never_backs_up_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    atomic_write(path, "good")
    path.write_text("")  # e.g. truncated by a crash of some other writer
    path.with_name("f.json.bak").write_text("good")
    atomic_write(path, "new")
    assert path.with_name("f.json.bak").read_text() == "good"


def test_atomic_write_falls_back_to_copy_without_hard_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_link(*_: Any, **__: Any) -> None:
        raise PermissionError("links not supported")

    path = tmp_path / "f.json"
    atomic_write(path, "old")
    monkeypatch.setattr(os, "link", no_link)
    atomic_write(path, "new")
    assert path.read_text() == "new"
    assert path.with_name("f.json.bak").read_text() == "old"


def test_failure_before_rename_leaves_original_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "consumerOffset.json"
    atomic_write(path, '{"offsetTable":{}}')
    real_replace = os.replace

    def failing_replace(src: Any, dst: Any) -> None:
        if Path(dst) == path:
            raise OSError("simulated crash between tmp write and rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(MetadataPersistError) as info:
        atomic_write(path, '{"offsetTable":{"T@G":{"0":1}}}')
    assert isinstance(info.value.__cause__, OSError)
    assert path.read_text() == '{"offsetTable":{}}'
    assert not path.with_name("consumerOffset.json.tmp").exists()


def test_failure_writing_tmp_leaves_original_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "topics.json"
    atomic_write(path, "old")

    def failing_fsync(_fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(MetadataPersistError):
        atomic_write(path, "new")
    assert path.read_text() == "old"


# -- loading ----------------------------------------------------------------------------------------


def test_load_with_backup_fresh_start_returns_none(tmp_path: Path) -> None:
    assert load_with_backup(tmp_path / "topics.json") is None


def test_load_with_backup_prefers_main_file(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    path.write_text('{"a":1}')
    path.with_name("topics.json.bak").write_text('{"a":0}')
    assert load_with_backup(path) == '{"a":1}'


@pytest.mark.parametrize("main", [None, "", "  \n", '{"offsetTable":{"T@G":{0:1', "\x00\x00\x00garbage"])
def test_load_with_backup_falls_back_to_bak(tmp_path: Path, main: str | None, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "consumerOffset.json"
    if main is not None:
        path.write_text(main)
    path.with_name("consumerOffset.json.bak").write_text('{"offsetTable":{"T@G":{0:1}}}')
    with caplog.at_level(logging.WARNING, logger="rmqbroker.metadata.jsonfile"):
        assert load_with_backup(path) == '{"offsetTable":{"T@G":{0:1}}}'
    assert any(".bak" in record.getMessage() for record in caplog.records)


def test_load_with_backup_non_utf8_main_uses_bak(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(b'{"a":"\xff\xfe"}')
    path.with_name("f.json.bak").write_text('{"a":"ok"}')
    assert load_with_backup(path) == '{"a":"ok"}'


def test_corrupt_main_without_bak_raises(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    path.write_text('{"dataVersion":')
    with pytest.raises(MetadataLoadError) as info:
        load_with_backup(path)
    assert isinstance(info.value.__cause__, MetadataFormatError)


@pytest.mark.parametrize("bak", [None, "", " \n"])
@pytest.mark.parametrize("main", ["", "\n  "])
def test_empty_main_without_usable_bak_raises(tmp_path: Path, main: str, bak: str | None) -> None:
    """An existing empty file is a lost write, not a fresh start: starting empty would persist
    over it with no topics or offsets."""
    path = tmp_path / "consumerOffset.json"
    path.write_text(main)
    if bak is not None:
        path.with_name("consumerOffset.json.bak").write_text(bak)
    with pytest.raises(MetadataLoadError, match=r"is empty and there is no usable consumerOffset\.json\.bak"):
        load_with_backup(path)


def test_empty_bak_alone_is_a_fresh_start(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    path.with_name("topics.json.bak").write_text("")
    assert load_with_backup(path) is None


def test_corrupt_main_and_bak_raises(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    path.write_text("{{{")
    path.with_name("topics.json.bak").write_text("}}}")
    with pytest.raises(MetadataLoadError):
        load_with_backup(path)


def test_decoder_rejection_counts_as_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text("[1]")
    path.with_name("f.json.bak").write_text('{"ok":true}')

    def decode(text: str) -> dict[str, Any]:
        obj = fastjson_loads(text)
        if not isinstance(obj, dict):
            raise TypeError("not an object")
        return obj

    assert load_decoded_with_backup(path, decode) == {"ok": True}


def test_message_queue_keyed_tables_round_trip_and_refuse_other_keys() -> None:
    body = ('{"consumeTps":0.5,"offsetTable":{' + mq_key("b", "T", 0) + ':{"x":1},' + mq_key("b", 'T"q', 1)
            + ':{"x":2}}}').encode()
    assert body.startswith(b'{"consumeTps":0.5,"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:')
    doc, table = loads_mq_keyed(body, "offsetTable")
    assert doc["consumeTps"] == 0.5 and table == {("T", "b", 0): {"x": 1}, ('T"q', "b", 1): {"x": 2}}
    # The writer makes exactly that body (members in name order, compact).
    assert dumps_mq_keyed("offsetTable", [("b", "T", 0, {"x": 1}), ("b", 'T"q', 1, {"x": 2})],
                          consumeTps=0.5) == body
    for bad in (b'{"offsetTable":{"T@b":{"x":1}}}', b'{"offsetTable":{{"queueId":0,"topic":"T"}:1}}',
                b'{"offsetTable":[]}', b"\xff"):
        with pytest.raises(MetadataFormatError):
            loads_mq_keyed(bad, "offsetTable")


def test_nesting_deeper_than_the_stack_is_a_format_error() -> None:
    # json raises RecursionError (not a ValueError) here; a body or file like this is malformed.
    for text in ("[" * 200_000, "{1:" * 200_000):
        with pytest.raises(MetadataFormatError, match="nested too deeply"):
            fastjson_loads(text)
