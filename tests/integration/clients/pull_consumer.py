"""Read every queue of a topic from offset 0 to its end with the C++ PullConsumer; print a JSON list."""

from __future__ import annotations

import argparse
import json
import sys

from _common import message_json, run
from rocketmq.client import PullConsumer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--group", default="CG_PULL")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--expression", default="*")
    parser.add_argument("--props", default="", help="comma-separated property names to report")
    parser.add_argument("--access-key", default=None, help="sign requests (plain ACL) with these credentials")
    parser.add_argument("--secret-key", default=None)
    args = parser.parse_args()
    props = [p for p in args.props.split(",") if p]

    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    if args.access_key:
        consumer.set_session_credentials(args.access_key, args.secret_key, "LOCAL")
    consumer.start()
    try:
        out = [message_json(m, props) for m in consumer.pull(args.topic, args.expression)]
    finally:
        consumer.shutdown()
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()


if __name__ == "__main__":
    run(main)
