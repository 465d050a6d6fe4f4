"""Broker request codes against a running broker: the codes no other process-level test covers
(SEND_MESSAGE_V2 letters, offsets by time, runtime info, queue locks, send-back, nameserver
version and unregistration), and requests the broker must refuse without side effects: a refused
send creates no topic and stores nothing, an out-of-range header number is a header error, and an
unusable request body is counted in /metrics.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest

from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.store.record import BatchEntry, decode_offset_msg_id, decode_record, encode_batch_body
from tests.conftest import Cluster
from tests.integration.helpers import create_topic, metric_delta, route, rpc, wait_route
from tests.support.procs import BrokerProc, Namesrv

MAX_MESSAGE_SIZE = 64 * 1024
TOPIC = "RequestsTopic"
PROPS = "KEYS\x01req\x02WAIT\x01true\x02TAGS\x01TagX\x02"
TX = "TRAN_MSG\x01true\x02PGROUP\x01PG_TX\x02"  # what a TransactionMQProducer adds to a half message
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
# Counters a refused request may move; each test says which one must and which must not.
COUNTERS = ("rmq_remoting_header_errors_total", "rmq_remoting_handler_errors_total", "rmq_send_rejected_total",
            "rmq_remoting_bad_requests_total", "rmq_malformed_frames_total")


@pytest.fixture(scope="module")
def env(module_cluster: Cluster) -> dict[str, Any]:
    ns = module_cluster.namesrv()
    # rejectTransactionMessage: a half message is one of the refused sends below.
    broker = module_cluster.broker(ns.addr, maxMessageSize=MAX_MESSAGE_SIZE, rejectTransactionMessage="true")
    create_topic(broker.addr, TOPIC, queues=2)
    return {"ns": ns, "broker": broker}


@pytest.fixture
def broker(env: dict[str, Any], shared_cluster: Cluster) -> BrokerProc:
    b: BrokerProc = env["broker"]
    return b


@pytest.fixture
def namesrv(env: dict[str, Any], shared_cluster: Cluster) -> Namesrv:
    ns: Namesrv = env["ns"]
    return ns


def v1(topic: str, queue_id: int = 0, **override: str) -> dict[str, str]:
    """A SEND_MESSAGE header (V1 field names)."""
    ext = {"producerGroup": "PG_REQ", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
           "queueId": str(queue_id), "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
           "properties": PROPS, "reconsumeTimes": "0"}
    ext.update(override)
    return ext


def v2(topic: str, queue_id: int = 0, props: str = "KEYS\x01v2\x02WAIT\x01true\x02TAGS\x01TagV2\x02",
       batch: bool = False, **override: str) -> dict[str, str]:
    """A SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE header (single-letter field names)."""
    ext = {"a": "PG_REQ", "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": "0",
           "g": str(int(time.time() * 1000)), "h": "0", "i": props, "j": "0", "k": "false",
           "m": "true" if batch else "false"}
    ext.update(override)
    return ext


def max_offset(b: BrokerProc, topic: str, qid: int) -> int:
    resp = rpc(b.addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(qid)})
    assert resp.code == ResponseCode.SUCCESS, resp
    return int(resp.ext_fields["offset"])


def phy_of(msg_id: str) -> int:
    return decode_offset_msg_id(msg_id)[2]


def view(b: BrokerProc, phy: int) -> Any:
    resp = rpc(b.addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(phy)})
    assert resp.code == ResponseCode.SUCCESS, resp
    return decode_record(bytes(resp.body))


def counters(before: str, after: str) -> dict[str, float]:
    return {n: metric_delta(before, after, n) for n in COUNTERS}


# ------------------------------------------------------------------ request codes
def test_send_v2_and_batch_read_the_letter_header(broker: BrokerProc) -> None:
    """SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE headers in single letters store what they name:
    topic, queue, tags and keys, and a batch becomes one record per entry with one msgId each."""
    before = max_offset(broker, TOPIC, 1)
    resp = rpc(broker.addr, RequestCode.SEND_MESSAGE_V2, v2(TOPIC, 1), body=b"v2 body")
    assert resp.code == ResponseCode.SUCCESS, resp
    rec = view(broker, phy_of(resp.ext_fields["msgId"]))
    assert (rec.topic, rec.body, rec.tags, rec.keys, rec.queue_id) == (TOPIC, b"v2 body", "TagV2", "v2", 1)
    batch = encode_batch_body([BatchEntry(0, f"b{i}".encode(), f"TAGS\x01TagB\x02KEYS\x01bk{i}") for i in range(3)])
    resp = rpc(broker.addr, RequestCode.SEND_BATCH_MESSAGE, v2(TOPIC, 1, props="WAIT\x01true\x02", batch=True),
               body=batch)
    assert resp.code == ResponseCode.SUCCESS, resp
    ids = resp.ext_fields["msgId"].split(",")
    assert len(ids) == 3
    assert [view(broker, phy_of(i)).body for i in ids] == [b"b0", b"b1", b"b2"]
    assert max_offset(broker, TOPIC, 1) == before + 4


def test_min_offset_search_by_timestamp_earliest_time_and_view(broker: BrokerProc) -> None:
    """GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP (each record's store time finds its offset),
    GET_EARLIEST_MSG_STORETIME, and VIEW_MESSAGE_BY_ID refusing an offset inside a record."""
    topic = "RequestsTimeTopic"
    create_topic(broker.addr, topic, queues=1)
    recs = []
    for i in range(3):
        resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, v1(topic), body=f"t{i}".encode())
        assert resp.code == ResponseCode.SUCCESS, resp
        recs.append(view(broker, phy_of(resp.ext_fields["msgId"])))
        time.sleep(0.05)
    assert [r.body for r in recs] == [b"t0", b"t1", b"t2"]
    resp = rpc(broker.addr, RequestCode.GET_MIN_OFFSET, {"topic": topic, "queueId": "0"})
    assert (resp.code, resp.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "0"), resp
    for r in recs:
        resp = rpc(broker.addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                   {"topic": topic, "queueId": "0", "timestamp": str(r.store_timestamp)})
        assert resp.code == ResponseCode.SUCCESS, resp
        assert int(resp.ext_fields["offset"]) == r.queue_offset, (r.store_timestamp, resp.ext_fields)
    resp = rpc(broker.addr, RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": topic, "queueId": "0"})
    assert resp.code == ResponseCode.SUCCESS and int(resp.ext_fields["timestamp"]) == recs[0].store_timestamp
    resp = rpc(broker.addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(recs[0].physical_offset + 3)})
    assert resp.code == ResponseCode.SYSTEM_ERROR and resp.remark


def test_broker_runtime_info(broker: BrokerProc) -> None:
    """GET_BROKER_RUNTIME_INFO: a table of strings whose commitlog max offset is the store's."""
    resp = rpc(broker.addr, RequestCode.GET_BROKER_RUNTIME_INFO)
    assert resp.code == ResponseCode.SUCCESS, resp
    table = json.loads(bytes(resp.body))["table"]
    assert int(table["commitLogMaxOffset"]) == broker.status()["maxPhyOffset"]
    assert all(isinstance(v, str) for v in table.values())


def test_lock_batch_mq_is_exclusive_and_unlock_releases(broker: BrokerProc) -> None:
    """LOCK_BATCH_MQ gives a queue to one client at a time (its owner may renew the lock) and
    UNLOCK_BATCH_MQ releases only the queues it names."""
    mqs = [{"topic": TOPIC, "brokerName": "broker-a", "queueId": q} for q in (0, 1)]

    def lock(client: str) -> set[int]:
        resp = rpc(broker.addr, RequestCode.LOCK_BATCH_MQ,
                   body=json.dumps({"consumerGroup": "CG_LOCK", "clientId": client, "mqSet": mqs}).encode())
        assert resp.code == ResponseCode.SUCCESS, resp
        return {mq["queueId"] for mq in json.loads(bytes(resp.body))["lockOKMQSet"]}

    assert lock("client-A") == {0, 1}
    assert lock("client-B") == set()
    assert lock("client-A") == {0, 1}
    resp = rpc(broker.addr, RequestCode.UNLOCK_BATCH_MQ,
               body=json.dumps({"consumerGroup": "CG_LOCK", "clientId": "client-A", "mqSet": mqs[:1]}).encode())
    assert resp.code == ResponseCode.SUCCESS
    assert lock("client-B") == {0}


def test_send_back_delay_level_and_dlq(broker: BrokerProc) -> None:
    """CONSUMER_SEND_MSG_BACK with delayLevel 0 schedules at level 3 + reconsumeTimes, a negative
    delayLevel goes straight to the DLQ, and so does a %RETRY% send that used up retryMaxTimes."""
    group = "CG_REQ_BACK"
    resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, v1(TOPIC), body=b"to be sent back")
    assert resp.code == ResponseCode.SUCCESS
    phy = phy_of(resp.ext_fields["msgId"])
    level3 = max_offset(broker, "SCHEDULE_TOPIC_XXXX", 2)
    back = rpc(broker.addr, RequestCode.CONSUMER_SEND_MSG_BACK,
               {"group": group, "offset": str(phy), "delayLevel": "0", "originMsgId": resp.ext_fields["msgId"],
                "originTopic": TOPIC})
    assert back.code == ResponseCode.SUCCESS, back
    assert max_offset(broker, "SCHEDULE_TOPIC_XXXX", 2) == level3 + 1  # level 3 is queue 2
    back = rpc(broker.addr, RequestCode.CONSUMER_SEND_MSG_BACK,
               {"group": group, "offset": str(phy), "delayLevel": "-1", "originMsgId": resp.ext_fields["msgId"],
                "originTopic": TOPIC})
    assert back.code == ResponseCode.SUCCESS, back
    assert max_offset(broker, f"%DLQ%{group}", 0) == 1
    resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, v1(f"%RETRY%{group}", reconsumeTimes="16"), body=b"tired")
    assert resp.code == ResponseCode.SUCCESS, resp
    assert max_offset(broker, f"%DLQ%{group}", 0) == 2


# ------------------------------------------------------------------ refused sends leave nothing behind
def _fresh(name: str) -> str:
    return f"Fresh{name}{time.monotonic_ns()}"


def _batch(*bodies: bytes) -> bytes:
    return encode_batch_body([BatchEntry(0, b, "TAGS\x01T") for b in bodies])


# (request code, header for a topic name, body, expected response code)
REFUSED_SENDS: dict[str, tuple[int, Callable[[str], dict[str, str]], bytes, int]] = {
    "oversized_body_v1": (RequestCode.SEND_MESSAGE, v1, b"x" * (MAX_MESSAGE_SIZE + 1),
                          ResponseCode.MESSAGE_ILLEGAL),
    "oversized_body_v2": (RequestCode.SEND_MESSAGE_V2, v2, b"x" * (MAX_MESSAGE_SIZE + 1),
                          ResponseCode.MESSAGE_ILLEGAL),
    "oversized_batch_entry": (RequestCode.SEND_BATCH_MESSAGE, lambda t: v2(t, batch=True),
                              _batch(b"ok", b"x" * (MAX_MESSAGE_SIZE + 1)), ResponseCode.MESSAGE_ILLEGAL),
    "malformed_batch_body": (RequestCode.SEND_BATCH_MESSAGE, lambda t: v2(t, batch=True), b"\x00\x00\x00\x07xx",
                             ResponseCode.MESSAGE_ILLEGAL),
    "oversized_properties": (RequestCode.SEND_MESSAGE, lambda t: v1(t, properties=PROPS + "BIG\x01" + "p" * 33000),
                             b"body", ResponseCode.MESSAGE_ILLEGAL),
    "oversized_multibyte_properties": (RequestCode.SEND_MESSAGE,
                                       lambda t: v1(t, properties=PROPS + "BIG\x01" + "\u00e9" * 16500),
                                       b"body", ResponseCode.MESSAGE_ILLEGAL),
    "illegal_topic_name": (RequestCode.SEND_MESSAGE, lambda t: v1(t.replace("Fresh", "Fresh bad ")), b"body",
                           ResponseCode.SYSTEM_ERROR),
    "queue_beyond_new_topic": (RequestCode.SEND_MESSAGE, lambda t: v1(t, 4), b"body", ResponseCode.SYSTEM_ERROR),
    "flag_out_of_range_v1": (RequestCode.SEND_MESSAGE, lambda t: v1(t, flag=str(2**31)), b"body",
                             ResponseCode.SYSTEM_ERROR),
    "born_timestamp_out_of_range_v2": (RequestCode.SEND_MESSAGE_V2, lambda t: v2(t, g=str(2**63)), b"body",
                                       ResponseCode.SYSTEM_ERROR),
    # With rejectTransactionMessage=true a half message is refused (transactions: test_transactions.py).
    "transaction_half_message": (RequestCode.SEND_MESSAGE, lambda t: v1(t, properties=PROPS + TX, sysFlag="4"),
                                 b"body", ResponseCode.NO_PERMISSION),
    "transaction_half_message_v2": (RequestCode.SEND_MESSAGE_V2, lambda t: v2(t, props=PROPS + TX, f="4"),
                                    b"body", ResponseCode.NO_PERMISSION),
}


@pytest.mark.parametrize("kind", sorted(REFUSED_SENDS))
def test_refused_send_to_fresh_topic_creates_nothing(broker: BrokerProc, namesrv: Namesrv, kind: str) -> None:
    """A send the broker refuses (oversized body, batch entry or properties, malformed batch,
    illegal topic name, queueId beyond the queues the topic would get, out-of-range header number)
    to a topic it would auto-create leaves no topic, no nameserver route and no stored bytes."""
    code, header, body, expected = REFUSED_SENDS[kind]
    ext = header(_fresh(kind.title().replace("_", "")))
    topic = ext.get("topic") or ext["b"]
    status = broker.status()
    resp = rpc(broker.addr, code, ext, body=body)
    assert resp.code == expected and resp.remark, resp
    after = broker.status()
    assert after["maxPhyOffset"] == status["maxPhyOffset"], "a refused send reached the store"
    assert after["topics"] == status["topics"], "a refused send auto-created its topic"
    # A topic auto-created by an accepted send reaches the nameserver: once it has, the refused
    # send's topic would have too, had it been created.
    control = _fresh("Control")
    ok = rpc(broker.addr, RequestCode.SEND_MESSAGE, v1(control), body=b"control")
    assert ok.code == ResponseCode.SUCCESS, ok
    wait_route(namesrv.addr, control)
    assert route(namesrv.addr, topic) is None, "the refused send's topic was registered"


@pytest.mark.parametrize("how", ["send", "batch", "update_topic"])
def test_created_topic_is_routed_when_the_request_is_answered(broker: BrokerProc, namesrv: Namesrv,
                                                              how: str) -> None:
    """As Java's broker, which registers a topic it creates before it answers the send (or
    UPDATE_AND_CREATE_TOPIC): the route is on the nameserver once the answer is back. Answered first,
    the README's quickstart (a consumer started right after the first send) found no route, and the
    stock C++ consumer got the message only at its route poll 10 s later. A send that waited for
    the route is stored once."""
    topic = _fresh(how.title().replace("_", ""))
    if how == "update_topic":
        create_topic(broker.addr, topic)
    else:
        code, ext, body = ((RequestCode.SEND_MESSAGE, v1(topic), b"routed") if how == "send" else
                           (RequestCode.SEND_BATCH_MESSAGE, v2(topic, batch=True), _batch(b"r1", b"r2")))
        resp = rpc(broker.addr, code, ext, body=body)
        assert resp.code == ResponseCode.SUCCESS, resp
    assert route(namesrv.addr, topic) is not None, "answered before the nameserver routed the new topic"
    if how != "update_topic":
        assert max_offset(broker, topic, 0) == (1 if how == "send" else 2)


def test_properties_just_under_the_limit_are_stored(broker: BrokerProc) -> None:
    """The early properties-length refusal refuses only what the store would: a long properties
    string within the limit is stored."""
    props = PROPS + "BIG\x01" + "p" * 32000
    resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, v1(TOPIC, properties=props), body=b"long props")
    assert resp.code == ResponseCode.SUCCESS, resp
    assert view(broker, phy_of(resp.ext_fields["msgId"])).properties["BIG"] == "p" * 32000


# ------------------------------------------------------------------ header numbers out of range
@pytest.mark.parametrize(("code", "override", "field"), [
    (RequestCode.SEND_MESSAGE, {"flag": str(2**31)}, "flag"),
    (RequestCode.SEND_MESSAGE, {"flag": str(-(2**31) - 1)}, "flag"),
    (RequestCode.SEND_MESSAGE, {"bornTimestamp": str(2**63)}, "bornTimestamp"),
    (RequestCode.SEND_MESSAGE, {"reconsumeTimes": str(2**31)}, "reconsumeTimes"),
    (RequestCode.SEND_MESSAGE, {"queueId": str(2**31)}, "queueId"),
    (RequestCode.SEND_MESSAGE, {"sysFlag": str(2**32)}, "sysFlag"),
    (RequestCode.SEND_MESSAGE_V2, {"h": str(2**31)}, "flag"),
    (RequestCode.SEND_MESSAGE_V2, {"g": str(-(2**63) - 1)}, "bornTimestamp"),
    (RequestCode.SEND_MESSAGE_V2, {"j": str(2**40)}, "reconsumeTimes"),
    (RequestCode.SEND_MESSAGE_V2, {"e": str(2**31)}, "queueId"),
    (RequestCode.SEND_MESSAGE_V2, {"f": str(2**31)}, "sysFlag"),
])
def test_out_of_range_header_number_is_a_header_error(broker: BrokerProc, code: int, override: dict[str, Any],
                                                      field: str) -> None:
    """A header number outside Java's int (long for bornTimestamp) is answered like a malformed
    field: SYSTEM_ERROR naming the field, counted as a header error (not a handler error), the
    store untouched, and the broker keeps taking sends."""
    status = broker.status()
    metrics = broker.metrics()
    ext = v1(TOPIC, **override) if code == RequestCode.SEND_MESSAGE else v2(TOPIC, **override)
    resp = rpc(broker.addr, code, ext, body=b"overflow")
    assert resp.code == ResponseCode.SYSTEM_ERROR, resp
    assert f"<{field}>" in (resp.remark or "") and "out of range" in (resp.remark or ""), resp.remark
    grew = counters(metrics, broker.metrics())
    assert grew["rmq_remoting_header_errors_total"] == 1, grew
    assert grew["rmq_remoting_handler_errors_total"] == 0, grew
    assert broker.status()["maxPhyOffset"] == status["maxPhyOffset"]
    ok = rpc(broker.addr, RequestCode.SEND_MESSAGE, v1(TOPIC), body=b"after overflow")
    assert ok.code == ResponseCode.SUCCESS
    assert view(broker, phy_of(ok.ext_fields["msgId"])).body == b"after overflow"


@pytest.mark.parametrize("code", [RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2])
def test_header_numbers_at_the_int_bounds_are_stored(broker: BrokerProc, code: int) -> None:
    """The range check takes the whole of Java's int: flags at its bounds are stored as sent."""
    for flag in (INT32_MAX, INT32_MIN):
        ext = v1(TOPIC, flag=str(flag)) if code == RequestCode.SEND_MESSAGE else v2(TOPIC, h=str(flag))
        resp = rpc(broker.addr, code, ext, body=b"bound")
        assert resp.code == ResponseCode.SUCCESS, resp
        assert view(broker, phy_of(resp.ext_fields["msgId"])).flag == flag


# ------------------------------------------------------------------ unusable bodies are counted
@pytest.mark.parametrize(("code", "ext", "body", "expected"), [
    (RequestCode.HEART_BEAT, {}, b"not json", ResponseCode.SYSTEM_ERROR),
    (RequestCode.HEART_BEAT, {}, b"[1,2]", ResponseCode.SYSTEM_ERROR),
    (RequestCode.HEART_BEAT, {}, b'{"consumerDataSet": 5}', ResponseCode.SYSTEM_ERROR),
    (RequestCode.HEART_BEAT, {}, json.dumps({"clientID": "c1", "consumerDataSet": [{
        "groupName": "CG_BAD_SUB", "subscriptionDataSet": [{"topic": TOPIC, "subString": "||"}]}]}).encode(),
     ResponseCode.SUBSCRIPTION_PARSE_FAILED),
    (RequestCode.LOCK_BATCH_MQ, {}, b"\xff\xfe", ResponseCode.SYSTEM_ERROR),
    (RequestCode.LOCK_BATCH_MQ, {}, json.dumps({"consumerGroup": "CG", "clientId": "c", "mqSet": [
        {"topic": TOPIC, "queueId": "zero"}]}).encode(), ResponseCode.SYSTEM_ERROR),
    (RequestCode.UNLOCK_BATCH_MQ, {}, b"{", ResponseCode.SYSTEM_ERROR),
    (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "T" * 128, "readQueueNums": "4", "writeQueueNums": "4",
                                           "perm": "6"}, b"", ResponseCode.SYSTEM_ERROR),
    (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "bad topic", "readQueueNums": "4", "writeQueueNums": "4",
                                           "perm": "6"}, b"", ResponseCode.SYSTEM_ERROR),
    (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "ZeroQueues", "readQueueNums": "0", "writeQueueNums": "4",
                                           "perm": "6"}, b"", ResponseCode.SYSTEM_ERROR),
])
def test_unusable_request_is_answered_and_counted(broker: BrokerProc, code: int, ext: dict[str, str], body: bytes,
                                                  expected: int) -> None:
    """A request whose body or argument cannot be used is answered with its error code and a
    remark, and counted once in rmq_remoting_bad_requests_total under its request code (not as a
    handler error); it creates no topic."""
    status = broker.status()
    metrics = broker.metrics()
    resp = rpc(broker.addr, code, ext, body=body)
    assert resp.code == expected and resp.remark, resp
    after = broker.metrics()
    assert metric_delta(metrics, after, "rmq_remoting_bad_requests_total", code=str(int(code))) == 1
    grew = counters(metrics, after)
    assert grew["rmq_remoting_bad_requests_total"] == 1, grew
    assert grew["rmq_remoting_handler_errors_total"] == 0, grew
    assert broker.status()["topics"] == status["topics"]


# ------------------------------------------------------------------ nameserver
def test_namesrv_closes_a_garbage_frame_and_keeps_serving(namesrv: Namesrv) -> None:
    """A frame whose header cannot be decoded closes that connection; the nameserver serves on."""
    with socket.create_connection(("127.0.0.1", namesrv.port), timeout=5) as s:
        s.sendall(struct.pack(">ii", 12, 8) + b"\x93garbage")
        s.settimeout(5)
        assert s.recv(100) == b""
    assert rpc(namesrv.addr, RequestCode.GET_BROKER_CLUSTER_INFO).code == ResponseCode.SUCCESS


def test_namesrv_query_data_version_and_unregister(broker: BrokerProc, namesrv: Namesrv) -> None:
    """QUERY_DATA_VERSION reports a stale version as changed; a broker that registers and then
    sends UNREGISTER_BROKER takes its topics' routes with it."""
    resp = rpc(namesrv.addr, RequestCode.QUERY_DATA_VERSION, {
        "brokerAddr": broker.addr, "brokerName": "broker-a", "brokerId": "0", "clusterName": "DefaultCluster"},
        body=json.dumps({"timestamp": 1, "counter": 1}).encode())
    assert resp.code == ResponseCode.SUCCESS and resp.ext_fields.get("changed") == "true", resp
    body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {"FakeTopic": {
        "topicName": "FakeTopic", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}},
        "dataVersion": {"timestamp": 1, "counter": 0}}, "filterServerList": []}).encode()
    ext = {"brokerAddr": "127.0.0.1:1", "brokerName": "fake", "brokerId": "0", "clusterName": "C2",
           "haServerAddr": "127.0.0.1:2", "compressed": "false"}

    async def go() -> tuple[int, int, bool]:
        c = RemotingClient()
        try:
            r1 = await c.invoke(namesrv.addr, RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=dict(ext),
                                                              body=body), 5)
            r2 = await c.invoke(namesrv.addr, RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                              ext_fields={"topic": "FakeTopic"}), 5)
            r3 = await c.invoke(namesrv.addr, RemotingCommand(RequestCode.UNREGISTER_BROKER, ext_fields={
                k: ext[k] for k in ("brokerAddr", "brokerName", "brokerId", "clusterName")}), 5)
            r4 = await c.invoke(namesrv.addr, RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                              ext_fields={"topic": "FakeTopic"}), 5)
            return r1.code, r2.code, (r3.code == 0 and r4.code == ResponseCode.TOPIC_NOT_EXIST)
        finally:
            await c.close()

    assert asyncio.run(go()) == (0, 0, True)


def _groups(broker: BrokerProc) -> dict[str, object]:
    code, body = broker.admin("/metadata")
    assert code == 200, body
    table: dict[str, object] = json.loads(body)["subscriptionGroups"]["subscriptionGroupTable"]
    return table


def test_refused_retry_send_creates_no_subscription_group(broker: BrokerProc) -> None:
    """A send to ``%RETRY%<group>`` refused for its properties leaves no auto-created group behind,
    while an accepted one to another new group does create it (autoCreateSubscriptionGroup)."""
    refused, accepted = _fresh("RefusedGroup"), _fresh("AcceptedGroup")
    resp = rpc(broker.addr, RequestCode.SEND_MESSAGE,
               v1(f"%RETRY%{refused}", properties=PROPS + "BIG\x01" + "p" * 33000), body=b"body")
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL and resp.remark, resp
    ok = rpc(broker.addr, RequestCode.SEND_MESSAGE, v1(f"%RETRY%{accepted}"), body=b"body")
    assert ok.code == ResponseCode.SUCCESS, ok
    groups = _groups(broker)
    assert accepted in groups
    assert refused not in groups


def test_half_messages_refused_with_reject_transaction_message(broker: BrokerProc) -> None:
    """With rejectTransactionMessage=true a half message fails at the producer with RocketMQ's
    answer; other sends that merely mention TRAN_MSG are stored."""
    topic = _fresh("Tx")
    create_topic(broker.addr, topic, queues=1)
    resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, v1(topic, properties=PROPS + TX, sysFlag="4"), body=b"half")
    assert (resp.code, resp.remark) == (ResponseCode.NO_PERMISSION,
                                        "the broker[127.0.0.1] sending transaction message is forbidden")
    end = rpc(broker.addr, RequestCode.END_TRANSACTION, {"producerGroup": "PG_TX", "tranStateTableOffset": "0",
                                                         "commitLogOffset": "0", "commitOrRollback": "8"})
    assert (end.code, end.remark) == (ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
    # RocketMQ's exception: a delayed retry of a transactional message (pre-4.6.1 clients) is stored.
    retry = v1(topic, properties=PROPS + TX + "DELAY\x011\x02", reconsumeTimes="1")
    assert rpc(broker.addr, RequestCode.SEND_MESSAGE, retry, body=b"retry").code == ResponseCode.SUCCESS
    plain = rpc(broker.addr, RequestCode.SEND_MESSAGE, v1(topic, properties=PROPS + "TRAN_MSG\x01false\x02"),
                body=b"not a half message")
    assert plain.code == ResponseCode.SUCCESS


def test_sql92_subscriptions_are_refused_with_rocketmqs_remark(broker: BrokerProc) -> None:
    """This broker filters by tag only. A Java consumer with an SQL92 selector is told so, as RocketMQ
    without enablePropertyFilter tells it: at its start (CHECK_CLIENT_CONFIG) and on every pull,
    instead of its expression being read as a tag that no message has."""
    topic = _fresh("Sql")
    create_topic(broker.addr, topic, queues=1)
    assert rpc(broker.addr, RequestCode.SEND_MESSAGE, v1(topic), body=b"m").code == ResponseCode.SUCCESS
    remark = "The broker does not support consumer to filter message by SQL92"
    sql = {"topic": topic, "subString": "a > 5", "expressionType": "SQL92", "subVersion": 1}

    def check(body: dict[str, Any]) -> tuple[int, str | None]:
        resp = rpc(broker.addr, RequestCode.CHECK_CLIENT_CONFIG, body=json.dumps(body).encode())
        return resp.code, resp.remark

    assert check({"clientId": "c1", "group": "CG_SQL", "subscriptionData": sql}) == (ResponseCode.SYSTEM_ERROR, remark)
    tag = {**sql, "subString": "TagX", "expressionType": "TAG"}
    assert check({"clientId": "c1", "group": "CG_SQL", "subscriptionData": tag})[0] == ResponseCode.SUCCESS

    pull = {"consumerGroup": "CG_SQL", "topic": topic, "queueId": "0", "queueOffset": "0", "maxMsgNums": "8",
            "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "a > 5",
            "subVersion": "1", "expressionType": "SQL92"}
    resp = rpc(broker.addr, RequestCode.PULL_MESSAGE, pull)
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, remark)
    resp = rpc(broker.addr, RequestCode.PULL_MESSAGE, {**pull, "subscription": "TagX", "expressionType": "TAG"})
    assert resp.code == ResponseCode.SUCCESS  # the tag the message carries

    async def registered_then_pulled() -> tuple[RemotingCommand, RemotingCommand]:
        """A heartbeat's SQL92 subscription, then a pull that relies on it, on one connection."""
        client = RemotingClient()
        try:
            heartbeat = {"clientID": "c-sql", "consumerDataSet": [{
                "groupName": "CG_SQL", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [sql]}]}
            beat = await client.invoke(broker.addr, RemotingCommand(RequestCode.HEART_BEAT,
                                                                    body=json.dumps(heartbeat).encode()), 5)
            assert beat.code == ResponseCode.SUCCESS
            conns = await client.invoke(broker.addr, RemotingCommand(
                RequestCode.GET_CONSUMER_CONNECTION_LIST, ext_fields={"consumerGroup": "CG_SQL"}), 5)
            pulled = await client.invoke(broker.addr, RemotingCommand(
                RequestCode.PULL_MESSAGE, ext_fields={**pull, "sysFlag": "0"}), 5)
            return conns, pulled
        finally:
            await client.close()

    conns, pulled = asyncio.run(registered_then_pulled())
    assert (pulled.code, pulled.remark) == (ResponseCode.SYSTEM_ERROR, remark)
    assert '"expressionType":"SQL92"' in bytes(conns.body).decode()
