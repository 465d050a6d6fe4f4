"""RocketMQ 4.9's broker statistics (BrokerStatsManager, StatsItem): the sampled counters that
VIEW_BROKER_STATS_DATA (315) answers, for ``mqadmin statsAll`` and the Dashboard.

Each stats item is a cumulative ``value`` (and a ``times`` count of the events that added to it)
sampled every ``statsSamplingInterval`` ms (Java: every 10 s; the last 7 samples make the minute
window), every 60 intervals (10 min; 7 samples make the hour window) and every 360 intervals
(1 h; 25 samples make the day window). A window's sum, tps and avgpt come from its first and last
sample only, as in StatsItem.computeStatsData: ``sum = last.value - first.value``,
``tps = sum * 1000 / (last.ms - first.ms)``, ``avgpt = sum / (last.times - first.times)`` (0 when
no times). An empty window gets a made-up first sample one period back with zeros, as Java's does,
so an item created between two samples shows all it counted at the next one.

What is measured how. The send path is compiled and benchmarked per message, so it keeps nothing
per topic; every figure here is read once per sampling period, never per message:

* TOPIC_PUT_NUMS / TOPIC_PUT_SIZE (key: topic): messages stored in the topic's consume queues
  since the last sample (the growth of their max offsets), and the record bytes of those messages
  (the size field of their consume-queue units, read at sampling time). ``times`` counts messages,
  so avgpt is 1 and the average record size; Java counts send requests there, which differs only
  for batches. As the consume queues see them, a delayed message counts under SCHEDULE_TOPIC_XXXX
  when sent (as in Java) and under its topic again when delivered, and a transactional one under
  its topic when committed. Only a master counts puts (a slave's queues grow by replication; a
  Java slave counts none); a slave keeps its baseline current so that a promotion starts clean.
* GROUP_GET_NUMS / GROUP_GET_SIZE (key: ``topic@group``): messages and record bytes pulls
  returned, with the number of pulls as ``times`` (Java's), from :class:`BrokerStats` totals that
  the pull processor keeps per (topic, group).
* BROKER_PUT_NUMS / BROKER_GET_NUMS (key: the cluster name, as in Java): the broker's sent and
  pulled message totals (``msgs_in`` / ``msgs_out``); ``times`` stays 0, as Java never counts it.

An item exists from the first sample that sees it count something, as Java's exists from the first
add; asking for any other name or key is answered "The stats <name> <key> not exist". A deleted
topic's items go (Java's onTopicDeleted).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rmqbroker.stats import BrokerStats
from rmqbroker.store.message_store import MessageStore

log = logging.getLogger(__name__)

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"
STATS_NAMES = (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE, BROKER_PUT_NUMS, BROKER_GET_NUMS)

# Java's StatsItem: samples kept per window, and the sampling periods in units of the minute one.
DEFAULT_SAMPLING_INTERVAL_MS = 10_000
MINUTE_SAMPLES = 7
HOUR_SAMPLES = 7
DAY_SAMPLES = 25
HOUR_PERIODS = 60  # 10 min
DAY_PERIODS = 360  # 1 h
# Consume-queue units summed per call (about 1 ms) when measuring put sizes; the loop yields between calls so a
# large backlog of new messages never holds the event loop for long.
UNITS_PER_READ = 65536

# One sample: (milliseconds, times, value).
Sample = tuple[float, int, int]


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """One window's figures (Java's StatsSnapshot; BrokerStatsItem on the wire)."""

    sum: int
    tps: float
    avgpt: float
    times: int

    def to_json_obj(self) -> dict[str, Any]:
        return {"avgpt": self.avgpt, "sum": self.sum, "tps": self.tps}


def compute_stats(samples: Sequence[Sample]) -> StatsSnapshot:
    """A window's figures from its first and last sample (StatsItem.computeStatsData)."""
    if not samples:
        return StatsSnapshot(0, 0.0, 0.0, 0)
    first_ms, first_times, first_value = samples[0]
    last_ms, last_times, last_value = samples[-1]
    total = last_value - first_value
    elapsed = last_ms - first_ms
    # Java divides by zero into NaN/Infinity here; JSON has no such numbers, and a window always
    # spans at least one period, so this only guards a clock that did not move.
    tps = total * 1000.0 / elapsed if elapsed > 0 else 0.0
    times = last_times - first_times
    return StatsSnapshot(total, tps, total / times if times > 0 else 0.0, times)


class StatsWindow:
    """The last ``keep`` samples of a counter taken every ``period_ms``."""

    __slots__ = ("keep", "period_ms", "samples")

    def __init__(self, period_ms: float, keep: int) -> None:
        self.period_ms = period_ms
        self.keep = keep
        self.samples: collections.deque[Sample] = collections.deque()

    def sample(self, now_ms: float, times: int, value: int) -> None:
        if not self.samples:
            self.samples.append((now_ms - self.period_ms, 0, 0))
        self.samples.append((now_ms, times, value))
        while len(self.samples) > self.keep:
            self.samples.popleft()

    def snapshot(self) -> StatsSnapshot:
        return compute_stats(self.samples)


class StatsItem:
    """One counter (``value``, ``times``) with its minute, hour and day windows."""

    __slots__ = ("day", "hour", "minute", "times", "value")

    def __init__(self, interval_ms: float) -> None:
        self.value = 0
        self.times = 0
        self.minute = StatsWindow(interval_ms, MINUTE_SAMPLES)
        self.hour = StatsWindow(interval_ms * HOUR_PERIODS, HOUR_SAMPLES)
        self.day = StatsWindow(interval_ms * DAY_PERIODS, DAY_SAMPLES)

    def to_json_obj(self) -> dict[str, Any]:
        """BrokerStatsData: members in name order, as fastjson writes them."""
        return {"statsDay": self.day.snapshot().to_json_obj(), "statsHour": self.hour.snapshot().to_json_obj(),
                "statsMinute": self.minute.snapshot().to_json_obj()}


class BrokerStatsManager:
    """The stats items by name and key, and the sampler that feeds them (run every
    ``interval_ms`` by the broker's supervisor; the first run only takes the baseline)."""

    def __init__(self, store: MessageStore, stats: BrokerStats, cluster_name: str, is_master: Callable[[], bool],
                 interval_ms: float = DEFAULT_SAMPLING_INTERVAL_MS) -> None:
        self._store = store
        self._stats = stats
        self._cluster = cluster_name
        self._is_master = is_master
        self.interval_ms = interval_ms
        self.tables: dict[str, dict[str, StatsItem]] = {name: {} for name in STATS_NAMES}
        # Consume-queue max offsets at the last sample, by (topic, queue id); None before the first.
        self._queue_max: dict[tuple[str, int], int] | None = None
        # topic -> [messages, record bytes] stored since start.
        self._put_totals: dict[str, list[int]] = {}
        self._ticks = 0

    def get_item(self, name: str, key: str) -> StatsItem | None:
        table = self.tables.get(name)
        return None if table is None else table.get(key)

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's items and totals go; one created again under the name starts at zero."""
        self._put_totals.pop(topic, None)
        self.tables[TOPIC_PUT_NUMS].pop(topic, None)
        self.tables[TOPIC_PUT_SIZE].pop(topic, None)
        prefix = topic + "@"
        for name in (GROUP_GET_NUMS, GROUP_GET_SIZE):
            table = self.tables[name]
            for key in [k for k in table if k.startswith(prefix)]:
                del table[key]
        self._stats.forget_topic(topic)

    async def sample(self, now_ms: float | None = None) -> None:
        """One sampling round: bring the counters up to date, then sample every item."""
        await self._measure_puts()
        self._feed_counters()
        now = time.monotonic() * 1000 if now_ms is None else now_ms
        hour = self._ticks % HOUR_PERIODS == 0
        day = self._ticks % DAY_PERIODS == 0
        self._ticks += 1
        for table in self.tables.values():
            for item in table.values():
                item.minute.sample(now, item.times, item.value)
                if hour:
                    item.hour.sample(now, item.times, item.value)
                if day:
                    item.day.sample(now, item.times, item.value)

    async def _measure_puts(self) -> None:
        """Add to each topic's put totals what its consume queues gained since the last round."""
        store = self._store
        current = {(topic, qid): store.get_max_offset_in_queue(topic, qid) for topic, qid in store.list_queues()}
        previous, self._queue_max = self._queue_max, current
        if previous is None or not self._is_master():
            return
        for (topic, qid), high in current.items():
            before = previous.get((topic, qid), 0)
            # A queue that shrank was deleted and started again from offset 0.
            gained = high - before if high >= before else high
            if gained <= 0:
                continue
            nbytes = 0
            pos = max(high - gained, store.get_min_offset_in_queue(topic, qid))
            while pos < high:
                chunk_bytes, read = store.queue_message_bytes(topic, qid, pos, min(pos + UNITS_PER_READ, high))
                if not read:
                    break
                nbytes += chunk_bytes
                pos += read
                if pos < high:
                    await asyncio.sleep(0)
            totals = self._put_totals.get(topic)
            if totals is None:
                self._put_totals[topic] = [gained, nbytes]
            else:
                totals[0] += gained
                totals[1] += nbytes

    def _feed_counters(self) -> None:
        """Copy the current totals into the items, creating those that counted something."""
        for topic, (messages, nbytes) in self._put_totals.items():
            self._set(TOPIC_PUT_NUMS, topic, messages, messages)
            self._set(TOPIC_PUT_SIZE, topic, messages, nbytes)
        for (topic, group), (messages, nbytes, pulls) in self._stats.group_totals.items():
            key = f"{topic}@{group}"
            self._set(GROUP_GET_NUMS, key, pulls, messages)
            self._set(GROUP_GET_SIZE, key, pulls, nbytes)
        if self._stats.msgs_in:
            self._set(BROKER_PUT_NUMS, self._cluster, 0, self._stats.msgs_in)
        if self._stats.msgs_out:
            self._set(BROKER_GET_NUMS, self._cluster, 0, self._stats.msgs_out)

    def _set(self, name: str, key: str, times: int, value: int) -> None:
        table = self.tables[name]
        item = table.get(key)
        if item is None:
            item = table[key] = StatsItem(self.interval_ms)
        item.times = times
        item.value = value
