"""``rmq-verify``: verify a broker group's replicas (see the package docstring for the contract)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rmqbroker.verify.admin_client import AdminError
from rmqbroker.verify.job import (
    Executor,
    LocalExecutor,
    SparkExecutor,
    VerifyOptions,
    spark_context,
    spark_session,
    verify,
)
from rmqbroker.verify.progress import Progress
from rmqbroker.verify.report import (
    EXIT_CLEAN,
    EXIT_ERROR,
    build_report,
    summary,
    write_configmap,
    write_parquet,
    write_report,
)

log = logging.getLogger("rmq-verify")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rmq-verify", description="Prove that a broker group's slaves hold the "
                                "master's data: commitlog records, consume queues and metadata.")
    p.add_argument("--replicas", required=True,
                   help="comma-separated admin URLs of the group's brokers (the master is found by its role)")
    p.add_argument("--token", default=None, help="admin bearer token (prefer --token-file or $RMQ_VERIFY_TOKEN)")
    p.add_argument("--token-file", default=None, help="file holding the admin bearer token")
    p.add_argument("--report", default=None, help="write the JSON report here")
    p.add_argument("--parquet", default=None, help="write the mismatches as Parquet to this directory")
    p.add_argument("--termination-log", default=None,
                   help="write the summary (<= 4096 bytes) here, e.g. /dev/termination-log in a pod")
    p.add_argument("--configmap", default=None, metavar="NAMESPACE/NAME",
                   help="create/replace this ConfigMap with report.json and summary.json (in-cluster credentials)")
    p.add_argument("--kube-api", default=None, help=argparse.SUPPRESS)  # tests / out-of-cluster API server
    p.add_argument("--engine", choices=("spark", "local"), default="spark",
                   help="spark (default) or local: every chunk in this process, no JVM")
    p.add_argument("--master", default=None,
                   help="Spark master (default local[*]; under spark-submit the submitted master)")
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark settings")
    p.add_argument("--chunk-size", type=parse_size, default=64 << 20, metavar="SIZE",
                   help="commitlog bytes per task, e.g. 32M or 512K (default 64M)")
    p.add_argument("--no-consume-queues", action="store_true", help="skip the consume-queue checks")
    p.add_argument("--no-metadata", action="store_true", help="skip the metadata checks")
    p.add_argument("--max-mismatches", type=int, default=1000, help="findings kept per replica (all are counted)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="how long one admin request may take before its replica counts as unreachable (default 120)")
    p.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                   help="progress line (auto: only when stdout is a terminal)")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary on stdout")
    args = p.parse_args(argv)
    if not args.timeout > 0:
        p.error("--timeout must be positive")
    bad_conf = [kv for kv in args.spark_conf if "=" not in kv or not kv.split("=", 1)[0].strip()]
    if bad_conf:
        p.error(f"--spark-conf expects KEY=VALUE, got {bad_conf[0]!r}")
    # The list, parsed once: main() verifies exactly what was checked here.
    args.replicas = [u.strip() for u in args.replicas.split(",") if u.strip()]
    dups = sorted({u for u in args.replicas if args.replicas.count(u) > 1})
    if dups:
        p.error(f"--replicas names {', '.join(dups)} more than once")
    return args


def parse_size(text: str) -> int:
    """``1048576``, ``512K``, ``64M`` or ``1G`` (binary units)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        n = int(t[:-1]) * units[t[-1]] if t and t[-1] in units else int(t)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from exc
    if n <= 0:
        raise argparse.ArgumentTypeError("size must be positive")
    return n


def read_token(args: argparse.Namespace) -> str:
    """The admin token; raises OSError when --token-file cannot be read."""
    if args.token_file:
        return Path(args.token_file).read_text().strip()
    if args.token is not None:
        return str(args.token)
    return os.environ.get("RMQ_VERIFY_TOKEN", "")


def _print_summary(report: dict[str, Any]) -> None:
    print(f"rmq-verify: {report['result'].upper()}  range [{report['range']['start']}, {report['range']['end']})  "
          f"{report['bytesVerified'] / 1e6:,.1f} MB  {report['mismatchCount']} mismatch(es)  "
          f"{report['durationSeconds']:.1f}s ({report['engine']})")
    for r in report["replicas"]:
        kinds = ", ".join(f"{k}={v}" for k, v in r["mismatchesByKind"].items()) or "none"
        gap = f", head gap {r['headGapBytes']} B (starts later than the master)" if r.get("headGapBytes") else ""
        print(f"  {r['role']:6} {r['name']}: {r['records']} records, {r['bytes'] / 1e6:,.1f} MB, "
              f"lag {r['lagBytes']} B{gap}, mismatches {r['mismatchCount']} ({kinds})")
        for m in r["mismatches"][:10]:
            where = f"@{m['offset']}" if m["offset"] is not None else ""
            q = f" {m['topic']}/{m['queueId']}" if m["topic"] is not None else ""
            qo = f"#{m['queueOffset']}" if m["queueOffset"] is not None else ""
            fld = f" {m['field']}: {m['expected']} != {m['actual']}" if m["expected"] or m["actual"] else ""
            print(f"    {m['kind']}{where}{q}{qo}{fld} {m['detail']}".rstrip())
    for e in report["errors"]:
        print(f"  error: {e}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = time.time()
    try:
        token = read_token(args)
    except OSError as exc:
        print(f"rmq-verify: cannot read the token file: {exc}", file=sys.stderr)
        return EXIT_ERROR
    progress = Progress(None if args.progress == "auto" else args.progress == "on")
    extra: dict[str, float] = {}
    sc = None
    executor: Executor
    if args.engine == "spark":
        conf = dict(kv.split("=", 1) for kv in args.spark_conf)
        t0 = time.perf_counter()
        sc = spark_context(args.master, conf)
        extra["sparkStart"] = time.perf_counter() - t0
        parallelism = sc.defaultParallelism
        executor = SparkExecutor(sc)
    else:
        parallelism = 1
        executor = LocalExecutor()
    opts = VerifyOptions(args.replicas, token, chunk_size=args.chunk_size, parallelism=parallelism,
                         check_consume_queues=not args.no_consume_queues, check_metadata=not args.no_metadata,
                         max_mismatches=args.max_mismatches, timeout=args.timeout)
    try:
        outcome = verify(opts, executor, progress)
    except (AdminError, ValueError) as exc:
        progress.close()
        print(f"rmq-verify: cannot verify: {exc}", file=sys.stderr)
        report: dict[str, Any] = {"version": 1, "result": "error", "exitCode": EXIT_ERROR, "errors": [str(exc)],
                                  "replicas": [], "bytesVerified": 0, "mismatchCount": 0,
                                  "range": {"start": 0, "end": 0},
                                  # UTC with its offset, as build_report writes it: the operator reads
                                  # a naive time as UTC, and local time made a failed run look hours
                                  # older or newer than its Job outside a UTC container.
                                  "startedAt": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds")}
        _emit(args, report)
        return EXIT_ERROR
    report = build_report(outcome, started, sc.master if sc is not None else None, extra)
    _emit(args, report)
    if not args.quiet:
        _print_summary(report)
    code: int = report["exitCode"]
    return code


def _emit(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Write the requested outputs, the termination message last. An output that cannot be written
    is an error of the run (exit 2, unless mismatches already make it 1), listed in the report's
    errors and said on stderr: the verification itself stands."""
    outputs: list[tuple[str, Any]] = []
    if args.report:
        outputs.append((f"the report {args.report}", lambda: write_report(report, args.report)))
    if args.parquet and report["replicas"]:
        # Re-uses the job's SparkContext (or starts one for --engine local).
        outputs.append((f"the Parquet mismatches {args.parquet}",
                        lambda: write_parquet(spark_session(args.master), report, args.parquet)))
    if args.configmap:
        outputs.append((f"the ConfigMap {args.configmap}",
                        lambda: write_configmap(report, args.configmap, api_url=args.kube_api)))
    for what, write in outputs:
        try:
            write()
        except Exception as exc:  # OSError, HTTP errors, no in-cluster credentials, Spark's Java errors
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            msg = f"cannot write {what}: {type(exc).__name__}: {reason}"
            print(f"rmq-verify: {msg}", file=sys.stderr)
            report["errors"].append(msg)
            if report["exitCode"] == EXIT_CLEAN:
                report["exitCode"] = EXIT_ERROR
    if args.termination_log:
        try:
            Path(args.termination_log).write_text(summary(report))
        except OSError as exc:
            log.warning("cannot write the termination message to %s: %s", args.termination_log, exc)


if __name__ == "__main__":
    sys.exit(main())
