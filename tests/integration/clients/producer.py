"""Send messages with the C++ client; print one JSON object with a result per message.

``--messages`` is a JSON list of ``{"topic", "body", "keys"?, "tags"?, "props"?, "delay"?, "shard"?}``.
Modes: ``sync`` (send_sync each), ``oneway`` (send_oneway each), ``orderly`` (send_orderly with
``shard`` as the queue-selector argument), ``batch`` (one send_batch with all messages).
Output: ``{"results": [{"status", "msg_id", "offset", "sent_ms"} | null, ...]}`` (null for oneway).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from _common import run
from rocketmq.client import Message, Producer


def build(spec: dict[str, Any]) -> Message:
    msg = Message(spec["topic"])
    msg.set_body(spec["body"])
    if spec.get("keys"):
        msg.set_keys(spec["keys"])
    if spec.get("tags"):
        msg.set_tags(spec["tags"])
    for key, value in (spec.get("props") or {}).items():
        msg.set_property(key, value)
    if spec.get("delay"):
        msg.set_delay_time_level(int(spec["delay"]))
    return msg


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--group", default="PG_TEST")
    parser.add_argument("--mode", choices=("sync", "oneway", "orderly", "batch"), default="sync")
    parser.add_argument("--messages", required=True, help="JSON list of message specs")
    parser.add_argument("--timeout-ms", type=int, default=3000)
    parser.add_argument("--access-key", default=None, help="sign requests (plain ACL) with these credentials")
    parser.add_argument("--secret-key", default=None)
    parser.add_argument("--settle-ms", type=int, default=0,
                        help="wait this long after start: the C++ client connects to every broker from its own "
                             "threads then, and a send that needs a connection meanwhile can fail at once on the "
                             "client's transport lock (\"get timed_mutex timeout\", reported as \"No route info\")")
    parser.add_argument("--keep-going", action="store_true",
                        help="sync mode: report a failed send as {\"error\": ...} and go on")
    args = parser.parse_args()
    specs: list[dict[str, Any]] = json.loads(args.messages)

    producer = Producer(args.group, timeout=args.timeout_ms)
    producer.set_namesrv_addr(args.namesrv)
    if args.access_key:
        producer.set_session_credentials(args.access_key, args.secret_key, "LOCAL")
    producer.start()
    time.sleep(args.settle_ms / 1000)
    results: list[dict[str, Any] | None] = []
    try:
        if args.mode == "batch":
            sent_ms = int(time.time() * 1000)
            r = producer.send_batch([build(s) for s in specs])
            results.append({"status": int(r.status), "msg_id": r.msg_id, "offset": r.offset, "sent_ms": sent_ms})
        else:
            for spec in specs:
                msg = build(spec)
                sent_ms = int(time.time() * 1000)
                if args.mode == "sync" and args.keep_going:
                    try:
                        r = producer.send_sync(msg)
                    except Exception as exc:  # the client's failure is the result
                        results.append({"error": f"{type(exc).__name__}: {exc}"})
                        continue
                elif args.mode == "sync":
                    r = producer.send_sync(msg)
                elif args.mode == "orderly":
                    r = producer.send_orderly(msg, int(spec.get("shard", 0)))
                else:
                    producer.send_oneway(msg)
                    results.append(None)
                    continue
                results.append({"status": int(r.status), "msg_id": r.msg_id, "offset": r.offset,
                                "sent_ms": sent_ms})
    finally:
        if args.mode == "oneway":
            time.sleep(0.3)  # oneway writes are queued on the client's I/O thread
        producer.shutdown()
    json.dump({"results": results}, sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()


if __name__ == "__main__":
    run(main)
