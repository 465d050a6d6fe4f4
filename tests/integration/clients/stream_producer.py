"""Send a stream of messages with the C++ client, printing one JSON line per send as it completes.

``{"i": n, "status": s, "msg_id": id, "offset": o}`` for a send that returned, ``{"i": n, "error": e}``
for one that raised. Runs until ``--count`` sends or ``--seconds`` elapsed, whichever comes first (with
``--stop-on-stdin``, or until stdin says "stop" or closes: the send under way completes first).
A caller may kill the broker mid-stream and still know which sends were acknowledged.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from _common import run, stop_on_stdin
from rocketmq.client import Message, Producer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--group", default="PG_STREAM")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--prefix", default="m")
    parser.add_argument("--timeout-ms", type=int, default=3000)
    parser.add_argument("--settle-ms", type=int, default=0,
                        help="wait this long after start (see producer.py --settle-ms: a first send racing the "
                             "client's own connection to the broker fails on its transport lock)")
    parser.add_argument("--pause-ms", type=int, default=0, help="sleep this long between sends")
    parser.add_argument("--stop-on-stdin", action="store_true",
                        help='end after the current send once stdin reads "stop" or closes')
    args = parser.parse_args()
    stop = stop_on_stdin() if args.stop_on_stdin else threading.Event()
    producer = Producer(args.group, timeout=args.timeout_ms)
    producer.set_namesrv_addr(args.namesrv)
    producer.start()
    time.sleep(args.settle_ms / 1000)
    deadline = time.monotonic() + args.seconds
    pad = "x" * max(0, args.size - 32)
    for i in range(args.count):
        if time.monotonic() > deadline or stop.is_set():
            break
        msg = Message(args.topic)
        key = f"{args.prefix}-{i}"
        msg.set_keys(key)
        msg.set_tags("TagS")
        msg.set_body(f"{key}|{pad}".encode())
        try:
            r = producer.send_sync(msg)
            line = {"i": i, "key": key, "status": int(r.status), "msg_id": r.msg_id, "offset": r.offset}
        except Exception as exc:
            line = {"i": i, "key": key, "error": str(exc)[:200]}
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
        if args.pause_ms:
            time.sleep(args.pause_ms / 1000)
    producer.shutdown()


if __name__ == "__main__":
    run(main)
