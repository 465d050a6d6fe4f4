"""Header numbers are bounded like Java's Integer/Long: a wider value is a HeaderError naming the
field (answered and counted as a bad header), never a number that fails later when a record is
packed."""

from __future__ import annotations

import pytest

from rmqbroker.remoting.codes import ResponseCode
from rmqbroker.remoting.wire import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, BadRequestError, Header, HeaderError


@pytest.mark.parametrize("value", [INT32_MIN, -1, 0, INT32_MAX])
def test_int32_fields_take_the_whole_java_int(value: int) -> None:
    h = Header({"flag": str(value)})
    assert h.req_int32("flag") == value
    assert h.opt_int32("flag", 7) == value


@pytest.mark.parametrize("value", [INT32_MIN - 1, INT32_MAX + 1, 2**63])
def test_int32_fields_refuse_wider_numbers(value: int) -> None:
    h = Header({"flag": str(value)})
    with pytest.raises(HeaderError, match=r"<flag> is out of range"):
        h.req_int32("flag")
    with pytest.raises(HeaderError, match=r"<flag> is out of range"):
        h.opt_int32("flag", 0)


def test_int_fields_are_java_longs_by_default() -> None:
    assert Header({"offset": str(INT64_MAX)}).req_int("offset") == INT64_MAX
    assert Header({"offset": str(INT64_MIN)}).opt_int("offset", 0) == INT64_MIN
    for value in (INT64_MAX + 1, INT64_MIN - 1):
        with pytest.raises(HeaderError, match=r"<offset> is out of range"):
            Header({"offset": str(value)}).req_int("offset")


def test_absent_optional_numbers_take_their_default() -> None:
    assert Header({}).opt_int32("reconsumeTimes", 0) == 0
    assert Header({"reconsumeTimes": ""}).opt_int32("reconsumeTimes", -1) == -1


def test_header_error_is_a_bad_request_answered_with_system_error() -> None:
    with pytest.raises(BadRequestError) as info:
        Header({}).req_int32("queueId")
    assert isinstance(info.value, HeaderError)
    assert info.value.code == ResponseCode.SYSTEM_ERROR
    assert "<queueId> is null" in info.value.remark
