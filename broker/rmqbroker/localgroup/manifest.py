"""The parts of a BrokerGroup manifest a local group uses, and the broker.conf each broker gets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rmqbroker.ha.election import FailoverSpec
from rmqbroker.managed_keys import managed_keys_in


class ManifestError(ValueError):
    """The manifest is not a usable BrokerGroup."""


@dataclass(frozen=True)
class GroupSpec:
    """The parts of a BrokerGroup spec a local group uses."""

    name: str
    cluster_name: str
    broker_name: str
    replicas: int
    replication: str
    flush_disk_type: str
    master_discovery: str
    broker_config: dict[str, str]
    failover: FailoverSpec = field(default_factory=FailoverSpec)

    @property
    def master_role(self) -> str:
        return "SYNC_MASTER" if self.replication == "SYNC" else "ASYNC_MASTER"


def _failover(obj: Any) -> FailoverSpec:
    # The CRD's defaults: failover on, after 30 s, never losing an acknowledged SYNC message.
    if obj is None:
        return FailoverSpec()
    if not isinstance(obj, dict):
        raise ManifestError("spec.failover must be an object")
    enabled = obj.get("enabled", True)
    lost = obj.get("masterLostSeconds", 30)
    loss = obj.get("allowDataLoss", False)
    if not isinstance(enabled, bool):
        raise ManifestError("spec.failover.enabled must be true or false")
    if not isinstance(lost, int) or isinstance(lost, bool) or not 1 <= lost <= 3600:
        raise ManifestError("spec.failover.masterLostSeconds must be an integer from 1 to 3600")
    if not isinstance(loss, bool):
        raise ManifestError("spec.failover.allowDataLoss must be true or false")
    return FailoverSpec(enabled, lost, loss)


# rmq-local runs at most this many groups of one manifest (ports: GROUP_PORT_STRIDE apart).
MAX_GROUPS = 4


def _documents(path: Path) -> list[dict[str, Any]]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    except (OSError, yaml.YAMLError) as exc:
        raise ManifestError(f"cannot read {path}: {exc}") from exc
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == "BrokerGroup"]


def load_manifest(path: Path) -> GroupSpec:
    """The one BrokerGroup of ``path``."""
    groups = _documents(path)
    if len(groups) != 1:
        raise ManifestError(f"{path} must contain exactly one BrokerGroup, found {len(groups)}")
    return parse_group(groups[0])


def load_groups(path: Path) -> list[GroupSpec]:
    """Every BrokerGroup of ``path`` (one cluster: they share one nameserver locally)."""
    docs = _documents(path)
    if not 1 <= len(docs) <= MAX_GROUPS:
        raise ManifestError(f"{path} must contain 1 to {MAX_GROUPS} BrokerGroups, found {len(docs)}")
    specs = []
    for i, doc in enumerate(docs):
        try:
            specs.append(parse_group(doc))
        except ManifestError as exc:
            if len(docs) == 1:
                raise
            name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
            raise ManifestError(f"BrokerGroup {name or f'#{i + 1}'}: {exc}") from exc
    for attr, what in (("name", "metadata.name"), ("broker_name", "brokerName")):
        values = [getattr(s, attr) for s in specs]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ManifestError(f"two BrokerGroups have the same {what}: {', '.join(twice)}")
    return specs


def parse_group(doc: dict[str, Any]) -> GroupSpec:
    meta = doc.get("metadata") or {}
    spec = doc.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict) or not meta.get("name"):
        raise ManifestError("BrokerGroup needs metadata.name and a spec object")
    replicas = spec.get("replicas", 2)
    if not isinstance(replicas, int) or not 1 <= replicas <= 5:
        raise ManifestError("spec.replicas must be an integer from 1 to 5")
    replication = spec.get("replication", "ASYNC")
    if replication not in ("SYNC", "ASYNC"):
        raise ManifestError("spec.replication must be SYNC or ASYNC")
    flush = spec.get("flushDiskType", "ASYNC_FLUSH")
    if flush not in ("ASYNC_FLUSH", "SYNC_FLUSH"):
        raise ManifestError("spec.flushDiskType must be ASYNC_FLUSH or SYNC_FLUSH")
    discovery = spec.get("masterDiscovery", "Direct")
    if discovery not in ("Direct", "NameServer"):
        raise ManifestError("spec.masterDiscovery must be Direct or NameServer")
    extra = spec.get("brokerConfig") or {}
    if not isinstance(extra, dict) or not all(isinstance(v, str) for v in extra.values()):
        raise ManifestError("spec.brokerConfig must map keys to strings")
    # Refused rather than overridden: rmq-local assigns these per broker, and one brokerConfig
    # value applied to every broker would clash (two masters, one port, one store directory).
    managed = managed_keys_in(str(k) for k in extra)
    if managed:
        raise ManifestError(f"spec.brokerConfig may not set keys rmq-local manages: {', '.join(managed)}")
    return GroupSpec(
        name=str(meta["name"]),
        cluster_name=str(spec.get("clusterName", "DefaultCluster")),
        broker_name=str(spec.get("brokerName") or meta["name"]),
        replicas=replicas,
        replication=replication,
        flush_disk_type=flush,
        master_discovery=discovery,
        broker_config={str(k): v for k, v in extra.items()},
        failover=_failover(spec.get("failover")),
    )


def render_conf(spec: GroupSpec, ordinal: int, broker_id: int, data_dir: Path, ports: Mapping[str, int],
                namesrv: str, master_ha: str, token_file: Path) -> str:
    """broker.conf of the broker at ``ordinal`` (its ports and store) holding ``broker_id`` (0: master)."""
    role = spec.master_role if broker_id == 0 else "SLAVE"
    # Defaults brokerConfig may change; the managed keys below are applied after it.
    conf: dict[str, str] = {
        "flushDiskType": spec.flush_disk_type,
        "mappedFileSizeCommitLog": str(64 * 1024 * 1024),
    }
    conf.update(spec.broker_config)
    conf |= {
        "brokerClusterName": spec.cluster_name,
        "brokerName": spec.broker_name,
        "brokerId": str(broker_id),
        "brokerRole": role,
        "namesrvAddr": namesrv,
        "brokerIP1": "127.0.0.1",
        "listenHost": "127.0.0.1",
        "listenPort": str(ports["listen"]),
        "haListenPort": str(ports["ha"]),
        "fastListenPort": str(ports["listen"] - 2),
        "adminListenPort": str(ports["admin"]),
        "adminTokenFile": str(token_file),
        "storePathRootDir": str(data_dir / f"broker-{ordinal}" / "store"),
    }
    if broker_id != 0 and spec.master_discovery == "Direct":
        conf["haMasterAddress"] = master_ha
    return "".join(f"{k}={v}\n" for k, v in conf.items())
