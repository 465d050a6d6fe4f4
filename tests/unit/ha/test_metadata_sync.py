"""SlaveMetadataSync rounds against a scripted master (answers per request code): what a failing
answer leaves behind and that the periodic loop survives it (reference §7.6)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rmqbroker.ha import metadata_sync
from rmqbroker.ha.metadata_sync import MetadataSyncError, SlaveMetadataSync
from rmqbroker.metadata.base import JsonConfigFile
from rmqbroker.metadata.consumer_offsets import ConsumerOffsetManager
from rmqbroker.metadata.delay_offsets import DelayOffsetTable
from rmqbroker.metadata.subscription_groups import SubscriptionGroupConfig, SubscriptionGroupManager
from rmqbroker.metadata.topics import TopicConfig, TopicConfigManager
from rmqbroker.outer_api import OuterApiError
from rmqbroker.remoting.codes import RequestCode

MASTER = "127.0.0.1:10911"

Tables = tuple[TopicConfigManager, SubscriptionGroupManager, ConsumerOffsetManager, DelayOffsetTable]


def tables(config_dir: Path) -> Tables:
    config_dir.mkdir(parents=True, exist_ok=True)
    return (TopicConfigManager(config_dir, cluster_name="DefaultCluster", broker_name="broker-a"),
            SubscriptionGroupManager(config_dir), ConsumerOffsetManager(config_dir), DelayOffsetTable(config_dir))


class ScriptedMaster:
    """The master's GET_ALL_* answers: its tables encoded, or what ``override`` says per code."""

    def __init__(self, config_dir: Path) -> None:
        self.topics, self.groups, self.offsets, self.delay = tables(config_dir)
        self.override: dict[RequestCode, bytes | Exception] = {}

    async def get_all(self, master_addr: str, code: RequestCode) -> bytes:
        answer = self.override.get(code)
        if isinstance(answer, Exception):
            raise answer
        if answer is not None:
            return answer
        sources: dict[RequestCode, JsonConfigFile[Any]] = {
            RequestCode.GET_ALL_TOPIC_CONFIG: self.topics, RequestCode.GET_ALL_CONSUMER_OFFSET: self.offsets,
            RequestCode.GET_ALL_DELAY_OFFSET: self.delay, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.groups}
        source = sources[code]
        return source.encode().encode("utf-8")


@pytest.fixture
def master(tmp_path: Path) -> ScriptedMaster:
    m = ScriptedMaster(tmp_path / "master")
    m.topics.update_topic_config(TopicConfig("T1", 4, 4))
    m.offsets.commit("CG", "T1", 0, 5)
    return m


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("condition not reached")


def slave_sync(tmp_path: Path, master: ScriptedMaster, **kw: float) -> tuple[SlaveMetadataSync, Tables]:
    t = tables(tmp_path / "slave")
    sync = SlaveMetadataSync(master, "127.0.0.1:20911", *t, **kw)  # type: ignore[arg-type]
    sync.set_master(MASTER)
    return sync, t


async def test_a_deeply_nested_body_fails_the_round_and_the_loop_goes_on(tmp_path: Path,
                                                                         master: ScriptedMaster) -> None:
    master.override[RequestCode.GET_ALL_TOPIC_CONFIG] = b"[" * 200_000
    sync, (topics, *_) = slave_sync(tmp_path, master, initial_delay=0.01, interval=0.01)
    with pytest.raises(MetadataSyncError):
        await sync.sync_all()
    sync.start()
    try:
        await asyncio.sleep(0.2)
        assert sync.failures >= 2, "the periodic task died on the first failing round"
        del master.override[RequestCode.GET_ALL_TOPIC_CONFIG]
        await until(lambda: "T1" in topics)
    finally:
        await sync.stop()


async def test_an_unexpected_error_in_a_round_is_counted_and_retried(tmp_path: Path, master: ScriptedMaster) -> None:
    calls = 0

    async def deletions(deleted: dict[str, int]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in a callback")

    master.override[RequestCode.GET_ALL_TOPIC_CONFIG] = master.topics.encode(extra={"deletedTopics": {"X": 1}}).encode()
    sync, _ = slave_sync(tmp_path, master, initial_delay=0.01, interval=0.01)
    sync.on_master_deletions = deletions
    sync.start()
    try:
        await until(lambda: sync.rounds > 0)
        assert sync.failures >= 1 and calls >= 2
    finally:
        await sync.stop()


@pytest.mark.parametrize("failure", [b"{not json", OuterApiError("request 21 to master timed out")])
async def test_a_failing_table_does_not_hold_back_the_others(tmp_path: Path, master: ScriptedMaster,
                                                             failure: bytes | Exception) -> None:
    """Like RocketMQ's SlaveSynchronize, each table is synced on its own: a topic table that times
    out or does not decode still lets the offsets, delay offsets and groups of the round through."""
    sync, (_, groups, offsets, delay) = slave_sync(tmp_path, master)
    await sync.sync_all()
    assert offsets.query("CG", "T1", 0) == 5
    master.override[RequestCode.GET_ALL_TOPIC_CONFIG] = failure
    master.offsets.commit("CG", "T1", 0, 9)
    master.delay.set(1, 7)
    master.groups.update(SubscriptionGroupConfig("CG_NEW"))
    with pytest.raises(MetadataSyncError) as failed:
        await sync.sync_all()
    assert offsets.query("CG", "T1", 0) == 9
    assert delay.get(1) == 7
    assert groups.get("CG_NEW") is not None
    assert str(failed.value).startswith("topic config: ")
    assert sync.rounds == 1


async def test_nothing_is_taken_from_an_address_whose_topic_table_was_never_read(tmp_path: Path,
                                                                                 master: ScriptedMaster) -> None:
    """Which broker an address belongs to is known from its topic table only (its brokerName and
    cluster topics): until one was read from it, its other tables are not taken."""
    master.override[RequestCode.GET_ALL_TOPIC_CONFIG] = OuterApiError("request 21 to master timed out")
    sync, (_, _, offsets, _) = slave_sync(tmp_path, master)
    with pytest.raises(MetadataSyncError, match="timed out"):
        await sync.sync_all()
    assert offsets.query("CG", "T1", 0) == -1


async def test_bodies_are_decoded_off_the_event_loop(tmp_path: Path, master: ScriptedMaster,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A Java master's bodies of 5,000 topics and 2,000 groups take ~0.2 s to decode (bare integer
    keys are rewritten first), a stall every interval for every request the slave serves."""
    loop_thread = threading.current_thread()
    decoded_on: list[threading.Thread] = []
    for name in ("decode_topic_sync", "decode_consumer_offsets", "decode_delay_offsets",
                 "decode_subscription_group_wrapper"):
        real = getattr(metadata_sync, name)

        def recording(body: bytes, real: Callable[[bytes], Any] = real) -> Any:
            decoded_on.append(threading.current_thread())
            return real(body)

        monkeypatch.setattr(metadata_sync, name, recording)
    sync, _ = slave_sync(tmp_path, master)
    await sync.sync_all()
    assert len(decoded_on) == 4 and loop_thread not in decoded_on


async def test_a_round_re_pointed_midway_takes_nothing_more_from_the_old_master(tmp_path: Path,
                                                                                master: ScriptedMaster) -> None:
    """A round still waiting for its master (hung) when the slave is re-pointed takes nothing from
    what that master answers afterwards and asks it nothing more; it counts neither as a round nor
    as a failure, and the new master is asked after the initial delay, not a whole interval later."""
    master.topics.update_topic_config(TopicConfig("T_OLD_ONLY", 1, 1))
    new = ScriptedMaster(tmp_path / "new")
    new.topics.update_topic_config(TopicConfig("T1", 4, 4))
    new.offsets.commit("CG", "T1", 0, 9)
    new_addr = "127.0.0.1:30911"
    asked: list[tuple[str, RequestCode]] = []
    waiting, release = asyncio.Event(), asyncio.Event()

    class TwoMasters:
        async def get_all(self, addr: str, code: RequestCode) -> bytes:
            asked.append((addr, code))
            if addr == new_addr:
                return await new.get_all(addr, code)
            if code == RequestCode.GET_ALL_TOPIC_CONFIG:
                waiting.set()
                await release.wait()
            return await master.get_all(addr, code)

    t = tables(tmp_path / "slave")
    topics, _, offsets, _ = t
    sync = SlaveMetadataSync(TwoMasters(), "127.0.0.1:20911", *t, initial_delay=0.05,  # type: ignore[arg-type]
                             interval=60)
    sync.set_master(MASTER)
    sync.start()
    try:
        await asyncio.wait_for(waiting.wait(), 5)
        sync.set_master(new_addr)
        release.set()
        await until(lambda: sync.rounds >= 1)
        assert offsets.query("CG", "T1", 0) == 9
        assert "T_OLD_ONLY" not in topics and "T1" in topics
        assert sync.failures == 0 and sync.last_error is None
        assert [code for addr, code in asked if addr == MASTER] == [RequestCode.GET_ALL_TOPIC_CONFIG]
    finally:
        await sync.stop()
