"""Pure builders: a GroupSpec (+ the current role assignment) -> the Kubernetes objects of a group.

Nothing here talks to the API server; every function returns plain dicts, so tests check the
rendered objects directly.

Children of a BrokerGroup ``<name>``:

* broker StatefulSet ``<name>`` (pods ``<name>-<ordinal>``), updateStrategy OnDelete so the
  operator decides the restart order; headless Service ``<name>-headless`` for stable DNS;
  PodDisruptionBudget ``<name>`` (maxUnavailable 1); PVC template ``data``;
* ConfigMap ``<name>-config`` with ``broker-<ordinal>.conf`` per pod, rendered from the current
  assignment of brokerIds to pods (brokerId is a runtime property: after a failover the promoted
  pod has brokerId 0, so a restarted pod comes back in the role it has now);
* Secret ``<name>-admin-token`` (bearer token of the brokers' admin endpoint);
* when the nameservers are managed: StatefulSet ``<name>-namesrv``, headless Service
  ``<name>-namesrv-headless`` and client Service ``<name>-namesrv``, PodDisruptionBudget;
* replica verification runs: Jobs ``<name>-verify-<unix seconds>`` (``rmq-verify``, one at a
  time, see :mod:`rmqoperator.verification`) and, when they run under a service account allowed
  to write it, the report ConfigMap ``<name>-verification``.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rmqbroker.config import ACL_FILE_NAME, env_name
from rmqbroker.remoting import tls
from rmqoperator.spec import API_VERSION, GROUP, KIND, GroupSpec, SchedulingSpec

if TYPE_CHECKING:
    from rmqoperator.verification import VerificationSpec

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# ordinal -> brokerId (0 = master)
Assignment = dict[int, int]

CONF_DIR = "/etc/rmq/conf"
TOKEN_DIR = "/etc/rmq/admin"
TOKEN_KEY = "token"
DATA_DIR = "/data"
# spec.acl.secretName: the Secret's plain_acl.yml is mounted here; its optional accessKey and
# secretKey reach the broker as the environment overrides of aclAccessKey / aclSecretKey.
ACL_DIR = "/etc/rmq/acl"
ACL_FILE_KEY = ACL_FILE_NAME
ACL_ENV = (("RMQ_BROKER_ACL_ACCESS_KEY", "accessKey"), ("RMQ_BROKER_ACL_SECRET_KEY", "secretKey"))
# spec.tls.secretName: the Secret's tls.crt, tls.key and ca.crt are mounted here, and the ConfigMap's
# tls.properties (RocketMQ's keys) points brokers and nameservers at them.
TLS_DIR = "/etc/rmq/tls"
TLS_KEYS = tls.CERT_FILES
TLS_PROPERTIES = tls.PROPERTIES_FILE
CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
APPLIED_SPEC_ANNOTATION = f"{GROUP}/applied-spec"
GROUP_LABEL = f"{GROUP}/group"
# Set on StatefulSet pods by Kubernetes >= 1.28; the broker picks its broker-<ordinal>.conf with it.
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
# The broker reads brokerIP1 from this environment variable (rmqbroker.config.env_name).
BROKER_IP_ENV = env_name("brokerIP1")
RUN_AS_USER = 10001
# Keys of a rendered broker.conf that depend on the role assignment (changed at runtime through
# the admin API, so they never call for a restart).
ROLE_KEYS = ("brokerId", "brokerRole", "haMasterAddress", "haGroupEpoch")
# The verification Job: its container, where Kubernetes reads the termination message from, the
# label its pods carry (set in the pod template, so no dependency on the job controller's labels).
VERIFY_CONTAINER = "verify"
TERMINATION_LOG = "/dev/termination-log"
VERIFY_JOB_LABEL = f"{GROUP}/verification-job"
VERIFY_TTL_SECONDS = 24 * 3600
NAMESRV_KV_CONFIG_PATH = "/tmp/namesrv/kvConfig.json"
COMPONENT_NAMES = {"broker": "rmq-broker", "namesrv": "rmq-namesrv", "verification": "rmq-verify"}


# ---------------------------------------------------------------- names
# 360 x 5 s: how long a broker may take to recover its store before the kubelet restarts it.
STARTUP_PROBE_FAILURES = 360


def broker_sts_name(spec: GroupSpec) -> str:
    return spec.name


def claim_name(spec: GroupSpec, ordinal: int) -> str:
    """The PersistentVolumeClaim the StatefulSet made for a pod (template ``data``)."""
    return f"data-{broker_sts_name(spec)}-{ordinal}"


def headless_name(spec: GroupSpec) -> str:
    return f"{spec.name}-headless"


def config_name(spec: GroupSpec) -> str:
    return f"{spec.name}-config"


def token_secret_name(spec: GroupSpec) -> str:
    return f"{spec.name}-admin-token"


def namesrv_sts_name(spec: GroupSpec) -> str:
    return f"{spec.name}-namesrv"


def namesrv_headless_name(spec: GroupSpec) -> str:
    return f"{spec.name}-namesrv-headless"


def namesrv_service_name(spec: GroupSpec) -> str:
    return f"{spec.name}-namesrv"


def verification_configmap_name(spec: GroupSpec) -> str:
    return f"{spec.name}-verification"


def pod_name(spec: GroupSpec, ordinal: int) -> str:
    return f"{broker_sts_name(spec)}-{ordinal}"


def pod_ordinal(name: str) -> int | None:
    head, _, tail = name.rpartition("-")
    return int(tail) if head and tail.isdigit() else None


def pod_dns(spec: GroupSpec, ordinal: int) -> str:
    """Stable DNS name of a broker pod (through the headless Service)."""
    return f"{pod_name(spec, ordinal)}.{headless_name(spec)}.{spec.namespace}.svc"


def master_ha_dns(spec: GroupSpec, master_ordinal: int) -> str:
    return f"{pod_dns(spec, master_ordinal)}:{spec.ports.ha}"


def namesrv_addr(spec: GroupSpec) -> str:
    """namesrvAddr: every nameserver pod (a broker registers with each of them)."""
    if not spec.name_server.managed:
        return ";".join(spec.name_server.addresses)
    sts, svc = namesrv_sts_name(spec), namesrv_headless_name(spec)
    return ";".join(f"{sts}-{i}.{svc}.{spec.namespace}.svc:{spec.ports.name_server}"
                    for i in range(spec.name_server.replicas))


# ---------------------------------------------------------------- metadata
def labels(spec: GroupSpec, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": COMPONENT_NAMES[component],
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "rmq-operator",
        GROUP_LABEL: spec.name,
    }


def selector(spec: GroupSpec, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": spec.name, "app.kubernetes.io/component": component,
            GROUP_LABEL: spec.name}


def selector_text(spec: GroupSpec, component: str) -> str:
    """``selector`` as a label-selector string (the scale subresource's ``status.selector``)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector(spec, component).items()))


def owner_reference(spec: GroupSpec) -> Obj:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": spec.name, "uid": spec.uid,
            "controller": True, "blockOwnerDeletion": True}


def _meta(spec: GroupSpec, name: str, component: str, annotations: dict[str, str] | None = None) -> Obj:
    meta: Obj = {"name": name, "namespace": spec.namespace, "labels": labels(spec, component),
                 "ownerReferences": [owner_reference(spec)]}
    if annotations:
        meta["annotations"] = annotations
    return meta


# ---------------------------------------------------------------- broker.conf
def role_for(spec: GroupSpec, broker_id: int) -> str:
    return spec.master_role if broker_id == 0 else "SLAVE"


def render_broker_conf(spec: GroupSpec, ordinal: int, broker_id: int, master_ordinal: int,
                       epoch: int | None = None) -> str:
    """broker.conf of pod ``ordinal`` holding ``broker_id`` while ``master_ordinal`` is the master
    at ``epoch`` (``haGroupEpoch``: a master restarted on an empty volume then refuses writes)."""
    conf: dict[str, str] = {
        "brokerClusterName": spec.cluster_name,
        "brokerName": spec.broker_name,
        "brokerId": str(broker_id),
        "brokerRole": role_for(spec, broker_id),
        "flushDiskType": spec.flush_disk_type,
        "namesrvAddr": namesrv_addr(spec),
        "listenPort": str(spec.ports.listen),
        "haListenPort": str(spec.ports.ha),
        "adminListenPort": str(spec.ports.admin),
        "adminTokenFile": f"{TOKEN_DIR}/{TOKEN_KEY}",
        "storePathRootDir": f"{DATA_DIR}/store",
    }
    if broker_id != 0 and spec.master_discovery == "Direct":
        conf["haMasterAddress"] = master_ha_dns(spec, master_ordinal)
    if epoch is not None:
        conf["haGroupEpoch"] = str(epoch)
    if spec.acl_secret:
        conf["aclEnable"] = "true"
        conf["aclFile"] = f"{ACL_DIR}/{ACL_FILE_KEY}"
    if spec.tls_secret:
        conf["tlsServerMode"] = spec.tls_mode
        conf["tlsEnable"] = "true"
        conf["tlsConfigFile"] = f"{CONF_DIR}/{TLS_PROPERTIES}"
    conf.update(sorted(spec.broker_config.items()))
    header = (f"# {spec.broker_name} pod {pod_name(spec, ordinal)}: rendered by rmq-operator, do not edit.\n"
              f"# brokerIP1 comes from ${BROKER_IP_ENV} (the pod IP).\n")
    return header + "".join(f"{k}={v}\n" for k, v in conf.items())


def render_tls_properties(spec: GroupSpec) -> str:
    """tls.properties for brokers and nameservers: the Secret's certificate as server and client,
    its CA trusted both ways (host names are not checked, as in RocketMQ)."""
    header = f"# {spec.name}: rendered by rmq-operator from spec.tls, do not edit.\n"
    return tls.render_properties(TLS_DIR, spec.tls_client_auth, header)


def secret_refs(spec: GroupSpec) -> list[tuple[str, str, tuple[str, ...]]]:
    """The Secrets the pods mount: (spec field, Secret name, keys the pods cannot start without)."""
    refs: list[tuple[str, str, tuple[str, ...]]] = []
    if spec.tls_secret:
        refs.append(("spec.tls.secretName", spec.tls_secret, TLS_KEYS))
    if spec.acl_secret:
        refs.append(("spec.acl.secretName", spec.acl_secret, (ACL_FILE_KEY,)))
    return refs


def _tls_volume(spec: GroupSpec) -> Obj:
    return {"name": "tls", "secret": {"secretName": spec.tls_secret, "defaultMode": 0o440,
                                      "items": [{"key": k, "path": k} for k in TLS_KEYS]}}


_TLS_MOUNT: Obj = {"name": "tls", "mountPath": TLS_DIR, "readOnly": True}


def master_ordinal_of(assignment: Assignment) -> int:
    return next((o for o, b in assignment.items() if b == 0), 0)


def config_map(spec: GroupSpec, assignment: Assignment, epoch: int | None = None) -> Obj:
    master = master_ordinal_of(assignment)
    data = {f"broker-{o}.conf": render_broker_conf(spec, o, b, master, epoch) for o, b in sorted(assignment.items())}
    if spec.tls_secret:
        data[TLS_PROPERTIES] = render_tls_properties(spec)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(spec, config_name(spec), "broker", {APPLIED_SPEC_ANNOTATION: spec.to_json()}),
            "data": data}


def admin_secret(spec: GroupSpec, token: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(spec, token_secret_name(spec), "broker"),
            "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()}}


# ---------------------------------------------------------------- pods
def _container_security() -> Obj:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]}}


def _pod_security() -> Obj:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER, "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _scheduling(spec: GroupSpec, component: str) -> Obj:
    """Pod-spec fields placing ``component``'s pods: the user's node constraints, and anti-affinity
    between this group's pods of that component (brokers of other groups may share a node)."""
    s = spec.scheduling
    out: Obj = {}
    affinity: Obj = {}
    if s.node_affinity:
        affinity["nodeAffinity"] = s.node_affinity
    if s.pod_anti_affinity != "None":
        term = {"labelSelector": {"matchLabels": selector(spec, component)}, "topologyKey": s.topology_key}
        affinity["podAntiAffinity"] = (
            {"requiredDuringSchedulingIgnoredDuringExecution": [term]} if s.pod_anti_affinity == "Required"
            else {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]})
    if affinity:
        out["affinity"] = affinity
    if s.node_selector:
        out["nodeSelector"] = dict(s.node_selector)
    if s.tolerations:
        out["tolerations"] = [dict(t) for t in s.tolerations]
    if s.priority_class_name:
        out["priorityClassName"] = s.priority_class_name
    return out


def _pod_metadata(spec: GroupSpec, component: str, annotations: dict[str, str] | None = None) -> Obj:
    """A pod template's metadata: the user's labels and annotations, then the operator's (which win;
    ``problems`` refuses user keys that would collide)."""
    meta: Obj = {"labels": {**spec.pod_labels, **labels(spec, component)}}
    merged = {**spec.pod_annotations, **(annotations or {})}
    if merged:
        meta["annotations"] = merged
    return meta


def _pull_secrets(spec: GroupSpec) -> Obj:
    return {"imagePullSecrets": [{"name": n} for n in spec.image_pull_secrets]} if spec.image_pull_secrets else {}


def _broker_pod_template(spec: GroupSpec) -> Obj:
    p = spec.ports
    container: Obj = {
        "name": "broker",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["rmq-broker"],
        # $(POD_ORDINAL) is expanded by the kubelet: no shell needed in the image.
        "args": ["-c", f"{CONF_DIR}/broker-$(POD_ORDINAL).conf"],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_ORDINAL", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}}},
            {"name": BROKER_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "ports": [
            {"name": "remoting", "containerPort": p.listen, "protocol": "TCP"},
            {"name": "ha", "containerPort": p.ha, "protocol": "TCP"},
            {"name": "admin", "containerPort": p.admin, "protocol": "TCP"},
            {"name": "vip", "containerPort": p.vip, "protocol": "TCP"},
        ],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "admin"}, "periodSeconds": 2,
                           "failureThreshold": 2, "timeoutSeconds": 2},
        # The admin endpoint comes up once the store has recovered, which after a crash can take
        # minutes on a large volume (commitlog CRCs, consume queues, the index after a node crash):
        # the startup probe gives it half an hour, so liveness never kills a recovery halfway.
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "admin"}, "periodSeconds": 5,
                         "failureThreshold": STARTUP_PROBE_FAILURES, "timeoutSeconds": 3},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "admin"},
                          "periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 3},
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "conf", "mountPath": CONF_DIR, "readOnly": True},
            {"name": "admin-token", "mountPath": TOKEN_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "securityContext": _container_security(),
    }
    if spec.resources:
        container["resources"] = spec.resources
    volumes: list[Obj] = [
        # The whole ConfigMap as a directory (no subPath): a restarted container reads the
        # current role assignment once the kubelet has synced the volume.
        {"name": "conf", "configMap": {"name": config_name(spec)}},
        {"name": "admin-token", "secret": {"secretName": token_secret_name(spec), "defaultMode": 0o440}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if spec.acl_secret:
        volumes.append({"name": "acl", "secret": {"secretName": spec.acl_secret, "defaultMode": 0o440,
                                                  "items": [{"key": ACL_FILE_KEY, "path": ACL_FILE_KEY}]}})
        container["volumeMounts"].append({"name": "acl", "mountPath": ACL_DIR, "readOnly": True})
        container["env"] += [{"name": env, "valueFrom": {"secretKeyRef": {"name": spec.acl_secret, "key": key,
                                                                          "optional": True}}}
                             for env, key in ACL_ENV]
    if spec.tls_secret:
        volumes.append(_tls_volume(spec))
        container["volumeMounts"].append(dict(_TLS_MOUNT))
    return {
        "metadata": _pod_metadata(spec, "broker", {CONFIG_HASH_ANNOTATION: config_hash(spec)}),
        "spec": {
            "enableServiceLinks": False,
            # Brokers never call the Kubernetes API: no token in the pod to steal.
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 60,
            "securityContext": _pod_security(),
            "containers": [container],
            "volumes": volumes,
            **_scheduling(spec, "broker"),
            **_pull_secrets(spec),
        },
    }


def config_hash(spec: GroupSpec) -> str:
    """Hash of everything whose change needs a broker restart (the role assignment excluded).

    A pod whose config-hash annotation differs from the StatefulSet template's is outdated; the
    operator restarts outdated pods one at a time. Replication mode (SYNC/ASYNC) is switched at
    runtime on the master and is left out too.
    """
    static_conf = [line for line in render_broker_conf(spec, 0, 1, 0).splitlines()
                   if not line.startswith("#") and line.split("=", 1)[0] not in ROLE_KEYS]
    material = {
        "image": spec.image, "pullPolicy": spec.image_pull_policy, "resources": spec.resources,
        "conf": static_conf, "discovery": spec.master_discovery, "restartAt": spec.restart_at,
    }
    if spec.acl_secret:  # only when set: groups without an ACL keep the hash they had
        material["acl"] = spec.acl_secret
    if spec.tls_secret:  # likewise (its mode and client auth are in the conf and tls.properties)
        material["tls"] = [spec.tls_secret, render_tls_properties(spec)]
    if spec.scheduling != SchedulingSpec():
        # Placement applies when a pod is scheduled: moving brokers means restarting them. The
        # default is left out so that groups from before scheduling existed keep their hash.
        material["scheduling"] = dataclasses.asdict(spec.scheduling)
    # Pod metadata and pull secrets reach a broker pod only when it is created: likewise only when set.
    for key, value in (("pullSecrets", list(spec.image_pull_secrets)), ("podLabels", spec.pod_labels),
                       ("podAnnotations", spec.pod_annotations)):
        if value:
            material[key] = value
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def broker_statefulset(spec: GroupSpec, replicas: int) -> Obj:
    pvc_spec: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": spec.storage_size}}}
    if spec.storage_class:
        pvc_spec["storageClassName"] = spec.storage_class
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _meta(spec, broker_sts_name(spec), "broker"),
        "spec": {
            "serviceName": headless_name(spec),
            "replicas": replicas,
            # Pods start together (a slave waits for its master by itself); OnDelete leaves the
            # restart order of a changed template to the operator (slaves first, master last).
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "selector": {"matchLabels": selector(spec, "broker")},
            "template": _broker_pod_template(spec),
            "volumeClaimTemplates": [{
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "labels": selector(spec, "broker")},
                "spec": pvc_spec,
            }],
        },
    }


def broker_headless_service(spec: GroupSpec) -> Obj:
    p = spec.ports
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(spec, headless_name(spec), "broker"),
        "spec": {
            "clusterIP": "None",
            # Slaves must resolve the master's name before it is Ready (it turns Ready only after
            # registering, and a SYNC master needs a slave to accept writes).
            "publishNotReadyAddresses": True,
            "selector": selector(spec, "broker"),
            "ports": [{"name": "remoting", "port": p.listen, "targetPort": "remoting", "protocol": "TCP"},
                      {"name": "ha", "port": p.ha, "targetPort": "ha", "protocol": "TCP"},
                      {"name": "admin", "port": p.admin, "targetPort": "admin", "protocol": "TCP"},
                      {"name": "vip", "port": p.vip, "targetPort": "vip", "protocol": "TCP"}],
        },
    }


def pod_disruption_budget(spec: GroupSpec, component: str = "broker") -> Obj:
    name = spec.name if component == "broker" else namesrv_sts_name(spec)
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": _meta(spec, name, component),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(spec, component)}},
    }


# ---------------------------------------------------------------- nameservers
def namesrv_statefulset(spec: GroupSpec) -> Obj:
    ns = spec.name_server
    port = spec.ports.name_server
    container: Obj = {
        "name": "namesrv",
        "image": ns.image or spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["rmq-namesrv"],
        # The root filesystem is read-only (HOME too): the KV config (mqadmin updateKvConfig /
        # updateOrderConf) goes to the /tmp emptyDir, which lasts as long as the pod.
        "args": ["--listen", f"0.0.0.0:{port}", "--kv-config-path", NAMESRV_KV_CONFIG_PATH],
        "ports": [{"name": "namesrv", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "namesrv"}, "periodSeconds": 2},
        "livenessProbe": {"tcpSocket": {"port": "namesrv"}, "initialDelaySeconds": 10, "periodSeconds": 10},
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    if ns.resources:
        container["resources"] = ns.resources
    volumes: list[Obj] = [{"name": "tmp", "emptyDir": {}}]
    pod_annotations: dict[str, str] | None = None
    if spec.tls_secret:
        container["args"] += ["--tls-server-mode", spec.tls_mode,
                              "--tls-config-file", f"{CONF_DIR}/{TLS_PROPERTIES}"]
        container["volumeMounts"] += [{"name": "conf", "mountPath": CONF_DIR, "readOnly": True}, dict(_TLS_MOUNT)]
        volumes += [{"name": "conf", "configMap": {"name": config_name(spec),
                                                   "items": [{"key": TLS_PROPERTIES, "path": TLS_PROPERTIES}]}},
                    _tls_volume(spec)]
        # The nameservers read their TLS files at start: a change of spec.tls rolls them.
        tls_hash = hashlib.sha256(json.dumps([spec.tls_secret, render_tls_properties(spec)]).encode()).hexdigest()
        pod_annotations = {f"{GROUP}/tls-hash": tls_hash[:16]}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _meta(spec, namesrv_sts_name(spec), "namesrv"),
        "spec": {
            "serviceName": namesrv_headless_name(spec),
            "replicas": ns.replicas,
            "podManagementPolicy": "Parallel",
            # Nameservers are stateless: the StatefulSet controller may roll them itself.
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": selector(spec, "namesrv")},
            "template": {
                "metadata": _pod_metadata(spec, "namesrv", pod_annotations),
                "spec": {"enableServiceLinks": False, "automountServiceAccountToken": False,
                         "securityContext": _pod_security(),
                         "containers": [container], "volumes": volumes,
                         **_scheduling(spec, "namesrv"), **_pull_secrets(spec)},
            },
        },
    }


def namesrv_headless_service(spec: GroupSpec) -> Obj:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(spec, namesrv_headless_name(spec), "namesrv"),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector(spec, "namesrv"),
                 "ports": [{"name": "namesrv", "port": spec.ports.name_server, "targetPort": "namesrv",
                            "protocol": "TCP"}]},
    }


def namesrv_client_service(spec: GroupSpec) -> Obj:
    """For clients (any nameserver answers every route: brokers register with all of them)."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(spec, namesrv_service_name(spec), "namesrv"),
        "spec": {"type": "ClusterIP", "selector": selector(spec, "namesrv"),
                 "ports": [{"name": "namesrv", "port": spec.ports.name_server, "targetPort": "namesrv",
                            "protocol": "TCP"}]},
    }


# ---------------------------------------------------------------- replica verification
def admin_urls(spec: GroupSpec, ordinals: Iterable[int]) -> list[str]:
    """Admin endpoints of the broker pods by their stable DNS names (rmq-verify finds the master by role)."""
    return [f"http://{pod_dns(spec, o)}:{spec.ports.admin}" for o in sorted(ordinals)]


def verification_job(spec: GroupSpec, verification: VerificationSpec, name: str, ordinals: Iterable[int],
                     annotations: Mapping[str, str] | None = None) -> Obj:
    """The ``rmq-verify`` Job ``name`` over the brokers ``ordinals`` (Spark in local mode in the pod).

    One attempt (backoffLimit 0: a failed run is reported, the next trigger runs again), bounded by
    activeDeadlineSeconds. The summary goes to the termination message; the full report to the
    ConfigMap ``<group>-verification`` only under ``serviceAccountName`` (the job writes it with its
    own credentials: the account needs configmaps create/patch); otherwise no API token is mounted.
    Root filesystem read-only: Spark, the JVM and Python write under the /tmp emptyDir.
    """
    meta_labels = {**labels(spec, "verification"), VERIFY_JOB_LABEL: name}
    args = ["--replicas", ",".join(admin_urls(spec, ordinals)), "--token-file", f"{TOKEN_DIR}/{TOKEN_KEY}",
            "--termination-log", TERMINATION_LOG, "--spark-conf", "spark.ui.enabled=false"]
    if verification.service_account:
        args += ["--configmap", f"{spec.namespace}/{verification_configmap_name(spec)}"]
    container: Obj = {
        "name": VERIFY_CONTAINER,
        "image": verification.image or spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["rmq-verify"],
        "args": args,
        # HOME (/home/rmq in the image) is read-only here; the JVM's java.io.tmpdir is /tmp already.
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "SPARK_LOCAL_DIRS", "value": "/tmp"}],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "volumeMounts": [{"name": "admin-token", "mountPath": TOKEN_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": _container_security(),
    }
    if verification.resources:
        container["resources"] = verification.resources
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": bool(verification.service_account),
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": [{"name": "admin-token", "secret": {"secretName": token_secret_name(spec), "defaultMode": 0o440}},
                    {"name": "tmp", "emptyDir": {}}],
        **_pull_secrets(spec),
    }
    if verification.service_account:
        pod_spec["serviceAccountName"] = verification.service_account
    meta: Obj = {"name": name, "namespace": spec.namespace, "labels": meta_labels,
                 "ownerReferences": [owner_reference(spec)]}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": verification.active_deadline_seconds,
            "ttlSecondsAfterFinished": VERIFY_TTL_SECONDS,
            "template": {"metadata": {"labels": meta_labels}, "spec": pod_spec},
        },
    }


# ---------------------------------------------------------------- the whole group
def children(spec: GroupSpec, assignment: Assignment, sts_replicas: int, epoch: int | None = None) -> list[Obj]:
    """Every child except the token Secret, in apply order (what a pod mounts comes first)."""
    out: list[Obj] = []
    if spec.name_server.managed:
        out += [namesrv_headless_service(spec), namesrv_client_service(spec), namesrv_statefulset(spec),
                pod_disruption_budget(spec, "namesrv")]
    out += [config_map(spec, assignment, epoch), broker_headless_service(spec), broker_statefulset(spec, sts_replicas),
            pod_disruption_budget(spec, "broker")]
    return out


def child_refs(spec: GroupSpec) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every child the operator may have created, for deletion."""
    refs = [("apps/v1", "StatefulSet", broker_sts_name(spec)), ("v1", "Service", headless_name(spec)),
            ("policy/v1", "PodDisruptionBudget", spec.name), ("v1", "ConfigMap", config_name(spec)),
            ("v1", "Secret", token_secret_name(spec)),
            ("apps/v1", "StatefulSet", namesrv_sts_name(spec)), ("v1", "Service", namesrv_headless_name(spec)),
            ("v1", "Service", namesrv_service_name(spec)),
            ("policy/v1", "PodDisruptionBudget", namesrv_sts_name(spec))]
    return refs
