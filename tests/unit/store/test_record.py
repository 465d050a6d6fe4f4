"""Record codec: golden bytes from the §3.1 table, Java hashCode, msg ids, properties, batches."""

from __future__ import annotations

import ipaddress
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqbroker.store.errors import CorruptRecordError, MessageIdError
from rmqbroker.store.record import (
    BLANK_MAGIC_CODE,
    BORNHOST_V6,
    MESSAGE_MAGIC_CODE,
    STOREHOST_V6,
    BatchEntry,
    check_record,
    decode_batch_body,
    decode_offset_msg_id,
    decode_properties,
    decode_record,
    dispatch_fields,
    encode_batch_body,
    encode_properties,
    encode_record,
    get_property,
    iter_records,
    java_string_hash,
    join_properties,
    offset_msg_id,
    record_properties,
    tags_code,
    write_blank,
)

# A record written out by hand, field by field, from the §3.1 table.
HAND_WRITTEN = bytes.fromhex(
    "00000085"  # 0 TOTALSIZE = 91 + 14 + 9 + 19 = 133
    "DAA320A7"  # 4 MAGICCODE
    "69C865ED"  # 8 BODYCRC = crc32("Hello RocketMQ") & 0x7FFFFFFF
    "00000001"  # 12 QUEUEID
    "00000000"  # 16 FLAG
    "0000000000000005"  # 20 QUEUEOFFSET
    "00000000000003E8"  # 28 PHYSICALOFFSET = 1000
    "00000000"  # 36 SYSFLAG
    "0000018BCFE56800"  # 40 BORNTIMESTAMP = 1700000000000
    "7F000001" "0000D431"  # 48 BORNHOST 127.0.0.1:54321
    "0000018BCFE5687B"  # 56 STORETIMESTAMP = 1700000000123
    "7F000001" "00002A9F"  # 64 STOREHOST 127.0.0.1:10911
    "00000000"  # 72 RECONSUMETIMES
    "0000000000000000"  # 76 PREPARED TRANSACTION OFFSET
    "0000000E"  # 84 BODYLENGTH = 14
    "48656C6C6F20526F636B65744D51"  # 88 BODY "Hello RocketMQ"
    "09"  # 102 TOPICLENGTH
    "546F70696354657374"  # 103 TOPIC "TopicTest"
    "0013"  # 112 PROPERTIESLENGTH = 19
    "4B45595301" "4B45593102" "5441475301" "54616741"  # 114 KEYS\x01KEY1\x02TAGS\x01TagA
)


def test_encode_record_matches_hand_written_bytes() -> None:
    assert len(HAND_WRITTEN) == 133
    got = encode_record(
        topic="TopicTest", body=b"Hello RocketMQ", properties={"KEYS": "KEY1", "TAGS": "TagA"}, queue_id=1,
        queue_offset=5, physical_offset=1000, born_timestamp=1700000000000, born_host=("127.0.0.1", 54321),
        store_timestamp=1700000000123, store_host=("127.0.0.1", 10911),
    )
    assert got == HAND_WRITTEN


def test_encode_record_matches_field_by_field_packing() -> None:
    body = b"some body \x00\xff"
    topic = b"TopicTest"
    props = b"TAGS\x01TagB\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01ABC"
    crc = zlib.crc32(body) & 0x7FFFFFFF
    total = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + len(body) + 1 + len(topic) + 2 + len(props)
    expected = b"".join([
        struct.pack(">i", total),
        struct.pack(">i", -626843481),
        struct.pack(">i", crc),
        struct.pack(">i", 3),  # queue id
        struct.pack(">i", 7),  # flag
        struct.pack(">q", 42),  # queue offset
        struct.pack(">q", 123456789),  # physical offset
        struct.pack(">i", 2),  # sys flag (MULTI_TAGS)
        struct.pack(">q", 1600000000001),
        bytes([10, 0, 0, 7]), struct.pack(">i", 40000),
        struct.pack(">q", 1600000000002),
        bytes([127, 0, 0, 1]), struct.pack(">i", 10911),
        struct.pack(">i", 2),  # reconsume times
        struct.pack(">q", 0),
        struct.pack(">i", len(body)), body,
        struct.pack(">b", len(topic)), topic,
        struct.pack(">h", len(props)), props,
    ])
    got = encode_record(
        topic="TopicTest", body=body, properties=props.decode(), queue_id=3, flag=7, queue_offset=42,
        physical_offset=123456789, sys_flag=2, born_timestamp=1600000000001, born_host=("10.0.0.7", 40000),
        store_timestamp=1600000000002, store_host=("127.0.0.1", 10911), reconsume_times=2,
    )
    assert got == expected


def test_decode_golden_record() -> None:
    rec = decode_record(HAND_WRITTEN)
    assert rec.total_size == 133
    assert rec.body_crc == 0x69C865ED
    assert rec.topic == "TopicTest"
    assert rec.body == b"Hello RocketMQ"
    assert rec.properties == {"KEYS": "KEY1", "TAGS": "TagA"}
    assert rec.properties_str == "KEYS\x01KEY1\x02TAGS\x01TagA"
    assert rec.tags == "TagA"
    assert rec.keys == "KEY1"
    assert rec.tags_code == 2598919
    assert rec.born_host == ("127.0.0.1", 54321)
    assert rec.store_host == ("127.0.0.1", 10911)
    assert rec.queue_offset == 5 and rec.physical_offset == 1000 and rec.queue_id == 1
    assert rec.store_timestamp == 1700000000123
    assert rec.msg_id == "7F00000100002A9F" + "00000000000003E8"
    assert check_record(HAND_WRITTEN, 0) == 133
    fields = dispatch_fields(HAND_WRITTEN, 0)
    assert fields == (133, "TopicTest", 1, 5, 0, 1700000000123, "KEYS\x01KEY1\x02TAGS\x01TagA")


def test_ipv6_hosts_set_sysflag_and_shift_fields() -> None:
    data = encode_record(topic="T", body=b"b", born_host=("::1", 1), store_host=("fe80::2", 2), sys_flag=1)
    assert len(data) == 91 + 1 + 1 + 24
    sys_flag = struct.unpack_from(">i", data, 36)[0]
    assert sys_flag == 1 | BORNHOST_V6 | STOREHOST_V6
    # store timestamp follows the 20-byte born host
    assert data[48:64] == ipaddress.IPv6Address("::1").packed
    rec = decode_record(data)
    assert rec.born_host == ("::1", 1)
    assert rec.store_host == ("fe80::2", 2)
    assert check_record(data, 0) == len(data)
    only_born = encode_record(topic="T", body=b"", born_host=("::1", 1), store_host=("1.2.3.4", 2))
    assert struct.unpack_from(">i", only_born, 36)[0] == BORNHOST_V6
    assert decode_record(only_born).store_host == ("1.2.3.4", 2)


def test_ipv4_mapped_ipv6_is_stored_as_ipv4() -> None:
    data = encode_record(topic="T", body=b"", born_host=("::ffff:10.1.2.3", 5))
    assert struct.unpack_from(">i", data, 36)[0] == 0
    assert decode_record(data).born_host == ("10.1.2.3", 5)


def test_java_string_hash_golden_values() -> None:
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    # Known Java values: overflow to Integer.MIN_VALUE, and a classic collision.
    assert java_string_hash("polygenelubricants") == -2147483648
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    # Non-ASCII BMP: U+65E5 U+672C -> 0x65E5 * 31 + 0x672C
    assert java_string_hash("\u65e5\u672c") == 0x65E5 * 31 + 0x672C == 835047
    assert java_string_hash("\u00e9") == 0xE9
    # Outside the BMP Java hashes the surrogate pair D83D DE00 (U+1F600).
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00 == 1772899
    expected = ((ord("a") * 31 + 0xD83D) * 31 + 0xDE00) * 31 + ord("b")
    assert java_string_hash("a\U0001f600b") == expected
    assert tags_code(None) == 0 and tags_code("") == 0 and tags_code("TagA") == 2598919


def _reference_hash(s: str) -> int:
    raw = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(raw), 2):
        h = (h * 31 + int.from_bytes(raw[i:i + 2], "big")) % (1 << 32)
    return h - (1 << 32) if h >= 1 << 31 else h


@given(st.text())
def test_java_string_hash_matches_definition(s: str) -> None:
    assert java_string_hash(s) == _reference_hash(s)


def test_offset_msg_id_golden() -> None:
    assert offset_msg_id("127.0.0.1", 10911, 0) == "7F00000100002A9F0000000000000000"
    assert offset_msg_id("127.0.0.1", 10911, 0x123456789A) == "7F00000100002A9F" + "000000123456789A"
    assert decode_offset_msg_id("7F00000100002A9F000000123456789A") == ("127.0.0.1", 10911, 0x123456789A)
    v6 = offset_msg_id("::1", 10911, 5)
    assert len(v6) == 56
    assert decode_offset_msg_id(v6) == ("::1", 10911, 5)
    for bad in ("", "7F00", "ZZ000001" * 4, "7F00000100002A9F00000000000000000"):
        with pytest.raises(MessageIdError):
            decode_offset_msg_id(bad)


def _not_mapped(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    # IPv4-mapped IPv6 addresses are deliberately stored (and decoded) as IPv4.
    return not isinstance(addr, ipaddress.IPv6Address) or addr.ipv4_mapped is None


_ips = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6).filter(_not_mapped))


@given(
    _ips,
    st.integers(0, 65535),
    st.integers(0, 2**63 - 1),
)
def test_offset_msg_id_round_trip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, phy: int) -> None:
    msg_id = offset_msg_id(str(ip), port, phy)
    assert msg_id == msg_id.upper()
    assert len(msg_id) == (32 if ip.version == 4 else 56)
    assert decode_offset_msg_id(msg_id) == (str(ip), port, phy)


def test_properties_java_and_cpp_forms() -> None:
    assert encode_properties({"TAGS": "TagA", "KEYS": "K1"}) == "TAGS\x01TagA\x02KEYS\x01K1"
    assert encode_properties({}) == ""
    # C++ writes a trailing separator.
    assert decode_properties("KEYS\x01KEY1\x02TAGS\x01TagA\x02WAIT\x01true\x02") == {
        "KEYS": "KEY1", "TAGS": "TagA", "WAIT": "true"}
    # Malformed segments are skipped as the Java reader does.
    assert decode_properties("KEY\x01\x02\x01v\x02ab\x02noseparator\x02a\x01b") == {"a": "b"}
    assert decode_properties("a\x01b\x01c") == {"a": "b\x01c"}
    assert decode_properties("") == {}
    assert decode_properties("A\x011\x02A\x012") == {"A": "2"}
    assert get_property("A\x011\x02TAGS\x01x\x02", "TAGS") == "x"
    assert get_property("TAGS\x01x", "TAGS") == "x"
    assert get_property("XTAGS\x01x", "TAGS") is None
    assert get_property("TAGS\x01a\x02TAGS\x01b", "TAGS") == "b"
    assert get_property("", "TAGS") is None
    assert join_properties("A\x011\x02", "W\x01t") == "A\x011\x02W\x01t"
    assert join_properties("A\x011", "W\x01t") == "A\x011\x02W\x01t"
    assert join_properties("", "W\x01t") == "W\x01t"
    assert join_properties("A\x011", "") == "A\x011"


_prop_text = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), min_size=1, max_size=20)


@given(st.dictionaries(_prop_text, _prop_text, max_size=8), st.booleans())
def test_properties_round_trip(props: dict[str, str], trailing: bool) -> None:
    text = encode_properties(props)
    assert decode_properties(text + ("\x02" if trailing else "")) == props
    for key, value in props.items():
        assert get_property(text, key) == value


_topic = st.text(st.characters(codec="utf-8"), max_size=40).filter(lambda t: len(t.encode()) <= 127)
_host = st.tuples(_ips.map(str), st.integers(0, 65535))
_i32 = st.integers(-(2**31), 2**31 - 1)
_i64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=200)
@given(
    topic=_topic, body=st.binary(max_size=300), props=st.dictionaries(_prop_text, _prop_text, max_size=5),
    queue_id=_i32, flag=_i32, queue_offset=_i64, phy=_i64, sys_flag=st.integers(0, 0xF) | st.just(0x700),
    born_ts=_i64, born_host=_host, store_ts=_i64, store_host=_host, reconsume=_i32, prepared=_i64,
)
def test_record_round_trip(topic: str, body: bytes, props: dict[str, str], queue_id: int, flag: int,
                           queue_offset: int, phy: int, sys_flag: int, born_ts: int, born_host: tuple[str, int],
                           store_ts: int, store_host: tuple[str, int], reconsume: int, prepared: int) -> None:
    data = encode_record(
        topic=topic, body=body, properties=props, queue_id=queue_id, flag=flag, queue_offset=queue_offset,
        physical_offset=phy, sys_flag=sys_flag, born_timestamp=born_ts, born_host=born_host,
        store_timestamp=store_ts, store_host=store_host, reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
    )
    rec = decode_record(data)
    assert rec.total_size == len(data)
    assert (rec.topic, rec.body, rec.properties) == (topic, body, props)
    assert (rec.queue_id, rec.flag, rec.queue_offset, rec.physical_offset) == (queue_id, flag, queue_offset, phy)
    assert rec.sys_flag & 0xF0F == sys_flag
    assert (rec.born_timestamp, rec.store_timestamp) == (born_ts, store_ts)
    assert (rec.born_host, rec.store_host) == (born_host, store_host)
    assert (rec.reconsume_times, rec.prepared_transaction_offset) == (reconsume, prepared)
    assert rec.body_crc == zlib.crc32(body) & 0x7FFFFFFF
    assert check_record(data, 0) == len(data)
    # concatenated records, as in a pull body
    assert [r.body for r in iter_records(data + data)] == [body, body]


def test_check_record_rejects_damage() -> None:
    data = bytearray(HAND_WRITTEN)
    assert check_record(data, 0) == 133
    bad_crc = bytearray(data)
    bad_crc[90] ^= 0xFF  # a body byte
    with pytest.raises(CorruptRecordError):
        check_record(bad_crc, 0)
    assert check_record(bad_crc, 0, check_crc=False) == 133
    bad_magic = bytearray(data)
    bad_magic[4] = 0
    with pytest.raises(CorruptRecordError):
        check_record(bad_magic, 0)
    bad_size = bytearray(data)
    struct.pack_into(">i", bad_size, 0, 134)
    with pytest.raises(CorruptRecordError):
        check_record(bad_size + b"\0", 0)
    with pytest.raises(CorruptRecordError):
        check_record(data[:100], 0)  # torn
    with pytest.raises(CorruptRecordError):
        check_record(bytes(200), 0)  # unwritten space
    with pytest.raises(CorruptRecordError):
        check_record(data, 0, limit=132)
    blank = bytearray(16)
    write_blank(blank, 0, 16)
    assert struct.unpack(">ii", blank[:8]) == (16, BLANK_MAGIC_CODE)
    assert check_record(blank, 0) == 0
    with pytest.raises(CorruptRecordError):
        decode_record(bad_magic, 0)
    with pytest.raises(CorruptRecordError):
        list(iter_records(bytes(data) + b"\x00" * 10))
    assert struct.unpack(">i", bytes.fromhex("DAA320A7"))[0] == MESSAGE_MAGIC_CODE


def test_batch_body_golden_and_errors() -> None:
    props = b"TAGS\x01TagA\x02UNIQ_KEY\x01ID1\x02WAIT\x01true\x02"
    entry = (struct.pack(">iiiii", 20 + 3 + 2 + len(props), 0, 0, 5, 3) + b"abc"
             + struct.pack(">h", len(props)) + props)
    entry2 = struct.pack(">iiiii", 22, 0, 0, 0, 0) + struct.pack(">h", 0)
    entries = decode_batch_body(entry + entry2)
    assert entries == [BatchEntry(5, b"abc", props.decode()), BatchEntry(0, b"", "")]
    assert encode_batch_body(entries) == entry + entry2
    for bad in (b"", entry[:10], entry[:-1], struct.pack(">iiiii", 0, 0, 0, 0, -1),
                struct.pack(">iiiii", 0, 0, 0, 0, 0) + struct.pack(">h", -1),
                struct.pack(">iiiii", 0, 0, 0, 0, 0) + struct.pack(">h", 2) + b"\xff\xfe"):
        with pytest.raises(CorruptRecordError):
            decode_batch_body(bad)


@given(st.lists(st.builds(BatchEntry, _i32, st.binary(max_size=100), st.text(st.characters(codec="utf-8"),
                                                                          max_size=50)),
                min_size=1, max_size=10))
def test_batch_round_trip(entries: list[BatchEntry]) -> None:
    assert decode_batch_body(encode_batch_body(entries)) == entries


@pytest.mark.parametrize(("born", "store"), [(("10.0.0.5", 5000), ("10.0.0.9", 10911)),
                                             (("::1", 5000), ("10.0.0.9", 10911)),
                                             (("10.0.0.5", 5000), ("fe80::1", 10911))])
def test_record_properties_reads_what_dispatch_fields_reads(born: tuple[str, int], store: tuple[str, int]) -> None:
    """The properties alone, for SQL92 selectors, at every header size (IPv4/IPv6 hosts) and offset."""
    props = {"TAGS": "TagA", "a": "37", "région": "€ü", "KEYS": "k1 k2"}
    one = encode_record(topic="Orders", body=b"x" * 33, properties=props, born_host=born, store_host=store)
    two = encode_record(topic="T", body=b"", properties="", born_host=born, store_host=store)
    buf = memoryview(b"pad" + one + two)
    assert record_properties(buf, 3) == dispatch_fields(buf, 3)[6] == encode_properties(props)
    assert record_properties(buf, 3 + len(one)) == ""
