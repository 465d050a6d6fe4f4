"""broker.conf keys that a group launcher renders itself and a manifest's ``brokerConfig`` may not set.

Shared by ``rmq-local`` and the operator (which imports it from here, because lower layers never
import upper ones): both assign roles, addresses, ports, the admin channel and data directories
per broker, and a ``brokerConfig`` value for any of these would be applied to every broker of the
group alike, giving e.g. two masters, one listen port or one store directory for all of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

MANAGED_KEYS: frozenset[str] = frozenset({
    "brokerClusterName", "brokerName", "brokerId", "brokerRole", "namesrvAddr", "haMasterAddress", "haGroupEpoch",
    "brokerIP1", "brokerIP2", "listenHost", "listenPort", "haListenPort", "fastListenPort", "adminListenPort",
    "adminToken", "adminTokenFile", "storePathRootDir", "storePathCommitLog",
})


def managed_keys_in(keys: Iterable[str]) -> list[str]:
    """The managed keys among ``keys``, sorted (so error messages are stable)."""
    return sorted(k for k in keys if k in MANAGED_KEYS)


# A broker.conf key as RocketMQ names them (camelCase, dotted for a few): nothing the properties
# parser would split, so that "brokerId " (a trailing space) cannot stand for "brokerId".
_KEY = re.compile(r"[A-Za-z0-9._-]+")


def unsafe_entries(config: Mapping[str, str]) -> list[str]:
    """What in ``config`` would not render as its own one line of broker.conf: a key outside
    RocketMQ's key characters, or a value with a line break (``"T\\nbrokerId=0"`` would set a
    managed key on every broker past the check of key names). One problem each, sorted."""
    out = []
    for key, value in sorted(config.items()):
        if not _KEY.fullmatch(key):
            out.append(f"key {key!r} is not a broker.conf key (letters, digits, '.', '_', '-')")
        elif "".join(value.splitlines()) != value:
            out.append(f"{key}: the value may not contain a line break")
    return out


# Keys rendered from spec.acl and spec.tls when those are set: brokerConfig may not contradict them.
ACL_KEYS: frozenset[str] = frozenset({"aclEnable", "aclFile"})
TLS_KEYS: frozenset[str] = frozenset({"tlsEnable", "tlsServerMode", "tlsConfigFile"})


def spec_rendered_keys_in(keys: Iterable[str], acl: bool, tls: bool) -> list[str]:
    """The keys among ``keys`` that spec.acl (when ``acl``) or spec.tls (when ``tls``) renders, sorted."""
    owned = (ACL_KEYS if acl else frozenset()) | (TLS_KEYS if tls else frozenset())
    return sorted(k for k in keys if k in owned)
