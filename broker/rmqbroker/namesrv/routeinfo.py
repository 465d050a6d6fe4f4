"""The nameserver's route table: clusters, broker names and addresses, topic queues, liveness.

Mirrors the behaviour of RocketMQ's RouteInfoManager (reference §2.15-§2.17); all access happens
on the event loop thread, so no locks are needed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from rmqbroker.metadata.topics import PERM_READ, PERM_WRITE

log = logging.getLogger(__name__)

MASTER_ID = 0

# Java's TopicSysFlag bits: a unit topic, and a topic with unit subscriptions.
FLAG_UNIT = 0x1
FLAG_UNIT_SUB = 0x2


@dataclass(slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int

    def to_json(self) -> dict[str, Any]:
        return {"brokerName": self.broker_name, "perm": self.perm,
                "readQueueNums": self.read_queue_nums, "topicSysFlag": self.topic_sys_flag,
                "writeQueueNums": self.write_queue_nums}


@dataclass(slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # Standard JSON keys ("0"): both the C++ and the Java client accept them.
        return {"brokerAddrs": {str(k): v for k, v in sorted(self.broker_addrs.items())},
                "brokerName": self.broker_name, "cluster": self.cluster}


@dataclass(slots=True)
class BrokerLiveInfo:
    last_update: float
    data_version: dict[str, Any]
    connection_id: int
    ha_server_addr: str
    # The replication epoch the broker registered with (this project's brokers; None: a Java broker).
    epoch: int | None = None


@dataclass(slots=True)
class TopicConfigLite:
    """The fields of a broker's TopicConfig the nameserver keeps."""

    name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@dataclass(slots=True)
class RegisterResult:
    ha_server_addr: str | None
    master_addr: str | None


def same_version(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return False
    return a.get("timestamp") == b.get("timestamp") and a.get("counter") == b.get("counter")


class RouteInfoManager:
    """Cluster/broker/topic tables and broker liveness."""

    def __init__(self) -> None:
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}

    def register_broker(
        self,
        *,
        cluster_name: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str,
        data_version: dict[str, Any] | None,
        topics: list[TopicConfigLite] | None,
        connection_id: int,
        epoch: int | None = None,
        now: float | None = None,
    ) -> RegisterResult:
        now = time.monotonic() if now is None else now
        stale = self._superseded_master(broker_name, broker_addr, broker_id, epoch)
        if stale is not None:
            return stale
        self.cluster_addr_table.setdefault(cluster_name, set()).add(broker_name)
        broker_data = self.broker_addr_table.get(broker_name)
        register_first = broker_data is None
        if broker_data is None:
            broker_data = BrokerData(cluster_name, broker_name)
            self.broker_addr_table[broker_name] = broker_data
        broker_data.cluster = cluster_name
        # The same address under another id means a role switch: drop the stale id first.
        for bid, addr in list(broker_data.broker_addrs.items()):
            if addr == broker_addr and bid != broker_id:
                del broker_data.broker_addrs[bid]
        old_addr = broker_data.broker_addrs.get(broker_id)
        if old_addr is not None and old_addr != broker_addr:
            # A different process took over this id (e.g. a rescheduled pod with a new IP).
            self.broker_live_table.pop(old_addr, None)
        register_first = register_first or old_addr is None
        broker_data.broker_addrs[broker_id] = broker_addr

        live = self.broker_live_table.get(broker_addr)
        if broker_id == MASTER_ID and topics is not None and (
            register_first or live is None or not same_version(live.data_version, data_version)
        ):
            self._update_queue_data(broker_name, topics)

        self.broker_live_table[broker_addr] = BrokerLiveInfo(
            last_update=now,
            data_version=dict(data_version or {}),
            connection_id=connection_id,
            ha_server_addr=ha_server_addr,
            epoch=epoch,
        )
        if broker_id != MASTER_ID:
            master_addr = broker_data.broker_addrs.get(MASTER_ID)
            if master_addr is not None:
                master_live = self.broker_live_table.get(master_addr)
                if master_live is not None:
                    return RegisterResult(master_live.ha_server_addr, master_addr)
        return RegisterResult(None, None)

    def _superseded_master(self, broker_name: str, broker_addr: str, broker_id: int,
                           epoch: int | None) -> RegisterResult | None:
        """A master's registration that must not take brokerId 0 from the live master holding it,
        registered at a newer epoch; None: it may (Java's rule, the last registration wins).

        A master that hung through a failover registers as brokerId 0 again as soon as it runs
        (its period passed meanwhile), before anything demotes it: the last registration winning
        would route clients to it (its SEND_OKs are truncated once it follows the new master) and,
        once it is demoted and registers as a slave, leave no brokerId 0 until the new master's
        next registration. Only a lower epoch than the holder's is refused: the same epoch at a
        new address is the same master moved (a rescheduled pod), and either side without an
        epoch is a Java broker."""
        if broker_id != MASTER_ID or epoch is None:
            return None
        broker_data = self.broker_addr_table.get(broker_name)
        holder = broker_data.broker_addrs.get(MASTER_ID) if broker_data is not None else None
        if holder is None or holder == broker_addr:
            return None
        live = self.broker_live_table.get(holder)
        if live is None or live.epoch is None or epoch >= live.epoch:
            return None
        log.warning("broker %s registered as master of %s at epoch %d; %s, master at epoch %d, keeps brokerId 0",
                    broker_addr, broker_name, epoch, holder, live.epoch)
        # Answered with the current master, as a slave would be: the old master logs it.
        return RegisterResult(live.ha_server_addr, holder)

    def _update_queue_data(self, broker_name: str, topics: list[TopicConfigLite]) -> None:
        # Create/replace only, as RocketMQ 4.9's createAndUpdateQueueData: a topic missing from a
        # master's registration keeps its route (a slave promoted before its metadata sync brought
        # a new topic must not make it vanish); routes go with the broker name (unregister/expiry).
        for tc in topics:
            self.topic_queue_table.setdefault(tc.name, {})[broker_name] = QueueData(
                broker_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag)

    def set_write_perm(self, broker_name: str, writable: bool) -> int:
        """mqadmin wipeWritePerm / addWritePerm: the broker's queues in every route lose or get write
        permission (read stays). It lasts until the broker registers a changed topic table, as in
        RocketMQ. Returns how many topics the broker serves."""
        count = 0
        for queues in self.topic_queue_table.values():
            qd = queues.get(broker_name)
            if qd is None:
                continue
            qd.perm = (qd.perm | PERM_READ | PERM_WRITE) if writable else (qd.perm & ~PERM_WRITE)
            count += 1
        return count

    def query_data_version_changed(self, broker_addr: str, data_version: dict[str, Any],
                                   now: float | None = None) -> tuple[bool, dict[str, Any] | None]:
        live = self.broker_live_table.get(broker_addr)
        if live is None:
            return True, None
        changed = not same_version(live.data_version, data_version)
        if not changed:
            live.last_update = time.monotonic() if now is None else now
        return changed, live.data_version

    def unregister_broker(self, *, cluster_name: str, broker_addr: str, broker_name: str,
                          broker_id: int) -> None:
        self.broker_live_table.pop(broker_addr, None)
        broker_data = self.broker_addr_table.get(broker_name)
        if broker_data is not None:
            if broker_data.broker_addrs.get(broker_id) == broker_addr:
                del broker_data.broker_addrs[broker_id]
            else:
                for bid, addr in list(broker_data.broker_addrs.items()):
                    if addr == broker_addr:
                        del broker_data.broker_addrs[bid]
            if not broker_data.broker_addrs:
                del self.broker_addr_table[broker_name]
                names = self.cluster_addr_table.get(cluster_name)
                if names is not None:
                    names.discard(broker_name)
                    if not names:
                        del self.cluster_addr_table[cluster_name]
                self._remove_topics_of(broker_name)
        log.info("unregistered broker %s (%s id %d)", broker_addr, broker_name, broker_id)

    def delete_topic(self, topic: str, cluster_name: str | None = None) -> None:
        """Forget ``topic``'s route: on every broker, or only on ``cluster_name``'s brokers."""
        queues = self.topic_queue_table.get(topic)
        if queues is None:
            return
        if cluster_name is None:
            del self.topic_queue_table[topic]
            return
        for broker_name in self.cluster_addr_table.get(cluster_name, set()):
            queues.pop(broker_name, None)
        if not queues:
            del self.topic_queue_table[topic]

    def _remove_topics_of(self, broker_name: str) -> None:
        for topic, queues in list(self.topic_queue_table.items()):
            queues.pop(broker_name, None)
            if not queues:
                del self.topic_queue_table[topic]

    def _remove_addr(self, broker_addr: str) -> None:
        for name, data in list(self.broker_addr_table.items()):
            for bid, addr in list(data.broker_addrs.items()):
                if addr == broker_addr:
                    self.unregister_broker(cluster_name=data.cluster, broker_addr=addr,
                                           broker_name=name, broker_id=bid)

    def scan_not_active(self, expiry_seconds: float, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        expired = [addr for addr, live in self.broker_live_table.items()
                   if now - live.last_update > expiry_seconds]
        for addr in expired:
            log.warning("broker %s expired: no registration for %.0fs", addr, expiry_seconds)
            self._remove_addr(addr)
        return expired

    def on_connection_closed(self, connection_id: int) -> None:
        for addr, live in list(self.broker_live_table.items()):
            if live.connection_id == connection_id:
                log.info("broker %s connection closed; removing it", addr)
                self._remove_addr(addr)

    def pick_topic_route(self, topic: str) -> dict[str, Any] | None:
        queues = self.topic_queue_table.get(topic)
        if not queues:
            return None
        broker_datas = [self.broker_addr_table[name].to_json() for name in sorted(queues)
                        if name in self.broker_addr_table and self.broker_addr_table[name].broker_addrs]
        if not broker_datas:
            return None
        return {
            "brokerDatas": broker_datas,
            "filterServerTable": {},
            "queueDatas": [queues[name].to_json() for name in sorted(queues)],
        }

    def cluster_info(self) -> dict[str, Any]:
        return {
            "brokerAddrTable": {name: data.to_json() for name, data in sorted(self.broker_addr_table.items())},
            "clusterAddrTable": {c: sorted(names) for c, names in sorted(self.cluster_addr_table.items())},
        }

    def all_topics(self) -> list[str]:
        return sorted(self.topic_queue_table)

    def topics_by_cluster(self, cluster_name: str) -> list[str]:
        """The topics with queues on a broker of ``cluster_name`` (none for an unknown cluster, as Java)."""
        names = self.cluster_addr_table.get(cluster_name, set())
        return sorted(topic for topic, queues in self.topic_queue_table.items() if not names.isdisjoint(queues))

    def system_topic_list(self) -> tuple[list[str], str | None]:
        """RocketMQ's "system topics" of a nameserver: every cluster name and broker name (a broker
        registers its name and its cluster's name as topics), and one broker address to ask for the
        broker's own system topics: the lowest id's of the first broker name."""
        names: set[str] = set()
        for cluster, broker_names in self.cluster_addr_table.items():
            names.add(cluster)
            names |= broker_names
        addr = None
        for _name, data in sorted(self.broker_addr_table.items()):
            if data.broker_addrs:
                addr = data.broker_addrs[min(data.broker_addrs)]
                break
        return sorted(names), addr

    def topics_by_sys_flag(self, unit: bool | None, unit_sub: bool | None) -> list[str]:
        """Topics whose topicSysFlag has (True) or lacks (False) the unit / unit-sub bit; None: either.
        As Java, one broker's queue data decides for the topic (brokers register the same flag)."""
        out = []
        for topic, queues in self.topic_queue_table.items():
            if not queues:
                continue
            flag = queues[min(queues)].topic_sys_flag
            if unit is not None and bool(flag & FLAG_UNIT) != unit:
                continue
            if unit_sub is not None and bool(flag & FLAG_UNIT_SUB) != unit_sub:
                continue
            out.append(topic)
        return sorted(out)
