"""A SYNC_MASTER and its slave on small disks that fill up and are freed again, under a stream of sends.

Each broker keeps its store on its own tmpfs (a private mount namespace, as in
``tests/integration/test_disk_full.py``; needs root or CAP_SYS_ADMIN). A sender keeps 16 sends in
flight over one connection, each body unique. Each round fills one disk to the last byte with a
filler file (the master's, then the slave's, in turn), lets the stream run into it for
``--full-seconds``, deletes the filler and waits until sends are taken again. A failed send's slot
waits 20 ms before its next send, as a client backs off.

At the end the slave must hold the master's commitlog byte for byte, every acknowledged send
(SEND_OK) must be in it once, and no send answered SERVICE_NOT_AVAILABLE may be in it (a refused
send leaves nothing behind). Both brokers must have run throughout (a SIGBUS would end them).

Usage: ``python bench/disk_full_chaos.py [--rounds 6] [--disk-mb 64] [--full-seconds 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.helpers import create_topic, poll  # noqa: E402
from tests.support.procs import BrokerProc, metric_value  # noqa: E402
from tests.support.small_disk import SmallDisk, small_disk_available  # noqa: E402

from rmqbroker.remoting.client import RemotingClient  # noqa: E402
from rmqbroker.remoting.codes import RequestCode, ResponseCode  # noqa: E402
from rmqbroker.remoting.frame import RemotingCommand  # noqa: E402
from rmqbroker.store.record import BLANK_MAGIC_CODE, decode_record, peek_size_magic  # noqa: E402

TOPIC = "DiskFull"
SEGMENT = 16 * 1024 * 1024  # BrokerProc's mappedFileSizeCommitLog


def bodies(log: bytes) -> list[bytes]:
    """The body of every record in commitlog bytes from offset 0 (end-of-segment markers skipped)."""
    out: list[bytes] = []
    pos = 0
    while pos + 8 <= len(log):
        _size, magic = peek_size_magic(log, pos)
        if magic == BLANK_MAGIC_CODE:
            pos = (pos // SEGMENT + 1) * SEGMENT
            continue
        rec = decode_record(log, pos)
        out.append(bytes(rec.body))
        pos += rec.total_size
    return out


class Sender(threading.Thread):
    """Sends unique bodies, ``window`` in flight, until stopped; records each answer's code by body."""

    def __init__(self, addr: str, size: int, window: int = 16) -> None:
        super().__init__(daemon=True)
        self.addr, self.size, self.window = addr, size, window
        self.answers: dict[bytes, int] = {}
        self.stopping = False
        self.recent: collections.deque[int] = collections.deque(maxlen=64)

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        client = RemotingClient()
        seq = 0

        async def one(body: bytes, qid: int) -> None:
            cmd = RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields={
                "producerGroup": "PG_DF", "topic": TOPIC, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
                "queueId": str(qid), "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
                "properties": "WAIT\x01true\x02"}, body=body)
            try:
                resp = await client.invoke(self.addr, cmd, 10)
                code = resp.code
            except Exception:
                code = -1  # no answer: may or may not be stored
            self.answers[body] = code
            self.recent.append(code)
            if code != ResponseCode.SUCCESS:
                # A client backs off after a failure. Without it a SYNC_MASTER whose slave is full
                # stores (and answers SLAVE_NOT_AVAILABLE to) tens of MB a second, as Java's does.
                await asyncio.sleep(0.02)

        pending: set[asyncio.Task[None]] = set()
        try:
            while not self.stopping:
                while len(pending) < self.window:
                    body = f"m{seq:09d}-".encode().ljust(self.size, b".")
                    pending.add(asyncio.create_task(one(body, seq % 4)))
                    seq += 1
                _done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.gather(*pending)
        finally:
            await client.close()

    def taking(self) -> bool:
        return len(self.recent) >= 16 and all(c == ResponseCode.SUCCESS for c in list(self.recent)[-16:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--disk-mb", type=int, default=64)
    ap.add_argument("--full-seconds", type=float, default=4.0)
    ap.add_argument("--size", type=int, default=2048, help="body bytes")
    args = ap.parse_args()
    if not small_disk_available():
        print("needs the right to mount a tmpfs in a private namespace (root or CAP_SYS_ADMIN)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="disk-full-chaos-"))
    conf: dict[str, Any] = {"cleanResourceInterval": 2000, "cleanFileForciblyEnable": "false"}
    with SmallDisk(work / "store-broker-df-0", args.disk_mb) as mdisk, \
            SmallDisk(work / "store-broker-df-1", args.disk_mb) as sdisk:
        master = BrokerProc(work, None, name="broker-df", role="SYNC_MASTER", **conf)
        master.args = mdisk.wrap(master.args)
        slave = BrokerProc(work, None, name="broker-df", broker_id=1, role="SLAVE",
                           haMasterAddress=f"127.0.0.1:{master.port + 1}", **conf)
        slave.args = sdisk.wrap(slave.args)
        master.start()
        slave.start()
        sender: Sender | None = None
        try:
            create_topic(master.addr, TOPIC)
            sender = Sender(master.addr, args.size)
            sender.start()
            poll(sender.taking, 20, what="sends taken")
            began = time.monotonic()
            for rnd in range(args.rounds):
                disk, who = (mdisk, "master") if rnd % 2 == 0 else (sdisk, "slave")
                filled = disk.fill()
                t0 = time.monotonic()
                time.sleep(args.full_seconds)
                codes = collections.Counter(list(sender.recent))
                disk.free()
                poll(sender.taking, 60, what="sends taken again")
                back = time.monotonic() - t0 - args.full_seconds
                print(f"round {rnd + 1}: {who} disk filled ({filled >> 20} MB filler); last answers while full "
                      f"{dict(codes)}; taken again {back:.1f} s after it was freed; "
                      f"alive {master.alive}/{slave.alive}", flush=True)
                if not (master.alive and slave.alive):
                    break
            time.sleep(1)
        except BaseException:
            master.stop()  # not left running (holding the disk's namespace) when the run fails
            slave.stop()
            raise
        finally:
            if sender is not None:
                sender.stopping = True
                sender.join(30)
        findings: list[str] = []
        if not (master.alive and slave.alive):
            findings.append(f"a broker ended: master alive {master.alive}, slave alive {slave.alive}")
        else:
            end = master.status()["maxPhyOffset"]
            poll(lambda: slave.status()["maxPhyOffset"] == end, 60, what="slave caught up")
            # /commitlog serves what consume queues cover: wait for the slave's dispatch too.
            poll(lambda: slave.status()["dispatchedPhyOffset"] == end, 60, what="slave's queues built")
            code, mbytes = master.admin(f"/commitlog?offset=0&length={end}")
            scode, sbytes = slave.admin(f"/commitlog?offset=0&length={end}")
            if (code, scode) != (200, 200) or mbytes != sbytes:
                n = min(len(mbytes), len(sbytes))
                first = next((i for i in range(n) if mbytes[i] != sbytes[i]), n)
                findings.append(f"the slave's commitlog differs from the master's: answers {code}/{scode}, "
                                f"{len(mbytes)}/{len(sbytes)} bytes, first difference at {first}")
            stored = collections.Counter(bodies(mbytes))
            answers = sender.answers if sender is not None else {}
            outcome = collections.Counter(answers.values())
            missing = [b for b, c in answers.items() if c == ResponseCode.SUCCESS and stored[b] != 1]
            leaked = [b for b, c in answers.items() if c == ResponseCode.SERVICE_NOT_AVAILABLE and stored[b]]
            print(f"sends: {dict(outcome)} over {time.monotonic() - began:.0f} s; commitlog {end} bytes, "
                  f"{sum(stored.values())} records; no-space refusals counted: master "
                  f"{metric_value(master.metrics(), 'rmq_store_no_space_failures_total'):.0f}, slave "
                  f"{metric_value(slave.metrics(), 'rmq_store_no_space_failures_total'):.0f}")
            if missing:
                findings.append(f"{len(missing)} acknowledged sends not stored exactly once, e.g. {missing[:3]}")
            if leaked:
                findings.append(f"{len(leaked)} sends refused SERVICE_NOT_AVAILABLE but stored, e.g. {leaked[:3]}")
        master.stop()
        slave.stop()
    print("findings:", "none" if not findings else "")
    for f in findings:
        print(" -", f)
    print(f"logs: {work}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
