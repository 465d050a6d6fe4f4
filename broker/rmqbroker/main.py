"""`rmq-broker` entry point: ``rmq-broker -c broker.conf [-n namesrv] [--set key=value ...]``."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
from pathlib import Path

from rmqbroker.acl import AclConfigError, PlainAcl
from rmqbroker.broker import Broker, read_conf
from rmqbroker.config import ConfigError, SettingsOrigin, build_settings, override_sources
from rmqbroker.metadata.errors import MetadataError
from rmqbroker.runtime import raise_fd_limit, run_until_signal, setup_logging
from rmqbroker.store.errors import StoreError

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rmq-broker", description="RocketMQ-compatible broker")
    parser.add_argument("-c", "--config", help="broker.conf (Java properties, RocketMQ key names)")
    parser.add_argument("-n", "--namesrv", help="nameserver addresses, host:port;host:port")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one broker.conf key (repeatable)")
    parser.add_argument("--log-level", default=os.environ.get("RMQ_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    raise_fd_limit()
    overrides: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = value.strip()
    if args.namesrv:
        overrides["namesrvAddr"] = args.namesrv
    try:
        settings = build_settings(read_conf(args.config), overrides=overrides)
        settings.admin_token()  # an unreadable or empty token file is a configuration error
        settings.tls_settings()  # so is a TLS file or certificate that cannot be loaded
        if settings.aclEnable:
            PlainAcl.load(settings.acl_path)  # a missing or malformed ACL file too
    except (ConfigError, AclConfigError, OSError) as exc:
        print(f"rmq-broker: invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc

    # What UPDATE_BROKER_CONFIG saves a change to, and which keys the file does not decide.
    origin = SettingsOrigin(Path(args.config) if args.config else None, override_sources(overrides=overrides))

    async def run(stop: asyncio.Event) -> None:
        try:
            broker = Broker(settings, origin)  # loads the metadata files
        except MetadataError as exc:
            log.error("cannot start: %s", exc)
            raise SystemExit(1) from exc
        try:
            await broker.start()
        except (StoreError, MetadataError, OSError) as exc:
            log.error("cannot start: %s", exc)
            await broker.store.shutdown()
            raise SystemExit(1) from exc
        # Start-up objects live as long as the process: keep them out of every later GC pass,
        # which shortens the collector's pauses (and so the latency tail) for good.
        gc.collect()
        gc.freeze()
        admin = f", admin http://{settings.listenHost}:{broker.admin.port}" if broker.admin else ""
        print(f"rmq-broker {settings.brokerName} ({settings.brokerRole}) listening on "
              f"{settings.broker_addr}{admin}", flush=True)
        await stop.wait()
        await broker.stop()

    run_until_signal(run)


if __name__ == "__main__":
    main()
