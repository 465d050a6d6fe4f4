"""DataVersion semantics (§5.5)."""

from __future__ import annotations

import time

import pytest

from rmqbroker.metadata.data_version import DataVersion
from rmqbroker.metadata.errors import MetadataFormatError


def test_initial_version_is_now_with_counter_zero() -> None:
    before = int(time.time() * 1000)
    dv = DataVersion()
    after = int(time.time() * 1000)
    assert dv.counter == 0
    assert before <= dv.timestamp <= after
    assert dv.state_version is None


def test_next_version_bumps_counter_and_refreshes_timestamp() -> None:
    dv = DataVersion(timestamp=1, counter=5)
    dv.next_version()
    assert dv.counter == 6
    assert dv.timestamp > 1


def test_equality_uses_timestamp_and_counter_only() -> None:
    assert DataVersion(10, 2) == DataVersion(10, 2)
    assert DataVersion(10, 2) != DataVersion(10, 3)
    assert DataVersion(10, 2) != DataVersion(11, 2)
    assert DataVersion(10, 2, state_version=1) == DataVersion(10, 2, state_version=9)
    assert DataVersion(10, 2) != "DataVersion"


def test_unhashable_because_mutable() -> None:
    with pytest.raises(TypeError):
        hash(DataVersion())


def test_assign_and_copy_are_independent() -> None:
    src = DataVersion(123, 7, state_version=3)
    dst = DataVersion()
    dst.assign(src)
    assert dst == src and dst.state_version == 3
    clone = dst.copy()
    clone.next_version()
    assert dst == src
    assert clone != dst


def test_json_round_trip_keeps_state_version_only_when_present() -> None:
    assert DataVersion(1700000000000, 5).to_json_obj() == {"counter": 5, "timestamp": 1700000000000}
    obj = {"counter": 5, "stateVersion": 2, "timestamp": 1700000000000}
    dv = DataVersion.from_json_obj(obj)
    assert (dv.timestamp, dv.counter, dv.state_version) == (1700000000000, 5, 2)
    assert dv.to_json_obj() == obj


def test_from_json_obj_rejects_garbage() -> None:
    with pytest.raises(MetadataFormatError):
        DataVersion.from_json_obj([1, 2])
    with pytest.raises(MetadataFormatError):
        DataVersion.from_json_obj({"counter": "x", "timestamp": 1})
