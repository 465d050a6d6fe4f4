"""The chart ships a byte-identical copy of crds/*.yaml (run `make sync-crds` after editing a CRD)."""

from __future__ import annotations

import hashlib

from tests.chart.conftest import CRD_CHART_DIR, CRD_SOURCE_DIR, crd_documents


def digests(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest()[:12] for name, data in files.items()}


def test_chart_crds_match_source_byte_for_byte() -> None:
    source = {p.name: p.read_bytes() for p in sorted(CRD_SOURCE_DIR.glob("*.yaml"))}
    chart = {p.name: p.read_bytes() for p in sorted(CRD_CHART_DIR.glob("*.yaml"))}
    missing = sorted(set(source) - set(chart))
    extra = sorted(set(chart) - set(source))
    drifted = sorted(name for name in set(source) & set(chart) if source[name] != chart[name])
    assert not (missing or extra or drifted), (
        f"charts/rmq-operator/crds is out of sync with crds/ (run `make sync-crds`): missing={missing} "
        f"extra={extra} drifted={drifted} source={digests(source)} chart={digests(chart)}"
    )


def test_brokergroup_crd_when_present() -> None:
    """Once crds/brokergroups.yaml exists, the chart's copy must define the BrokerGroup kind."""
    if not (CRD_SOURCE_DIR / "brokergroups.yaml").exists():
        # Written by the operator work (issue 4, item 1); until then there is nothing to ship.
        assert not list(CRD_CHART_DIR.glob("*.yaml"))
        return
    crds = {c["metadata"]["name"]: c for c in crd_documents()}
    crd = crds["brokergroups.rmq.brokergroup.dev"]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["spec"]["group"] == "rmq.brokergroup.dev"
    assert crd["spec"]["names"]["kind"] == "BrokerGroup"
    assert crd["spec"]["names"]["plural"] == "brokergroups"
    assert "v1alpha1" in {v["name"] for v in crd["spec"]["versions"]}
