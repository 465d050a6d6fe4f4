"""SubscriptionGroupConfig and SubscriptionGroupManager / subscriptionGroup.json (§5.4, §2.6, §7.6)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rmqbroker.metadata.data_version import DataVersion
from rmqbroker.metadata.errors import MetadataFormatError
from rmqbroker.metadata.subscription_groups import (
    BUILTIN_GROUPS,
    SubscriptionGroupConfig,
    SubscriptionGroupManager,
    decode_subscription_group_wrapper,
)

# 4.9.x fields plus 5.x additions (groupRetryPolicy, consumeMessageOrderly, attributes, groupSysFlag).
JAVA_SUBSCRIPTION_GROUP_JSON = """{
\t"dataVersion":{
\t\t"counter":3,
\t\t"timestamp":1700000000123
\t},
\t"subscriptionGroupTable":{
\t\t"CG_TEST":{
\t\t\t"brokerId":0,
\t\t\t"consumeBroadcastEnable":true,
\t\t\t"consumeEnable":true,
\t\t\t"consumeFromMinEnable":true,
\t\t\t"groupName":"CG_TEST",
\t\t\t"notifyConsumerIdsChangedEnable":true,
\t\t\t"retryMaxTimes":16,
\t\t\t"retryQueueNums":1,
\t\t\t"whichBrokerWhenConsumeSlowly":1
\t\t},
\t\t"CG_V5":{
\t\t\t"attributes":{},
\t\t\t"brokerId":0,
\t\t\t"consumeBroadcastEnable":false,
\t\t\t"consumeEnable":false,
\t\t\t"consumeFromMinEnable":true,
\t\t\t"consumeMessageOrderly":false,
\t\t\t"consumeTimeoutMinute":15,
\t\t\t"groupName":"CG_V5",
\t\t\t"groupRetryPolicy":{
\t\t\t\t"type":"CUSTOMIZED"
\t\t\t},
\t\t\t"groupSysFlag":0,
\t\t\t"notifyConsumerIdsChangedEnable":true,
\t\t\t"retryMaxTimes":3,
\t\t\t"retryQueueNums":1,
\t\t\t"whichBrokerWhenConsumeSlowly":1
\t\t}
\t}
}"""


def on_disk(config_dir: Path) -> dict[str, Any]:
    obj = json.loads((config_dir / "subscriptionGroup.json").read_text())
    assert isinstance(obj, dict)
    return obj


def test_config_defaults_and_json_shape() -> None:
    config = SubscriptionGroupConfig("CG")
    assert config.to_json_obj() == {
        "brokerId": 0,
        "consumeBroadcastEnable": True,
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "groupName": "CG",
        "notifyConsumerIdsChangedEnable": True,
        "retryMaxTimes": 16,
        "retryQueueNums": 1,
        "whichBrokerWhenConsumeSlowly": 1,
    }
    assert SubscriptionGroupConfig.from_json_obj(config.to_json_obj()) == config
    assert SubscriptionGroupConfig.from_json_obj({}, "Keyed").group_name == "Keyed"
    with pytest.raises(MetadataFormatError):
        SubscriptionGroupConfig.from_json_obj({"retryMaxTimes": 1})


def test_builtin_groups(config_dir: Path) -> None:
    mgr = SubscriptionGroupManager(config_dir, auto_create=False)
    assert set(mgr.table()) == set(BUILTIN_GROUPS)
    assert set(BUILTIN_GROUPS) == {
        "TOOLS_CONSUMER",
        "FILTERSRV_CONSUMER",
        "SELF_TEST_C_GROUP",
        "CID_ONS-HTTP-PROXY",
        "CID_ONSAPI_PULL",
        "CID_ONSAPI_PERMISSION",
        "CID_ONSAPI_OWNER",
    }
    assert mgr.find("TOOLS_CONSUMER") == SubscriptionGroupConfig("TOOLS_CONSUMER")


def test_find_auto_creates_persists_and_bumps_version(config_dir: Path) -> None:
    mgr = SubscriptionGroupManager(config_dir, auto_create=True)
    before = mgr.data_version
    config = mgr.find("CG_NEW")
    assert config == SubscriptionGroupConfig("CG_NEW")
    assert mgr.data_version.counter == before.counter + 1
    disk = on_disk(config_dir)
    assert disk["subscriptionGroupTable"]["CG_NEW"] == config.to_json_obj()
    assert disk["dataVersion"] == mgr.data_version.to_json_obj()
    # Second lookup: no change.
    assert mgr.find("CG_NEW") is config
    assert mgr.data_version.counter == before.counter + 1


def test_find_without_auto_create(config_dir: Path) -> None:
    mgr = SubscriptionGroupManager(config_dir, auto_create=False)
    assert mgr.find("CG_NEW") is None
    assert mgr.get("CG_NEW") is None
    assert not (config_dir / "subscriptionGroup.json").exists()
    # System consumer groups are created regardless.
    assert mgr.find("CID_RMQ_SYS_TRANS") is not None


def test_update_and_delete(config_dir: Path) -> None:
    mgr = SubscriptionGroupManager(config_dir)
    start = mgr.data_version.counter
    assert mgr.update(SubscriptionGroupConfig("CG", retry_max_times=3)) is None
    previous = mgr.update(SubscriptionGroupConfig("CG", consume_enable=False))
    assert previous == SubscriptionGroupConfig("CG", retry_max_times=3)
    assert mgr.delete("CG")
    assert not mgr.delete("CG")
    assert mgr.data_version.counter == start + 3
    assert "CG" not in on_disk(config_dir)["subscriptionGroupTable"]


def test_loads_java_file_and_preserves_unknown_fields(config_dir: Path) -> None:
    (config_dir / "subscriptionGroup.json").write_text(JAVA_SUBSCRIPTION_GROUP_JSON)
    mgr = SubscriptionGroupManager(config_dir)
    assert mgr.data_version == DataVersion(1700000000123, 3)
    v5 = mgr.get("CG_V5")
    assert v5 is not None
    assert (v5.consume_enable, v5.consume_broadcast_enable, v5.retry_max_times) == (False, False, 3)
    assert v5.extra["groupRetryPolicy"] == {"type": "CUSTOMIZED"}
    assert "TOOLS_CONSUMER" in mgr
    mgr.find("CG_OTHER")
    disk = on_disk(config_dir)["subscriptionGroupTable"]
    original = json.loads(JAVA_SUBSCRIPTION_GROUP_JSON)["subscriptionGroupTable"]
    assert disk["CG_V5"] == original["CG_V5"]
    assert disk["CG_TEST"] == original["CG_TEST"]


def test_bak_fallback(config_dir: Path) -> None:
    (config_dir / "subscriptionGroup.json.bak").write_text(JAVA_SUBSCRIPTION_GROUP_JSON)
    (config_dir / "subscriptionGroup.json").write_text('{"dataVersion":{"coun')
    mgr = SubscriptionGroupManager(config_dir)
    assert mgr.get("CG_TEST") is not None


def test_encode_and_replace_all(config_dir: Path) -> None:
    master = SubscriptionGroupManager(config_dir / "m")
    master.find("CG_A")
    slave = SubscriptionGroupManager(config_dir / "s")
    body = master.encode()
    assert "\n" not in body and json.loads(body) == json.loads(master.encode(pretty=True))
    table, version = decode_subscription_group_wrapper(body)
    assert version is not None
    assert slave.replace_all(table, version)
    assert slave.table() == master.table() and slave.data_version == master.data_version
    path = config_dir / "s" / "subscriptionGroup.json"
    stat = path.stat()
    assert not slave.replace_all(table, version)
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)


def test_the_group_table_in_pieces_is_the_whole_encoding(config_dir: Path) -> None:
    """GET_ALL_SUBSCRIPTIONGROUP_CONFIG is answered from pieces: joined, one encoding's text."""
    import asyncio

    from rmqbroker.metadata.jsonfile import PIECE_KEYS

    mgr = SubscriptionGroupManager(config_dir)
    for i in range(PIECE_KEYS + 7):
        mgr.update(SubscriptionGroupConfig(f"CG{i:04d}", retry_queue_nums=i % 3 + 1), persist=False)
    assert asyncio.run(mgr.encode_async()) == mgr.encode()
