"""The processes of a local group: started, restarted when they exit, and failed over.

What the kubelet and the operator do on Kubernetes, done for local processes:

- A process that exits is started again after a back-off (1 s, doubling to 30 s; back to 1 s once
  it has run for a minute), from a broker.conf rendered for its current role.
- With ``spec.failover.enabled``, a master unreachable for ``masterLostSeconds`` is replaced by the
  slave :mod:`rmqbroker.ha.election` chooses (``POST /role`` at a new epoch). Every other broker
  is then made to follow it (``POST /role`` to demote a former master, ``POST /ha/master``).
- Which broker holds which brokerId, and the epoch, are kept in ``state.json``. A restarted broker,
  or the whole group started again, comes back in its current role.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqbroker.conf_file import rewrite_properties
from rmqbroker.ha import election
from rmqbroker.localgroup.manifest import GroupSpec, render_conf, store_dir, tls_properties_path, write_secrets
from rmqbroker.managed_keys import MANAGED_KEYS
from rmqbroker.metadata.jsonfile import atomic_write
from rmqbroker.properties import parse_properties

STATE_FILE = "state.json"
MASTER_ROLES = ("SYNC_MASTER", "ASYNC_MASTER")
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0
# A process that ran this long before exiting starts again after the first back-off.
BACKOFF_RESET_AFTER = 60.0
STATUS_TIMEOUT = 1.0
CONTROL_TIMEOUT = 15.0
EVENTS_KEPT = 8
# How long a slave started with nameserver discovery may not know its master before it is told.
NAMESERVER_GRACE = 15.0


class AdminCallError(Exception):
    """A broker's admin endpoint refused or did not answer a call."""


def broker_ports(base_port: int, ordinal: int) -> dict[str, int]:
    """Ports of the broker at ``ordinal``: remoting, HA and admin (the VIP channel is listen - 2)."""
    return {"listen": base_port + 10 * ordinal, "ha": base_port + 10 * ordinal + 1,
            "admin": base_port + 10 * ordinal + 5}


def admin_call(port: int, token: str, method: str, path: str, body: Mapping[str, Any] | None = None,
               timeout: float = STATUS_TIMEOUT) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            obj = json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        reason = exc.read()[:300].decode("utf-8", "replace")
        raise AdminCallError(f"{method} {path}: HTTP {exc.code}: {reason}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise AdminCallError(f"{method} {path}: {exc}") from exc
    if not isinstance(obj, dict):
        raise AdminCallError(f"{method} {path}: answer is not a JSON object")
    return obj


def fetch_status(admin_port: int, token: str) -> dict[str, Any] | None:
    try:
        return admin_call(admin_port, token, "GET", "/status")
    except AdminCallError:
        return None


@dataclass
class Proc:
    """One supervised process and its restart bookkeeping."""

    name: str
    args: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    answered: bool = False  # its admin endpoint answered since it was started
    restarts: int = 0
    backoff: float = BACKOFF_FIRST
    restart_at: float | None = None
    last_exit: int | None = None
    log_offset: int = 0  # where this start's output begins in the (appended) log

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self, now: float) -> None:
        with open(self.log_path, "ab") as log_file:
            self.log_offset = log_file.tell()
            # The child keeps its own copy of the descriptor; its own session keeps Ctrl-C of
            # the terminal away from it, so the group stops in order.
            self.popen = subprocess.Popen(self.args, stdout=log_file, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        self.started_at = now
        self.answered = False
        self.restart_at = None

    def reap(self, now: float) -> str | None:
        """If the process exited since the last look: schedule its restart and say so."""
        if self.popen is None or self.restart_at is not None:
            return None
        code = self.popen.poll()
        if code is None:
            return None
        self.last_exit = code
        if now - self.started_at >= BACKOFF_RESET_AFTER:
            self.backoff = BACKOFF_FIRST
        self.restart_at = now + self.backoff
        delay = self.backoff
        self.backoff = min(BACKOFF_MAX, self.backoff * 2)
        how = f"signal {-code}" if code < 0 else f"status {code}"
        return f"{self.name} exited ({how}); starting it again in {delay:.0f}s (log: {self.log_path})"

    def due(self, now: float) -> bool:
        return self.restart_at is not None and now >= self.restart_at

    def stop(self) -> None:
        if self.running:
            assert self.popen is not None
            self.popen.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> None:
        if self.popen is None:
            return
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


@dataclass
class Watch:
    """What the supervisor saw of the current master (reset when the master changes)."""

    lost_since: float | None = None
    seen_healthy: bool = False
    master_offset: int = 0
    connected: frozenset[str] = frozenset()
    in_sync: frozenset[str] = frozenset()
    blocked: str = ""  # the last reason failover was refused, said once
    log_id: str | None = None  # the log identity the master served when last seen healthy
    lost_store: str = ""  # why the master, although it answers, no longer holds the group's log
    first_term_failed: bool = False


@dataclass
class LocalGroup:
    """The nameserver and brokers of one local group, their roles and the group's epoch."""

    spec: GroupSpec
    data_dir: Path
    base_port: int
    namesrv: str
    token_file: Path
    assignment: dict[int, int] = field(default_factory=dict)  # ordinal -> brokerId (0: master)
    epoch: int = 0
    procs: dict[str, Proc] = field(default_factory=dict)
    statuses: dict[int, dict[str, Any] | None] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    watch: Watch = field(default_factory=Watch)
    conf_epoch: int = -1  # the group epoch the confs on disk carry (haGroupEpoch)
    _token: str | None = field(default=None, repr=False)

    @staticmethod
    def name_of(ordinal: int) -> str:
        return f"broker-{ordinal}"

    @property
    def token(self) -> str:
        """The admin token, read once: the brokers hold it for the run, whatever happens to the file."""
        if self._token is None:
            self._token = self.token_file.read_text().strip()
        return self._token

    @property
    def master(self) -> int:
        return next(o for o, b in self.assignment.items() if b == 0)

    def ports(self, ordinal: int) -> dict[str, int]:
        return broker_ports(self.base_port, ordinal)

    def ha_address(self, ordinal: int) -> str:
        return f"127.0.0.1:{self.ports(ordinal)['ha']}"

    # -- roles ------------------------------------------------------------------------------

    def load_assignment(self, saved: Mapping[str, Any] | None) -> None:
        """Roles from a previous run of this group (``state.json``), completed for ``replicas``.

        Raises ValueError when the saved master is beyond ``replicas`` (a scale-down would remove it).
        """
        ids: dict[int, int] = {}
        if saved and saved.get("group") == self.spec.name:
            pairs = [(int(k), b) for k, b in (saved.get("assignment") or {}).items()
                     if str(k).isdigit() and isinstance(b, int) and not isinstance(b, bool) and b >= 0]
            for ordinal, bid in sorted(pairs):
                if bid not in ids.values():  # an id held twice (a damaged file) goes to the first only
                    ids[ordinal] = bid
            epoch = saved.get("epoch")
            self.epoch = epoch if isinstance(epoch, int) and epoch >= 0 else 0
        master = next((o for o, b in ids.items() if b == 0), None)
        if master is not None and master >= self.spec.replicas:
            raise ValueError(f"the master is {self.name_of(master)}: spec.replicas must be at least {master + 1} "
                             f"(or remove {self.data_dir} to start afresh)")
        out = {o: b for o, b in ids.items() if o < self.spec.replicas}
        if master is None:
            out = {0: 0, **{o: b for o, b in out.items() if o != 0 and b != 0}}
        for o in range(self.spec.replicas):
            if o not in out:
                used = set(out.values())
                out[o] = next(i for i in range(1, 100) if i not in used)
        self.assignment = dict(sorted(out.items()))

    def store_dir(self, ordinal: int) -> Path:
        return store_dir(self.data_dir, ordinal)

    def conf_path(self, ordinal: int) -> Path:
        return self.data_dir / f"{self.name_of(ordinal)}.conf"

    def write_confs(self, keep_saved: bool = True) -> list[str]:
        """Render every broker's conf for its current role.

        A value a broker saved in its conf at run time (UPDATE_BROKER_CONFIG) differs from what the
        manifest renders. ``keep_saved`` keeps such values (a failover re-renders the confs of a
        running group); otherwise the manifest's win, as when the group starts, and the values
        dropped are returned, one line per broker, for the user to carry into spec.brokerConfig.
        """
        write_secrets(self.spec, self.data_dir)
        dropped = []
        for ordinal, broker_id in self.assignment.items():
            path = self.conf_path(ordinal)
            conf = render_conf(self.spec, ordinal, broker_id, self.data_dir, self.ports(ordinal), self.namesrv,
                               self.ha_address(self.master), self.token_file, self.epoch)
            saved = self._saved_values(path, conf)
            if keep_saved:
                conf = rewrite_properties(conf, saved)
            elif saved:
                dropped.append(f"{path.name}: {', '.join(f'{k}={v}' for k, v in saved.items())}")
            # Owner-only: with spec.acl it holds the account slaves sign their metadata sync with.
            atomic_write(path, conf, mode=0o600, backup=False)
        self.conf_epoch = self.epoch
        return dropped

    @staticmethod
    def _saved_values(path: Path, rendered: str) -> dict[str, str]:
        """Keys of the conf at ``path`` whose values ``rendered`` would not keep (addresses, ports
        and roles aside: those are rmq-local's to assign)."""
        try:
            old = parse_properties(path.read_text())
        except FileNotFoundError:
            return {}
        new = parse_properties(rendered)
        return {k: v for k, v in old.items() if k not in MANAGED_KEYS and new.get(k) != v}

    # -- processes --------------------------------------------------------------------------

    def add_processes(self, namesrv_dir: Path | None = None) -> None:
        """The group's brokers and, with ``namesrv_dir`` (the first group of a manifest), the
        nameserver they all share, its log and KV config there."""
        if namesrv_dir is not None:
            # Its KV config (mqadmin updateKvConfig) stays with the local data, not in $HOME.
            args = [sys.executable, "-m", "rmqbroker.namesrv.main", "--listen", self.namesrv,
                    "--kv-config-path", str(namesrv_dir / "namesrv" / "kvConfig.json")]
            if self.spec.tls is not None:
                args += ["--tls-server-mode", self.spec.tls.mode, "--tls-config-file",
                         str(tls_properties_path(self.data_dir))]
            self.procs["namesrv"] = Proc("namesrv", args, namesrv_dir / "namesrv.log")
        for ordinal in self.assignment:
            name = self.name_of(ordinal)
            self.procs[name] = Proc(name, [sys.executable, "-m", "rmqbroker.main", "-c",
                                           str(self.data_dir / f"{name}.conf")], self.data_dir / f"{name}.log")

    def start_order(self) -> list[str]:
        """The nameserver, the master, then the slaves."""
        slaves = [self.name_of(o) for o in self.assignment if o != self.master]
        return [*(["namesrv"] if "namesrv" in self.procs else []), self.name_of(self.master), *slaves]

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop()
        for proc in self.procs.values():
            proc.wait(20)

    def event(self, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.events = [*self.events, f"{stamp} {message}"][-EVENTS_KEPT:]

    def supervise(self, now: float) -> None:
        for proc in self.procs.values():
            said = proc.reap(now)
            if said:
                self.event(said)
            if proc.due(now):
                proc.restarts += 1
                proc.start(now)

    # -- observation and failover -----------------------------------------------------------

    def observe(self, now: float) -> None:
        token = self.token
        for ordinal in self.assignment:
            proc = self.procs[self.name_of(ordinal)]
            st = fetch_status(self.ports(ordinal)["admin"], token) if proc.running else None
            proc.answered = proc.answered or st is not None
            self.statuses[ordinal] = st
        ms = self.statuses.get(self.master)
        w = self.watch
        answers = ms is not None and ms.get("role") in MASTER_ROLES
        lost = self._lost_store(ms) if ms is not None and answers else None
        if lost and not w.lost_store:
            self.event(f"master {self.name_of(self.master)} lost its store: {lost}")
        w.lost_store = lost or ""
        if ms is not None and answers and not lost and not ms.get("termFenced"):
            w.lost_since = None
            w.seen_healthy = True
            w.blocked = ""
            w.master_offset = int(ms.get("maxPhyOffset") or 0)
            log_id = ms.get("logId")
            w.log_id = log_id if isinstance(log_id, str) and log_id else w.log_id
            # The master's epoch is the group's (state.json may be older than the brokers' stores).
            self.epoch = max(self.epoch, int(ms.get("epoch") or 0))
            connected, synced = set(), set()
            for ordinal, st in self.statuses.items():
                if ordinal == self.master or st is None:
                    continue
                ha = st.get("ha") or {}
                follows = st.get("role") == "SLAVE" and ha.get("masterAddress") == self.ha_address(self.master)
                if follows and ha.get("connected"):
                    connected.add(self.name_of(ordinal))
                # Polled a moment after the master, a slave may be past the offset seen there.
                lag = max(0, w.master_offset - int(st.get("maxPhyOffset") or 0))
                if election.in_sync(follows, bool(ha.get("connected")), int(st.get("epoch") or 0),
                                    int(ms.get("epoch") or 0), lag):
                    synced.add(self.name_of(ordinal))
            w.connected, w.in_sync = frozenset(connected), frozenset(synced)
        elif w.lost_since is None:
            w.lost_since = now

    def _lost_store(self, ms: Mapping[str, Any]) -> str | None:
        """Why the master, answering as a master, no longer holds the group's log, or None: its
        store was emptied or replaced while it was down (the operator's rule, ``lost_data``). It
        reports an epoch older than the group's, another log identity than it served, or a slave
        pointed at it holds bytes of its term beyond its end."""
        name = self.name_of(self.master)
        epoch = int(ms.get("epoch") or 0)
        if epoch < self.epoch:
            return f"it is at epoch {epoch}, older than the group's {self.epoch}"
        log_id = ms.get("logId")
        if self.watch.log_id and isinstance(log_id, str) and log_id and log_id != self.watch.log_id:
            return f"it serves log {log_id}, not the log {self.watch.log_id} it served"
        master_ha = self.ha_address(self.master)
        ahead = []
        for ordinal, st in sorted(self.statuses.items()):
            ha = (st or {}).get("ha") or {}
            held = int(ha.get("aheadOfMasterBytes") or 0)
            if ordinal != self.master and st and st.get("role") == "SLAVE" and held > 0 \
                    and ha.get("masterAddress") == master_ha:
                ahead.append(f"{self.name_of(ordinal)} ({held} bytes)")
        if ahead:
            return f"slave(s) pointed at {name} hold bytes of its term beyond its end: {', '.join(ahead)}"
        return None

    def fail_over(self, now: float) -> None:
        """Promote a slave when the master has been unreachable for ``masterLostSeconds``, or at
        once when it answers without the group's log (waiting cannot bring its bytes back, and
        the slaves refuse to follow it)."""
        w = self.watch
        fo = self.spec.failover
        if w.lost_since is None or not (w.seen_healthy or w.lost_store):
            return
        if not w.lost_store and now - w.lost_since < fo.master_lost_seconds:
            return
        old = self.name_of(self.master)
        how = f"lost its store ({w.lost_store})" if w.lost_store else f"was unreachable for {now - w.lost_since:.1f}s"
        if w.lost_store and len(self.assignment) == 1:
            self._start_over(now)
            return
        if not fo.enabled:
            self._refused("disabled", f"master {old} {how}; failover is off (spec.failover.enabled: false)")
            return
        live = {ordinal: st for ordinal, st in self.statuses.items()
                if ordinal != self.master and st is not None and st.get("role") == "SLAVE"}
        slaves = [self.name_of(o) for o in self.assignment if o != self.master]
        strict = fo.strict(self.spec.replication)
        record = election.MasterRecord(w.seen_healthy, w.connected, w.in_sync, w.master_offset)

        def candidates(offsets: Mapping[int, int]) -> list[election.Candidate]:
            return [election.Candidate(self.name_of(o), o, int(st.get("epoch") or 0), offsets[o])
                    for o, st in live.items() if o in offsets]

        chosen, why = election.choose(candidates({o: int(st.get("maxPhyOffset") or 0) for o, st in live.items()}),
                                      slaves, self.epoch, strict, record)
        if chosen is None:
            self._refused(why, f"master {old} {how}; not promoting: {why}")
            return
        epoch = election.next_epoch(self.epoch, [int(st.get("epoch") or 0) for st in self.statuses.values() if st])
        # Fence every slave first: a master that is only hung could otherwise still get an ack
        # (and answer SEND_OK) after the choice. The offsets they answer are final; choose on them.
        fenced: dict[int, int] = {}
        for ordinal in live:
            try:
                answer = admin_call(self.ports(ordinal)["admin"], self.token, "POST", "/ha/fence", {"epoch": epoch},
                                    CONTROL_TIMEOUT)
                fenced[ordinal] = int(answer.get("maxPhyOffset") or 0)
            except AdminCallError as exc:
                self.event(f"fencing {self.name_of(ordinal)} failed: {exc}")
        chosen, why = election.choose(candidates(fenced), slaves, self.epoch, strict, record)
        if chosen is None or (strict and len(fenced) < len(live)):
            why = why if chosen is None else "a slave could not be fenced"
            self._refused(why, f"master {old} {how}; not promoting: {why}")
            return
        cand = int(chosen.rsplit("-", 1)[1])
        try:
            admin_call(self.ports(cand)["admin"], self.token, "POST", "/role",
                       {"role": self.spec.master_role, "brokerId": 0, "epoch": epoch}, CONTROL_TIMEOUT)
        except AdminCallError as exc:
            self.event(f"promoting {chosen} failed: {exc}")
            return
        old_master = self.master
        self.assignment[old_master] = self.assignment[cand]
        self.assignment[cand] = 0
        self.epoch = epoch
        self.write_confs()  # restarts (of the old master too) come back in the new roles
        self.event(f"promoted {chosen} to {self.spec.master_role} at epoch {epoch} ({why}); master {old} {how}")
        self.save()  # before anything else: a restarted rmq-local must know the new roles
        self.watch = Watch()
        self.observe(now)

    def _start_over(self, now: float) -> None:
        """The group's only broker came back without its store: nothing else holds the group's
        log, and refusing writes keeps nothing, so it goes on with an empty log at a new epoch
        (the operator's rule for a group of one)."""
        name, w = self.name_of(self.master), self.watch
        st = self.statuses.get(self.master) or {}
        epoch = election.next_epoch(self.epoch, [int(st.get("epoch") or 0)])
        try:
            admin_call(self.ports(self.master)["admin"], self.token, "POST", "/role",
                       {"role": self.spec.master_role, "brokerId": 0, "epoch": epoch}, CONTROL_TIMEOUT)
        except AdminCallError as exc:
            self._refused("start-over", f"{name} lost its store and could not begin epoch {epoch}: {exc}")
            return
        self.event(f"{name} lost its store ({w.lost_store}); it is the group's only broker, so nothing holds the "
                   f"messages it had: it goes on with an empty log at epoch {epoch}")
        self.epoch = epoch
        self.save()
        self.watch = Watch()
        self.observe(now)

    def _refused(self, key: str, message: str) -> None:
        """Say once why the lost master is not replaced (until the reason changes)."""
        if self.watch.blocked != key:
            self.watch.blocked = key
            self.event(message)

    def align(self) -> None:
        """Make every reachable broker hold its assigned role and follow the master."""
        master = self.master
        ms = self.statuses.get(master)
        if ms is None or ms.get("role") not in MASTER_ROLES or self.watch.lost_store:
            return
        token = self.token
        master_ha = self.ha_address(master)
        broker_addr = f"127.0.0.1:{self.ports(master)['listen']}"
        demoted = False
        for ordinal, st in self.statuses.items():
            if ordinal == master or st is None:
                continue
            name, want = self.name_of(ordinal), self.assignment[ordinal]
            admin = self.ports(ordinal)["admin"]
            try:
                if st.get("role") in MASTER_ROLES or st.get("brokerId") != want:
                    admin_call(admin, token, "POST", "/role", {"role": "SLAVE", "brokerId": want,
                                                               "epoch": self.epoch}, CONTROL_TIMEOUT)
                    demoted = demoted or st.get("role") in MASTER_ROLES
                    self.event(f"{name} -> SLAVE brokerId {want} (was {st.get('role')} brokerId {st.get('brokerId')})")
                elif not self._needs_repoint(ordinal, st, master_ha):
                    continue
                admin_call(admin, token, "POST", "/ha/master", {"haAddress": master_ha, "brokerAddress": broker_addr,
                                                                "epoch": self.epoch}, CONTROL_TIMEOUT)
                self.event(f"{name} now follows master {self.name_of(master)} at {master_ha}")
            except AdminCallError as exc:
                self.event(f"aligning {name} failed: {exc}")
        if demoted:
            # A former master registered as brokerId 0; once demoted it registers as a slave and
            # the nameserver drops brokerId 0 until the master's next periodic registration. The
            # same role posted again makes the master register at once.
            try:
                admin_call(self.ports(master)["admin"], token, "POST", "/role",
                           {"role": ms["role"], "brokerId": 0, "epoch": self.epoch}, CONTROL_TIMEOUT)
            except AdminCallError as exc:
                self.event(f"re-registering master {self.name_of(master)} failed: {exc}")

    def _needs_repoint(self, ordinal: int, st: Mapping[str, Any], master_ha: str) -> bool:
        if (st.get("ha") or {}).get("fencedBelowEpoch"):
            return True  # fenced by a failover that did not happen: a re-point lifts it
        following = (st.get("ha") or {}).get("masterAddress")
        if following is None and self.spec.master_discovery == "NameServer":
            # A slave just started asks the nameserver for its master within seconds.
            return time.monotonic() - self.procs[self.name_of(ordinal)].started_at > NAMESERVER_GRACE
        return following != master_ha

    def begin_first_term(self) -> None:
        """A new group's master begins epoch 1 once it serves (a same-role POST /role), and every
        broker.conf then says so (``haGroupEpoch``): a master back on an emptied store is at
        epoch 0 again, below it, and refuses writes instead of acknowledging sends on a log the
        group will not keep. Its slaves re-handshake into the new epoch."""
        ms = self.statuses.get(self.master)
        if (self.epoch != 0 or ms is None or ms.get("role") not in MASTER_ROLES or self.watch.lost_store
                or int(ms.get("epoch") or 0) != 0 or not ms.get("logId") or ms.get("termFenced")):
            return
        name = self.name_of(self.master)
        try:
            admin_call(self.ports(self.master)["admin"], self.token, "POST", "/role",
                       {"role": self.spec.master_role, "brokerId": 0, "epoch": 1}, CONTROL_TIMEOUT)
        except AdminCallError as exc:
            if not self.watch.first_term_failed:  # said once; tried again every pass
                self.watch.first_term_failed = True
                self.event(f"{name}, the master, did not begin epoch 1: {exc}")
            return
        self.epoch = 1
        self.event(f"{name}, the master, began epoch 1: a broker back on an emptied store then takes no writes")

    def tick(self, now: float) -> None:
        self.supervise(now)
        self.observe(now)
        self.fail_over(now)
        self.begin_first_term()
        self.align()
        if self.conf_epoch != self.epoch:
            self.write_confs()  # restarts read the group's epoch
        self.save()

    # -- state.json -------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        brokers = []
        for ordinal, broker_id in self.assignment.items():
            proc = self.procs.get(self.name_of(ordinal))
            brokers.append({"id": ordinal, "name": self.name_of(ordinal), "brokerId": broker_id,
                            "pid": proc.popen.pid if proc and proc.popen else None,
                            "running": bool(proc and proc.running), "restarts": proc.restarts if proc else 0,
                            "answered": bool(proc and proc.answered),
                            **self.ports(ordinal)})
        return {"group": self.spec.name, "namesrv": self.namesrv, "tokenFile": str(self.token_file),
                "epoch": self.epoch, "assignment": {str(o): b for o, b in self.assignment.items()},
                "brokers": brokers, "events": self.events}

    def save(self) -> None:
        path = self.data_dir / STATE_FILE
        text = json.dumps(self.state(), indent=1)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # `rmq-local status` never reads half a file
