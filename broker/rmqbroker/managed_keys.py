"""broker.conf keys that a group launcher renders itself and a manifest's ``brokerConfig`` may not set.

Shared by ``rmq-local`` and the operator (which imports it from here, because lower layers never
import upper ones): both assign roles, addresses, ports, the admin channel and data directories
per broker, and a ``brokerConfig`` value for any of these would be applied to every broker of the
group alike, giving e.g. two masters, one listen port or one store directory for all of them.
"""

from __future__ import annotations

from collections.abc import Iterable

MANAGED_KEYS: frozenset[str] = frozenset({
    "brokerClusterName", "brokerName", "brokerId", "brokerRole", "namesrvAddr", "haMasterAddress",
    "brokerIP1", "brokerIP2", "listenHost", "listenPort", "haListenPort", "fastListenPort", "adminListenPort",
    "adminToken", "adminTokenFile", "storePathRootDir", "storePathCommitLog",
})


def managed_keys_in(keys: Iterable[str]) -> list[str]:
    """The managed keys among ``keys``, sorted (so error messages are stable)."""
    return sorted(k for k in keys if k in MANAGED_KEYS)
