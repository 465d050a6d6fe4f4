"""Client registry: producers and consumers by group, their subscriptions, queue locks.

Fed by HEART_BEAT / UNREGISTER_CLIENT and connection closes (reference §2.6, §2.7, §2.11).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rmqbroker.filter.sql92 import FilterParseError, Selector, compile_sql92
from rmqbroker.remoting.server import Connection
from rmqbroker.store.record import java_string_hash

log = logging.getLogger(__name__)

SUB_ALL = "*"
TAG_TYPE = "TAG"
SQL92_TYPE = "SQL92"


class SubscriptionParseError(ValueError):
    """A tag expression that cannot be parsed."""


@dataclass(slots=True)
class SubscriptionData:
    topic: str
    sub_string: str
    sub_version: int
    tags: frozenset[str]
    codes: frozenset[int]
    # TAG, SQL92, or a filter this broker cannot serve: see ``unsupported``.
    expression_type: str = TAG_TYPE
    # SQL92: the compiled selector, or why it does not compile. A heartbeat keeps such a
    # subscription, so that its pulls are told their filter data does not exist (as RocketMQ's
    # ConsumerFilterManager, which leaves it out, tells them) instead of the heartbeat failing.
    selector: Selector | None = None
    filter_error: str | None = None

    @property
    def is_tag_type(self) -> bool:
        return self.expression_type == TAG_TYPE

    @property
    def matches_all(self) -> bool:
        return not self.codes

    def match_code(self, tags_code: int) -> bool:
        return not self.codes or tags_code in self.codes

    def match_tag(self, tag: str | None) -> bool:
        return not self.tags or (tag is not None and tag in self.tags)


def unsupported_filter(expression_type: str | None, *, property_filter: bool) -> str | None:
    """Why a subscription of this type cannot be served (RocketMQ's remark), or None: tag filters
    always can, SQL92 only with ``enablePropertyFilter``."""
    if expression_type is None or expression_type in ("", TAG_TYPE):
        return None
    if expression_type == SQL92_TYPE and property_filter:
        return None
    return f"The broker does not support consumer to filter message by {expression_type}"


def build_subscription(topic: str, expression: str | None, sub_version: int = 0,
                       expression_type: str | None = None, *, strict: bool = True) -> SubscriptionData:
    """Parse a TAG expression (``*``, ``TagA || TagB``; codes are computed here, never trusted) or
    compile an SQL92 selector. A selector that does not compile raises with ``strict``, else is kept
    with its ``filter_error``. Another type is kept as unsupported: read as tags, its expression
    would match no message and leave its consumer waiting without a word."""
    if expression_type == SQL92_TYPE:
        expr = (expression or "").strip()
        try:
            selector = compile_sql92(expr)
        except FilterParseError as exc:
            why = f"invalid SQL92 expression {expr!r}: {exc}"
            if strict:
                raise SubscriptionParseError(why) from exc
            return SubscriptionData(topic, expr, sub_version, frozenset(), frozenset(), SQL92_TYPE, filter_error=why)
        return SubscriptionData(topic, expr, sub_version, frozenset(), frozenset(), SQL92_TYPE, selector)
    if unsupported_filter(expression_type, property_filter=False) is not None:
        return SubscriptionData(topic, (expression or "").strip(), sub_version, frozenset(), frozenset(),
                                str(expression_type))
    expr = (expression or "").strip()
    if not expr or expr == SUB_ALL:
        return SubscriptionData(topic, SUB_ALL, sub_version, frozenset(), frozenset())
    tags = [t.strip() for t in expr.split("||")]
    tags = [t for t in tags if t]
    if not tags:
        raise SubscriptionParseError(f"subscription expression {expression!r} has no tags")
    return SubscriptionData(topic, expr, sub_version, frozenset(tags),
                            frozenset(java_string_hash(t) for t in tags))


def _enum(value: Any, names: tuple[str, ...], default: int) -> int:
    # C++ sends ordinals, Java sends enum names; accept both.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value in names:
            return names.index(value)
        if value.isdigit():
            return int(value)
    return default


CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
CONSUME_FROM = ("CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                "CONSUME_FROM_MIN_OFFSET", "CONSUME_FROM_MAX_OFFSET", "CONSUME_FROM_FIRST_OFFSET",
                "CONSUME_FROM_TIMESTAMP")


@dataclass(slots=True)
class ClientChannel:
    client_id: str
    conn: Connection
    language: str
    version: int
    last_update: float


@dataclass
class ConsumerGroupInfo:
    group: str
    consume_type: int = 1
    message_model: int = 1
    consume_from_where: int = 0
    channels: dict[int, ClientChannel] = field(default_factory=dict)  # by connection id
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return sorted({ch.client_id for ch in self.channels.values()})


@dataclass(slots=True)
class _Lock:
    client_id: str
    last_update: float


def _latest(client_id: str, channels: Iterable[ClientChannel]) -> ClientChannel | None:
    """The open one of ``channels`` of ``client_id`` heard from last."""
    found: ClientChannel | None = None
    for ch in channels:
        if ch.client_id == client_id and not ch.conn.closed and (found is None or ch.last_update > found.last_update):
            found = ch
    return found


class ClientManager:
    """Consumer and producer groups, keyed by the connections their heartbeats arrive on."""

    def __init__(self, notify: Callable[[str, list[Connection]], None] | None = None,
                 lock_max_live_seconds: float = 60.0) -> None:
        self.consumers: dict[str, ConsumerGroupInfo] = {}
        self.producers: dict[str, dict[int, ClientChannel]] = {}
        self._notify = notify
        self._locks: dict[tuple[str, str, int], _Lock] = {}  # (group, topic, queueId)
        self.lock_max_live_seconds = lock_max_live_seconds

    # -- registration --
    def register_consumer(self, group: str, channel: ClientChannel, consume_type: Any, message_model: Any,
                          consume_from_where: Any, subscriptions: list[SubscriptionData]) -> bool:
        """Register/refresh; returns True when the group's membership or subscriptions changed."""
        info = self.consumers.get(group)
        if info is None:
            info = ConsumerGroupInfo(group)
            self.consumers[group] = info
        info.consume_type = _enum(consume_type, CONSUME_TYPES, 1)
        info.message_model = _enum(message_model, MESSAGE_MODELS, 1)
        info.consume_from_where = _enum(consume_from_where, CONSUME_FROM, 0)
        new_channel = channel.conn.id not in info.channels
        info.channels[channel.conn.id] = channel
        changed = new_channel
        if subscriptions or not info.subscriptions:
            new_subs = {s.topic: s for s in subscriptions}
            old = {t: s.sub_string for t, s in info.subscriptions.items()}
            if old != {t: s.sub_string for t, s in new_subs.items()}:
                changed = True
            info.subscriptions = new_subs
        if new_channel:
            channel.conn.on_close(self.connection_closed)
        if changed:
            self._notify_group(info)
        return changed

    def register_producer(self, group: str, channel: ClientChannel) -> None:
        chans = self.producers.setdefault(group, {})
        if channel.conn.id not in chans:
            channel.conn.on_close(self.connection_closed)
        chans[channel.conn.id] = channel

    def any_producer(self, group: str) -> ClientChannel | None:
        """The producer of ``group`` heard from last (a transaction check goes to one of them)."""
        chans = [c for c in self.producers.get(group, {}).values() if not c.conn.closed]
        return max(chans, key=lambda c: c.last_update) if chans else None

    def find_client(self, client_id: str) -> ClientChannel | None:
        """The open connection of the client whose heartbeats carry ``client_id`` (the one heard from
        last), where a reply to its request goes. Producers first, where RocketMQ looks (a Java client
        heartbeats its internal producer group even when it only consumes), then consumers."""
        found = _latest(client_id, (ch for chans in self.producers.values() for ch in chans.values()))
        if found is None:
            found = _latest(client_id, (ch for info in self.consumers.values() for ch in info.channels.values()))
        return found

    def unregister(self, conn: Connection, producer_group: str | None, consumer_group: str | None) -> None:
        if producer_group:
            chans = self.producers.get(producer_group)
            if chans is not None:
                chans.pop(conn.id, None)
                if not chans:
                    del self.producers[producer_group]
        if consumer_group:
            info = self.consumers.get(consumer_group)
            if info is not None and info.channels.pop(conn.id, None) is not None:
                self._after_consumer_removed(info)

    def connection_closed(self, conn: Connection) -> None:
        for group, chans in list(self.producers.items()):
            if chans.pop(conn.id, None) is not None and not chans:
                del self.producers[group]
        for info in list(self.consumers.values()):
            if info.channels.pop(conn.id, None) is not None:
                self._after_consumer_removed(info)

    def _after_consumer_removed(self, info: ConsumerGroupInfo) -> None:
        if info.channels:
            self._notify_group(info)
        else:
            # Keep nothing for a group with no live client: its subscriptions are gone too.
            self.consumers.pop(info.group, None)

    def scan_expired(self, expiry_seconds: float, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        dropped = 0
        for info in list(self.consumers.values()):
            for cid, ch in list(info.channels.items()):
                if now - ch.last_update > expiry_seconds:
                    log.info("consumer %s of %s expired", ch.client_id, info.group)
                    del info.channels[cid]
                    ch.conn.close()
                    dropped += 1
            if dropped:
                self._after_consumer_removed(info)
        for group, chans in list(self.producers.items()):
            for cid, ch in list(chans.items()):
                if now - ch.last_update > expiry_seconds:
                    del chans[cid]
                    dropped += 1
            if not chans:
                del self.producers[group]
        return dropped

    def _notify_group(self, info: ConsumerGroupInfo) -> None:
        if self._notify is not None:
            self._notify(info.group, [ch.conn for ch in info.channels.values()])

    # -- queries --
    def online_elsewhere(self, group: str, topic: str) -> bool:
        """Whether ``group`` has online consumers that subscribe to topics, but not to ``topic``
        (RocketMQ then leaves the topic out of the group's stats and offset clones)."""
        info = self.consumers.get(group)
        return info is not None and bool(info.subscriptions) and topic not in info.subscriptions

    def find_subscription(self, group: str, topic: str) -> SubscriptionData | None:
        info = self.consumers.get(group)
        return None if info is None else info.subscriptions.get(topic)

    def consumer_ids(self, group: str) -> list[str]:
        info = self.consumers.get(group)
        return [] if info is None else info.client_ids()

    # -- orderly consumption locks (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ) --
    def try_lock(self, group: str, client_id: str, mqs: list[tuple[str, int]],
                 now: float | None = None) -> list[tuple[str, int]]:
        now = time.monotonic() if now is None else now
        locked = []
        for topic, qid in mqs:
            key = (group, topic, qid)
            lock = self._locks.get(key)
            if lock is None or lock.client_id == client_id or now - lock.last_update > self.lock_max_live_seconds:
                self._locks[key] = _Lock(client_id, now)
                locked.append((topic, qid))
        return locked

    def unlock(self, group: str, client_id: str, mqs: list[tuple[str, int]]) -> None:
        for topic, qid in mqs:
            key = (group, topic, qid)
            lock = self._locks.get(key)
            if lock is not None and lock.client_id == client_id:
                del self._locks[key]
