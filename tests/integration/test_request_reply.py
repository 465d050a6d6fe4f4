"""Request-reply (Java ``DefaultMQProducer.request``, 4.6+) against real processes, on the wire as
the Java client speaks it (the stock Python binding has no request()): the requester heartbeats as
a producer and sends its request with CORRELATION_ID / REPLY_TO_CLIENT; the responder reads the
request's CLUSTER and sends its reply to ``<cluster>_REPLY_TOPIC`` with SEND_REPLY_MESSAGE(_V2);
the broker pushes it to the requester (PUSH_REPLY_MESSAGE_TO_CLIENT) and stores it unless
storeReplyMessageEnable is off. A requester that is not connected, or refuses the push, makes the
reply fail; a slave refuses replies as it refuses sends."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.store.record import decode_properties, encode_properties, iter_records
from tests.conftest import Cluster
from tests.integration.helpers import create_topic, rpc, wait_caught_up, wait_route
from tests.support.procs import BrokerProc, Namesrv, metric_value

REPLY_TOPIC = "DefaultCluster_REPLY_TOPIC"
REQUEST_TOPIC = "RpcTopic"
REQUESTER_ID = "127.0.0.1@requester#1"


class Requester:
    """What a Java producer calling request() does on the wire: heartbeat as a producer with its
    client id, send the request, and answer the broker's PUSH_REPLY_MESSAGE_TO_CLIENT."""

    def __init__(self, addr: str, answer: int = ResponseCode.SUCCESS) -> None:
        self.addr = addr
        self.answer = answer
        self.pushed: list[RemotingCommand] = []
        self.client = RemotingClient(on_request=self._on_request)

    def _on_request(self, addr: str, cmd: RemotingCommand) -> None:
        if cmd.code != RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT:
            return
        self.pushed.append(cmd)
        if not cmd.is_oneway:
            self.client.respond(addr, cmd.make_response(self.answer))

    async def heartbeat(self) -> None:
        body = {"clientID": REQUESTER_ID, "language": "JAVA", "version": 409,
                "producerDataSet": [{"groupName": "PG_REQUESTER"}], "consumerDataSet": []}
        resp = await self.client.invoke(self.addr, RemotingCommand(RequestCode.HEART_BEAT,
                                                                   body=json.dumps(body).encode()), 5)
        assert resp.code == ResponseCode.SUCCESS

    async def request(self, correlation_id: str) -> None:
        props = encode_properties({"UNIQ_KEY": correlation_id, "CORRELATION_ID": correlation_id,
                                   "REPLY_TO_CLIENT": REQUESTER_ID, "TTL": "3000"})
        ext = {"a": "PG_REQUESTER", "b": REQUEST_TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0",
               "g": str(int(time.time() * 1000)), "h": "0", "i": props}
        resp = await self.client.invoke(self.addr, RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=ext,
                                                                   body=b"ping"), 5)
        assert resp.code == ResponseCode.SUCCESS, resp


def reply_props(correlation_id: str, reply_to: str | None = REQUESTER_ID) -> str:
    """A responder's reply properties, as Java's MessageUtil.createReplyMessage sets them."""
    props = {"UNIQ_KEY": f"R-{correlation_id}", "KEYS": f"R-{correlation_id}", "CORRELATION_ID": correlation_id,
             "TTL": "3000", "MSG_TYPE": "reply"}
    if reply_to is not None:
        props["REPLY_TO_CLIENT"] = reply_to
    return encode_properties(props)


async def send_reply(client: RemotingClient, addr: str, props: str, body: bytes, *, v2: bool = True,
                     topic: str = REPLY_TOPIC) -> RemotingCommand:
    born = str(int(time.time() * 1000))
    if v2:
        ext = {"a": "PG_RESPONDER", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": born,
               "h": "0", "i": props, "j": "0", "k": "false"}
        code = RequestCode.SEND_REPLY_MESSAGE_V2
    else:
        ext = {"producerGroup": "PG_RESPONDER", "topic": topic, "defaultTopic": "TBW102",
               "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0", "bornTimestamp": born, "flag": "0",
               "properties": props}
        code = RequestCode.SEND_REPLY_MESSAGE
    return await client.invoke(addr, RemotingCommand(code, ext_fields=ext, body=body), 15)


def pulled(addr: str, topic: str) -> list[tuple[bytes, dict[str, str]]]:
    """(body, properties) of what a consumer of ``topic`` queue 0 gets, from the start."""
    pull = {"consumerGroup": "CG_RPC", "topic": topic, "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
            "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*",
            "subVersion": "0"}
    resp = rpc(addr, RequestCode.PULL_MESSAGE, pull)
    if resp.code != ResponseCode.SUCCESS:
        return []
    return [(r.body, dict(r.properties)) for r in iter_records(bytes(resp.body))]


def max_offset(addr: str, topic: str) -> int:
    resp = rpc(addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": "0"})
    assert resp.code == ResponseCode.SUCCESS, resp
    return int(resp.ext_fields["offset"])


@pytest.fixture(scope="module")
def env(module_cluster: Cluster) -> tuple[BrokerProc, Namesrv]:
    ns = module_cluster.namesrv()
    broker = module_cluster.broker(ns.addr, name="broker-rpc")
    create_topic(broker.addr, REQUEST_TOPIC, queues=1)
    return broker, ns


@pytest.fixture
def master(env: tuple[BrokerProc, Namesrv], shared_cluster: Cluster) -> tuple[BrokerProc, str]:
    return env[0], env[1].addr


def test_reply_topic_is_built_in_and_routed(master: tuple[BrokerProc, str]) -> None:
    broker, namesrv = master
    data = wait_route(namesrv, REPLY_TOPIC)
    assert [(q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in data["queueDatas"]] \
        == [("broker-rpc", 1, 1, 6)]
    # A system topic, as RocketMQ's: not deletable like a user topic.
    resp = rpc(broker.addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": REPLY_TOPIC})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "conflict with system topic" in (resp.remark or "")


def test_reply_is_pushed_to_its_requester_and_stored(master: tuple[BrokerProc, str]) -> None:
    broker = master[0]
    before = broker.metrics()

    async def scenario() -> tuple[Requester, list[RemotingCommand]]:
        requester = Requester(broker.addr)
        await requester.heartbeat()
        await requester.request("corr-1")
        # The responder gets the request and replies to its cluster's reply topic.
        [(body, props)] = await asyncio.to_thread(pulled, broker.addr, REQUEST_TOPIC)
        assert body == b"ping"
        reply_topic = props["CLUSTER"] + "_REPLY_TOPIC"
        assert reply_topic == REPLY_TOPIC
        responder = RemotingClient()
        answers = [await send_reply(responder, broker.addr, reply_props(props["CORRELATION_ID"]), b"pong-v2"),
                   await send_reply(responder, broker.addr, reply_props("corr-2"), b"pong-v1", v2=False)]
        await responder.close()
        await requester.client.close()
        return requester, answers

    requester, answers = asyncio.run(scenario())
    for resp in answers:
        assert (resp.code, resp.remark) == (ResponseCode.SUCCESS, None), resp
        # Stored: the reply's id and offset, as a send answers.
        assert resp.ext_fields["queueId"] == "0" and resp.ext_fields["msgId"] != "0"
    assert [int(r.ext_fields["queueOffset"]) for r in answers] == [0, 1]

    assert [p.code for p in requester.pushed] == [RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT] * 2
    assert [bytes(p.body) for p in requester.pushed] == [b"pong-v2", b"pong-v1"]
    for push, corr in zip(requester.pushed, ("corr-1", "corr-2"), strict=True):
        ext = push.ext_fields
        assert not push.is_oneway
        assert {k: ext[k] for k in ("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId",
                                    "sysFlag", "flag", "reconsumeTimes", "unitMode")} == {
            "producerGroup": "PG_RESPONDER", "topic": REPLY_TOPIC, "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0", "flag": "0", "reconsumeTimes": "0",
            "unitMode": "false"}
        assert abs(int(ext["bornTimestamp"]) - time.time() * 1000) < 60_000
        # The responder's address (its connection's), and the broker's.
        host, _, port = ext["bornHost"].rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0 and ext["bornHost"] != broker.addr
        assert ext["storeHost"] == broker.addr
        assert abs(int(ext["storeTimestamp"]) - time.time() * 1000) < 60_000
        props = decode_properties(ext["properties"])
        assert props["CORRELATION_ID"] == corr and props["REPLY_TO_CLIENT"] == REQUESTER_ID
        assert props["MSG_TYPE"] == "reply" and int(props["PUSH_REPLY_TIME"]) > 0

    stored = pulled(broker.addr, REPLY_TOPIC)
    assert [body for body, _ in stored] == [b"pong-v2", b"pong-v1"]
    assert [props["CORRELATION_ID"] for _, props in stored] == ["corr-1", "corr-2"]
    after = broker.metrics()
    assert metric_value(after, "rmq_reply_messages_pushed_total") \
        - metric_value(before, "rmq_reply_messages_pushed_total") == 2


def test_reply_without_its_requester_fails(master: tuple[BrokerProc, str]) -> None:
    broker = master[0]
    start = max_offset(broker.addr, REPLY_TOPIC)

    async def scenario() -> tuple[list[RemotingCommand], Requester]:
        responder = RemotingClient()
        answers = [await send_reply(responder, broker.addr, reply_props("c-gone", "127.0.0.1@nobody#0"), b"x"),
                   await send_reply(responder, broker.addr, reply_props("c-none", None), b"x")]
        # A requester that refuses the push, then one that has gone away.
        refusing = Requester(broker.addr, answer=ResponseCode.SYSTEM_ERROR)
        await refusing.heartbeat()
        answers.append(await send_reply(responder, broker.addr, reply_props("c-refused"), b"x"))
        await refusing.client.close()
        answers.append(await send_reply(responder, broker.addr, reply_props("c-closed"), b"x"))
        await responder.close()
        return answers, refusing

    answers, refusing = asyncio.run(scenario())
    assert [(r.code, r.remark) for r in answers] == [
        (ResponseCode.SYSTEM_ERROR, "push reply message fail, channel of <127.0.0.1@nobody#0> not found."),
        (ResponseCode.SYSTEM_ERROR, "reply message properties[REPLY_TO_CLIENT] is null"),
        (ResponseCode.SYSTEM_ERROR, f"push reply message to {REQUESTER_ID} fail."),
        (ResponseCode.SYSTEM_ERROR, f"push reply message fail, channel of <{REQUESTER_ID}> not found."),
    ]
    assert len(refusing.pushed) == 1
    # Stored all the same, as RocketMQ does: the response says the requester did not get it.
    assert max_offset(broker.addr, REPLY_TOPIC) == start + 4
    assert all(r.ext_fields.get("msgId", "0") != "0" for r in answers)
    assert metric_value(broker.metrics(), "rmq_reply_messages_not_pushed_total") >= 4


def one_reply(addr: str, client_id: str) -> tuple[RemotingCommand, Requester]:
    """A requester heartbeats as ``client_id``; a responder sends it one reply (b"pong") through
    ``addr``. The responder's answer, and the requester with what was pushed to it."""

    async def scenario() -> tuple[RemotingCommand, Requester]:
        requester = Requester(addr)
        await requester.heartbeat()
        responder = RemotingClient()
        resp = await send_reply(responder, addr, reply_props(client_id), b"pong")
        await responder.close()
        await requester.client.close()
        return resp, requester

    return asyncio.run(scenario())


def test_replies_not_stored_without_store_reply_message_enable(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr, name="broker-nostore", storeReplyMessageEnable="false")

    resp, requester = one_reply(broker.addr, "c-1")
    assert resp.code == ResponseCode.SUCCESS
    # RocketMQ's placeholders for a reply it did not store.
    assert (resp.ext_fields["msgId"], resp.ext_fields["queueId"], resp.ext_fields["queueOffset"]) == ("0", "0", "0")
    assert [bytes(p.body) for p in requester.pushed] == [b"pong"]
    assert max_offset(broker.addr, REPLY_TOPIC) == 0 and pulled(broker.addr, REPLY_TOPIC) == []


def test_a_slave_refuses_replies(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-rpc-ha")
    slave = cluster.broker(ns.addr, name="broker-rpc-ha", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}")

    resp, requester = one_reply(slave.addr, "c-slave")
    assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, resp
    assert requester.pushed == []
    wait_caught_up(master, [slave])
    assert max_offset(slave.addr, REPLY_TOPIC) == 0
