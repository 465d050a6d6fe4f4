"""`rmq-namesrv` entry point."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from rmqbroker.namesrv.processor import NamesrvProcessor
from rmqbroker.namesrv.routeinfo import RouteInfoManager
from rmqbroker.remoting.client import split_addr
from rmqbroker.remoting.server import RemotingServer
from rmqbroker.runtime import Supervisor, run_until_signal, setup_logging

log = logging.getLogger(__name__)


class Namesrv:
    """A nameserver: remoting server + route table + broker expiry scan."""

    def __init__(self, host: str, port: int, broker_expiry_seconds: float = 120.0,
                 scan_interval_seconds: float = 10.0) -> None:
        self.routes = RouteInfoManager()
        self.server = RemotingServer(host, port, name="namesrv")
        NamesrvProcessor(self.routes).register(self.server)
        self.broker_expiry_seconds = broker_expiry_seconds
        self.scan_interval_seconds = scan_interval_seconds
        self.supervisor = Supervisor()

    async def start(self) -> None:
        await self.server.start()

        async def scan() -> None:
            self.routes.scan_not_active(self.broker_expiry_seconds)

        self.supervisor.every("broker-expiry-scan", self.scan_interval_seconds, scan,
                              initial_delay=min(5.0, self.scan_interval_seconds))

    async def stop(self) -> None:
        await self.supervisor.stop()
        await self.server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rmq-namesrv", description="RocketMQ-compatible nameserver")
    parser.add_argument("--listen", default=os.environ.get("RMQ_NAMESRV_LISTEN", "0.0.0.0:9876"),
                        help="HOST:PORT to listen on (env RMQ_NAMESRV_LISTEN, default 0.0.0.0:9876)")
    parser.add_argument("--broker-expiry-seconds", type=float,
                        default=float(os.environ.get("RMQ_NAMESRV_BROKER_EXPIRY_SECONDS", "120")),
                        help="drop a broker that has not registered for this long (default 120)")
    parser.add_argument("--scan-interval-seconds", type=float, default=10.0)
    parser.add_argument("--log-level", default=os.environ.get("RMQ_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        host, port = split_addr(args.listen)
    except ValueError as exc:
        parser.error(str(exc))

    async def run(stop: asyncio.Event) -> None:
        ns = Namesrv(host, port, args.broker_expiry_seconds, args.scan_interval_seconds)
        await ns.start()
        print(f"rmq-namesrv listening on {host}:{ns.server.port}", flush=True)
        await stop.wait()
        log.info("shutting down")
        await ns.stop()

    run_until_signal(run)


if __name__ == "__main__":
    main()
