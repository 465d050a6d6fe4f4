"""Bad input against a running broker: it is rejected, counted, leaves the store alone, and the
broker keeps serving everybody else."""

from __future__ import annotations

import gzip
import json
import socket
import struct
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand, decode_frame_payload, encode_frame
from rmqbroker.store.record import BatchEntry, decode_offset_msg_id, decode_record, encode_batch_body
from tests.conftest import Cluster
from tests.integration.helpers import message, metric_delta, poll, produce, pull_all, rpc, wait_route
from tests.support.procs import BrokerProc

MAX_MESSAGE_SIZE = 64 * 1024
GOOD_TOPIC = "GoodTopic"


@pytest.fixture(scope="module")
def env(module_cluster: Cluster) -> dict[str, Any]:
    ns = module_cluster.namesrv()
    broker = module_cluster.broker(ns.addr, maxMessageSize=MAX_MESSAGE_SIZE)
    return {"ns": ns, "broker": broker}


@pytest.fixture
def broker(env: dict[str, Any], shared_cluster: Cluster) -> BrokerProc:
    b: BrokerProc = env["broker"]
    return b


def send_ext(topic: str, queue_id: int = 0, /, **override: str | None) -> dict[str, str]:
    ext = {
        "producerGroup": "PG_RAW", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": str(queue_id), "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
        "properties": "KEYS\x01raw\x02WAIT\x01true\x02", "reconsumeTimes": "0", "unitMode": "false",
        "batch": "false",
    }
    for key, value in override.items():
        if value is None:
            ext.pop(key, None)
        else:
            ext[key] = value
    return ext


def raw_frame(header: dict[str, Any] | bytes, body: bytes = b"", serialize_type: int = 0,
              header_len: int | None = None) -> bytes:
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    hlen = len(head) if header_len is None else header_len
    return struct.pack(">ii", 4 + len(head) + len(body), (serialize_type << 24) | hlen) + head + body


def connect(broker: BrokerProc) -> socket.socket:
    return socket.create_connection(("127.0.0.1", broker.port), timeout=5)


def closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    """True when the broker closes the connection within ``timeout`` (any bytes it sends are skipped)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the broker")
        buf += chunk
    return buf


def read_response(sock: socket.socket) -> RemotingCommand:
    (length,) = struct.unpack(">i", recv_exact(sock, 4))
    return decode_frame_payload(recv_exact(sock, length))


def assert_serves(broker: BrokerProc) -> None:
    """A well-formed send still works, and it does reach the store."""
    before = broker.status()["maxPhyOffset"]
    resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, send_ext(GOOD_TOPIC), body=b"still serving")
    assert resp.code == ResponseCode.SUCCESS, resp
    assert broker.status()["maxPhyOffset"] > before


@contextmanager
def rejected_and_counted(broker: BrokerProc, metric: str, **labels: str) -> Iterator[None]:
    """The block's input must bump ``metric`` by one and change neither the store nor the topics."""
    status = broker.status()
    metrics = broker.metrics()
    yield
    poll(lambda: metric_delta(metrics, broker.metrics(), metric, **labels) >= 1, timeout=5,
         what=f"{metric}{labels} to increase")
    assert metric_delta(metrics, broker.metrics(), metric, **labels) == 1
    after = broker.status()
    assert after["maxPhyOffset"] == status["maxPhyOffset"], "a rejected request reached the store"
    assert after["topics"] == status["topics"], "a rejected request created a topic"
    assert_serves(broker)


def test_broker_serves_before_bad_input(broker: BrokerProc) -> None:
    assert_serves(broker)


# ---------------------------------------------------------------- framing errors: connection closed
_HEADER = {"flag": 0, "language": "CPP", "opaque": 1, "version": 63, "remark": ""}

FRAMING_ERRORS: dict[str, tuple[bytes, str]] = {
    "oversized length": (struct.pack(">ii", 16 * 1024 * 1024 + 1, 20) + b"{" * 20, "bad_length"),
    "negative length": (struct.pack(">i", -16) + b"\x00" * 12, "bad_length"),
    "length smaller than header word": (struct.pack(">ii", 2, 0), "bad_length"),
    "http request": (b"GET /metrics HTTP/1.1\r\nHost: broker\r\n\r\n", "bad_length"),
    "garbage header bytes": (raw_frame(b"\x93\x00\xffgarbage\x01"), "bad_header"),
    "unknown serialize type": (raw_frame({**_HEADER, "code": 10}, serialize_type=7), "bad_header"),
    "header longer than frame": (raw_frame({**_HEADER, "code": 10}, header_len=4000), "bad_header"),
    "header is a JSON list": (raw_frame(b"[10, 0, 1]"), "bad_header"),
    "code is a string": (raw_frame({**_HEADER, "code": "x"}), "bad_header"),
    "opaque is a string": (raw_frame({**_HEADER, "code": 10, "opaque": "1"}), "bad_header"),
    "extFields is a list": (raw_frame({**_HEADER, "code": 10, "extFields": ["topic", "T"]}), "bad_header"),
    "extFields value is an object": (raw_frame({**_HEADER, "code": 10, "extFields": {"topic": {"a": 1}}}),
                                     "bad_header"),
    "truncated binary header": (raw_frame(struct.pack(">hbhii", 10, 0, 63, 1, 0), serialize_type=1),
                                "bad_header"),
}


@pytest.mark.parametrize("case", list(FRAMING_ERRORS))
def test_framing_error_closes_connection(broker: BrokerProc, case: str) -> None:
    data, reason = FRAMING_ERRORS[case]
    with rejected_and_counted(broker, "rmq_malformed_frames_total", reason=reason), connect(broker) as sock:
        sock.sendall(data)
        assert closed_by_peer(sock), "the broker kept a connection that sent a malformed frame"


def test_truncated_frame_closed_when_peer_closes(broker: BrokerProc) -> None:
    with rejected_and_counted(broker, "rmq_malformed_frames_total", reason="truncated"), connect(broker) as sock:
        frame = encode_frame(RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields=send_ext(GOOD_TOPIC),
                                             body=b"never complete"))
        sock.sendall(frame[:-5])
        # an incomplete frame is simply waited for ...
        assert not closed_by_peer(sock, timeout=0.3)
        # ... until the peer gives up: then the broker closes its side too
        sock.shutdown(socket.SHUT_WR)
        assert closed_by_peer(sock)


def test_frames_split_across_writes_are_reassembled(broker: BrokerProc) -> None:
    frame = encode_frame(RemotingCommand(RequestCode.GET_MAX_OFFSET, opaque=7,
                                         ext_fields={"topic": GOOD_TOPIC, "queueId": "0"}))
    with connect(broker) as sock:
        for i in range(len(frame)):
            sock.sendall(frame[i:i + 1])
            if i % 16 == 0:
                time.sleep(0.001)
        resp = read_response(sock)
    assert resp.code == ResponseCode.SUCCESS and resp.opaque == 7 and int(resp.ext_fields["offset"]) >= 0


# ---------------------------------------------------------------- request errors: answered, connection kept
def test_unknown_request_code(broker: BrokerProc) -> None:
    with rejected_and_counted(broker, "rmq_remoting_unsupported_codes_total"), connect(broker) as sock:
        sock.sendall(encode_frame(RemotingCommand(9999, opaque=41, language="CPP")))
        resp = read_response(sock)
        assert (resp.code, resp.opaque, resp.is_response) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, 41, True)
        assert "9999" in (resp.remark or "") and "not supported" in (resp.remark or "")
        # the same connection keeps working
        sock.sendall(encode_frame(RemotingCommand(RequestCode.GET_MAX_OFFSET, opaque=42,
                                                  ext_fields={"topic": GOOD_TOPIC, "queueId": "0"})))
        resp = read_response(sock)
        assert (resp.code, resp.opaque) == (ResponseCode.SUCCESS, 42)


@pytest.mark.parametrize(("override", "field"), [
    ({"topic": None}, "topic"),
    ({"queueId": None}, "queueId"),
    ({"defaultTopic": None}, "defaultTopic"),
    ({"bornTimestamp": None}, "bornTimestamp"),
    ({"flag": None}, "flag"),
    ({"queueId": "first"}, "queueId"),
    ({"sysFlag": "1.5"}, "sysFlag"),
    ({"reconsumeTimes": "many"}, "reconsumeTimes"),
])
def test_send_with_missing_or_malformed_header_field(broker: BrokerProc, override: dict[str, str | None],
                                                     field: str) -> None:
    # a topic the broker would auto-create: a rejected send must not create it
    topic = f"Fresh-{field}"
    with rejected_and_counted(broker, "rmq_remoting_header_errors_total"):
        resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, send_ext(topic, **override), body=b"body")
        assert resp.code == ResponseCode.SYSTEM_ERROR, resp
        assert field in (resp.remark or ""), resp.remark


@pytest.mark.parametrize("topic", [
    "T" * 128,
    "bad topic",
    "bad/topic",
    "tópico",
    "semi;colon",
    " ",
])
def test_send_to_illegal_topic_name(broker: BrokerProc, topic: str) -> None:
    with rejected_and_counted(broker, "rmq_send_rejected_total", code=str(int(ResponseCode.SYSTEM_ERROR))):
        resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, send_ext(topic), body=b"body")
        assert resp.code == ResponseCode.SYSTEM_ERROR, resp
        assert resp.remark and "topic" in resp.remark.lower(), resp.remark


def test_longest_legal_topic_name_is_accepted(broker: BrokerProc) -> None:
    topic = "L" * 127
    resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, send_ext(topic), body=b"long topic name")
    assert resp.code == ResponseCode.SUCCESS, resp


def test_body_over_max_message_size(broker: BrokerProc) -> None:
    with rejected_and_counted(broker, "rmq_send_rejected_total", code=str(int(ResponseCode.MESSAGE_ILLEGAL))):
        resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, send_ext(GOOD_TOPIC), body=b"x" * (MAX_MESSAGE_SIZE + 1))
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL, resp
        assert resp.remark
    # exactly the limit is fine
    resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, send_ext(GOOD_TOPIC), body=b"x" * MAX_MESSAGE_SIZE)
    assert resp.code == ResponseCode.SUCCESS, resp


def view_body(broker: BrokerProc, offset_msg_id: str) -> bytes:
    """The stored body of the message with this offset message id, as VIEW_MESSAGE_BY_ID reads it."""
    resp = rpc(broker.addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(decode_offset_msg_id(offset_msg_id)[2])})
    assert resp.code == ResponseCode.SUCCESS, resp
    return decode_record(bytes(resp.body), 0).body


@pytest.mark.parametrize(("case", "body"), [
    ("not zlib", b"not-zlib"),
    ("gzip", gzip.compress(b"y" * 5000)),
    ("too short", zlib.compress(b"")[:7]),
])
def test_compressed_body_that_is_not_zlib_is_illegal(broker: BrokerProc, case: str, body: bytes) -> None:
    """A consumer given a compressed body that does not inflate stalls on its queue (the stock C++
    one does): a body flagged compressed must at least start as a zlib stream."""
    with rejected_and_counted(broker, "rmq_send_rejected_total", code=str(int(ResponseCode.MESSAGE_ILLEGAL))):
        resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, send_ext(GOOD_TOPIC, sysFlag="1"), body=body)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL, (case, resp)
        assert resp.remark and "not a zlib stream" in resp.remark


def test_compressed_body_that_inflates_is_stored_as_sent(broker: BrokerProc) -> None:
    body = zlib.compress(b"z" * MAX_MESSAGE_SIZE)
    resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, send_ext(GOOD_TOPIC, sysFlag="1"), body=body)
    assert resp.code == ResponseCode.SUCCESS, resp
    assert zlib.decompress(view_body(broker, resp.ext_fields["msgId"])) == b"z" * MAX_MESSAGE_SIZE
    # RocketMQ 5's LZ4/ZSTD bodies (compression type in bits 8-10) are not zlib's to check.
    resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, send_ext(GOOD_TOPIC, sysFlag=str(1 | 2 << 8)), body=b"zstd?")
    assert resp.code == ResponseCode.SUCCESS, resp


@pytest.mark.parametrize(("case", "sys_flag", "body"), [
    ("plain, over maxMessageSize", "0", encode_batch_body([BatchEntry(0, bytes(40_000), "") for _ in range(2)])),
    ("compressed, inflates past maxMessageSize", "1",
     zlib.compress(encode_batch_body([BatchEntry(0, bytes(60_000), "") for _ in range(40)]), 9)),
])
def test_batch_over_max_message_size_is_illegal(broker: BrokerProc, case: str, sys_flag: str, body: bytes) -> None:
    """Java's checkMessages refuses a batch body over maxMessageSize; a compressed one is inflated
    no further than that (a few kilobytes of zeros could otherwise hold the loop for minutes)."""
    with rejected_and_counted(broker, "rmq_send_rejected_total", code=str(int(ResponseCode.MESSAGE_ILLEGAL))):
        resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, send_ext(GOOD_TOPIC, sysFlag=sys_flag, batch="true"),
                   body=body)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL, (case, resp)
        assert resp.remark and str(MAX_MESSAGE_SIZE) in resp.remark, resp.remark


@pytest.mark.parametrize("topic", ["SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "OFFSET_MOVED_EVENT"])
def test_send_to_system_topic_is_forbidden(broker: BrokerProc, topic: str) -> None:
    with rejected_and_counted(broker, "rmq_send_rejected_total", code=str(int(ResponseCode.NO_PERMISSION))):
        resp = rpc(broker.addr, RequestCode.SEND_MESSAGE, send_ext(topic, **{"properties": "DELAY\x011\x02"}),
                   body=b"sneaky")
        assert resp.code == ResponseCode.NO_PERMISSION, resp
        assert resp.remark and topic in resp.remark


def test_stock_client_works_after_bad_input(env: dict[str, Any], shared_cluster: Cluster) -> None:
    ns = env["ns"]
    sent = [message("AfterBadInput", f"fine-{i}", keys=f"k{i}", tags="TagF") for i in range(4)]
    results = produce(ns.addr, sent)
    assert all(r is not None and r["status"] == 0 for r in results)
    wait_route(ns.addr, "AfterBadInput")
    assert sorted(m["body"] for m in pull_all(ns.addr, "AfterBadInput")) == sorted(s["body"] for s in sent)


def test_idle_and_stalled_connections_are_closed_and_counted(cluster: Cluster) -> None:
    """serverChannelMaxIdleTimeSeconds (Java's, default 120 s; 2 s here): a peer that stops half way
    through a frame, holding its buffered bytes, is closed and counted as a stalled frame; one that
    sends nothing, or nothing more, is closed as idle; one that keeps sending requests is left alone. The nameserver
    does the same."""
    broker = cluster.broker(None, serverChannelMaxIdleTimeSeconds=2)
    before = broker.metrics()
    stalled, silent, quiet, busy = connect(broker), connect(broker), connect(broker), connect(broker)
    frame = raw_frame({"code": int(RequestCode.GET_BROKER_RUNTIME_INFO), "flag": 0, "opaque": 1, "language": "JAVA",
                       "version": 409, "extFields": {}}, body=b"b" * 100_000)
    stalled.sendall(frame[:50_000])
    quiet.sendall(frame)  # one request answered, then nothing
    assert read_response(quiet).code == ResponseCode.SUCCESS
    started = time.monotonic()
    for i in range(8):  # 4 s of a request every 0.5 s: never quiet for 2 s
        busy.sendall(raw_frame({"code": int(RequestCode.GET_BROKER_RUNTIME_INFO), "flag": 0, "opaque": 10 + i,
                                "language": "JAVA", "version": 409, "extFields": {}}))
        assert read_response(busy).code == ResponseCode.SUCCESS
        time.sleep(0.5)
    assert all(closed_by_peer(s, timeout=0.1) for s in (stalled, silent, quiet))
    assert time.monotonic() - started < 8
    busy.sendall(raw_frame({"code": int(RequestCode.GET_BROKER_RUNTIME_INFO), "flag": 0, "opaque": 99,
                            "language": "JAVA", "version": 409, "extFields": {}}))
    assert read_response(busy).code == ResponseCode.SUCCESS
    busy.close()
    after = broker.metrics()
    assert metric_delta(before, after, "rmq_malformed_frames_total", reason="stalled") == 1
    assert metric_delta(before, after, "rmq_remoting_idle_closed_total") == 2  # silent and quiet
    assert "malformed frame (stalled: no complete frame for 2s, 50000 bytes of one pending)" in broker.log_text()

    ns = cluster.namesrv(extra_args=["--server-channel-max-idle-seconds", "1"])
    host, port = ns.addr.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(frame[:1000])
        assert closed_by_peer(s, timeout=5)
    assert "serverChannelMaxIdleTimeSeconds=1" in bytes(rpc(ns.addr, RequestCode.GET_NAMESRV_CONFIG).body).decode()
