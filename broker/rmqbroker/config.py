"""Broker settings: one frozen object at a time, built from broker.conf <- env <- CLI at start-up.

A run-time change (UPDATE_BROKER_CONFIG, processors/broker_config.py) builds a new object with
:func:`updated_settings`, parsed and validated as at start-up, and replaces the broker's.

broker.conf is RocketMQ's Java properties format with RocketMQ's key names. Environment
variables override it as ``RMQ_BROKER_<KEY>`` with the key in upper snake case (``listenPort`` ->
``RMQ_BROKER_LISTEN_PORT``); ``NAMESRV_ADDR`` is honoured as in RocketMQ. Command-line ``-n`` and
``--set key=value`` override both. Unknown keys are logged once; an invalid value is fatal with
a message naming the key.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqbroker.properties import parse_properties
from rmqbroker.remoting import tls
from rmqbroker.store.config import DEFAULT_MESSAGE_DELAY_LEVEL as DEFAULT_DELAY_LEVELS
from rmqbroker.store.config import parse_delay_levels
from rmqbroker.store.message_store import ROLES
from rmqbroker.store.retention import parse_delete_when

log = logging.getLogger(__name__)

FLUSH_TYPES = ("ASYNC_FLUSH", "SYNC_FLUSH")
ACL_FILE_NAME = "plain_acl.yml"


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key."""


def _key(name: str) -> dict[str, str]:
    return {"key": name}


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Every broker.conf key the broker understands, with RocketMQ 4.9.x defaults."""

    brokerClusterName: str = field(default="DefaultCluster", metadata=_key("brokerClusterName"))
    brokerName: str = field(default_factory=socket.gethostname, metadata=_key("brokerName"))
    brokerId: int = field(default=0, metadata=_key("brokerId"))
    brokerRole: str = field(default="ASYNC_MASTER", metadata=_key("brokerRole"))
    flushDiskType: str = field(default="ASYNC_FLUSH", metadata=_key("flushDiskType"))
    namesrvAddr: str = field(default="", metadata=_key("namesrvAddr"))
    brokerIP1: str = field(default="", metadata=_key("brokerIP1"))
    brokerIP2: str = field(default="", metadata=_key("brokerIP2"))
    listenHost: str = field(default="0.0.0.0", metadata=_key("listenHost"))
    listenPort: int = field(default=10911, metadata=_key("listenPort"))
    haListenPort: int = field(default=0, metadata=_key("haListenPort"))
    # -1: listenPort - 2, as Java's "VIP channel" (fast remoting server) is; 0: none.
    fastListenPort: int = field(default=-1, metadata=_key("fastListenPort"))
    haMasterAddress: str = field(default="", metadata=_key("haMasterAddress"))
    # Project key, written by the operator: the group's replication epoch as it last recorded it
    # (-1: not known). A master whose epoch record ends below it lost its store and refuses writes.
    haGroupEpoch: int = field(default=-1, metadata=_key("haGroupEpoch"))
    adminListenPort: int = field(default=0, metadata=_key("adminListenPort"))
    adminToken: str = field(default="", metadata=_key("adminToken"))
    adminTokenFile: str = field(default="", metadata=_key("adminTokenFile"))
    storePathRootDir: str = field(default="~/store", metadata=_key("storePathRootDir"))
    aclEnable: bool = field(default=False, metadata=_key("aclEnable"))
    # Project key (Java reads ${ROCKETMQ_HOME}/conf/plain_acl.yml): default <storePathRootDir>/config/plain_acl.yml.
    aclFile: str = field(default="", metadata=_key("aclFile"))
    # Project keys: the account a slave signs its metadata-sync requests to the master with.
    aclAccessKey: str = field(default="", metadata=_key("aclAccessKey"))
    aclSecretKey: str = field(default="", metadata=_key("aclSecretKey"))
    storePathCommitLog: str = field(default="", metadata=_key("storePathCommitLog"))
    mappedFileSizeCommitLog: int = field(default=1073741824, metadata=_key("mappedFileSizeCommitLog"))
    mappedFileSizeConsumeQueue: int = field(default=6000000, metadata=_key("mappedFileSizeConsumeQueue"))
    defaultTopicQueueNums: int = field(default=8, metadata=_key("defaultTopicQueueNums"))
    autoCreateTopicEnable: bool = field(default=True, metadata=_key("autoCreateTopicEnable"))
    autoCreateSubscriptionGroup: bool = field(default=True, metadata=_key("autoCreateSubscriptionGroup"))
    messageDelayLevel: str = field(default=DEFAULT_DELAY_LEVELS, metadata=_key("messageDelayLevel"))
    maxMessageSize: int = field(default=4194304, metadata=_key("maxMessageSize"))
    brokerPermission: int = field(default=6, metadata=_key("brokerPermission"))
    syncFlushTimeout: int = field(default=5000, metadata=_key("syncFlushTimeout"))
    slaveTimeout: int = field(default=3000, metadata=_key("slaveTimeout"))
    flushIntervalCommitLog: int = field(default=500, metadata=_key("flushIntervalCommitLog"))
    flushIntervalConsumeQueue: int = field(default=1000, metadata=_key("flushIntervalConsumeQueue"))
    flushConsumerOffsetInterval: int = field(default=5000, metadata=_key("flushConsumerOffsetInterval"))
    flushDelayOffsetInterval: int = field(default=10000, metadata=_key("flushDelayOffsetInterval"))
    longPollingEnable: bool = field(default=True, metadata=_key("longPollingEnable"))
    shortPollingTimeMills: int = field(default=1000, metadata=_key("shortPollingTimeMills"))
    slaveReadEnable: bool = field(default=False, metadata=_key("slaveReadEnable"))
    # SQL92 selectors (filter/sql92.py), off by default as in RocketMQ; with filterSupportRetry a
    # group's retry messages are filtered by its selector of their original topic.
    enablePropertyFilter: bool = field(default=False, metadata=_key("enablePropertyFilter"))
    filterSupportRetry: bool = field(default=False, metadata=_key("filterSupportRetry"))
    # Transactional messages (processors/transaction.py), with RocketMQ's defaults.
    rejectTransactionMessage: bool = field(default=False, metadata=_key("rejectTransactionMessage"))
    transactionTimeOut: int = field(default=6000, metadata=_key("transactionTimeOut"))
    transactionCheckMax: int = field(default=15, metadata=_key("transactionCheckMax"))
    transactionCheckInterval: int = field(default=60000, metadata=_key("transactionCheckInterval"))
    # Request-reply (processors/reply.py): a reply pushed to its requester is stored in its topic too.
    storeReplyMessageEnable: bool = field(default=True, metadata=_key("storeReplyMessageEnable"))
    registerNameServerPeriod: int = field(default=30000, metadata=_key("registerNameServerPeriod"))
    # Project key (Java samples its broker stats every 10 s, fixed): the sampling period of
    # VIEW_BROKER_STATS_DATA's figures (broker_stats.py); the hour and day samplings scale with it.
    statsSamplingInterval: int = field(default=10000, metadata=_key("statsSamplingInterval"))
    notifyConsumerIdsChangedEnable: bool = field(default=True, metadata=_key("notifyConsumerIdsChangedEnable"))
    clientChannelExpiredMillis: int = field(default=120000, metadata=_key("clientChannelExpiredMillis"))
    # Java's NettyServerConfig key: a remoting connection with no frame either way this long is
    # closed (clients heartbeat every 30 s); 0 never closes one.
    serverChannelMaxIdleTimeSeconds: int = field(default=120, metadata=_key("serverChannelMaxIdleTimeSeconds"))
    haSendHeartbeatInterval: int = field(default=5000, metadata=_key("haSendHeartbeatInterval"))
    haHousekeepingInterval: int = field(default=20000, metadata=_key("haHousekeepingInterval"))
    # Larger than Java's 32 KiB: per-frame costs dominate replication throughput in Python.
    haTransferBatchSize: int = field(default=1048576, metadata=_key("haTransferBatchSize"))
    haSlaveFallbehindMax: int = field(default=268435456, metadata=_key("haSlaveFallbehindMax"))
    # Project key: while no SYNC_MASTER send waits, the master pushes a slave's next bytes once it
    # has acknowledged the previous push (fewer, larger pushes; see ha/master.py).
    haPushAfterAck: bool = field(default=True, metadata=_key("haPushAfterAck"))
    # Project key: a slave forwards clients' writes (stale routes after a hand-over or failover)
    # to the master it streams from instead of refusing them (processors/relay.py).
    relaySendsToMaster: bool = field(default=True, metadata=_key("relaySendsToMaster"))
    slaveSyncInitialDelay: int = field(default=3000, metadata=_key("slaveSyncInitialDelay"))
    slaveSyncInterval: int = field(default=10000, metadata=_key("slaveSyncInterval"))
    checkCRCOnRecover: bool = field(default=True, metadata=_key("checkCRCOnRecover"))
    # Index files for QUERY_MESSAGE (store/index.py); an index file is 40 + 4 * slots + 20 * entries bytes.
    messageIndexEnable: bool = field(default=True, metadata=_key("messageIndexEnable"))
    maxHashSlotNum: int = field(default=5000000, metadata=_key("maxHashSlotNum"))
    maxIndexNum: int = field(default=20000000, metadata=_key("maxIndexNum"))
    # Retention (store/retention.py): hours of the day to delete expired files, and their age in hours.
    deleteWhen: str = field(default="04", metadata=_key("deleteWhen"))
    fileReservedTime: int = field(default=72, metadata=_key("fileReservedTime"))
    diskMaxUsedSpaceRatio: int = field(default=75, metadata=_key("diskMaxUsedSpaceRatio"))
    # Java 4.x reads these two from JVM properties (as fractions); 5.x made them percent keys.
    diskSpaceWarningLevelRatio: int = field(default=90, metadata=_key("diskSpaceWarningLevelRatio"))
    diskSpaceCleanForciblyRatio: int = field(default=85, metadata=_key("diskSpaceCleanForciblyRatio"))
    cleanFileForciblyEnable: bool = field(default=True, metadata=_key("cleanFileForciblyEnable"))
    cleanResourceInterval: int = field(default=10000, metadata=_key("cleanResourceInterval"))
    deleteCommitLogFilesInterval: int = field(default=100, metadata=_key("deleteCommitLogFilesInterval"))
    # TLS on the remoting ports (remoting/tls.py). Java takes the mode and the client switch as JVM
    # properties (-Dtls.server.mode, -Dtls.enable) and certificates from its tls.properties file.
    tlsServerMode: str = field(default="permissive", metadata=_key("tlsServerMode"))
    tlsEnable: bool = field(default=False, metadata=_key("tlsEnable"))
    tlsConfigFile: str = field(default=tls.DEFAULT_CONFIG_FILE, metadata=_key("tlsConfigFile"))

    # -- derived values --
    @property
    def is_slave(self) -> bool:
        return self.brokerRole == "SLAVE"

    @property
    def host_ip(self) -> str:
        return self.brokerIP1 or default_ip()

    @property
    def ha_port(self) -> int:
        # Unlike Java 4.x, a configured haListenPort is honoured.
        return self.haListenPort if self.haListenPort > 0 else self.listenPort + 1

    @property
    def fast_port(self) -> int:
        """The VIP channel's port (0: none)."""
        return self.listenPort - 2 if self.fastListenPort < 0 else self.fastListenPort

    @property
    def broker_addr(self) -> str:
        return f"{self.host_ip}:{self.listenPort}"

    @property
    def ha_server_addr(self) -> str:
        return f"{self.brokerIP2 or self.host_ip}:{self.ha_port}"

    @property
    def store_root(self) -> Path:
        return Path(os.path.expanduser(self.storePathRootDir))

    @property
    def acl_path(self) -> Path:
        return Path(os.path.expanduser(self.aclFile)) if self.aclFile else self.store_root / "config" / ACL_FILE_NAME

    @property
    def commitlog_dir(self) -> Path:
        return Path(os.path.expanduser(self.storePathCommitLog)) if self.storePathCommitLog \
            else self.store_root / "commitlog"

    @property
    def namesrv_addrs(self) -> list[str]:
        return [a.strip() for a in self.namesrvAddr.split(";") if a.strip()]

    def tls_settings(self) -> tls.TlsSettings:
        """The remoting ports' TLS settings, with tlsConfigFile read and its certificates loaded."""
        try:
            return tls.load_settings(self.tlsServerMode, self.tlsEnable, self.tlsConfigFile)
        except tls.TlsConfigError as exc:
            raise ConfigError(f"TLS: {exc}") from exc

    def admin_token(self) -> str:
        """The configured admin bearer token ("" when none is configured)."""
        if self.adminTokenFile:
            try:
                token = Path(self.adminTokenFile).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"adminTokenFile: cannot read {self.adminTokenFile}: {exc}") from exc
            if not token:
                # An empty file must not silently open the endpoint.
                raise ConfigError(f"adminTokenFile: {self.adminTokenFile} is empty")
            return token
        return self.adminToken


_FIELDS = {f.metadata["key"]: f for f in dataclasses.fields(BrokerSettings)}
# Keys whose values never leave the process (GET_BROKER_CONFIG answers them masked).
SECRET_KEYS = frozenset({"adminToken", "aclSecretKey"})


def setting_text(s: BrokerSettings, key: str) -> str:
    """One setting's value as broker.conf spells it (booleans in lower case), unmasked."""
    value = getattr(s, key)
    return str(value).lower() if isinstance(value, bool) else str(value)


def settings_properties(s: BrokerSettings) -> str:
    """Every setting as ``key=value`` lines (broker.conf format, Java's getAllConfigsFormatString),
    secrets masked."""
    lines = []
    for key in sorted(_FIELDS):
        text = setting_text(s, key)
        if key in SECRET_KEYS and text:
            text = "******"
        lines.append(f"{key}={text}")
    return "\n".join(lines) + "\n"


_SNAKE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


_ENV_PREFIX = "RMQ_BROKER_"


def env_name(key: str) -> str:
    return _ENV_PREFIX + _SNAKE.sub("_", key).upper()


_ENV_KEYS: dict[str, str] = {env_name(key): key for key in _FIELDS}


def default_ip() -> str:
    """RocketMQ's choice: a non-loopback IPv4 address of this host, else 127.0.0.1."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent for a UDP connect
            ip = str(s.getsockname()[0])
            if not ip.startswith("127."):
                return ip
    except OSError:
        pass
    return "127.0.0.1"


def _convert(key: str, raw: str, typ: Any) -> Any:
    if typ in ("bool", bool):
        # Java Boolean.parseBoolean would silently take anything but "true" as false; a
        # typo in a production config deserves an error instead.
        low = raw.strip().lower()
        if low not in ("true", "false"):
            raise ConfigError(f"{key}: expected true or false, got {raw!r}")
        return low == "true"
    if typ in ("int", int):
        try:
            return int(raw.strip())
        except ValueError as exc:
            raise ConfigError(f"{key}: expected an integer, got {raw!r}") from exc
    return raw.strip()


_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _host_problem(host: str) -> str | None:
    """Why ``host`` is neither an IPv4 address nor a host name (RFC 1123), or None."""
    if not host:
        return "empty host"
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    # A name whose last label is numeric can only be meant as an IPv4 address (RFC 1123 2.1):
    # judging it as one keeps 999.1.1.1 or 10.0.0 from passing as host names.
    if labels[-1].isdigit():
        try:
            ipaddress.IPv4Address(name)
        except ValueError:
            return f"{host!r} is not a valid IPv4 address"
        return None
    if len(name) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        return f"{host!r} is not an IPv4 address or host name"
    return None


def _address_problem(addr: str) -> str | None:
    """Why ``addr`` is not ``host:port``, or None."""
    host, sep, port = addr.rpartition(":")
    if not sep:
        return f"{addr!r} is not host:port"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"{addr!r}: {port!r} is not a TCP port"
    problem = _host_problem(host)
    return f"{addr!r}: {problem}" if problem else None


def _validate_addresses(s: BrokerSettings) -> None:
    for key in ("brokerIP1", "brokerIP2"):
        value = getattr(s, key)
        problem = _host_problem(value) if value else None
        if problem:
            raise ConfigError(f"{key}: {problem}")
    if s.haMasterAddress:
        problem = _address_problem(s.haMasterAddress)
        if problem:
            raise ConfigError(f"haMasterAddress: {problem}")
    if s.namesrvAddr.strip():
        # Empty entries ("a:1;") are tolerated as RocketMQ does; namesrv_addrs skips them too.
        for addr in s.namesrv_addrs:
            problem = _address_problem(addr)
            if problem:
                raise ConfigError(f"namesrvAddr: {problem} (expected host:port;host:port)")
        if not s.namesrv_addrs:
            raise ConfigError(f"namesrvAddr: {s.namesrvAddr!r} has no host:port")


def _validate(s: BrokerSettings) -> None:
    if s.brokerRole not in ROLES:
        raise ConfigError(f"brokerRole: expected one of {', '.join(ROLES)}, got {s.brokerRole!r}")
    if s.tlsServerMode not in tls.MODES:
        raise ConfigError(f"tlsServerMode: expected one of {', '.join(tls.MODES)}, got {s.tlsServerMode!r}")
    if s.flushDiskType not in FLUSH_TYPES:
        raise ConfigError(f"flushDiskType: expected one of {', '.join(FLUSH_TYPES)}, got {s.flushDiskType!r}")
    if s.brokerRole == "SLAVE" and s.brokerId <= 0:
        raise ConfigError("brokerId: a SLAVE needs brokerId > 0")
    for key in ("listenPort", "haListenPort", "adminListenPort"):
        value = getattr(s, key)
        if not 0 <= value <= 65535:
            raise ConfigError(f"{key}: {value} is not a TCP port")
    if s.listenPort == 0:
        raise ConfigError("listenPort: must be set")
    if not -1 <= s.fastListenPort <= 65535:
        raise ConfigError(f"fastListenPort: {s.fastListenPort} is not a TCP port (0 turns the VIP channel off)")
    if s.fast_port and s.fast_port in (s.listenPort, s.ha_port, s.adminListenPort):
        raise ConfigError(f"fastListenPort: {s.fast_port} is already the remoting, HA or admin port")
    if s.fastListenPort < 0 and s.listenPort <= 2:
        raise ConfigError("fastListenPort: listenPort - 2 is no port; set fastListenPort (0 for none)")
    for key in ("mappedFileSizeCommitLog", "maxMessageSize", "defaultTopicQueueNums", "transactionTimeOut",
                "transactionCheckInterval", "statsSamplingInterval"):
        if getattr(s, key) <= 0:
            raise ConfigError(f"{key}: must be positive")
    if s.mappedFileSizeConsumeQueue <= 0 or s.mappedFileSizeConsumeQueue % 20:
        raise ConfigError("mappedFileSizeConsumeQueue: must be a positive multiple of 20")
    if s.maxMessageSize + 1024 > s.mappedFileSizeCommitLog:
        raise ConfigError("mappedFileSizeCommitLog: must be larger than maxMessageSize")
    if not re.fullmatch(r"[a-zA-Z0-9_%|-]+", s.brokerName):
        raise ConfigError(f"brokerName: {s.brokerName!r} has characters outside [a-zA-Z0-9_%|-]")
    try:
        parse_delay_levels(s.messageDelayLevel)
    except ValueError as exc:
        raise ConfigError(f"messageDelayLevel: {exc}") from exc
    try:
        parse_delete_when(s.deleteWhen)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if not 0 <= s.brokerPermission <= 15:
        raise ConfigError(f"brokerPermission: {s.brokerPermission} is not a permission (4 read, 2 write, 6 both)")
    for key in ("clientChannelExpiredMillis", "registerNameServerPeriod"):
        if getattr(s, key) <= 0:
            raise ConfigError(f"{key}: must be a positive number of milliseconds")
    if s.shortPollingTimeMills < 0:
        raise ConfigError("shortPollingTimeMills: must not be negative (milliseconds)")
    if s.serverChannelMaxIdleTimeSeconds < 0:
        raise ConfigError("serverChannelMaxIdleTimeSeconds: must not be negative (0: never close an idle connection)")
    if s.maxHashSlotNum <= 0:
        raise ConfigError("maxHashSlotNum: must be positive")
    if s.maxIndexNum <= 1:
        raise ConfigError("maxIndexNum: must be above 1")
    if s.fileReservedTime <= 0:
        raise ConfigError("fileReservedTime: must be a positive number of hours")
    if not 10 <= s.diskMaxUsedSpaceRatio <= 95:
        # Java clamps silently; a value outside is a typo worth an error.
        raise ConfigError(f"diskMaxUsedSpaceRatio: {s.diskMaxUsedSpaceRatio} is outside 10-95 (percent)")
    for key in ("diskSpaceWarningLevelRatio", "diskSpaceCleanForciblyRatio"):
        if not 1 <= getattr(s, key) <= 100:
            raise ConfigError(f"{key}: {getattr(s, key)} is outside 1-100 (percent)")
    if s.diskSpaceCleanForciblyRatio > s.diskSpaceWarningLevelRatio:
        raise ConfigError("diskSpaceCleanForciblyRatio: must not exceed diskSpaceWarningLevelRatio "
                          "(a full disk is writable again once under the forced-clean ratio)")
    if s.cleanResourceInterval <= 0:
        raise ConfigError("cleanResourceInterval: must be a positive number of milliseconds")
    if s.deleteCommitLogFilesInterval < 0:
        raise ConfigError("deleteCommitLogFilesInterval: must not be negative (milliseconds)")
    if bool(s.aclAccessKey) != bool(s.aclSecretKey):
        raise ConfigError("aclAccessKey/aclSecretKey: set both or neither")
    _validate_addresses(s)


# Unknown keys already reported by this process: settings may be built more than once (the
# operator validates every reconcile), and one warning per key is enough to spot a typo.
_warned_unknown: set[str] = set()


def _unknown(key: str, source: str) -> None:
    if key not in _warned_unknown:
        _warned_unknown.add(key)
        log.warning("%s: unknown key %r ignored", source, key)


def build_settings(
    conf_text: str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> BrokerSettings:
    """broker.conf text <- environment <- explicit overrides, validated.

    Unknown keys (from any of the three) are logged once per process and ignored, as RocketMQ
    ignores unknown properties; an invalid value of a known key raises :class:`ConfigError`.
    """
    env = os.environ if env is None else env
    raw: dict[str, str] = {}
    if conf_text:
        for key, value in parse_properties(conf_text).items():
            if key in _FIELDS:
                raw[key] = value
            else:
                _unknown(key, "broker.conf")
    if env.get("NAMESRV_ADDR"):
        raw["namesrvAddr"] = env["NAMESRV_ADDR"]
    for name, value in env.items():
        if name.startswith(_ENV_PREFIX):
            env_key = _ENV_KEYS.get(name)
            if env_key is None:
                _unknown(name, "environment")
            else:
                raw[env_key] = value
    for key, value in (overrides or {}).items():
        if key in _FIELDS:
            raw[key] = value
        else:
            _unknown(key, "--set")
    kwargs = {key: _convert(key, value, _FIELDS[key].type) for key, value in raw.items()}
    settings = BrokerSettings(**kwargs)
    _validate(settings)
    return settings


def updated_settings(current: BrokerSettings, changes: Mapping[str, str]) -> BrokerSettings:
    """``current`` with ``changes`` (broker.conf key -> value text) applied, each value parsed and the
    result validated exactly as at start-up. Unlike start-up, an unknown key is an error: a change
    that would be ignored must not be reported as made. Raises :class:`ConfigError` naming the key."""
    unknown = sorted(k for k in changes if k not in _FIELDS)
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: not a broker setting")
    kwargs = {key: _convert(key, value, _FIELDS[key].type) for key, value in changes.items()}
    settings = dataclasses.replace(current, **kwargs)
    _validate(settings)
    return settings


@dataclass(frozen=True)
class SettingsOrigin:
    """Where a broker's settings came from: what a run-time change needs to be saved for the next start."""

    # The broker.conf given with -c (None: the broker runs on defaults, environment and --set only).
    conf_path: Path | None = None
    # Keys set by a source that overrides broker.conf at start-up -> that source, for the operator.
    overridden: Mapping[str, str] = field(default_factory=dict)


def override_sources(env: Mapping[str, str] | None = None,
                     overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The keys the environment and the command line set (so broker.conf's values of them are not
    used at start-up), each with where it is set; mirrors :func:`build_settings`'s precedence."""
    env = os.environ if env is None else env
    out: dict[str, str] = {}
    if env.get("NAMESRV_ADDR"):
        out["namesrvAddr"] = "the environment variable NAMESRV_ADDR"
    for name in env:
        key = _ENV_KEYS.get(name)
        if key is not None:
            out[key] = f"the environment variable {name}"
    for key in overrides or {}:
        if key in _FIELDS:
            out[key] = "the command line"
    return out
