"""`rmq-operator` entry point: runs the kopf operator with the BrokerGroup handlers.

``rmq-operator [--namespace NS ...] [--metrics-port 8080] [--liveness-port 8081]``; without
``--namespace`` (or ``$WATCH_NAMESPACE``, comma-separated) it watches every namespace.

Environment: ``RMQ_OPERATOR_DEFAULT_IMAGE`` (broker image for groups without ``spec.image``),
``RMQ_OPERATOR_POLL_SECONDS`` (broker status polling period, default 1),
``RMQ_OPERATOR_HANDOVER_SETTLE_SECONDS`` (how long a roll leaves a handed-over master relaying
clients' sends before restarting it, default 35),
``RMQ_OPERATOR_METRICS_PORT`` / ``RMQ_OPERATOR_LIVENESS_PORT`` (defaults of the flags),
``RMQ_LOG_LEVEL``. Credentials: the pod's service account, else ``$KUBECONFIG``/``~/.kube/config``.

Broker pods need Kubernetes >= 1.28 (the ``apps.kubernetes.io/pod-index`` label picks each pod's
``broker-<ordinal>.conf``), an image with ``rmq-broker`` and ``rmq-namesrv`` on PATH that runs as
UID 10001 with a read-only root filesystem (``/tmp`` and ``/data`` are volumes).
"""

from __future__ import annotations

import argparse
import logging
import os

import kopf
from prometheus_client import start_http_server

from rmqoperator import handlers as _handlers  # noqa: F401 - registers the handlers
from rmqoperator.metrics import REGISTRY

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rmq-operator", description="Kubernetes operator for RocketMQ broker groups")
    parser.add_argument("-n", "--namespace", action="append", default=[],
                        help="namespace to watch (repeatable; default: $WATCH_NAMESPACE or all namespaces)")
    parser.add_argument("--metrics-port", type=int, default=int(os.environ.get("RMQ_OPERATOR_METRICS_PORT", "8080")),
                        help="Prometheus metrics port (0 disables)")
    parser.add_argument("--liveness-port", type=int,
                        default=int(os.environ.get("RMQ_OPERATOR_LIVENESS_PORT", "8081")),
                        help="kopf liveness endpoint port, /healthz (0 disables)")
    parser.add_argument("--log-level", default=os.environ.get("RMQ_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    namespaces = args.namespace or [n.strip() for n in os.environ.get("WATCH_NAMESPACE", "").split(",") if n.strip()]
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=REGISTRY)
    liveness = f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None
    kopf.run(clusterwide=not namespaces, namespaces=namespaces, standalone=True, liveness_endpoint=liveness)


if __name__ == "__main__":
    main()
