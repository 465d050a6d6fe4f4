"""Run a C++ PushConsumer; print one JSON line per event until stdin closes (or says "stop").

Events: ``{"event": "started"}``, ``{"event": "msg", ...message fields...}``,
``{"event": "stopped"}``. With ``--fail-first`` a message delivered with reconsume_times 0 is
answered RECONSUME_LATER (and reported with ``"failed": true``).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from _common import message_json, run, stop_on_stdin
from rocketmq.client import PushConsumer, RecvMessage
from rocketmq.ffi import _CConsumeStatus, dll

_out_lock = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    line = json.dumps(obj)
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--expression", default="*")
    parser.add_argument("--props", default="", help="comma-separated property names to report")
    parser.add_argument("--fail-first", action="store_true")
    parser.add_argument("--orderly", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    args = parser.parse_args()
    props = [p for p in args.props.split(",") if p]

    consumer = PushConsumer(args.group, orderly=args.orderly)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.set_thread_count(args.threads)

    def on_message(_consumer: Any, cmsg: Any) -> int:
        # Return the status explicitly: the wrapper's own callback re-raises the listener's exception
        # out of the ctypes callback, and then the status the C++ side sees is whatever ctypes left
        # in the result slot.
        try:
            msg = RecvMessage(cmsg)
            data = message_json(msg, props)
            fail = args.fail_first and data["reconsume_times"] == 0
            data["event"] = "msg"
            data["failed"] = fail
            emit(data)
            return int(_CConsumeStatus.RECONSUME_LATER if fail else _CConsumeStatus.CONSUME_SUCCESS)
        except Exception as exc:  # never let an exception cross the ctypes boundary
            emit({"event": "error", "error": repr(exc)})
            return int(_CConsumeStatus.RECONSUME_LATER)

    dll.Subscribe(consumer._handle, args.topic.encode(), args.expression.encode())
    consumer._register_callback(on_message)
    consumer.start()
    emit({"event": "started"})

    stop_on_stdin().wait(args.max_seconds)
    t0 = time.monotonic()
    consumer.shutdown()
    emit({"event": "stopped", "shutdown_seconds": round(time.monotonic() - t0, 3)})


if __name__ == "__main__":
    run(main)
