"""Java .properties text (broker.conf, RocketMQ's tls.properties): a leaf module, so that every
layer that reads such a file parses it the same way."""

from __future__ import annotations

import re

_PROPERTY_LINE = re.compile(r"([^=:\s]+)\s*[=:\s]\s*(.*)$")


def property_line(raw: str) -> tuple[str, str] | None:
    """One line of a .properties text as (key, value); None for a blank or comment line."""
    line = raw.strip()
    if not line or line[0] in "#!":
        return None
    m = _PROPERTY_LINE.match(line)
    if m is None:
        return line, ""
    return m.group(1), m.group(2).strip()


def parse_properties(text: str) -> dict[str, str]:
    """Java .properties subset: key=value or key:value, # and ! comments, surrounding spaces."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        entry = property_line(raw)
        if entry is not None:
            out[entry[0]] = entry[1]
    return out
