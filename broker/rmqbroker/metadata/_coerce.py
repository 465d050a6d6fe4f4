"""Lenient field readers for JSON written by fastjson, which may quote numbers or booleans."""

from __future__ import annotations

from collections.abc import Mapping
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


def plain_int_keyed(value: Any) -> dict[int, int] | None:
    """A ``{queueId|level: offset}`` JSON object of integers under integer keys, converted without a
    per-entry check (a slave decodes every consumer offset of its master each round, hundreds of
    thousands of them); None for anything else, which checked_int_keyed reads or refuses."""
    if not isinstance(value, dict):
        return None
    try:
        plain = {int(k): v for k, v in value.items()}
    except (TypeError, ValueError):
        return None
    return plain if all(type(v) is int for v in plain.values()) else None


def int_keyed(value: Any, what: str) -> dict[int, int]:
    """Read a ``{queueId|level: offset}`` map whose keys may be quoted or (pre-parse) bare integers."""
    plain = plain_int_keyed(value)
    return plain if plain is not None else checked_int_keyed(value, what)


def checked_int_keyed(value: Any, what: str) -> dict[int, int]:
    """int_keyed entry by entry, naming ``what`` and the entry in an error."""
    table = as_object(value, what)
    return {as_int(k, f"{what} key"): as_int(v, f"{what}[{k}]") for k, v in table.items()}
