"""Acceptance of replica verification (issue 5): real stores from real brokers, PySpark in local mode.

A clean group passes; then each fault, injected into a copy of a slave's store that a real broker
serves, is found and located exactly - and nothing else is reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmqbroker.store.consume_queue import BLANK_SIZE, UNIT
from rmqbroker.store.record import COMPRESSED, header_size
from rmqbroker.verify.cli import main
from tests.support.procs import BrokerProc
from tests.verify.conftest import SEG, Group, StoreFiles, start_copy

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run_verify(urls: list[str], token: str, tmp: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    report = tmp / "report.json"
    code = main(["--replicas", ",".join(urls), "--token", token, "--report", str(report), "--quiet",
                 "--progress", "off", *extra])
    return code, json.loads(report.read_text())


def replica(report: dict[str, Any], url: str) -> dict[str, Any]:
    return next(r for r in report["replicas"] if r["name"] == url)


def only_findings(report: dict[str, Any], url: str) -> list[dict[str, Any]]:
    """The findings of ``url``, asserting that no other replica has any."""
    for r in report["replicas"]:
        if r["name"] != url:
            assert r["mismatchCount"] == 0, (r["name"], r["mismatches"][:5])
    r = replica(report, url)
    assert r["mismatchCount"] == len(r["mismatches"])
    return list(r["mismatches"])


def verify_copy(group: Group, tmp_path: Path, name: str, mutate: Callable[[Path], None], *extra: str,
                before: Callable[[BrokerProc], None] | None = None) -> tuple[int, dict[str, Any], str]:
    """rmq-verify over the master, slave 1 and a copy of the golden slave store after ``mutate``
    (see ``start_copy``); (exit code, report, the copy's URL). ``before`` looks at the copy first."""
    bad = start_copy(group, name, mutate)
    url = f"http://127.0.0.1:{bad.admin_port}"
    try:
        if before is not None:
            before(bad)
        code, rep = run_verify([*group.urls[:2], url], group.token, tmp_path, *extra)
    finally:
        bad.stop()
    return code, rep, url


def flip_byte(segment: Path, at: int, mask: int) -> None:
    with open(segment, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ mask]))


def test_clean_group_passes(spark: SparkSession, group: Group, tmp_path: Path) -> None:
    # 256 KiB chunks: a dozen tasks; records and 300 KB record-lookalike bodies straddle chunk starts.
    code, rep = run_verify(group.urls, group.token, tmp_path, "--chunk-size", "256K",
                           "--parquet", str(tmp_path / "mm.parquet"))
    assert code == 0, json.dumps(rep, indent=1)[:4000]
    print("clean run timings", rep["durationSeconds"], rep["timings"])
    assert rep["result"] == "clean" and rep["mismatchCount"] == 0
    assert rep["engine"] == "spark" and rep["chunks"] >= 12
    # Some chunk started inside a lookalike body: its guessed boundary was corrected by the chain check.
    assert rep["chunkReruns"] >= 1
    end = group.master.status()["maxPhyOffset"]
    assert rep["range"] == {"start": 0, "end": end} and end > 2 * SEG
    m = replica(rep, group.urls[0])
    assert m["role"] == "master" and m["bytes"] == end
    assert m["records"] > 4000
    for url in group.urls[1:]:
        r = replica(rep, url)
        assert r["records"] == m["records"] and r["bytes"] == end and r["lagBytes"] == 0
        assert r["consumeQueueUnits"] >= m["records"] - 10  # delayed originals have SCHEDULE units
    assert spark.read.parquet(str(tmp_path / "mm.parquet")).count() == 0


def test_flipped_body_byte_on_a_slave(group: Group, tmp_path: Path) -> None:
    recs = StoreFiles(group.golden).records()
    pos, rec = next((p, r) for p, r in recs[1500:] if r.sys_flag & COMPRESSED)
    at = pos + header_size(rec.sys_flag) + 7

    def flip(root: Path) -> None:
        flip_byte(root / "commitlog" / f"{pos - pos % SEG:020d}", at - pos + pos % SEG, 0x40)

    code, rep, url = verify_copy(group, tmp_path, "flip", flip, "--chunk-size", "256K")
    assert code == 1
    (m,) = only_findings(rep, url)
    assert (m["kind"], m["offset"], m["topic"], m["queueId"], m["queueOffset"]) == (
        "body_crc", pos, rec.topic, rec.queue_id, rec.queue_offset)
    assert f"record at {pos}:" in m["detail"], m  # the commitlog offset, not one inside a fetched chunk


def test_truncated_slave_is_lag_not_mismatch(group: Group, tmp_path: Path) -> None:
    recs = StoreFiles(group.golden).records()
    cut = recs[len(recs) // 2][0]

    def truncate(root: Path) -> None:
        for f in sorted((root / "commitlog").iterdir()):
            start = int(f.name)
            if start > cut:
                f.unlink()
            elif start + SEG > cut:
                with open(f, "r+b") as fh:
                    fh.seek(cut - start)
                    fh.write(bytes(start + SEG - cut))

    def serves_up_to_cut(bad: BrokerProc) -> None:
        assert bad.status()["maxPhyOffset"] == cut

    code, rep, url = verify_copy(group, tmp_path, "trunc", truncate, before=serves_up_to_cut)
    assert code == 0 and rep["result"] == "clean", rep["replicas"]
    r = replica(rep, url)
    assert r["mismatchCount"] == 0
    assert r["lagBytes"] == rep["range"]["end"] - cut and r["verifiedRange"] == [0, cut]
    assert r["bytes"] == cut and r["lagRecords"] == len([p for p, _ in recs if p >= cut])


def test_padding_after_a_segments_last_record_is_compared(group: Group, tmp_path: Path) -> None:
    """The end-of-segment blank marker and the padding after it are bytes a slave must hold too."""
    pos, rec = max(((p, r) for p, r in StoreFiles(group.golden).records() if p < SEG), key=lambda pr: pr[0])
    blank = pos + rec.total_size  # the first segment's end-of-file marker, then padding up to SEG
    assert SEG - blank > 16
    at = blank + 12  # past the marker's size and magic

    code, rep, url = verify_copy(group, tmp_path, "padding", lambda root: flip_byte(
        root / "commitlog" / f"{0:020d}", at, 0xFF), "--engine", "local")
    assert code == 1, rep["replicas"]
    (m,) = only_findings(rep, url)
    assert (m["kind"], m["offset"]) == ("non_record_bytes", at), m


def test_a_slave_without_the_masters_first_segment_shows_its_head_gap(group: Group, tmp_path: Path) -> None:
    term = tmp_path / "termination"

    def starts_at_the_second_segment(bad: BrokerProc) -> None:
        assert bad.status()["minPhyOffset"] == SEG

    code, rep, url = verify_copy(group, tmp_path, "headgap", lambda root: (root / "commitlog" / f"{0:020d}").unlink(),
                                 "--engine", "local", "--termination-log", str(term),
                                 before=starts_at_the_second_segment)
    assert code == 0 and replica(rep, url)["headGapBytes"] == SEG
    short = json.loads(term.read_text())
    assert [r.get("headGapBytes") for r in short["replicas"]] == [None, None, SEG]


def test_slave_record_with_another_topic(group: Group, tmp_path: Path) -> None:
    recs = StoreFiles(group.golden).records()
    pos, rec = next((p, r) for p, r in recs[2000:] if r.topic == "VerifyT1" and not r.sys_flag & COMPRESSED)
    topic_at = pos + header_size(rec.sys_flag) + len(rec.body) + 1

    def retopic(root: Path) -> None:
        seg = root / "commitlog" / f"{pos - pos % SEG:020d}"
        with open(seg, "r+b") as f:
            f.seek(topic_at - pos + pos % SEG)
            assert f.read(8) == b"VerifyT1"
            f.seek(-8, os.SEEK_CUR)
            f.write(b"VerifyT3")

    code, rep, url = verify_copy(group, tmp_path, "topic", retopic)
    assert code == 1
    found = only_findings(rep, url)
    record = [m for m in found if m["kind"] == "record"]
    assert [(m["offset"], m["field"], m["expected"], m["actual"]) for m in record] == [
        (pos, "topic", "VerifyT1", "VerifyT3")]
    # The replica's consume queues now disagree with its commitlog at the same record, and only there.
    assert all(m["offset"] == pos for m in found), found
    kinds = {(m["kind"], m["topic"]) for m in found}
    assert ("cq_dangling", "VerifyT1") in kinds  # VerifyT1's unit points at a VerifyT3 record
    assert {k for k, _ in kinds} <= {"record", "cq_dangling", "cq_wrong", "cq_missing"}


def test_missing_and_wrong_consume_queue_units(group: Group, tmp_path: Path) -> None:
    qdir = Path("consumequeue") / "VerifyT2" / "1"
    units = b"".join(f.read_bytes() for f in sorted((group.golden / qdir).iterdir()))
    n = len(units) // 20
    while n and units[(n - 1) * 20:n * 20] == bytes(20):  # the file's unwritten tail
        n -= 1
    missing_at, wrong_at = n // 3, 2 * n // 3
    miss_phy, miss_size, _ = UNIT.unpack_from(units, missing_at * 20)
    wrong_phy, wrong_size, wrong_tags = UNIT.unpack_from(units, wrong_at * 20)

    def damage(root: Path) -> None:
        f = sorted((root / qdir).iterdir())[0]
        with open(f, "r+b") as fh:
            fh.seek(missing_at * 20)
            fh.write(UNIT.pack(0, BLANK_SIZE, 0))
            fh.seek(wrong_at * 20)
            fh.write(UNIT.pack(wrong_phy, wrong_size, wrong_tags + 1))

    code, rep, url = verify_copy(group, tmp_path, "cq", damage)
    assert code == 1
    found = sorted(only_findings(rep, url), key=lambda m: m["queueOffset"])
    assert [(m["kind"], m["offset"], m["topic"], m["queueId"], m["queueOffset"], m["field"]) for m in found] == [
        ("cq_missing", miss_phy, "VerifyT2", 1, missing_at, None),
        ("cq_wrong", wrong_phy, "VerifyT2", 1, wrong_at, "tagsCode"),
    ]
    assert found[1]["expected"] == str(wrong_tags) and found[1]["actual"] == str(wrong_tags + 1)
    assert miss_size > 0


def test_subscription_group_missing_on_a_slave(group: Group, tmp_path: Path) -> None:
    def drop_group(root: Path) -> None:
        path = root / "config" / "subscriptionGroup.json"
        obj = json.loads(path.read_text())
        del obj["subscriptionGroupTable"]["CG_VERIFY_B"]  # DataVersion unchanged: no sync would notice
        path.write_text(json.dumps(obj))

    code, rep, url = verify_copy(group, tmp_path, "group", drop_group)
    assert code == 1
    (m,) = only_findings(rep, url)
    assert m["kind"] == "subscription_group" and m["field"] == "subscriptionGroupTable.CG_VERIFY_B"
    assert "missing on the replica although the DataVersion is the same" in m["detail"]


def test_slave_consumer_offset_ahead_of_master(group: Group, tmp_path: Path) -> None:
    def bump(root: Path) -> None:
        path = root / "config" / "consumerOffset.json"
        obj = json.loads(path.read_text())
        obj["offsetTable"]["VerifyT3@CG_VERIFY_A"]["2"] += 5
        path.write_text(json.dumps(obj))

    code, rep, url = verify_copy(group, tmp_path, "offsets", bump, "--no-consume-queues")
    assert code == 1
    (m,) = only_findings(rep, url)
    assert (m["kind"], m["topic"], m["queueId"], m["field"], m["expected"], m["actual"]) == (
        "consumer_offset_ahead", "VerifyT3", 2, "CG_VERIFY_A", "12", "17")


def test_console_script_local_engine_and_termination_message(group: Group, tmp_path: Path) -> None:
    """The operator's entry point: a separate process, token file, termination message, exit code."""
    token_file = tmp_path / "token"
    token_file.write_text(group.token + "\n")
    term = tmp_path / "termination-log"
    exe = Path(sys.executable).with_name("rmq-verify")
    proc = subprocess.run([str(exe), "--replicas", ",".join(group.urls), "--token-file", str(token_file),
                           "--engine", "local", "--termination-log", str(term), "--report", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CLEAN" in proc.stdout
    msg = json.loads(term.read_text())
    assert len(term.read_bytes()) <= 4096
    assert msg["result"] == "clean" and msg["mismatchCount"] == 0 and len(msg["replicas"]) == 3
    assert msg["bytesVerified"] == group.master.status()["maxPhyOffset"]
    # A wrong token is an error (exit 2), not a clean pass.
    token_file.write_text("wrong")
    proc = subprocess.run([str(exe), "--replicas", ",".join(group.urls), "--token-file", str(token_file),
                           "--engine", "local", "--termination-log", str(term)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert json.loads(term.read_text())["result"] == "error"


def test_usage_and_output_errors_are_one_line_and_exit_2(group: Group, tmp_path: Path) -> None:
    """Bad command lines and outputs that cannot be written: a message, exit 2, no traceback; an
    output failing after a clean verification keeps the verdict but not exit 0."""
    exe = str(Path(sys.executable).with_name("rmq-verify"))
    token = ["--token", group.token]
    cases: list[tuple[list[str], str]] = [
        (["--replicas", group.urls[0], "--token-file", str(tmp_path / "absent")], "cannot read the token file"),
        (["--replicas", group.urls[0], *token, "--spark-conf", "spark.ui.enabled"], "--spark-conf expects KEY=VALUE"),
        (["--replicas", f"{group.urls[0]},{group.urls[1]},{group.urls[0]}", *token], "more than once"),
    ]
    for argv, said in cases:
        proc = subprocess.run([exe, *argv, "--engine", "local"], capture_output=True, text=True, timeout=120,
                              check=False)
        assert proc.returncode == 2 and said in proc.stderr, (argv, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
    term = tmp_path / "termination-log"
    proc = subprocess.run([exe, "--replicas", ",".join(group.urls), *token, "--engine", "local",
                           "--report", str(tmp_path / "no" / "such" / "dir" / "r.json"), "--configmap", "ns/cm",
                           "--termination-log", str(term)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot write the report" in proc.stderr and "cannot write the ConfigMap ns/cm" in proc.stderr
    msg = json.loads(term.read_text())
    assert msg["result"] == "clean" and msg["exitCode"] == 2 and len(msg["errors"]) == 2


def test_a_replica_that_never_answers_is_unreachable_after_the_timeout(group: Group, tmp_path: Path) -> None:
    """A port that accepts connections and never answers (a hung broker) ends the run at --timeout."""
    import socket
    import time

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # connections complete in the backlog; nothing is ever read or written
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        began = time.monotonic()
        code, rep = run_verify([*group.urls[:2], url], group.token, tmp_path, "--engine", "local", "--timeout", "1")
        took = time.monotonic() - began
    assert code == 2 and took < 30, (code, took)
    assert [m["kind"] for m in replica(rep, url)["mismatches"]] == ["unreachable"]


def test_termination_summary_is_bounded() -> None:
    from rmqbroker.verify.report import summary

    mism = [{"replica": "http://x", "kind": "body_crc", "offset": i, "size": 1, "topic": "T" * 100, "queueId": 0,
             "queueOffset": i, "field": None, "expected": None, "actual": None, "detail": "d" * 1000}
            for i in range(100)]
    report = {"result": "mismatch", "exitCode": 1, "startedAt": "x", "bytesVerified": 1, "mismatchCount": 100,
              "range": {"start": 0, "end": 1}, "errors": [],
              "replicas": [{"name": "http://x", "role": "slave", "lagBytes": 0, "mismatchCount": 100,
                            "mismatchesByKind": {"body_crc": 100}, "mismatches": mism}]}
    text = summary(report)
    assert len(text.encode()) <= 4096
    doc = json.loads(text)
    assert doc["truncated"] and doc["mismatchCount"] == 100 and doc["firstMismatches"]


def test_progress_only_on_a_terminal() -> None:
    import io

    from rmqbroker.verify.progress import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    piped, tty = io.StringIO(), Tty()
    for stream in (piped, tty):
        p = Progress(stream=stream)
        p.update(3, 10, 30_000_000, force=True)
        p.close()
    assert piped.getvalue() == ""
    assert "3/10 chunks" in tty.getvalue() and "30.0 MB" in tty.getvalue()


def test_an_error_run_reports_its_start_in_utc(tmp_path: Path) -> None:
    """The operator reads startedAt (a naive time as UTC) to tell this Job's ConfigMap summary from
    an earlier run's; a run that could not verify wrote the local wall time without an offset."""
    import datetime
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens: connection refused
    term = tmp_path / "termination-log"
    began = time.time()
    proc = subprocess.run([str(Path(sys.executable).with_name("rmq-verify")), "--replicas", url, "--token", "t",
                           "--engine", "local", "--termination-log", str(term)],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "TZ": "America/New_York"})
    assert proc.returncode == 2, proc.stderr
    started = datetime.datetime.fromisoformat(json.loads(term.read_text())["startedAt"])
    assert started.tzinfo is not None and abs(started.timestamp() - began) < 60, started
