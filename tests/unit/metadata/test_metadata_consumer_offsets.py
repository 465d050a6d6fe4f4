"""ConsumerOffsetManager / consumerOffset.json (§5.2, §2.8, §7.6)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rmqbroker.metadata.consumer_offsets import ConsumerOffsetManager, decode_consumer_offsets
from rmqbroker.metadata.errors import MetadataLoadError
from rmqbroker.metadata.jsonfile import PIECE_KEYS

# What a 4.9.x broker writes: fastjson pretty print, bare integer keys, odd closing-brace breaks.
JAVA_CONSUMER_OFFSET_JSON = """{
\t"offsetTable":{
\t\t"%RETRY%please_rename_unique_group_name_4@please_rename_unique_group_name_4":{0:0
\t\t},
\t\t"TopicTest@please_rename_unique_group_name_4":{0:250,1:250,2:249,3:251
\t\t},
\t\t"OrderTopic@CG2":{0:12,1:7,-1:3
\t\t}
\t}
}"""

# GET_ALL_CONSUMER_OFFSET body from a Java master (compact, bare integer keys, 5.x dataVersion).
JAVA_GET_ALL_BODY = '{"dataVersion":{"counter":1,"timestamp":1},"offsetTable":{"TopicTest@CG":{0:12,1:7}}}'


def test_loads_java_written_file(config_dir: Path) -> None:
    (config_dir / "consumerOffset.json").write_text(JAVA_CONSUMER_OFFSET_JSON)
    mgr = ConsumerOffsetManager(config_dir)
    group = "please_rename_unique_group_name_4"
    assert mgr.query(group, "TopicTest", 2) == 249
    assert mgr.query(group, f"%RETRY%{group}", 0) == 0
    assert mgr.query("CG2", "OrderTopic", -1) == 3
    assert mgr.query(group, "TopicTest", 9) == -1
    assert mgr.query("nobody", "TopicTest", 0) == -1
    assert not mgr.dirty


def test_commit_query_and_dirty_tracking(config_dir: Path) -> None:
    mgr = ConsumerOffsetManager(config_dir)
    assert not mgr.dirty
    assert not mgr.persist_if_dirty()
    assert not (config_dir / "consumerOffset.json").exists()

    mgr.commit("CG", "TopicTest", 0, 12)
    mgr.commit("CG", "TopicTest", 1, 7)
    assert mgr.dirty
    assert mgr.query("CG", "TopicTest", 0) == 12
    assert mgr.persist_if_dirty()
    assert not mgr.dirty
    assert json.loads((config_dir / "consumerOffset.json").read_text()) == {
        "offsetTable": {"TopicTest@CG": {"0": 12, "1": 7}}
    }

    # Re-committing the same value is not a change; an unchanged table is not rewritten.
    stat = (config_dir / "consumerOffset.json").stat()
    mgr.commit("CG", "TopicTest", 0, 12)
    assert not mgr.dirty and not mgr.persist_if_dirty()
    assert (config_dir / "consumerOffset.json").stat().st_ino == stat.st_ino

    mgr.commit("CG", "TopicTest", 0, 5, client_host="10.0.0.1:1234")  # moving back is allowed
    assert mgr.query("CG", "TopicTest", 0) == 5 and mgr.dirty


def test_encode_uses_quoted_keys_in_numeric_order(config_dir: Path) -> None:
    mgr = ConsumerOffsetManager(config_dir)
    for queue in (10, 2, 1):
        mgr.commit("G", "T", queue, queue * 100)
    assert mgr.encode() == '{"offsetTable":{"T@G":{"1":100,"2":200,"10":1000}}}'
    assert decode_consumer_offsets(mgr.encode(pretty=True)) == {"T@G": {1: 100, 2: 200, 10: 1000}}


def test_round_trip_through_disk(config_dir: Path) -> None:
    mgr = ConsumerOffsetManager(config_dir)
    mgr.commit("G1", "T1", 0, 1)
    mgr.commit("G2", "T1", 3, 9)
    mgr.persist()
    again = ConsumerOffsetManager(config_dir)
    assert again.table() == mgr.table() == {"T1@G1": {0: 1}, "T1@G2": {3: 9}}


def test_helpers(config_dir: Path) -> None:
    mgr = ConsumerOffsetManager(config_dir)
    mgr.commit("G1", "T1", 0, 1)
    mgr.commit("G1", "T2", 1, 2)
    mgr.commit("G2", "T1", 0, 3)
    assert mgr.offsets_for_group("G1") == {"T1": {0: 1}, "T2": {1: 2}}
    assert mgr.which_groups_by_topic("T1") == {"G1", "G2"}
    assert mgr.which_topics_by_group("G1") == {"T1", "T2"}
    assert mgr.query_all("G1", "T2") == {1: 2}
    assert mgr.query_all("G9", "T2") == {}
    assert mgr.clone_offset("G1", "G3", "T1")
    assert mgr.query("G3", "T1", 0) == 1
    assert not mgr.clone_offset("nobody", "G3", "T1")
    mgr.persist()
    assert mgr.remove_offsets("G1", "T2")
    assert mgr.which_topics_by_group("G1") == {"T1"}
    assert mgr.remove_offsets("G1")
    assert not mgr.remove_offsets("G1")
    assert mgr.dirty
    assert mgr.remove_offsets(topic="T1")  # every group's offsets on a deleted topic
    assert mgr.which_groups_by_topic("T1") == set() and not mgr.remove_offsets(topic="T1")
    with pytest.raises(ValueError):
        mgr.remove_offsets()


def test_merge_all_replaces_per_key(config_dir: Path) -> None:
    (config_dir / "consumerOffset.json").write_text('{"offsetTable":{"TopicTest@CG":{0:1,1:1,2:1},"Local@CG":{0:5}}}')
    mgr = ConsumerOffsetManager(config_dir)
    incoming = decode_consumer_offsets(JAVA_GET_ALL_BODY)
    assert incoming == {"TopicTest@CG": {0: 12, 1: 7}}
    mgr.merge_all(incoming)
    assert mgr.table() == {"TopicTest@CG": {0: 12, 1: 7}, "Local@CG": {0: 5}}
    assert mgr.dirty
    mgr.persist()
    assert json.loads((config_dir / "consumerOffset.json").read_text())["offsetTable"]["TopicTest@CG"] == {
        "0": 12,
        "1": 7,
    }
    # The merged copy is independent of the caller's mapping.
    incoming["TopicTest@CG"][0] = 999
    assert mgr.query("CG", "TopicTest", 0) == 12


def test_unknown_top_level_fields_are_kept(config_dir: Path) -> None:
    (config_dir / "consumerOffset.json").write_text(JAVA_GET_ALL_BODY)
    mgr = ConsumerOffsetManager(config_dir)
    mgr.commit("CG", "TopicTest", 0, 13)
    mgr.persist()
    disk = json.loads((config_dir / "consumerOffset.json").read_text())
    assert disk["dataVersion"] == {"counter": 1, "timestamp": 1}
    assert disk["offsetTable"] == {"TopicTest@CG": {"0": 13, "1": 7}}


def test_truncated_file_uses_bak(config_dir: Path) -> None:
    (config_dir / "consumerOffset.json.bak").write_text(JAVA_CONSUMER_OFFSET_JSON)
    (config_dir / "consumerOffset.json").write_text(JAVA_CONSUMER_OFFSET_JSON[:90])
    mgr = ConsumerOffsetManager(config_dir)
    assert mgr.query("CG2", "OrderTopic", 1) == 7


def test_bad_offset_value_without_bak_is_fatal(config_dir: Path) -> None:
    (config_dir / "consumerOffset.json").write_text('{"offsetTable":{"T@G":{0:"x"}}}')
    with pytest.raises(MetadataLoadError):
        ConsumerOffsetManager(config_dir)


async def test_persist_async(config_dir: Path) -> None:
    mgr = ConsumerOffsetManager(config_dir)
    mgr.commit("G", "T", 0, 42)
    await mgr.persist_async()
    assert not mgr.dirty
    assert not await mgr.persist_if_dirty_async()
    assert ConsumerOffsetManager(config_dir).query("G", "T", 0) == 42


def test_a_slaves_outage_commits_survive_a_restart(config_dir: Path) -> None:
    """What a group committed to a slave while its master was away is kept over the master's older
    table by a restarted slave too: the marks are written with the offsets."""
    mgr = ConsumerOffsetManager(config_dir)
    mgr.merge_all({"T@G": {0: 5, 1: 5}})  # the master's table, synced before the outage
    mgr.commit("G", "T", 0, 9, on_slave=True)
    mgr.commit("G", "T", 1, 8, on_slave=True)
    mgr.relayed("G", "T", 1, 8)  # queue 1's commit already handed over
    mgr.persist()
    disk = json.loads((config_dir / "consumerOffset.json").read_text())
    assert disk["slaveCommits"] == {"T@G": {"0": {"handedOver": False, "masterOffset": 5},
                                            "1": {"handedOver": True, "masterOffset": 8}}}

    restarted = ConsumerOffsetManager(config_dir)
    assert restarted.kept_over_master() == [("G", "T", 0, 9)]
    # The master comes back with its stale table: queue 0 keeps the slave's commit; queue 1 was
    # handed over and the master has moved it since (a reset), so the master's offset wins there.
    restarted.merge_all({"T@G": {0: 4, 1: 3}})
    assert restarted.table() == {"T@G": {0: 9, 1: 3}}
    restarted.persist()
    assert json.loads((config_dir / "consumerOffset.json").read_text())["slaveCommits"] == {
        "T@G": {"0": {"handedOver": False, "masterOffset": 5}}}

    # Promoted (or started as a master): the commits are its own offsets, nothing is marked any more.
    restarted.forget_slave_commits()
    assert restarted.dirty
    restarted.persist()
    disk = json.loads((config_dir / "consumerOffset.json").read_text())
    assert "slaveCommits" not in disk and disk["offsetTable"] == {"T@G": {"0": 9, "1": 3}}
    # A GET_ALL_CONSUMER_OFFSET body decodes to the offsets only.
    assert decode_consumer_offsets(mgr.encode()) == {"T@G": {0: 9, 1: 8}}


def test_a_damaged_slave_commits_field_costs_only_the_marks(config_dir: Path) -> None:
    (config_dir / "consumerOffset.json").write_text(
        '{"offsetTable":{"T@G":{"0":9}},"slaveCommits":{"T@G":{"0":{"masterOffset":"x"}}}}')
    mgr = ConsumerOffsetManager(config_dir)
    assert mgr.query("G", "T", 0) == 9
    assert mgr.kept_over_master() == []
    mgr.merge_all({"T@G": {0: 4}})  # without marks, the master's table wins (as RocketMQ's putAll)
    assert mgr.query("G", "T", 0) == 4


# ------------------------------------------------------------------ large tables, piece by piece
def big_table(mgr: ConsumerOffsetManager, keys: int) -> None:
    for i in range(keys):
        for q in (3, 0, 1):  # committed out of order: the file lists queues in order
            mgr.commit(f"G{i % 7}", f"Topic{i:05d}", q, i * 10 + q)


@pytest.mark.parametrize("keys", [0, 1, PIECE_KEYS, PIECE_KEYS * 2 + 1])
def test_the_pieces_give_the_encoding_of_the_whole_table(config_dir: Path, keys: int) -> None:
    """GET_ALL_CONSUMER_OFFSET is answered from pieces of PIECE_KEYS keys so that the event loop runs
    between them: joined, they are the same text as one encoding, extra fields and a slave's
    outage commits included; the file, one key per line, decodes to the same table (also by a
    fresh manager loading it)."""
    (config_dir / "consumerOffset.json").write_text(JAVA_GET_ALL_BODY)
    mgr = ConsumerOffsetManager(config_dir)
    big_table(mgr, keys)
    mgr.commit("CG", "TopicTest", 0, 99, on_slave=True)
    assert asyncio.run(mgr.encode_async()) == mgr.encode()
    mgr.persist()
    text = (config_dir / "consumerOffset.json").read_text()
    assert json.loads(text) == json.loads(mgr.encode())
    assert text.count("\n") >= keys  # one line per key
    again = ConsumerOffsetManager(config_dir)
    assert again.table() == mgr.table() and again.keys_committed_here() == {"TopicTest@CG"}


def test_commits_between_the_pieces_leave_the_text_whole(config_dir: Path) -> None:
    """The loop runs between the pieces, and what it commits or removes there shows in the pieces
    read after it (as Java serialises its concurrent map); the text stays one JSON document and a
    persist made that way leaves the table dirty if it may have missed a change."""
    mgr = ConsumerOffsetManager(config_dir)
    keys = PIECE_KEYS * 3
    big_table(mgr, keys)
    mgr.persist()
    last, removed = (f"Topic{i:05d}@G{i % 7}" for i in (keys - 1, keys - 2))  # both in the last piece

    async def run() -> str:
        async def meanwhile() -> None:
            await asyncio.sleep(0)
            topic, group = last.split("@")
            mgr.commit(group, topic, 0, 123456)
            mgr.remove_keys([removed])
            mgr.commit("G9", "ANewTopic", 0, 1)  # after the keys were listed

        other = asyncio.create_task(meanwhile())
        text = await mgr.encode_async()
        await mgr.persist_async()
        await other
        return text

    text = asyncio.run(run())
    table = json.loads(text)["offsetTable"]
    assert table[last]["0"] == 123456 and removed not in table
    assert "ANewTopic@G9" not in table and len(table) == keys - 1
    on_disk = json.loads((config_dir / "consumerOffset.json").read_text())["offsetTable"]
    assert on_disk[last]["0"] == 123456
    assert mgr.dirty or "ANewTopic@G9" in on_disk


def test_merge_in_slices_is_the_whole_merge(config_dir: Path, tmp_path: Path) -> None:
    """A slave merges its master's table in slices of PIECE_KEYS keys (the event loop runs between
    them) with the same outcome as at once: the master's queues taken, the outage commits kept over
    its stale ones, a pending mark dropped where the master moved on."""
    managers = []
    for where in (config_dir, tmp_path):
        mgr = ConsumerOffsetManager(where)
        big_table(mgr, PIECE_KEYS * 2 + 5)
        incoming = mgr.table()  # the master's table, synced before the outage
        mgr.commit("G1", "Topic00001", 0, 500, on_slave=True)  # kept: the master has nothing newer
        mgr.commit("G3", "Topic00003", 1, 500, on_slave=True)  # dropped: the master moved on
        managers.append(mgr)
    for key in list(incoming)[::4]:  # other groups committed on the master
        incoming[key] = {q: o + 1 for q, o in incoming[key].items()}
    incoming["Topic00003@G3"][1] = 9999
    assert managers[0].merge_all(incoming)
    assert asyncio.run(managers[1].merge_all_async(incoming))
    assert managers[0].table() == managers[1].table()
    assert managers[1].query("G1", "Topic00001", 0) == 500 and managers[1].query("G3", "Topic00003", 1) == 9999
    assert managers[0].keys_committed_here() == managers[1].keys_committed_here() == {"Topic00001@G1"}
    assert not asyncio.run(managers[1].merge_all_async(incoming))  # nothing left to change


@pytest.mark.parametrize("text", [
    "{}", " { } ", '{"offsetTable":{}}', '{"offsetTable":null}', '{"offsetTable":5}', '{"offsetTable":[]}',
    '{"dataVersion":{"counter":1},"offsetTable":{"T@G":{"0":1,"1":2}},"x":[1,{"y":"}"}]}',
    '{\n\t"offsetTable":{\n\t\t"T@G":{"0":1},\n\t\t"U@G":{"3":4}\n\t}\n}\n',
    '{"offsetTable":{"T@G":{"0":1}},"offsetTable":{"U@G":{"1":2}}}',
    '{"offsetTable":{"T\\u00e9@G":{"0":1},"a},\\"b@G":{"1":2}}}',
    '\ufeff{"offsetTable":{"T@G":{"0":1}}}',
    '{"offsetTable":{"T@G":{0:1,-1:2}}}',  # fastjson's bare keys (a Java master)
    '{"offsetTable":{"T@G":{"0":"7","1":8.0}}}',  # quoted and float numbers
    '{"offsetTable":{"T@G":{"0":true}}}', '{"offsetTable":{"T@G":{"x":1}}}', '{"offsetTable":{"T@G":5}}',
    '{"offsetTable":{"T@G":{"0":1}}} trailing', '{"offsetTable":{"T@G":{"0":1}}', '{"offsetTable":{"T@G":{"0":1},}}',
    '[1]', '"s"', '', '{"offsetTable":{"T@G":{"0":1}}}{}',
])
def test_decoding_entry_by_entry_is_decoding_at_once(text: str) -> None:
    """A slave decodes its master's table entry by entry (so that the event loop gets the GIL in
    between): same table or same refusal as decoding the whole text at once."""
    from rmqbroker.metadata.consumer_offsets import _decode_obj
    from rmqbroker.metadata.errors import MetadataFormatError
    from rmqbroker.metadata.jsonfile import fastjson_loads

    def at_once() -> object:
        try:
            return _decode_obj(fastjson_loads(text))[0]
        except MetadataFormatError:
            return MetadataFormatError

    def by_entry(body: str | bytes) -> object:
        try:
            return decode_consumer_offsets(body)
        except MetadataFormatError:
            return MetadataFormatError

    expected = at_once()
    assert by_entry(text) == expected
    assert by_entry(text.encode()) == expected


def test_a_key_with_braces_and_commas_survives_the_file(config_dir: Path) -> None:
    """The file lists one key per line by cutting the compact text after each '},"': a group named
    by a client with '},' in it must not be cut inside its name."""
    mgr = ConsumerOffsetManager(config_dir)
    mgr.commit('G},"x', "T", 0, 1)
    mgr.commit("G},", "T", 1, 2)
    mgr.commit("H", "T", 0, 3)
    mgr.persist()
    assert ConsumerOffsetManager(config_dir).table() == {'T@G},"x': {0: 1}, "T@G},": {1: 2}, "T@H": {0: 3}}
