"""Stock C++ client load for ``soak_bench.py`` (PyPI ``rocketmq==0.4.4``), one role per process.

``produce``: sends at ``--rate`` messages/s with ``send_sync``, and every ``--churn`` seconds shuts
its Producer down and starts one under a new instance name (a new client id and connection: registration, heartbeats
and unregistration on the broker and the nameserver, over and over).
``consume``: a PushConsumer of ``--group``, likewise replaced every ``--churn`` seconds (rebalances,
offset commits on shutdown); it counts deliveries and distinct message keys (redeliveries after a
rebalance are allowed, losses are not). Both print one JSON line of running totals every second
and stop when stdin closes.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from rocketmq.client import Message, Producer, PushConsumer, RecvMessage
from rocketmq.ffi import _CConsumeStatus, dll

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/tests/integration/clients")
from _common import run  # type: ignore[import-not-found]


class Totals:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok = 0
        self.errors = 0
        self.clients = 0
        self.last_error = ""
        self.keys: set[bytes] = set()  # consumer: distinct message keys seen

    def line(self) -> str:
        with self.lock:
            return json.dumps({"ok": self.ok, "errors": self.errors, "clients": self.clients,
                               "distinct": len(self.keys), "last_error": self.last_error})


def produce(args: argparse.Namespace, totals: Totals, stop: threading.Event) -> None:
    body = b"s" * args.size
    period = 1.0 / args.rate
    i = 0
    while not stop.is_set():
        producer = Producer(f"PG_SOAK_{args.index}", timeout=3000)
        producer.set_namesrv_addr(args.namesrv)
        # A new client id for every instance (the default is the process id): the broker meets a
        # new client each time and must forget the old one.
        dll.SetProducerInstanceName(producer._handle, f"soak-p{args.index}-{totals.clients}".encode())
        producer.start()
        with totals.lock:
            totals.clients += 1
        until = time.monotonic() + args.churn
        next_at = time.monotonic()
        while not stop.is_set() and time.monotonic() < until:
            msg = Message(args.topic)
            msg.set_keys(f"soak-{args.index}-{i}")
            msg.set_tags("TagSoak")
            msg.set_body(body)
            try:
                producer.send_sync(msg)
                with totals.lock:
                    totals.ok += 1
            except Exception as exc:  # counted, the soak goes on
                with totals.lock:
                    totals.errors += 1
                    totals.last_error = str(exc)[:200]
            i += 1
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -1.0:
                next_at = time.monotonic()  # fell behind: don't burst to catch up
        producer.shutdown()


def consume(args: argparse.Namespace, totals: Totals, stop: threading.Event) -> None:
    def on_message(_consumer: Any, cmsg: Any) -> int:
        try:
            msg = RecvMessage(cmsg)
            key = msg.keys
            with totals.lock:
                totals.ok += 1
                totals.keys.add(key)
            return int(_CConsumeStatus.CONSUME_SUCCESS)
        except Exception as exc:  # never let an exception cross the ctypes boundary
            with totals.lock:
                totals.errors += 1
                totals.last_error = repr(exc)[:200]
            return int(_CConsumeStatus.RECONSUME_LATER)

    while not stop.is_set():
        consumer = PushConsumer(args.group)
        consumer.set_namesrv_addr(args.namesrv)
        consumer.set_thread_count(2)
        dll.SetPushConsumerInstanceName(consumer._handle, f"soak-c-{totals.clients}".encode())
        dll.Subscribe(consumer._handle, args.topic.encode(), b"*")
        consumer._register_callback(on_message)
        consumer.start()
        with totals.lock:
            totals.clients += 1
        stop.wait(args.churn)
        consumer.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("produce", "consume"))
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", default="CG_SOAK")
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--churn", type=float, default=30.0)
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args()
    totals = Totals()
    stop = threading.Event()

    def watch_stdin() -> None:
        for _line in sys.stdin:
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    worker = threading.Thread(target=produce if args.role == "produce" else consume, args=(args, totals, stop))
    worker.start()
    while worker.is_alive():
        sys.stdout.write(totals.line() + "\n")
        sys.stdout.flush()
        worker.join(1.0)
    sys.stdout.write(totals.line() + "\n")


if __name__ == "__main__":
    run(main)
