"""`rmq-namesrv` entry point."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from rmqbroker.metadata.errors import MetadataError
from rmqbroker.namesrv.kvconfig import DEFAULT_PATH, KVConfigStore
from rmqbroker.namesrv.processor import NamesrvProcessor
from rmqbroker.namesrv.routeinfo import RouteInfoManager
from rmqbroker.remoting.client import split_addr
from rmqbroker.remoting.server import IDLE_SECONDS, RemotingServer
from rmqbroker.remoting.tls import DEFAULT_CONFIG_FILE as DEFAULT_TLS_FILE
from rmqbroker.remoting.tls import MODES, TlsSettings
from rmqbroker.remoting.tls import load_settings as load_tls_settings
from rmqbroker.runtime import Supervisor, raise_fd_limit, run_until_signal, setup_logging

log = logging.getLogger(__name__)


class Namesrv:
    """A nameserver: remoting server + route table + KV config + broker expiry scan.

    ``kv`` must be loaded already (:meth:`KVConfigStore.load`), so that a corrupt file stops the
    process before it serves anything.
    """

    def __init__(self, host: str, port: int, broker_expiry_seconds: float = 120.0,
                 scan_interval_seconds: float = 10.0, kv: KVConfigStore | None = None,
                 order_message_enable: bool = False, tls: TlsSettings | None = None,
                 idle_seconds: float = IDLE_SECONDS) -> None:
        self.routes = RouteInfoManager()
        self.kv = kv if kv is not None else KVConfigStore(None)
        self.tls = tls
        self.server = RemotingServer(host, port, name="namesrv", tls=tls, idle_seconds=idle_seconds)
        self.host = host
        self.order_message_enable = order_message_enable
        NamesrvProcessor(self.routes, self.kv, order_message_enable, self.config_properties).register(self.server)
        self.broker_expiry_seconds = broker_expiry_seconds
        self.scan_interval_seconds = scan_interval_seconds
        self.supervisor = Supervisor()

    def config_properties(self) -> dict[str, str]:
        """GET_NAMESRV_CONFIG: the options this nameserver runs with, under Java's NamesrvConfig /
        NettyServerConfig names where Java has the option (listenPort, kvConfigPath,
        orderMessageEnable); Java's broker expiry and scan period are constants, so those are ours."""
        props = {
            "listenHost": self.host,
            "listenPort": str(self.server.port),  # the bound port, also when 0 was asked for
            "orderMessageEnable": "true" if self.order_message_enable else "false",
            "brokerExpirySeconds": _number(self.broker_expiry_seconds),
            "scanIntervalSeconds": _number(self.scan_interval_seconds),
            "serverChannelMaxIdleTimeSeconds": _number(self.server.idle_seconds),
        }
        if self.kv.path is not None:
            props["kvConfigPath"] = str(self.kv.path)
        return props

    async def start(self) -> None:
        await self.server.start()

        async def scan() -> None:
            self.routes.scan_not_active(self.broker_expiry_seconds)

        self.supervisor.every("broker-expiry-scan", self.scan_interval_seconds, scan,
                              initial_delay=min(5.0, self.scan_interval_seconds))

    async def stop(self) -> None:
        await self.supervisor.stop()
        await self.server.stop()


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else str(value)


def _bool(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")
    return value.lower() == "true"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rmq-namesrv", description="RocketMQ-compatible nameserver")
    parser.add_argument("--listen", default=os.environ.get("RMQ_NAMESRV_LISTEN", "0.0.0.0:9876"),
                        help="HOST:PORT to listen on (env RMQ_NAMESRV_LISTEN, default 0.0.0.0:9876)")
    parser.add_argument("--broker-expiry-seconds", type=float,
                        default=float(os.environ.get("RMQ_NAMESRV_BROKER_EXPIRY_SECONDS", "120")),
                        help="drop a broker that has not registered for this long (default 120)")
    parser.add_argument("--scan-interval-seconds", type=float, default=10.0)
    parser.add_argument("--kv-config-path", type=Path,
                        default=Path(os.environ.get("RMQ_NAMESRV_KV_CONFIG_PATH", str(DEFAULT_PATH))),
                        help="the KV config file, RocketMQ's kvConfig.json (env RMQ_NAMESRV_KV_CONFIG_PATH, "
                             "default ~/namesrv/kvConfig.json); its directory must be writable for changes")
    parser.add_argument("--order-message-enable", type=_bool, nargs="?", const=True, default=None,
                        help="routes carry the topic's orderTopicConf (KV namespace ORDER_TOPIC_CONFIG); "
                             "true or false, alone means true (env RMQ_NAMESRV_ORDER_MESSAGE_ENABLE, default false)")
    parser.add_argument("--tls-server-mode", choices=MODES,
                        default=os.environ.get("RMQ_NAMESRV_TLS_SERVER_MODE", "permissive"),
                        help="TLS on the listen port, RocketMQ's tls.server.mode: disabled, permissive (plain and TLS "
                             "clients) or enforcing (TLS only) (env RMQ_NAMESRV_TLS_SERVER_MODE, default permissive)")
    parser.add_argument("--tls-config-file", default=os.environ.get("RMQ_NAMESRV_TLS_CONFIG_FILE", DEFAULT_TLS_FILE),
                        help="RocketMQ's tls.properties: certificates, client authentication, test mode (env "
                             f"RMQ_NAMESRV_TLS_CONFIG_FILE, default {DEFAULT_TLS_FILE}, read when it exists)")
    parser.add_argument("--server-channel-max-idle-seconds", type=float,
                        default=float(os.environ.get("RMQ_NAMESRV_SERVER_CHANNEL_MAX_IDLE_SECONDS", str(IDLE_SECONDS))),
                        help="close a connection with no frame either way for this long, Java's "
                             "serverChannelMaxIdleTimeSeconds (env RMQ_NAMESRV_SERVER_CHANNEL_MAX_IDLE_SECONDS, "
                             "default 120; 0: never)")
    parser.add_argument("--log-level", default=os.environ.get("RMQ_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    if args.server_channel_max_idle_seconds < 0:
        parser.error("--server-channel-max-idle-seconds must not be negative")
    setup_logging(args.log_level)
    raise_fd_limit()
    try:
        host, port = split_addr(args.listen)
        if args.order_message_enable is None:
            args.order_message_enable = _bool(os.environ.get("RMQ_NAMESRV_ORDER_MESSAGE_ENABLE", "false"))
        tls = load_tls_settings(args.tls_server_mode, False, args.tls_config_file)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        parser.error(str(exc))
    kv = KVConfigStore(args.kv_config_path)
    try:
        kv.load()
    except MetadataError as exc:
        # An operator's mistake, not a bug: say which file and why, without a traceback.
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None and str(exc.__cause__) not in str(exc) else ""
        print(f"rmq-namesrv: cannot load the KV config: {exc}{cause}", file=sys.stderr)
        sys.exit(2)

    async def run(stop: asyncio.Event) -> None:
        ns = Namesrv(host, port, args.broker_expiry_seconds, args.scan_interval_seconds, kv,
                     args.order_message_enable, tls, args.server_channel_max_idle_seconds)
        try:
            await ns.start()
        except OSError as exc:
            # A port in use is a set-up mistake, not a bug: one line, no traceback, as rmq-broker says it.
            log.error("cannot start: %s", exc)
            await ns.stop()
            raise SystemExit(1) from exc
        print(f"rmq-namesrv listening on {host}:{ns.server.port}", flush=True)
        await stop.wait()
        log.info("shutting down")
        await ns.stop()

    run_until_signal(run)


if __name__ == "__main__":
    main()
