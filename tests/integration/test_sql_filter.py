"""SQL92 selectors (``MessageSelector.bySql``) against a real broker with enablePropertyFilter:
messages sent by the stock C++ producer with user properties are selected by the broker, for a
subscription a heartbeat registered and for one a pull carries; a selector that does not compile
is refused where RocketMQ refuses it; a parked long poll wakes for a matching message; with
filterSupportRetry a group's retry messages are selected by its selector of their first topic.

The consumer speaks the Java client's wire protocol: the stock Python binding subscribes by tag only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.store.record import iter_records
from tests.conftest import Cluster
from tests.integration.helpers import create_topic_and_wait, message, produce, rpc
from tests.support.procs import BrokerProc

TOPIC = "SqlTopic"
QUEUES = 2
FLAG_SUSPEND, FLAG_SUBSCRIPTION = 0x2, 0x4


@pytest.fixture(scope="module")
def sql_broker(module_cluster: Cluster) -> Iterator[tuple[BrokerProc, list[dict[str, str]]]]:
    """A broker with SQL92 on, and 40 messages with properties ``a`` (0..39), ``color`` and a tag."""
    ns = module_cluster.namesrv()
    broker = module_cluster.broker(ns.addr, enablePropertyFilter="true", filterSupportRetry="true")
    create_topic_and_wait(broker.addr, ns.addr, TOPIC, queues=QUEUES)
    sent = [{"a": str(i), "color": "red" if i % 3 == 0 else "blue", "tag": "TagA" if i % 2 else "TagB",
             "body": f"m{i}"} for i in range(40)]
    results = produce(ns.addr, [message(TOPIC, m["body"], tags=m["tag"], props={"a": m["a"], "color": m["color"]})
                                for m in sent])
    assert all(r is not None and r["status"] == 0 for r in results), results  # SEND_OK
    yield broker, sent


def _pull_ext(group: str, queue_id: int, offset: int, sys_flag: int = 0, **extra: str) -> dict[str, str]:
    return {"consumerGroup": group, "topic": TOPIC, "queueId": str(queue_id), "queueOffset": str(offset),
            "maxMsgNums": "32", "sysFlag": str(sys_flag), "commitOffset": "0", "suspendTimeoutMillis": "0",
            "subVersion": "1", **extra}


async def _heartbeat(client: RemotingClient, addr: str, group: str, topic: str, expression: str,
                     expression_type: str = "SQL92") -> RemotingCommand:
    sub = {"topic": topic, "subString": expression, "expressionType": expression_type, "subVersion": 1,
           "classFilterMode": False, "tagsSet": [], "codeSet": []}
    body = {"clientID": f"sql-{group}@1", "language": "JAVA", "version": 409, "producerDataSet": [],
            "consumerDataSet": [{"groupName": group, "consumeType": "CONSUME_PASSIVELY",
                                 "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                                 "unitMode": False, "subscriptionDataSet": [sub]}]}
    return await client.invoke(addr, RemotingCommand(RequestCode.HEART_BEAT, body=json.dumps(body).encode()), 5)


async def _pull_everything(client: RemotingClient, addr: str, group: str, **extra: str) -> list[dict[str, Any]]:
    """Every selected message of every queue from offset 0, as {"body", "props"}."""
    out: list[dict[str, Any]] = []
    for qid in range(QUEUES):
        offset = 0
        for _ in range(100):
            resp = await client.invoke(addr, RemotingCommand(RequestCode.PULL_MESSAGE,
                                                             ext_fields={**_pull_ext(group, qid, offset), **extra}), 5)
            if resp.code == ResponseCode.PULL_NOT_FOUND:
                break
            assert resp.code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY), (resp.code, resp.remark)
            offset = int(resp.ext_fields["nextBeginOffset"])
            if resp.code == ResponseCode.SUCCESS:
                out += [{"body": bytes(r.body).decode(), "props": r.properties}
                        for r in iter_records(resp.body)]
        else:
            raise AssertionError(f"queue {qid} never ended")
    return out


def _expected(sent: list[dict[str, str]], pred: Any) -> list[str]:
    return sorted(m["body"] for m in sent if pred(m))


def test_a_heartbeat_selector_selects_by_user_and_system_properties(
        sql_broker: tuple[BrokerProc, list[dict[str, str]]]) -> None:
    broker, sent = sql_broker

    async def run() -> list[dict[str, Any]]:
        client = RemotingClient()
        try:
            beat = await _heartbeat(client, broker.addr, "CG_SQL_HB", TOPIC,
                                    "a >= 10 AND color = 'red' AND TAGS IN ('TagA', 'TagB')")
            assert beat.code == ResponseCode.SUCCESS
            return await _pull_everything(client, broker.addr, "CG_SQL_HB")
        finally:
            await client.close()

    got = asyncio.run(run())
    want = _expected(sent, lambda m: int(m["a"]) >= 10 and m["color"] == "red")
    assert want and sorted(m["body"] for m in got) == want
    # The records are whole: their properties came through as sent.
    assert all(m["props"]["color"] == "red" and int(m["props"]["a"]) >= 10 for m in got)


def test_a_selector_carried_by_the_pull_itself(sql_broker: tuple[BrokerProc, list[dict[str, str]]]) -> None:
    broker, sent = sql_broker
    cases = [
        ("TAGS = 'TagB' AND a BETWEEN 3 AND 20", lambda m: m["tag"] == "TagB" and 3 <= int(m["a"]) <= 20),
        ("color <> 'red' AND NOT (a > 5)", lambda m: m["color"] != "red" and int(m["a"]) <= 5),
        ("a IS NULL OR a IN ('7', '8')", lambda m: m["a"] in ("7", "8")),
        ("missing > 1", lambda m: False),
    ]

    async def run() -> list[list[str]]:
        client = RemotingClient()
        try:
            return [sorted(m["body"] for m in await _pull_everything(
                client, broker.addr, "CG_SQL_FLAG", sysFlag=str(FLAG_SUBSCRIPTION), subscription=expr,
                expressionType="SQL92")) for expr, _ in cases]
        finally:
            await client.close()

    for (expr, pred), got in zip(cases, asyncio.run(run()), strict=True):
        assert got == _expected(sent, pred), expr


def test_nothing_selected_moves_the_consumer_past_what_it_scanned(
        sql_broker: tuple[BrokerProc, list[dict[str, str]]]) -> None:
    broker, _ = sql_broker
    resp = rpc(broker.addr, RequestCode.PULL_MESSAGE,
               _pull_ext("CG_SQL_NONE", 0, 0, sys_flag=FLAG_SUBSCRIPTION, subscription="a > 1000",
                         expressionType="SQL92"))
    assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY, resp.remark
    assert int(resp.ext_fields["nextBeginOffset"]) == int(resp.ext_fields["maxOffset"]) > 0


def test_selectors_that_do_not_compile_are_refused_where_rocketmq_refuses_them(
        sql_broker: tuple[BrokerProc, list[dict[str, str]]]) -> None:
    broker, _ = sql_broker

    def check(expression: str) -> RemotingCommand:
        body = {"clientId": "c1", "group": "CG_SQL_BAD",
                "subscriptionData": {"topic": TOPIC, "subString": expression, "expressionType": "SQL92"}}
        return rpc(broker.addr, RequestCode.CHECK_CLIENT_CONFIG, body=json.dumps(body).encode())

    assert check("a > 5 AND color = 'red'").code == ResponseCode.SUCCESS
    bad = check("a > 'x'")
    assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "cannot be compared" in (bad.remark or "")
    bad = check("a >")
    assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "column 4" in (bad.remark or "")

    pulled = rpc(broker.addr, RequestCode.PULL_MESSAGE,
                 _pull_ext("CG_SQL_BAD", 0, 0, sys_flag=FLAG_SUBSCRIPTION, subscription="a = NULL",
                           expressionType="SQL92"))
    assert pulled.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "IS NULL" in (pulled.remark or "")

    async def registered() -> tuple[RemotingCommand, RemotingCommand]:
        """A consumer that skipped the check: its heartbeat is taken, its pulls are told why."""
        client = RemotingClient()
        try:
            beat = await _heartbeat(client, broker.addr, "CG_SQL_BAD", TOPIC, "a in (5)")
            pull = await client.invoke(broker.addr, RemotingCommand(
                RequestCode.PULL_MESSAGE, ext_fields=_pull_ext("CG_SQL_BAD", 0, 0)), 5)
            return beat, pull
        finally:
            await client.close()

    beat, pull = asyncio.run(registered())
    assert beat.code == ResponseCode.SUCCESS
    assert pull.code == ResponseCode.FILTER_DATA_NOT_EXIST and "string literal" in (pull.remark or "")


def test_a_parked_long_poll_wakes_for_a_selected_message(
        sql_broker: tuple[BrokerProc, list[dict[str, str]]]) -> None:
    broker, _ = sql_broker
    probe = rpc(broker.addr, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": "0"})
    end = int(probe.ext_fields["offset"])

    async def run() -> tuple[RemotingCommand, float]:
        client = RemotingClient()
        try:
            ext = _pull_ext("CG_SQL_POLL", 0, end, sys_flag=FLAG_SUSPEND | FLAG_SUBSCRIPTION,
                            subscription="color = 'green'", expressionType="SQL92", suspendTimeoutMillis="20000")
            started = time.monotonic()
            parked = asyncio.ensure_future(client.invoke(broker.addr, RemotingCommand(
                RequestCode.PULL_MESSAGE, ext_fields=ext), 30))
            await asyncio.sleep(0.5)
            assert not parked.done()
            props = "color\x01green\x02a\x01100\x02"
            send = {"producerGroup": "PG_SQL", "topic": TOPIC, "defaultTopic": "TBW102",
                    "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
                    "bornTimestamp": str(int(time.time() * 1000)), "flag": "0", "properties": props}
            sent = await client.invoke(broker.addr, RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields=send,
                                                                    body=b"green"), 5)
            assert sent.code == ResponseCode.SUCCESS
            return await parked, time.monotonic() - started
        finally:
            await client.close()

    resp, waited = asyncio.run(run())
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert [bytes(r.body) for r in iter_records(resp.body)] == [b"green"]
    assert waited < 10  # woken by the message, not by the 20 s timeout


def test_retry_messages_are_selected_by_the_groups_selector_of_their_topic(
        sql_broker: tuple[BrokerProc, list[dict[str, str]]]) -> None:
    """filterSupportRetry: the retry topic is subscribed with "*", yet the messages sent back from
    TOPIC are selected by the group's selector of TOPIC; a retry message of another topic is not."""
    broker, _ = sql_broker
    group = "CG_SQL_RETRY"
    retry = f"%RETRY%{group}"

    async def run() -> list[str]:
        client = RemotingClient()
        try:
            beat = await _heartbeat(client, broker.addr, group, TOPIC, "a > 5")
            assert beat.code == ResponseCode.SUCCESS
            for body, props in ((b"r-selected", f"RETRY_TOPIC\x01{TOPIC}\x02a\x019\x02"),
                                (b"r-not-selected", f"RETRY_TOPIC\x01{TOPIC}\x02a\x011\x02"),
                                (b"r-other-topic", "RETRY_TOPIC\x01OtherTopic\x02a\x011\x02")):
                send = {"producerGroup": "PG_SQL", "topic": retry, "defaultTopic": "TBW102",
                        "defaultTopicQueueNums": "1", "queueId": "0", "sysFlag": "0",
                        "bornTimestamp": str(int(time.time() * 1000)), "flag": "0", "properties": props,
                        "reconsumeTimes": "1"}
                sent = await client.invoke(broker.addr, RemotingCommand(RequestCode.SEND_MESSAGE,
                                                                        ext_fields=send, body=body), 5)
                assert sent.code == ResponseCode.SUCCESS, sent.remark
            ext = {**_pull_ext(group, 0, 0, sys_flag=FLAG_SUBSCRIPTION, subscription="*", expressionType="TAG"),
                   "topic": retry}
            resp = await client.invoke(broker.addr, RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=ext), 5)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            return [bytes(r.body).decode() for r in iter_records(resp.body)]
        finally:
            await client.close()

    assert asyncio.run(run()) == ["r-selected", "r-other-topic"]

