"""TopicConfig, validation and TopicConfigManager / topics.json (§5.1, §2.4, §2.13, §7.6)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from rmqbroker.metadata.data_version import DataVersion
from rmqbroker.metadata.errors import MetadataFormatError, MetadataLoadError, MetadataPersistError
from rmqbroker.metadata.jsonfile import fastjson_loads
from rmqbroker.metadata.topics import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    DELETED_TOPICS_KEY,
    LOG_ID_KEY,
    NOT_ALLOWED_SEND_TOPICS,
    PERM_INHERIT,
    PERM_PRIORITY,
    PERM_READ,
    PERM_WRITE,
    SCHEDULE_TOPIC,
    TopicConfig,
    TopicConfigManager,
    decode_topic_sync,
    decode_topic_wrapper,
    is_not_allowed_send_topic,
    is_system_topic,
    retry_topic,
    validate_topic,
)

JAVA_TOPICS_JSON = """{
\t"dataVersion":{
\t\t"counter":7,
\t\t"timestamp":1700000000000
\t},
\t"topicConfigTable":{
\t\t"TopicTest":{
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":4,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"TopicTest",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":4
\t\t},
\t\t"OldTopic":{
\t\t\t"order":true,
\t\t\t"perm":4,
\t\t\t"readQueueNums":2,
\t\t\t"topicFilterType":"MULTI_TAG",
\t\t\t"topicName":"OldTopic",
\t\t\t"topicSynFlag":1,
\t\t\t"writeQueueNums":2
\t\t},
\t\t"TopicV5":{
\t\t\t"attributes":{"+message.type":"NORMAL"},
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":8,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"TopicV5",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":8
\t\t},
\t\t"TBW102":{
\t\t\t"order":false,
\t\t\t"perm":7,
\t\t\t"readQueueNums":8,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"TBW102",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":8
\t\t}
\t}
}"""


def make_manager(config_dir: Path, **overrides: object) -> TopicConfigManager:
    kwargs: dict[str, object] = {
        "cluster_name": "DefaultCluster",
        "broker_name": "broker-a",
        "auto_create_topic_enable": True,
        "default_topic_queue_nums": 8,
    }
    kwargs.update(overrides)
    return TopicConfigManager(config_dir, **kwargs)  # type: ignore[arg-type]


def on_disk(config_dir: Path) -> dict[str, Any]:
    obj = json.loads((config_dir / "topics.json").read_text())
    assert isinstance(obj, dict)
    return obj


# -- TopicConfig ------------------------------------------------------------------------------------


def test_topic_config_defaults_and_perm_constants() -> None:
    tc = TopicConfig("T")
    assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (16, 16, 6)
    assert (tc.topic_filter_type, tc.topic_sys_flag, tc.order) == ("SINGLE_TAG", 0, False)
    assert (PERM_PRIORITY, PERM_READ, PERM_WRITE, PERM_INHERIT) == (8, 4, 2, 1)
    assert tc.readable and tc.writeable and not tc.inherited


def test_topic_config_json_uses_java_field_names_and_keeps_unknown_keys() -> None:
    obj = {
        "topicName": "T",
        "readQueueNums": 4,
        "writeQueueNums": 2,
        "perm": 7,
        "topicFilterType": "MULTI_TAG",
        "topicSysFlag": 1,
        "order": True,
        "attributes": {"+message.type": "FIFO"},
    }
    tc = TopicConfig.from_json_obj(obj)
    assert tc == TopicConfig("T", 4, 2, 7, "MULTI_TAG", 1, True, {"attributes": {"+message.type": "FIFO"}})
    assert tc.to_json_obj() == obj
    assert list(tc.to_json_obj()) == sorted(obj)


def test_topic_config_lenient_types_and_legacy_syn_flag() -> None:
    tc = TopicConfig.from_json_obj(
        {"readQueueNums": "4", "writeQueueNums": 4, "perm": "6", "order": "true", "topicSynFlag": 2}, "X"
    )
    assert (tc.topic_name, tc.read_queue_nums, tc.perm, tc.order, tc.topic_sys_flag) == ("X", 4, 6, True, 2)
    assert tc.to_json_obj()["topicSynFlag"] == 2


# -- validation -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["TopicTest", "%RETRY%cg", "a|b", "A-b_9", "x" * 127])
def test_valid_topic_names(name: str) -> None:
    assert validate_topic(name) is None


@pytest.mark.parametrize("name", [None, "", "   ", "a b", "topic.x", "主题", "a@b", "x" * 128])
def test_invalid_topic_names(name: str | None) -> None:
    remark = validate_topic(name)
    assert isinstance(remark, str) and remark


def test_system_and_forbidden_topics() -> None:
    expected = {
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    }
    assert expected == NOT_ALLOWED_SEND_TOPICS
    assert is_not_allowed_send_topic(SCHEDULE_TOPIC)
    assert not is_not_allowed_send_topic("TopicTest")
    assert is_system_topic("TBW102") and is_system_topic("rmq_sys_anything")
    assert not is_system_topic("TopicTest")


# -- built-ins --------------------------------------------------------------------------------------


def test_builtin_topics(config_dir: Path) -> None:
    mgr = make_manager(config_dir)
    expect = {
        "SELF_TEST_TOPIC": (1, 1, 6),
        "TBW102": (8, 8, 7),
        "BenchmarkTest": (1024, 1024, 6),
        "DefaultCluster": (16, 16, 7),
        "broker-a": (1, 1, 7),
        "OFFSET_MOVED_EVENT": (1, 1, 6),
        "SCHEDULE_TOPIC_XXXX": (18, 18, 6),
        "DefaultCluster_REPLY_TOPIC": (1, 1, 6),
    }
    for name, (read, write, perm) in expect.items():
        tc = mgr.select(name)
        assert tc is not None, name
        assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (read, write, perm), name
    assert set(mgr.topic_names()) == set(expect)
    assert mgr.is_system_topic("DefaultCluster") and mgr.is_system_topic("broker-a")
    # As RocketMQ's TopicValidator.addSystemTopic: not deletable like a user topic.
    assert mgr.is_system_topic("DefaultCluster_REPLY_TOPIC")
    # Built-ins live in memory only until the first change.
    assert not (config_dir / "topics.json").exists()
    assert not mgr.dirty


def test_builtins_without_auto_create_and_with_trace(config_dir: Path) -> None:
    mgr = make_manager(
        config_dir,
        auto_create_topic_enable=False,
        cluster_topic_enable=False,
        broker_topic_enable=False,
        trace_topic_enable=True,
    )
    assert mgr.select(AUTO_CREATE_TOPIC_KEY_TOPIC) is None
    cluster = mgr.select("DefaultCluster")
    broker = mgr.select("broker-a")
    assert cluster is not None and cluster.perm == PERM_INHERIT
    assert broker is not None and broker.perm == PERM_INHERIT
    trace = mgr.select("RMQ_SYS_TRACE_TOPIC")
    assert trace is not None and trace.read_queue_nums == 1


# -- auto-create on send ----------------------------------------------------------------------------


def test_create_topic_in_send_message_method(config_dir: Path) -> None:
    mgr = make_manager(config_dir)
    seen: list[tuple[str, TopicConfig | None]] = []
    mgr.add_change_listener(lambda name, tc: seen.append((name, tc)))
    before = mgr.data_version

    tc = mgr.create_topic_in_send_message_method("NewTopic", "TBW102", "10.0.0.9:5555", 4, 0)

    assert tc == TopicConfig("NewTopic", 4, 4, 6)
    assert mgr.select("NewTopic") == tc
    after = mgr.data_version
    assert after.counter == before.counter + 1 and after != before
    disk = on_disk(config_dir)
    assert disk["dataVersion"] == after.to_json_obj()
    assert disk["topicConfigTable"]["NewTopic"] == tc.to_json_obj()
    assert seen == [("NewTopic", tc)]
    assert not mgr.dirty

    # Existing topic: returned as-is, nothing changes.
    assert mgr.create_topic_in_send_message_method("NewTopic", "TBW102", "x", 2, 0) is tc
    assert mgr.data_version == after


def test_auto_create_caps_queues_at_default_topic(config_dir: Path) -> None:
    mgr = make_manager(config_dir, default_topic_queue_nums=3)
    tc = mgr.create_topic_in_send_message_method("T1", "TBW102", "h", 16, 0)
    assert tc is not None and (tc.read_queue_nums, tc.write_queue_nums) == (3, 3)


def test_auto_create_refused(config_dir: Path) -> None:
    mgr = make_manager(config_dir)
    assert mgr.create_topic_in_send_message_method("T1", "NoSuchDefault", "h", 4, 0) is None
    # Default topic without PERM_INHERIT.
    assert mgr.create_topic_in_send_message_method("T1", "TopicX", "h", 4, 0) is None
    mgr.update_topic_config(TopicConfig("TopicX", 4, 4, 6))
    assert mgr.create_topic_in_send_message_method("T1", "TopicX", "h", 4, 0) is None
    assert mgr.select("T1") is None


def test_persisted_tbw102_does_not_reenable_auto_create(config_dir: Path) -> None:
    (config_dir / "topics.json").write_text(JAVA_TOPICS_JSON)
    mgr = make_manager(config_dir, auto_create_topic_enable=False)
    assert mgr.select("TBW102") is not None
    assert mgr.create_topic_in_send_message_method("T1", "TBW102", "h", 4, 0) is None


def test_create_retry_topic(config_dir: Path) -> None:
    mgr = make_manager(config_dir)
    version = mgr.data_version
    tc = mgr.create_retry_topic(retry_topic("CG"), 1, PERM_READ | PERM_WRITE)
    assert tc == TopicConfig("%RETRY%CG", 1, 1, 6)
    assert mgr.data_version.counter == version.counter + 1
    assert "%RETRY%CG" in on_disk(config_dir)["topicConfigTable"]
    assert mgr.create_retry_topic("%RETRY%CG", 5, 2) is tc


# -- update / delete --------------------------------------------------------------------------------


def test_every_change_bumps_version_and_persists(config_dir: Path) -> None:
    mgr = make_manager(config_dir)
    counters = [mgr.data_version.counter]
    mgr.update_topic_config(TopicConfig("A", 2, 2))
    counters.append(mgr.data_version.counter)
    previous = mgr.update_topic_config(TopicConfig("A", 4, 4, order=True))
    assert previous == TopicConfig("A", 2, 2)
    counters.append(mgr.data_version.counter)
    assert mgr.update_topic_sys_flag("A", 1) == TopicConfig("A", 4, 4, order=True, topic_sys_flag=1)
    counters.append(mgr.data_version.counter)
    assert mgr.update_topic_sys_flag("A", 1) is not None  # unchanged: no bump
    assert mgr.delete_topic("A")
    counters.append(mgr.data_version.counter)
    assert counters == list(range(counters[0], counters[0] + 5))
    assert not mgr.delete_topic("A")
    assert mgr.data_version.counter == counters[-1]
    assert "A" not in on_disk(config_dir)["topicConfigTable"]
    assert on_disk(config_dir)["dataVersion"] == mgr.data_version.to_json_obj()


def test_reload_restores_table_and_version(config_dir: Path) -> None:
    mgr = make_manager(config_dir)
    mgr.update_topic_config(TopicConfig("Orders", 8, 8, 6, "MULTI_TAG", order=True))
    reloaded = make_manager(config_dir)
    assert reloaded.select("Orders") == mgr.select("Orders")
    assert reloaded.data_version == mgr.data_version
    assert reloaded.table() == mgr.table()


def test_persist_false_defers_write(config_dir: Path) -> None:
    mgr = make_manager(config_dir)
    mgr.update_topic_config(TopicConfig("A"), persist=False)
    assert mgr.dirty
    assert not (config_dir / "topics.json").exists()
    assert mgr.persist_if_dirty()
    assert not mgr.dirty
    assert not mgr.persist_if_dirty()
    assert "A" in on_disk(config_dir)["topicConfigTable"]


def test_failed_inline_persist_keeps_change_and_stays_dirty(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mgr = make_manager(config_dir)

    def broken(*_: object) -> None:
        raise MetadataPersistError("disk gone")

    monkeypatch.setattr("rmqbroker.metadata.base.atomic_write", broken)
    mgr.update_topic_config(TopicConfig("A"))
    assert mgr.select("A") is not None and mgr.dirty
    with pytest.raises(MetadataPersistError):
        mgr.persist()
    monkeypatch.undo()
    assert mgr.persist_if_dirty()


# -- encoding / loading Java files ------------------------------------------------------------------


def test_encode_shape(config_dir: Path) -> None:
    mgr = make_manager(config_dir)
    compact = mgr.encode()
    assert "\n" not in compact and compact.startswith('{"dataVersion":{"counter":0,"timestamp":')
    obj = json.loads(compact)
    assert set(obj) == {"dataVersion", "topicConfigTable"}
    assert obj["topicConfigTable"]["TBW102"] == {
        "order": False,
        "perm": 7,
        "readQueueNums": 8,
        "topicFilterType": "SINGLE_TAG",
        "topicName": "TBW102",
        "topicSysFlag": 0,
        "writeQueueNums": 8,
    }
    pretty = mgr.encode(pretty=True)
    assert pretty.startswith('{\n\t"dataVersion":{\n\t\t"counter":0,')
    assert json.loads(pretty) == obj
    table, version = decode_topic_wrapper(compact)
    assert table == mgr.table() and version == mgr.data_version
    assert mgr.wrapper_obj() == obj
    partial = mgr.wrapper_obj(["TBW102", "missing"])
    assert list(partial["topicConfigTable"]) == ["TBW102"]
    assert partial["dataVersion"] == obj["dataVersion"]


def test_loads_java_written_file_and_preserves_unknown_fields(config_dir: Path) -> None:
    (config_dir / "topics.json").write_text(JAVA_TOPICS_JSON)
    mgr = make_manager(config_dir)
    assert mgr.data_version == DataVersion(1700000000000, 7)
    assert mgr.select("TopicTest") == TopicConfig("TopicTest", 4, 4, 6)
    old = mgr.select("OldTopic")
    assert old is not None and old.topic_sys_flag == 1 and old.order and old.topic_filter_type == "MULTI_TAG"
    v5 = mgr.select("TopicV5")
    assert v5 is not None and v5.extra == {"attributes": {"+message.type": "NORMAL"}}
    # Built-ins not in the file are still there.
    assert mgr.select("SCHEDULE_TOPIC_XXXX") is not None
    assert not mgr.dirty

    mgr.update_topic_config(TopicConfig("Other"))
    disk = on_disk(config_dir)
    assert disk["topicConfigTable"]["TopicV5"]["attributes"] == {"+message.type": "NORMAL"}
    assert disk["topicConfigTable"]["OldTopic"]["topicSynFlag"] == 1
    # The previous (Java) content is kept as the backup.
    assert (config_dir / "topics.json.bak").read_text() == JAVA_TOPICS_JSON


def test_truncated_file_falls_back_to_bak(config_dir: Path) -> None:
    (config_dir / "topics.json.bak").write_text(JAVA_TOPICS_JSON)
    (config_dir / "topics.json").write_text(JAVA_TOPICS_JSON[:200])
    mgr = make_manager(config_dir)
    assert mgr.select("TopicTest") is not None
    assert mgr.data_version.counter == 7


def test_wrong_shape_falls_back_to_bak(config_dir: Path) -> None:
    (config_dir / "topics.json.bak").write_text(JAVA_TOPICS_JSON)
    (config_dir / "topics.json").write_text('{"topicConfigTable":{"T":{"perm":"rw"}}}')
    assert make_manager(config_dir).select("TopicTest") is not None


def test_corrupt_file_without_bak_refuses_to_start(config_dir: Path) -> None:
    (config_dir / "topics.json").write_text("\x00\x00\x00")
    with pytest.raises(MetadataLoadError):
        make_manager(config_dir)


# -- slave sync -------------------------------------------------------------------------------------


def test_the_sync_body_carries_the_masters_deleted_topics(config_dir: Path) -> None:
    """GET_ALL_TOPIC_CONFIG adds ``deletedTopics`` (the master's deletion points) to the wrapper;
    the file never holds it, and a body without it (a Java master's) decodes to no deletions."""
    mgr = make_manager(config_dir)
    mgr.update_topic_config(TopicConfig("Kept", 2, 2))
    mgr.persist()
    body = mgr.encode(extra={DELETED_TOPICS_KEY: {"Gone": 4096}})
    table, version, deleted, log_id = decode_topic_sync(body)
    assert table == mgr.table() and version == mgr.data_version and deleted == {"Gone": 4096}
    assert DELETED_TOPICS_KEY not in on_disk(config_dir)
    assert decode_topic_sync(mgr.encode())[2] == {} and log_id is None
    assert decode_topic_sync(mgr.encode(extra={LOG_ID_KEY: "L1"}))[3] == "L1"
    with pytest.raises(MetadataFormatError):
        decode_topic_sync(mgr.encode(extra={LOG_ID_KEY: 7}))
    for bad in ({"Gone": -1}, {"Gone": "many"}, ["Gone"]):
        with pytest.raises(MetadataFormatError, match=DELETED_TOPICS_KEY):
            decode_topic_sync(json.dumps({**json.loads(mgr.encode()), DELETED_TOPICS_KEY: bad}))


def test_replace_all(config_dir: Path) -> None:
    master = make_manager(config_dir / "master")
    master.update_topic_config(TopicConfig("FromMaster", 2, 2))
    slave = make_manager(config_dir / "slave")
    slave.persist()
    path = config_dir / "slave" / "topics.json"

    table, version = decode_topic_wrapper(master.encode())
    assert version is not None
    assert slave.replace_all(table, version)
    assert slave.data_version == master.data_version
    assert slave.table() == master.table()
    assert on_disk(config_dir / "slave") == json.loads(master.encode())

    stat = path.stat()
    assert not slave.replace_all(table, version.copy())
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    assert not slave.dirty


# -- async persistence ------------------------------------------------------------------------------


async def test_persist_async_with_concurrent_mutations(config_dir: Path) -> None:
    mgr = make_manager(config_dir)
    writes = [mgr.persist_async() for _ in range(5)]
    for i in range(200):
        mgr.update_topic_config(TopicConfig(f"T{i}", 1, 1), persist=False)
        if i % 40 == 0:
            writes.append(mgr.persist_async())
            await asyncio.sleep(0)
    await asyncio.gather(*writes)
    # Every intermediate file was complete JSON; the final flush has everything.
    assert await mgr.persist_if_dirty_async() in (True, False)
    assert not mgr.dirty
    disk = fastjson_loads(await asyncio.to_thread((config_dir / "topics.json").read_text))
    assert len(disk["topicConfigTable"]) == len(mgr)
    assert disk["dataVersion"] == mgr.data_version.to_json_obj()
    assert not await asyncio.to_thread((config_dir / "topics.json.tmp").exists)


def test_topic_config_is_immutable() -> None:
    tc = TopicConfig("T")
    with pytest.raises(dataclasses.FrozenInstanceError):
        tc.perm = 2  # type: ignore[misc]
    assert dataclasses.replace(tc, perm=2).perm == 2


def test_the_topic_table_in_pieces_is_the_whole_encoding(config_dir: Path) -> None:
    """GET_ALL_TOPIC_CONFIG is answered from pieces (the event loop runs between them): joined,
    the same text as one encoding, unknown entry fields and the deleted-topics extra included."""
    from rmqbroker.metadata.jsonfile import PIECE_KEYS

    mgr = make_manager(config_dir)
    for i in range(PIECE_KEYS * 2 + 3):
        mgr.update_topic_config(TopicConfig(f"Topic{i:04d}", read_queue_nums=i % 5 + 1, write_queue_nums=4,
                                            extra={"attributes": {"k": f"v{i}"}} if i % 3 else {}), persist=False)
    extra = {DELETED_TOPICS_KEY: [{"topic": "Gone", "phyOffset": 5}]}
    assert asyncio.run(mgr.encode_async(extra=extra)) == mgr.encode(extra=extra)
    assert asyncio.run(mgr.encode_async()) == mgr.encode()
