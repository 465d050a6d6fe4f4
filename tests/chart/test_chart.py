"""charts/rmq-operator: lint, render with default and non-default values, validate every object offline."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.chart import tooling
from tests.chart.conftest import (
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    Manifest,
    Render,
    crd_documents,
    find,
    one,
    run_helm,
    values_args,
)

FULLNAME = f"{RELEASE}-rmq-operator"

NAMESPACED: dict[str, Any] = {"rbac": {"namespaced": True}, "operator": {"watchNamespaces": ["team-a", "team-b"]}}
NETWORK_POLICY: dict[str, Any] = {
    "networkPolicy": {
        "enabled": True,
        "groups": [
            {"name": "broker-a", "managedNameServer": True},
            {"name": "broker-b", "namespace": "team-b", "managedNameServer": False,
             "clients": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}],
             "extraIngress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 10911}]}]},
        ],
    }
}
CUSTOM: dict[str, Any] = {
    "image": {"repository": "registry.example/rmq/brokergroup", "tag": "1.2.3", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
    "operator": {"logLevel": "DEBUG", "extraArgs": ["--log-level=DEBUG"],
                 "extraEnv": [{"name": "EXTRA", "value": "1"}]},
    "serviceAccount": {"name": "custom-sa", "annotations": {"example.com/role": "x"}},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rmq", "effect": "NoSchedule"}],
    "metrics": {"service": {"enabled": False}},
    "exampleBrokerGroup": {"enabled": True},
}
VARIANTS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "namespaced": NAMESPACED,
    "namespaced-no-discovery": {**NAMESPACED, "rbac": {"namespaced": True, "crdDiscovery": False}},
    "network-policy": NETWORK_POLICY,
    "custom": CUSTOM,
}
# Exactly what the operator may do in a namespace it manages: (apiGroup, resource) -> verbs. Neither
# kopf nor k8s.py ever PUTs (no "update") or watches anything but BrokerGroups, or reads one pod.
NAMESPACED_RULES: dict[tuple[str, str], set[str]] = {
    ("rmq.brokergroup.dev", "brokergroups"): {"get", "list", "watch", "patch"},
    ("rmq.brokergroup.dev", "brokergroups/status"): {"get", "patch"},
    ("apps", "statefulsets"): {"create", "get", "patch", "delete"},
    ("", "services"): {"create", "get", "patch", "delete"},
    ("", "configmaps"): {"create", "get", "patch", "delete"},
    ("", "secrets"): {"create", "get", "delete"},
    ("policy", "poddisruptionbudgets"): {"create", "get", "patch", "delete"},
    ("", "pods"): {"list", "delete"},
    ("", "persistentvolumeclaims"): {"get", "patch"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    ("batch", "jobs"): {"create", "get", "list", "delete"},
}
CRD_READ = {("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"}}
NAMESPACES_WATCH = {("", "namespaces"): {"list", "watch"}}


def rule_table(role: Manifest) -> dict[tuple[str, str], set[str]]:
    table: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                table.setdefault((group, resource), set()).update(rule["verbs"])
    return table


def container(manifests: Iterable[Manifest]) -> dict[str, Any]:
    deployment = one(manifests, "Deployment", FULLNAME)
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


def validate_builtin(manifest: Manifest) -> None:
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(str(p) for p in exc.path)
            raise AssertionError(
                f"{manifest['kind']}/{manifest['metadata']['name']} invalid for Kubernetes {version} at {where}: "
                f"{exc.message}"
            ) from None


def validate_custom(manifest: Manifest) -> None:
    """Custom resources against their CRD's openAPIV3Schema (kubernetes-validate has no schema for them)."""
    group, _, version = manifest["apiVersion"].partition("/")
    for crd in crd_documents():
        spec = crd["spec"]
        if spec["group"] == group and spec["names"]["kind"] == manifest["kind"]:
            served = {v["name"]: v for v in spec["versions"]}
            assert version in served, f"{manifest['kind']} {version} is not served by the CRD"
            schema = dict(served[version]["schema"]["openAPIV3Schema"])
            body = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind", "metadata")}
            jsonschema.validate(body, schema)
            return
    # The CRD is not in the chart yet (crds/brokergroups.yaml not written): the kind must be ours.
    assert group == "rmq.brokergroup.dev" and manifest["kind"] == "BrokerGroup", manifest["apiVersion"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint_strict(tools: tooling.Tools, tmp_path: Path, variant: str) -> None:
    proc = run_helm(tools.helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE,
                    *values_args(tmp_path, VARIANTS[variant]))
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_objects_are_valid(render: Render, variant: str) -> None:
    manifests = render(VARIANTS[variant], include_crds=True)
    assert manifests
    for manifest in manifests:
        if manifest["apiVersion"].startswith("rmq.brokergroup.dev/"):
            validate_custom(manifest)
        else:
            validate_builtin(manifest)


def test_validation_is_strict(render: Render) -> None:
    """Guard against a validator that accepts anything: an unknown field must be rejected."""
    deployment = one(render(), "Deployment", FULLNAME)
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(AssertionError, match="livenessProbes"):
        validate_builtin(deployment)


def test_default_install(render: Render) -> None:
    manifests = render()
    kinds = sorted(m["kind"] for m in manifests)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "Service", "ServiceAccount"]
    deployment = one(manifests, "Deployment", FULLNAME)
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == FULLNAME
    c = container(manifests)
    assert c["image"] == "rmq-brokergroup:0.1.0"
    assert c["command"] == ["rmq-operator"]
    # rmq-operator's CLI (operator/rmqoperator/main.py): no --namespace = every namespace.
    assert c["args"] == ["--liveness-port=8081", "--metrics-port=8080"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8081, "metrics": 8080}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    env = {e["name"]: e for e in c["env"]}
    assert env["RMQ_OPERATOR_DEFAULT_IMAGE"]["value"] == "rmq-brokergroup:0.1.0"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    service = one(manifests, "Service", f"{FULLNAME}-metrics")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert not find(manifests, "BrokerGroup"), "the example BrokerGroup is off by default"
    assert not find(manifests, "NetworkPolicy"), "NetworkPolicies are off by default"


def test_security_contexts(render: Render) -> None:
    manifests = render()
    pod = one(manifests, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(manifests)["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    mounts = {m["mountPath"] for m in container(manifests)["volumeMounts"]}
    assert "/tmp" in mounts, "a read-only root needs a writable /tmp"


def test_cluster_rbac_is_least_privilege(render: Render) -> None:
    manifests = render()
    role = one(manifests, "ClusterRole", FULLNAME)
    assert rule_table(role) == {**NAMESPACED_RULES, **NAMESPACES_WATCH, **CRD_READ}
    binding = one(manifests, "ClusterRoleBinding", FULLNAME)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": FULLNAME}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]


def test_namespaced_rbac(render: Render) -> None:
    manifests = render(NAMESPACED)
    roles = find(manifests, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert rule_table(role) == NAMESPACED_RULES
    bindings = find(manifests, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    # The only cluster-wide grant left is read access to CRDs (kopf's discovery).
    (cluster_role,) = find(manifests, "ClusterRole")
    assert rule_table(cluster_role) == CRD_READ
    (cluster_binding,) = find(manifests, "ClusterRoleBinding")
    assert cluster_binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    args = container(manifests)["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


def test_namespaced_rbac_defaults_to_release_namespace_and_can_drop_cluster_grants(render: Render) -> None:
    manifests = render({"rbac": {"namespaced": True, "crdDiscovery": False}})
    assert [r["metadata"]["namespace"] for r in find(manifests, "Role")] == [NAMESPACE]
    assert not find(manifests, "ClusterRole") and not find(manifests, "ClusterRoleBinding")
    assert f"--namespace={NAMESPACE}" in container(manifests)["args"]


def test_rbac_can_be_disabled(render: Render) -> None:
    manifests = render({"rbac": {"create": False}})
    assert not {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"} & {m["kind"] for m in manifests}


def test_custom_values(render: Render) -> None:
    manifests = render(CUSTOM)
    c = container(manifests)
    assert c["image"] == "registry.example/rmq/brokergroup:1.2.3"
    assert c["imagePullPolicy"] == "Always"
    assert c["resources"] == CUSTOM["resources"]
    assert c["args"][-1] == "--log-level=DEBUG"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["RMQ_LOG_LEVEL"] == "DEBUG" and env["EXTRA"] == "1"
    assert env["RMQ_OPERATOR_DEFAULT_IMAGE"] == "registry.example/rmq/brokergroup:1.2.3"
    pod = one(manifests, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "custom-sa"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == CUSTOM["tolerations"]
    assert one(manifests, "ServiceAccount", "custom-sa")["metadata"]["annotations"] == {"example.com/role": "x"}
    assert not find(manifests, "Service"), "metrics Service disabled"


def test_network_policies(render: Render) -> None:
    manifests = render(NETWORK_POLICY)
    policies = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in find(manifests, "NetworkPolicy")}
    assert sorted(policies) == [(NAMESPACE, "broker-a-broker"), (NAMESPACE, "broker-a-namesrv"),
                                ("team-b", "broker-b-broker")]
    group_pods = {"podSelector": {"matchLabels": {"rmq.brokergroup.dev/group": "broker-a"}}}
    default_clients = [{"podSelector": {"matchLabels": {"rmq.brokergroup.dev/client": "true"}}}]

    broker = policies[(NAMESPACE, "broker-a-broker")]["spec"]
    assert broker["podSelector"]["matchLabels"] == {"rmq.brokergroup.dev/group": "broker-a",
                                                    "app.kubernetes.io/component": "broker"}
    assert broker["policyTypes"] == ["Ingress"]
    allowed: dict[int, list[dict[str, Any]]] = {}
    for rule in broker["ingress"]:
        for port in rule["ports"]:
            allowed.setdefault(port["port"], []).extend(rule["from"])
    assert allowed[10912] == [group_pods], "HA port: only the group's own pods"
    assert allowed[10911] == [group_pods, *default_clients], "remoting: the group and its clients"
    assert allowed[10909] == allowed[10911], "the VIP channel (remoting - 2) as remoting"
    operator_peer, verify_peer = allowed[10916]
    assert operator_peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    assert operator_peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "rmq-operator",
                                                           "app.kubernetes.io/instance": RELEASE}
    # The group's verification Job reads every broker's admin port; its pods carry these labels.
    assert verify_peer == {"podSelector": {"matchLabels": {"rmq.brokergroup.dev/group": "broker-a",
                                                           "app.kubernetes.io/component": "verification"}}}
    from types import SimpleNamespace

    from rmqoperator import builders

    pod_labels = builders.labels(SimpleNamespace(name="broker-a"), "verification")  # type: ignore[arg-type]
    assert verify_peer["podSelector"]["matchLabels"].items() <= pod_labels.items()

    namesrv = policies[(NAMESPACE, "broker-a-namesrv")]["spec"]
    assert namesrv["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "namesrv"
    (rule,) = namesrv["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9876}]
    assert rule["from"] == [group_pods, *default_clients]

    other = policies[("team-b", "broker-b-broker")]["spec"]
    remoting_peers = [peer for r in other["ingress"] if any(p["port"] == 10911 for p in r["ports"])
                      for peer in r["from"]]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}} in remoting_peers
    assert {"ipBlock": {"cidr": "10.0.0.0/8"}} in remoting_peers, "extraIngress is appended"


def test_example_brokergroup(render: Render) -> None:
    manifests = render({"exampleBrokerGroup": {"enabled": True}})
    group = one(manifests, "BrokerGroup", "broker-a")
    assert group["apiVersion"] == "rmq.brokergroup.dev/v1alpha1"
    assert group["metadata"]["namespace"] == NAMESPACE
    example = yaml.safe_load((tooling.REPO_ROOT / "examples" / "brokergroup.yaml").read_text())
    assert group["spec"]["replicas"] == 3 and group["spec"]["replication"] == "SYNC"
    assert set(group["spec"]) <= set(example["spec"]) | {"replicas", "replication"}
    validate_custom(group)


def test_values_schema(tools: tooling.Tools, tmp_path: Path) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(defaults, schema)
    for variant in VARIANTS.values():
        if variant:
            jsonschema.validate({**defaults, **variant}, schema)
    bad_values: list[dict[str, Any]] = [
        {"image": {"repository": "x", "pullPolicy": "Sometimes"}},
        {"rbac": {"namespaced": "yes"}},
        {"operator": {"watchNamespaces": ["Not_A_Namespace"]}},
        {"securityContext": {"runAsNonRoot": False}},
        {"networkPolicy": {"ports": {"remoting": 70000, "ha": 1, "admin": 1, "namesrv": 1}}},
        {"unknownKey": True},
    ]
    for bad in bad_values:
        proc = run_helm(tools.helm, "template", RELEASE, str(CHART), *values_args(tmp_path, bad), check=False)
        assert proc.returncode != 0, f"helm accepted invalid values {bad}"
        assert "schema" in proc.stderr.lower(), proc.stderr


def test_chart_matches_the_operator(render: Render) -> None:
    """Flags, labels and ports the chart assumes are the ones rmq-operator and the CRD define."""
    import subprocess
    import sys

    from rmqoperator import builders, k8s

    helptext = subprocess.run([sys.executable, "-m", "rmqoperator.main", "--help"], capture_output=True,
                              text=True, timeout=60, check=True).stdout
    manifests = render({**NAMESPACED, **CUSTOM})
    for arg in container(manifests)["args"]:
        flag = arg.split("=", 1)[0]
        assert flag in helptext, f"rmq-operator does not accept {flag}"
    # Every resource the operator's API module touches is granted.
    granted = rule_table(one(render(), "ClusterRole", FULLNAME))
    for (api_version, _kind), plural in k8s.PLURALS.items():
        group = api_version.rpartition("/")[0] if "/" in api_version else ""
        assert granted.get((group, plural)), f"{group}/{plural} is used by rmqoperator.k8s but not granted"
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["networkPolicy"]
    assert defaults["groupLabel"] == builders.GROUP_LABEL
    assert defaults["componentLabel"] == "app.kubernetes.io/component"
    crd = next(c for c in crd_documents() if c["spec"]["names"]["kind"] == "BrokerGroup")
    ports = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["ports"]
    crd_ports = {k: v["default"] for k, v in ports["properties"].items()}
    assert defaults["ports"] == {"remoting": crd_ports["listen"], "ha": crd_ports["ha"],
                                 "admin": crd_ports["admin"], "namesrv": crd_ports["nameServer"]}
