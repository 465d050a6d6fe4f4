"""Lenient field readers for JSON written by fastjson, which may quote numbers or booleans."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rmqbroker.metadata.errors import MetadataFormatError


def as_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise MetadataFormatError(f"{what}: expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError as exc:
            raise MetadataFormatError(f"{what}: expected an integer, got {value!r}") from exc
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise MetadataFormatError(f"{what}: expected an integer, got {value!r}")


def as_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise MetadataFormatError(f"{what}: expected a boolean, got {value!r}")


def as_str(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    raise MetadataFormatError(f"{what}: expected a string, got {value!r}")


def as_object(value: Any, what: str) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    raise MetadataFormatError(f"{what}: expected a JSON object, got {type(value).__name__}")


def int_keyed(value: Any, what: str | Callable[[], str]) -> dict[int, int]:
    """Read a ``{queueId|level: offset}`` map whose keys may be quoted or (pre-parse) bare integers.
    ``what`` names it in errors; a callable is asked only when there is one."""
    if isinstance(value, dict):
        # The common case (integer values under integer keys) without a per-entry check: a slave
        # decodes every consumer offset of its master each round, hundreds of thousands of them.
        try:
            fast = {int(k): v for k, v in value.items()}
        except (TypeError, ValueError):
            pass
        else:
            if all(type(v) is int for v in fast.values()):
                return fast
    name = what() if callable(what) else what
    table = as_object(value, name)
    return {as_int(k, f"{name} key"): as_int(v, f"{name}[{k}]") for k, v in table.items()}
