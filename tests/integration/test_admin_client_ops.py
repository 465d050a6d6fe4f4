"""The admin requests about consumers, producers and consume queues (RocketMQ 4.9's AdminBrokerProcessor)
against a real broker: CONSUME_MESSAGE_DIRECTLY (309) and INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223)
relayed to a consumer that speaks the Java client's side of the wire (it answers 309 and
GET_CONSUMER_STATUS_FROM_CLIENT, 221), QUERY_CONSUME_TIME_SPAN (303), QUERY_CORRECTION_OFFSET (308),
QUERY_CONSUME_QUEUE (321), GET_ALL_PRODUCER_INFO (328), RESUME_CHECK_HALF_MESSAGE (323), their
refusals on a connection that stays usable, and the rmq-admin commands built on them."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rmqbroker.admin_cli import main as rmq_admin
from rmqbroker.metadata.jsonfile import fastjson_loads, mq_key
from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.store.record import decode_offset_msg_id, decode_record, java_string_hash, offset_msg_id
from tests.conftest import Cluster
from tests.integration.helpers import create_topic_and_wait, poll, rpc, send_raw
from tests.support.procs import BrokerProc, Namesrv

TOPIC = "OpsTopic"
GROUP = "CG_OPS"
BROKER = "broker-ops"
TX_TOPIC = "OpsTxTopic"
TX_GROUP = "PG_OPS_TX"
COMMIT = 8


class JavaLikeClient:
    """A consumer (and producer) that answers the broker's requests as RocketMQ's Java client does:
    CONSUME_MESSAGE_DIRECTLY with a ConsumeMessageDirectlyResult, GET_CONSUMER_STATUS_FROM_CLIENT with
    its offsets, CHECK_TRANSACTION_STATE by ending the transaction (when ``commit_checks``).
    ``silent`` leaves every request unanswered (what the stock C++ client does with 221 and 309)."""

    def __init__(self, addr: str, client_id: str, *, silent: bool = False, commit_checks: bool = False) -> None:
        self.addr = addr
        self.client_id = client_id
        self.silent = silent
        self.commit_checks = commit_checks
        self.direct: list[RemotingCommand] = []
        self.status_asks: list[RemotingCommand] = []
        self.checks: list[RemotingCommand] = []
        self.client = RemotingClient(on_request=self._on_request)

    def _on_request(self, addr: str, cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            self.checks.append(cmd)
            if self.commit_checks:
                ext = cmd.ext_fields
                asyncio.get_running_loop().create_task(self.end(int(ext["tranStateTableOffset"]),
                                                                int(ext["commitLogOffset"]), COMMIT))
            return
        if cmd.code == RequestCode.CONSUME_MESSAGE_DIRECTLY:
            self.direct.append(cmd)
            msg = decode_record(bytes(cmd.body))
            body = {"autoCommit": True, "consumeResult": "CR_SUCCESS", "order": False,
                    "remark": f"consumed {msg.body.decode()}", "spentTimeMills": 3}
        elif cmd.code == RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT:
            self.status_asks.append(cmd)
            topic = cmd.ext_fields["topic"]
            body_text = (f'{{"consumerTable":{{}},"messageQueueTable":{{{mq_key(BROKER, topic, 0)}:5,'
                         f'{mq_key(BROKER, topic, 1)}:7}}}}')
            if not self.silent:
                self.client.respond(addr, cmd.make_response(ResponseCode.SUCCESS, body=body_text.encode()))
            return
        else:
            return
        if not self.silent:
            self.client.respond(addr, cmd.make_response(ResponseCode.SUCCESS, body=json.dumps(body).encode()))

    async def call(self, code: int, ext: dict[str, str], body: bytes = b"", timeout: float = 15) -> RemotingCommand:
        return await self.client.invoke(self.addr, RemotingCommand(code, ext_fields=ext, body=body), timeout)

    async def heartbeat(self, *, consumer_group: str | None = GROUP, producer_group: str | None = None) -> None:
        body: dict[str, Any] = {"clientID": self.client_id, "language": "JAVA", "version": 409,
                                "producerDataSet": [{"groupName": producer_group}] if producer_group else [],
                                "consumerDataSet": []}
        if consumer_group:
            body["consumerDataSet"] = [{
                "groupName": consumer_group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
                "subscriptionDataSet": [{"topic": TOPIC, "subString": "*", "classFilterMode": False,
                                         "tagsSet": [], "codeSet": [], "subVersion": 1, "expressionType": "TAG"}]}]
        resp = await self.call(RequestCode.HEART_BEAT, {}, json.dumps(body).encode())
        assert resp.code == ResponseCode.SUCCESS, resp

    async def half(self, body: bytes) -> str:
        """A transactional half message; its offset msg id."""
        props = f"TRAN_MSG\x01true\x02PGROUP\x01{TX_GROUP}\x02"
        resp = await self.call(RequestCode.SEND_MESSAGE, {
            "producerGroup": TX_GROUP, "topic": TX_TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
            "queueId": "0", "sysFlag": "4", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
            "properties": props}, body)
        assert resp.code == ResponseCode.SUCCESS, resp
        return resp.ext_fields["msgId"]

    async def end(self, table_offset: int, phy: int, state: int) -> None:
        await self.client.invoke_oneway(self.addr, RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={
            "producerGroup": TX_GROUP, "tranStateTableOffset": str(table_offset), "commitLogOffset": str(phy),
            "commitOrRollback": str(state), "fromTransactionCheck": "true"}))


@pytest.fixture(scope="module")
def env(module_cluster: Cluster) -> Iterator[tuple[Namesrv, BrokerProc, list[str]]]:
    """One broker with TOPIC (2 queues, three messages in queue 0) and the transaction check quick."""
    ns = module_cluster.namesrv()
    broker = module_cluster.broker(ns.addr, name=BROKER, transactionCheckInterval=300, transactionTimeOut=800,
                                   transactionCheckMax=1)
    create_topic_and_wait(broker.addr, ns.addr, TOPIC, queues=2)
    ids = []
    for i in range(3):
        resp = send_raw(broker.addr, TOPIC, f"m{i}".encode(), properties=f"WAIT\x01true\x02TAGS\x01T{i}\x02")
        assert resp.code == ResponseCode.SUCCESS, resp
        ids.append(resp.ext_fields["msgId"])
        time.sleep(0.01)
    yield ns, broker, ids


def _body(resp: RemotingCommand) -> Any:
    assert resp.code == ResponseCode.SUCCESS, resp
    return fastjson_loads(bytes(resp.body))


def _store_time(addr: str, msg_id: str) -> int:
    resp = rpc(addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(decode_offset_msg_id(msg_id)[2])})
    return decode_record(bytes(resp.body)).store_timestamp


def _commit(addr: str, group: str, queue_id: int, offset: int, topic: str = TOPIC) -> None:
    resp = rpc(addr, RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic,
                                                          "queueId": str(queue_id), "commitOffset": str(offset)})
    assert resp.code == ResponseCode.SUCCESS


def test_consume_message_directly_is_relayed_to_the_consumer(env: tuple[Namesrv, BrokerProc, list[str]],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    ns, broker, ids = env

    async def scenario() -> JavaLikeClient:
        c = JavaLikeClient(broker.addr, "ops-consumer@1")
        await c.heartbeat()
        admin = JavaLikeClient(broker.addr, "admin@1")  # one connection for every request below
        ok = {"consumerGroup": GROUP, "clientId": c.client_id, "msgId": ids[1]}
        resp = await admin.call(RequestCode.CONSUME_MESSAGE_DIRECTLY, ok)
        assert resp.code == ResponseCode.SUCCESS, resp
        result = json.loads(bytes(resp.body))
        assert (result["consumeResult"], result["remark"]) == ("CR_SUCCESS", "consumed m1")
        # Refusals, each with Java's code and a remark, on the same connection.
        resp = await admin.call(RequestCode.CONSUME_MESSAGE_DIRECTLY, {**ok, "clientId": "nobody@1"})
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, f"The Consumer <{GROUP}> <nobody@1> not online")
        resp = await admin.call(RequestCode.CONSUME_MESSAGE_DIRECTLY, {**ok, "consumerGroup": "CG_NOBODY"})
        assert resp.code == ResponseCode.SYSTEM_ERROR and "not online" in (resp.remark or "")
        gone = offset_msg_id("127.0.0.1", broker.port, 10**12)
        resp = await admin.call(RequestCode.CONSUME_MESSAGE_DIRECTLY, {**ok, "msgId": gone})
        assert resp.code == ResponseCode.SYSTEM_ERROR and "can not find message" in (resp.remark or "")
        resp = await admin.call(RequestCode.CONSUME_MESSAGE_DIRECTLY, {**ok, "msgId": "XYZ"})
        assert resp.code == ResponseCode.SYSTEM_ERROR and "msg id" in (resp.remark or "")
        for field in ("consumerGroup", "msgId"):
            resp = await admin.call(RequestCode.CONSUME_MESSAGE_DIRECTLY, {k: v for k, v in ok.items() if k != field})
            assert resp.code == ResponseCode.SYSTEM_ERROR and f"<{field}>" in (resp.remark or "")
        resp = await admin.call(RequestCode.CONSUME_MESSAGE_DIRECTLY, {**ok, "msgId": ids[2]})
        assert resp.code == ResponseCode.SUCCESS and b"consumed m2" in bytes(resp.body)
        await admin.client.close()
        # mqadmin queryMsgById -g -d: the same request, and the result as Java prints it.
        code = await asyncio.to_thread(rmq_admin, ["queryMsgById", "-n", ns.addr, "-i", ids[0], "-g", GROUP,
                                                   "-d", c.client_id])
        assert code == 0
        await c.client.close()
        return c

    c = asyncio.run(scenario())
    assert len(c.direct) == 3
    first = c.direct[0]
    assert first.ext_fields["brokerName"] == BROKER and first.ext_fields["msgId"] == ids[1]
    assert decode_record(bytes(first.body)).body == b"m1"
    out = capsys.readouterr().out
    assert "ConsumeMessageDirectlyResult [order=false, autoCommit=true, consumeResult=CR_SUCCESS, " \
           "remark=consumed m0, spentTimeMills=3]" in out


def test_consumer_status_is_gathered_from_the_group(env: tuple[Namesrv, BrokerProc, list[str]],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    ns, broker, _ids = env

    async def scenario() -> tuple[JavaLikeClient, JavaLikeClient, list[RemotingCommand], int]:
        a = JavaLikeClient(broker.addr, "ops-status-a@1")
        b = JavaLikeClient(broker.addr, "ops-status-b@1", silent=True)
        await a.heartbeat()
        await b.heartbeat()
        admin = JavaLikeClient(broker.addr, "admin@2")
        answers = [await admin.call(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                                    {"topic": TOPIC, "group": GROUP})]
        answers.append(await admin.call(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                                        {"topic": TOPIC, "group": GROUP, "clientAddr": a.client_id}))
        answers.append(await admin.call(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                                        {"topic": TOPIC, "group": "CG_NOBODY"}))
        answers.append(await admin.call(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {"group": GROUP}))
        answers.append(await admin.call(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                                        {"topic": TOPIC, "group": GROUP, "clientAddr": a.client_id}))
        await admin.client.close()
        code = await asyncio.to_thread(rmq_admin, ["getConsumerStatus", "-n", ns.addr, "-g", GROUP, "-t", TOPIC,
                                                   "-i", a.client_id])
        await a.client.close()
        await b.client.close()
        return a, b, answers, code

    a, b, answers, code = asyncio.run(scenario())
    everyone, one, nobody, no_topic, again = answers
    # The silent member is asked and left out once it times out; the other's offsets come back.
    table = fastjson_loads(bytes(everyone.body).replace(mq_key(BROKER, TOPIC, 0).encode(), b'"q0"')
                           .replace(mq_key(BROKER, TOPIC, 1).encode(), b'"q1"'))
    assert everyone.code == ResponseCode.SUCCESS and table["consumerTable"] == {a.client_id: {"q0": 5, "q1": 7}}
    assert len(b.status_asks) == 1 and b.status_asks[0].ext_fields == {"topic": TOPIC, "group": GROUP}
    assert one.code == ResponseCode.SUCCESS and bytes(one.body) == bytes(everyone.body)
    assert len(a.status_asks) == 4  # both requests above, once more, and the CLI's
    assert (nobody.code, nobody.remark) == (ResponseCode.SYSTEM_ERROR,
                                            "No Any Consumer online in the consumer group: [CG_NOBODY]")
    assert no_topic.code == ResponseCode.SYSTEM_ERROR and "<topic>" in (no_topic.remark or "")
    assert again.code == ResponseCode.SUCCESS
    out = capsys.readouterr().out
    assert code == 0
    assert f"get consumer status from client. group={GROUP}, topic={TOPIC}, originClientId={a.client_id}" in out
    rows = [line.split() for line in out.splitlines()[2:]]
    assert rows == [[a.client_id, BROKER, "0", "5"], [a.client_id, BROKER, "1", "7"]]


def test_consume_time_span(env: tuple[Namesrv, BrokerProc, list[str]]) -> None:
    _ns, broker, ids = env
    _commit(broker.addr, "CG_SPAN", 0, 1)
    before = int(time.time() * 1000)
    spans = _body(rpc(broker.addr, RequestCode.QUERY_CONSUME_TIME_SPAN,
                      {"topic": TOPIC, "group": "CG_SPAN"}))["consumeTimeSpanSet"]
    times = [_store_time(broker.addr, i) for i in ids]
    q0, q1 = sorted(spans, key=lambda s: s["messageQueue"]["queueId"])
    assert q0["messageQueue"] == {"brokerName": BROKER, "queueId": 0, "topic": TOPIC}
    assert (q0["minTimeStamp"], q0["maxTimeStamp"], q0["consumeTimeStamp"]) == (times[0], times[2], times[0])
    assert before - times[1] <= q0["delayTime"] <= int(time.time() * 1000) - times[1]
    assert q0["minTimeStampStr"].count("#") == 1 and q0["minTimeStampStr"].endswith(f"{times[0] % 1000:03d}")
    assert (q1["minTimeStamp"], q1["maxTimeStamp"], q1["delayTime"]) == (-1, -1, 0)  # an empty queue
    resp = rpc(broker.addr, RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": "NoSuchTopic", "group": "CG_SPAN"})
    assert (resp.code, resp.remark) == (ResponseCode.TOPIC_NOT_EXIST, "topic[NoSuchTopic] not exist")
    resp = rpc(broker.addr, RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": TOPIC})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "<group>" in (resp.remark or "")


def test_correction_offset(env: tuple[Namesrv, BrokerProc, list[str]]) -> None:
    _ns, broker, _ids = env
    topic = "OpsCorrection"
    _commit(broker.addr, "CG_FAST", 0, 3, topic)
    _commit(broker.addr, "CG_SLOW", 0, 1, topic)
    _commit(broker.addr, "CG_SLOW", 1, 0, topic)

    def ask(compare: str, filters: str | None = None) -> dict[str, int]:
        ext = {"topic": topic, "compareGroup": compare, **({"filterGroups": filters} if filters is not None else {})}
        result: dict[str, int] = _body(rpc(broker.addr, RequestCode.QUERY_CORRECTION_OFFSET, ext))["correctionOffsets"]
        return result

    assert ask("CG_FAST") == {"0": 1, "1": 0}  # the lowest over every group
    assert ask("CG_FAST", "CG_SLOW") == {"0": 3}  # the filtered group left out
    assert ask("CG_SLOW", "CG_SLOW,CG_OTHER") == {"0": (1 << 63) - 1}  # the compare group is behind
    # Filtering reads the offsets, it does not delete them (RocketMQ 4.9 does).
    assert ask("CG_FAST") == {"0": 1, "1": 0}
    resp = rpc(broker.addr, RequestCode.QUERY_CORRECTION_OFFSET, {"topic": topic})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "<compareGroup>" in (resp.remark or "")


def test_query_consume_queue(env: tuple[Namesrv, BrokerProc, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    ns, broker, ids = env
    phys = [decode_offset_msg_id(i)[2] for i in ids]

    async def scenario() -> tuple[list[RemotingCommand], int]:
        c = JavaLikeClient(broker.addr, "ops-cq@1")
        await c.heartbeat()
        admin = JavaLikeClient(broker.addr, "admin@3")
        base = {"topic": TOPIC, "queueId": "0", "index": "0", "count": "10"}
        answers = [await admin.call(RequestCode.QUERY_CONSUME_QUEUE, ext) for ext in (
            {**base, "consumerGroup": GROUP}, {**base, "index": "1", "count": "1", "consumerGroup": "CG_OFF"},
            {**base, "index": "5"}, {**base, "queueId": "7"}, {k: v for k, v in base.items() if k != "index"},
            base)]
        await admin.client.close()
        code = await asyncio.to_thread(rmq_admin, ["queryCq", "-n", ns.addr, "-t", TOPIC, "-q", "0", "-i", "1",
                                                   "-g", GROUP])
        await c.client.close()
        return answers, code

    answers, code = asyncio.run(scenario())
    with_group, offline, past_end, no_queue, no_index, plain = answers
    doc = _body(with_group)
    assert (doc["minQueueIndex"], doc["maxQueueIndex"]) == (0, 3)
    assert [u["physicOffset"] for u in doc["queueData"]] == phys
    assert all(u["physicSize"] > 0 and u["eval"] is False for u in doc["queueData"])
    assert [u["tagsCode"] for u in doc["queueData"]] == [java_string_hash(f"T{i}") for i in range(3)]
    assert doc["subscriptionData"]["subString"] == "*" and doc["filterData"] == "null"
    doc = _body(offline)
    assert [u["physicOffset"] for u in doc["queueData"]] == phys[1:2]
    assert "subscriptionData" not in doc and doc["filterData"] == f"CG_OFF@{TOPIC} is not online!"
    assert (past_end.code, past_end.remark, bytes(past_end.body)) == (
        ResponseCode.SUCCESS, f"Index 5 of 0@{TOPIC} is not exist!", b"")
    assert (no_queue.code, no_queue.remark) == (ResponseCode.SYSTEM_ERROR, f"7@{TOPIC} is not exist!")
    assert no_index.code == ResponseCode.SYSTEM_ERROR and "<index>" in (no_index.remark or "")
    assert "subscriptionData" not in _body(plain) and "filterData" not in _body(plain)
    out = capsys.readouterr().out
    assert code == 0
    assert "Subscription data: \n" in out and "Filter data: \nnull\n" in out
    assert "Queue data: \nmax: 3, min: 0\n" in out
    assert f"idx: 1\nConsumeQueueData{{physicOffset={phys[1]}, " in out and f"idx: 2\nConsumeQueueData{{physicOffset=" \
        f"{phys[2]}, " in out and "idx: 3" not in out
    assert ", extendDataJson='null', bitMap='null', eval=false, msg='null'}" in out


def test_all_producer_info(env: tuple[Namesrv, BrokerProc, list[str]]) -> None:
    _ns, broker, _ids = env

    async def scenario() -> Any:
        p = JavaLikeClient(broker.addr, "ops-producer@1")
        await p.heartbeat(consumer_group=None, producer_group="PG_OPS")
        before = int(time.time() * 1000)
        doc = fastjson_loads(bytes((await p.call(RequestCode.GET_ALL_PRODUCER_INFO, {})).body))
        await p.client.close()
        return doc, before

    doc, before = asyncio.run(scenario())
    (info,) = doc["data"]["PG_OPS"]
    assert (info["clientId"], info["language"], info["version"]) == ("ops-producer@1", "JAVA", 409)
    assert info["remoteIP"].startswith("/127.0.0.1:") and before - 5000 < info["lastUpdateTimestamp"] <= before


def test_resume_check_half_message(env: tuple[Namesrv, BrokerProc, list[str]]) -> None:
    _ns, broker, ids = env
    create_topic_and_wait(broker.addr, _ns.addr, TX_TOPIC, queues=1)

    async def scenario() -> tuple[JavaLikeClient, list[RemotingCommand]]:
        p = JavaLikeClient(broker.addr, "ops-tx@1")
        await p.heartbeat(consumer_group=None, producer_group=TX_GROUP)
        given_up = await p.half(b"given up")
        young = await p.half(b"still young")
        answers = [await p.call(RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": young})]
        # transactionCheckMax=1: one unanswered check, then the half is given up.
        for _ in range(100):
            if broker.log_text().count("given up") >= 2:
                break
            await asyncio.sleep(0.1)
        asked = len(p.checks)
        p.commit_checks = True
        answers += [await p.call(RequestCode.RESUME_CHECK_HALF_MESSAGE, ext) for ext in (
            {"msgId": given_up}, {"msgId": ids[0]}, {"msgId": offset_msg_id("127.0.0.1", broker.port, 10**12)},
            {})]
        for _ in range(100):  # the copy is checked after transactionTimeOut, and the answer commits it
            if len(p.checks) > asked and bool(await asyncio.to_thread(_delivered, broker.addr)):
                break
            await asyncio.sleep(0.1)
        copy_id = p.checks[-1].ext_fields["offsetMsgId"]
        for _ in range(50):  # settled: putting it back again is refused once the walk is past it
            again = await p.call(RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": copy_id})
            if "already committed" in (again.remark or ""):
                break
            await asyncio.sleep(0.2)
        answers.append(again)
        await p.client.close()
        return p, answers

    p, answers = asyncio.run(scenario())
    young_refused, resumed, not_half, missing, no_id, settled = answers
    assert young_refused.code == ResponseCode.SYSTEM_ERROR and "still being checked" in (young_refused.remark or "")
    assert resumed.code == ResponseCode.SUCCESS, resumed
    assert not_half.code == ResponseCode.SYSTEM_ERROR and "not a half message" in (not_half.remark or "")
    assert missing.code == ResponseCode.SYSTEM_ERROR and "can not find message" in (missing.remark or "")
    assert no_id.code == ResponseCode.SYSTEM_ERROR and "<msgId>" in (no_id.remark or "")
    assert settled.code == ResponseCode.SYSTEM_ERROR and "already committed" in (settled.remark or ""), settled
    last = decode_record(bytes(p.checks[-1].body))
    assert last.body == b"given up" and last.properties["TRANSACTION_CHECK_TIMES"] == "1"
    assert [r.body for r in (decode_record(b) for b in _delivered(broker.addr))] == [b"given up"]


def _delivered(addr: str) -> list[bytes]:
    """The raw records of TX_TOPIC queue 0."""
    pull = {"consumerGroup": "CG_OPS_TX", "topic": TX_TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
            "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"}
    resp = rpc(addr, RequestCode.PULL_MESSAGE, pull)
    if resp.code != ResponseCode.SUCCESS:
        return []
    body = bytes(resp.body)
    out = []
    pos = 0
    while pos + 4 <= len(body):
        size = int.from_bytes(body[pos:pos + 4], "big")
        out.append(body[pos:pos + size])
        pos += size
    return out


def test_unknown_code_still_refused(env: tuple[Namesrv, BrokerProc, list[str]]) -> None:
    """The new codes are served; an unknown one keeps REQUEST_CODE_NOT_SUPPORTED."""
    _ns, broker, _ids = env
    assert rpc(broker.addr, 9999).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    poll(lambda: rpc(broker.addr, RequestCode.GET_ALL_PRODUCER_INFO).code == ResponseCode.SUCCESS, 5,
         what="GET_ALL_PRODUCER_INFO served")
