"""Resetting a consumer group's offsets to a point in time, as ``mqadmin resetOffsetByTime`` does,
against real processes and the stock C++ push consumer: online, the broker sends the consumer
RESET_CONSUMER_CLIENT_OFFSET (220) and it consumes again from there; offline, the offsets are
committed directly and a consumer that starts later begins there."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rmqbroker.admin_cli import main as rmq_admin
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from tests.conftest import Cluster
from tests.integration.helpers import (
    PushConsumer,
    create_topic_and_wait,
    message,
    poll,
    produce,
    query_consumer_offset,
    rpc,
)

TOPIC = "ResetTopic"
GROUP = "CG_RESET"


def offset_by_time(store_times: list[int], timestamp: int) -> int:
    """The offset SEARCH_OFFSET_BY_TIMESTAMP and the reset pick in a queue whose messages were
    stored at ``store_times`` (reference §2.9, Java 4.x): an exact store-time hit (the first of
    equals), else the nearer of the two neighbours, the earlier one on a tie."""
    after = next((i for i, t in enumerate(store_times) if t >= timestamp), len(store_times))
    if after == len(store_times) or store_times[after] == timestamp or after == 0:
        return min(after, len(store_times) - 1) if store_times else 0
    before = after - 1
    return before if timestamp - store_times[before] <= store_times[after] - timestamp else after


def test_reset_offset_by_time_online_and_offline(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-o")
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=2)
    assert all(r is not None and r["status"] == 0 for r in produce(ns.addr, [message(TOPIC, f"old-{i}")
                                                                             for i in range(10)]))
    time.sleep(1.1)
    middle = int(time.time() * 1000)
    time.sleep(0.1)
    assert all(r is not None and r["status"] == 0 for r in produce(ns.addr, [message(TOPIC, f"new-{i}")
                                                                             for i in range(10)]))
    news = {f"new-{i}" for i in range(10)}
    olds = {f"old-{i}" for i in range(10)}
    n = ("-n", ns.addr)

    with PushConsumer(ns.addr, GROUP, TOPIC, log_dir=cluster.workdir) as consumer:
        consumer.wait_started()
        first = consumer.wait_count(20, 60)
        # Where the reset lands follows from the store times, not from this test's sleeps: the
        # nearer neighbour of ``middle`` is the last old message when the new ones were stored
        # later after ``middle`` than the old ones before it (a producer slow to start under load).
        by_queue: dict[int, list[dict[str, Any]]] = {}
        for m in sorted(first, key=lambda m: (m["queue_id"], m["queue_offset"])):
            by_queue.setdefault(m["queue_id"], []).append(m)
        assert sorted(by_queue) == [0, 1] and all(
            [m["queue_offset"] for m in ms] == list(range(len(ms))) for ms in by_queue.values()), first
        expected = {q: offset_by_time([m["store_timestamp"] for m in ms], middle) for q, ms in by_queue.items()}
        again_expected = {m["body"] for ms in by_queue.values() for m in ms
                          if m["queue_offset"] >= expected[m["queue_id"]]}
        # Never past a message stored after ``middle``: at most the last old one of a queue comes back.
        assert news <= again_expected and len(again_expected) <= 12, (middle, expected, first)
        # Wait until the consumer has committed everything it consumed (the C++ client persists
        # offsets every 5 s): a reset compares against committed offsets.
        poll(lambda: sum(query_consumer_offset(master.addr, GROUP, TOPIC, q) or 0 for q in (0, 1)) == 20, 20,
             what="offsets committed")
        assert rmq_admin(["resetOffsetByTime", *n, "-g", GROUP, "-t", TOPIC, "-s", str(middle)]) == 0
        out = capsys.readouterr().out
        rows = [line.split() for line in out.splitlines()[1:]]
        assert {int(r[1]): int(r[2]) for r in rows} == expected, (out, middle, first)
        # The online consumer drops its position and consumes from there again: the newer half
        # (and the last old message of a queue whose reset landed on it), not the rest.
        msgs = consumer.wait_for(lambda m: sum(1 for x in m if x["body"] in again_expected)
                                 >= 2 * len(again_expected), 60, what="the newer half again")
        time.sleep(1.0)
        msgs = consumer.messages
    bodies = [m["body"] for m in msgs]
    assert all(bodies.count(b) == (2 if b in again_expected else 1) for b in news | olds), bodies

    # A new group starts where this one is (mqadmin cloneGroupOffset), and both show as consumers.
    assert rmq_admin(["cloneGroupOffset", *n, "-s", GROUP, "-d", "CG_CLONE", "-t", TOPIC]) == 0
    assert "cloned 1 topic(s)" in capsys.readouterr().out
    assert [query_consumer_offset(master.addr, "CG_CLONE", TOPIC, q) for q in (0, 1)] == \
        [query_consumer_offset(master.addr, GROUP, TOPIC, q) for q in (0, 1)]
    who = rpc(master.addr, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": TOPIC})
    assert set(json.loads(bytes(who.body))["groupList"]) == {GROUP, "CG_CLONE"}

    # Offline: nobody to tell, so the offsets are committed directly (mqadmin's fallback); the
    # broker itself answers CONSUMER_NOT_ONLINE.
    poll(lambda: rpc(master.addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {
        "topic": TOPIC, "group": GROUP, "timestamp": "0", "isForce": "true"}).code
        == ResponseCode.CONSUMER_NOT_ONLINE, 30, what="consumer gone from the broker")
    assert rmq_admin(["resetOffsetByTime", *n, "-g", GROUP, "-t", TOPIC, "-s", "0"]) == 0
    capsys.readouterr()
    assert [query_consumer_offset(master.addr, GROUP, TOPIC, q) for q in (0, 1)] == [0, 0]
    with PushConsumer(ns.addr, GROUP, TOPIC, log_dir=cluster.workdir) as consumer:
        consumer.wait_started()
        again = consumer.wait_count(20, 60)
    assert sorted(m["body"] for m in again) == sorted([f"old-{i}" for i in range(10)] + sorted(news))

    # Refusals: an unknown topic, a group that never consumed it.
    resp = rpc(master.addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {
        "topic": "NoSuchTopic", "group": GROUP, "timestamp": "0"})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "no topic in this broker" in (resp.remark or "")
    resp = rpc(master.addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {
        "topic": TOPIC, "group": "CG_NEVER", "timestamp": "0"})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "CG_NEVER" in (resp.remark or "")
