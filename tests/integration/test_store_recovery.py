"""Crash recovery of the store: a writer process is SIGKILLed mid-stream, then the store is reopened.

Checks that every acknowledged message survives with a valid body CRC, that consume queues agree
with the commitlog, that a torn tail is cut off and that a damaged consume queue is rebuilt.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Literal

import pytest

from rmqbroker.store.message_store import GetMessageStatus, MessageInner, MessageStore
from rmqbroker.store.record import decode_record, iter_records
from tests.integration.store_writer import SEGMENT, body_for, config
from tests.support.procs import BrokerProc
from tests.unit.store.consistency import assert_store_consistent

WRITER = Path(__file__).with_name("store_writer.py")
Ack = tuple[int, str, int, int]


def run_writer_and_kill(root: Path, flush: str, acks_before_kill: int, extra_delay_s: float) -> list[Ack]:
    """Start the writer, SIGKILL it ``extra_delay_s`` after ``acks_before_kill`` acknowledgements.

    Its output is drained continuously by a thread, so the writer is never blocked on a full pipe
    and the kill lands while it is appending.  Returns every acknowledgement it printed.
    """
    proc = subprocess.Popen([sys.executable, str(WRITER), str(root), flush], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    stdout = proc.stdout
    lines: list[str] = []

    def drain() -> None:
        for line in stdout:
            lines.append(line)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    try:
        while len(lines) < acks_before_kill + 1 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.002)
        time.sleep(extra_delay_s)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        reader.join(timeout=60)
        err = proc.stderr.read() if proc.stderr is not None else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, err
    assert lines and lines[0].strip() == "READY"
    acks = []
    for line in lines[1:]:
        if not line.endswith("\n"):
            continue  # killed while printing: not a complete acknowledgement
        seq, topic, qid, qoff = line.split()
        acks.append((int(seq), topic, int(qid), int(qoff)))
    assert len(acks) >= acks_before_kill
    return acks


def assert_acked_readable(store: MessageStore, acks: list[Ack]) -> None:
    for seq, topic, qid, qoff in acks:
        res = store.get_message("check", topic, qid, qoff, 1)
        assert res.status is GetMessageStatus.FOUND, (seq, topic, qid, qoff, res.status)
        [rec] = list(iter_records(res.body()))
        assert rec.body == body_for(seq) and rec.queue_offset == qoff


async def reopen_and_check(root: Path, flush: Literal["ASYNC_FLUSH", "SYNC_FLUSH"], acks: list[Ack],
                           expect_clean: bool) -> tuple[int, int]:
    store = MessageStore(config(root, flush))
    await store.start()
    try:
        assert store.last_exit_ok is expect_clean
        count = assert_store_consistent(store)
        assert count >= len(acks)
        assert_acked_readable(store, acks)
        return store.max_phy_offset(), count
    finally:
        await store.shutdown()


def newest_file(directory: Path) -> Path:
    """The segment with the highest start offset (names are zero-padded)."""
    return max(directory.iterdir())


def write_at(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


@pytest.mark.parametrize(("flush", "delay"), [("ASYNC_FLUSH", 0.0), ("ASYNC_FLUSH", 0.037), ("SYNC_FLUSH", 0.0),
                                              ("SYNC_FLUSH", 0.021)])
def test_kill9_mid_stream_then_torn_tail_then_corrupt_consume_queue(
        tmp_path: Path, flush: Literal["ASYNC_FLUSH", "SYNC_FLUSH"], delay: float) -> None:
    root = tmp_path / "store"
    acks = run_writer_and_kill(root, flush, acks_before_kill=400, extra_delay_s=delay)
    assert (root / "abort").exists()
    assert len(list((root / "commitlog").iterdir())) > 3  # segments rolled

    end, count = asyncio.run(reopen_and_check(root, flush, acks, expect_clean=False))

    # A torn tail: half of a real record after the valid end, plus garbage, then a "crash".  When
    # the end is a segment boundary the torn record sits at the start of a freshly created segment.
    cl_dir = root / "commitlog"
    first_seg = min(cl_dir.iterdir()).read_bytes()
    record = first_seg[:decode_record(first_seg).total_size]
    seg = cl_dir / f"{end - end % SEGMENT:020d}"
    if not seg.exists():
        seg.write_bytes(bytes(SEGMENT))
    write_at(seg, end % SEGMENT, record[: len(record) // 2] + os.urandom(64))
    (root / "abort").touch()
    end2, count2 = asyncio.run(reopen_and_check(root, flush, acks, expect_clean=False))
    assert (end2, count2) == (end, count)
    if end % SEGMENT:
        assert seg.read_bytes()[end % SEGMENT:] == bytes(SEGMENT - end % SEGMENT)
    else:
        assert not seg.exists()

    # A damaged consume queue: garbage over units of one file, zeroes over another; clean exit.
    cq_root = root / "consumequeue"
    write_at(newest_file(cq_root / "T1" / "1"), 20 * 2, os.urandom(20 * 4))
    write_at(newest_file(cq_root / "T2" / "2"), 0, bytes(20 * 50))
    end3, count3 = asyncio.run(reopen_and_check(root, flush, acks, expect_clean=True))
    assert (end3, count3) == (end, count)

    # And the store keeps working after all that.
    async def append_more() -> None:
        store = MessageStore(config(root, flush))
        await store.start()
        before = store.get_max_offset_in_queue("T1", 1)
        r = await store.put_message(MessageInner(topic="T1", queue_id=1, flag=0, body=b"after",
                                                 properties={"TAGS": "x"}))
        assert r.ok and r.queue_offset == before and r.wrote_offset == end
        assert_store_consistent(store)
        await store.shutdown()

    asyncio.run(append_more())


def test_consume_queues_lost_after_a_crash_recovery_are_rebuilt_from_the_commitlog(tmp_path: Path) -> None:
    """A writer is killed, the store recovers and shuts down cleanly; then a whole topic's queues, one
    queue's directory and the newest file of another are deleted (an operator's mistake).
    The next start rebuilds exactly them: every acknowledged message is readable again at its offset."""
    root = tmp_path / "store"
    acks = run_writer_and_kill(root, "ASYNC_FLUSH", acks_before_kill=400, extra_delay_s=0.0)
    end, count = asyncio.run(reopen_and_check(root, "ASYNC_FLUSH", acks, expect_clean=False))

    cq_root = root / "consumequeue"
    shutil.rmtree(cq_root / "T2")
    shutil.rmtree(cq_root / "T1" / "1")
    newest_file(cq_root / "T0" / "2").unlink()
    end2, count2 = asyncio.run(reopen_and_check(root, "ASYNC_FLUSH", acks, expect_clean=True))
    assert (end2, count2) == (end, count)


@pytest.mark.parametrize(("name", "content"), [("config/consumerOffset.json", ""),
                                                ("config/topics.json", '{"topicConfigTable":{')])
def test_an_unusable_metadata_file_stops_the_start_with_one_line(tmp_path: Path, name: str, content: str) -> None:
    """An empty (lost write) or corrupt metadata file without a usable .bak: the broker exits with
    status 1 and one error line naming the file, and leaves the file for the operator to repair."""
    broker = BrokerProc(tmp_path, None, name="broker-meta")
    path = broker.store_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    broker.start(wait_ready=False)
    assert broker.popen is not None
    assert broker.popen.wait(30) == 1
    log = broker.log_text()
    assert f"cannot start: {path}" in log and "Traceback" not in log, log
    assert path.read_text() == content
