"""The BrokerGroup spec as a typed value, with the CRD's defaults applied and semantic checks.

The API server applies the CRD's defaults, but the operator may see objects written before a
default existed (and the test emulator applies none), so :func:`parse_spec` applies the same
defaults again; a test keeps the two in step. What the schema cannot express (keys the operator
owns in ``brokerConfig``, values the broker would refuse, names too long for pod labels) is
checked by :func:`problems` and reported as a condition instead of touching running children.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rmqbroker.ha.election import FailoverSpec
from rmqbroker.managed_keys import MANAGED_KEYS, managed_keys_in, spec_rendered_keys_in, unsafe_entries

log = logging.getLogger(__name__)

GROUP = "rmq.brokergroup.dev"
VERSION = "v1alpha1"
PLURAL = "brokergroups"
KIND = "BrokerGroup"
API_VERSION = f"{GROUP}/{VERSION}"

PAUSED_ANNOTATION = f"{GROUP}/paused"
RESTART_ANNOTATION = f"{GROUP}/restart-at"
# A pod name: hand the master over to that broker once (each new value is one request).
SWITCHOVER_ANNOTATION = f"{GROUP}/switchover-to"

DEFAULT_IMAGE = os.environ.get("RMQ_OPERATOR_DEFAULT_IMAGE", "rmq-brokergroup:0.1.0")

# broker.conf keys the operator renders itself: letting brokerConfig override them would break
# role assignment, addressing or the admin channel the operator depends on. rmq-local refuses the
# same keys, so the list lives in the broker package (which must not import the operator).
RESERVED_KEYS = MANAGED_KEYS

BROKER_NAME_RE = re.compile(r"^[a-zA-Z0-9_%|-]+$")
# StatefulSet pods get a controller-revision-hash label "<sts>-<10 chars>" (63 max) and the
# nameserver StatefulSet is "<name>-namesrv": 40 leaves room for both.
MAX_NAME_LENGTH = 40
# The group's name names its Services, which must be DNS-1035 labels (a letter first, no dots).
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class SpecError(ValueError):
    """The spec cannot be used; the message says why."""


@dataclass(frozen=True)
class Ports:
    listen: int = 10911
    ha: int = 10912
    admin: int = 10916
    name_server: int = 9876

    @property
    def vip(self) -> int:
        """RocketMQ's VIP channel, where the broker listens too (Java clients up to 4.4 send there)."""
        return self.listen - 2


@dataclass(frozen=True)
class NameServerSpec:
    managed: bool = True
    replicas: int = 1
    addresses: tuple[str, ...] = ()
    image: str | None = None
    resources: dict[str, Any] = field(default_factory=dict)


ANTI_AFFINITY_MODES = ("Preferred", "Required", "None")


@dataclass(frozen=True)
class SchedulingSpec:
    """Where a group's broker and nameserver pods may run. By default the pods of each component
    prefer distinct nodes: a master and its slaves on one node would all go with that node."""

    pod_anti_affinity: str = "Preferred"
    topology_key: str = "kubernetes.io/hostname"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    node_affinity: dict[str, Any] = field(default_factory=dict)
    priority_class_name: str = ""


@dataclass(frozen=True)
class GroupSpec:
    """One BrokerGroup's desired state (defaults applied)."""

    name: str
    namespace: str
    uid: str
    cluster_name: str = "DefaultCluster"
    broker_name: str = ""
    replicas: int = 2
    replication: str = "ASYNC"
    flush_disk_type: str = "ASYNC_FLUSH"
    master_discovery: str = "Direct"
    name_server: NameServerSpec = field(default_factory=NameServerSpec)
    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    resources: dict[str, Any] = field(default_factory=dict)
    storage_size: str = "10Gi"
    storage_class: str | None = None
    ports: Ports = field(default_factory=Ports)
    broker_config: dict[str, str] = field(default_factory=dict)
    failover: FailoverSpec = field(default_factory=FailoverSpec)
    verification: dict[str, Any] = field(default_factory=dict)
    restart_at: str = ""
    # Secret holding plain_acl.yml (and optionally accessKey/secretKey for the slaves' sync): ACL on.
    acl_secret: str = ""
    # spec.tls: Secret with tls.crt, tls.key and ca.crt (cert-manager's layout): TLS on the remoting
    # ports in tls_mode, the brokers' own connections over TLS, clients verified per tls_client_auth.
    tls_secret: str = ""
    tls_mode: str = "enforcing"
    tls_client_auth: str = "none"
    scheduling: SchedulingSpec = field(default_factory=SchedulingSpec)
    # Names of Secrets to pull the images with (every pod of the group: brokers, nameservers, jobs).
    image_pull_secrets: tuple[str, ...] = ()
    # Added to the broker and nameserver pods (e.g. for a scraper or a service mesh).
    pod_annotations: dict[str, str] = field(default_factory=dict)
    pod_labels: dict[str, str] = field(default_factory=dict)

    @property
    def master_role(self) -> str:
        return "SYNC_MASTER" if self.replication == "SYNC" else "ASYNC_MASTER"

    def to_json(self) -> str:
        """Stable JSON of the whole spec (stored on the ConfigMap as the last applied spec)."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> GroupSpec:
        obj = json.loads(text)
        obj["name_server"] = NameServerSpec(**{**obj["name_server"],
                                               "addresses": tuple(obj["name_server"]["addresses"])})
        obj["ports"] = Ports(**obj["ports"])
        obj["failover"] = FailoverSpec(**obj["failover"])
        if "scheduling" in obj:  # absent from specs applied by operators before it existed
            obj["scheduling"] = SchedulingSpec(**{**obj["scheduling"],
                                                  "tolerations": tuple(obj["scheduling"]["tolerations"])})
        obj["image_pull_secrets"] = tuple(obj.get("image_pull_secrets", ()))
        return GroupSpec(**obj)


# spec.tls: the remoting ports' modes a group can run in (RocketMQ's tls.server.mode without
# "disabled": a group without TLS leaves spec.tls out) and its tls.server.need.client.auth values.
TLS_MODES = ("permissive", "enforcing")
TLS_CLIENT_AUTH = ("none", "optional", "require")

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_QUANTITY_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
                   "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity_bytes(text: str) -> int | None:
    """A Kubernetes storage quantity (the forms the CRD admits: ``10Gi``, ``1.5T``, ``500M``, ``1024``)
    in bytes, or None when it is not one."""
    m = _QUANTITY.match(text.strip())
    if m is None:
        return None
    whole, _, frac = m.group(1).partition(".")
    unit = _QUANTITY_UNITS[m.group(2)]
    return int(whole) * unit + (int(frac) * unit) // 10 ** len(frac) if frac else int(whole) * unit


def _get(obj: Mapping[str, Any], key: str, typ: type, default: Any, path: str) -> Any:
    value = obj.get(key)
    if value is None:
        return default
    # bool is an int subclass: refuse `true` where a number is expected.
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise SpecError(f"{path}{key} must be of type {typ.__name__}")
    return value


def _obj(obj: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = obj.get(key) or {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{path}{key} must be an object")
    return value


def _parse_scheduling(spec: Mapping[str, Any]) -> SchedulingSpec:
    path = "spec.scheduling."
    sched = _obj(spec, "scheduling", "spec.")
    node_selector = _obj(sched, "nodeSelector", path)
    if not all(isinstance(v, str) for v in node_selector.values()):
        raise SpecError(f"{path}nodeSelector values must be strings")
    tolerations = sched.get("tolerations") or []
    if not isinstance(tolerations, list) or not all(isinstance(t, Mapping) for t in tolerations):
        raise SpecError(f"{path}tolerations must be a list of objects")
    return SchedulingSpec(
        pod_anti_affinity=_get(sched, "podAntiAffinity", str, "Preferred", path),
        topology_key=_get(sched, "topologyKey", str, "kubernetes.io/hostname", path),
        node_selector={str(k): str(v) for k, v in node_selector.items()},
        tolerations=tuple(dict(t) for t in tolerations),
        node_affinity=dict(_obj(sched, "nodeAffinity", path)),
        priority_class_name=_get(sched, "priorityClassName", str, "", path))


def parse_spec(body: Mapping[str, Any]) -> GroupSpec:
    """A BrokerGroup object -> GroupSpec; SpecError when a field has the wrong shape."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise SpecError("spec must be an object")
    name = str(meta.get("name", ""))
    ns_spec = _obj(spec, "nameServer", "spec.")
    managed = ns_spec.get("managed")
    addresses = ns_spec.get("addresses")
    if managed is not None and addresses is not None:
        raise SpecError("spec.nameServer: set either managed or addresses, not both")
    if addresses is not None:
        if not isinstance(addresses, list) or not addresses or not all(isinstance(a, str) for a in addresses):
            raise SpecError("spec.nameServer.addresses must be a non-empty list of host:port strings")
        name_server = NameServerSpec(managed=False, replicas=0, addresses=tuple(addresses))
    else:
        m = managed if isinstance(managed, Mapping) else {}
        name_server = NameServerSpec(
            managed=True, replicas=_get(m, "replicas", int, 1, "spec.nameServer.managed."),
            image=_get(m, "image", str, None, "spec.nameServer.managed."),
            resources=dict(_obj(m, "resources", "spec.nameServer.managed.")))
    ports_obj = _obj(spec, "ports", "spec.")
    ports = Ports(**{attr: _get(ports_obj, key, int, getattr(Ports, attr), "spec.ports.")
                     for attr, key in (("listen", "listen"), ("ha", "ha"), ("admin", "admin"),
                                       ("name_server", "nameServer"))})
    fo = _obj(spec, "failover", "spec.")
    failover = FailoverSpec(
        enabled=_get(fo, "enabled", bool, True, "spec.failover."),
        master_lost_seconds=_get(fo, "masterLostSeconds", int, 30, "spec.failover."),
        allow_data_loss=_get(fo, "allowDataLoss", bool, False, "spec.failover."))
    storage = _obj(spec, "storage", "spec.")
    broker_config = _obj(spec, "brokerConfig", "spec.")
    for key, value in broker_config.items():
        if not isinstance(value, str):
            raise SpecError(f"spec.brokerConfig.{key} must be a string (quote numbers and booleans)")
    annotations = meta.get("annotations") or {}
    return GroupSpec(
        name=name,
        namespace=str(meta.get("namespace") or "default"),
        uid=str(meta.get("uid", "")),
        cluster_name=_get(spec, "clusterName", str, "DefaultCluster", "spec."),
        broker_name=_get(spec, "brokerName", str, "", "spec.") or name,
        replicas=_get(spec, "replicas", int, 2, "spec."),
        replication=_get(spec, "replication", str, "ASYNC", "spec."),
        flush_disk_type=_get(spec, "flushDiskType", str, "ASYNC_FLUSH", "spec."),
        master_discovery=_get(spec, "masterDiscovery", str, "Direct", "spec."),
        name_server=name_server,
        image=_get(spec, "image", str, DEFAULT_IMAGE, "spec."),
        image_pull_policy=_get(spec, "imagePullPolicy", str, "IfNotPresent", "spec."),
        resources=dict(_obj(spec, "resources", "spec.")),
        storage_size=_get(storage, "size", str, "10Gi", "spec.storage."),
        storage_class=_get(storage, "storageClassName", str, None, "spec.storage."),
        ports=ports,
        broker_config={str(k): str(v) for k, v in broker_config.items()},
        failover=failover,
        verification=dict(_obj(spec, "verification", "spec.")),
        restart_at=str(annotations.get(RESTART_ANNOTATION, "")),
        acl_secret=_get(_obj(spec, "acl", "spec."), "secretName", str, "", "spec.acl.") or "",
        tls_secret=_get(_obj(spec, "tls", "spec."), "secretName", str, "", "spec.tls.") or "",
        tls_mode=_get(_obj(spec, "tls", "spec."), "mode", str, "enforcing", "spec.tls."),
        tls_client_auth=_get(_obj(spec, "tls", "spec."), "clientAuth", str, "none", "spec.tls."),
        scheduling=_parse_scheduling(spec),
        image_pull_secrets=_pull_secrets(spec),
        pod_annotations=_string_map(spec, "podAnnotations"),
        pod_labels=_string_map(spec, "podLabels"),
    )


def _pull_secrets(spec: Mapping[str, Any]) -> tuple[str, ...]:
    raw = spec.get("imagePullSecrets") or []
    if not isinstance(raw, list) or not all(isinstance(r, Mapping) and isinstance(r.get("name"), str) for r in raw):
        raise SpecError("spec.imagePullSecrets must be a list of {name: <Secret>}")
    return tuple(str(r["name"]) for r in raw)


def _string_map(spec: Mapping[str, Any], key: str) -> dict[str, str]:
    raw = _obj(spec, key, "spec.")
    if not all(isinstance(v, str) for v in raw.values()):
        raise SpecError(f"spec.{key} values must be strings")
    return {str(k): str(v) for k, v in raw.items()}


_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Label and annotation key prefixes the operator and the StatefulSet controller set on pods.
RESERVED_PREFIXES = ("app.kubernetes.io/", "rmq.brokergroup.dev/", "apps.kubernetes.io/",
                     "statefulset.kubernetes.io/", "controller-revision-hash")


def _key_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return "its prefix is not a DNS subdomain"
    if not name or not _LABEL_NAME.match(name):
        return "its name is not 1-63 characters of [A-Za-z0-9-_.] beginning and ending alphanumerically"
    if key.startswith(RESERVED_PREFIXES):
        return "the operator sets it"
    return None


def _metadata_problems(spec: GroupSpec) -> list[str]:
    out = []
    for what, mapping in (("podLabels", spec.pod_labels), ("podAnnotations", spec.pod_annotations)):
        for key, value in mapping.items():
            why = _key_problem(key)
            if why is None and what == "podLabels" and not _LABEL_NAME.match(value):
                why = "its value is not a label value (at most 63 characters of [A-Za-z0-9-_.])"
            if why is not None:
                out.append(f"spec.{what}[{key!r}]: {why}")
    return out


def fixed_port_problems(applied: GroupSpec | None, spec: GroupSpec) -> list[str]:
    """The HA and admin ports cannot change under a running group: the operator reaches its brokers
    and points slaves at their master on the spec's ports, while each broker keeps the ones it
    started with until it restarts (and a roll waits for brokers it can no longer reach)."""
    if applied is None:
        return []
    out = []
    for key, old, new in (("ha", applied.ports.ha, spec.ports.ha), ("admin", applied.ports.admin, spec.ports.admin)):
        if old != new:
            out.append(f"spec.ports.{key} cannot change on a running group ({old} -> {new}): put it back to {old}, "
                       "or run a new group")
    return out


def problems(spec: GroupSpec) -> list[str]:
    """What makes a well-formed spec unusable (the schema catches the rest on a real API server)."""
    out: list[str] = _metadata_problems(spec)
    if len(spec.name) > MAX_NAME_LENGTH:
        out.append(f"metadata.name must be at most {MAX_NAME_LENGTH} characters")
    if not _DNS_1035.match(spec.name):
        out.append(f"metadata.name {spec.name!r} must start with a letter and hold only lowercase letters, digits "
                   "and '-' (it names the group's Services)")
    if not BROKER_NAME_RE.match(spec.broker_name):
        out.append(f"brokerName {spec.broker_name!r} has characters outside [a-zA-Z0-9_%|-]")
    if not 1 <= spec.replicas <= 5:
        out.append("spec.replicas must be from 1 to 5")
    if spec.replication not in ("SYNC", "ASYNC"):
        out.append("spec.replication must be SYNC or ASYNC")
    if spec.master_discovery not in ("Direct", "NameServer"):
        out.append("spec.masterDiscovery must be Direct or NameServer")
    if spec.name_server.managed and not 1 <= spec.name_server.replicas <= 5:
        out.append("spec.nameServer.managed.replicas must be from 1 to 5")
    if not spec.failover.master_lost_seconds >= 1:
        out.append("spec.failover.masterLostSeconds must be at least 1")
    if spec.scheduling.pod_anti_affinity not in ANTI_AFFINITY_MODES:
        out.append(f"spec.scheduling.podAntiAffinity must be one of {', '.join(ANTI_AFFINITY_MODES)}")
    if not spec.scheduling.topology_key:
        out.append("spec.scheduling.topologyKey must not be empty")
    if not quantity_bytes(spec.storage_size):
        out.append(f"spec.storage.size {spec.storage_size!r} is not a storage quantity (e.g. 10Gi)")
    if spec.tls_secret and spec.tls_mode not in TLS_MODES:
        out.append(f"spec.tls.mode must be one of {', '.join(TLS_MODES)}")
    if spec.tls_secret and spec.tls_client_auth not in TLS_CLIENT_AUTH:
        out.append(f"spec.tls.clientAuth must be one of {', '.join(TLS_CLIENT_AUTH)}")
    ports = [spec.ports.listen, spec.ports.ha, spec.ports.admin, spec.ports.vip]
    if len(set(ports)) != len(ports):
        out.append("spec.ports: listen, ha, admin and the VIP channel (listen - 2) must differ")
    if spec.ports.vip < 1:
        out.append("spec.ports.listen must be above 2 (the VIP channel is listen - 2)")
    name_server = _name_server_problems(spec)
    out.extend(name_server)
    reserved = managed_keys_in(spec.broker_config)
    if reserved:
        out.append(f"spec.brokerConfig may not set operator-managed keys: {', '.join(reserved)}")
    unsafe = unsafe_entries(spec.broker_config)
    out.extend(f"spec.brokerConfig: {problem}" for problem in unsafe)
    derived = spec_rendered_keys_in(spec.broker_config, bool(spec.acl_secret), bool(spec.tls_secret))
    if derived:
        out.append(f"spec.brokerConfig may not set keys spec.acl/spec.tls render: {', '.join(derived)}")
    if not reserved and not unsafe:
        # Bad nameserver addresses are reported above against their own field: judge brokerConfig
        # with managed nameservers so that namesrvAddr is not blamed on it a second time.
        out.extend(_broker_config_problems(replace(spec, name_server=NameServerSpec()) if name_server else spec))
    from rmqoperator.verification import problems as verification_problems

    out.extend(verification_problems(spec))
    return out


def _name_server_problems(spec: GroupSpec) -> list[str]:
    """Each external nameserver address judged by the broker's own namesrvAddr parser.

    The CRD pattern refuses most bad addresses; this catches what a regex cannot express (label
    and name lengths) and objects the API server never validated (the emulator, older CRDs).
    """
    if spec.name_server.managed:
        return []
    from rmqbroker.config import ConfigError, build_settings

    out: list[str] = []
    for i, addr in enumerate(spec.name_server.addresses):
        where = f"spec.nameServer.addresses[{i}]"
        if not addr.strip() or ";" in addr:
            # The broker tolerates empty entries and splits on ";": one item must be one address.
            out.append(f"{where}: {addr!r} is not one host:port")
            continue
        try:
            build_settings(env={}, overrides={"brokerName": "probe", "namesrvAddr": addr})
        except ConfigError as exc:
            reason = str(exc).removeprefix("namesrvAddr: ").removesuffix(" (expected host:port;host:port)")
            out.append(f"{where}: {reason}")
    return out


def _broker_config_problems(spec: GroupSpec) -> list[str]:
    """Render pod 0's broker.conf and let the broker's own settings parser judge it."""
    from rmqbroker.config import ConfigError, build_settings
    from rmqoperator.builders import render_broker_conf

    conf = render_broker_conf(spec, ordinal=0, broker_id=0, master_ordinal=0)
    try:
        build_settings(conf, env={})
    except ConfigError as exc:
        return [f"spec.brokerConfig: {exc}"]
    return []
