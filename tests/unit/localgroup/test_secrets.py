"""spec.tls and spec.acl for rmq-local: the Secrets they name are read from the manifest itself."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from rmqbroker.localgroup.manifest import ManifestError, load_groups, load_manifest, render_conf, write_secrets

GROUP = """
kind: BrokerGroup
metadata: {name: sec}
spec:
  replicas: 2
  tls: {secretName: sec-tls, clientAuth: optional}
  acl: {secretName: sec-acl}
"""
CA_B64 = base64.b64encode(b"CA").decode()
TLS_SECRET = f"""
kind: Secret
metadata: {{name: sec-tls}}
stringData: {{tls.crt: CERT, tls.key: KEY}}
data: {{ca.crt: {CA_B64}}}
"""
ACL_SECRET = """
kind: Secret
metadata: {name: sec-acl}
stringData: {plain_acl.yml: "accounts: []", accessKey: ak, secretKey: sk}
"""


def manifest(tmp_path: Path, *docs: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text("\n---\n".join(docs))
    return path


def test_secrets_of_the_manifest_reach_the_brokers_files_and_conf(tmp_path: Path) -> None:
    spec = load_manifest(manifest(tmp_path, TLS_SECRET, GROUP, ACL_SECRET))
    assert spec.tls is not None and spec.acl is not None
    assert (spec.tls.mode, spec.tls.client_auth) == ("enforcing", "optional")  # the CRD's default mode
    assert dict(spec.tls.files) == {"tls.crt": b"CERT", "tls.key": b"KEY", "ca.crt": b"CA"}
    data = tmp_path / "data"
    props = write_secrets(spec, data)
    assert props == data / "secrets" / "tls.properties"
    text = props.read_text()
    assert f"tls.server.certPath={data}/secrets/tls/tls.crt" in text
    assert "tls.server.need.client.auth=optional" in text and "tls.server.authClient=true" in text
    assert (data / "secrets" / "tls" / "ca.crt").read_bytes() == b"CA"
    # One copy per broker, as each Java broker has its own file (see the ACL part of test_local_group).
    for ordinal in (0, 1):
        assert (data / "secrets" / "acl" / f"broker-{ordinal}" / "plain_acl.yml").read_text() == "accounts: []"
    for path in (data / "secrets").rglob("*"):
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    conf = render_conf(spec, 1, 1, data, {"listen": 1, "ha": 2, "admin": 3}, "ns:9876", "m:2", tmp_path / "t")
    for line in ("tlsEnable=true", "tlsServerMode=enforcing", f"tlsConfigFile={props}", "aclEnable=true",
                 f"aclFile={data}/secrets/acl/broker-1/plain_acl.yml", "aclAccessKey=ak", "aclSecretKey=sk"):
        assert line in conf.splitlines(), line


def test_without_tls_or_acl_nothing_is_written(tmp_path: Path) -> None:
    spec = load_manifest(manifest(tmp_path, "kind: BrokerGroup\nmetadata: {name: plain}\nspec: {}\n"))
    assert write_secrets(spec, tmp_path / "d") is None
    assert not (tmp_path / "d").exists()
    conf = render_conf(spec, 0, 0, tmp_path / "d", {"listen": 1, "ha": 2, "admin": 3}, "ns:9876", "m:2",
                       tmp_path / "t")
    keys = {line.split("=", 1)[0] for line in conf.splitlines()}
    assert not keys & {"tlsEnable", "tlsServerMode", "tlsConfigFile", "aclEnable", "aclFile", "aclAccessKey"}


@pytest.mark.parametrize(("docs", "message"), [
    ((GROUP, ACL_SECRET), "spec.tls.secretName: Secret sec-tls is not in the manifest"),
    ((GROUP, TLS_SECRET), "spec.acl.secretName: Secret sec-acl is not in the manifest"),
    ((GROUP, ACL_SECRET, TLS_SECRET.replace("tls.key: KEY", "other: KEY")), "Secret sec-tls has no tls.key"),
    ((GROUP, ACL_SECRET, TLS_SECRET.replace(CA_B64, "'not base64!'")),
     "Secret sec-tls: data.ca.crt is not base64"),
    ((GROUP.replace("clientAuth: optional", "clientAuth: always"), ACL_SECRET, TLS_SECRET),
     "spec.tls.clientAuth must be none, optional or require"),
    ((GROUP.replace("metadata: {name: sec}", "metadata: {name: sec, namespace: prod}"), ACL_SECRET, TLS_SECRET),
     "Secret sec-tls is not in the manifest"),  # a Secret of another namespace is not this group's
])
def test_missing_or_bad_secrets_are_refused(tmp_path: Path, docs: tuple[str, ...], message: str) -> None:
    with pytest.raises(ManifestError, match=message.replace(".", r"\.")):
        load_manifest(manifest(tmp_path, *docs))


def test_groups_sharing_the_local_nameserver_agree_on_tls(tmp_path: Path) -> None:
    other = "kind: BrokerGroup\nmetadata: {name: other}\nspec: {brokerName: other}\n"
    with pytest.raises(ManifestError, match=r"give them all the same spec\.tls"):
        load_groups(manifest(tmp_path, GROUP, other, TLS_SECRET, ACL_SECRET))
    same = other.replace("spec: {brokerName: other}", "spec: {brokerName: other, tls: {secretName: sec-tls, "
                         "clientAuth: optional}}")
    assert [s.name for s in load_groups(manifest(tmp_path, GROUP, same, TLS_SECRET, ACL_SECRET))] == ["sec", "other"]


def test_key_material_stays_out_of_the_specs_repr(tmp_path: Path) -> None:
    spec = load_manifest(manifest(tmp_path, TLS_SECRET, GROUP, ACL_SECRET))
    text = repr(spec)
    assert "sec-tls" in text and "sec-acl" in text
    assert "KEY" not in text and "'sk'" not in text and "accounts" not in text
