"""Finding messages as RocketMQ operators do, against real processes: the stock C++ producer sends
messages with keys; ``rmq-admin queryMsgByKey`` / ``queryMsgByUniqueKey`` / ``queryMsgById`` find
them through QUERY_MESSAGE (12) and VIEW_MESSAGE_BY_ID (33); a slave answers from the index it
built from the replicated log; unknown keys and bad requests get RocketMQ's answers."""

from __future__ import annotations

import time
from typing import Any

import pytest

from rmqbroker.admin_cli import main as rmq_admin
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.store.record import decode_offset_msg_id, iter_records, offset_msg_id
from tests.conftest import Cluster
from tests.integration.helpers import create_topic_and_wait, message, produce, rpc, send_raw, wait_caught_up
from tests.support.procs import free_port

TOPIC = "QueryTopic"


def msg_id(result: dict[str, Any] | None) -> str:
    """The message id of a send the client reported (None: it reported none)."""
    assert result is not None
    return str(result["msg_id"])


def query(addr: str, key: str, *, unique: bool = False, begin: int = 0,
          end: int | None = None) -> tuple[int, list[Any]]:
    ext = {"topic": TOPIC, "key": key, "maxNum": "64", "beginTimestamp": str(begin),
           "endTimestamp": str(end if end is not None else int(time.time() * 1000) + 60_000)}
    if unique:
        ext["_UNIQUE_KEY_QUERY"] = "true"
    resp = rpc(addr, RequestCode.QUERY_MESSAGE, ext)
    assert "indexLastUpdatePhyoffset" in resp.ext_fields and "indexLastUpdateTimestamp" in resp.ext_fields
    return resp.code, list(iter_records(bytes(resp.body))) if resp.code == ResponseCode.SUCCESS else []


def test_messages_are_found_by_key_unique_key_and_offset_id(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    ns = cluster.namesrv()
    master = cluster.broker(ns.addr, name="broker-q", maxHashSlotNum=97, maxIndexNum=50)
    slave = cluster.broker(ns.addr, name="broker-q", broker_id=1, role="SLAVE", maxHashSlotNum=97, maxIndexNum=50,
                           haMasterAddress=f"127.0.0.1:{master.port + 1}")
    create_topic_and_wait(master.addr, ns.addr, TOPIC, queues=4)
    sent = produce(ns.addr, [message(TOPIC, f"body-{i}", keys=f"order-{i} batch-A", tags="TagQ")
                             for i in range(30)])
    assert all(r is not None and r["status"] == 0 for r in sent)
    raw = send_raw(master.addr, TOPIC, b"raw body")  # its answer carries the broker's offset message id
    assert raw.code == ResponseCode.SUCCESS
    n = ("-n", ns.addr)

    assert rmq_admin(["queryMsgByKey", *n, "-t", TOPIC, "-k", "order-7"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[1:]]
    assert len(rows) == 1 and rows[0][0] == msg_id(sent[7]) and rows[0][-2:] == ["order-7", "batch-A"]

    assert rmq_admin(["queryMsgByKey", *n, "-t", TOPIC, "-k", "batch-A"]) == 0
    ids = {line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]}
    assert ids == {r["msg_id"] for r in sent if r is not None}
    assert len(list((master.store_dir / "index").iterdir())) >= 2  # the chains cross index files

    assert rmq_admin(["queryMsgByUniqueKey", *n, "-t", TOPIC, "-i", msg_id(sent[3])]) == 0
    out = capsys.readouterr().out
    assert "order-3 batch-A" in out and "TagQ" in out and f"Message ID:         {msg_id(sent[3])}" in out
    # ... with the broker's offset message id, which queryMsgById takes.
    offset_id = next(line.split()[1] for line in out.splitlines() if line.startswith("OffsetID:"))
    assert decode_offset_msg_id(offset_id)[:2] == ("127.0.0.1", master.port)
    assert rmq_admin(["queryMsgById", *n, "-i", offset_id]) == 0
    assert f"Message ID:         {msg_id(sent[3])}" in capsys.readouterr().out

    assert rmq_admin(["queryMsgById", *n, "-i", raw.ext_fields["msgId"]]) == 0
    out = capsys.readouterr().out
    assert f"Topic:              {TOPIC}" in out and "Body Length:        8" in out
    # An id that names no broker (as a client's message id does): the error says what to use.
    assert rmq_admin(["queryMsgById", *n, "-i", offset_msg_id("127.0.0.1", free_port(), 0)]) == 1
    assert "for the client's message id use queryMsgByUniqueKey" in capsys.readouterr().err

    assert rmq_admin(["queryMsgByKey", *n, "-t", TOPIC, "-k", "no-such-key"]) == 1
    assert "no message" in capsys.readouterr().err

    # The slave indexed the replicated records itself.
    wait_caught_up(master, [slave])
    code, records = query(slave.addr, "order-12")
    assert code == ResponseCode.SUCCESS and [r.body for r in records] == [b"body-12"]
    code, records = query(slave.addr, msg_id(sent[5]), unique=True)
    assert code == ResponseCode.SUCCESS and [r.body for r in records] == [b"body-5"]

    # RocketMQ's answers: nothing in range, nothing under the key, a request without a key.
    code, _ = query(master.addr, "order-1", begin=int(time.time() * 1000) + 3_600_000)
    assert code == ResponseCode.QUERY_NOT_FOUND
    resp = rpc(master.addr, RequestCode.QUERY_MESSAGE, {"topic": TOPIC, "key": "missing", "maxNum": "32",
                                                        "beginTimestamp": "0", "endTimestamp": str(1 << 62)})
    assert (resp.code, resp.remark) == (ResponseCode.QUERY_NOT_FOUND,
                                        "can not find message, maybe time range not correct")
    resp = rpc(master.addr, RequestCode.QUERY_MESSAGE, {"topic": TOPIC, "maxNum": "32", "beginTimestamp": "0",
                                                        "endTimestamp": "1"})
    assert resp.code == ResponseCode.SYSTEM_ERROR and "key" in (resp.remark or "")
    # The broker survived all of it.
    assert send_raw(master.addr, TOPIC, b"still here").code == ResponseCode.SUCCESS


def test_index_pages_lost_with_the_machine_are_built_again(cluster: Cluster) -> None:
    """kill -9, then what a crash of the machine leaves of the newest index file: its slot pages and
    newer entries never reached the disk. The abort marker names another boot, so the restarted
    broker builds that file again from the commitlog and every message is found by key again."""
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr, name="broker-crash", maxHashSlotNum=97, maxIndexNum=200)
    create_topic_and_wait(broker.addr, ns.addr, TOPIC, queues=2)
    sent = produce(ns.addr, [message(TOPIC, f"body-{i}", keys=f"order-{i}") for i in range(150)])
    assert all(r is not None and r["status"] == 0 for r in sent)
    broker.kill9()
    index_dir = broker.store_dir / "index"
    files = sorted(index_dir.iterdir())
    assert len(files) >= 2  # full files were flushed when they filled: those survive a crash
    newest = bytearray(files[-1].read_bytes())
    slots_end = 40 + 97 * 4
    newest[40:slots_end] = bytes(slots_end - 40)
    newest[slots_end + 20 * 20:] = bytes(len(newest) - slots_end - 20 * 20)
    files[-1].write_bytes(newest)
    abort = broker.store_dir / "abort"
    assert abort.exists()
    abort.write_text("a-boot-before-the-machine-crashed")

    broker.start()
    for i in range(150):
        code, records = query(broker.addr, f"order-{i}")
        assert code == ResponseCode.SUCCESS and [r.body for r in records] == [f"body-{i}".encode()], i
    code, records = query(broker.addr, msg_id(sent[77]), unique=True)
    assert code == ResponseCode.SUCCESS and [r.body for r in records] == [b"body-77"]
    assert "indexed commitlog" in broker.log_text()
