"""The request-latency histogram exported on /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from rmqbroker.admin.metrics import LatencyHistogram


def test_buckets_are_cumulative_and_inclusive() -> None:
    reg = CollectorRegistry()
    h = LatencyHistogram({"broker": "b"})
    reg.register(h)
    for seconds in (0.0001, 0.0003, 0.002, 2.0, 100.0):
        h.observe(10, seconds)
    h.observe(11, 0.00001)
    text = generate_latest(reg).decode()
    assert 'rmq_request_latency_seconds_bucket{broker="b",code="10",le="0.0001"} 1.0' in text  # le is inclusive
    assert 'rmq_request_latency_seconds_bucket{broker="b",code="10",le="0.001"} 2.0' in text
    assert 'rmq_request_latency_seconds_bucket{broker="b",code="10",le="30.0"} 4.0' in text
    assert 'rmq_request_latency_seconds_bucket{broker="b",code="10",le="+Inf"} 5.0' in text
    assert 'rmq_request_latency_seconds_count{broker="b",code="10"} 5.0' in text
    assert 'rmq_request_latency_seconds_count{broker="b",code="11"} 1.0' in text
