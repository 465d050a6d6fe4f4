"""The parts of a BrokerGroup manifest a local group uses, and the broker.conf each broker gets.

``spec.tls`` and ``spec.acl`` name Secrets; locally they are read from the same manifest file
(``kind: Secret`` documents, ``data`` in base64 and/or ``stringData``), since there is no API
server to hold them, and their files are written under the group's data folder.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rmqbroker.config import ACL_FILE_NAME
from rmqbroker.ha.election import FailoverSpec
from rmqbroker.managed_keys import managed_keys_in, spec_rendered_keys_in, unsafe_entries
from rmqbroker.metadata.jsonfile import atomic_write
from rmqbroker.remoting import tls as tls_conf

# Where a group's Secret files and rendered tls.properties go, under its data folder.
SECRETS_DIR = "secrets"


class ManifestError(ValueError):
    """The manifest is not a usable BrokerGroup."""


@dataclass(frozen=True)
class TlsSpec:
    """spec.tls with its Secret's files (tls.crt, tls.key, ca.crt)."""

    secret_name: str
    mode: str
    client_auth: str
    files: tuple[tuple[str, bytes], ...] = field(repr=False)  # key material: never in a log line

    @property
    def shape(self) -> tuple[str, str, str]:
        return (self.secret_name, self.mode, self.client_auth)


@dataclass(frozen=True)
class AclSpec:
    """spec.acl with its Secret: plain_acl.yml and the account slaves sign metadata sync with."""

    secret_name: str
    acl_file: bytes = field(repr=False)
    access_key: str = ""
    secret_key: str = field(default="", repr=False)


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
    tls: TlsSpec | None = None
    acl: AclSpec | None = None

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


Secrets = Mapping[tuple[str, str], dict[str, bytes]]


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    except (OSError, yaml.YAMLError) as exc:
        raise ManifestError(f"cannot read {path}: {exc}") from exc
    return [d for d in docs if isinstance(d, dict)]


def _namespace(doc: Mapping[str, Any]) -> str:
    meta = doc.get("metadata")
    return str((meta.get("namespace") if isinstance(meta, dict) else None) or "default")


def _secrets(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, bytes]]:
    """The manifest's Secrets by (namespace, name): ``data`` decoded, ``stringData`` over it (as
    the API server merges them)."""
    out: dict[tuple[str, str], dict[str, bytes]] = {}
    for doc in docs:
        if doc.get("kind") != "Secret":
            continue
        meta = doc.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        if not name:
            raise ManifestError("a Secret in the manifest has no metadata.name")
        values: dict[str, bytes] = {}
        data, string_data = doc.get("data") or {}, doc.get("stringData") or {}
        if not isinstance(data, dict) or not isinstance(string_data, dict):
            raise ManifestError(f"Secret {name}: data and stringData must be maps")
        for key, value in data.items():
            try:
                values[str(key)] = base64.b64decode(str(value), validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ManifestError(f"Secret {name}: data.{key} is not base64 ({exc})") from exc
        for key, value in string_data.items():
            values[str(key)] = str(value).encode()
        out[(_namespace(doc), str(name))] = values
    return out


def load_manifest(path: Path) -> GroupSpec:
    """The one BrokerGroup of ``path``."""
    docs = _read(path)
    groups = [d for d in docs if d.get("kind") == "BrokerGroup"]
    if len(groups) != 1:
        raise ManifestError(f"{path} must contain exactly one BrokerGroup, found {len(groups)}")
    return parse_group(groups[0], _secrets(docs))


def load_groups(path: Path) -> list[GroupSpec]:
    """Every BrokerGroup of ``path`` (one cluster: they share one nameserver locally)."""
    all_docs = _read(path)
    docs = [d for d in all_docs if d.get("kind") == "BrokerGroup"]
    if not 1 <= len(docs) <= MAX_GROUPS:
        raise ManifestError(f"{path} must contain 1 to {MAX_GROUPS} BrokerGroups, found {len(docs)}")
    secrets = _secrets(all_docs)
    specs = []
    for i, doc in enumerate(docs):
        try:
            specs.append(parse_group(doc, secrets))
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
    if len({s.tls.shape if s.tls else None for s in specs}) > 1:
        # Locally the groups share one nameserver, and it has one TLS setting.
        raise ManifestError("the BrokerGroups share rmq-local's nameserver: give them all the same spec.tls, or none")
    return specs


def _secret(secrets: Secrets, namespace: str, obj: Mapping[str, Any], field_name: str,
            keys: tuple[str, ...]) -> tuple[str, dict[str, bytes]]:
    name = obj.get("secretName")
    if not isinstance(name, str) or not name:
        raise ManifestError(f"spec.{field_name}.secretName must name a Secret")
    values = secrets.get((namespace, name))
    if values is None:
        raise ManifestError(f"spec.{field_name}.secretName: Secret {name} is not in the manifest (rmq-local reads "
                            "the Secrets a BrokerGroup names from the same file: kind Secret, data or stringData)")
    missing = [k for k in keys if not values.get(k)]
    if missing:
        raise ManifestError(f"spec.{field_name}: Secret {name} has no {', '.join(missing)}")
    return name, values


def _tls(obj: Any, secrets: Secrets, namespace: str) -> TlsSpec | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ManifestError("spec.tls must be an object")
    mode = obj.get("mode", "enforcing")
    client_auth = obj.get("clientAuth", "none")
    if mode not in ("permissive", "enforcing"):
        raise ManifestError("spec.tls.mode must be permissive or enforcing")
    if client_auth not in tls_conf.CLIENT_AUTH_MODES:
        raise ManifestError("spec.tls.clientAuth must be none, optional or require")
    name, values = _secret(secrets, namespace, obj, "tls", tls_conf.CERT_FILES)
    return TlsSpec(name, mode, client_auth, tuple((k, values[k]) for k in tls_conf.CERT_FILES))


def _acl(obj: Any, secrets: Secrets, namespace: str) -> AclSpec | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ManifestError("spec.acl must be an object")
    name, values = _secret(secrets, namespace, obj, "acl", (ACL_FILE_NAME,))
    try:
        access, secret = (values.get(k, b"").decode() for k in ("accessKey", "secretKey"))
    except UnicodeDecodeError as exc:
        raise ManifestError(f"spec.acl: Secret {name}: accessKey and secretKey must be text") from exc
    return AclSpec(name, values[ACL_FILE_NAME], access, secret)


def parse_group(doc: dict[str, Any], secrets: Secrets | None = None) -> GroupSpec:
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
    unsafe = unsafe_entries({str(k): v for k, v in extra.items()})
    if unsafe:
        raise ManifestError(f"spec.brokerConfig: {'; '.join(unsafe)}")
    derived = spec_rendered_keys_in((str(k) for k in extra), bool(spec.get("acl")), bool(spec.get("tls")))
    if derived:
        raise ManifestError(f"spec.brokerConfig may not set keys spec.acl/spec.tls render: {', '.join(derived)}")
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
        tls=_tls(spec.get("tls"), secrets or {}, _namespace(doc)),
        acl=_acl(spec.get("acl"), secrets or {}, _namespace(doc)),
    )


def render_conf(spec: GroupSpec, ordinal: int, broker_id: int, data_dir: Path, ports: Mapping[str, int],
                namesrv: str, master_ha: str, token_file: Path, group_epoch: int = 0) -> str:
    """broker.conf of the broker at ``ordinal`` (its ports and store) holding ``broker_id`` (0: master)
    in a group at ``group_epoch`` (``haGroupEpoch``: a master back on an emptied store refuses writes)."""
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
        "storePathRootDir": str(store_dir(data_dir, ordinal)),
        "haGroupEpoch": str(group_epoch),
    }
    if broker_id != 0 and spec.master_discovery == "Direct":
        conf["haMasterAddress"] = master_ha
    if spec.acl is not None:
        conf |= {"aclEnable": "true", "aclFile": str(acl_file_path(data_dir, ordinal)),
                 "aclAccessKey": spec.acl.access_key, "aclSecretKey": spec.acl.secret_key}
    if spec.tls is not None:
        conf |= {"tlsEnable": "true", "tlsServerMode": spec.tls.mode,
                 "tlsConfigFile": str(tls_properties_path(data_dir))}
    return "".join(f"{k}={v}\n" for k, v in conf.items())


def store_dir(data_dir: Path, ordinal: int) -> Path:
    """The store of the broker at ``ordinal`` of the group kept in ``data_dir``."""
    return data_dir / f"broker-{ordinal}" / "store"


def tls_properties_path(data_dir: Path) -> Path:
    """Where :func:`write_secrets` renders tls.properties for the group in ``data_dir``."""
    return data_dir / SECRETS_DIR / tls_conf.PROPERTIES_FILE


def acl_file_path(data_dir: Path, ordinal: int) -> Path:
    """The plain_acl.yml of the broker at ``ordinal``: each broker has its own copy of the Secret's,
    as each Java broker has its own file. Shared, a change sent to every broker (rmq-admin's ``-c``)
    was made by the first for all, and the others then refused a deletion ("not existed")."""
    return data_dir / SECRETS_DIR / "acl" / f"broker-{ordinal}" / ACL_FILE_NAME


def write_secrets(spec: GroupSpec, data_dir: Path) -> Path | None:
    """The Secrets' files of ``spec`` under ``data_dir/secrets`` (owner-only), and tls.properties;
    the tls.properties path, if TLS is on."""
    secrets = data_dir / SECRETS_DIR
    files: dict[Path, bytes] = {}
    if spec.acl is not None:
        files |= {acl_file_path(data_dir, ordinal): spec.acl.acl_file for ordinal in range(spec.replicas)}
    props = None
    if spec.tls is not None:
        files |= {secrets / "tls" / name: content for name, content in spec.tls.files}
        props = tls_properties_path(data_dir)
        header = f"# {spec.name}: rendered by rmq-local from spec.tls (Secret {spec.tls.secret_name}).\n"
        files[props] = tls_conf.render_properties(str(secrets / "tls"), spec.tls.client_auth, header).encode()
    for path, content in files.items():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(path, content, mode=0o600, backup=False)  # a secret gets no .bak copy
    return props
