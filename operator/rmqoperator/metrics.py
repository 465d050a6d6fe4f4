"""The operator's own Prometheus metrics (served by ``rmq-operator --metrics-port``).

A private registry keeps them apart from anything else in the process (and lets tests read them).
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter("rmq_operator_reconciles", "Reconciles of BrokerGroup children, by result",
                     ["namespace", "group", "result"], registry=REGISTRY)
FAILOVERS = Counter("rmq_operator_failovers", "Slave promotions after a lost master, by result",
                    ["namespace", "group", "result"], registry=REGISTRY)
HANDOVERS = Counter("rmq_operator_handovers", "Masters handed over to an in-sync slave before a planned restart, "
                    "by result", ["namespace", "group", "result"], registry=REGISTRY)
REPOINTS = Counter("rmq_operator_repoints", "POST /ha/master calls made to slaves, by result",
                   ["namespace", "group", "result"], registry=REGISTRY)
RESTARTS = Counter("rmq_operator_pod_restarts", "Broker pods deleted by the operator, by reason",
                   ["namespace", "group", "reason"], registry=REGISTRY)
MAX_LAG = Gauge("rmq_operator_group_max_lag_bytes", "Largest replication lag of a slave, in commitlog bytes",
                ["namespace", "group"], registry=REGISTRY)
IN_SYNC = Gauge("rmq_operator_group_in_sync_replicas", "Replicas holding the master's data (master included)",
                ["namespace", "group"], registry=REGISTRY)
READY = Gauge("rmq_operator_group_ready", "1 when the group's Ready condition is True",
              ["namespace", "group"], registry=REGISTRY)
EPOCH = Gauge("rmq_operator_group_epoch", "Replication epoch of the group", ["namespace", "group"],
              registry=REGISTRY)


def forget_group(namespace: str, group: str) -> None:
    """Drop a deleted group's gauges (counters stay: they are cumulative)."""
    for gauge in (MAX_LAG, IN_SYNC, READY, EPOCH):
        try:
            gauge.remove(namespace, group)
        except KeyError:
            pass
