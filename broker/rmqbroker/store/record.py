"""The one stored-record codec: commitlog records (§3.1), properties (§3.3), msg ids (§3.5), batches (§3.7).

The same bytes appear in the commitlog, in pull response bodies, in the HA stream and in
VIEW_MESSAGE_BY_ID, so every other package encodes and decodes records through this module.
"""

from __future__ import annotations

import functools
import mmap
import socket
import struct
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from rmqbroker.store.errors import CorruptRecordError, MessageIdError

try:
    # ISA-L's CRC32 (same polynomial and values as zlib's) folds with carry-less multiplication:
    # ~4x faster than zlib 1.2's table on a 1 KiB body and ~9x on the megabytes a recovery or a
    # verification job checks.
    import isal.isal_zlib as _crc_impl
except ImportError:  # no isal wheel for this platform
    import zlib as _crc_impl  # type: ignore[no-redef]

# Buffers records are read from / written into: mapped segments, response bodies, scratch arrays.
ReadBuffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
WriteBuffer: TypeAlias = bytearray | memoryview | mmap.mmap

# -- magic codes ----------------------------------------------------------------------------------
MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194: end-of-file marker
# Bytes a segment must keep free after any record, so the end-of-file marker always fits.
END_FILE_MIN_BLANK_LENGTH: Final = 8

# -- SYSFLAG bits (§3.2) --------------------------------------------------------------------------
COMPRESSED: Final = 0x1
# RocketMQ 5's compression type in bits 8-10 of a compressed message (0 before 5: zlib).
COMPRESSION_TYPE_MASK: Final = 0x7 << 8
COMPRESSION_TYPE_ZLIB: Final = 0x3 << 8
MULTI_TAGS: Final = 0x2
TRANSACTION_NOT_TYPE: Final = 0x0
TRANSACTION_PREPARED_TYPE: Final = 0x4
TRANSACTION_COMMIT_TYPE: Final = 0x8
TRANSACTION_ROLLBACK_TYPE: Final = 0xC
TRANSACTION_TYPE_MASK: Final = 0xC
BORNHOST_V6: Final = 0x10
STOREHOST_V6: Final = 0x20
NEED_UNWRAP: Final = 0x40
INNER_BATCH: Final = 0x80
HOST_V6_MASK = BORNHOST_V6 | STOREHOST_V6

# -- property separators and well-known keys (§3.3, §3.4) -----------------------------------------
NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"

KEYS: Final = "KEYS"
TAGS: Final = "TAGS"
WAIT: Final = "WAIT"
DELAY: Final = "DELAY"
UNIQ_KEY: Final = "UNIQ_KEY"
REAL_TOPIC: Final = "REAL_TOPIC"
REAL_QID: Final = "REAL_QID"
RETRY_TOPIC: Final = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
CLUSTER: Final = "CLUSTER"
TRAN_MSG: Final = "TRAN_MSG"
PGROUP: Final = "PGROUP"
RECONSUME_TIME: Final = "RECONSUME_TIME"
MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
MIN_OFFSET: Final = "MIN_OFFSET"
MAX_OFFSET: Final = "MAX_OFFSET"
MSG_REGION: Final = "MSG_REGION"
TRACE_ON: Final = "TRACE_ON"
BUYER_ID: Final = "BUYER_ID"
TRANSFER_FLAG: Final = "TRANSFER_FLAG"
CORRECTION_FLAG: Final = "CORRECTION_FLAG"
MQ2_FLAG: Final = "MQ2_FLAG"
CONSUME_START_TIME: Final = "CONSUME_START_TIME"
TRAN_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
TRANSACTION_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_TIME_IN_SECONDS: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"
INSTANCE_ID: Final = "INSTANCE_ID"
CORRELATION_ID: Final = "CORRELATION_ID"
REPLY_TO_CLIENT: Final = "REPLY_TO_CLIENT"
TTL: Final = "TTL"
ARRIVE_TIME: Final = "ARRIVE_TIME"
PUSH_REPLY_TIME: Final = "PUSH_REPLY_TIME"
MSG_TYPE: Final = "MSG_TYPE"

MAX_TOPIC_LENGTH = 127  # TOPICLENGTH is one (signed) byte
MAX_PROPERTIES_LENGTH = 32767  # PROPERTIESLENGTH is a signed short

# -- record header layouts (§3.1) -----------------------------------------------------------------
# Both hosts IPv4 (the common case).  Byte offsets:
#   0 TOTALSIZE i | 4 MAGICCODE i | 8 BODYCRC i | 12 QUEUEID i | 16 FLAG i | 20 QUEUEOFFSET q
#  28 PHYSICALOFFSET q | 36 SYSFLAG i | 40 BORNTIMESTAMP q | 48 BORNHOST ip 4s + port i
#  56 STORETIMESTAMP q | 64 STOREHOSTADDRESS ip 4s + port i | 72 RECONSUMETIMES i
#  76 PREPARED TRANSACTION OFFSET q | 84 BODYLENGTH i | 88 BODY...
_HDR_V4_V4 = struct.Struct(">iiiiiqqiq4siq4siiqi")
# BORNHOST_V6 only: born host is 16-byte ip + port, everything after shifts by +12.
#   0..47 as above | 48 BORNHOST 16s + i | 68 STORETIMESTAMP q | 76 STOREHOST 4s + i
#  84 RECONSUMETIMES i | 88 PREPARED TRANSACTION OFFSET q | 96 BODYLENGTH i | 100 BODY...
_HDR_V6_V4 = struct.Struct(">iiiiiqqiq16siq4siiqi")
# STOREHOST_V6 only: store host is 16-byte ip + port.
#   0..47 as above | 48 BORNHOST 4s + i | 56 STORETIMESTAMP q | 64 STOREHOST 16s + i
#  84 RECONSUMETIMES i | 88 PREPARED TRANSACTION OFFSET q | 96 BODYLENGTH i | 100 BODY...
_HDR_V4_V6 = struct.Struct(">iiiiiqqiq4siq16siiqi")
# Both hosts IPv6: each host 16-byte ip + port (+24 in total).
#   0..47 as above | 48 BORNHOST 16s + i | 68 STORETIMESTAMP q | 76 STOREHOST 16s + i
#  96 RECONSUMETIMES i | 100 PREPARED TRANSACTION OFFSET q | 108 BODYLENGTH i | 112 BODY...
_HDR_V6_V6 = struct.Struct(">iiiiiqqiq16siq16siiqi")
# Indexed by (sys_flag >> 4) & 3, i.e. by the BORNHOST_V6 / STOREHOST_V6 bits.
_HEADERS: tuple[struct.Struct, ...] = (_HDR_V4_V4, _HDR_V6_V4, _HDR_V4_V6, _HDR_V6_V6)
# Header sizes (88, 100, 100, 112) by the same index, for callers sizing records inline.
HEADER_SIZES: tuple[int, ...] = tuple(h.size for h in _HEADERS)

# First 8 bytes of any record or end-of-file marker: 0 TOTALSIZE (or maxBlank) i | 4 MAGICCODE i
_SIZE_MAGIC = struct.Struct(">ii")
# One int field read on its own (SYSFLAG at record offset 36, BODYLENGTH, BODYCRC):  0 value i
_I32 = struct.Struct(">i")
SYSFLAG_POS: Final = 36
# PROPERTIESLENGTH after the topic:  0 length H  (unsigned, so corruption shows up as a size mismatch)
_U16 = struct.Struct(">H")
# STORETIMESTAMP read on its own, at record offset 56 (68 with an IPv6 born host):  0 value q
_I64 = struct.Struct(">q")
# Queue-id / queue-offset pair starting at record offset 12: 0 QUEUEID i | 4 FLAG i | 8 QUEUEOFFSET q
_QID_FLAG_QOFF = struct.Struct(">iiq")

# Bytes after the header that are not body/topic/properties: TOPICLENGTH (1) + PROPERTIESLENGTH (2).
_TAIL_FIXED = 3
# Smallest possible record (IPv4 hosts, empty body, topic and properties).
MIN_RECORD_SIZE = _HDR_V4_V4.size + _TAIL_FIXED

# -- batch entry (§3.7) ---------------------------------------------------------------------------
# Entry header:  0 TOTALSIZE i | 4 MAGICCODE i (0) | 8 BODYCRC i (0) | 12 FLAG i | 16 BODYLEN i | 20 BODY
_BATCH_HDR = struct.Struct(">iiiii")
# Right after BODY:  0 PROPLEN h | 2 PROPERTIES
_BATCH_PROPLEN = struct.Struct(">h")

# -- offset msg id (§3.5) -------------------------------------------------------------------------
# After the 4- or 16-byte store ip:  0 store port i | 4 commitlog physical offset q
_PORT_OFFSET = struct.Struct(">iq")


def header_size(sys_flag: int) -> int:
    """Bytes before BODY for a record with these SYSFLAG host bits."""
    return _HEADERS[(sys_flag >> 4) & 3].size


def record_size(sys_flag: int, body_len: int, tail_len: int) -> int:
    """TOTALSIZE of a record whose tail (see :func:`encode_tail`) is ``tail_len`` bytes."""
    return _HEADERS[(sys_flag >> 4) & 3].size + body_len + tail_len


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """BODYCRC as RocketMQ stores it: CRC32 masked to a non-negative int."""
    return _crc_impl.crc32(body) & 0x7FFFFFFF


# -- Java String.hashCode -------------------------------------------------------------------------
_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"


@functools.lru_cache(maxsize=8192)
def java_string_hash(s: str) -> int:
    """Java ``String.hashCode()``: polynomial over UTF-16 code units, 32-bit signed overflow."""
    if s.isascii():
        units: bytes | memoryview = s.encode("ascii")
    else:
        # UTF-16 in native order so the code units can be read with a plain cast.
        units = memoryview(s.encode(_UTF16_NATIVE, "surrogatepass")).cast("H")
    h = 0
    for unit in units:
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """Consume-queue tagsCode for a TAGS value (§3.6): 0 without tags."""
    return java_string_hash(tags) if tags else 0


# -- properties -----------------------------------------------------------------------------------
def encode_properties(props: Mapping[str, str]) -> str:
    """Java-style properties string: ``k\\x01v`` joined by ``\\x02``, no trailing separator."""
    return PROPERTY_SEPARATOR.join([k + NAME_VALUE_SEPARATOR + v for k, v in props.items()])


def decode_properties(text: str) -> dict[str, str]:
    """Parse a properties string the way the Java reader does (§3.3).

    Segments shorter than 3 chars, without a name/value separator, or with an empty name or
    value are skipped, which also absorbs the C++ client's trailing ``\\x02``.
    """
    out: dict[str, str] = {}
    if not text:
        return out
    for segment in text.split(PROPERTY_SEPARATOR):
        if len(segment) < 3:
            continue
        name, _, value = segment.partition(NAME_VALUE_SEPARATOR)
        if name and value:
            out[name] = value
    return out


def get_property(text: str, name: str) -> str | None:
    """One property from an encoded string without building a dict (last occurrence wins, as in Java)."""
    key = name + NAME_VALUE_SEPARATOR
    idx = text.rfind(PROPERTY_SEPARATOR + key)
    if idx >= 0:
        start = idx + 1 + len(key)
    elif text.startswith(key):
        start = len(key)
    else:
        return None
    end = text.find(PROPERTY_SEPARATOR, start)
    value = text[start:] if end < 0 else text[start:end]
    return value or None


def join_properties(first: str, second: str) -> str:
    """Append ``second`` to ``first``, inserting a separator only when ``first`` lacks one (§3.7)."""
    if not first:
        return second
    if not second:
        return first
    if first.endswith(PROPERTY_SEPARATOR):
        return first + second
    return first + PROPERTY_SEPARATOR + second


# -- hosts ----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def ip_to_bytes(ip: str) -> bytes:
    """4 bytes for IPv4 (IPv4-mapped IPv6 included, C++ consumers need IPv4), else 16 bytes."""
    try:
        return socket.inet_pton(socket.AF_INET, ip)
    except OSError:
        pass
    try:
        raw = socket.inet_pton(socket.AF_INET6, ip.split("%", 1)[0])
    except OSError as exc:
        raise ValueError(f"not an IP address: {ip!r}") from exc
    if raw[:12] == b"\x00" * 10 + b"\xff\xff":
        return raw[12:]
    return raw


@functools.lru_cache(maxsize=4096)
def bytes_to_ip(raw: bytes) -> str:
    """Inverse of :func:`ip_to_bytes`."""
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def host_sys_flag(born_ip: bytes, store_ip: bytes) -> int:
    """The SYSFLAG host bits matching two encoded addresses."""
    return (BORNHOST_V6 if len(born_ip) == 16 else 0) | (STOREHOST_V6 if len(store_ip) == 16 else 0)


# -- offset message id ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)
def _msg_id_prefix(ip: str, port: int) -> str:
    return (ip_to_bytes(ip) + _I32.pack(port)).hex().upper()


def offset_msg_id(ip: str, port: int, phy_offset: int) -> str:
    """Broker message id: store ip + port + commitlog offset, upper-case hex (32 chars for IPv4)."""
    if phy_offset < 0:
        phy_offset &= 0xFFFFFFFFFFFFFFFF
    return f"{_msg_id_prefix(ip, port)}{phy_offset:016X}"


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """``(ip, port, physical offset)`` from an offset message id; 32 hex chars means IPv4."""
    if len(msg_id) == 32:
        ip_len = 4
    elif len(msg_id) == 56:
        ip_len = 16
    else:
        raise MessageIdError(f"offset msg id must be 32 or 56 hex chars, got {len(msg_id)}: {msg_id!r}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise MessageIdError(f"offset msg id is not hex: {msg_id!r}") from exc
    port, phy = _PORT_OFFSET.unpack_from(raw, ip_len)
    return bytes_to_ip(raw[:ip_len]), port, phy


# -- records --------------------------------------------------------------------------------------
@dataclass(slots=True)
class MessageRecord:
    """A decoded stored record (§3.1)."""

    total_size: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str] = field(default_factory=dict)
    properties_str: str = ""

    @property
    def tags(self) -> str | None:
        return self.properties.get(TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(KEYS)

    @property
    def msg_id(self) -> str:
        """Offset message id of this record (store host + physical offset)."""
        return offset_msg_id(self.store_host[0], self.store_host[1], self.physical_offset)

    @property
    def tags_code(self) -> int:
        return tags_code(self.properties.get(TAGS))


def encode_tail(topic: bytes, properties: bytes) -> bytes:
    """TOPICLENGTH + TOPIC + PROPERTIESLENGTH + PROPERTIES, the part that follows BODY."""
    return bytes((len(topic),)) + topic + _U16.pack(len(properties)) + properties


@functools.lru_cache(maxsize=4096)
def topic_prefix(topic: str) -> bytes:
    """TOPICLENGTH + TOPIC for a topic (cached: topics repeat); longer than 128 bytes means illegal."""
    raw = topic.encode("utf-8")
    return bytes((min(len(raw), 255),)) + raw


def encode_tail_with_prefix(prefix: bytes, properties: bytes) -> bytes:
    """Like :func:`encode_tail` with a precomputed :func:`topic_prefix`."""
    return prefix + _U16.pack(len(properties)) + properties


# Positional on purpose: this runs once per stored message and keyword passing costs measurably more.
def write_record_into(
    buf: WriteBuffer,
    pos: int,
    total_size: int,
    crc: int,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp: int,
    born_ip: bytes,
    born_port: int,
    store_timestamp: int,
    store_ip: bytes,
    store_port: int,
    reconsume_times: int,
    prepared_transaction_offset: int,
    body: bytes | bytearray | memoryview,
    tail: bytes,
) -> None:
    """Write one complete record at ``buf[pos:pos+total_size]`` (the commitlog hot path).

    The caller has already computed ``total_size`` with :func:`record_size`, ``tail`` with
    :func:`encode_tail`, and set the SYSFLAG host bits to match the ip lengths.
    """
    hdr = _HEADERS[(sys_flag >> 4) & 3]
    hdr.pack_into(
        buf, pos, total_size, MESSAGE_MAGIC_CODE, crc, queue_id, flag, queue_offset, physical_offset,
        sys_flag, born_timestamp, born_ip, born_port, store_timestamp, store_ip, store_port,
        reconsume_times, prepared_transaction_offset, len(body),
    )
    p = pos + hdr.size
    end = p + len(body)
    buf[p:end] = body
    buf[end:end + len(tail)] = tail


def encode_record(
    *,
    topic: str,
    body: bytes,
    properties: Mapping[str, str] | str = "",
    queue_id: int = 0,
    flag: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    sys_flag: int = 0,
    born_timestamp: int = 0,
    born_host: tuple[str, int] = ("127.0.0.1", 0),
    store_timestamp: int = 0,
    store_host: tuple[str, int] = ("127.0.0.1", 0),
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    crc: int | None = None,
) -> bytes:
    """The exact stored bytes of one record (§3.1); SYSFLAG host bits follow the host addresses."""
    props = properties if isinstance(properties, str) else encode_properties(properties)
    topic_b = topic.encode("utf-8")
    props_b = props.encode("utf-8")
    if len(topic_b) > MAX_TOPIC_LENGTH:
        raise ValueError(f"topic is {len(topic_b)} bytes, at most {MAX_TOPIC_LENGTH} fit")
    if len(props_b) > MAX_PROPERTIES_LENGTH:
        raise ValueError(f"properties are {len(props_b)} bytes, at most {MAX_PROPERTIES_LENGTH} fit")
    born_ip = ip_to_bytes(born_host[0])
    store_ip = ip_to_bytes(store_host[0])
    sys_flag = (sys_flag & ~HOST_V6_MASK) | host_sys_flag(born_ip, store_ip)
    tail = encode_tail(topic_b, props_b)
    size = record_size(sys_flag, len(body), len(tail))
    out = bytearray(size)
    write_record_into(
        out, 0, size, body_crc(body) if crc is None else crc, queue_id, flag, queue_offset,
        physical_offset, sys_flag, born_timestamp, born_ip, born_host[1], store_timestamp, store_ip,
        store_host[1], reconsume_times, prepared_transaction_offset, body, tail,
    )
    return bytes(out)


def decode_record(buf: ReadBuffer, pos: int = 0) -> MessageRecord:
    """Decode the record at ``pos``; raises :class:`CorruptRecordError` if it is not one."""
    try:
        sys_flag = _I32.unpack_from(buf, pos + SYSFLAG_POS)[0]
        hdr = _HEADERS[(sys_flag >> 4) & 3]
        (total, magic, crc, qid, flag, qoff, phy, sys_flag, born_ts, born_ip, born_port, store_ts,
         store_ip, store_port, reconsume, prepared, body_len) = hdr.unpack_from(buf, pos)
    except struct.error as exc:
        raise CorruptRecordError(f"record header truncated at {pos}", pos) from exc
    if magic != MESSAGE_MAGIC_CODE:
        raise CorruptRecordError(f"bad magic code {magic & 0xFFFFFFFF:#010x} at {pos}", pos)
    p = pos + hdr.size
    end = pos + total
    if body_len < 0 or total > len(buf) - pos or p + body_len + _TAIL_FIXED > end:
        raise CorruptRecordError(f"record at {pos} has inconsistent lengths (total {total})", pos)
    body = bytes(buf[p:p + body_len])
    p += body_len
    topic_len = buf[p]
    topic_raw = bytes(buf[p + 1:p + 1 + topic_len])
    p += 1 + topic_len
    if p + 2 > end:
        raise CorruptRecordError(f"record at {pos}: topic runs past the record end", pos)
    props_len = _U16.unpack_from(buf, p)[0]
    p += 2
    if p + props_len != end:
        raise CorruptRecordError(f"record at {pos}: TOTALSIZE {total} disagrees with its fields", pos)
    try:
        topic = topic_raw.decode("utf-8")
        props = bytes(buf[p:end]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(f"record at {pos}: topic or properties are not UTF-8", pos) from exc
    return MessageRecord(
        total, crc, qid, flag, qoff, phy, sys_flag, born_ts, (bytes_to_ip(born_ip), born_port), store_ts,
        (bytes_to_ip(store_ip), store_port), reconsume, prepared, body, topic, decode_properties(props), props,
    )


def iter_records(buf: ReadBuffer) -> Iterator[MessageRecord]:
    """Decode concatenated records, e.g. a pull response body (§3.8)."""
    pos = 0
    n = len(buf)
    while pos < n:
        if n - pos < MIN_RECORD_SIZE:
            raise CorruptRecordError(f"{n - pos} trailing bytes at {pos} cannot hold a record", pos)
        rec = decode_record(buf, pos)
        yield rec
        pos += rec.total_size


def check_record(buf: ReadBuffer, pos: int, check_crc: bool = True, limit: int | None = None) -> int:
    """Validate the record at ``pos`` and return its size (recovery's ``checkMessageAndReturnSize``).

    Returns 0 for an end-of-file blank marker.  Raises :class:`CorruptRecordError` for anything
    else that is not a complete, self-consistent record inside ``buf[:limit]`` (including
    unwritten zeroes, so callers that expect a clean tail test for them first).
    """
    n = len(buf) if limit is None else min(limit, len(buf))
    if pos < 0 or n - pos < _SIZE_MAGIC.size:
        raise CorruptRecordError(f"no room for a record header at {pos}", pos)
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return 0
    if magic != MESSAGE_MAGIC_CODE:
        raise CorruptRecordError(f"bad magic code {magic & 0xFFFFFFFF:#010x} at {pos}", pos)
    if total < MIN_RECORD_SIZE or total > n - pos:
        raise CorruptRecordError(f"record at {pos} has impossible TOTALSIZE {total}", pos)
    sys_flag = _I32.unpack_from(buf, pos + SYSFLAG_POS)[0]
    hsize = _HEADERS[(sys_flag >> 4) & 3].size
    if total < hsize + _TAIL_FIXED:
        raise CorruptRecordError(f"record at {pos} has impossible TOTALSIZE {total}", pos)
    body_len = _I32.unpack_from(buf, pos + hsize - 4)[0]
    p = pos + hsize + body_len
    if body_len < 0 or p + _TAIL_FIXED > pos + total:
        raise CorruptRecordError(f"record at {pos} has impossible BODYLENGTH {body_len}", pos)
    p += 1 + buf[p]
    if p + 2 > pos + total:
        raise CorruptRecordError(f"record at {pos}: topic runs past the record end", pos)
    if p + 2 + _U16.unpack_from(buf, p)[0] != pos + total:
        raise CorruptRecordError(f"record at {pos}: TOTALSIZE {total} disagrees with its fields", pos)
    if check_crc:
        stored = _I32.unpack_from(buf, pos + 8)[0]
        start = pos + hsize
        with memoryview(buf) as view:
            actual = body_crc(view[start:start + body_len])
        if actual != stored:
            raise CorruptRecordError(f"record at {pos}: body CRC {actual} != stored {stored}", pos)
    return int(total)


def peek_size_magic(buf: ReadBuffer, pos: int) -> tuple[int, int]:
    """TOTALSIZE (or blank length) and MAGICCODE of the record at ``pos``."""
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    return int(size), int(magic)


def write_blank(buf: WriteBuffer, pos: int, blank_len: int) -> None:
    """The 8-byte end-of-file marker ``[blank_len][BLANK_MAGIC_CODE]``."""
    _SIZE_MAGIC.pack_into(buf, pos, blank_len, BLANK_MAGIC_CODE)


# Everything dispatch needs from an IPv4/IPv4 record header, in one unpack:
#   0 TOTALSIZE i | 4 MAGICCODE i | 8 (BODYCRC) | 12 QUEUEID i | 16 (FLAG) | 20 QUEUEOFFSET q
#  28 (PHYSICALOFFSET) | 36 SYSFLAG i | 40 (BORNTIMESTAMP, BORNHOST) | 56 STORETIMESTAMP q
#  64 (STOREHOST, RECONSUMETIMES, PREPARED TRANSACTION OFFSET) | 84 BODYLENGTH i
_DISPATCH_V4 = struct.Struct(">ii4xi4xq8xi16xq20xi")
_topic_names: dict[bytes, str] = {}


def dispatch_record(buf: ReadBuffer, pos: int, limit: int) -> tuple[int, str, int, int, int, int, str] | None:
    """Fast path of :func:`check_record` (without CRC) + :func:`dispatch_fields` for the common case.

    Returns the dispatch fields of a complete, self-consistent IPv4 record inside ``buf[:limit]``,
    or None for anything else (end-of-file marker, IPv6 hosts, partial or corrupt data) — the caller
    then takes the general path, which also produces the precise error.
    """
    if limit - pos < MIN_RECORD_SIZE:
        return None
    total, magic, qid, qoff, sys_flag, store_ts, body_len = _DISPATCH_V4.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC_CODE or sys_flag & (BORNHOST_V6 | STOREHOST_V6) or not (
            MIN_RECORD_SIZE <= total <= limit - pos) or body_len < 0:
        return None
    end = pos + total
    p = pos + 88 + body_len
    if p + _TAIL_FIXED > end:
        return None
    t0 = p + 1
    p = t0 + buf[p]
    if p + 2 > end or p + 2 + ((buf[p] << 8) | buf[p + 1]) != end:
        return None
    raw_topic = bytes(buf[t0:p])
    topic = _topic_names.get(raw_topic)
    if topic is None:
        topic = raw_topic.decode("utf-8", "replace")
        if len(_topic_names) < 65536:
            _topic_names[raw_topic] = topic
    return total, topic, qid, qoff, sys_flag, store_ts, bytes(buf[p + 2:end]).decode("utf-8", "replace")


def dispatch_fields(buf: ReadBuffer, pos: int) -> tuple[int, str, int, int, int, int, str]:
    """What a consume-queue dispatch needs from an already-checked record, without decoding the body.

    Returns ``(total_size, topic, queue_id, queue_offset, sys_flag, store_timestamp, properties)``.
    """
    total = _I32.unpack_from(buf, pos)[0]
    qid, _flag, qoff = _QID_FLAG_QOFF.unpack_from(buf, pos + 12)
    sys_flag = _I32.unpack_from(buf, pos + SYSFLAG_POS)[0]
    hsize = _HEADERS[(sys_flag >> 4) & 3].size
    store_ts = _I64.unpack_from(buf, pos + (68 if sys_flag & BORNHOST_V6 else 56))[0]
    p = pos + hsize + _I32.unpack_from(buf, pos + hsize - 4)[0]
    topic_len = buf[p]
    topic = bytes(buf[p + 1:p + 1 + topic_len]).decode("utf-8", "replace")
    p += 1 + topic_len
    props_len = _U16.unpack_from(buf, p)[0]
    props = bytes(buf[p + 2:p + 2 + props_len]).decode("utf-8", "replace")
    return int(total), topic, int(qid), int(qoff), int(sys_flag), int(store_ts), props


def record_properties(buf: ReadBuffer, pos: int) -> str:
    """The properties string of an already-checked record, and nothing else (what an SQL92
    selector reads on every record a pull scans: a third of :func:`dispatch_fields`' cost)."""
    sys_flag = _I32.unpack_from(buf, pos + SYSFLAG_POS)[0]
    hsize = _HEADERS[(sys_flag >> 4) & 3].size
    p = pos + hsize + _I32.unpack_from(buf, pos + hsize - 4)[0]
    p += 1 + buf[p]
    props_len = _U16.unpack_from(buf, p)[0]
    return str(buf[p + 2:p + 2 + props_len], "utf-8", "replace")


# TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET read at once (bulk verification).
#   0 TOTALSIZE i | 4 MAGICCODE i | 8 BODYCRC i | 12 QUEUEID i | 16 FLAG i | 20 QUEUEOFFSET q
_HEAD28 = struct.Struct(">iiiiiq")


def verify_record(buf: ReadBuffer, pos: int) -> tuple[int, bool, str, int, int, int, int, str]:
    """:func:`check_record` and :func:`dispatch_fields` in one pass, for scanning whole logs (replica
    verification): one call per record instead of two that parse the same header.

    Returns ``(total_size, body_crc_ok, topic, queue_id, queue_offset, sys_flag, store_timestamp,
    properties)``.  A body CRC mismatch is returned as ``False`` (the framing is still sound, so a
    scan can go on); anything else that is not a complete, self-consistent record in ``buf`` -
    end-of-file markers and records cut off by the end of ``buf`` included - raises
    :class:`CorruptRecordError` as :func:`check_record` would.
    """
    n = len(buf)
    if pos < 0 or n - pos < MIN_RECORD_SIZE:
        raise CorruptRecordError(f"no room for a record at {pos}", pos)
    total, magic, crc, qid, _flag, qoff = _HEAD28.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC_CODE:
        raise CorruptRecordError(f"bad magic code {magic & 0xFFFFFFFF:#010x} at {pos}", pos)
    if total < MIN_RECORD_SIZE or total > n - pos:
        raise CorruptRecordError(f"record at {pos} has impossible TOTALSIZE {total}", pos)
    sys_flag = _I32.unpack_from(buf, pos + SYSFLAG_POS)[0]
    hsize = _HEADERS[(sys_flag >> 4) & 3].size
    end = pos + total
    body_len = _I32.unpack_from(buf, pos + hsize - 4)[0] if total >= hsize + _TAIL_FIXED else -1
    start = pos + hsize
    p = start + body_len
    if body_len < 0 or p + _TAIL_FIXED > end:
        raise CorruptRecordError(f"record at {pos} has impossible BODYLENGTH {body_len}", pos)
    t = p + 1
    p = t + buf[p]
    if p + 2 > end:
        raise CorruptRecordError(f"record at {pos}: topic runs past the record end", pos)
    if p + 2 + _U16.unpack_from(buf, p)[0] != end:
        raise CorruptRecordError(f"record at {pos}: TOTALSIZE {total} disagrees with its fields", pos)
    with memoryview(buf) as view:
        crc_ok = body_crc(view[start:start + body_len]) == crc
    store_ts = _I64.unpack_from(buf, pos + (68 if sys_flag & BORNHOST_V6 else 56))[0]
    topic = bytes(buf[t:p]).decode("utf-8", "replace")
    props = bytes(buf[p + 2:end]).decode("utf-8", "replace")
    return int(total), crc_ok, topic, int(qid), int(qoff), int(sys_flag), int(store_ts), props


def record_header_fields(buf: ReadBuffer, pos: int) -> tuple[int, int, int, int, int]:
    """``(total_size, magic, queue_id, queue_offset, store_timestamp)`` of the record at ``pos``."""
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    qid, _flag, qoff = _QID_FLAG_QOFF.unpack_from(buf, pos + 12)
    sys_flag = _I32.unpack_from(buf, pos + SYSFLAG_POS)[0]
    store_ts = _I64.unpack_from(buf, pos + (68 if sys_flag & BORNHOST_V6 else 56))[0]
    return int(total), int(magic), int(qid), int(qoff), int(store_ts)


def record_topic(buf: ReadBuffer, pos: int) -> str:
    """TOPIC of the record at ``pos`` (lengths are trusted: check the record first)."""
    sys_flag = _I32.unpack_from(buf, pos + SYSFLAG_POS)[0]
    hsize = _HEADERS[(sys_flag >> 4) & 3].size
    p = pos + hsize + _I32.unpack_from(buf, pos + hsize - 4)[0]
    return bytes(buf[p + 1:p + 1 + buf[p]]).decode("utf-8", "replace")


# -- batch body -----------------------------------------------------------------------------------
@dataclass(slots=True)
class BatchEntry:
    """One message of a batch body (§3.7)."""

    flag: int
    body: bytes
    properties: str


def encode_batch_body(entries: list[BatchEntry]) -> bytes:
    """Inverse of :func:`decode_batch_body` (what Java/C++ producers send)."""
    out = bytearray()
    for e in entries:
        props = e.properties.encode("utf-8")
        out += _BATCH_HDR.pack(20 + len(e.body) + 2 + len(props), 0, 0, e.flag, len(e.body))
        out += e.body
        out += _BATCH_PROPLEN.pack(len(props))
        out += props
    return bytes(out)


def decode_batch_body(body: bytes | bytearray | memoryview) -> list[BatchEntry]:
    """Split a batch body into its messages.

    Like the Java broker, entries are walked by their BODYLEN/PROPLEN fields; TOTALSIZE,
    MAGICCODE and BODYCRC are not trusted.  Truncated or negative lengths and non-UTF-8
    properties raise :class:`CorruptRecordError`.
    """
    out: list[BatchEntry] = []
    pos = 0
    n = len(body)
    if n == 0:
        raise CorruptRecordError("empty batch body", 0)
    while pos < n:
        if n - pos < _BATCH_HDR.size:
            raise CorruptRecordError(f"batch entry at {pos}: {n - pos} bytes cannot hold its header", pos)
        _total, _magic, _crc, flag, body_len = _BATCH_HDR.unpack_from(body, pos)
        p = pos + _BATCH_HDR.size
        if body_len < 0 or p + body_len + _BATCH_PROPLEN.size > n:
            raise CorruptRecordError(f"batch entry at {pos}: BODYLEN {body_len} runs past the body", pos)
        msg_body = bytes(body[p:p + body_len])
        p += body_len
        props_len = _BATCH_PROPLEN.unpack_from(body, p)[0]
        p += _BATCH_PROPLEN.size
        if props_len < 0 or p + props_len > n:
            raise CorruptRecordError(f"batch entry at {pos}: PROPLEN {props_len} runs past the body", pos)
        try:
            props = bytes(body[p:p + props_len]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"batch entry at {pos}: properties are not UTF-8", pos) from exc
        out.append(BatchEntry(flag, msg_body, props))
        pos = p + props_len
    return out
