"""Prometheus collector over the broker's plain counters (no metric objects on the hot path)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from rmqbroker.remoting.latency import LATENCY_BUCKETS, RequestLatency
from rmqbroker.remoting.server import RemotingStats
from rmqbroker.stats import BrokerStats

# A gauge family with labels of its own, computed at scrape time:
# (name, help, label names, [(label values, value), ...]).
LabeledGauge = tuple[str, str, tuple[str, ...], list[tuple[tuple[str, ...], float]]]


class BrokerCollector(Collector):
    """Reads counters at scrape time."""

    def __init__(self, stats: BrokerStats, remoting: RemotingStats, gauges: Callable[[], dict[str, float]],
                 labels: dict[str, str], counters: Callable[[], dict[str, tuple[str, float]]] | None = None,
                 labeled: Callable[[], list[LabeledGauge]] | None = None) -> None:
        self.stats = stats
        self.remoting = remoting
        self.gauges = gauges
        self.counters = counters
        self.labeled = labeled
        self.labels = labels

    def collect(self) -> Iterator[Any]:
        names = list(self.labels)
        values = list(self.labels.values())

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(values, value)
            return c

        s, r = self.stats, self.remoting
        yield counter("rmq_messages_in", "Messages stored by sends", s.msgs_in)
        yield counter("rmq_bytes_in", "Message body bytes stored by sends", s.bytes_in)
        yield counter("rmq_messages_out", "Messages returned by pulls", s.msgs_out)
        yield counter("rmq_acl_denied", "Requests refused by the plain ACL (aclEnable)", s.acl_denied)
        yield counter("rmq_acl_reloads", "Changed ACL files put in force", s.acl_reloads)
        yield counter("rmq_acl_reload_failures", "Changed ACL files that could not be used", s.acl_reload_failures)
        yield counter("rmq_bytes_out", "Record bytes returned by pulls", s.bytes_out)
        yield counter("rmq_remoting_requests", "Requests received on the remoting port", r.requests_total)
        yield counter("rmq_remoting_connections", "Connections accepted on the remoting port", r.connections_total)
        yield counter("rmq_remoting_unsupported_codes", "Requests with an unknown code", r.unsupported_codes)
        yield counter("rmq_remoting_handler_errors", "Requests whose handler raised", r.handler_errors)
        yield counter("rmq_remoting_header_errors", "Requests with a missing or malformed header field",
                      r.header_errors)
        bad = CounterMetricFamily("rmq_remoting_bad_requests",
                                  "Requests refused for an unusable body or argument, by request code",
                                  labels=[*names, "code"])
        for code, n in sorted(r.bad_requests.items()):
            bad.add_metric([*values, str(code)], n)
        yield bad
        malformed = CounterMetricFamily("rmq_malformed_frames", "Malformed frames (connection closed)",
                                        labels=[*names, "reason"])
        for reason in ("bad_length", "bad_header", "truncated", "stalled", "tls_not_enabled"):
            malformed.add_metric([*values, reason], r.malformed_frames.get(reason, 0))
        yield malformed
        yield counter("rmq_remoting_idle_closed", "Connections closed after serverChannelMaxIdleTimeSeconds "
                      "without a frame either way", r.idle_closed)
        yield counter("rmq_remoting_tls_connections", "Connections served over TLS", r.tls_connections)
        refused = CounterMetricFamily("rmq_remoting_tls_refused",
                                      "Connections closed before their first frame: plain ones on a TLS-enforcing "
                                      "port, failed TLS handshakes", labels=[*names, "reason"])
        for reason in ("plaintext", "handshake", "setup"):
            refused.add_metric([*values, reason], r.tls_refused.get(reason, 0))
        yield refused
        rejected = CounterMetricFamily("rmq_send_rejected", "Sends answered with an error code",
                                       labels=[*names, "code"])
        for code, n in sorted(s.send_rejected.items()):
            rejected.add_metric([*values, str(code)], n)
        yield rejected
        for name, (doc, total) in (self.counters() if self.counters is not None else {}).items():
            yield counter(f"rmq_{name}", doc, total)
        for name, value in self.gauges().items():
            g = GaugeMetricFamily(f"rmq_{name}", name.replace("_", " "), labels=names)
            g.add_metric(values, value)
            yield g
        for name, doc, label_names, samples in (self.labeled() if self.labeled is not None else []):
            family = GaugeMetricFamily(f"rmq_{name}", doc, labels=[*names, *label_names])
            for label_values, value in samples:
                family.add_metric([*values, *label_values], value)
            yield family


class LatencyHistogram(Collector):
    """Exports the remoting server's :class:`RequestLatency` as a Prometheus histogram at scrape
    time: counting stays a bucket scan and an increment per request, with no metric child per call."""

    def __init__(self, labels: dict[str, str], source: RequestLatency | None = None) -> None:
        self.labels = labels
        self.source = source if source is not None else RequestLatency()

    def observe(self, code: int, seconds: float) -> None:
        self.source.observe(code, seconds)

    def collect(self) -> Iterator[Any]:
        h = HistogramMetricFamily("rmq_request_latency_seconds", "Request handling time by request code",
                                  labels=[*self.labels, "code"])
        for code, (counts, total) in sorted(self.source.snapshot().items()):
            cumulative = 0
            buckets = []
            for bound, n in zip((*LATENCY_BUCKETS, float("inf")), counts, strict=True):
                cumulative += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            h.add_metric([*self.labels.values(), str(code)], buckets, total)
        yield h


def build_registry(stats: BrokerStats, remoting: RemotingStats, gauges: Callable[[], dict[str, float]],
                   labels: dict[str, str], latency_source: RequestLatency | None = None,
                   counters: Callable[[], dict[str, tuple[str, float]]] | None = None,
                   labeled: Callable[[], list[LabeledGauge]] | None = None) -> CollectorRegistry:
    """A registry with the counters collector, the request-latency histogram (by request code) and
    the standard ``process_*`` metrics (memory, CPU, open descriptors and their limit).

    ``counters`` adds counters kept outside :class:`BrokerStats` (name -> (help, total))."""
    registry = CollectorRegistry()
    registry.register(BrokerCollector(stats, remoting, gauges, labels, counters, labeled))
    registry.register(LatencyHistogram(labels, latency_source))
    registry.register(ProcessCollector(registry=None))
    return registry
