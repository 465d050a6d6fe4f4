"""rmq-local's role bookkeeping: the assignment kept across runs, the failover spec, process restarts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from rmqbroker.ha.election import FailoverSpec
from rmqbroker.localgroup.manifest import GroupSpec, ManifestError, load_manifest
from rmqbroker.localgroup.supervisor import BACKOFF_MAX, LocalGroup, Proc


def group(tmp_path: Path, replicas: int = 3, name: str = "g") -> LocalGroup:
    spec = GroupSpec(name=name, cluster_name="C", broker_name=name, replicas=replicas, replication="SYNC",
                     flush_disk_type="ASYNC_FLUSH", master_discovery="Direct", broker_config={})
    return LocalGroup(spec, tmp_path, 30911, "127.0.0.1:30876", tmp_path / "token")


def test_fresh_group_has_broker_0_as_master(tmp_path: Path) -> None:
    g = group(tmp_path)
    g.load_assignment(None)
    assert g.assignment == {0: 0, 1: 1, 2: 2} and g.epoch == 0 and g.master == 0


def test_saved_roles_are_kept_and_completed_for_more_replicas(tmp_path: Path) -> None:
    g = group(tmp_path, replicas=4)
    g.load_assignment({"group": "g", "epoch": 3, "assignment": {"0": 1, "1": 0, "2": 2}})
    assert g.assignment == {0: 1, 1: 0, 2: 2, 3: 3} and g.epoch == 3 and g.master == 1
    g.write_confs()
    conf0 = (tmp_path / "broker-0.conf").read_text()
    assert "brokerRole=SLAVE\n" in conf0 and "brokerId=1\n" in conf0 and "haMasterAddress=127.0.0.1:30922" in conf0
    assert f"storePathRootDir={tmp_path / 'broker-0' / 'store'}" in conf0  # the store stays with the ordinal
    conf1 = (tmp_path / "broker-1.conf").read_text()
    assert "brokerRole=SYNC_MASTER\n" in conf1 and "brokerId=0\n" in conf1 and "haMasterAddress" not in conf1


def test_saved_roles_of_another_group_are_ignored(tmp_path: Path) -> None:
    g = group(tmp_path)
    g.load_assignment({"group": "other", "epoch": 5, "assignment": {"0": 1, "1": 0, "2": 2}})
    assert g.assignment == {0: 0, 1: 1, 2: 2} and g.epoch == 0


def test_scale_down_may_not_remove_the_master(tmp_path: Path) -> None:
    g = group(tmp_path, replicas=2)
    with pytest.raises(ValueError, match=r"the master is broker-2: spec\.replicas must be at least 3"):
        g.load_assignment({"group": "g", "epoch": 1, "assignment": {"0": 1, "1": 2, "2": 0}})
    g.load_assignment({"group": "g", "epoch": 1, "assignment": {"0": 0, "1": 2, "2": 1}})
    assert g.assignment == {0: 0, 1: 2}


@pytest.mark.parametrize(("failover", "message"), [
    ("[]", "spec.failover must be an object"),
    ("{enabled: 'yes'}", "spec.failover.enabled must be true or false"),
    ("{masterLostSeconds: 0}", r"masterLostSeconds must be an integer from 1 to 3600"),
    ("{masterLostSeconds: '5'}", r"masterLostSeconds must be an integer from 1 to 3600"),
    ("{allowDataLoss: 1}", "spec.failover.allowDataLoss must be true or false"),
])
def test_bad_failover_spec_is_refused(tmp_path: Path, failover: str, message: str) -> None:
    path = tmp_path / "bg.yaml"
    path.write_text(f"kind: BrokerGroup\nmetadata: {{name: x}}\nspec:\n  failover: {failover}\n")
    with pytest.raises(ManifestError, match=message):
        load_manifest(path)


def test_failover_spec_defaults_and_values(tmp_path: Path) -> None:
    path = tmp_path / "bg.yaml"
    path.write_text("kind: BrokerGroup\nmetadata: {name: x}\nspec: {}\n")
    assert load_manifest(path).failover == FailoverSpec(True, 30, False)
    path.write_text("kind: BrokerGroup\nmetadata: {name: x}\n"
                    "spec: {failover: {enabled: false, masterLostSeconds: 7, allowDataLoss: true}}\n")
    assert load_manifest(path).failover == FailoverSpec(False, 7, True)


def test_exited_process_restarts_with_doubling_back_off(tmp_path: Path) -> None:
    proc = Proc("p", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "p.log")
    proc.start(0.0)
    assert proc.popen is not None
    proc.popen.wait(30)
    said = proc.reap(1.0)
    assert said is not None and "p exited (status 3); starting it again in 1s" in said
    assert proc.reap(1.5) is None  # said once
    assert not proc.due(1.9) and proc.due(2.0)
    delays: list[Any] = []
    now = 2.0
    for _ in range(7):
        proc.start(now)
        proc.popen.wait(30)
        proc.reap(now + 0.1)
        assert proc.restart_at is not None
        delays.append(round(proc.restart_at - (now + 0.1), 3))
        now = proc.restart_at
    assert delays == [2.0, 4.0, 8.0, 16.0, BACKOFF_MAX, BACKOFF_MAX, BACKOFF_MAX]
    proc.start(now)
    proc.popen.wait(30)
    proc.reap(now + 61.0)  # ran for over a minute: back to the first delay
    assert proc.restart_at == pytest.approx(now + 62.0)


def _groups_yaml(*groups: str) -> str:
    return "\n---\n".join(f"kind: BrokerGroup\nmetadata: {{name: {g}}}\nspec: {{}}" for g in groups)


def test_several_groups_load_in_order(tmp_path: Path) -> None:
    from rmqbroker.localgroup.manifest import load_groups

    path = tmp_path / "c.yaml"
    path.write_text(_groups_yaml("broker-a", "broker-b"))
    assert [s.name for s in load_groups(path)] == ["broker-a", "broker-b"]
    with pytest.raises(ManifestError, match="exactly one BrokerGroup, found 2"):
        load_manifest(path)


@pytest.mark.parametrize(("text", "message"), [
    (_groups_yaml("a", "a"), "two BrokerGroups have the same metadata.name: a"),
    (_groups_yaml("a", "b") + "\n---\nkind: BrokerGroup\nmetadata: {name: c}\nspec: {brokerName: a}",
     "two BrokerGroups have the same brokerName: a"),
    (_groups_yaml("a", "b", "c", "d", "e"), "1 to 4 BrokerGroups, found 5"),
    ("kind: ConfigMap\nmetadata: {name: x}\n", "1 to 4 BrokerGroups, found 0"),
    (_groups_yaml("a") + "\n---\nkind: BrokerGroup\nmetadata: {name: b}\nspec: {replicas: 9}",
     "BrokerGroup b: spec.replicas must be an integer from 1 to 5"),
])
def test_bad_cluster_manifest_is_refused(tmp_path: Path, text: str, message: str) -> None:
    from rmqbroker.localgroup.manifest import load_groups

    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ManifestError, match=message):
        load_groups(path)


def test_damaged_saved_roles_never_make_two_masters(tmp_path: Path) -> None:
    g = group(tmp_path)
    g.load_assignment({"group": "g", "epoch": "x", "assignment": {"0": 0, "1": 0, "2": True, "x": 1}})
    assert g.assignment == {0: 0, 1: 1, 2: 2} and g.epoch == 0


def test_values_saved_at_run_time_are_kept_on_a_re_render_and_reported_when_dropped(tmp_path: Path) -> None:
    g = group(tmp_path, replicas=2)
    g.load_assignment(None)
    assert g.write_confs(keep_saved=False) == []  # nothing there before
    conf0 = tmp_path / "broker-0.conf"
    # As the broker saves an UPDATE_BROKER_CONFIG: the key's line rewritten, a new key appended.
    conf0.write_text(conf0.read_text().replace("flushDiskType=ASYNC_FLUSH", "flushDiskType=SYNC_FLUSH")
                     + "fileReservedTime=12\n")
    g.assignment = {0: 1, 1: 0}  # a failover re-renders both confs
    assert g.write_confs() == []
    text = conf0.read_text()
    assert "brokerRole=SLAVE\n" in text and "brokerId=1\n" in text  # the new role ...
    assert "flushDiskType=SYNC_FLUSH\n" in text and "fileReservedTime=12\n" in text  # ... and the saved values
    assert "fileReservedTime" not in (tmp_path / "broker-1.conf").read_text()
    # Started again (other ports too): the manifest's values, and the dropped ones said.
    g2 = LocalGroup(g.spec, tmp_path, 40911, "127.0.0.1:40876", tmp_path / "token")
    g2.load_assignment({"group": "g", "epoch": 1, "assignment": {"0": 1, "1": 0}})
    assert g2.write_confs(keep_saved=False) == ["broker-0.conf: flushDiskType=SYNC_FLUSH, fileReservedTime=12"]
    text = conf0.read_text()
    assert "flushDiskType=ASYNC_FLUSH\n" in text and "fileReservedTime" not in text and "listenPort=40911\n" in text


def test_a_store_some_process_holds_is_found(tmp_path: Path) -> None:
    import fcntl
    import os

    from rmqbroker.local import _stores_in_use

    g = group(tmp_path, replicas=2)
    g.load_assignment(None)
    assert _stores_in_use([g]) == []  # no stores yet
    for ordinal in (0, 1):
        g.store_dir(ordinal).mkdir(parents=True)
        (g.store_dir(ordinal) / "lock").touch()
    fd = os.open(g.store_dir(1) / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running broker holds its store
        assert _stores_in_use([g]) == [g.store_dir(1)]
    finally:
        os.close(fd)
    assert _stores_in_use([g]) == []


@pytest.mark.parametrize(("spec", "message"), [
    ("{brokerConfig: {msgTraceTopicName: \"T\\nbrokerId=0\"}}",
     "msgTraceTopicName: the value may not contain a line break"),
    ("{brokerConfig: {'brokerRole ': ASYNC_MASTER}}", "key 'brokerRole ' is not a broker.conf key"),
    ("{tls: {secretName: t}, brokerConfig: {tlsServerMode: disabled}}",
     r"may not set keys spec\.acl/spec\.tls render: tlsServerMode"),
])
def test_broker_config_that_would_not_render_as_its_own_line_or_contradicts_the_spec_is_refused(
        tmp_path: Path, spec: str, message: str) -> None:
    path = tmp_path / "bg.yaml"
    path.write_text(f"kind: BrokerGroup\nmetadata: {{name: x}}\nspec: {spec}\n")
    with pytest.raises(ManifestError, match=message):
        load_manifest(path)


def test_the_admin_token_is_read_once_for_the_run(tmp_path: Path) -> None:
    """The supervisor keeps asking its brokers with the token they started with, even if the file
    goes (a data directory removed under a running group crashed rmq-local with a traceback)."""
    g = group(tmp_path)
    g.token_file.write_text("tok-1\n")
    assert g.token == "tok-1"
    g.token_file.unlink()
    assert g.token == "tok-1"


def test_a_master_without_the_groups_log_counts_as_lost_at_once(tmp_path: Path) -> None:
    """The operator's rule in rmq-local: a master that answers but lost its store (an epoch older
    than the group's, another log identity than it served, or a slave pointed at it holding bytes
    of its term beyond its end) is lost without waiting masterLostSeconds."""
    g = group(tmp_path)
    g.load_assignment({"group": "g", "epoch": 2, "assignment": {"0": 0, "1": 1, "2": 2}})
    master_ha = g.ha_address(0)

    def slave(ahead: int = 0, follows: str = master_ha) -> dict[str, Any]:
        return {"role": "SLAVE", "epoch": 2, "maxPhyOffset": 100,
                "ha": {"masterAddress": follows, "connected": ahead == 0, "aheadOfMasterBytes": ahead}}

    def round_(master: dict[str, Any], *slaves: dict[str, Any]) -> None:
        g.statuses = {0: master, 1: slaves[0], 2: slaves[1]}
        w = g.watch
        lost = g._lost_store(master)
        w.lost_store = lost or ""
        if not lost:  # what observe() keeps of a healthy master
            w.seen_healthy, w.log_id, w.lost_since = True, master["logId"], None
        elif w.lost_since is None:
            w.lost_since = 100.0

    healthy = {"role": "SYNC_MASTER", "epoch": 2, "logId": "a1", "maxPhyOffset": 100}
    round_(healthy, slave(), slave())
    assert g.watch.lost_store == "" and g.watch.log_id == "a1"
    round_({**healthy, "logId": "b2"}, slave(), slave())
    assert g.watch.lost_store == "it serves log b2, not the log a1 it served"
    round_({**healthy, "epoch": 0, "logId": "c3"}, slave(), slave())
    assert g.watch.lost_store == "it is at epoch 0, older than the group's 2"
    # Bytes ahead count only from a slave pointed at this master.
    round_(healthy, slave(ahead=4096, follows="127.0.0.1:1"), slave())
    assert g.watch.lost_store == ""
    round_(healthy, slave(ahead=4096), slave())
    assert g.watch.lost_store == ("slave(s) pointed at broker-0 hold bytes of its term beyond its end: "
                                  "broker-1 (4096 bytes)")
    # Lost that way, the failover does not wait masterLostSeconds (30 by default) to promote; here
    # no slave answers the fence, so it is refused for that reason, not for the wait.
    g.token_file.write_text("t\n")
    g.fail_over(now=100.5)
    assert any("master broker-0 lost its store" in e and "not promoting" in e for e in g.events), g.events
