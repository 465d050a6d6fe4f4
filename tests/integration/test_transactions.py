"""Transactional messages against real processes, on the wire as RocketMQ's TransactionMQProducer
speaks it (the stock Python binding has no transactional producer): a half message stays invisible
until END_TRANSACTION commits it; a rollback drops it; a half left open is checked back with the
producer (CHECK_TRANSACTION_STATE) and committed from its answer; one never answered is given up
after transactionCheckMax checks; a slave replicates the outcome and refuses END_TRANSACTION."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from rmqbroker.remoting import wire
from rmqbroker.remoting.client import RemotingClient
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.store.record import decode_offset_msg_id, decode_record, iter_records, offset_msg_id
from tests.conftest import Cluster
from tests.integration.helpers import create_topic, poll, rpc, wait_caught_up
from tests.support.procs import BrokerProc, metric_value

TOPIC = "TxTopic"
GROUP = "PG_TX"
COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0


class TxProducer:
    """What a TransactionMQProducer does on the wire: heartbeat as a producer, half sends,
    END_TRANSACTION, and answers to the broker's CHECK_TRANSACTION_STATE."""

    def __init__(self, addr: str, answer: int | None, group: str = GROUP) -> None:
        self.addr = addr
        self.group = group
        self.answer = answer  # the state a check gets (None: never answered)
        self.checks: list[RemotingCommand] = []
        self.client = RemotingClient(on_request=self._on_request)

    def _on_request(self, addr: str, cmd: RemotingCommand) -> None:
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
            return
        self.checks.append(cmd)
        if self.answer is not None:
            ext = cmd.ext_fields
            asyncio.get_running_loop().create_task(self.end(
                int(ext["tranStateTableOffset"]), int(ext["commitLogOffset"]), self.answer, from_check=True))

    async def heartbeat(self) -> None:
        body = {"clientID": "tx-client@1", "language": "JAVA", "version": 409,
                "producerDataSet": [{"groupName": self.group}], "consumerDataSet": []}
        resp = await self.client.invoke(self.addr, RemotingCommand(RequestCode.HEART_BEAT,
                                                                   body=json.dumps(body).encode()), 5)
        assert resp.code == ResponseCode.SUCCESS

    async def half(self, body: bytes, key: str) -> tuple[int, int]:
        """Send a half message; its (queue offset, commitlog offset) from the answer."""
        props = f"UNIQ_KEY\x01{key}\x02KEYS\x01{key}\x02TRAN_MSG\x01true\x02PGROUP\x01{self.group}\x02"
        ext = {"producerGroup": self.group, "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
               "queueId": "0", "sysFlag": "4", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
               "properties": props}
        resp = await self.client.invoke(self.addr, RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields=ext,
                                                                   body=body), 5)
        assert resp.code == ResponseCode.SUCCESS, resp
        assert resp.ext_fields["queueId"] == "0"  # the queue it was sent to
        return int(resp.ext_fields["queueOffset"]), decode_offset_msg_id(resp.ext_fields["msgId"])[2]

    async def end(self, table_offset: int, phy: int, state: int, *, from_check: bool = False,
                  group: str = GROUP) -> RemotingCommand:
        ext = {"producerGroup": group, "tranStateTableOffset": str(table_offset), "commitLogOffset": str(phy),
               "commitOrRollback": str(state), "fromTransactionCheck": "true" if from_check else "false"}
        return await self.client.invoke(self.addr, RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=ext), 5)


def delivered(addr: str) -> list[Any]:
    """The messages a consumer of TOPIC queue 0 gets, from the start."""
    pull = {"consumerGroup": "CG_TX", "topic": TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
            "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*",
            "subVersion": "0"}
    resp = rpc(addr, RequestCode.PULL_MESSAGE, pull)
    return list(iter_records(bytes(resp.body))) if resp.code == ResponseCode.SUCCESS else []


def broker_with_slave(cluster: Cluster, **conf: Any) -> tuple[BrokerProc, BrokerProc]:
    ns = cluster.namesrv()
    tx = {"transactionCheckInterval": 300, "transactionTimeOut": 800, **conf}
    master = cluster.broker(ns.addr, name="broker-tx", **tx)
    slave = cluster.broker(ns.addr, name="broker-tx", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}", **tx)
    create_topic(master.addr, TOPIC, queues=1)
    return master, slave


def test_a_repeated_end_after_check_rounds_and_a_restart_stores_nothing_twice(cluster: Cluster) -> None:
    """Check rounds move their progress past settled halves (and forget them in memory), and a
    restart forgets them too: an END_TRANSACTION repeated after either still finds the half's op
    and stores no second copy."""
    master, _slave = broker_with_slave(cluster)

    async def commit() -> list[int]:
        p = TxProducer(master.addr, answer=COMMIT)
        await p.heartbeat()
        half = await p.half(b"once", "TX-ONCE")
        assert (await p.end(*half, COMMIT)).code == ResponseCode.SUCCESS
        await p.client.close()
        return list(half)

    a = asyncio.run(commit())
    # The check's progress passes the settled half (every 300 ms).
    poll(lambda: rpc(master.addr, RequestCode.QUERY_CONSUMER_OFFSET, {
        "consumerGroup": "CID_RMQ_SYS_TRANS", "topic": "RMQ_SYS_TRANS_HALF_TOPIC", "queueId": "0"},
    ).ext_fields.get("offset") == str(a[0] + 1), 10, what="check progress past the half")
    time.sleep(0.7)  # and at least one more round

    async def repeat() -> int:
        p = TxProducer(master.addr, answer=COMMIT)
        code = (await p.end(a[0], a[1], COMMIT)).code
        await p.client.close()
        return code

    assert asyncio.run(repeat()) == ResponseCode.SUCCESS
    assert [r.body for r in delivered(master.addr)] == [b"once"]
    master.stop()
    master.start()
    assert asyncio.run(repeat()) == ResponseCode.SUCCESS
    assert [r.body for r in delivered(master.addr)] == [b"once"]


def test_commit_rollback_and_a_check_back(cluster: Cluster) -> None:
    master, slave = broker_with_slave(cluster)

    halves: list[tuple[int, int]] = []

    async def scenario() -> TxProducer:
        p = TxProducer(master.addr, answer=COMMIT)
        await p.heartbeat()
        a = await p.half(b"committed", "TX-A")
        assert await asyncio.to_thread(delivered, master.addr) == []  # a half message is invisible
        assert (await p.end(*a, COMMIT)).code == ResponseCode.SUCCESS
        b = await p.half(b"rolled back", "TX-B")
        assert (await p.end(*b, ROLLBACK)).code == ResponseCode.SUCCESS
        assert (await p.end(*a, COMMIT)).code == ResponseCode.SUCCESS  # repeated: not stored twice
        # Refused: another group, a wrong table offset, an offset that holds no half message.
        resp = await p.end(*a, COMMIT, group="PG_OTHER")
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        resp = await p.end(a[0] + 7, a[1], COMMIT)
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong")
        resp = await p.end(0, 10**9, COMMIT)
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
        # Left open (the producer's state unknown): the broker asks, and the answer commits it.
        c = await p.half(b"checked back", "TX-C")
        halves.extend([a, c])
        await p.client.invoke_oneway(master.addr, RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={
            "producerGroup": GROUP, "tranStateTableOffset": str(c[0]), "commitLogOffset": str(c[1]),
            "commitOrRollback": str(UNKNOWN), "fromTransactionCheck": "false"}))
        for _ in range(150):  # the check runs every 300 ms for halves older than 800 ms
            if len(await asyncio.to_thread(delivered, master.addr)) >= 2:
                break
            await asyncio.sleep(0.1)
        return p

    async def run() -> TxProducer:
        p = await scenario()
        await p.client.close()
        return p

    p = asyncio.run(run())
    got = delivered(master.addr)
    assert [r.body for r in got] == [b"committed", b"checked back"]
    assert [r.prepared_transaction_offset for r in got] == [phy for _, phy in halves]  # each names its half
    for r in got:
        assert r.topic == TOPIC and r.sys_flag & 0xC == COMMIT
        assert "TRAN_MSG" not in r.properties and "REAL_TOPIC" not in r.properties
        assert r.properties["PGROUP"] == GROUP
    check = p.checks[0]
    checked = decode_record(bytes(check.body))
    assert (checked.topic, checked.body, checked.properties["UNIQ_KEY"]) == (TOPIC, b"checked back", "TX-C")
    assert check.ext_fields["transactionId"] == "TX-C" and int(check.ext_fields["commitLogOffset"]) > 0

    # The slave holds the same outcome; it relays a transaction's end to its master (a producer
    # with a stale route after a hand-over), and refuses one another broker relayed to it.
    wait_caught_up(master, [slave])
    resp = rpc(slave.addr, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": "0"})
    assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["offset"] == "2"
    end = {"producerGroup": GROUP, "tranStateTableOffset": "0", "commitLogOffset": str(1 << 40),
           "commitOrRollback": "8"}
    resp = rpc(slave.addr, RequestCode.END_TRANSACTION, end)
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
    resp = rpc(slave.addr, RequestCode.END_TRANSACTION, {**end, wire.RELAYED_BY: "127.0.0.1:1"})
    assert resp.code == ResponseCode.SLAVE_NOT_AVAILABLE
    # Every half is settled: the next check round moves its progress past them all.
    def progress() -> str | None:
        resp = rpc(master.addr, RequestCode.QUERY_CONSUMER_OFFSET, {
            "consumerGroup": "CID_RMQ_SYS_TRANS", "topic": "RMQ_SYS_TRANS_HALF_TOPIC", "queueId": "0"})
        return resp.ext_fields.get("offset") if resp.code == ResponseCode.SUCCESS else None

    poll(lambda: progress() == "3", 10, what="the check's progress past the three halves")
    metrics = master.metrics()
    assert metric_value(metrics, "rmq_transactions_committed_total") == 2
    assert metric_value(metrics, "rmq_transactions_rolled_back_total") == 1
    assert metric_value(metrics, "rmq_transaction_checks_total") >= 1
    assert metric_value(metrics, "rmq_store_index_failures_total") == 0  # every record indexed


def test_a_half_never_answered_is_given_up_and_a_restart_keeps_the_outcome(cluster: Cluster) -> None:
    master, _slave = broker_with_slave(cluster, transactionCheckMax=2)

    async def scenario() -> TxProducer:
        p = TxProducer(master.addr, answer=None)
        await p.heartbeat()
        await p.half(b"never answered", "TX-D")
        for _ in range(75):
            if "given up" in master.log_text():
                break
            await asyncio.sleep(0.2)
        await p.client.close()
        return p

    p = asyncio.run(scenario())
    assert len(p.checks) == 2 and "given up" in master.log_text()
    assert metric_value(master.metrics(), "rmq_transactions_given_up_total") == 1
    assert delivered(master.addr) == []
    # A restarted master neither delivers it nor asks again.
    master.kill9()
    master.start()

    async def listen() -> TxProducer:
        q = TxProducer(master.addr, answer=COMMIT)
        await q.heartbeat()
        await asyncio.sleep(2)
        await q.client.close()
        return q

    assert asyncio.run(listen()).checks == [] and delivered(master.addr) == []


def test_a_half_given_up_behind_an_older_open_one_is_not_asked_about_again(cluster: Cluster) -> None:
    """The walk's progress stops at an older half whose producer group is not connected; a younger
    half given up meanwhile stays given up (reported once), instead of being asked about again."""
    master, _slave = broker_with_slave(cluster, transactionCheckMax=2)

    async def scenario() -> tuple[TxProducer, RemotingCommand]:
        gone = TxProducer(master.addr, answer=None, group="PG_TX_GONE")
        await gone.half(b"its producer left", "TX-H")
        await gone.client.close()
        p = TxProducer(master.addr, answer=None)
        await p.heartbeat()
        _, phy = await p.half(b"never answered", "TX-I")
        for _ in range(75):
            if "given up" in master.log_text():
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(2.0)  # about 6 more check rounds
        # An admin may put it back although the walk has not passed it (the older half holds it).
        msg_id = offset_msg_id("127.0.0.1", master.port, phy)
        resumed = await p.client.invoke(master.addr, RemotingCommand(
            RequestCode.RESUME_CHECK_HALF_MESSAGE, ext_fields={"msgId": msg_id}), 5)
        await p.client.close()
        return p, resumed

    p, resumed = asyncio.run(scenario())
    assert master.log_text().count("given up") == 1
    assert len(p.checks) == 2
    assert resumed.code == ResponseCode.SUCCESS, resumed
    assert metric_value(master.metrics(), "rmq_transactions_given_up_total") == 1
    assert delivered(master.addr) == []


def test_reject_transaction_message_refuses_half_messages(cluster: Cluster) -> None:
    ns = cluster.namesrv()
    broker = cluster.broker(ns.addr, name="broker-notx", rejectTransactionMessage="true")
    create_topic(broker.addr, TOPIC, queues=1)

    async def send() -> RemotingCommand:
        p = TxProducer(broker.addr, answer=None)
        try:
            await p.half(b"x", "TX-E")
        except AssertionError:
            pass
        props = f"TRAN_MSG\x01true\x02PGROUP\x01{GROUP}\x02"
        ext = {"producerGroup": GROUP, "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
               "queueId": "0", "sysFlag": "4", "bornTimestamp": "1", "flag": "0", "properties": props}
        resp = await p.client.invoke(broker.addr, RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields=ext,
                                                                  body=b"x"), 5)
        await p.client.close()
        return resp

    resp = asyncio.run(send())
    assert (resp.code, resp.remark) == (ResponseCode.NO_PERMISSION,
                                        "the broker[127.0.0.1] sending transaction message is forbidden")


def test_a_promoted_slave_checks_the_halves_its_old_master_left_open(cluster: Cluster) -> None:
    """The half and the check's progress reach the slave (commitlog, consumer offsets); after the
    master is lost and the slave promoted, the producer is asked there and its commit is stored."""
    master, slave = broker_with_slave(cluster, transactionTimeOut=1500, slaveSyncInitialDelay=100,
                                      slaveSyncInterval=200)

    async def before() -> tuple[int, int]:
        p = TxProducer(master.addr, answer=None)  # connected, but never answers the old master
        await p.heartbeat()
        first = await p.half(b"settled on the old master", "TX-F")
        assert (await p.end(*first, COMMIT)).code == ResponseCode.SUCCESS
        open_half = await p.half(b"left open", "TX-G")
        await p.client.close()
        return open_half

    asyncio.run(before())
    wait_caught_up(master, [slave])
    time.sleep(0.5)  # a metadata sync round: the half topic's config and the offsets
    master.kill9()
    # As the operator does: promote once the slave has lost its master.
    poll(lambda: not slave.status()["ha"]["connected"], 20, what="the slave noticed its master is gone")
    code, body = slave.admin("/role", "POST", json.dumps({"role": "ASYNC_MASTER", "brokerId": 0,
                                                          "epoch": 1}).encode())
    assert code == 200, body

    async def after() -> TxProducer:
        p = TxProducer(slave.addr, answer=COMMIT)
        await p.heartbeat()
        for _ in range(100):
            if len(await asyncio.to_thread(delivered, slave.addr)) >= 2:
                break
            await asyncio.sleep(0.1)
        await p.client.close()
        return p

    p = asyncio.run(after())
    assert [r.body for r in delivered(slave.addr)] == [b"settled on the old master", b"left open"]
    assert [decode_record(bytes(c.body)).body for c in p.checks] == [b"left open"]  # not the settled one
