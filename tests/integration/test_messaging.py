"""Producing and consuming with the stock C++ client: every send mode, pull and push consumers."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from tests.conftest import Cluster
from tests.integration.helpers import (
    PushConsumer,
    create_topic_and_wait,
    message,
    metric_delta,
    poll,
    produce,
    pull_all,
    query_consumer_offset,
    wait_route,
)
from tests.support.procs import metric_value

SEND_OK = 0


def _fingerprint(m: dict[str, Any], props: tuple[str, ...]) -> tuple[Any, ...]:
    return (m["topic"], m["body"], m.get("keys") or "", m.get("tags") or "",
            tuple((p, (m.get("props") or {}).get(p) or "") for p in props))


def test_send_modes_and_pull_from_offset_zero(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    cluster.broker(ns.addr)
    props = ("color", "size")

    # sync: every send is acknowledged, and the pull returns exactly these messages (ids included)
    sync_msgs = [message("SyncTopic", f"sync-{i}", keys=f"key-{i} other-{i}", tags=["TagA", "TagB", ""][i % 3] or None,
                         props={"color": f"c{i}", "size": str(i * 10)}) for i in range(9)]
    results = produce(ns.addr, sync_msgs, mode="sync")
    assert [r["status"] for r in results if r] == [SEND_OK] * len(sync_msgs)
    wait_route(ns.addr, "SyncTopic")
    pulled = pull_all(ns.addr, "SyncTopic", props=props)
    assert Counter(_fingerprint(m, props) for m in pulled) == Counter(_fingerprint(s, props) for s in sync_msgs)
    assert sorted(m["id"] for m in pulled) == sorted(r["msg_id"] for r in results if r)
    assert len({m["queue_id"] for m in pulled}) > 1, "sync sends should spread over the topic's queues"
    for m in pulled:
        assert m["store_timestamp"] >= m["born_timestamp"] > 0

    # oneway: no acknowledgement, still all stored
    oneway_msgs = [message("OnewayTopic", f"oneway-{i}", keys=f"ow-{i}", tags="TagO", props={"color": "blue"})
                   for i in range(6)]
    produce(ns.addr, oneway_msgs, mode="oneway")
    wait_route(ns.addr, "OnewayTopic")
    pulled = pull_all(ns.addr, "OnewayTopic", props=props)
    assert Counter(_fingerprint(m, props) for m in pulled) == Counter(_fingerprint(s, props) for s in oneway_msgs)


def test_orderly_send_keeps_shard_order_in_one_queue(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    cluster.broker(ns.addr)
    shards = (0, 1, 2, 3)
    seq = 6
    msgs = [message("OrderTopic", f"shard{s}-seq{n:02d}", keys=f"order-{s}", tags="TagOrd", shard=s)
            for n in range(seq) for s in shards]
    results = produce(ns.addr, msgs, mode="orderly")
    assert [r["status"] for r in results if r] == [SEND_OK] * len(msgs)
    wait_route(ns.addr, "OrderTopic")
    pulled = pull_all(ns.addr, "OrderTopic")
    assert sorted(m["body"] for m in pulled) == sorted(s["body"] for s in msgs)
    queues_of: dict[int, set[int]] = {}
    for s in shards:
        mine = sorted((m for m in pulled if m["body"].startswith(f"shard{s}-")), key=lambda m: m["queue_offset"])
        queues_of[s] = {m["queue_id"] for m in mine}
        assert len(queues_of[s]) == 1, f"shard {s} spread over queues {queues_of[s]}"
        assert [m["body"] for m in mine] == [f"shard{s}-seq{n:02d}" for n in range(seq)], "order not kept"
    # the selector is shard % queueCount: four shards on a four-queue topic use four different queues
    assert len({q for qs in queues_of.values() for q in qs}) == len(shards)


def test_send_batch_is_stored_as_separate_messages(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr)
    props = ("batchprop",)
    before = broker.metrics()
    batch = [message("BatchTopic", f"batch-{i}", keys=f"bk-{i}", tags="TagBatch", props={"batchprop": f"p{i}"})
             for i in range(5)]
    results = produce(ns.addr, batch, mode="batch")
    assert results[0] is not None and results[0]["status"] == SEND_OK
    # a big batch (C++ compresses bodies of 4 KiB or more as a whole)
    big = [message("BatchTopic", f"big-{i}-" + "x" * 1500, keys=f"big-{i}", tags="TagBig") for i in range(4)]
    results = produce(ns.addr, big, mode="batch")
    assert results[0] is not None and results[0]["status"] == SEND_OK
    wait_route(ns.addr, "BatchTopic")
    pulled = pull_all(ns.addr, "BatchTopic", props=props)
    assert Counter(_fingerprint(m, props) for m in pulled) == \
        Counter(_fingerprint(s, props) for s in batch + big)
    # each batch lands in one queue with consecutive offsets, in batch order
    for prefix, sent in (("batch-", batch), ("big-", big)):
        mine = [m for m in pulled if m["body"].startswith(prefix)]
        assert len({m["queue_id"] for m in mine}) == 1
        mine.sort(key=lambda m: m["queue_offset"])
        assert [m["body"] for m in mine] == [s["body"] for s in sent]
        offsets = [m["queue_offset"] for m in mine]
        assert offsets == list(range(offsets[0], offsets[0] + len(sent)))
    assert metric_delta(before, broker.metrics(), "rmq_messages_in_total") == len(batch) + len(big)


def test_push_consumer_tag_filter(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr)
    topic, group = "TagTopic", "CG_TAGS"
    create_topic_and_wait(broker.addr, ns.addr, topic)
    props = ("color",)
    # five tags over four queues: every queue gets a mix of matching and non-matching messages
    sent = [message(topic, f"tag-{i}", keys=f"tk-{i}", tags=("TagA", "TagC", "TagB", None, "TagC")[i % 5],
                    props={"color": f"c{i}"}) for i in range(20)]
    wanted = [s for s in sent if s.get("tags") in ("TagA", "TagB")]
    before_out = metric_value(broker.metrics(), "rmq_messages_out_total")
    with PushConsumer(ns.addr, group, topic, "TagA || TagB", props=props, log_dir=cluster.workdir) as consumer:
        consumer.wait_started()
        results = produce(ns.addr, sent)
        assert [r["status"] for r in results if r] == [SEND_OK] * len(sent)
        consumer.wait_count(len(wanted), timeout=20)
        time.sleep(1.0)  # a non-matching message would show up now
        # The client commits what it went past every 5 s; waiting for that here (rather than for its
        # commit at shutdown) keeps a pull still in flight at the stop from making this a race.
        poll(lambda: sum(query_consumer_offset(broker.addr, group, topic, q) or 0 for q in range(4)) == len(sent),
             20, 0.5, what="the consumer's offsets past every message")
        msgs = consumer.stop()
        assert consumer.stopped_cleanly
    assert Counter(_fingerprint(m, props) for m in msgs) == Counter(_fingerprint(s, props) for s in wanted)
    # the consumer went past the filtered messages too: its committed offsets cover the whole topic
    assert sum(query_consumer_offset(broker.addr, group, topic, q) or 0 for q in range(4)) == len(sent)
    # the broker filtered by tag: only matching messages left it
    assert metric_value(broker.metrics(), "rmq_messages_out_total") - before_out == len(wanted)


def test_orderly_push_consumer_gets_each_shard_in_order(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr)
    topic, group = "OrderPushTopic", "CG_ORDERLY"
    create_topic_and_wait(broker.addr, ns.addr, topic)
    shards, seq = (0, 1, 2, 3, 4, 5), 8
    msgs = [message(topic, f"shard{s}-seq{n:02d}", keys=f"o{s}", tags="TagOrd", shard=s)
            for n in range(seq) for s in shards]
    with PushConsumer(ns.addr, group, topic, orderly=True, log_dir=cluster.workdir) as consumer:
        consumer.wait_started()
        produce(ns.addr, msgs, mode="orderly")
        got = consumer.wait_count(len(msgs), timeout=20)
    assert sorted(m["body"] for m in got) == sorted(s["body"] for s in msgs)
    for s in shards:
        # consumed in the order sent (the events are printed in consumption order)
        assert [m["body"] for m in got if m["body"].startswith(f"shard{s}-")] == \
            [f"shard{s}-seq{n:02d}" for n in range(seq)]
