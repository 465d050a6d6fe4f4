"""Stock-client traffic for the kind e2e test; runs in a Job (image: tests/e2e/client/Dockerfile).

``produce``: send_sync messages keyed ``<prefix>-<n>``, ``--count`` of them or for ``--duration``
seconds, tolerating failures (during a failover some sends fail: they were never acknowledged).
Prints one JSON line per attempt: ``{"event": "ack", "key", "msg_id", "offset"}`` or
``{"event": "fail", "key", "error"}``, then ``{"event": "done", "acked": N, "failed": M}``.

``consume``: read every queue of the topic from offset 0 to its end with the PullConsumer and print
``{"event": "msg", "key", "queue_id", "queue_offset"}`` per message, then ``{"event": "done", ...}``.

Leaves with ``os._exit``: the C++ client's destructors can hang a normal interpreter exit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def produce(args: argparse.Namespace) -> int:
    from rocketmq.client import Message, Producer, SendStatus

    producer = Producer(args.group, timeout=args.timeout_ms)
    producer.set_namesrv_addr(args.namesrv)
    producer.start()
    acked = failed = 0
    deadline = time.monotonic() + args.duration if args.duration else None
    n = 0
    try:
        while (deadline is None and n < args.count) or (deadline is not None and time.monotonic() < deadline):
            key = f"{args.prefix}-{n}"
            n += 1
            msg = Message(args.topic)
            msg.set_keys(key)
            msg.set_tags("e2e")
            msg.set_body(json.dumps({"key": key, "pad": "x" * args.body_bytes}))
            try:
                result = producer.send_sync(msg)
            except Exception as exc:
                failed += 1
                emit(event="fail", key=key, error=f"{type(exc).__name__}: {exc}"[:300])
            else:
                if result.status == SendStatus.OK:
                    acked += 1
                    emit(event="ack", key=key, msg_id=text(result.msg_id), offset=int(result.offset))
                else:
                    failed += 1
                    emit(event="fail", key=key, error=f"status {result.status}")
            if args.interval:
                time.sleep(args.interval)
    finally:
        producer.shutdown()
    emit(event="done", acked=acked, failed=failed)
    return 0 if acked else 1


def consume(args: argparse.Namespace) -> int:
    from rocketmq.client import PullConsumer

    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.start()
    count = 0
    try:
        for msg in consumer.pull(args.topic, "*"):
            count += 1
            emit(event="msg", key=text(msg.keys), queue_id=int(msg.queue_id), queue_offset=int(msg.queue_offset))
    finally:
        consumer.shutdown()
    emit(event="done", messages=count)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="stock RocketMQ client traffic for the kind e2e test")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("produce")
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="PG_E2E")
    p.add_argument("--prefix", required=True)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--duration", type=float, default=0.0, help="send for this many seconds instead of --count")
    p.add_argument("--interval", type=float, default=0.0, help="pause between sends (seconds)")
    p.add_argument("--body-bytes", type=int, default=256)
    p.add_argument("--timeout-ms", type=int, default=3000)
    c = sub.add_parser("consume")
    c.add_argument("--namesrv", required=True)
    c.add_argument("--topic", required=True)
    c.add_argument("--group", default="CG_E2E")
    args = parser.parse_args(argv)
    return produce(args) if args.command == "produce" else consume(args)


if __name__ == "__main__":
    code = 2
    try:
        code = main()
    except BaseException:
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
