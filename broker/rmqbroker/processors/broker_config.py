"""The broker's settings over the wire: GET_BROKER_CONFIG (26) and UPDATE_BROKER_CONFIG (25, mqadmin
updateBrokerConfig).

An update is all or nothing: every key must be a setting and every value must parse and validate as
at start-up (config.updated_settings), else nothing changes. Keys of ``LIVE_KEYS`` take effect at once
(the context's settings object is replaced); the others only after a restart, so they are accepted
only when they can be saved to the broker.conf the broker was started with (conf_file.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable

from rmqbroker.conf_file import ConfWriteError, save_changes, unwritable_reason
from rmqbroker.config import (
    BrokerSettings,
    ConfigError,
    SettingsOrigin,
    setting_text,
    settings_properties,
    updated_settings,
)
from rmqbroker.metadata.data_version import DataVersion
from rmqbroker.processors.context import BrokerContext
from rmqbroker.properties import parse_properties
from rmqbroker.remoting import wire
from rmqbroker.remoting.codes import RequestCode, ResponseCode
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import Connection, RemotingServer

log = logging.getLogger(__name__)

# Keys applied at once. Each one's every reader reads ctx.settings when it uses the value (or the
# broker pushes the new value to it in its on-change hook); a key read once at start-up must not be
# here, or a change would be reported as made while nothing used it.
LIVE_KEYS = frozenset({
    # send/pull/ctx.writable read it per request; the broker re-registers so routes show it.
    "brokerPermission",
    # pull.py and client_manage.py, per request.
    "slaveReadEnable", "enablePropertyFilter", "filterSupportRetry", "longPollingEnable", "shortPollingTimeMills",
    # reply.py per reply; the consumer-ids notifier per change; the transaction checker per round.
    "storeReplyMessageEnable", "notifyConsumerIdsChangedEnable", "transactionTimeOut", "transactionCheckMax",
    # The broker's client scan and registration loop, per round.
    "clientChannelExpiredMillis", "registerNameServerPeriod",
    # Retention: the broker hands the clean service a new RetentionConfig, read per round.
    "fileReservedTime", "deleteWhen", "diskMaxUsedSpaceRatio", "diskSpaceWarningLevelRatio",
    "diskSpaceCleanForciblyRatio", "cleanFileForciblyEnable", "deleteCommitLogFilesInterval",
})

# Keys never changed over the wire, with why. Identity, role, addresses, ports and data directories
# are assigned per broker (by rmq-local, the operator or whoever wrote broker.conf); roles change
# through the admin endpoint's POST /role with epochs, the master through POST /ha/master.
_IDENTITY = "is the broker's identity in its cluster"
_SECRET = "is a secret, changed only where it is kept"
_TLS = "is a TLS setting, changed only in the broker's own configuration"
FORBIDDEN_KEYS: dict[str, str] = {
    "brokerClusterName": _IDENTITY, "brokerName": _IDENTITY, "brokerId": _IDENTITY,
    "brokerRole": "changes through the admin endpoint's POST /role (with an epoch)",
    "haMasterAddress": "changes through the admin endpoint's POST /ha/master",
    "adminToken": _SECRET, "adminTokenFile": _SECRET, "aclAccessKey": _SECRET, "aclSecretKey": _SECRET,
    "storePathRootDir": "is where the broker's data is", "storePathCommitLog": "is where the broker's data is",
    "listenHost": "is what the broker listens on", "listenPort": "is a listen port",
    "haListenPort": "is a listen port", "fastListenPort": "is a listen port", "adminListenPort": "is a listen port",
    # Over the wire a TLS change could only weaken the transport it arrives on.
    "tlsServerMode": _TLS, "tlsEnable": _TLS, "tlsConfigFile": _TLS,
}

# Bounds the wait for the nameservers after a brokerPermission change (the loop retries later anyway).
REGISTER_TIMEOUT_S = 5.0

OnApplied = Callable[[BrokerSettings, BrokerSettings], Awaitable[None]]


async def _nothing(old: BrokerSettings, new: BrokerSettings) -> None:
    return None


def _on_kubernetes() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


class BrokerConfigProcessor:
    """GET_BROKER_CONFIG and UPDATE_BROKER_CONFIG on one broker's context."""

    def __init__(self, ctx: BrokerContext, origin: SettingsOrigin | None = None,
                 on_applied: OnApplied = _nothing) -> None:
        self.ctx = ctx
        self.origin = origin or SettingsOrigin()
        self._on_applied = on_applied
        # The configuration's DataVersion (GetBrokerConfigResponseHeader.version): moves on each update.
        self.version = DataVersion()
        self._lock = asyncio.Lock()  # one update at a time, as Java's synchronized handler

    def register(self, server: RemotingServer) -> None:
        server.register(RequestCode.GET_BROKER_CONFIG, self.get_broker_config)
        server.register(RequestCode.UPDATE_BROKER_CONFIG, self.update_broker_config)

    async def get_broker_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin getBrokerConfig: every current setting in broker.conf format (secrets masked)."""
        version = json.dumps(self.version.to_json_obj(), separators=(",", ":"))
        return cmd.make_response(ResponseCode.SUCCESS, ext_fields={wire.VERSION: version},
                                 body=settings_properties(self.ctx.settings).encode("utf-8"))

    async def update_broker_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """mqadmin updateBrokerConfig: the body is Java properties text (MixAll.properties2String)."""
        try:
            changes = parse_properties(bytes(cmd.body or b"").decode("utf-8"))
        except UnicodeDecodeError as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"nothing changed: the body is not UTF-8 ({exc})")
        if not changes:
            return cmd.make_response(ResponseCode.SUCCESS, "nothing changed: the body has no key=value line")
        forbidden = [f"{k} {FORBIDDEN_KEYS[k]}" for k in sorted(changes) if k in FORBIDDEN_KEYS]
        if forbidden:
            # NO_PERMISSION, as Java answers a key of its configBlackList.
            return cmd.make_response(ResponseCode.NO_PERMISSION,
                                     f"nothing changed: cannot be changed at run time: {'; '.join(forbidden)}")
        async with self._lock:
            return await self._update(conn, cmd, changes)

    async def _update(self, conn: Connection, cmd: RemotingCommand, changes: dict[str, str]) -> RemotingCommand:
        old = self.ctx.settings
        live = [k for k in changes if k in LIVE_KEYS]
        later = [k for k in changes if k not in LIVE_KEYS]
        try:
            # What the next start will see, and what runs until then: both must be valid settings.
            new = updated_settings(old, changes)
            applied = updated_settings(old, {k: changes[k] for k in live})
        except ConfigError as exc:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, f"nothing changed: {exc}")
        texts = {key: setting_text(new, key) for key in changes}
        path = self.origin.conf_path
        unsaved = unwritable_reason(path) if path is not None else "the broker was started without a config file (-c)"
        if unsaved is None and path is not None:
            try:
                await asyncio.to_thread(save_changes, path, texts)
            except ConfWriteError as exc:
                log.warning("updateBrokerConfig from %s: %s", conn.remote_addr, exc)
                unsaved = str(exc)
        if unsaved is not None and later:
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, (
                f"nothing changed: {_pairs(later, texts)} would take effect only after a restart, and {unsaved}, "
                f"so nothing would ever apply it{self._lasting_hint()}"))
        log.info("updateBrokerConfig from %s: %s (applied now: %s; after a restart: %s)", conn.remote_addr,
                 _pairs(list(changes), texts), ", ".join(live) or "-", ", ".join(later) or "-")
        if live:
            self.ctx.settings = applied
            self.version.next_version()
            await self._on_applied(old, applied)
        return cmd.make_response(ResponseCode.SUCCESS, self._remark(live, later, texts, unsaved))

    def _remark(self, live: list[str], later: list[str], texts: dict[str, str], unsaved: str | None) -> str:
        parts = []
        if live:
            parts.append(f"applied now: {_pairs(live, texts)}")
        if unsaved is not None:
            parts.append(f"not saved, so lost at restart: {unsaved}{self._lasting_hint()}")
        else:
            parts.append(f"saved to {self.origin.conf_path}")
            if later:
                parts.append(f"applied after a restart: {_pairs(later, texts)}")
            shadowed = [f"{k} is also set by {self.origin.overridden[k]}, which overrides the file at restart"
                        for k in texts if k in self.origin.overridden]
            parts.extend(shadowed)
        return "; ".join(parts)

    @staticmethod
    def _lasting_hint() -> str:
        if _on_kubernetes():
            return ("; on Kubernetes broker.conf is rendered by the operator: change spec.brokerConfig of the "
                    "BrokerGroup for a lasting change")
        return ""


def _pairs(keys: list[str], texts: dict[str, str]) -> str:
    return ", ".join(f"{k}={texts[k]}" for k in keys)
