"""Consumer offsets survive consumer restarts and broker restarts."""

from __future__ import annotations

import time
from pathlib import Path

from rmqbroker.metadata.jsonfile import fastjson_loads
from tests.conftest import Cluster
from tests.integration.helpers import (
    PushConsumer,
    create_topic_and_wait,
    message,
    poll,
    produce,
    pull_all,
    query_consumer_offset,
    wait_route,
)
from tests.support.procs import BrokerProc

QUEUES = 4


def _committed(broker: BrokerProc, group: str, topic: str) -> dict[int, int]:
    out = {}
    for q in range(QUEUES):
        offset = query_consumer_offset(broker.addr, group, topic, q)
        if offset is not None:
            out[q] = offset
    return out


def _offsets_file(broker: BrokerProc, group: str, topic: str) -> dict[int, int] | None:
    path = Path(broker.conf["storePathRootDir"]) / "config" / "consumerOffset.json"
    if not path.exists():
        return None
    try:
        table = fastjson_loads(path.read_text())["offsetTable"]
    except (ValueError, KeyError):
        return None
    entry = table.get(f"{topic}@{group}")
    return None if entry is None else {int(k): int(v) for k, v in entry.items()}


def test_offsets_survive_consumer_restart(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr, flushConsumerOffsetInterval=300)
    topic, group = "OffsetTopic", "CG_OFFSETS"
    create_topic_and_wait(broker.addr, ns.addr, topic, QUEUES)
    first = [message(topic, f"first-{i}", keys=f"f{i}", tags="TagO") for i in range(8)]
    produce(ns.addr, first)

    with PushConsumer(ns.addr, group, topic, log_dir=cluster.workdir) as consumer:
        consumer.wait_started()
        consumer.wait_count(len(first), timeout=20)
        got = consumer.stop()
        assert consumer.stopped_cleanly
    assert sorted(m["body"] for m in got) == sorted(s["body"] for s in first)
    # the shutdown committed the consumed offsets to the broker
    assert sum(_committed(broker, group, topic).values()) == len(first)

    second = [message(topic, f"second-{i}", keys=f"s{i}", tags="TagO") for i in range(5)]
    produce(ns.addr, second)
    with PushConsumer(ns.addr, group, topic, log_dir=cluster.workdir) as consumer:
        consumer.wait_started()
        consumer.wait_count(len(second), timeout=20)
        time.sleep(1.5)  # an already-consumed message redelivered would show up now
        got = consumer.stop()
    assert sorted(m["body"] for m in got) == sorted(s["body"] for s in second)

    # consumerOffset.json holds the group's offsets for every queue it consumed
    offsets = poll(lambda: (o := _offsets_file(broker, group, topic)) and
                   sum(o.values()) == len(first) + len(second) and o,
                   timeout=10, what="consumerOffset.json with all offsets")
    assert offsets == _committed(broker, group, topic)


def test_offsets_and_messages_survive_broker_restart(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr)
    topic, group = "RestartTopic", "CG_RESTART"
    create_topic_and_wait(broker.addr, ns.addr, topic, QUEUES)
    before = [message(topic, f"before-{i}", keys=f"b{i}", tags="TagR", props={"n": str(i)}) for i in range(8)]
    after = [message(topic, f"after-{i}", keys=f"a{i}", tags="TagR", props={"n": str(i)}) for i in range(6)]

    with PushConsumer(ns.addr, group, topic, log_dir=cluster.workdir) as consumer:
        consumer.wait_started()
        produce(ns.addr, before)
        consumer.wait_count(len(before), timeout=20)
        # the consumer commits every 5 s; wait until the broker has all its offsets
        committed = poll(lambda: (c := _committed(broker, group, topic)) and sum(c.values()) == len(before) and c,
                         timeout=15, what="committed offsets")

        assert broker.stop() == 0
        broker.start()
        # the offsets were persisted and reloaded
        assert _committed(broker, group, topic) == committed
        wait_route(ns.addr, topic)

        produce(ns.addr, after)
        # The C++ client notices the restart only when its in-flight pulls time out and its next
        # heartbeat is due (both 30 s), so this takes a while.
        msgs = consumer.wait_for(lambda ms: {s["body"] for s in after} <= {m["body"] for m in ms},
                                 timeout=45, what="messages sent after the restart")
    bodies = [m["body"] for m in msgs]
    assert set(bodies) == {s["body"] for s in before + after}
    # the consumer went on from where it was: nothing consumed before the restart came back
    assert sorted(b for b in bodies if b.startswith("before-")) == sorted(s["body"] for s in before)

    # every message is still in the store and readable from offset 0
    pulled = pull_all(ns.addr, topic, props=("n",))
    assert sorted((m["body"], m["keys"], m["props"]["n"]) for m in pulled) == \
        sorted((s["body"], s["keys"], s["props"]["n"]) for s in before + after)
