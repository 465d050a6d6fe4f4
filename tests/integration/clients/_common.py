"""Shared by the client scripts: a received C++ ``RecvMessage`` as JSON, a stop request on stdin, and a
hang-proof exit."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def message_json(msg: Any, props: list[str]) -> dict[str, Any]:
    return {
        "topic": _text(msg.topic),
        "tags": _text(msg.tags),
        "keys": _text(msg.keys),
        "body": _text(msg.body),
        "id": _text(msg.id),
        "queue_id": int(msg.queue_id),
        "queue_offset": int(msg.queue_offset),
        "commit_log_offset": int(msg.commit_log_offset),
        "reconsume_times": int(msg.reconsume_times),
        "born_timestamp": int(msg.born_timestamp),
        "store_timestamp": int(msg.store_timestamp),
        "recv_ms": int(time.time() * 1000),
        "props": {p: _text(msg.get_property(p)) for p in props},
    }


def stop_on_stdin() -> threading.Event:
    """An event set once stdin reads "stop" or closes (the test is done with this client)."""
    stop = threading.Event()

    def watch() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    return stop


def run(main: Callable[[], None]) -> None:
    """Run ``main`` and leave with os._exit: the client's destructors can hang a normal exit."""
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)
