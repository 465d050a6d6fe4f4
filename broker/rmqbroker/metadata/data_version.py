"""DataVersion: the (timestamp, counter) stamp that tells peers a metadata table changed (§5.5)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rmqbroker.metadata.errors import MetadataFormatError


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class DataVersion:
    """Mutable version stamp; equal iff timestamp and counter are equal.

    ``state_version`` (5.x) is carried through untouched when a peer or file supplies it, but is
    not part of equality, matching how 4.9.x brokers and nameservers compare versions.
    """

    __slots__ = ("counter", "state_version", "timestamp")

    def __init__(self, timestamp: int | None = None, counter: int = 0, state_version: int | None = None) -> None:
        self.timestamp: int = _now_ms() if timestamp is None else timestamp
        self.counter: int = counter
        self.state_version: int | None = state_version

    def next_version(self) -> None:
        """Stamp a change: timestamp becomes now and the counter advances by one."""
        self.timestamp = _now_ms()
        self.counter += 1

    def assign(self, other: DataVersion) -> None:
        """Adopt another version (a slave adopting its master's)."""
        self.timestamp = other.timestamp
        self.counter = other.counter
        self.state_version = other.state_version

    def copy(self) -> DataVersion:
        return DataVersion(self.timestamp, self.counter, self.state_version)

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"counter": self.counter}
        if self.state_version is not None:
            obj["stateVersion"] = self.state_version
        obj["timestamp"] = self.timestamp
        return obj

    @classmethod
    def from_json_obj(cls, obj: Any) -> DataVersion:
        if not isinstance(obj, Mapping):
            raise MetadataFormatError(f"dataVersion must be a JSON object, got {type(obj).__name__}")
        try:
            timestamp = int(obj.get("timestamp", 0))
            counter = int(obj.get("counter", 0))
            raw_state = obj.get("stateVersion")
            state_version = None if raw_state is None else int(raw_state)
        except (TypeError, ValueError) as exc:
            raise MetadataFormatError(f"bad dataVersion {obj!r}") from exc
        return cls(timestamp, counter, state_version)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DataVersion):
            return NotImplemented
        return self.timestamp == other.timestamp and self.counter == other.counter

    # Mutable and compared by value: must not be used as a dict key or set member.
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        extra = "" if self.state_version is None else f", state_version={self.state_version}"
        return f"DataVersion(timestamp={self.timestamp}, counter={self.counter}{extra})"
