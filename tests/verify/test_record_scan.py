"""``record.verify_record``, the bulk path the verifier walks logs with, agrees with the codec's
``check_record`` + ``dispatch_fields`` (the chunk-boundary logic is exercised end to end by
``test_verify.test_clean_group_passes`` with record-lookalike bodies)."""

from __future__ import annotations

import pytest

from rmqbroker.store.errors import CorruptRecordError
from rmqbroker.store.record import (
    check_record,
    dispatch_fields,
    encode_record,
    verify_record,
    write_blank,
)


def _log() -> bytes:
    recs = [encode_record(topic=f"T{i % 3}", body=bytes([i]) * (i * 37 % 500), properties={"TAGS": f"t{i}"},
                          queue_id=i % 4, queue_offset=i, physical_offset=0, born_host=("::1", 1) if i == 5 else
                          ("127.0.0.1", 2), store_timestamp=1000 + i) for i in range(40)]
    return b"".join(recs)


def test_verify_record_matches_check_and_dispatch() -> None:
    data = _log()
    pos = 0
    while pos < len(data):
        size, ok, topic, qid, qoff, sys_flag, ts, props = verify_record(data, pos)
        assert ok and size == check_record(data, pos)
        assert dispatch_fields(data, pos) == (size, topic, qid, qoff, sys_flag, ts, props)
        pos += size


def test_verify_record_reports_a_bad_body_crc_and_raises_on_framing() -> None:
    rec = bytearray(encode_record(topic="T", body=b"hello world", queue_offset=3))
    rec[90] ^= 1  # inside the body
    assert verify_record(rec, 0)[1] is False
    with pytest.raises(CorruptRecordError):
        verify_record(rec[:-1], 0)  # cut off
    blank = bytearray(16)
    write_blank(blank, 0, 16)
    with pytest.raises(CorruptRecordError):
        verify_record(blank, 0)
    bad = bytearray(rec)
    bad[0:4] = (len(rec) + 1).to_bytes(4, "big")  # TOTALSIZE disagrees with the fields
    with pytest.raises(CorruptRecordError):
        verify_record(bad + b"\0", 0)
