"""The window arithmetic of broker_stats against hand-computed values (RocketMQ's
StatsItem.computeStatsData: first and last sample of a window of at most 7 / 7 / 25 samples)."""

from __future__ import annotations

import pytest

from rmqbroker.broker_stats import StatsItem, StatsSnapshot, StatsWindow, compute_stats


def test_an_empty_window_is_all_zero() -> None:
    assert compute_stats([]) == StatsSnapshot(0, 0.0, 0.0, 0)
    assert StatsItem(10_000).to_json_obj() == {
        "statsDay": {"avgpt": 0.0, "sum": 0, "tps": 0.0},
        "statsHour": {"avgpt": 0.0, "sum": 0, "tps": 0.0},
        "statsMinute": {"avgpt": 0.0, "sum": 0, "tps": 0.0}}


def test_first_sample_counts_from_a_zero_sample_one_period_back() -> None:
    w = StatsWindow(10_000, 7)
    w.sample(100_000, 2, 30)  # 30 counted in 2 events since the item appeared
    assert list(w.samples) == [(90_000, 0, 0), (100_000, 2, 30)]
    # sum 30 - 0; tps 30 * 1000 / 10 000 ms; avgpt 30 / 2
    assert w.snapshot() == StatsSnapshot(30, 3.0, 15.0, 2)


def test_the_window_keeps_the_last_seven_samples() -> None:
    w = StatsWindow(10_000, 7)
    for ms, times, value in ((100_000, 2, 30), (110_000, 3, 40), (120_000, 3, 40), (130_000, 3, 40),
                             (140_000, 5, 70), (150_000, 5, 70)):
        w.sample(ms, times, value)
    # Still 7 samples with the made-up one: 90 s .. 150 s, sum 70 over 60 s, 5 events.
    assert len(w.samples) == 7
    assert w.snapshot() == StatsSnapshot(70, 70 * 1000 / 60_000, 70 / 5, 5)
    w.sample(160_000, 6, 100)
    # The made-up sample is dropped: 100 s .. 160 s, sum 100 - 30 = 70 over 60 s, 6 - 2 = 4 events.
    assert w.samples[0] == (100_000, 2, 30) and len(w.samples) == 7
    snap = w.snapshot()
    assert (snap.sum, snap.times) == (70, 4)
    assert snap.tps == pytest.approx(1.1666666666666667)
    assert snap.avgpt == 17.5
    for ms in range(170_000, 240_000, 10_000):  # a minute with nothing new
        w.sample(ms, 6, 100)
    assert w.snapshot() == StatsSnapshot(0, 0.0, 0.0, 0)


def test_counters_without_times_have_no_average() -> None:
    w = StatsWindow(10_000, 7)
    w.sample(50_000, 0, 12)  # BROKER_PUT_NUMS: Java adds to the value only
    w.sample(60_000, 0, 20)
    assert w.snapshot() == StatsSnapshot(20, 20 * 1000 / 20_000, 0.0, 0)


def test_hour_and_day_windows_scale_with_the_sampling_interval() -> None:
    item = StatsItem(10_000)
    assert (item.minute.period_ms, item.minute.keep) == (10_000, 7)
    assert (item.hour.period_ms, item.hour.keep) == (600_000, 7)  # every 10 min, the last hour
    assert (item.day.period_ms, item.day.keep) == (3_600_000, 25)  # every hour, the last day
    item.hour.sample(1_200_000, 4, 400)  # 400 in 10 min
    assert item.hour.snapshot() == StatsSnapshot(400, 400 * 1000 / 600_000, 100.0, 4)
    item.day.sample(3_600_000, 1, 7200)
    item.day.sample(7_200_000, 2, 10_800)
    # 10 800 over 2 h: 1.5 per second; 10 800 / 2 events
    assert item.day.snapshot() == StatsSnapshot(10_800, 1.5, 5400.0, 2)
    body = item.to_json_obj()
    assert list(body) == ["statsDay", "statsHour", "statsMinute"]  # fastjson's member order
    assert body["statsDay"] == {"avgpt": 5400.0, "sum": 10_800, "tps": 1.5}
