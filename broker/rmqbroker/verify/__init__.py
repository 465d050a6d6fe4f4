"""Replica verification: prove that a broker group's slaves hold exactly the master's data.

``rmq-verify`` (``rmqbroker.verify.cli:main``) reads every replica over its admin endpoint
(``GET /status``, ``/commitlog``, ``/consumequeue``, ``/metadata``, bearer token) and checks:

* **commitlog** - the master's range ``[minPhyOffset, maxPhyOffset)`` is cut into chunks, one
  Spark task each (``rmqbroker.verify.chunk`` explains how a task finds record boundaries and why
  they can be trusted).  Every record's framing and body CRC is checked with the broker's own
  codec (``rmqbroker.store.record``), and each slave is compared record by record (physical
  offset, size, body CRC, topic, queueId, queueOffset).  Records beyond what a slave serves
  (its max offset, or its ``dispatchedPhyOffset`` while it still builds consume queues for what
  it received) are *lag*, not corruption; records below its min offset (a slave that started from the master's
  last segment) are a *head gap*.
* **consume queues** - on every replica, every unit points at a record of its topic/queue/queue
  offset with the right size and tagsCode, and every record has its unit.
* **metadata** - topic configs and subscription groups (DataVersion and content), and consumer
  offsets: a slave's offset is never ahead of the master's.  A slave whose metadata is behind (a
  sync round can repair it) is compared again after its next round (``job.settle_metadata``).

Running it
----------
Local mode is the default and what a Kubernetes Job pod runs::

    rmq-verify --replicas http://b-0:10915,http://b-1:10915,http://b-2:10915 \
        --token-file /etc/rmq/admin-token --report /tmp/report.json \
        --termination-log /dev/termination-log [--configmap NAMESPACE/NAME] [--parquet DIR]

``--engine local`` runs the same tasks in-process without a JVM (small groups, no Java).  For a
large group, submit the same entry point to a Kubernetes Spark cluster (executors get the
chunks; the driver only plans, checks the chunk chain and writes the report)::

    spark-submit --master k8s://https://API:443 --deploy-mode cluster \
        --conf spark.kubernetes.container.image=IMAGE \
        --conf spark.kubernetes.namespace=NS \
        --conf spark.kubernetes.authenticate.driver.serviceAccountName=rmq-verify \
        --conf spark.executor.instances=4 \
        local:///opt/rmq/lib/python3.11/site-packages/rmqbroker/verify/__main__.py \
        --replicas ... --token-file ... --configmap NS/rmq-verify-GROUP

(under spark-submit the job uses the submitted master; ``--master`` is for plain ``rmq-verify``).

Exit status: 0 clean, 1 mismatches found, 2 a replica could not be verified (unreachable, bad
token, no usable master), the command line or token file is unusable, or an output (report,
Parquet, ConfigMap) could not be written after a clean verification (the error is in the report's
``errors``).

For the operator: reading the result
------------------------------------
* ``--termination-log /dev/termination-log``: when the container ends, the pod's
  ``status.containerStatuses[0].state.terminated.message`` holds a compact JSON summary of at
  most 4096 bytes (Kubernetes' limit)::

      {"result": "clean"|"mismatch"|"error", "exitCode": 0|1|2, "startedAt": ISO-8601,
       "bytesVerified": N, "mismatchCount": N, "range": {"start": N, "end": N},
       "replicas": [{"name", "role", "lagBytes", "mismatchCount", "byKind": {kind: N}}],
       "errors": [...], "firstMismatches": [{"replica", "kind", "offset", "topic", "queueId", ...}],
       "truncated": bool}

  ``firstMismatches`` (then ``replicas``) are dropped first when the limit is hit, and
  ``truncated`` says so; ``result``/``exitCode``/``mismatchCount``/``bytesVerified`` are always
  there.  Set ``terminationMessagePolicy: File`` (the default) on the container.
* ``--configmap NS/NAME``: the full report as ``data["report.json"]`` (mismatch lists cut to 20
  per replica if it would exceed ~900 KiB) and the same summary as ``data["summary.json"]``;
  needs RBAC to create/patch ConfigMaps in NS.
* ``status.lastVerification`` maps to: time = ``startedAt``, result = ``result``, bytes verified
  = ``bytesVerified``, mismatches = ``mismatchCount``; emit an Event when ``result`` is not
  ``clean``.

The full report (``--report``) has, per replica: records, bytes, verifiedRange, lagBytes,
headGapBytes, consumeQueueUnits, mismatchCount, mismatchesByKind and the kept mismatches (kind,
offset, size, topic, queueId, queueOffset, field, expected, actual, detail); kinds are listed in
``rmqbroker.verify.model``.
"""

from rmqbroker.verify.model import ChunkResult, ChunkTask, Mismatch, ReplicaRef

__all__ = ["ChunkResult", "ChunkTask", "Mismatch", "ReplicaRef"]
