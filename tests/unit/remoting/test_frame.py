"""Golden-byte and round-trip tests of the frame codec (reference §1.1-§1.3, captures)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqbroker.remoting.codes import SERIALIZE_JSON, SERIALIZE_ROCKETMQ
from rmqbroker.remoting.frame import (
    FrameError,
    RemotingCommand,
    decode_frame_payload,
    encode_frame,
    encode_json_response,
)
from rmqbroker.remoting.wire import Header, HeaderError, normalize_send_v2

CAPTURES = Path(__file__).resolve().parents[3].parent / "shared" / "reference" / "captures"


def test_heartbeat_response_worked_example() -> None:
    # §1.1: a 95-byte JSON header and no body -> 00 00 00 63 | 00 00 00 5F | header.
    cmd = RemotingCommand(0, opaque=2, flag=1)
    frame = encode_frame(cmd)
    expected_header = (b'{"code":0,"flag":1,"language":"JAVA","opaque":2,'
                       b'"serializeTypeCurrentRPC":"JSON","version":409}')
    assert len(expected_header) == 95
    assert frame == bytes.fromhex("00000063") + bytes.fromhex("0000005F") + expected_header


def _cpp_request_bytes() -> tuple[bytes, int]:
    """Rebuild the C++ client's raw GET_ROUTEINFO request from log_tail.txt (jsoncpp FastWriter)."""
    header = {"code": 105, "extFields": {"AccessKey": "", "OnsChannel": "ALIYUN",
                                         "Signature": "N/YT7X6tJe5UfutmW+uNwTTJ7Fc=", "topic": "TopicTest"},
              "flag": 0, "language": "CPP", "opaque": 0, "remark": "", "version": 63}
    raw = (json.dumps(header, separators=(",", ":"), sort_keys=True) + "\n").encode()
    return raw, 0xBD


def test_cpp_header_with_trailing_newline_matches_capture() -> None:
    raw, captured_len = _cpp_request_bytes()
    assert len(raw) == captured_len  # the newline counts in headerLen (log_tail.txt)
    if CAPTURES.exists():
        tail = (CAPTURES / "log_tail.txt").read_text()
        assert "hlraw=0x000000bd" in tail and "TAIL: b'\":63}\\n'" in tail
    payload = struct.pack(">i", len(raw)) + raw
    cmd = decode_frame_payload(payload)
    assert cmd.code == 105 and cmd.language == "CPP" and cmd.version == 63 and cmd.opaque == 0
    assert cmd.ext_fields["topic"] == "TopicTest"
    assert cmd.remark == "" and not cmd.is_response


def test_numeric_ext_fields_become_strings() -> None:
    header = {"code": 10, "extFields": {"queueId": 3, "sysFlag": 0, "batch": "0", "ok": True,
                                        "defaultTopicQueueNums": 4},
              "flag": 0, "language": "CPP", "opaque": 7, "remark": "", "version": 63}
    raw = json.dumps(header).encode()
    cmd = decode_frame_payload(struct.pack(">i", len(raw)) + raw + b"BODY")
    assert cmd.ext_fields == {"queueId": "3", "sysFlag": "0", "batch": "0", "ok": "true",
                              "defaultTopicQueueNums": "4"}
    assert cmd.body == b"BODY"


def test_response_ext_fields_are_json_strings() -> None:
    req = RemotingCommand(10, opaque=9, ext_fields={})
    resp = req.make_response(0, ext_fields={"queueId": "1", "queueOffset": str(5)})
    frame = encode_frame(resp)
    (_, word) = struct.unpack_from(">ii", frame)
    header = json.loads(frame[8:8 + (word & 0xFFFFFF)])
    assert word >> 24 == SERIALIZE_JSON
    assert header["extFields"] == {"queueId": "1", "queueOffset": "5"}
    assert header["opaque"] == 9 and header["flag"] == 1


def test_binary_header_golden() -> None:
    # §1.3 layout written out by hand: code 105, lang CPP(1), version 63, opaque 5, flag 0,
    # remark "r", ext {"topic": "T"}.
    ext = struct.pack(">h", 5) + b"topic" + struct.pack(">i", 1) + b"T"
    header = (struct.pack(">hbhii", 105, 1, 63, 5, 0) + struct.pack(">i", 1) + b"r"
              + struct.pack(">i", len(ext)) + ext)
    payload = struct.pack(">i", (1 << 24) | len(header)) + header + b"xy"
    cmd = decode_frame_payload(payload)
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag) == (105, "CPP", 63, 5, 0)
    assert cmd.remark == "r" and cmd.ext_fields == {"topic": "T"} and cmd.body == b"xy"
    assert cmd.serialize_type == SERIALIZE_ROCKETMQ
    # and our encoder produces the same header bytes for the same command
    again = encode_frame(cmd)
    assert again[8:8 + len(header)] == header


@pytest.mark.parametrize("payload", [
    b"\x00\x00",                                            # shorter than the header word
    struct.pack(">i", 50) + b"{}",                          # header length beyond the frame
    struct.pack(">i", 5) + b"{nope",                        # not JSON
    struct.pack(">i", 2) + b"[]",                           # JSON but not an object
    struct.pack(">i", 13) + b'{"code":"10"}',               # code of the wrong type
    struct.pack(">i", 25) + b'{"code":1,"extFields":[1]}',  # extFields of the wrong type
    struct.pack(">i", (7 << 24) | 2) + b"{}",               # unknown serialize type
    struct.pack(">i", (1 << 24) | 3) + b"\x00\x01\x02",     # truncated binary header
])
def test_malformed_payloads_raise_frame_error(payload: bytes) -> None:
    with pytest.raises(FrameError):
        decode_frame_payload(payload)


def test_header_accessors_and_v2_mapping() -> None:
    h = Header(normalize_send_v2({"a": "PG", "b": "T", "e": "3", "m": "true", "zz": "x"}))
    assert h.req_str("producerGroup") == "PG" and h.req_int("queueId") == 3
    assert h.opt_bool("batch") is True and h.opt_str("zz") == "x"
    with pytest.raises(HeaderError, match="topicX"):
        h.req_str("topicX")
    with pytest.raises(HeaderError, match="not a number"):
        Header({"queueId": "abc"}).req_int("queueId")


_text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=30)


@given(
    code=st.integers(-32768, 32767),
    opaque=st.integers(0, 2**31 - 1),
    flag=st.sampled_from([0, 1, 2, 3]),
    remark=st.none() | _text.filter(bool),
    ext=st.dictionaries(_text.filter(bool), _text, max_size=6),
    body=st.binary(max_size=200),
    stype=st.sampled_from([SERIALIZE_JSON, SERIALIZE_ROCKETMQ]),
)
def test_round_trip(code: int, opaque: int, flag: int, remark: str | None, ext: dict[str, str],
                    body: bytes, stype: int) -> None:
    cmd = RemotingCommand(code, opaque=opaque, flag=flag, remark=remark, ext_fields=ext, body=body,
                          language="CPP", version=63, serialize_type=stype)
    frame = encode_frame(cmd)
    (length,) = struct.unpack_from(">i", frame)
    assert length == len(frame) - 4
    back = decode_frame_payload(frame[4:])
    assert (back.code, back.opaque, back.flag, back.remark, back.ext_fields, back.body) == (
        code, opaque, flag, remark, ext, body)
    assert (back.language, back.version, back.serialize_type) == ("CPP", 63, stype)


def test_prebuilt_json_response_is_the_encoders_frame() -> None:
    """The send path's ready-made success frame must be byte-identical to what the general
    encoder writes for the same response (codes, opaques and members vary)."""
    request = RemotingCommand(310, opaque=0, ext_fields={"a": "g"})
    for code, opaque in ((0, 0), (0, 7), (10, 2**31 - 1), (12, -5)):
        request.opaque = opaque
        ext = {"msgId": "7F00000100002A9F0000000000001234", "queueId": "3", "queueOffset": "42",
               "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        members = ",".join(f'"{k}":"{v}"' for k, v in ext.items())
        resp = request.make_response(code, None, ext_fields=ext)
        assert encode_json_response(code, opaque, members) == encode_frame(resp)
        resp.ext_json = members
        assert encode_json_response(code, opaque, members) == encode_frame(resp)
        decoded = decode_frame_payload(encode_json_response(code, opaque, members)[4:])
        assert (decoded.code, decoded.opaque, decoded.ext_fields, decoded.is_response) == (code, opaque, ext, True)
