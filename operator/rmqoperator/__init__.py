"""Kubernetes operator for BrokerGroup resources (``rmq-operator``, or ``kopf run -m rmqoperator.handlers``).

Modules:

* ``spec`` -- the BrokerGroup spec as a typed value (CRD defaults re-applied) and semantic checks;
* ``builders`` -- pure functions: spec + role assignment -> StatefulSets, Services, ConfigMap, PDBs, Secret,
  the verification Job;
* ``reconcile`` / ``failover`` / ``rolling`` / ``status`` -- pure decisions (role assignment,
  failover candidate, admin-API alignment actions, restart order, conditions);
* ``verification`` -- pure decisions of replica verification (cron schedule, verify-now requests,
  the rmq-verify report -> ``status.lastVerification`` and the ``ReplicasVerified`` condition);
* ``controller`` -- per-group orchestration executing those decisions (``verifier``: its
  verification part, starting the rmq-verify Job and collecting its result);
* ``k8s`` -- the only module calling the Kubernetes API (and the RBAC it needs);
* ``brokerapi`` -- the brokers' admin HTTP API client;
* ``handlers`` -- thin kopf handlers; ``metrics`` -- Prometheus metrics; ``main`` -- the entry point.
"""
