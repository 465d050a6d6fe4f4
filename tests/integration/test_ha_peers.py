"""A real broker against a scripted HA peer on loopback: as a SLAVE it follows a fake master played
by the test (silence, streams that do not continue its log, malformed frames), and as a master it
logs what a misbehaving fake slave sends to its HA port and paces its pushes by the slave's acks."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rmqbroker.remoting.codes import ResponseCode
from rmqbroker.store.record import encode_record
from tests.conftest import Cluster
from tests.integration.helpers import poll, send_raw
from tests.support.procs import BrokerProc

# The HA wire format (rmqbroker.ha.master), spelled out so that the test does not trust the code
# under test to define it.
REPORT = struct.Struct(">q")
HEADER = struct.Struct(">qi")
EPOCH_QUERY = -2

# A log end far beyond anything the slave holds: its handshake never has a reason to truncate.
BIG_MAX_OFFSET = 1 << 30


@dataclass
class Peer:
    """One accepted HA connection of the fake master, read with deadlines (never blocking forever)."""

    sock: socket.socket
    buf: bytearray = field(default_factory=bytearray)
    # Every complete 8-byte report received, with the monotonic time it was read.
    reports: list[tuple[float, int]] = field(default_factory=list)
    closed_at: float | None = None

    def _read_some(self, deadline: float) -> bool:
        """Receive once (waiting at most until ``deadline``); False once the slave closed."""
        if self.closed_at is not None:
            return False
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return True
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed_at = time.monotonic()
            return False
        self.buf += data
        return True

    def read_exact(self, n: int, timeout: float = 10.0) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self.buf) < n:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{n} bytes not received within {timeout}s (have {len(self.buf)})")
            if not self._read_some(deadline):
                raise AssertionError(f"slave closed the connection after {bytes(self.buf)!r}")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def answer_epoch_query(self, max_offset: int = BIG_MAX_OFFSET, epoch: int = 0) -> None:
        (query,) = REPORT.unpack(self.read_exact(REPORT.size))
        assert query == EPOCH_QUERY, f"first message was {query}, not the epoch query"
        body = json.dumps({"epoch": epoch, "history": [], "maxOffset": max_offset}).encode()
        self.sock.sendall(HEADER.pack(EPOCH_QUERY, len(body)) + body)

    def _collect_reports(self) -> None:
        now = time.monotonic()
        while len(self.buf) >= REPORT.size:
            self.reports.append((now, REPORT.unpack_from(self.buf)[0]))
            del self.buf[:REPORT.size]

    def wait_report(self, offset: int, timeout: float = 10.0) -> None:
        """Until the slave reports ``offset`` (any report beyond it fails)."""
        deadline = time.monotonic() + timeout
        while True:
            self._collect_reports()
            values = [v for _, v in self.reports]
            assert all(v <= offset for v in values), f"slave reported {values}, beyond {offset}"
            if offset in values:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no report of {offset} within {timeout}s (reports: {values})")
            if not self._read_some(deadline):
                raise AssertionError(f"slave closed the connection; reports: {values}")

    def wait_closed(self, timeout: float) -> float:
        """Read (and record reports) until the slave closes the connection; when it did."""
        deadline = time.monotonic() + timeout
        while self._read_some(deadline):
            self._collect_reports()
            if time.monotonic() >= deadline:
                raise AssertionError(f"slave kept the connection open for {timeout}s; reports: {self.reports}")
        self._collect_reports()
        assert self.closed_at is not None
        return self.closed_at

    def send_frame(self, offset: int, size: int, body: bytes = b"") -> None:
        self.sock.sendall(HEADER.pack(offset, size) + body)


class FakeMaster:
    """A listening socket on loopback that the slave's haMasterAddress points at."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.peers: list[Peer] = []

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def accept(self, timeout: float = 15.0) -> Peer:
        self.server.settimeout(timeout)
        try:
            sock, _ = self.server.accept()
        except TimeoutError:
            raise AssertionError(f"the slave made no connection #{len(self.peers) + 1} within {timeout}s") from None
        peer = Peer(sock)
        self.peers.append(peer)
        return peer

    def close(self) -> None:
        for p in self.peers:
            p.sock.close()
        self.server.close()


@pytest.fixture
def fake_master() -> Iterator[FakeMaster]:
    fm = FakeMaster()
    yield fm
    fm.close()


def start_slave(cluster: Cluster, fm: FakeMaster, name: str, **conf: Any) -> BrokerProc:
    return cluster.broker(None, name=name, broker_id=1, role="SLAVE", haMasterAddress=fm.addr, **conf)


def ha_status(broker: BrokerProc) -> dict[str, Any]:
    ha: dict[str, Any] = broker.status()["ha"]
    return ha


def logged(proc: BrokerProc, text: str) -> bool:
    return text in proc.log_text()


def two_records(base: int = 0) -> bytes:
    """Two whole commitlog records at offsets base and base + len(first), as a master would have
    stored them."""
    first = encode_record(topic="PeerTopic", body=b"first" * 20, properties={"KEYS": "k0"}, queue_offset=0,
                          physical_offset=base, store_timestamp=int(time.time() * 1000))
    second = encode_record(topic="PeerTopic", body=b"second" * 20, properties={"KEYS": "k1"}, queue_offset=1,
                           physical_offset=base + len(first), store_timestamp=int(time.time() * 1000))
    return first + second


def commitlog_head(store: Path, n: int) -> bytes:
    with open(store / "commitlog" / f"{0:020d}", "rb") as f:
        return f.read(n)


# ---------------------------------------------------------------- slave side
def test_slave_heartbeats_then_drops_a_silent_master_and_reconnects(cluster: Cluster, fake_master: FakeMaster,
                                                                     ) -> None:
    """A master that answers the handshake and then says nothing (no frames, no heartbeats) is
    given up after haHousekeepingInterval; meanwhile the slave reports its offset every
    haSendHeartbeatInterval; then it connects again."""
    slave = start_slave(cluster, fake_master, "broker-silent", haHousekeepingInterval=1500,
                        haSendHeartbeatInterval=500)
    peer = fake_master.accept()
    poll(lambda: ha_status(slave)["connected"], 10, what="slave shows the connection")
    assert ha_status(slave)["masterAddress"] == fake_master.addr
    peer.answer_epoch_query(max_offset=0)
    answered = time.monotonic()
    closed = peer.wait_closed(timeout=10)
    silent_for = closed - answered
    # Never before the housekeeping interval (1.5 s, counted from the slave's last read).
    assert 1.2 <= silent_for <= 10, f"slave closed after {silent_for:.2f}s of silence"
    values = [v for _, v in peer.reports]
    assert values and set(values) == {0}, f"reports: {values}"
    # The first report comes at once; heartbeats keep coming while the master is silent.
    heartbeats = [t for t, _ in peer.reports if t - answered >= 0.3]
    assert len(heartbeats) >= 2, f"reports at {[round(t - answered, 2) for t, _ in peer.reports]}s"
    # Logged after the socket is closed: it may lag behind what the fake master saw.
    poll(functools.partial(logged, slave, f"HA connection to {fake_master.addr} failed: master silent"), 5,
         what="slave logs why it gave up")

    again = fake_master.accept(timeout=10)
    (query,) = REPORT.unpack(again.read_exact(REPORT.size))
    assert query == EPOCH_QUERY  # a fresh handshake, not a continued stream
    poll(lambda: ha_status(slave)["connects"] >= 2, 10, what="second connection counted")
    st = slave.status()
    assert st["maxPhyOffset"] == 0 and st["ha"]["refusedStreams"] == 0  # silence is no refused stream


# name: (frame offset given the slave's log end, frame size, body, what the slave logs)
BAD_FRAMES: dict[str, tuple[Callable[[int], int], int, bytes, str]] = {
    "gap": (lambda end: end + 100, 16, b"x" * 16, "master sent offset {bad}, this log ends at {end}"),
    "rewind": (lambda end: 0, 16, b"y" * 16, "master sent offset 0, this log ends at {end}"),
    "negative_size": (lambda end: end, -1, b"", "malformed frame header (offset {end}, size -1)"),
    "negative_offset": (lambda end: -100, 16, b"z" * 16, "malformed frame header (offset -100, size 16)"),
}


@pytest.mark.parametrize("case", list(BAD_FRAMES))
def test_slave_refuses_a_frame_that_does_not_continue_its_log(cluster: Cluster, fake_master: FakeMaster,
                                                              case: str) -> None:
    """After a valid stream, a frame at another offset than the slave's log end, or a malformed
    header, makes the slave drop the connection without storing a byte of it; it keeps what it
    had and reconnects, continuing from its own end."""
    slave = start_slave(cluster, fake_master, f"broker-{case.replace('_', '-')}")
    valid = two_records()
    end = len(valid)
    peer = fake_master.accept()
    peer.answer_epoch_query()
    peer.wait_report(0)
    peer.send_frame(0, end, valid)
    peer.wait_report(end)
    poll(lambda: slave.status()["maxPhyOffset"] == end, 10, what="valid stream stored")

    at, size, body, expected = BAD_FRAMES[case]
    bad = at(end)
    peer.send_frame(bad, size, body)
    peer.wait_closed(timeout=10)
    assert [v for _, v in peer.reports if v > end] == []

    st = poll(lambda: (s := slave.status())["ha"]["refusedStreams"] >= 1 and s, 10, what="refusal counted")
    assert st["ha"]["refusedStreams"] == 1
    assert st["maxPhyOffset"] == end
    # Nothing of the refused frame reached the segment file either.
    assert commitlog_head(slave.store_dir, end + 4096) == valid + bytes(4096)
    line = f"HA stream from {fake_master.addr} refused: {expected.format(bad=bad, end=end)}"
    poll(functools.partial(logged, slave, line), 5, what=f"slave logs {line!r}")

    again = fake_master.accept(timeout=15)
    again.answer_epoch_query()
    again.wait_report(end)  # continues from the bytes it kept
    poll(lambda: ha_status(slave)["connects"] >= 2, 10, what="reconnect counted")
    st = slave.status()
    assert st["maxPhyOffset"] == end and st["ha"]["truncatedBytes"] == 0


def test_slave_follows_a_rocketmq_4_master_without_the_epoch_handshake(cluster: Cluster,
                                                                       fake_master: FakeMaster) -> None:
    """The fake plays an Apache RocketMQ 4.9 master (reference §7.3): it takes the first report
    as the slave's request offset, so the epoch query (-2) becomes the offset its writer streams
    from; nothing is there, so after its heartbeat interval it sends a heartbeat at -2. The slave
    then reconnects without the query and follows as a Java slave would: it reports its offset
    (0, an empty log) and stores what a 4.9 master sends for 0, the stream from the start of its
    last segment. The connection after that asks for epochs again."""
    seg = 1 << 20
    slave = start_slave(cluster, fake_master, "broker-legacy", mappedFileSizeCommitLog=seg,
                        maxMessageSize=64 * 1024)
    probe = fake_master.accept()
    (query,) = REPORT.unpack(probe.read_exact(REPORT.size))
    assert query == EPOCH_QUERY
    probe.send_frame(EPOCH_QUERY, 0)  # the 4.9 writer's heartbeat at nextTransferFromWhere = -2
    probe.wait_closed(timeout=10)
    poll(functools.partial(logged, slave, f"HA master {fake_master.addr} does not know the epoch handshake"), 5,
         what="slave logs why it reconnects")

    java = fake_master.accept(timeout=5)  # at once, no back-off
    java.wait_report(0)
    # The master's log: a full first segment, and two records at the start of the last one.
    records = two_records(base=seg)
    end = seg + len(records)
    java.send_frame(seg, len(records), records)
    java.wait_report(end)
    assert all(v >= 0 for _, v in java.reports), f"reports: {java.reports}"
    java.send_frame(end, 0)  # a heartbeat where the slave is
    st = poll(lambda: (s := slave.status())["maxPhyOffset"] == end and s, 10, what="stream stored")
    assert st["ha"]["masterWithoutEpochs"] is True and st["ha"]["connected"] is True
    assert st["ha"]["refusedStreams"] == 0 and st["ha"]["truncatedBytes"] == 0
    with open(slave.store_dir / "commitlog" / f"{seg:020d}", "rb") as f:
        assert f.read(len(records)) == records
    # Consume queues are built from the records, at the offsets the master gave them.
    code, body = slave.admin("/consumequeue?topic=PeerTopic&queueId=0&offset=0&count=2")
    assert code == 200 and len(body) == 40
    first_size = struct.unpack_from(">i", records)[0]  # the record's TOTALSIZE
    assert [struct.unpack_from(">q", body, i)[0] for i in (0, 20)] == [seg, seg + first_size]

    java.sock.close()
    again = fake_master.accept(timeout=15)
    again.answer_epoch_query(max_offset=end)  # asked again: a master replaced at this address gets it
    again.wait_report(end)
    poll(lambda: ha_status(slave)["masterWithoutEpochs"] is False, 10, what="handshake master recognised")


# ---------------------------------------------------------------- master side
BAD_REPORTS = {
    # name: (bytes sent by the fake slave, then half-close?, expected log text)
    "beyond_log": (b"\x7f" * 8, False, f"reported offset {0x7f7f7f7f7f7f7f7f} beyond this master's log end"),
    "text": (b"garbage!" * 3, False,
             f"reported offset {REPORT.unpack(b'garbage!')[0]} beyond this master's log end"),
    "negative": (REPORT.pack(-7), False, "malformed report (offset -7)"),
    "partial": (b"abc", True, "closed mid-report (3 stray bytes"),
}


def test_master_logs_and_drops_bad_ha_input(cluster: Cluster) -> None:
    """Whatever a fake slave sends that is not a report of an offset within the log, the master
    closes the connection (well before its housekeeping interval) and says why in its log."""
    master = cluster.broker(None, name="broker-g")
    assert send_raw(master.addr, "GTopic", b"x").code == 0
    for name, (payload, half_close, expected) in BAD_REPORTS.items():
        with socket.create_connection(("127.0.0.1", master.port + 1), timeout=5) as s:
            s.sendall(payload)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            s.settimeout(5)
            try:
                assert s.recv(100) == b"", name
            except ConnectionResetError:
                pass
        poll(functools.partial(logged, master, expected), 5, what=f"{name}: log names {expected!r}")
    assert master.status()["ha"]["slaves"] == []
    assert send_raw(master.addr, "GTopic", b"still serving").code == 0


def _read_frames(peer: Peer, until: int, timeout: float = 10.0) -> int:
    """Read pushed frames (heartbeats skipped) until the stream reaches ``until``; where it starts."""
    start = -1
    reached = -1
    while reached < until:
        offset, size = HEADER.unpack(peer.read_exact(HEADER.size, timeout))
        if not size:
            continue
        assert reached in (-1, offset), f"frame at {offset}, the stream was at {reached}"
        peer.read_exact(size, timeout)
        start = offset if start < 0 else start
        reached = offset + size
    assert reached == until, f"stream went to {reached}, beyond {until}"
    return start


def _nothing_pushed(peer: Peer, seconds: float) -> None:
    """No commitlog bytes (heartbeats aside) arrive within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peer._read_some(deadline)
        while len(peer.buf) >= HEADER.size and HEADER.unpack_from(peer.buf)[1] == 0:
            del peer.buf[:HEADER.size]
        assert not peer.buf, f"pushed without an ack: {bytes(peer.buf[:HEADER.size])!r}..."


def _fake_slave(master: BrokerProc, report: int) -> Peer:
    sock = socket.create_connection(("127.0.0.1", master.port + 1), timeout=5)
    sock.sendall(REPORT.pack(report))
    return Peer(sock)


@pytest.mark.parametrize("after_ack", [True, False])
def test_async_master_pushes_the_next_bytes_once_the_slave_acked(cluster: Cluster, after_ack: bool) -> None:
    """With no send waiting for a slave, the master keeps one push in flight per slave: bytes
    appended meanwhile go out, all together, when the slave acknowledges that push
    (``haPushAfterAck``, on by default); with the key off every loop pass pushes."""
    master = cluster.broker(None, name="broker-p", haPushAfterAck=str(after_ack).lower())
    assert send_raw(master.addr, "PTopic", b"one").code == 0
    first_end = master.status()["maxPhyOffset"]
    peer = _fake_slave(master, 0)
    try:
        assert _read_frames(peer, first_end) == 0
        for body in (b"two", b"three"):
            assert send_raw(master.addr, "PTopic", body).code == 0
        third_end = master.status()["maxPhyOffset"]
        if after_ack:
            _nothing_pushed(peer, 1.5)  # three housekeeping ticks, which push too
            peer.sock.sendall(REPORT.pack(first_end))
        assert _read_frames(peer, third_end) == first_end
        if after_ack:
            # An ack that covers only part of the push in flight releases nothing.
            assert send_raw(master.addr, "PTopic", b"four").code == 0
            peer.sock.sendall(REPORT.pack(first_end + 1))
            _nothing_pushed(peer, 1.0)
            peer.sock.sendall(REPORT.pack(third_end))
            assert _read_frames(peer, master.status()["maxPhyOffset"]) == third_end
    finally:
        peer.sock.close()


def test_sync_master_pushes_while_a_send_waits_without_an_ack(cluster: Cluster) -> None:
    """A SYNC_MASTER send's bytes are pushed at once even while an earlier push is unacknowledged
    (a waiting producer must not wait for that round trip too), and its ack answers the send."""
    master = cluster.broker(None, name="broker-q", role="SYNC_MASTER")
    assert send_raw(master.addr, "QTopic", b"before any slave").code == ResponseCode.SLAVE_NOT_AVAILABLE
    first_end = master.status()["maxPhyOffset"]
    peer = _fake_slave(master, 0)
    try:
        assert _read_frames(peer, first_end) == 0  # never acknowledged below
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(send_raw, master.addr, "QTopic", b"waits for the slave")
            second_end = poll(lambda: (end := master.status()["maxPhyOffset"]) > first_end and end, 5,
                              what="second message stored")
            assert _read_frames(peer, second_end) == first_end
            assert not waiting.done()
            peer.sock.sendall(REPORT.pack(second_end))
            assert waiting.result(10).code == 0
    finally:
        peer.sock.close()
