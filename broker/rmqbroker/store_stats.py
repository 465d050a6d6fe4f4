"""RocketMQ 4.9's StoreStatsService and BrokerStats figures in GET_BROKER_RUNTIME_INFO (28).

Admin tools read these keys from the runtime info without checking that they are there:
``mqadmin clusterList`` takes its InTPS/OutTPS columns from ``putTps``/``getTransferedTps`` and
the day's message counts from ``msg{Put,Get}Total{Yesterday,Today}Morning``; RocketMQ Dashboard's
cluster page splits ``putTps`` and ``getTransferedTps`` unguarded. The counters are sampled once a
second, as Java's StoreStatsService does, and each TPS figure is Java's: the change between the
newest sample and the one 10, 60 or 600 samples before it, per second of the time between them,
as Java's ``Double.toString`` writes it; a window not filled yet gives an empty figure, so the
three are joined by spaces even when empty ("  " at start), as in Java.

What is counted: puts are the messages sends stored (:attr:`BrokerStats.msgs_in`); a pull that
returned messages is "found", any other evaluated pull "miss" (Java counts its store lookups the
same way); transferred messages are the messages pulls returned (:attr:`BrokerStats.msgs_out`).
The morning figures roll over at local midnight, as Java's daily ``BrokerStats.record()`` does.
"""

from __future__ import annotations

import collections
import datetime
import time

from rmqbroker.stats import BrokerStats

# Java's StoreStatsService: samples kept (one a second, ten minutes), and the TPS windows.
MAX_SAMPLES = 600 + 1
TPS_WINDOWS = (10, 60, 600)

Samples = collections.deque[tuple[int, int]]  # (epoch ms, counter total)


def java_double(value: float) -> str:
    """``Double.toString`` for the magnitudes TPS figures have (plain notation below 10^7)."""
    return repr(float(value))


def window_tps(samples: Samples, window: int) -> float | None:
    """Per-second change over the last ``window`` samples, or None while fewer are kept."""
    if len(samples) <= window:
        return None
    then_ms, then = samples[-1 - window]
    now_ms, now = samples[-1]
    if now_ms <= then_ms:
        return 0.0
    return (now - then) / (now_ms - then_ms) * 1000


def tps_figures(samples: Samples) -> str:
    """Java's ``"<10 s> <1 min> <10 min>"`` (an empty figure where the window is not full yet)."""
    return " ".join("" if (tps := window_tps(samples, w)) is None else java_double(tps) for w in TPS_WINDOWS)


class StoreStatsService:
    """Samples the broker's counters every second for the runtime info's TPS and day figures."""

    def __init__(self, stats: BrokerStats) -> None:
        self.stats = stats
        self.puts: Samples = collections.deque(maxlen=MAX_SAMPLES)
        self.found: Samples = collections.deque(maxlen=MAX_SAMPLES)
        self.missed: Samples = collections.deque(maxlen=MAX_SAMPLES)
        self.transferred: Samples = collections.deque(maxlen=MAX_SAMPLES)
        # Java's BrokerStats: totals at the last two local midnights (0 until the first one).
        self.put_yesterday_morning = 0
        self.put_today_morning = 0
        self.get_yesterday_morning = 0
        self.get_today_morning = 0
        self._day: datetime.date | None = None

    async def sample(self) -> None:
        self.sample_now()

    def sample_now(self, now_ms: int | None = None, today: datetime.date | None = None) -> None:
        """Take one sample (and roll the morning figures over when the local date changed)."""
        s = self.stats
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        day = datetime.date.today() if today is None else today
        if self._day is not None and day != self._day:
            self.put_yesterday_morning, self.put_today_morning = self.put_today_morning, s.msgs_in
            self.get_yesterday_morning, self.get_today_morning = self.get_today_morning, s.msgs_out
        self._day = day
        self.puts.append((ms, s.msgs_in))
        self.found.append((ms, s.pulls_found))
        self.missed.append((ms, s.pulls_missed))
        self.transferred.append((ms, s.msgs_out))

    def runtime_info(self) -> dict[str, str]:
        s = self.stats
        # Java's getTotalTps is the only figure written as 0.0 where its window is not full yet.
        total = " ".join(java_double((window_tps(self.found, w) or 0.0) + (window_tps(self.missed, w) or 0.0))
                         for w in TPS_WINDOWS)
        return {
            "putTps": tps_figures(self.puts),
            "getFoundTps": tps_figures(self.found),
            "getMissTps": tps_figures(self.missed),
            "getTotalTps": total,
            "getTransferedTps": tps_figures(self.transferred),
            "putMessageTimesTotal": str(s.msgs_in),
            "msgPutTotalYesterdayMorning": str(self.put_yesterday_morning),
            "msgPutTotalTodayMorning": str(self.put_today_morning),
            "msgPutTotalTodayNow": str(s.msgs_in),
            "msgGetTotalYesterdayMorning": str(self.get_yesterday_morning),
            "msgGetTotalTodayMorning": str(self.get_today_morning),
            "msgGetTotalTodayNow": str(s.msgs_out),
        }
