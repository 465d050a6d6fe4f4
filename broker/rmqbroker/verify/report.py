"""The JSON report, its short summary (Kubernetes termination message), Parquet and ConfigMap output."""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmqbroker.verify.job import ReplicaState, VerifyOutcome
from rmqbroker.verify.model import UNREACHABLE, Mismatch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPORT_VERSION = 1
# Kubernetes keeps at most 4096 bytes of a container's termination message.
TERMINATION_MESSAGE_LIMIT = 4096
# A ConfigMap holds at most 1 MiB; keep room for the summary and object overhead.
CONFIGMAP_REPORT_LIMIT = 900 * 1024

EXIT_CLEAN = 0
EXIT_MISMATCH = 1
EXIT_ERROR = 2


def result_of(outcome: VerifyOutcome) -> tuple[str, int]:
    """``("clean", 0)``, ``("mismatch", 1)`` or ``("error", 2)`` (a replica could not be verified)."""
    if outcome.errors or any(st.by_kind.get(UNREACHABLE) for st in outcome.replicas):
        return "error", EXIT_ERROR
    if any(st.mismatch_count for st in outcome.replicas):
        return "mismatch", EXIT_MISMATCH
    return "clean", EXIT_CLEAN


def _replica_json(st: ReplicaState) -> dict[str, Any]:
    ref = st.ref
    s = st.status
    return {
        "name": ref.name,
        "role": "master" if st.is_master else "slave",
        "brokerRole": s.get("role"),
        "brokerId": ref.broker_id,
        "minPhyOffset": s.get("minPhyOffset"),
        "maxPhyOffset": s.get("maxPhyOffset"),
        "verifiedRange": [ref.start, ref.end],
        "records": st.stats.records,
        "bytes": st.stats.bytes,
        "lagBytes": st.lag_bytes,
        "lagRecords": st.stats.lag_records,
        "headGapBytes": st.head_gap_bytes,
        "consumeQueueUnits": st.stats.cq_units,
        "metadata": st.metadata,
        "mismatchCount": st.mismatch_count,
        "mismatchesByKind": dict(sorted(st.by_kind.items())),
        "mismatches": [m.to_json() for m in sorted(st.mismatches, key=_order)],
    }


def _order(m: Mismatch) -> tuple[int, str, int]:
    return (m.offset if m.offset is not None else -1, m.kind, m.queue_offset or 0)


def build_report(outcome: VerifyOutcome, started: float, spark_master: str | None,
                 extra_timings: dict[str, float] | None = None) -> dict[str, Any]:
    result, code = result_of(outcome)
    t = outcome.timings
    pair_bytes = sum(st.stats.bytes for st in outcome.slaves)
    return {
        "version": REPORT_VERSION,
        "result": result,
        "exitCode": code,
        "startedAt": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
        "durationSeconds": round(time.time() - started, 3),
        "engine": outcome.engine,
        "sparkMaster": spark_master,
        "master": outcome.master.ref.name,
        "range": {"start": outcome.start, "end": outcome.end},
        "chunks": outcome.tasks,
        "chunkSize": outcome.chunk_size,
        "chunkReruns": outcome.reruns,
        "bytesVerified": outcome.master.stats.bytes,
        "pairBytesVerified": pair_bytes,
        "mismatchCount": sum(st.mismatch_count for st in outcome.replicas),
        "errors": outcome.errors,
        "replicas": [_replica_json(st) for st in outcome.replicas],
        "timings": {
            **{k: round(v, 3) for k, v in outcome.phases.items()},
            **{k: round(v, 3) for k, v in (extra_timings or {}).items()},
            # Summed over tasks (so they can exceed the wall time with parallel tasks).
            "taskFetch": round(t.fetch, 3),
            "taskDecode": round(t.decode, 3),
            "taskCompare": round(t.compare, 3),
            "taskConsumeQueue": round(t.consume_queue, 3),
        },
    }


def summary(report: dict[str, Any], limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """Compact JSON of the report's essentials, at most ``limit`` bytes (first mismatches dropped last)."""
    first: list[dict[str, Any]] = []
    for r in report["replicas"]:
        first.extend(r["mismatches"][:5])
    doc: dict[str, Any] = {
        "result": report["result"],
        "exitCode": report["exitCode"],
        "startedAt": report["startedAt"],
        "bytesVerified": report["bytesVerified"],
        "mismatchCount": report["mismatchCount"],
        "range": report["range"],
        "replicas": [{"name": r["name"], "role": r["role"], "lagBytes": r["lagBytes"],
                      **({"headGapBytes": r["headGapBytes"]} if r.get("headGapBytes") else {}),
                      "mismatchCount": r["mismatchCount"], "byKind": r["mismatchesByKind"]}
                     for r in report["replicas"]],
        "errors": [e[:200] for e in report["errors"][:3]],
        "firstMismatches": [{k: v for k, v in m.items() if v is not None and k not in ("expected", "actual")}
                            for m in first],
        "truncated": False,
    }

    def text() -> str:
        return json.dumps(doc, separators=(",", ":"))

    while len(text().encode()) > limit and doc["firstMismatches"]:
        doc["firstMismatches"].pop()
        doc["truncated"] = True
    while len(text().encode()) > limit and doc["replicas"]:
        doc["replicas"].pop()
        doc["truncated"] = True
    out = text()
    return out if len(out.encode()) <= limit else json.dumps({"result": report["result"], "truncated": True})


def write_parquet(spark: SparkSession, report: dict[str, Any], path: str) -> int:
    """Every kept mismatch as one Parquet row (columns as in the JSON report); returns the row count."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType([
        StructField("replica", StringType(), False), StructField("kind", StringType(), False),
        StructField("offset", LongType(), True), StructField("size", LongType(), True),
        StructField("topic", StringType(), True), StructField("queueId", LongType(), True),
        StructField("queueOffset", LongType(), True), StructField("field", StringType(), True),
        StructField("expected", StringType(), True), StructField("actual", StringType(), True),
        StructField("detail", StringType(), True),
    ])
    rows = [tuple(m[f.name] for f in schema.fields) for r in report["replicas"] for m in r["mismatches"]]
    spark.createDataFrame(rows, schema).coalesce(1).write.mode("overwrite").parquet(path)
    return len(rows)


def write_report(report: dict[str, Any], path: str) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, path)


_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def write_configmap(report: dict[str, Any], target: str, api_url: str | None = None, token: str | None = None,
                    ) -> None:
    """Create or replace ConfigMap ``namespace/name`` with ``report.json`` and ``summary.json``.

    In a pod the API server, token and CA come from the service account; ``api_url``/``token``
    override them (tests, out-of-cluster runs).
    """
    namespace, _, name = target.rpartition("/")
    if not namespace:
        namespace = (_SA_DIR / "namespace").read_text().strip() if (_SA_DIR / "namespace").exists() else "default"
    ctx: ssl.SSLContext | None = None
    if api_url is None:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise OSError("not in a Kubernetes pod (KUBERNETES_SERVICE_HOST is not set)")
        api_url = f"https://{host}:{port}"
        ctx = ssl.create_default_context(cafile=str(_SA_DIR / "ca.crt"))
    if token is None and (_SA_DIR / "token").exists():
        token = (_SA_DIR / "token").read_text().strip()
    full = json.dumps(report, separators=(",", ":"))
    if len(full) > CONFIGMAP_REPORT_LIMIT:
        cut = [{**r, "mismatches": r["mismatches"][:20]} for r in report["replicas"]]
        full = json.dumps({**report, "replicas": cut, "truncated": True}, separators=(",", ":"))
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/component": "replica-verification"}},
            "data": {"report.json": full, "summary.json": summary(report)}}
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    base = f"{api_url.rstrip('/')}/api/v1/namespaces/{namespace}/configmaps"

    def send(method: str, url: str, content_type: str) -> None:
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method=method,
                                     headers={**headers, "Content-Type": content_type})
        with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:
            resp.read()

    try:
        send("POST", base, "application/json")
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise
        # Already there (an earlier run): replace its data.
        send("PATCH", f"{base}/{name}", "application/merge-patch+json")
