"""Topic configuration: ``TopicConfig``, name validation, system topics and ``topics.json`` (§5.1).

The manager owns the broker's topic table and its DataVersion.  Its JSON wrapper
``{"dataVersion":…,"topicConfigTable":…}`` is the file content, the GET_ALL_TOPIC_CONFIG body and
the ``topicConfigSerializeWrapper`` of REGISTER_BROKER.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqbroker.metadata._coerce import as_bool, as_int, as_object, as_str
from rmqbroker.metadata.data_version import DataVersion
from rmqbroker.metadata.errors import MetadataFormatError
from rmqbroker.metadata.jsonfile import fastjson_loads
from rmqbroker.metadata.versioned import VersionedTableFile, decode_wrapper

log = logging.getLogger(__name__)

# Permission bits (PermName).
PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1

SINGLE_TAG = "SINGLE_TAG"
MULTI_TAG = "MULTI_TAG"

DEFAULT_QUEUE_NUMS = 16

# Well-known topic names.
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
BENCHMARK_TOPIC = "BenchmarkTest"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SCHEDULE_TOPIC_QUEUE_NUMS = 18
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
REPLY_TOPIC_SUFFIX = "_REPLY_TOPIC"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

TOPIC_MAX_LENGTH = 127

#: Topics an admin may not create or update (UPDATE_AND_CREATE_TOPIC, §2.13).
SYSTEM_TOPICS: frozenset[str] = frozenset(
    {
        AUTO_CREATE_TOPIC_KEY_TOPIC,
        SCHEDULE_TOPIC,
        BENCHMARK_TOPIC,
        TRANS_HALF_TOPIC,
        TRACE_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT,
    }
)

#: Topics producers may not send to (§2.4 step 1, answered with NO_PERMISSION).
NOT_ALLOWED_SEND_TOPICS: frozenset[str] = frozenset(
    {
        SCHEDULE_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT,
    }
)

_VALID_TOPIC_CHARS = frozenset("%|-_0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def perm_readable(perm: int) -> bool:
    return perm & PERM_READ == PERM_READ


def perm_writeable(perm: int) -> bool:
    return perm & PERM_WRITE == PERM_WRITE


def perm_inherited(perm: int) -> bool:
    return perm & PERM_INHERIT == PERM_INHERIT


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


_VALID_NAME = re.compile(r"[%|a-zA-Z0-9_-]+")


def is_topic_or_group_illegal(name: str) -> bool:
    """True when ``name`` has a character outside ``^[%|a-zA-Z0-9_-]+$``."""
    return _VALID_NAME.fullmatch(name) is None and bool(name)


def validate_topic(name: str | None) -> str | None:
    """Return an error remark for an unusable topic name, or None when the name is fine."""
    if name is None or not name.strip():
        return "The topic name is blank."
    if is_topic_or_group_illegal(name):
        return f"The topic name [{name}] has illegal characters; only ^[%|a-zA-Z0-9_-]+$ is allowed."
    if len(name) > TOPIC_MAX_LENGTH:
        return f"The topic name is longer than the maximum of {TOPIC_MAX_LENGTH} characters."
    return None


def reply_topic(cluster_name: str) -> str:
    """The cluster's request-reply topic, built into every broker (RocketMQ's MixAll.getReplyTopic)."""
    return cluster_name + REPLY_TOPIC_SUFFIX


def is_system_topic(name: str) -> bool:
    return name in SYSTEM_TOPICS or name.startswith(SYSTEM_TOPIC_PREFIX)


def is_not_allowed_send_topic(name: str) -> bool:
    return name in NOT_ALLOWED_SEND_TOPICS


_TOPIC_FIELDS = frozenset(
    {"topicName", "readQueueNums", "writeQueueNums", "perm", "topicFilterType", "topicSysFlag", "order"}
)


def _filter_type(value: Any, what: str) -> str:
    # fastjson writes enums by name; an ordinal is accepted in case some tool wrote one.
    if isinstance(value, int) and not isinstance(value, bool):
        return MULTI_TAG if value == 1 else SINGLE_TAG
    return as_str(value, what)


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """One topic's configuration (immutable: derive changes with :func:`dataclasses.replace`).

    ``extra`` holds JSON fields this broker does not interpret (5.x ``attributes``, pre-4.9
    ``topicSynFlag``, …) so that they survive a load/persist round trip.
    """

    topic_name: str
    read_queue_nums: int = DEFAULT_QUEUE_NUMS
    write_queue_nums: int = DEFAULT_QUEUE_NUMS
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = SINGLE_TAG
    topic_sys_flag: int = 0
    order: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def readable(self) -> bool:
        return perm_readable(self.perm)

    @property
    def writeable(self) -> bool:
        return perm_writeable(self.perm)

    @property
    def inherited(self) -> bool:
        return perm_inherited(self.perm)

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = copy.deepcopy(self.extra) if self.extra else {}
        obj.update(
            order=self.order,
            perm=self.perm,
            readQueueNums=self.read_queue_nums,
            topicFilterType=self.topic_filter_type,
            topicName=self.topic_name,
            topicSysFlag=self.topic_sys_flag,
            writeQueueNums=self.write_queue_nums,
        )
        # fastjson sorts properties alphabetically; doing the same keeps diffs against Java files small.
        return dict(sorted(obj.items()))

    @classmethod
    def from_json_obj(cls, obj: Any, name: str | None = None) -> TopicConfig:
        """Build from a JSON object; ``name`` (the table key) is used when ``topicName`` is absent."""
        what = f"topic {name!r}" if name is not None else "topic config"
        data = as_object(obj, what)
        raw_name = data.get("topicName")
        topic_name = as_str(raw_name, f"{what}.topicName") if raw_name is not None else name
        if topic_name is None:
            raise MetadataFormatError(f"{what}: no topicName")
        sys_flag_raw = data.get("topicSysFlag", data.get("topicSynFlag", 0))
        return cls(
            topic_name=topic_name,
            read_queue_nums=as_int(data.get("readQueueNums", DEFAULT_QUEUE_NUMS), f"{what}.readQueueNums"),
            write_queue_nums=as_int(data.get("writeQueueNums", DEFAULT_QUEUE_NUMS), f"{what}.writeQueueNums"),
            perm=as_int(data.get("perm", PERM_READ | PERM_WRITE), f"{what}.perm"),
            topic_filter_type=_filter_type(data.get("topicFilterType", SINGLE_TAG), f"{what}.topicFilterType"),
            topic_sys_flag=as_int(sys_flag_raw, f"{what}.topicSysFlag"),
            order=as_bool(data.get("order", False), f"{what}.order"),
            extra={k: v for k, v in data.items() if k not in _TOPIC_FIELDS},
        )


#: Called with (topic name, new config) after a topic is created or updated, (name, None) on delete.
TopicChangeListener = Callable[[str, TopicConfig | None], None]


#: Project extension of the GET_ALL_TOPIC_CONFIG body: the master's deleted topics, each with where
#: its commitlog ended when it went. A slave whose sync never saw a topic missing (deleted and
#: created again between two rounds) learns the deletion from it. Java slaves ignore the field.
DELETED_TOPICS_KEY = "deletedTopics"
#: Project extension of the GET_ALL_TOPIC_CONFIG body: the identity of the master's log (the HA
#: epoch store's ``logId``). A slave takes nothing from a master whose log is not its own (a master
#: back on a replaced volume, whose fresh table would delete the slave's topics).
LOG_ID_KEY = "logId"


def decode_topic_wrapper(text: str | bytes) -> tuple[dict[str, TopicConfig], DataVersion | None]:
    """Parse a TopicConfigSerializeWrapper (topics.json / GET_ALL_TOPIC_CONFIG body)."""
    table, version, _, _ = decode_topic_sync(text)
    return table, version


def decode_topic_sync(text: str | bytes) -> tuple[dict[str, TopicConfig], DataVersion | None, dict[str, int],
                                                  str | None]:
    """A GET_ALL_TOPIC_CONFIG body: the table, its version, the master's deleted topics
    (``DELETED_TOPICS_KEY``; empty from a master without the extension) and its log identity
    (``LOG_ID_KEY``; None from a master without it)."""
    table, version, extra = decode_wrapper(fastjson_loads(text), "topicConfigTable", TopicConfig.from_json_obj)
    log_id = extra.get(LOG_ID_KEY)
    if log_id is not None and not (isinstance(log_id, str) and log_id):
        raise MetadataFormatError(f"{LOG_ID_KEY}: not a log identity: {log_id!r}")
    raw = as_object(extra.get(DELETED_TOPICS_KEY) or {}, DELETED_TOPICS_KEY)
    deleted = {}
    for topic, end in raw.items():
        offset = as_int(end, f"{DELETED_TOPICS_KEY}.{topic}")
        if offset < 0:
            raise MetadataFormatError(f"{DELETED_TOPICS_KEY}.{topic}: negative commitlog offset {offset}")
        deleted[topic] = offset
    return table, version, deleted, log_id


class TopicConfigManager(VersionedTableFile[TopicConfig]):
    """The broker's topic table, persisted to ``<config_dir>/topics.json`` on every change.

    Mutators take ``persist=False`` for callers on the event loop that prefer to follow up with
    ``await persist_if_dirty_async()`` instead of an inline fsync.
    """

    FILE_NAME = "topics.json"
    TABLE_KEY = "topicConfigTable"
    KIND = "topic"

    @staticmethod
    def _entry_from_json(raw: Any, name: str) -> TopicConfig:
        return TopicConfig.from_json_obj(raw, name)

    def __init__(
        self,
        config_dir: Path,
        *,
        cluster_name: str,
        broker_name: str,
        auto_create_topic_enable: bool = True,
        default_topic_queue_nums: int = 8,
        cluster_topic_enable: bool = True,
        broker_topic_enable: bool = True,
        trace_topic_enable: bool = False,
        trace_topic_name: str = TRACE_TOPIC,
        autoload: bool = True,
    ) -> None:
        super().__init__(config_dir)
        self.cluster_name = cluster_name
        self.broker_name = broker_name
        self.auto_create_topic_enable = auto_create_topic_enable
        self.default_topic_queue_nums = default_topic_queue_nums
        self._listeners: list[TopicChangeListener] = []
        # The cluster/broker-name topics and the cluster's reply topic are reserved on this broker
        # like the fixed system topics.
        self._system_topics = set(SYSTEM_TOPICS) | {cluster_name, broker_name, reply_topic(cluster_name)}
        if trace_topic_enable:
            self._system_topics.add(trace_topic_name)
        self._add_builtin_topics(cluster_topic_enable, broker_topic_enable, trace_topic_enable, trace_topic_name)
        if autoload:
            self.load()

    def _add_builtin_topics(
        self, cluster_topic_enable: bool, broker_topic_enable: bool, trace_enable: bool, trace_name: str
    ) -> None:
        rw = PERM_READ | PERM_WRITE
        builtins = [TopicConfig(SELF_TEST_TOPIC, 1, 1)]
        if self.auto_create_topic_enable:
            nums = self.default_topic_queue_nums
            builtins.append(TopicConfig(AUTO_CREATE_TOPIC_KEY_TOPIC, nums, nums, rw | PERM_INHERIT))
        builtins.append(TopicConfig(BENCHMARK_TOPIC, 1024, 1024))
        builtins.append(TopicConfig(self.cluster_name, perm=PERM_INHERIT | (rw if cluster_topic_enable else 0)))
        builtins.append(TopicConfig(self.broker_name, 1, 1, PERM_INHERIT | (rw if broker_topic_enable else 0)))
        builtins.append(TopicConfig(OFFSET_MOVED_EVENT, 1, 1))
        builtins.append(TopicConfig(SCHEDULE_TOPIC, SCHEDULE_TOPIC_QUEUE_NUMS, SCHEDULE_TOPIC_QUEUE_NUMS))
        if trace_enable:
            builtins.append(TopicConfig(trace_name, 1, 1))
        # Where request-reply responders send (processors/reply.py).
        builtins.append(TopicConfig(reply_topic(self.cluster_name), 1, 1))
        for tc in builtins:
            self._table[tc.topic_name] = tc

    # -- queries --------------------------------------------------------------------------------

    def select(self, topic: str) -> TopicConfig | None:
        return self._table.get(topic)

    def topic_names(self) -> list[str]:
        with self._lock:
            return list(self._table)

    def system_topic_names(self) -> list[str]:
        """The fixed system topics and this broker's cluster, broker, reply and trace topics."""
        return sorted(self._system_topics)

    def is_system_topic(self, topic: str) -> bool:
        """System topics of this broker: the fixed set, ``rmq_sys_*`` and the cluster/broker topics."""
        return topic in self._system_topics or topic.startswith(SYSTEM_TOPIC_PREFIX)

    def wrapper_obj(self, topics: Iterable[str] | None = None) -> dict[str, Any]:
        """The TopicConfigSerializeWrapper as a JSON object, optionally restricted to ``topics``.

        The restricted form is what a broker registers after a single topic changed.
        """
        with self._lock:
            if topics is None:
                return self._snapshot_locked()
            names = sorted(t for t in set(topics) if t in self._table)
            return {
                "dataVersion": self._data_version.to_json_obj(),
                "topicConfigTable": {n: self._table[n].to_json_obj() for n in names},
            }

    # -- listeners ------------------------------------------------------------------------------

    def add_change_listener(self, listener: TopicChangeListener) -> None:
        """Register a callback run after a create/update/delete (e.g. to re-register with namesrv)."""
        self._listeners.append(listener)

    def _notify(self, topic: str, config: TopicConfig | None) -> None:
        for listener in list(self._listeners):
            try:
                listener(topic, config)
            except Exception:
                log.exception("topic change listener failed for %s", topic)

    # -- mutations ------------------------------------------------------------------------------

    def create_topic_in_send_message_method(
        self,
        topic: str,
        default_topic: str,
        remote_addr: str,
        client_default_topic_queue_nums: int,
        topic_sys_flag: int = 0,
        *,
        persist: bool = True,
    ) -> TopicConfig | None:
        """Auto-create ``topic`` from ``default_topic`` for a send (§2.4 step 2).

        Returns the existing or new config, or None when the default topic is missing or does not
        carry PERM_INHERIT (the caller then answers TOPIC_NOT_EXIST).
        """
        with self._lock:
            existing = self._table.get(topic)
            if existing is not None:
                return existing
            default = self._table.get(default_topic)
            if default is None:
                log.warning("auto-create of %s from %s refused: default topic absent", topic, default_topic)
                return None
            perm = default.perm
            if default_topic == AUTO_CREATE_TOPIC_KEY_TOPIC and not self.auto_create_topic_enable:
                # A TBW102 left in topics.json by an earlier run must not re-enable auto-creation.
                perm = PERM_READ | PERM_WRITE
            if not perm_inherited(perm):
                log.warning(
                    "auto-create of %s from %s refused: default perm %d lacks INHERIT (producer %s)",
                    topic,
                    default_topic,
                    perm,
                    remote_addr,
                )
                return None
            queue_nums = max(0, min(client_default_topic_queue_nums, default.write_queue_nums))
            created = TopicConfig(
                topic_name=topic,
                read_queue_nums=queue_nums,
                write_queue_nums=queue_nums,
                perm=perm & ~PERM_INHERIT,
                topic_filter_type=default.topic_filter_type,
                topic_sys_flag=topic_sys_flag,
            )
            self._put_locked(created)
        log.info("auto-created topic %s from %s for producer %s: %s", topic, default_topic, remote_addr, created)
        self._persist_after_change(persist)
        self._notify(topic, created)
        return created

    def create_retry_topic(
        self, topic: str, queue_nums: int, perm: int, topic_sys_flag: int = 0, *, persist: bool = True
    ) -> TopicConfig:
        """Return ``topic``, creating it with the given queues/perm if absent.

        Used for ``%RETRY%<group>`` (heartbeat, send-back, sends to a retry topic) and ``%DLQ%<group>``.
        """
        with self._lock:
            existing = self._table.get(topic)
            if existing is not None:
                return existing
            created = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=topic_sys_flag)
            self._put_locked(created)
        log.info("created topic %s: %s", topic, created)
        self._persist_after_change(persist)
        self._notify(topic, created)
        return created

    def update_topic_config(self, tc: TopicConfig, *, persist: bool = True) -> TopicConfig | None:
        """Put or replace a topic config; returns the previous one."""
        with self._lock:
            previous = self._table.get(tc.topic_name)
            self._put_locked(tc)
        if previous is None:
            log.info("created topic %s: %s", tc.topic_name, tc)
        else:
            log.info("updated topic %s: %s -> %s", tc.topic_name, previous, tc)
        self._persist_after_change(persist)
        self._notify(tc.topic_name, tc)
        return previous

    def restore_from_queues(self, queue_counts: Mapping[str, int]) -> list[str]:
        """Create a read/write config for each topic in ``queue_counts`` (topic -> queues it has in
        the store) that has none; the names created.

        A promoted slave's configs are its master's as of the last metadata round: a topic created
        since had its messages replicated but no config, so pulls of it were refused as
        TOPIC_NOT_EXIST until someone created it again.
        """
        created: list[TopicConfig] = []
        with self._lock:
            for topic, nums in sorted(queue_counts.items()):
                if topic not in self._table and nums > 0:
                    tc = TopicConfig(topic, nums, nums, PERM_READ | PERM_WRITE)
                    self._put_locked(tc)
                    created.append(tc)
        if created:
            for tc in created:
                log.warning("topic %s has messages but no config (created on the master after the last "
                            "metadata sync): restored as %s", tc.topic_name, tc)
            self._persist_after_change(True)
            for tc in created:
                self._notify(tc.topic_name, tc)
        return [tc.topic_name for tc in created]

    def update_topic_sys_flag(self, topic: str, sys_flag: int, *, persist: bool = True) -> TopicConfig | None:
        """Change a topic's sys flag (unit mode bits) if it differs; returns the resulting config."""
        with self._lock:
            current = self._table.get(topic)
            if current is None or current.topic_sys_flag == sys_flag:
                return current
            updated = dataclasses.replace(current, topic_sys_flag=sys_flag)
            self._put_locked(updated)
        self._persist_after_change(persist)
        self._notify(topic, updated)
        return updated

    def delete_topic(self, topic: str, *, persist: bool = True) -> bool:
        """Remove a topic; False if it did not exist (nothing changes then)."""
        with self._lock:
            if self._table.pop(topic, None) is None:
                return False
            self._data_version.next_version()
            self._mark_changed_locked()
        log.info("deleted topic %s", topic)
        self._persist_after_change(persist)
        self._notify(topic, None)
        return True

    def next_data_version(self) -> None:
        """Stamp the table as changed although no topic did: nameservers take a registered topic
        table again only when its version moved (a brokerPermission change rewrites every route)."""
        with self._lock:
            self._data_version.next_version()
            self._mark_changed_locked()

    def _put_locked(self, tc: TopicConfig) -> None:
        self._table[tc.topic_name] = tc
        self._data_version.next_version()
        self._mark_changed_locked()

    # -- slave sync -----------------------------------------------------------------------------
