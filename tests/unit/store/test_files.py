"""Mapped files, the commitlog and consume queues on real files."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from rmqbroker.store import mapped_file
from rmqbroker.store.checkpoint import AbortMarker, StoreCheckpoint
from rmqbroker.store.commitlog import CommitLog
from rmqbroker.store.consume_queue import BLANK_SIZE, ConsumeQueue
from rmqbroker.store.errors import StoreConfigError, StoreError
from rmqbroker.store.mapped_file import MappedFile, MappedFileQueue, file_name
from rmqbroker.store.record import (
    BLANK_MAGIC_CODE,
    check_record,
    decode_record,
    encode_tail,
    ip_to_bytes,
    record_size,
)

SEG = 64 * 1024
LOCAL = ip_to_bytes("127.0.0.1")


def _append(cl: CommitLog, topic: str, qid: int, body: bytes, props: bytes = b"") -> tuple[int, int, int]:
    tail = encode_tail(topic.encode(), props)
    size = record_size(0, len(body), len(tail))
    phy, qoff, _ts = cl.append_message(topic, qid, 0, body, tail, size, 0, 1, LOCAL, 1, LOCAL, 10911, 0, 0, True)
    return phy, size, qoff


def test_mapped_file_basics(tmp_path: Path) -> None:
    assert file_name(1073741824) == "00000000001073741824"
    mf = MappedFile(tmp_path / file_name(4096), 4096, create=True)
    assert mf.file_from_offset == 4096 and (tmp_path / "00000000000000004096").stat().st_size == 4096
    assert mf.append(b"x" * 5000) == 4096 and mf.is_full
    assert mf.flush() == 4096
    mf.truncate_to(10)
    assert mf.wrote_position == 10 and mf.flushed_position == 10
    assert mf.mm[:10] == b"x" * 10 and mf.mm[10:] == bytes(4086)
    mf.close()
    with pytest.raises(StoreError):
        MappedFile(tmp_path / file_name(4096), 4096, create=True)  # exists already
    with pytest.raises(StoreConfigError):
        MappedFile(tmp_path / file_name(4096), 8192, create=False)


def test_truncate_zeroes_stale_bytes_beyond_the_write_position(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / file_name(0), 1 << 20, create=True)
    mf.mm[900_000:900_010] = b"garbage!!!"  # written by a previous life, position unknown
    mf.wrote_position = 100
    mf.truncate_to(50)
    assert mf.mm[900_000:900_010] == bytes(10)
    mf.close()


def test_mapped_file_queue_load_validation(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path / "q", 4096)
    a = q.get_last_file()
    a.append(b"a" * 4096)
    b = q.get_last_file()
    assert b.file_from_offset == 4096
    b.append(b"b" * 10)
    assert q.max_offset() == 4106 and q.min_offset() == 0
    assert q.find_file(4100) is b and q.find_file(8192) is None and q.find_file(-1) is None
    q.close()

    loaded = MappedFileQueue(tmp_path / "q", 4096)
    assert loaded.load() is True and len(loaded.files) == 2
    loaded.truncate_to(4096)
    assert [f.file_from_offset for f in loaded.files] == [0]
    assert loaded.max_offset() == 4096
    loaded.close()

    with pytest.raises(StoreConfigError, match="configured size"):
        MappedFileQueue(tmp_path / "q", 8192).load()
    (tmp_path / "q" / file_name(12288)).write_bytes(bytes(4096))  # gap after segment 0
    with pytest.raises(StoreConfigError, match="gap"):
        MappedFileQueue(tmp_path / "q", 4096).load()
    lenient = MappedFileQueue(tmp_path / "q", 4096)
    assert lenient.load(strict=False) is False
    assert [f.file_from_offset for f in lenient.files] == [0]
    assert not (tmp_path / "q" / file_name(12288)).exists()
    lenient.close()


def test_commitlog_rolls_with_blank_marker(tmp_path: Path) -> None:
    cl = CommitLog(tmp_path / "commitlog", SEG)
    cl.load()
    records = [_append(cl, "T", 0, bytes([i % 256]) * 1000) for i in range(200)]
    files = cl.mfq.files
    assert len(files) >= 3
    for mf in files[:-1]:
        assert mf.wrote_position == SEG
        # the last record of the segment is followed by [bytes left][BLANK_MAGIC]
        last = max(p for p, _s, _q in records if mf.file_from_offset <= p < mf.file_end_offset)
        size = next(s for p, s, _q in records if p == last)
        rel = last - mf.file_from_offset + size
        blank_len, magic = struct.unpack_from(">ii", mf.mm, rel)
        assert magic == BLANK_MAGIC_CODE and blank_len == SEG - rel
        assert mf.mm[rel + 8:] == bytes(SEG - rel - 8)
    for i, (phy, size, qoff) in enumerate(records):
        assert qoff == i
        view = cl.read(phy, size)
        assert view is not None
        rec = decode_record(view)
        assert rec.physical_offset == phy and rec.queue_offset == i and rec.body == bytes([i % 256]) * 1000
        assert phy // SEG == (phy + size - 1) // SEG  # never spans segments
    assert cl.topic_queue_table == {"T-0": 200}
    assert cl.read(records[-1][0] + 1, 10**6) is None
    assert cl.look_message(records[5][0]) == bytes(cl.read(records[5][0], records[5][1]) or b"")
    assert cl.look_message(records[5][0] + 1) is None
    data = cl.get_data(0, cl.max_offset() + 100)
    assert len(data) == cl.max_offset()
    assert cl.get_data(records[3][0], records[3][1]) == cl.look_message(records[3][0])
    view = cl.read_range(SEG - 10, 100)
    assert view is not None and len(view) == 10  # never crosses a segment
    cl.close()


def test_commitlog_append_raw_and_recover(tmp_path: Path) -> None:
    master = CommitLog(tmp_path / "m", SEG)
    master.load()
    for i in range(150):
        _append(master, f"T{i % 3}", i % 2, b"z" * (500 + i))
    stream = master.get_data(0, master.max_offset())

    slave = CommitLog(tmp_path / "s", SEG)
    slave.load()
    pos = 0
    for chunk in (7, 1000, 30000, 70000, 10**9):
        part = stream[pos:pos + chunk]
        if not part:
            break
        assert slave.append_raw(pos, part) == pos + len(part)
        pos += len(part)
    assert slave.max_offset() == master.max_offset()
    assert slave.get_data(0, 10**9) == stream
    with pytest.raises(StoreError):
        slave.append_raw(pos + 1, b"x")
    positions = [(mf.file_from_offset + rel, size) for mf, rel, size in slave.iter_records(0)]
    assert sum(1 for _p, s in positions if s) == 150
    slave.close()

    # torn tail: half a record after the end
    rec = master.look_message(0)
    assert rec is not None
    last = master.mfq.last_file
    assert last is not None
    end = master.max_offset()
    last.mm[last.wrote_position:last.wrote_position + 60] = rec[:60]
    master.close()
    reopened = CommitLog(tmp_path / "m", SEG)
    reopened.load()
    assert reopened.recover(0, check_crc=True) == end
    assert reopened.max_offset() == end
    tail = reopened.mfq.last_file
    assert tail is not None and tail.mm[tail.wrote_position:tail.wrote_position + 60] == bytes(60)
    reopened.close()


def test_commitlog_append_raw_into_empty_log_mid_segment(tmp_path: Path) -> None:
    cl = CommitLog(tmp_path / "c", SEG)
    cl.load()
    cl.append_raw(SEG * 3 + 100, b"abc")
    assert cl.min_offset() == SEG * 3 and cl.max_offset() == SEG * 3 + 103
    assert cl.get_data(SEG * 3 + 100, 3) == b"abc"
    cl.close()


def test_consume_queue_units_blank_fill_and_truncation(tmp_path: Path) -> None:
    cq = ConsumeQueue("T", 1, tmp_path, 20 * 10)
    cq.load()
    cq.put_unit(13, 1000, 100, 7)  # first unit of the queue at logical 13
    assert cq.min_offset() == 13 and cq.max_offset() == 14
    assert cq.get_unit(10) == (0, BLANK_SIZE, 0) and cq.get_unit(13) == (1000, 100, 7)
    for i in range(14, 30):
        cq.put_unit(i, 1000 + (i - 13) * 100, 100, i)
    cq.put_unit(20, 1700, 100, 20)  # duplicate dispatch is ignored
    assert cq.max_offset() == 30
    assert [f.file_from_offset for f in cq.mfq.files] == [200, 400]
    assert cq.get_units(18, 5) == [(1000 + (i - 13) * 100, 100, i) for i in range(18, 23)]
    found = cq.units_buffer(18)
    assert found is not None and found[1] == 160 and found[2] == 200
    assert cq.roll_next_file(18) == 20
    assert cq.truncate_beyond_phy(2350) == 4  # units whose record ends after 2350
    assert cq.max_offset() == 26 and cq.max_phy_end == 2300
    cq.put_unit(30, 3000, 10, 0)  # a gap is filled with blanks
    assert cq.get_unit(27) == (0, BLANK_SIZE, 0) and cq.get_unit(30) == (3000, 10, 0)
    assert [f.file_from_offset for f in cq.mfq.files] == [200, 400, 600]
    cq.close()

    again = ConsumeQueue("T", 1, tmp_path, 20 * 10)
    assert again.load() is True and again.recover() is True
    assert again.min_offset() == 13 and again.max_offset() == 31 and again.max_phy_end == 3010
    again.close()


def test_consume_queue_recover_stops_at_garbage(tmp_path: Path) -> None:
    cq = ConsumeQueue("T", 0, tmp_path, 20 * 100)
    cq.load()
    for i in range(10):
        cq.put_unit(i, i * 100, 100, 0)
    last = cq.mfq.last_file
    assert last is not None
    last.mm[100:120] = struct.pack(">qiq", 5, -3, 0)  # unit 5 is garbage
    cq.close()
    again = ConsumeQueue("T", 0, tmp_path, 20 * 100)
    again.load()
    assert again.recover() is False
    assert again.max_offset() == 5 and again.max_phy_end == 500
    again.close()


def test_search_offset_by_time(tmp_path: Path) -> None:
    cq = ConsumeQueue("T", 0, tmp_path, 20 * 4)
    cq.load()
    times = [100, 200, 200, 300, 500, 800, 1300]
    for i in range(len(times)):
        cq.put_unit(i, i * 10, 10, 0)

    def store_time(phy: int, size: int) -> int:
        return times[phy // 10]

    def search(ts: int) -> int:
        return cq.search_offset_by_time(ts, store_time, 0)

    assert search(100) == 0 and search(200) == 1 and search(500) == 4
    assert search(50) == 0 and search(5000) == 6
    assert search(240) == 2  # nearer to 200 (offset 2) than to 300
    assert search(260) == 3
    assert search(250) == 2  # tie goes to the earlier message
    assert search(1000) == 5
    cq.close()
    empty = ConsumeQueue("E", 0, tmp_path, 20 * 4)
    assert empty.search_offset_by_time(1, store_time, 0) == 0


def test_checkpoint_and_abort(tmp_path: Path) -> None:
    ck = StoreCheckpoint(tmp_path / "checkpoint")
    ck.load()
    assert ck.min_timestamp() == 0
    ck.physic_msg_timestamp, ck.logics_msg_timestamp, ck.index_msg_timestamp = 10, 7, 3
    ck.flush()
    raw = (tmp_path / "checkpoint").read_bytes()
    assert len(raw) == 4096 and struct.unpack_from(">qqq", raw) == (10, 7, 3)
    again = StoreCheckpoint(tmp_path / "checkpoint")
    again.load()
    assert (again.physic_msg_timestamp, again.logics_msg_timestamp, again.min_timestamp()) == (10, 7, 7)
    abort = AbortMarker(tmp_path / "abort")
    assert not abort.exists()
    abort.create()
    assert abort.exists()
    abort.remove()
    abort.remove()
    assert not abort.exists()


def test_check_record_on_commitlog_segment(tmp_path: Path) -> None:
    cl = CommitLog(tmp_path / "c", SEG)
    cl.load()
    phy, size, _ = _append(cl, "T", 0, b"hello", b"TAGS\x01A")
    last = cl.mfq.last_file
    assert last is not None
    assert check_record(last.mm, phy) == size
    cl.close()


def test_consume_queue_sums_the_sizes_its_units_record(tmp_path: Path) -> None:
    """sum_sizes (TOPIC_PUT_SIZE) adds the recorded sizes across segments, blank units left out,
    and says how many units it read; it equals the sum over get_units."""
    cq = ConsumeQueue("T", 0, tmp_path, 20 * 7)
    cq.load()
    sizes = {i: 100 + i * 997 for i in range(40)}
    sizes[5] = 4 * 1024 * 1024  # large sizes carry into every byte of the field
    for i, size in sizes.items():
        if i not in (12, 13):  # a gap: two blank units
            cq.put_unit(i, i * 10_000_000, size, 0)
    want = [u[1] for u in cq.get_units(0, 40) if u[1] != BLANK_SIZE]
    assert len(want) == 38
    assert cq.sum_sizes(0, 40) == (sum(want), 40)
    assert cq.sum_sizes(3, 20) == (sum(u[1] for u in cq.get_units(3, 20) if u[1] != BLANK_SIZE), 20)
    assert cq.sum_sizes(38, 10) == (sizes[38] + sizes[39], 2)  # only what is written
    assert cq.sum_sizes(40, 5) == (0, 0)
    cq.close()


def test_writes_check_their_room_while_the_disk_has_plenty_and_reserve_blocks_ahead_below_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    size = 8 << 20  # a step is a 64th of the file, at least 64 KiB: 128 KiB here; a check covers 8 KiB
    mf = MappedFile(tmp_path / file_name(0), size, create=True)

    def allocated() -> int:
        return mf.path.stat().st_blocks * 512

    try:
        assert allocated() == 0  # created sparse
        # The test disk has far more than PLENTY_FREE: a 16th of a step is checked, nothing allocated ahead.
        mf.append(b"x" * 100)
        assert mf.reserved == 8 << 10 and allocated() < 64 << 10
        monkeypatch.setattr(mapped_file, "PLENTY_FREE", 1 << 62)  # now the disk looks nearly full
        mf.append(b"y" * (10 << 10))
        assert mf.reserved == (8 << 10) + (128 << 10)  # a whole step beyond what was covered ...
        assert allocated() >= 128 << 10  # ... with its blocks taken now
        monkeypatch.undo()
        mf.reserve(1 << 20, allocate=True)  # the slave's stream asks for real blocks whatever the disk has
        assert mf.reserved == 1 << 20 and allocated() >= (1 << 20) - (8 << 10)
    finally:
        mf.close()
