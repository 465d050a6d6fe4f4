"""BrokerStats' consumer TPS: messages a group pulled from a topic over the last minute."""

from __future__ import annotations

from rmqbroker.stats import GET_TPS_WINDOW, BrokerStats


def test_group_get_tps_counts_the_last_minute_per_group_and_topic() -> None:
    stats = BrokerStats()
    stats.got("G", "T", 30, now=1000.2)
    stats.got("G", "T", 30, now=1000.7)  # same second: one bucket
    stats.got("G", "U", 60, now=1030.0)
    stats.got("H", "T", 600, now=1030.0)  # another group
    assert stats.group_get_tps("G", ["T"], now=1030.5) == 60 / GET_TPS_WINDOW
    assert stats.group_get_tps("G", ["T", "U"], now=1030.5) == 120 / GET_TPS_WINDOW
    assert stats.group_get_tps("G", ["V"], now=1030.5) == 0.0
    # A minute after the first pulls they no longer count, and later pulls drop their buckets.
    assert stats.group_get_tps("G", ["T", "U"], now=1060.0) == 60 / GET_TPS_WINDOW
    stats.got("G", "T", 6, now=1075.0)
    assert list(stats.group_gets[("T", "G")]) == [(1075, 6)]
    assert stats.group_get_tps("G", ["T"], now=1075.0) == 6 / GET_TPS_WINDOW
