"""Consumer (subscription) group configuration and ``subscriptionGroup.json`` (§5.4)."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqbroker.metadata._coerce import as_bool, as_int, as_object, as_str
from rmqbroker.metadata.data_version import DataVersion
from rmqbroker.metadata.errors import MetadataFormatError
from rmqbroker.metadata.jsonfile import fastjson_loads
from rmqbroker.metadata.versioned import VersionedTableFile, decode_wrapper

log = logging.getLogger(__name__)

TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"
FILTERSRV_CONSUMER_GROUP = "FILTERSRV_CONSUMER"
SELF_TEST_CONSUMER_GROUP = "SELF_TEST_C_GROUP"
ONS_HTTP_PROXY_GROUP = "CID_ONS-HTTP-PROXY"
ONSAPI_PULL_GROUP = "CID_ONSAPI_PULL"
ONSAPI_PERMISSION_GROUP = "CID_ONSAPI_PERMISSION"
ONSAPI_OWNER_GROUP = "CID_ONSAPI_OWNER"
#: Groups with this prefix are created on demand even when auto-creation is disabled.
SYS_CONSUMER_GROUP_PREFIX = "CID_RMQ_SYS_"

BUILTIN_GROUPS: tuple[str, ...] = (
    TOOLS_CONSUMER_GROUP,
    FILTERSRV_CONSUMER_GROUP,
    SELF_TEST_CONSUMER_GROUP,
    ONS_HTTP_PROXY_GROUP,
    ONSAPI_PULL_GROUP,
    ONSAPI_PERMISSION_GROUP,
    ONSAPI_OWNER_GROUP,
)

_GROUP_FIELDS = frozenset(
    {
        "groupName",
        "consumeEnable",
        "consumeFromMinEnable",
        "consumeBroadcastEnable",
        "retryQueueNums",
        "retryMaxTimes",
        "brokerId",
        "whichBrokerWhenConsumeSlowly",
        "notifyConsumerIdsChangedEnable",
    }
)


def is_sys_consumer_group(group: str) -> bool:
    return group.startswith(SYS_CONSUMER_GROUP_PREFIX)


@dataclass(frozen=True, slots=True)
class SubscriptionGroupConfig:
    """One consumer group's settings; ``extra`` keeps fields this broker does not interpret (5.x)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = copy.deepcopy(self.extra) if self.extra else {}
        obj.update(
            brokerId=self.broker_id,
            consumeBroadcastEnable=self.consume_broadcast_enable,
            consumeEnable=self.consume_enable,
            consumeFromMinEnable=self.consume_from_min_enable,
            groupName=self.group_name,
            notifyConsumerIdsChangedEnable=self.notify_consumer_ids_changed_enable,
            retryMaxTimes=self.retry_max_times,
            retryQueueNums=self.retry_queue_nums,
            whichBrokerWhenConsumeSlowly=self.which_broker_when_consume_slowly,
        )
        return dict(sorted(obj.items()))

    @classmethod
    def from_json_obj(cls, obj: Any, name: str | None = None) -> SubscriptionGroupConfig:
        """Build from a JSON object; ``name`` (the table key) is used when ``groupName`` is absent."""
        what = f"group {name!r}" if name is not None else "subscription group"
        data = as_object(obj, what)
        raw_name = data.get("groupName")
        group_name = as_str(raw_name, f"{what}.groupName") if raw_name is not None else name
        if group_name is None:
            raise MetadataFormatError(f"{what}: no groupName")
        return cls(
            group_name=group_name,
            consume_enable=as_bool(data.get("consumeEnable", True), f"{what}.consumeEnable"),
            consume_from_min_enable=as_bool(data.get("consumeFromMinEnable", True), f"{what}.consumeFromMinEnable"),
            consume_broadcast_enable=as_bool(
                data.get("consumeBroadcastEnable", True), f"{what}.consumeBroadcastEnable"
            ),
            retry_queue_nums=as_int(data.get("retryQueueNums", 1), f"{what}.retryQueueNums"),
            retry_max_times=as_int(data.get("retryMaxTimes", 16), f"{what}.retryMaxTimes"),
            broker_id=as_int(data.get("brokerId", 0), f"{what}.brokerId"),
            which_broker_when_consume_slowly=as_int(
                data.get("whichBrokerWhenConsumeSlowly", 1), f"{what}.whichBrokerWhenConsumeSlowly"
            ),
            notify_consumer_ids_changed_enable=as_bool(
                data.get("notifyConsumerIdsChangedEnable", True), f"{what}.notifyConsumerIdsChangedEnable"
            ),
            extra={k: v for k, v in data.items() if k not in _GROUP_FIELDS},
        )


def decode_subscription_group_wrapper(
    text: str | bytes,
) -> tuple[dict[str, SubscriptionGroupConfig], DataVersion | None]:
    """Parse subscriptionGroup.json / a GET_ALL_SUBSCRIPTIONGROUP_CONFIG body."""
    table, version, _ = decode_wrapper(fastjson_loads(text), "subscriptionGroupTable",
                                       SubscriptionGroupConfig.from_json_obj)
    return table, version


class SubscriptionGroupManager(VersionedTableFile[SubscriptionGroupConfig]):
    """Consumer group table persisted to ``<config_dir>/subscriptionGroup.json`` on every change."""

    FILE_NAME = "subscriptionGroup.json"
    TABLE_KEY = "subscriptionGroupTable"
    KIND = "subscription group"

    @staticmethod
    def _entry_from_json(raw: Any, name: str) -> SubscriptionGroupConfig:
        return SubscriptionGroupConfig.from_json_obj(raw, name)

    def __init__(self, config_dir: Path, auto_create: bool = True, *, autoload: bool = True) -> None:
        super().__init__(config_dir)
        self.auto_create = auto_create
        self._table.update({name: SubscriptionGroupConfig(name) for name in BUILTIN_GROUPS})
        if autoload:
            self.load()

    # -- queries --------------------------------------------------------------------------------

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        """Look up without auto-creating."""
        return self._table.get(group)

    def find(self, group: str, *, persist: bool = True) -> SubscriptionGroupConfig | None:
        """Look up ``group``; when absent and auto-creation applies, create it with defaults.

        Auto-creation applies when enabled, and always for ``CID_RMQ_SYS_*`` groups.
        """
        config = self._table.get(group)
        if config is not None:
            return config
        if not (self.auto_create or is_sys_consumer_group(group)):
            return None
        with self._lock:
            config = self._table.get(group)
            if config is not None:
                return config
            config = SubscriptionGroupConfig(group)
            self._put_locked(config)
        log.info("auto-created subscription group %s", group)
        self._persist_after_change(persist)
        return config

    # -- mutations ------------------------------------------------------------------------------

    def update(self, config: SubscriptionGroupConfig, *, persist: bool = True) -> SubscriptionGroupConfig | None:
        """Put or replace a group config; returns the previous one."""
        with self._lock:
            previous = self._table.get(config.group_name)
            self._put_locked(config)
        log.info("subscription group %s: %s -> %s", config.group_name, previous, config)
        self._persist_after_change(persist)
        return previous

    def delete(self, group: str, *, persist: bool = True) -> bool:
        with self._lock:
            if self._table.pop(group, None) is None:
                return False
            self._data_version.next_version()
            self._mark_changed_locked()
        log.info("deleted subscription group %s", group)
        self._persist_after_change(persist)
        return True

    def _put_locked(self, config: SubscriptionGroupConfig) -> None:
        self._table[config.group_name] = config
        self._data_version.next_version()
        self._mark_changed_locked()
