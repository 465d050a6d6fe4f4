"""Builders: the rendered children for each spec variant (pure functions, no API server)."""

from __future__ import annotations

import base64
import dataclasses
import json
import ssl
from pathlib import Path
from typing import Any

import pytest

from rmqbroker.config import build_settings, env_name
from rmqbroker.properties import parse_properties
from rmqbroker.remoting import tls
from rmqoperator import builders
from rmqoperator.reconcile import complete_assignment
from rmqoperator.spec import GroupSpec, SpecError, parse_spec, problems
from rmqoperator.verification import VerificationSpec
from tests.operator.conftest import example
from tests.support.certs import TestCA


def spec_of(**fields: Any) -> GroupSpec:
    doc = example(**fields)
    doc["metadata"].update(namespace="prod", uid="uid-1")
    return parse_spec(doc)


def by_kind(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def test_every_broker_conf_carries_the_groups_epoch_without_a_restart() -> None:
    spec = spec_of(replicas=3)
    before = builders.config_hash(spec)
    cm = builders.config_map(spec, {0: 1, 1: 0, 2: 2}, epoch=4)
    for i in range(3):
        text = cm["data"][f"broker-{i}.conf"]
        assert parse_properties(text)["haGroupEpoch"] == "4"
        assert build_settings(text, env={}).haGroupEpoch == 4
    assert builders.config_hash(spec) == before  # a failover's new epoch rolls no pod
    assert "operator-managed keys: haGroupEpoch" in "; ".join(problems(spec_of(brokerConfig={"haGroupEpoch": "9"})))


@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("replication", ["SYNC", "ASYNC"])
@pytest.mark.parametrize("discovery", ["Direct", "NameServer"])
def test_broker_confs_per_variant(replicas: int, replication: str, discovery: str) -> None:
    spec = spec_of(replicas=replicas, replication=replication, masterDiscovery=discovery)
    assert problems(spec) == []
    cm = builders.config_map(spec, complete_assignment({}, replicas))
    assert sorted(cm["data"]) == [f"broker-{i}.conf" for i in range(replicas)]
    for i in range(replicas):
        text = cm["data"][f"broker-{i}.conf"]
        conf = parse_properties(text)
        settings = build_settings(text, env={})  # the broker itself accepts it
        assert settings.brokerName == "broker-a"
        assert conf["brokerId"] == str(i)
        expected_role = ("SYNC_MASTER" if replication == "SYNC" else "ASYNC_MASTER") if i == 0 else "SLAVE"
        assert conf["brokerRole"] == expected_role
        if i > 0 and discovery == "Direct":
            assert conf["haMasterAddress"] == "broker-a-0.broker-a-headless.prod.svc:10912"
        else:
            assert "haMasterAddress" not in conf
        assert conf["namesrvAddr"] == "broker-a-namesrv-0.broker-a-namesrv-headless.prod.svc:9876"
        assert conf["adminListenPort"] == "10916"
        assert conf["adminTokenFile"] == "/etc/rmq/admin/token"
        assert conf["storePathRootDir"] == "/data/store"
        assert "brokerIP1" not in conf  # from the pod IP, through the environment
        assert conf["defaultTopicQueueNums"] == "4" and conf["autoCreateTopicEnable"] == "true"
    sts = builders.broker_statefulset(spec, replicas)
    assert sts["spec"]["replicas"] == replicas


def test_children_with_managed_nameservers() -> None:
    spec = spec_of(replicas=3, nameServer={"managed": {"replicas": 2}})
    objs = builders.children(spec, complete_assignment({}, 3), 3)
    kinds = by_kind(objs)
    assert set(kinds) == {
        ("Service", "broker-a-namesrv-headless"), ("Service", "broker-a-namesrv"),
        ("StatefulSet", "broker-a-namesrv"), ("PodDisruptionBudget", "broker-a-namesrv"),
        ("ConfigMap", "broker-a-config"), ("Service", "broker-a-headless"), ("StatefulSet", "broker-a"),
        ("PodDisruptionBudget", "broker-a")}
    for o in objs:
        assert o["metadata"]["namespace"] == "prod"
        assert o["metadata"]["ownerReferences"] == [{
            "apiVersion": "rmq.brokergroup.dev/v1alpha1", "kind": "BrokerGroup", "name": "broker-a",
            "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]
        assert o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rmq-operator"
    ns_sts = kinds[("StatefulSet", "broker-a-namesrv")]
    assert ns_sts["spec"]["replicas"] == 2
    assert ns_sts["spec"]["template"]["spec"]["containers"][0]["command"] == ["rmq-namesrv"]
    assert kinds[("Service", "broker-a-namesrv-headless")]["spec"]["clusterIP"] == "None"
    conf = parse_properties(kinds[("ConfigMap", "broker-a-config")]["data"]["broker-0.conf"])
    assert conf["namesrvAddr"] == ("broker-a-namesrv-0.broker-a-namesrv-headless.prod.svc:9876;"
                                   "broker-a-namesrv-1.broker-a-namesrv-headless.prod.svc:9876")
    for pdb in (kinds[("PodDisruptionBudget", "broker-a")], kinds[("PodDisruptionBudget", "broker-a-namesrv")]):
        assert pdb["spec"]["maxUnavailable"] == 1


def test_namesrv_kv_config_on_a_writable_volume() -> None:
    """The root filesystem is read-only: the nameserver's kvConfig.json must be on an emptyDir."""
    pod = builders.namesrv_statefulset(spec_of(nameServer={"managed": {"replicas": 1}}))["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    args = container["args"]
    path = args[args.index("--kv-config-path") + 1]
    writable = {m["mountPath"] for m in container["volumeMounts"]
                if "emptyDir" in next(v for v in pod["volumes"] if v["name"] == m["name"])}
    assert any(path.startswith(mount.rstrip("/") + "/") for mount in writable), (path, writable)


def test_children_with_external_nameservers() -> None:
    spec = spec_of(nameServer={"addresses": ["10.1.0.5:9876", "ns2.example.com:9876"]})
    kinds = by_kind(builders.children(spec, complete_assignment({}, 2), 2))
    assert not [k for k in kinds if "namesrv" in k[1]]
    conf = parse_properties(kinds[("ConfigMap", "broker-a-config")]["data"]["broker-1.conf"])
    assert conf["namesrvAddr"] == "10.1.0.5:9876;ns2.example.com:9876"


def test_broker_statefulset_pod_template() -> None:
    spec = spec_of(replicas=3, image="reg/rmq:1.2", resources={"limits": {"memory": "2Gi"}},
                   storage={"size": "50Gi", "storageClassName": "ssd"})
    sts = builders.broker_statefulset(spec, 3)
    s = sts["spec"]
    assert s["updateStrategy"] == {"type": "OnDelete"}
    assert s["serviceName"] == "broker-a-headless"
    assert s["selector"]["matchLabels"].items() <= s["template"]["metadata"]["labels"].items()
    pvc = s["volumeClaimTemplates"][0]
    assert pvc["metadata"]["name"] == "data"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "50Gi" and pvc["spec"]["storageClassName"] == "ssd"
    pod = s["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == "reg/rmq:1.2" and c["resources"] == {"limits": {"memory": "2Gi"}}
    assert c["command"] == ["rmq-broker"] and c["args"] == ["-c", "/etc/rmq/conf/broker-$(POD_ORDINAL).conf"]
    env = {e["name"]: e for e in c["env"]}
    assert builders.BROKER_IP_ENV == env_name("brokerIP1") == "RMQ_BROKER_BROKER_IP1"
    assert env["RMQ_BROKER_BROKER_IP1"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["POD_ORDINAL"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"remoting": 10911, "ha": 10912, "admin": 10916,
                                                                          "vip": 10909}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    # A long recovery is not killed: the startup probe allows 30 minutes before liveness applies.
    startup = c["startupProbe"]
    assert startup["httpGet"] == c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert "initialDelaySeconds" not in c["livenessProbe"]
    # Least privilege: neither brokers nor nameservers get an API token.
    assert pod["automountServiceAccountToken"] is False
    assert builders.namesrv_statefulset(spec)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and pod["securityContext"]["runAsNonRoot"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["conf"]["configMap"]["name"] == "broker-a-config"
    assert volumes["admin-token"]["secret"]["secretName"] == "broker-a-admin-token"
    assert s["template"]["metadata"]["annotations"][builders.CONFIG_HASH_ANNOTATION] == builders.config_hash(spec)


def test_acl_secret_mounts_the_file_and_turns_the_acl_on() -> None:
    """spec.acl.secretName: the Secret's plain_acl.yml is mounted read-only, the conf points the
    broker at it, and the slaves' signing account comes from the same Secret as optional env."""
    plain = spec_of(replicas=2)
    spec = spec_of(replicas=2, acl={"secretName": "rmq-acl"})
    assert spec.acl_secret == "rmq-acl" and problems(spec) == []
    conf = builders.render_broker_conf(spec, 1, 1, 0)
    settings = build_settings(conf, env={"RMQ_BROKER_ACL_ACCESS_KEY": "sync-user",
                                         "RMQ_BROKER_ACL_SECRET_KEY": "sync-secret"})
    assert settings.aclEnable and str(settings.acl_path) == "/etc/rmq/acl/plain_acl.yml"
    assert (settings.aclAccessKey, settings.aclSecretKey) == ("sync-user", "sync-secret")
    assert not build_settings(builders.render_broker_conf(plain, 1, 1, 0), env={}).aclEnable
    pod = builders.broker_statefulset(spec, 2)["spec"]["template"]["spec"]
    volume = {v["name"]: v for v in pod["volumes"]}["acl"]["secret"]
    assert volume["secretName"] == "rmq-acl" and volume["items"] == [{"key": "plain_acl.yml", "path": "plain_acl.yml"}]
    c = pod["containers"][0]
    assert {"name": "acl", "mountPath": "/etc/rmq/acl", "readOnly": True} in c["volumeMounts"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert env == {env_name("aclAccessKey"): {"name": "rmq-acl", "key": "accessKey", "optional": True},
                   env_name("aclSecretKey"): {"name": "rmq-acl", "key": "secretKey", "optional": True}}
    plain_pod = builders.broker_statefulset(plain, 2)["spec"]["template"]["spec"]
    assert "acl" not in {v["name"] for v in plain_pod["volumes"]}
    # Turning the ACL on, or pointing it at another Secret, restarts the brokers; no ACL keeps the old hash.
    hashes = {builders.config_hash(s) for s in (plain, spec, dataclasses.replace(spec, acl_secret="other"))}
    assert len(hashes) == 3


def test_tls_secret_mounts_certificates_and_renders_tls_properties(tmp_path: Path) -> None:
    """spec.tls: brokers and managed nameservers mount the Secret and read a tls.properties that
    RocketMQ's loader accepts; brokers connect over TLS themselves; a change rolls both."""
    plain = spec_of(replicas=2)
    spec = spec_of(replicas=2, tls={"secretName": "rmq-tls", "clientAuth": "require"})
    assert (spec.tls_secret, spec.tls_mode, spec.tls_client_auth) == ("rmq-tls", "enforcing", "require")
    assert problems(spec) == []
    settings = build_settings(builders.render_broker_conf(spec, 1, 1, 0), env={})
    assert (settings.tlsServerMode, settings.tlsEnable) == ("enforcing", True)
    assert settings.tlsConfigFile == "/etc/rmq/conf/tls.properties"
    plain_settings = build_settings(builders.render_broker_conf(plain, 1, 1, 0), env={})
    assert (plain_settings.tlsServerMode, plain_settings.tlsEnable) == ("permissive", False)

    data = builders.config_map(spec, complete_assignment({}, 2))["data"]
    assert "tls.properties" not in builders.config_map(plain, complete_assignment({}, 2))["data"]
    # The rendered file with the Secret's files where the pod would mount them: the broker's own
    # loader takes it, and requires (and verifies) client certificates from the CA.
    ca = TestCA(tmp_path / "secret")
    leaf = ca.issue("broker-a")
    leaf.cert.rename(tmp_path / "secret" / "tls.crt")
    leaf.key.rename(tmp_path / "secret" / "tls.key")
    props = tmp_path / "tls.properties"
    props.write_text(data["tls.properties"].replace("/etc/rmq/tls/", f"{tmp_path / 'secret'}/"))
    loaded = tls.load_settings(settings.tlsServerMode, settings.tlsEnable, str(props))
    assert not loaded.test_mode and loaded.server_need_client_auth == "require"
    assert tls.server_context(loaded).verify_mode == ssl.CERT_REQUIRED
    client = tls.client_context(loaded)
    assert client is not None and client.verify_mode == ssl.CERT_REQUIRED

    for component, pod in _pod_specs(spec).items():
        volume = {v["name"]: v for v in pod["volumes"]}["tls"]["secret"]
        assert volume["secretName"] == "rmq-tls"
        assert [i["key"] for i in volume["items"]] == ["tls.crt", "tls.key", "ca.crt"], component
        assert {"name": "tls", "mountPath": "/etc/rmq/tls", "readOnly": True} in pod["containers"][0]["volumeMounts"]
    args = _pod_specs(spec)["namesrv"]["containers"][0]["args"]
    assert args[args.index("--tls-server-mode") + 1] == "enforcing"
    assert args[args.index("--tls-config-file") + 1] == "/etc/rmq/conf/tls.properties"
    for component, pod in _pod_specs(plain).items():
        assert "tls" not in {v["name"] for v in pod["volumes"]}, component
    # Turning TLS on, or changing its Secret or mode, restarts brokers and rolls nameservers.
    variants = (plain, spec, dataclasses.replace(spec, tls_secret="other"),
                dataclasses.replace(spec, tls_mode="permissive"))
    assert len({builders.config_hash(s) for s in variants}) == 4
    templates = [builders.namesrv_statefulset(s)["spec"]["template"] for s in variants]
    assert len({json.dumps(t, sort_keys=True) for t in templates}) == 4


def test_services_and_secret() -> None:
    spec = spec_of()
    svc = builders.broker_headless_service(spec)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert {p["name"] for p in svc["spec"]["ports"]} == {"remoting", "ha", "admin", "vip"}
    secret = builders.admin_secret(spec, "s3cret")
    assert base64.b64decode(secret["data"]["token"]) == b"s3cret"


def test_conf_follows_the_role_assignment_after_a_failover() -> None:
    spec = spec_of(replicas=3, replication="SYNC")
    cm = builders.config_map(spec, {0: 1, 1: 0, 2: 2})  # pod 1 was promoted, pod 0 took its id
    confs = {k: parse_properties(v) for k, v in cm["data"].items()}
    assert (confs["broker-1.conf"]["brokerId"], confs["broker-1.conf"]["brokerRole"]) == ("0", "SYNC_MASTER")
    assert "haMasterAddress" not in confs["broker-1.conf"]
    for k in ("broker-0.conf", "broker-2.conf"):
        assert confs[k]["brokerRole"] == "SLAVE"
        assert confs[k]["haMasterAddress"] == "broker-a-1.broker-a-headless.prod.svc:10912"
    assert confs["broker-0.conf"]["brokerId"] == "1"
    assert GroupSpec.from_json(cm["metadata"]["annotations"][builders.APPLIED_SPEC_ANNOTATION]) == spec


def test_config_hash_tracks_what_needs_a_restart() -> None:
    base = spec_of(replicas=3)
    h = builders.config_hash(base)
    same = [dataclasses.replace(base, replicas=5), dataclasses.replace(base, replication="SYNC"),
            dataclasses.replace(base, failover=dataclasses.replace(base.failover, master_lost_seconds=5))]
    for s in same:
        assert builders.config_hash(s) == h
    changed = [dataclasses.replace(base, image="other:2"),
               dataclasses.replace(base, resources={"limits": {"cpu": "1"}}),
               dataclasses.replace(base, broker_config={**base.broker_config, "maxMessageSize": "1024"}),
               dataclasses.replace(base, restart_at="2026-11-22T10:00:00Z"),
               dataclasses.replace(base, master_discovery="NameServer"),
               dataclasses.replace(base, flush_disk_type="SYNC_FLUSH")]
    assert len({builders.config_hash(s) for s in changed} | {h}) == len(changed) + 1


@pytest.mark.parametrize(("fields", "message"), [
    ({"brokerConfig": {"brokerRole": "SLAVE"}}, "operator-managed keys: brokerRole"),
    ({"brokerConfig": {"listenPort": "1", "namesrvAddr": "x:1"}}, "listenPort, namesrvAddr"),
    ({"brokerConfig": {"defaultTopicQueueNums": "many"}}, "defaultTopicQueueNums"),
    ({"brokerConfig": {"mappedFileSizeConsumeQueue": "7"}}, "multiple of 20"),
    # A line break or a near-miss key would set a managed key past the check of key names.
    ({"brokerConfig": {"msgTraceTopicName": "T\nbrokerId=0\nbrokerRole=ASYNC_MASTER"}},
     "spec.brokerConfig: msgTraceTopicName: the value may not contain a line break"),
    ({"brokerConfig": {"x": "a\u2028brokerId=0"}}, "x: the value may not contain a line break"),
    ({"brokerConfig": {"brokerId ": "0"}}, "key 'brokerId ' is not a broker.conf key"),
    ({"brokerConfig": {"namesrvAddr\t": "evil:9876"}}, "is not a broker.conf key"),
    ({"brokerConfig": {"tlsServerMode": "disabled"}, "tls": {"secretName": "t"}},
     "spec.brokerConfig may not set keys spec.acl/spec.tls render: tlsServerMode"),
    ({"brokerConfig": {"aclEnable": "false"}, "acl": {"secretName": "a"}}, "spec.acl/spec.tls render: aclEnable"),
    ({"ports": {"listen": 10911, "ha": 10911}}, "must differ"),
    ({"ports": {"listen": 10911, "admin": 10909}}, "must differ"),
    ({"ports": {"listen": 2}}, "above 2"),
    ({"podLabels": {"app.kubernetes.io/name": "x"}}, "spec.podLabels['app.kubernetes.io/name']: the operator sets it"),
    ({"podAnnotations": {"rmq.brokergroup.dev/config-hash": "0"}}, "the operator sets it"),
    ({"podLabels": {"team": "not a value"}}, "is not a label value"),
    ({"podLabels": {"Bad_Prefix/x": "y"}}, "prefix is not a DNS subdomain"),
])
def test_semantic_problems_are_found(fields: dict[str, Any], message: str) -> None:
    found = problems(spec_of(**fields))
    assert found and message in "; ".join(found)


LONG_LABEL = "n" * 64  # one label over RFC 1123's 63: the CRD pattern lets it through, the broker does not


@pytest.mark.parametrize(("addresses", "message"), [
    (["10.0.0.1:9876", "999.1.1.1:9876"],
     "spec.nameServer.addresses[1]: '999.1.1.1:9876': '999.1.1.1' is not a valid IPv4 address"),
    (["ns.example.com:0"], "spec.nameServer.addresses[0]: 'ns.example.com:0': '0' is not a TCP port"),
    (["ns.example.com"], "spec.nameServer.addresses[0]: 'ns.example.com' is not host:port"),
    ([f"ns.{LONG_LABEL}:9876"], f"spec.nameServer.addresses[0]: 'ns.{LONG_LABEL}:9876': "),
    (["ns-a:9876", ""], "spec.nameServer.addresses[1]: '' is not one host:port"),
    (["ns-a:9876;ns-b:9876"], "spec.nameServer.addresses[0]: 'ns-a:9876;ns-b:9876' is not one host:port"),
])
def test_bad_name_server_addresses_are_reported_against_their_field(addresses: list[str], message: str) -> None:
    found = problems(spec_of(nameServer={"addresses": addresses}))
    assert len(found) == 1 and found[0].startswith(message), found
    assert "brokerConfig" not in found[0] and "namesrvAddr" not in found[0]


def test_bad_name_server_address_does_not_hide_or_blame_broker_config() -> None:
    found = problems(spec_of(nameServer={"addresses": ["999.1.1.1:9876"]},
                             brokerConfig={"defaultTopicQueueNums": "many"}))
    assert [f.split(":")[0] for f in found] == ["spec.nameServer.addresses[0]", "spec.brokerConfig"], found
    assert "namesrvAddr" not in found[1] and "defaultTopicQueueNums" in found[1]


FULL_SCHEDULING = {
    "podAntiAffinity": "Required", "topologyKey": "topology.kubernetes.io/zone",
    "nodeSelector": {"pool": "mq"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "mq", "effect": "NoSchedule"},
                    {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}],
    "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]},
    "priorityClassName": "mq-critical",
}


POD_EXTRAS = {"imagePullSecrets": [{"name": "registry-creds"}],
              "podAnnotations": {"prometheus.io/scrape": "true", "sidecar.istio.io/inject": "false"},
              "podLabels": {"team": "payments", "example.com/tier": "mq"}}


@pytest.mark.parametrize(("managed", "acl", "scheduling"), [(True, False, False), (False, False, False),
                                                          (True, True, True)])
def test_children_validate_against_kubernetes_schemas(managed: bool, acl: bool, scheduling: bool) -> None:
    """Strict validation of every rendered child (kubernetes-validate; a dev dependency of the chart tests)."""
    kv = pytest.importorskip("kubernetes_validate")
    ns = {"managed": {"replicas": 2}} if managed else {"addresses": ["10.0.0.1:9876"]}
    spec = spec_of(replicas=3, nameServer=ns, resources={"limits": {"memory": "2Gi", "cpu": 2}},
                   storage={"size": "5Gi", "storageClassName": "ssd"},
                   **({"acl": {"secretName": "rmq-acl"}, "tls": {"secretName": "rmq-tls"}} if acl else {}),
                   **({"scheduling": FULL_SCHEDULING, **POD_EXTRAS} if scheduling else {}))
    spec = dataclasses.replace(spec, uid="0f0f0f0f-aaaa-bbbb-cccc-000000000000")
    for obj in [*builders.children(spec, complete_assignment({}, 3), 3), builders.admin_secret(spec, "t")]:
        kv.validate(obj, kv.latest_version(), strict=True)


def _pod_specs(spec: GroupSpec) -> dict[str, dict[str, Any]]:
    return {"broker": builders.broker_statefulset(spec, spec.replicas)["spec"]["template"]["spec"],
            "namesrv": builders.namesrv_statefulset(spec)["spec"]["template"]["spec"]}


def test_pods_of_a_group_prefer_distinct_nodes_by_default() -> None:
    """A master and its slaves on one node would all go with that node: by default each
    component's pods of the group prefer distinct nodes, without pinning them anywhere."""
    spec = spec_of(replicas=3)
    for component, pod in _pod_specs(spec).items():
        anti = pod["affinity"]["podAntiAffinity"]
        assert list(anti) == ["preferredDuringSchedulingIgnoredDuringExecution"]
        (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["weight"] == 100
        assert term["podAffinityTerm"] == {"labelSelector": {"matchLabels": builders.selector(spec, component)},
                                           "topologyKey": "kubernetes.io/hostname"}
        assert "nodeAffinity" not in pod["affinity"]
        assert not {"nodeSelector", "tolerations", "priorityClassName"} & pod.keys()
    # The selector names this group's pods of that component only (other groups may share nodes).
    assert builders.selector(spec, "broker") != builders.selector(spec, "namesrv")
    assert builders.selector(spec, "broker") != builders.selector(dataclasses.replace(spec, name="other"), "broker")


def test_scheduling_is_rendered_into_broker_and_nameserver_pods() -> None:
    spec = spec_of(replicas=3, scheduling=FULL_SCHEDULING)
    for component, pod in _pod_specs(spec).items():
        term = {"labelSelector": {"matchLabels": builders.selector(spec, component)},
                "topologyKey": "topology.kubernetes.io/zone"}
        assert pod["affinity"]["podAntiAffinity"] == {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
        assert pod["affinity"]["nodeAffinity"] == FULL_SCHEDULING["nodeAffinity"]
        assert pod["nodeSelector"] == {"pool": "mq"}
        assert pod["tolerations"] == FULL_SCHEDULING["tolerations"]
        assert pod["priorityClassName"] == "mq-critical"
    none = _pod_specs(spec_of(replicas=3, scheduling={"podAntiAffinity": "None"}))
    assert all("affinity" not in pod for pod in none.values())


def test_scheduling_changes_restart_brokers_but_the_default_keeps_old_hashes() -> None:
    base = spec_of(replicas=3)
    explicit_default = spec_of(replicas=3, scheduling={"podAntiAffinity": "Preferred",
                                                       "topologyKey": "kubernetes.io/hostname"})
    # Groups created before spec.scheduling existed have the default: their pods are not restarted.
    assert builders.config_hash(explicit_default) == builders.config_hash(base)
    moved = [spec_of(replicas=3, scheduling={"nodeSelector": {"pool": "mq"}}),
             spec_of(replicas=3, scheduling={"podAntiAffinity": "Required"}),
             spec_of(replicas=3, scheduling={"tolerations": [{"operator": "Exists"}]}),
             spec_of(replicas=3, scheduling=FULL_SCHEDULING)]
    assert len({builders.config_hash(s) for s in moved} | {builders.config_hash(base)}) == len(moved) + 1


def test_scheduling_round_trips_through_the_applied_spec() -> None:
    spec = spec_of(replicas=3, scheduling=FULL_SCHEDULING)
    assert GroupSpec.from_json(spec.to_json()) == spec
    # A spec applied by an operator from before spec.scheduling reads back with the default.
    old = json.loads(spec_of(replicas=3).to_json())
    del old["scheduling"]
    assert GroupSpec.from_json(json.dumps(old)) == spec_of(replicas=3)


@pytest.mark.parametrize(("scheduling", "message"), [
    ({"podAntiAffinity": "Sometimes"}, "podAntiAffinity must be one of Preferred, Required, None"),
    ({"topologyKey": ""}, "topologyKey must not be empty"),
])
def test_scheduling_problems_are_found(scheduling: dict[str, Any], message: str) -> None:
    """What the CRD schema refuses on a real API server, the operator reports as a condition too."""
    assert message in "; ".join(problems(spec_of(scheduling=scheduling)))


@pytest.mark.parametrize(("scheduling", "message"), [
    ({"nodeSelector": {"pool": 1}}, "nodeSelector values must be strings"),
    ({"tolerations": {"key": "x"}}, "tolerations must be a list of objects"),
    ({"tolerations": ["x"]}, "tolerations must be a list of objects"),
    ({"priorityClassName": 5}, "priorityClassName must be of type str"),
])
def test_malformed_scheduling_is_a_spec_error(scheduling: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        spec_of(scheduling=scheduling)


def test_pull_secrets_pod_labels_and_annotations_reach_every_pod() -> None:
    spec = spec_of(**POD_EXTRAS)
    assert problems(spec) == []
    sts = {"broker": builders.broker_statefulset(spec, 3), "namesrv": builders.namesrv_statefulset(spec)}
    for component, obj in sts.items():
        template = obj["spec"]["template"]
        assert template["spec"]["imagePullSecrets"] == [{"name": "registry-creds"}], component
        labels = template["metadata"]["labels"]
        assert labels["team"] == "payments" and labels["example.com/tier"] == "mq"
        assert labels.items() >= builders.selector(spec, component).items()  # the selector still matches
        assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert builders.CONFIG_HASH_ANNOTATION in sts["broker"]["spec"]["template"]["metadata"]["annotations"]
    job = builders.verification_job(spec, VerificationSpec(), "v-1", [0, 1])
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "registry-creds"}]
    # Applying them restarts brokers; a group without them keeps the hash it had.
    plain = spec_of()
    assert builders.config_hash(spec) != builders.config_hash(plain)
    assert builders.config_hash(plain) == builders.config_hash(dataclasses.replace(spec, image_pull_secrets=(),
                                                                                   pod_labels={}, pod_annotations={}))
    assert "imagePullSecrets" not in builders.namesrv_statefulset(plain)["spec"]["template"]["spec"]
    assert GroupSpec.from_json(spec.to_json()) == spec


def test_malformed_pod_extras_are_spec_errors() -> None:
    for fields, message in (({"imagePullSecrets": ["registry-creds"]}, "list of {name"),
                            ({"podLabels": {"team": 1}}, "values must be strings")):
        with pytest.raises(SpecError, match=message):
            spec_of(**fields)


@pytest.mark.parametrize("name", ["1broker", "broker.a", "Broker-a", "broker-"])
def test_a_name_that_cannot_name_services_is_refused(name: str) -> None:
    """The name names Services (DNS-1035 labels): "broker.a-headless" is not one, whatever the
    brokerName, so a dotted name is refused even with spec.brokerName set."""
    doc = example(brokerName="broker-a")  # a valid brokerName: the name itself is what fails
    doc["metadata"].update(name=name, namespace="prod", uid="uid-1")
    found = problems(parse_spec(doc))
    assert any(f"metadata.name {name!r} must start with a letter" in p for p in found), found


def test_a_name_that_can_name_services_passes() -> None:
    doc = example()
    doc["metadata"].update(name="b2-x9", namespace="prod", uid="uid-1")
    assert not [p for p in problems(parse_spec(doc)) if "metadata.name" in p]
