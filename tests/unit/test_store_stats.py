"""StoreStatsService: RocketMQ's TPS windows, Java's number format, the midnight roll-over."""

from __future__ import annotations

import datetime

from rmqbroker.stats import BrokerStats
from rmqbroker.store_stats import StoreStatsService, java_double

DAY = datetime.date(2026, 11, 27)


def test_tps_windows_fill_one_sample_a_second() -> None:
    stats = BrokerStats()
    svc = StoreStatsService(stats)
    assert svc.runtime_info()["putTps"] == "  "  # no sample yet: three empty figures, as Java's
    for second in range(601):
        stats.msgs_in = second * 50 if second <= 540 else 540 * 50 + (second - 540) * 200
        stats.msgs_out = second * 10
        stats.pulls_found = second * 3
        stats.pulls_missed = second
        svc.sample_now(now_ms=1_000_000 + second * 1000, today=DAY)
        info = svc.runtime_info()
        if second == 9:
            # 10 samples make no 10-second window yet (it needs 11), so every figure is empty.
            assert info["putTps"] == "  " and info["getTotalTps"] == "0.0 0.0 0.0"
        if second == 10:
            assert info["putTps"] == "50.0  " and info["getTransferedTps"] == "10.0  "
            assert info["getFoundTps"] == "3.0  " and info["getMissTps"] == "1.0  "
            assert info["getTotalTps"] == "4.0 0.0 0.0"
        if second == 60:
            assert info["putTps"] == "50.0 50.0 "
    info = svc.runtime_info()
    # Last 60 s at 200/s; over ten minutes (540 s at 50/s, 60 s at 200/s) 65/s.
    assert info["putTps"] == "200.0 200.0 65.0"
    assert info["msgPutTotalTodayNow"] == str(stats.msgs_in)


def test_morning_figures_roll_over_at_local_midnight() -> None:
    stats = BrokerStats()
    svc = StoreStatsService(stats)
    stats.msgs_in, stats.msgs_out = 100, 40
    svc.sample_now(now_ms=1, today=DAY)
    info = svc.runtime_info()
    assert (info["msgPutTotalYesterdayMorning"], info["msgPutTotalTodayMorning"]) == ("0", "0")
    stats.msgs_in, stats.msgs_out = 250, 90
    svc.sample_now(now_ms=2, today=DAY + datetime.timedelta(days=1))
    stats.msgs_in, stats.msgs_out = 300, 95
    svc.sample_now(now_ms=3, today=DAY + datetime.timedelta(days=1))
    info = svc.runtime_info()
    assert (info["msgPutTotalYesterdayMorning"], info["msgPutTotalTodayMorning"]) == ("0", "250")
    assert (info["msgGetTotalYesterdayMorning"], info["msgGetTotalTodayMorning"]) == ("0", "90")
    svc.sample_now(now_ms=4, today=DAY + datetime.timedelta(days=2))
    info = svc.runtime_info()
    assert (info["msgPutTotalYesterdayMorning"], info["msgPutTotalTodayMorning"]) == ("250", "300")
    assert info["msgPutTotalTodayNow"] == "300"


def test_java_double_format() -> None:
    assert [java_double(v) for v in (0, 5, 12.5, 1000 / 3)] == ["0.0", "5.0", "12.5", "333.3333333333333"]
