"""RemotingCommand and the frame codec (reference §1.1-§1.3).

A frame is ``[int length][int serializeType<<24 | headerLen][header][body]``; the header is JSON
(type 0) or RocketMQ's binary layout (type 1). Replies always use the request's serialize type,
which is what keeps the C++ client (JSON only, never masks the type byte) happy.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from json.encoder import encode_basestring as _enc  # C-accelerated; keeps non-ASCII as is
from typing import Any, cast

from rmqbroker.remoting.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    LANGUAGE_CODE,
    LANGUAGES,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    SERVER_VERSION,
)

_json_loads: Callable[[bytes], Any]
try:
    # orjson parses a request header about 2.5x faster than the standard library; optional.
    from orjson import loads as _json_loads
except ImportError:  # pragma: no cover - exercised only without orjson
    _json_loads = json.loads

# Java's LengthFieldBasedFrameDecoder limit: applies to the length field value + 4.
MAX_FRAME_BYTES = 16 * 1024 * 1024

# Frame prefix:
#   0  int  length        bytes that follow this field (4 + headerLen + bodyLen)
#   4  int  headerLenWord serialize type in the high byte, header length in the low 3 bytes
FRAME_PREFIX = struct.Struct(">ii")

# ROCKETMQ binary header, fixed part:
#   0  short code
#   2  byte  language code
#   3  short version
#   5  int   opaque
#   9  int   flag
#  13  int   remarkLen (followed by remark bytes, then int extLen and the ext map)
BINARY_HEADER_FIXED = struct.Struct(">hbhii")
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")


class FrameError(Exception):
    """A frame that cannot be decoded; the connection that sent it must be closed."""


class RemotingCommand:
    """One request or response on the wire."""

    __slots__ = ("body", "code", "ext_fields", "ext_json", "flag", "language", "opaque", "remark",
                 "serialize_type", "version")

    def __init__(
        self,
        code: int,
        *,
        opaque: int = 0,
        flag: int = 0,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: bytes | bytearray | memoryview = b"",
        language: str = "JAVA",
        version: int = SERVER_VERSION,
        serialize_type: int = SERIALIZE_JSON,
    ) -> None:
        self.code = code
        self.opaque = opaque
        self.flag = flag
        self.remark = remark
        self.ext_fields: dict[str, str] = ext_fields if ext_fields is not None else {}
        self.body = body
        self.language = language
        self.version = version
        self.serialize_type = serialize_type
        # Optional pre-encoded JSON members of ``ext_fields`` (without the braces), set only by a
        # producer that knows its values need no escaping (the send response, once per message);
        # it must describe exactly ``ext_fields``, and is ignored by the binary encoding.
        self.ext_json: str | None = None

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def make_response(
        self,
        code: int,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: bytes | bytearray | memoryview = b"",
    ) -> RemotingCommand:
        """A response to this request: same opaque and serialize type, RESPONSE flag set."""
        return RemotingCommand(code, opaque=self.opaque, flag=FLAG_RESPONSE, remark=remark, ext_fields=ext_fields,
                               body=body, serialize_type=self.serialize_type)

    def __repr__(self) -> str:
        kind = "resp" if self.is_response else "req"
        return (f"RemotingCommand({kind} code={self.code} opaque={self.opaque} flag={self.flag} "
                f"remark={self.remark!r} ext={self.ext_fields!r} body={len(self.body)}B)")


def _ext_value(value: Any) -> str:
    # The C++ client sends some header fields as JSON numbers and booleans; Java coerces them
    # into strings, and so must we, so processors only ever see strings.
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise FrameError(f"extFields value of type {type(value).__name__} is not a scalar")


def _decode_json_header(raw: bytes | memoryview) -> RemotingCommand:
    try:
        parsed = _json_loads(bytes(raw))
    except (ValueError, UnicodeDecodeError) as exc:
        raise FrameError(f"header is not valid JSON: {exc}") from exc
    if type(parsed) is not dict:
        raise FrameError("header JSON is not an object")
    # Typed as a dict from here on: compiled, every lookup below is a direct dict access.
    obj: dict[str, Any] = parsed
    code = obj.get("code")
    opaque = obj.get("opaque", 0)
    flag = obj.get("flag", 0)
    version = obj.get("version", 0)
    # ``type(x) is int`` rejects bools too, which isinstance would let through.
    if type(code) is not int or type(opaque) is not int or type(flag) is not int or type(version) is not int:
        for name, value in (("code", code), ("opaque", opaque), ("flag", flag), ("version", version)):
            if type(value) is not int:
                raise FrameError(f"header field {name!r} must be an integer, got {value!r}")
    remark = obj.get("remark")
    if remark is not None and type(remark) is not str:
        raise FrameError("header field 'remark' must be a string")
    language = obj.get("language", "JAVA")
    if type(language) is not str:
        raise FrameError("header field 'language' must be a string")
    ext_raw = obj.get("extFields")
    ext: dict[str, str]
    if ext_raw is None:
        ext = {}
    elif type(ext_raw) is not dict:
        raise FrameError("header field 'extFields' must be an object")
    else:
        fields: dict[str, Any] = ext_raw
        ext = ext_raw
        for value in fields.values():
            if type(value) is not str:
                # Rare (C++ numbers and booleans): coerce a copy, so processors only see strings.
                ext = {k: _ext_value(v) for k, v in fields.items() if v is not None}
                break
    return RemotingCommand(cast(int, code), opaque=cast(int, opaque), flag=cast(int, flag), remark=remark,
                           ext_fields=ext, language=language, version=cast(int, version))


def _decode_binary_header(raw: bytes | memoryview) -> RemotingCommand:
    raw = memoryview(raw)
    size = len(raw)
    try:
        code, lang, version, opaque, flag = BINARY_HEADER_FIXED.unpack_from(raw, 0)
        pos = BINARY_HEADER_FIXED.size
        (remark_len,) = _INT.unpack_from(raw, pos)
        pos += 4
        if remark_len < 0 or remark_len > size - pos:
            raise FrameError(f"binary header remark length {remark_len} out of range")
        remark = bytes(raw[pos:pos + remark_len]).decode("utf-8") if remark_len else None
        pos += remark_len
        (ext_len,) = _INT.unpack_from(raw, pos)
        pos += 4
        if ext_len < 0 or ext_len > size - pos:
            raise FrameError(f"binary header ext length {ext_len} out of range")
        end = pos + ext_len
        ext: dict[str, str] = {}
        while pos < end:
            (klen,) = _SHORT.unpack_from(raw, pos)
            pos += 2
            if klen < 0 or pos + klen > end:
                raise FrameError("binary header ext key overruns the map")
            key = bytes(raw[pos:pos + klen]).decode("utf-8")
            pos += klen
            (vlen,) = _INT.unpack_from(raw, pos)
            pos += 4
            if vlen < 0 or pos + vlen > end:
                raise FrameError("binary header ext value overruns the map")
            ext[key] = bytes(raw[pos:pos + vlen]).decode("utf-8")
            pos += vlen
    except struct.error as exc:
        raise FrameError(f"binary header truncated: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise FrameError(f"binary header string is not UTF-8: {exc}") from exc
    language = LANGUAGES[lang] if 0 <= lang < len(LANGUAGES) else "OTHER"
    return RemotingCommand(code, opaque=opaque, flag=flag, remark=remark, ext_fields=ext,
                           language=language, version=version, serialize_type=SERIALIZE_ROCKETMQ)


def decode_frame_payload(payload: bytes | bytearray | memoryview) -> RemotingCommand:
    """Decode everything after the 4-byte length field (the header-length word onwards)."""
    data = payload if type(payload) is bytes else bytes(payload)
    return decode_frame(data, 0, len(data))


def decode_frame(data: bytes, start: int, end: int) -> RemotingCommand:
    """Decode the frame payload ``data[start:end]`` (from the header-length word on).

    Works on immutable ``bytes`` by offsets, so header and body are each one slice (one copy) and
    no memoryview has to be created and released per frame; the body is a ``bytes`` the store can
    keep as it is.
    """
    if end - start < 4:
        raise FrameError("frame shorter than its header-length word")
    (word,) = _INT.unpack_from(data, start)
    stype = (word >> 24) & 0xFF
    header_len = word & 0xFFFFFF
    hstart = start + 4
    hend = hstart + header_len
    if hend > end:
        raise FrameError(f"header length {header_len} exceeds frame length {end - hstart}")
    if stype == SERIALIZE_JSON:
        cmd = _decode_json_header(data[hstart:hend])
    elif stype == SERIALIZE_ROCKETMQ:
        cmd = _decode_binary_header(data[hstart:hend])
    else:
        raise FrameError(f"unknown serialize type {stype}")
    if end > hend:
        cmd.body = data[hend:end]
    return cmd


def _json_header(cmd: RemotingCommand) -> bytes:
    # Built by hand rather than with json.dumps of a dict: this runs once per response. Keys are
    # emitted in fastjson's (alphabetical) order; strings go through the C JSON string encoder.
    ext = cmd.ext_json
    if ext is None and cmd.ext_fields:
        # Values must be JSON strings: the C++ client ignores numeric response fields.
        ext = ",".join([f"{_enc(k)}:{_enc(str(v))}" for k, v in cmd.ext_fields.items()])
    ext_part = f',"extFields":{{{ext}}}' if ext else ""
    language = cmd.language
    lang_json = '"JAVA"' if language == "JAVA" else _enc(language)
    remark = cmd.remark
    remark_part = "" if remark is None else f',"remark":{_enc(remark)}'
    return (f'{{"code":{int(cmd.code)}{ext_part},"flag":{int(cmd.flag)},"language":{lang_json},'
            f'"opaque":{int(cmd.opaque)}{remark_part},"serializeTypeCurrentRPC":"JSON",'
            f'"version":{int(cmd.version)}}}').encode()


def _binary_header(cmd: RemotingCommand) -> bytes:
    remark = cmd.remark.encode("utf-8") if cmd.remark else b""
    parts = [
        BINARY_HEADER_FIXED.pack(cmd.code, LANGUAGE_CODE.get(cmd.language, 0), cmd.version,
                                 cmd.opaque, cmd.flag),
        _INT.pack(len(remark)),
        remark,
    ]
    ext = bytearray()
    for key, value in cmd.ext_fields.items():
        kb = key.encode("utf-8")
        vb = str(value).encode("utf-8")
        ext += _SHORT.pack(len(kb)) + kb + _INT.pack(len(vb)) + vb
    parts.append(_INT.pack(len(ext)))
    parts.append(bytes(ext))
    return b"".join(parts)


def encode_header(cmd: RemotingCommand) -> bytes:
    """The frame prefix and header; the body is written after it without copying."""
    header = _binary_header(cmd) if cmd.serialize_type == SERIALIZE_ROCKETMQ else _json_header(cmd)
    return FRAME_PREFIX.pack(4 + len(header) + len(cmd.body),
                             (cmd.serialize_type << 24) | len(header)) + header


def encode_json_response(code: int, opaque: int, ext_json: str) -> bytes:
    """The whole frame of a JSON response without remark or body whose extFields are the
    pre-encoded members ``ext_json``: the same bytes as ``encode_header`` of
    ``request.make_response(code, None, ext)`` with ``ext_json`` set, built without the command
    object (the send path answers every message with one)."""
    header = (f'{{"code":{code},"extFields":{{{ext_json}}},"flag":{FLAG_RESPONSE},"language":"JAVA",'
              f'"opaque":{opaque},"serializeTypeCurrentRPC":"JSON","version":{SERVER_VERSION}}}').encode()
    n = len(header)
    return FRAME_PREFIX.pack(4 + n, n) + header


def encode_frame(cmd: RemotingCommand) -> bytes:
    """The whole frame as one bytes object (convenient for small frames and tests)."""
    head = encode_header(cmd)
    return head + bytes(cmd.body) if cmd.body else head
