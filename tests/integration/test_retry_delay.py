"""Consume failures go through %RETRY%<group>; delay levels hold messages back for their level's time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rmqbroker.metadata.jsonfile import fastjson_loads
from tests.conftest import Cluster
from tests.integration.helpers import PushConsumer, create_topic_and_wait, message, poll, produce, pull_all

# Every retry level is short so the first redelivery (level 3) comes after one second.
FAST_RETRY_LEVELS = " ".join(["1s"] * 18)


def test_failed_consume_is_redelivered_through_retry_topic(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr, messageDelayLevel=FAST_RETRY_LEVELS)
    topic, group = "RetryTopic", "CG_RETRY"
    create_topic_and_wait(broker.addr, ns.addr, topic)
    # The broker creates the retry topic at the consumer's first heartbeat, but the C++ client only
    # learns its route at the next refresh (up to 30 s later); creating it up front saves that wait.
    create_topic_and_wait(broker.addr, ns.addr, f"%RETRY%{group}", queues=1)
    props = ("color", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID")
    sent = [message(topic, f"retry-{i}", keys=f"rk-{i}", tags="TagR", props={"color": f"c{i}"}) for i in range(3)]
    bodies = {s["body"] for s in sent}

    def both_deliveries(msgs: list[dict[str, Any]]) -> bool:
        retried = {m["body"] for m in msgs if m["reconsume_times"] >= 1}
        return retried >= bodies

    with PushConsumer(ns.addr, group, topic, props=props, fail_first=True, log_dir=cluster.workdir) as consumer:
        consumer.wait_started()
        results = produce(ns.addr, sent)
        msgs = consumer.wait_for(both_deliveries, timeout=30, what="redeliveries")
    for s, r in zip(sent, results, strict=True):
        assert r is not None
        first = [m for m in msgs if m["body"] == s["body"] and m["reconsume_times"] == 0]
        again = [m for m in msgs if m["body"] == s["body"] and m["reconsume_times"] >= 1]
        assert first and first[0]["failed"]
        retry = again[0]
        # the consumer sees the original topic, keys, tags and properties on the redelivery
        assert (retry["topic"], retry["keys"], retry["tags"]) == (topic, s["keys"], s["tags"])
        assert retry["props"]["color"] == s["props"]["color"]
        assert retry["props"]["RETRY_TOPIC"] == topic
        # the failed message went through delay level 3 (1 s here) before coming back
        assert retry["recv_ms"] - first[0]["recv_ms"] >= 900

    # the redelivered copies are stored in the group's retry topic
    stored = pull_all(ns.addr, f"%RETRY%{group}", props=props)
    assert sorted(m["body"] for m in stored if m["reconsume_times"] == 1) == sorted(bodies)
    for m in stored:
        assert m["props"]["RETRY_TOPIC"] == topic
        assert m["props"]["ORIGIN_MESSAGE_ID"]


def test_delay_level_message_waits_for_its_level(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr, messageDelayLevel="1s 2s 3s", flushDelayOffsetInterval=300)
    topic, group = "DelayTopic", "CG_DELAY"
    create_topic_and_wait(broker.addr, ns.addr, topic)
    level_ms = {1: 1000, 2: 2000, 3: 3000}
    sent = [message(topic, "now", keys="k-now", tags="TagD"),
            message(topic, "level2", keys="k-2", tags="TagD", delay=2),
            message(topic, "level3", keys="k-3", tags="TagD", delay=3)]
    with PushConsumer(ns.addr, group, topic, log_dir=cluster.workdir) as consumer:
        consumer.wait_started()
        results = produce(ns.addr, sent)
        msgs = consumer.wait_count(len(sent), timeout=20)
    by_body = {m["body"]: m for m in msgs}
    sent_ms = {s["body"]: r["sent_ms"] for s, r in zip(sent, results, strict=True) if r is not None}
    assert set(by_body) == {"now", "level2", "level3"}
    for body, level in (("level2", 2), ("level3", 3)):
        m = by_body[body]
        assert m["topic"] == topic and m["keys"] == f"k-{level}" and m["tags"] == "TagD"
        # stored in the real topic only once the level's delay has passed
        assert m["store_timestamp"] - m["born_timestamp"] >= level_ms[level], m
        assert m["recv_ms"] - sent_ms[body] >= level_ms[level], m
    assert by_body["now"]["recv_ms"] < by_body["level2"]["recv_ms"] < by_body["level3"]["recv_ms"]
    assert by_body["now"]["store_timestamp"] - by_body["now"]["born_timestamp"] < 1000

    # the schedule service records its progress per level in delayOffset.json
    path = Path(broker.conf["storePathRootDir"]) / "config" / "delayOffset.json"

    def delay_offsets() -> dict[int, int] | None:
        if not path.exists():
            return None
        try:
            table = fastjson_loads(path.read_text())["offsetTable"]
        except (ValueError, KeyError):
            return None
        offsets = {int(k): int(v) for k, v in table.items()}
        return offsets if offsets.get(2) == 1 and offsets.get(3) == 1 else None

    offsets = poll(delay_offsets, timeout=10, what="delayOffset.json with levels 2 and 3 at offset 1")
    assert offsets.get(1, 0) == 0
