"""The BrokerGroup CRD: accepts the example, rejects invalid specs, agrees with the operator's defaults."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml

from rmqoperator.spec import GroupSpec, parse_spec
from tests.operator.conftest import EXAMPLE, example
from tests.operator.emulator import CRD_PATH

CRD = yaml.safe_load(CRD_PATH.read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """What the API server does with ``default``: fill absent properties, recursively."""
    if not isinstance(value, dict) or schema.get("type") != "object":
        return value
    out = dict(value)
    for key, sub in (schema.get("properties") or {}).items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        if key in out:
            out[key] = apply_defaults(sub, out[key])
    return out


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for key, sub in (schema.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def test_crd_identity_and_printer_columns() -> None:
    assert CRD["apiVersion"] == "apiextensions.k8s.io/v1"
    assert CRD["metadata"]["name"] == "brokergroups.rmq.brokergroup.dev"
    spec = CRD["spec"]
    assert (spec["group"], spec["scope"]) == ("rmq.brokergroup.dev", "Namespaced")
    assert spec["names"]["kind"] == "BrokerGroup" and spec["names"]["plural"] == "brokergroups"
    assert spec["names"]["shortNames"] == ["bg"]
    assert VERSION["name"] == "v1alpha1" and VERSION["served"] and VERSION["storage"]
    assert VERSION["subresources"]["status"] == {}
    # kubectl scale: every path of the scale subresource names a field of the schema, of its type.
    scale = VERSION["subresources"]["scale"]
    for key, kind in (("specReplicasPath", "integer"), ("statusReplicasPath", "integer"),
                      ("labelSelectorPath", "string")):
        node = SCHEMA
        for part in scale[key].lstrip(".").split("."):
            node = node["properties"][part]
        assert node["type"] == kind, key
    columns = [c["name"] for c in VERSION["additionalPrinterColumns"] if c.get("priority", 0) == 0]
    assert columns == ["Ready", "Master", "Replicas", "In-Sync", "Max Lag", "Age"]


def test_schema_is_structural() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    for path, node in walk(SCHEMA):
        if node.get("x-kubernetes-int-or-string"):
            assert node.get("anyOf") == [{"type": "integer"}, {"type": "string"}], path
            continue
        assert "type" in node, f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        if "default" in node:
            jsonschema.validate(node["default"], node)  # a default must satisfy its own schema
        # value validations inside oneOf/anyOf may not declare types or defaults (structural rule)
        for branch in node.get("oneOf", []):
            assert set(branch) <= {"required"}, path


def test_example_validates_and_local_runner_reads_it() -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    VALIDATOR.validate(doc)
    from rmqbroker.local import load_manifest

    local = load_manifest(EXAMPLE)
    spec = parse_spec(apply_defaults(SCHEMA, doc))
    assert (local.replicas, local.replication, local.master_discovery) == (
        spec.replicas, spec.replication, spec.master_discovery)
    # rmq-local fails over by the same spec, with the CRD's defaults.
    assert (local.failover.enabled, local.failover.master_lost_seconds, local.failover.allow_data_loss) == (
        spec.failover.enabled, spec.failover.master_lost_seconds, spec.failover.allow_data_loss)


def test_cluster_example_validates_and_parses() -> None:
    """examples/cluster.yaml: two groups, the second registering with the first's nameserver pods."""
    docs = [d for d in yaml.safe_load_all((EXAMPLE.parent / "cluster.yaml").read_text()) if d]
    specs = []
    for doc in docs:
        VALIDATOR.validate(doc)
        doc["metadata"] |= {"namespace": "default", "uid": "u"}
        specs.append(parse_spec(apply_defaults(SCHEMA, doc)))
    a, b = specs
    assert (a.name, b.name) == ("broker-a", "broker-b") and a.cluster_name == b.cluster_name
    assert a.name_server.managed and not b.name_server.managed
    assert b.name_server.addresses == tuple(
        f"broker-a-namesrv-{i}.broker-a-namesrv-headless.default.svc:9876" for i in range(a.name_server.replicas))


def test_schema_defaults_match_operator_defaults() -> None:
    bare = {"apiVersion": "rmq.brokergroup.dev/v1alpha1", "kind": "BrokerGroup",
            "metadata": {"name": "g", "namespace": "ns", "uid": "u"}, "spec": {}}
    defaulted = apply_defaults(SCHEMA, bare)
    VALIDATOR.validate(defaulted)
    assert defaulted["spec"]["replicas"] == 2
    assert defaulted["spec"]["nameServer"] == {"managed": {"replicas": 1}}
    assert parse_spec(defaulted) == parse_spec(bare)
    assert parse_spec(bare) == GroupSpec(name="g", namespace="ns", uid="u", broker_name="g")


# Nameserver addresses the broker's namesrvAddr parser refuses and the CRD pattern must refuse too.
BAD_ADDRESSES = ["999.1.1.1:9876", "256.0.0.1:9876", "10.0.0:9876", "1.2.3.4.5:9876", "010.0.0.1:9876",
                 "ns.1:9876", "12345:9876", "ns:0", "ns:65536", "ns:99999", "ns:", ":9876", "-ns:9876",
                 "ns-:9876", "ns..example:9876", ".ns:9876", "ns_1:9876", "ns example:9876", "[::1]:9876",
                 f"{'n' * 64}:9876"]


def address_schema_accepts(address: str) -> bool:
    return VALIDATOR.is_valid(example(nameServer={"addresses": [address]}))


def test_bad_addresses_are_refused_by_the_broker_too() -> None:
    """BAD_ADDRESSES really are what the broker refuses (so the pattern is no stricter than needed there)."""
    from rmqbroker.config import ConfigError, build_settings

    for address in BAD_ADDRESSES:
        with pytest.raises(ConfigError, match=r"^namesrvAddr: "):
            build_settings(env={}, overrides={"brokerName": "b", "namesrvAddr": address})


def test_address_pattern_never_accepts_what_the_broker_refuses() -> None:
    """Whatever the pattern lets through the operator accepts, except what a regex cannot express
    (label and name lengths): the operator's own check reports those against the list item."""
    from rmqoperator.spec import problems

    hosts = ["a", "ns", "ns-1", "1a", "a1", "1-1", "1a1", "x.y", "x.1", "1.x", "a.b.c.d", "10.0.0.1", "1.2.3",
             "0.0.0.0", "255.255.255.255", "256.1.1.1", "01.1.1.1", "ns.", "1.2.3.4.", "-a", "a-", "a..b",
             "n" * 63, f"x.{'n' * 63}", f"x.{'1' + 'n' * 63}", f"{'1' + 'n' * 62 + '1'}", ".".join(["n" * 63] * 4)]
    ports = ["1", "80", "9876", "65535", "65536", "0", "080"]
    for address in (f"{h}:{p}" for h in hosts for p in ports):
        if not address_schema_accepts(address):
            continue
        spec = parse_spec(apply_defaults(SCHEMA, example(nameServer={"addresses": ["10.0.0.1:9876", address]})))
        found = problems(spec)
        host = address.rpartition(":")[0].rstrip(".")
        beyond_regex = len(host) > 253 or any(len(label) > 63 for label in host.split("."))
        assert all(f.startswith("spec.nameServer.addresses[1]: ") for f in found), (address, found)
        assert bool(found) == beyond_regex, (address, found)


@pytest.mark.parametrize("spec", [
    {"nameServer": {"addresses": ["10.0.0.1:9876", "ns.example.com:9876"]}},
    {"nameServer": {"addresses": ["0.0.0.0:1", "255.255.255.255:65535", "ns.example.com.:9876", "n1:80",
                                  "1a1.x-1:9876", "ns-0.ns-headless.prod.svc.cluster.local:9876"]}},
    {"replicas": 5, "replication": "ASYNC", "masterDiscovery": "NameServer"},
    {"resources": {"requests": {"cpu": "500m", "memory": 1073741824}, "limits": {"memory": "2Gi"}}},
    {"storage": {"size": "1.5Ti", "storageClassName": "fast"}},
    {"verification": {"schedule": "0 3 * * *", "image": "x:1", "resources": {"limits": {"cpu": 2}}}},
    {"verification": {"schedule": "@daily"}},
    {"failover": {"enabled": False, "masterLostSeconds": 3600, "allowDataLoss": True}},
    {"acl": {"secretName": "rmq-acl.v2"}},
    {"tls": {"secretName": "rmq-tls"}},
    {"tls": {"secretName": "rmq-tls", "mode": "permissive", "clientAuth": "require"}},
    {"scheduling": {"podAntiAffinity": "None"}},
    {"scheduling": {
        "podAntiAffinity": "Required", "topologyKey": "topology.kubernetes.io/zone",
        "nodeSelector": {"pool": "mq"}, "priorityClassName": "mq-critical",
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "mq", "effect": "NoSchedule"},
                        {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}],
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-9"]}]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}]}}},
    {"imagePullSecrets": [{"name": "registry-creds"}], "podAnnotations": {"prometheus.io/scrape": "true"},
     "podLabels": {"team": "payments"}},
])
def test_valid_variants(spec: dict[str, Any]) -> None:
    VALIDATOR.validate(example(**spec))


@pytest.mark.parametrize(("spec", "where"), [
    ({"replicas": 0}, "replicas"),
    ({"replicas": 6}, "replicas"),
    ({"replicas": "3"}, "replicas"),
    ({"replication": "sync"}, "replication"),
    ({"flushDiskType": "NEVER"}, "flushDiskType"),
    ({"masterDiscovery": "DNS"}, "masterDiscovery"),
    ({"brokerName": "broker.a"}, "brokerName"),
    ({"clusterName": ""}, "clusterName"),
    ({"nameServer": {}}, "nameServer"),
    ({"nameServer": {"managed": {}, "addresses": ["a:1"]}}, "nameServer"),
    ({"nameServer": {"addresses": []}}, "addresses"),
    ({"nameServer": {"addresses": ["no-port"]}}, "addresses"),
    *[({"nameServer": {"addresses": ["10.0.0.1:9876", bad]}}, "addresses") for bad in BAD_ADDRESSES],
    ({"nameServer": {"managed": {"replicas": 9}}}, "replicas"),
    ({"brokerConfig": {"defaultTopicQueueNums": 4}}, "brokerConfig"),
    ({"failover": {"masterLostSeconds": 0}}, "masterLostSeconds"),
    ({"failover": {"enabled": "yes"}}, "enabled"),
    ({"storage": {"size": "10 GB"}}, "size"),
    ({"ports": {"admin": 70000}}, "admin"),
    ({"imagePullPolicy": "Sometimes"}, "imagePullPolicy"),
    ({"verification": {"schedule": "daily"}}, "schedule"),
    ({"acl": {}}, "secretName"),
    ({"acl": {"secretName": "Rmq_ACL"}}, "secretName"),
    ({"tls": {"mode": "enforcing"}}, "secretName"),
    ({"tls": {"secretName": "rmq-tls", "mode": "disabled"}}, "mode"),
    ({"tls": {"secretName": "rmq-tls", "clientAuth": "always"}}, "clientAuth"),
    ({"scheduling": {"podAntiAffinity": "Sometimes"}}, "podAntiAffinity"),
    ({"scheduling": {"topologyKey": ""}}, "topologyKey"),
    ({"scheduling": {"nodeSelector": {"pool": 1}}}, "nodeSelector"),
    ({"scheduling": {"tolerations": [{"operator": "Maybe"}]}}, "operator"),
    ({"scheduling": {"tolerations": [{"effect": "NoRun"}]}}, "effect"),
    ({"scheduling": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}},
     "nodeSelectorTerms"),
    ({"scheduling": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 0, "preference": {}}]}}}, "weight"),
    ({"scheduling": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "disk", "operator": "Like"}]}]}}}}, "operator"),
    ({"scheduling": {"priorityClassName": ""}}, "priorityClassName"),
    ({"imagePullSecrets": [{}]}, "name"),
    ({"imagePullSecrets": [{"name": ""}]}, "name"),
    ({"podLabels": {"team": 1}}, "podLabels"),
    ({"podLabels": {"team": "x" * 64}}, "podLabels"),
    ({"podAnnotations": {"a": True}}, "podAnnotations"),
])
def test_invalid_specs_are_rejected(spec: dict[str, Any], where: str) -> None:
    errors = list(VALIDATOR.iter_errors(example(**spec)))
    assert errors, f"{spec} was accepted"
    assert any(where in "/".join(map(str, e.absolute_path)) or where in e.message for e in errors), errors
