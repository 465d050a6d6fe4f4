"""Broker-wide counters read by the admin endpoint's Prometheus collector and sampled by broker_stats."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

# Consumer TPS is the messages a group pulled from a topic over the last minute (RocketMQ's
# GROUP_GET_NUMS), kept as one count per second.
GET_TPS_WINDOW = 60


@dataclass
class BrokerStats:
    """Plain counters: cheap to bump on the hot path, exported as Prometheus counters."""

    msgs_in: int = 0
    bytes_in: int = 0
    msgs_out: int = 0
    bytes_out: int = 0
    send_rejected: dict[int, int] = field(default_factory=dict)  # by response code
    pull_held: int = 0
    # Pulls evaluated against the store: those that returned messages, and all others (Java's
    # getMessageTimesTotalFound / getMessageTimesTotalMiss).
    pulls_found: int = 0
    pulls_missed: int = 0
    acl_denied: int = 0  # requests refused by the plain ACL
    acl_reloads: int = 0
    acl_reload_failures: int = 0  # the ACL file changed but did not load (the old rules stay)
    # (topic, group) -> (second, messages pulled in it), oldest first, at most GET_TPS_WINDOW long.
    group_gets: dict[tuple[str, str], collections.deque[tuple[int, int]]] = field(default_factory=dict)
    # (topic, group) -> [messages, record bytes, pulls] since start: what broker_stats samples for
    # RocketMQ's GROUP_GET_NUMS / GROUP_GET_SIZE.
    group_totals: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def rejected(self, code: int) -> None:
        self.send_rejected[code] = self.send_rejected.get(code, 0) + 1

    def got(self, group: str, topic: str, messages: int, nbytes: int = 0, now: float | None = None) -> None:
        """A pull of ``group`` returned ``messages`` messages of ``topic`` in ``nbytes`` record bytes."""
        key = (topic, group)
        totals = self.group_totals.get(key)
        if totals is None:
            self.group_totals[key] = [messages, nbytes, 1]
        else:
            totals[0] += messages
            totals[1] += nbytes
            totals[2] += 1
        second = int(time.monotonic() if now is None else now)
        buckets = self.group_gets.get(key)
        if buckets is None:
            buckets = self.group_gets[key] = collections.deque()
        if buckets and buckets[-1][0] == second:
            buckets[-1] = (second, buckets[-1][1] + messages)
        else:
            buckets.append((second, messages))
            while buckets[0][0] <= second - GET_TPS_WINDOW:
                buckets.popleft()

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's pull figures go with it (RocketMQ drops its GROUP_GET_* items)."""
        for key in [k for k in self.group_totals if k[0] == topic]:
            del self.group_totals[key]
            self.group_gets.pop(key, None)

    def group_get_tps(self, group: str, topics: Iterable[str], now: float | None = None) -> float:
        """Messages per second ``group`` pulled from ``topics`` over the last minute."""
        since = int(time.monotonic() if now is None else now) - GET_TPS_WINDOW
        total = 0
        for topic in topics:
            buckets = self.group_gets.get((topic, group))
            if buckets is not None:
                total += sum(n for second, n in buckets if second > since)
        return total / GET_TPS_WINDOW
