"""Seeded random requests of every request code against a running SYNC_MASTER, its slave and the
nameserver: headers mostly plausible with some fields replaced by hostile values (missing, empty,
out of Java's int/long range, non-numbers, control characters, system topic names), bodies from
nothing through random bytes to JSON of the wrong shape. Each is answered with a response code;
none may reach the server as an unanticipated handler error (which would mean a case the broker
did not judge), kill a process, log a traceback, or cost the slave its copy of the log."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from typing import Any

import pytest

from rmqbroker.remoting import wire
from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from tests.conftest import Cluster
from tests.integration.helpers import poll, rpc
from tests.support.procs import Proc, metric_value

# RMQ_FUZZ_PER_CODE raises it for a longer search than the suite can afford.
PER_CODE = int(os.environ.get("RMQ_FUZZ_PER_CODE", "50"))
# Answered by a consumer the broker relays to (which the fuzzing connection, once a heartbeat made
# it a group member, never answers) or, like END_TRANSACTION, oneway in RocketMQ: not waited for.
UNANSWERED = {RequestCode.GET_CONSUMER_RUNNING_INFO, RequestCode.CONSUME_MESSAGE_DIRECTLY,
              RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, RequestCode.END_TRANSACTION}
CODES = [int(c) for c in RequestCode if c not in UNANSWERED] + [0, -1, 9999]

FIELDS = sorted({v for k, v in vars(wire).items() if k.isupper() and isinstance(v, str) and 0 < len(v) < 40}
                | set("abcdefghijklmn"))
HOSTILE = ["", "0", "-1", "2147483647", "2147483648", "-2147483649", "9223372036854775808",
           "-9223372036854775809", "99999999999999999999", "abc", "true", "null", "1e3", " 5", "0x10", "1.5",
           "\x00", "x" * 300, "é☃", "%RETRY%FuzzGroup", "%DLQ%FuzzGroup", "SCHEDULE_TOPIC_XXXX", "TBW102",
           "RMQ_SYS_TRANS_HALF_TOPIC", "*", "a > 1", "TagA || TagB", "SQL92", "\x01\x02\x01", "{}",
           "KEYS\x01k\x02DELAY\x013\x02", "127.0.0.1:1", "0A000001000029000000000000000000"]
PLAUSIBLE = {
    "topic": "FuzzTopic", "b": "FuzzTopic", "queueId": "0", "e": "0", "consumerGroup": "FuzzGroup",
    "producerGroup": "PG", "a": "PG", "group": "FuzzGroup", "groupName": "FuzzGroup", "offset": "0",
    "commitOffset": "0", "maxMsgNums": "4", "queueOffset": "0", "sysFlag": "0", "f": "0", "flag": "0", "h": "0",
    "bornTimestamp": "1700000000000", "g": "1700000000000", "defaultTopic": "TBW102", "c": "TBW102",
    "defaultTopicQueueNums": "4", "d": "4", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6",
    "suspendTimeoutMillis": "100", "subscription": "*", "subVersion": "0", "expressionType": "TAG",
    "timestamp": "0", "maxOffset": "10", "minOffset": "0", "delayLevel": "0", "key": "k", "maxNum": "4",
    "beginTimestamp": "0", "endTimestamp": "9999999999999", "clientID": "c1", "clientId": "c1",
    "msgId": "7F00000100002A9F0000000000000000", "statsName": "TOPIC_PUT_NUMS", "statsKey": "FuzzTopic",
    "isOrder": "false", "index": "0", "count": "1", "version": "1", "reconsumeTimes": "0", "j": "0",
    "properties": "WAIT\x01true\x02", "i": "WAIT\x01true\x02", "brokerName": "broker-a",
    "clusterName": "DefaultCluster", "brokerId": "0", "commitLogOffset": "0", "srcGroup": "FuzzGroup",
    "destGroup": "FuzzGroup2"}


def fuzz_header(rng: random.Random) -> dict[str, str]:
    if rng.random() < 0.3:  # a few fields, any values
        return {rng.choice(FIELDS): rng.choice(HOSTILE) for _ in range(rng.randrange(12))}
    ext = {}
    for name in FIELDS:
        if name in PLAUSIBLE:
            ext[name] = PLAUSIBLE[name] if rng.random() < 0.85 else rng.choice(HOSTILE)
        elif rng.random() < 0.3:
            ext[name] = rng.choice(HOSTILE)
    return ext


def fuzz_body(rng: random.Random) -> bytes:
    def some() -> str:
        return rng.choice(HOSTILE)

    shapes: list[Any] = [
        None, {}, [], 5, "s", {"a": [1, {"b": None}]},
        {rng.choice(FIELDS): some() for _ in range(3)},
        {"clientID": "c1", "producerDataSet": rng.choice([[], [{"groupName": some()}], {}, None]),
         "consumerDataSet": [{"groupName": some(), "consumeType": rng.choice(["CONSUME_PASSIVELY", 3]),
                              "subscriptionDataSet": [{"topic": some(), "subString": some(), "expressionType": some(),
                                                       "tagsSet": rng.choice([[], ["a"], None, 5])}]}]},
        {"consumerGroup": some(), "clientId": some(),
         "mqSet": rng.choice([[], 5, [{"topic": some(), "brokerName": some(),
                                       "queueId": rng.choice([0, -1, 2**40, "x", None])}]])},
        {"offsetTable": rng.choice([{}, {"a@b": {"0": 5}}, {"x": 5}, [], None]),
         "topicConfigTable": rng.choice([{}, {"T": {"topicName": "T"}}, {"T": 5}, None]),
         "dataVersion": rng.choice([{}, {"counter": "x"}, None, 5])},
        {"groupName": some(), "retryQueueNums": rng.choice([1, -1, "x", 2**40]), "brokerId": rng.choice([0, -5, "x"]),
         "consumeEnable": rng.choice([True, "x", None])},
    ]
    kind = rng.randrange(len(shapes) + 4)
    if kind < len(shapes):
        return json.dumps(shapes[kind]).encode()
    return [b"", rng.randbytes(rng.randrange(1, 300)), b"\xff\xfe\x00",
            f"k=v\n{some()}={some()}\n".encode()][kind - len(shapes)]


async def fuzz(addr: str, seed: int) -> dict[str, int]:
    """Send PER_CODE seeded random requests of each code, 8 in flight; count the outcomes by what
    came back."""
    rng = random.Random(seed)
    requests = [RemotingCommand(code, ext_fields=fuzz_header(rng), body=fuzz_body(rng))
                for _ in range(PER_CODE) for code in CODES]
    outcomes: dict[str, int] = {}
    gate = asyncio.Semaphore(8)
    client = RemotingClient()

    async def one(cmd: RemotingCommand) -> None:
        async with gate:
            try:
                key = str((await client.invoke(addr, cmd, 5)).code)
            except Exception as exc:  # the outcome is what is counted
                key = f"{cmd.code}: {type(exc).__name__} {exc}"
        outcomes[key] = outcomes.get(key, 0) + 1

    try:
        await asyncio.gather(*(one(cmd) for cmd in requests))
    finally:
        await client.close()
    return outcomes


def assert_clean_log(proc: Proc) -> None:
    text = proc.log_text()
    assert "Traceback" not in text and " ERROR " not in text, text[-4000:]


@pytest.mark.parametrize("seed", [1, 2])
def test_random_requests_are_all_judged(cluster: Cluster, seed: int) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, role="SYNC_MASTER")
    slave = cluster.broker(ns.addr, broker_id=1, role="SLAVE", haMasterAddress=f"127.0.0.1:{master.port + 1}")
    poll(lambda: master.status()["ha"]["slaves"], timeout=15, what="the slave connected")
    for target in (master, slave, ns):
        outcomes = asyncio.run(fuzz(target.addr, seed))
        unanswered = {k: v for k, v in outcomes.items() if not k.lstrip("-").isdigit()}
        assert not unanswered, unanswered
        # Most requests must get past the header checks, or the fuzz tests nothing but them.
        assert outcomes.get(str(int(ResponseCode.SUCCESS)), 0) > PER_CODE * len(CODES) // 10, outcomes
        assert ns.alive and master.alive and slave.alive
    for broker in (master, slave):
        metrics = broker.metrics()
        assert metric_value(metrics, "rmq_remoting_handler_errors_total") == 0
        assert metric_value(metrics, "rmq_remoting_header_errors_total") > 0  # the hostile values arrived
    for proc in (master, slave, ns):
        assert_clean_log(proc)
    # The store took what was sent and the slave still holds the same log: a plain send and read work.
    sent = rpc(master.addr, RequestCode.SEND_MESSAGE, {
        "producerGroup": "PG", "topic": "AfterFuzz", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": "0", "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
        "properties": "WAIT\x01true\x02", "reconsumeTimes": "0"}, body=b"after the fuzz")
    assert sent.code == ResponseCode.SUCCESS, sent
    end = master.status()["maxPhyOffset"]
    poll(lambda: slave.status()["maxPhyOffset"] == end, timeout=10, what="the slave at the master's end")
    status, master_bytes = master.admin(f"/commitlog?offset=0&length={end}")
    assert status == 200
    assert slave.admin(f"/commitlog?offset=0&length={end}") == (200, master_bytes)
